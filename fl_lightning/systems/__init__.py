"""FeDiSyn's system model: devices, channel, water-filling, LoRA depth, contributions, scaling law.

The calibration against the paper's reported times and traffic is ``systems/calibration.py``.
Everything here is pure math on numpy float64 arrays (no Lightning, no I/O), so the federation
loop can plan a round (depths → compute times → bandwidths → round time) and tests can check each
piece against an independent reference.
"""

from fl_lightning.systems.backbones import BACKBONES, Backbone, backbone, head_params, lora_params_per_block
from fl_lightning.systems.channel import (
    REFERENCE_LOSS_DB,
    ChannelConfig,
    device_spectral_efficiency,
    path_gain,
    place_devices,
    spectral_efficiency,
    upload_time,
)
from fl_lightning.systems.clc import (
    DEPTH_POLICIES,
    DepthDecision,
    capacity_depths,
    contribution_aware_depths,
    depth_contribution,
    depth_round_time,
    fixed_depths,
    full_depths,
    memory_depth_limits,
    policy_depths,
)
from fl_lightning.systems.devices import (
    BOARDS,
    PAPER_TESTBED,
    PROFILES,
    Board,
    DeviceProfile,
    board_profiles,
    compute_time,
    max_depth,
    measured_profiles,
    paper_testbed,
    profile_arrays,
)
from fl_lightning.systems.scaling_law import (
    ScalingLawParams,
    fit_scaling_law,
    optimal_lambda,
    synthesis_cost_per_unit_lambda,
    total_time,
)
from fl_lightning.systems.server import RTX_4090, SERVERS, ServerProfile, generation_time, pretrain_time_per_image_epoch
from fl_lightning.systems.wfba import ALLOCATIONS, allocate_bandwidth, equal_bandwidth, finish_time

__all__ = [
    "Backbone",
    "BACKBONES",
    "backbone",
    "head_params",
    "lora_params_per_block",
    "Board",
    "BOARDS",
    "board_profiles",
    "ServerProfile",
    "RTX_4090",
    "SERVERS",
    "generation_time",
    "pretrain_time_per_image_epoch",
    "ChannelConfig",
    "place_devices",
    "path_gain",
    "spectral_efficiency",
    "upload_time",
    "device_spectral_efficiency",
    "REFERENCE_LOSS_DB",
    "contribution_aware_depths",
    "capacity_depths",
    "full_depths",
    "fixed_depths",
    "memory_depth_limits",
    "depth_contribution",
    "depth_round_time",
    "policy_depths",
    "DepthDecision",
    "DEPTH_POLICIES",
    "DeviceProfile",
    "PROFILES",
    "PAPER_TESTBED",
    "paper_testbed",
    "compute_time",
    "max_depth",
    "measured_profiles",
    "profile_arrays",
    "ScalingLawParams",
    "total_time",
    "synthesis_cost_per_unit_lambda",
    "fit_scaling_law",
    "optimal_lambda",
    "allocate_bandwidth",
    "equal_bandwidth",
    "finish_time",
    "ALLOCATIONS",
]
