"""Edge-device profiles of the FeDiSyn system model: compute time and memory of depth-x LoRA.

Device i fine-tunes LoRA only in its last ``x_i`` transformer blocks. Its per-round compute time
and memory are (FeDiSyn, system model, Sec. III)

    H_i^comp = D_i · (h̄_i + x_i · h_i)          # forward of every sample + backward of x_i blocks
    m̄_i + x_i · m_i ≤ M_i                       # fixed memory + one share per trainable block

with D_i the number of samples it processes, h̄_i the per-sample forward time, h_i the per-sample
backward time of one block, m̄_i the fixed memory, m_i the memory of one trainable block and M_i
the device's memory budget.

The paper's testbed is 1 Jetson AGX Xavier, 5 Jetson Orin NX, 3 Jetson AGX Orin and 1 Jetson AGX
Thor. A profile is computed for a **backbone** (``backbones.py``: ViT-B/16 for CIFAR-10 and
Caltech-101, ViT-L/16 for Food-101) and the **configured batch size** (:func:`board_profiles`); the
numbers are calibrations, to be overridden, not measurements. Every number and its source:

==============================  =================  ============================================
quantity                        value              source / derivation
==============================  =================  ============================================
h̄, forward / image             MACs / (0.88 T ·   MACs from ``backbones.py`` (ViT-B/16 17.6 G,
                                speed) s           ViT-L/16 61.6 G: timm's table); 0.88 TMAC/s
                                                   effective on a Xavier (≈ 16 % of its 11
                                                   TFLOP/s FP16 tensor peak; ViT-B: 20 ms,
                                                   ViT-L: 70 ms per image)
h, backward / image / block     2 h̄ / L           the usual backward ≈ 2 × forward, per block
                                                   (an upper bound: frozen weights need no
                                                   weight gradient)
relative speed                  Xavier 1, Orin     assumed from the data sheets' dense INT8
                                NX 1.5, AGX Orin   TOPS (32 : 50 : 138 : ~500) discounted by
                                3, Thor 8          memory bandwidth (137 : 102 : 205 : 273 GB/s)
m̄, fixed memory                4 P + 1.5 GB +     fp32 weights (P params with the 1000-class
                                b · a              head: ViT-B 0.35 GB, ViT-L 1.22 GB), CUDA/
                                                   cuDNN context (assumed 1.5 GB), the forward
                                                   working set of one frozen block at batch b
m, memory / trainable block     b · a + 16 · 6rD   saved activations a = 17 N D fp32 per image
                                                   (ViT-B 10.3 MB, ViT-L 13.7 MB) × the batch b
                                                   (``train.batch_size``), + LoRA weights,
                                                   grads and AdamW's two moments (4 × 4 B ×
                                                   6 r D). Batch 32: ViT-B 0.33 GB (every board
                                                   holds 12 of 12), ViT-L 0.44 GB (an Orin NX
                                                   holds 20 of 24)
M, budget                       board − 4 GB       32/16/64/128 GB unified memory; 4 GB for the
                                                   OS
p, transmit power               0.10/0.12/0.15/    assumed, within the 0.1–0.2 W (20–23 dBm) of
                                0.20 W             edge radios; with the distance it sets the
                                                   SNR (``channel.py``)
==============================  =================  ============================================

:data:`PROFILES` are the boards for ViT-B/16 at batch 32 (the CIFAR-10 / Caltech-101 setting).

``measured_profiles`` replaces the times by ones derived from the simulating host's own measured
times (see the round-timing callback), keeping each profile's speed relative to the slowest one.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from fl_lightning.systems.backbones import BACKBONES, Backbone, lora_params_per_block

__all__ = [
    "DeviceProfile",
    "Board",
    "BOARDS",
    "board_profiles",
    "PROFILES",
    "PAPER_TESTBED",
    "paper_testbed",
    "compute_time",
    "max_depth",
    "measured_profiles",
    "profile_arrays",
]


@dataclass(frozen=True)
class DeviceProfile:
    """Compute, memory and radio characteristics of one edge device.

    Args:
        name: profile name (e.g. ``"jetson_orin_nx"``).
        forward_time_s: h̄, forward time of one sample through the whole backbone (s).
        backward_time_per_layer_s: h, backward time of one sample through one trainable block (s).
        fixed_memory_gb: m̄, memory used whatever the depth (GB).
        memory_per_layer_gb: m, extra memory of each trainable block (GB).
        memory_budget_gb: M, memory available for training (GB).
        transmit_power_w: p, uplink transmit power (W).
    """

    name: str
    forward_time_s: float
    backward_time_per_layer_s: float
    fixed_memory_gb: float
    memory_per_layer_gb: float
    memory_budget_gb: float
    transmit_power_w: float

    def __post_init__(self) -> None:
        for key in ("forward_time_s", "backward_time_per_layer_s", "memory_per_layer_gb", "memory_budget_gb", "transmit_power_w"):
            _check_positive(f"DeviceProfile {self.name!r}: {key}", getattr(self, key))
        value = self.fixed_memory_gb
        if not (_is_real(value) and math.isfinite(value) and value >= 0):
            raise ValueError(f"DeviceProfile {self.name!r}: fixed_memory_gb must be a finite float >= 0, got {value!r}")


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_positive(what: str, value: object) -> None:
    if not _is_real(value):
        raise TypeError(f"{what} must be a real number, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{what} must be a finite float > 0, got {value!r}")


@dataclass(frozen=True)
class Board:
    """An edge board: its speed relative to the AGX Xavier, its unified memory and its radio."""

    name: str
    speed: float  # relative to the Xavier (module docstring)
    memory_gb: float
    transmit_power_w: float


BOARDS: dict[str, Board] = {
    "jetson_agx_xavier": Board("jetson_agx_xavier", speed=1.0, memory_gb=32.0, transmit_power_w=0.10),
    "jetson_orin_nx": Board("jetson_orin_nx", speed=1.5, memory_gb=16.0, transmit_power_w=0.12),
    "jetson_agx_orin": Board("jetson_agx_orin", speed=3.0, memory_gb=64.0, transmit_power_w=0.15),
    "jetson_agx_thor": Board("jetson_agx_thor", speed=8.0, memory_gb=128.0, transmit_power_w=0.20),
}
"""The paper's four board types (module docstring)."""

XAVIER_MACS_PER_S = 0.88e12  # effective forward MAC/s of ViT LoRA training on an AGX Xavier (module docstring)
BACKWARD_OVER_FORWARD = 2.0  # h = 2 h̄ / L
CONTEXT_GB = 1.5  # CUDA/cuDNN context and allocator slack
OS_SHARE_GB = 4.0  # unified memory kept by the OS and the display/camera stack
_GB = 1e9


def board_profiles(backbone: Backbone, batch_size: int, *, lora_rank: int = 8) -> dict[str, DeviceProfile]:
    """Each board's :class:`DeviceProfile` for LoRA fine-tuning of ``backbone`` at ``batch_size``.

    Args:
        backbone: the ViT the devices train (``systems.backbones``).
        batch_size: b, images per local step (sets the activation memory of a trainable block).
        lora_rank: r of the adapters (their weights, grads and AdamW state, per block).
    """
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"board_profiles: batch_size must be an int >= 1, got {batch_size!r}")
    forward_xavier = backbone.forward_macs / XAVIER_MACS_PER_S
    activations = batch_size * backbone.activation_bytes_per_block()
    lora_state = 4 * 4 * lora_params_per_block(backbone.embed_dim, lora_rank)  # weights, grads, Adam m and v
    fixed = (4 * backbone.params(1000) + activations) / _GB + CONTEXT_GB
    per_layer = (activations + lora_state) / _GB
    return {
        b.name: DeviceProfile(
            name=b.name,
            forward_time_s=forward_xavier / b.speed,
            backward_time_per_layer_s=BACKWARD_OVER_FORWARD * forward_xavier / backbone.depth / b.speed,
            fixed_memory_gb=fixed,
            memory_per_layer_gb=per_layer,
            memory_budget_gb=b.memory_gb - OS_SHARE_GB,
            transmit_power_w=b.transmit_power_w,
        )
        for b in BOARDS.values()
    }


PROFILES: dict[str, DeviceProfile] = board_profiles(BACKBONES["vit_base_patch16_224"], 32)
"""The boards for ViT-B/16 at batch 32 (see the module docstring); override as needed."""

# 1 Xavier, 5 Orin NX, 3 AGX Orin, 1 Thor: the paper's 10-device testbed.
PAPER_TESTBED: tuple[str, ...] = (
    ("jetson_agx_xavier",) + ("jetson_orin_nx",) * 5 + ("jetson_agx_orin",) * 3 + ("jetson_agx_thor",)
)


def paper_testbed(profiles: dict[str, DeviceProfile] | None = None) -> list[DeviceProfile]:
    """The paper's 10 devices in order: 1 AGX Xavier, 5 Orin NX, 3 AGX Orin, 1 AGX Thor.

    Args:
        profiles: the boards' profiles (default :data:`PROFILES`, ViT-B/16 at batch 32; e.g.
            ``board_profiles(backbone("vit_large_patch16_224"), 32)`` for Food-101).
    """
    table = PROFILES if profiles is None else profiles
    return [table[name] for name in PAPER_TESTBED]


def profile_arrays(profiles: Sequence[DeviceProfile]) -> dict[str, np.ndarray]:
    """Stack a list of profiles into float64 arrays, one per field (keys = field names).

    The returned keys match the keyword arguments of :func:`fl_lightning.systems.clc.
    contribution_aware_depths` (plus ``transmit_power_w``).
    """
    keys = [f.name for f in fields(DeviceProfile) if f.name != "name"]  # every numeric field, in its order
    return {key: np.array([getattr(p, key) for p in profiles], dtype=np.float64) for key in keys}


def compute_time(
    num_samples: float | np.ndarray,
    profile_or_arrays: DeviceProfile | Sequence[DeviceProfile] | tuple[np.ndarray, np.ndarray],
    depth: int | np.ndarray,
) -> np.ndarray:
    """Compute time H_i^comp = D_i · (h̄_i + x_i · h_i), vectorised over devices.

    Args:
        num_samples: D_i, samples each device processes in the round (scalar or (N,)).
            Multiply by the local epochs before calling if a device passes over its data
            several times.
        profile_or_arrays: one profile, a list of N profiles, or a pair of arrays
            ``(forward_time_s, backward_time_per_layer_s)`` of shape (N,).
        depth: x_i, number of trainable (last) blocks (scalar or (N,)).

    Returns:
        float64 array of compute times in seconds (broadcast shape of the inputs; 0-d for scalars).
    """
    if isinstance(profile_or_arrays, DeviceProfile):
        forward = np.float64(profile_or_arrays.forward_time_s)
        backward = np.float64(profile_or_arrays.backward_time_per_layer_s)
    elif (
        isinstance(profile_or_arrays, tuple)
        and len(profile_or_arrays) == 2
        and not any(isinstance(p, DeviceProfile) for p in profile_or_arrays)
    ):
        forward = np.asarray(profile_or_arrays[0], dtype=np.float64)
        backward = np.asarray(profile_or_arrays[1], dtype=np.float64)
    else:
        arrays = profile_arrays(list(profile_or_arrays))
        forward, backward = arrays["forward_time_s"], arrays["backward_time_per_layer_s"]
    D = np.asarray(num_samples, dtype=np.float64)
    x = np.asarray(depth, dtype=np.float64)
    if np.any(D < 0):
        raise ValueError(f"compute_time: num_samples must be >= 0, got {num_samples!r}")
    if np.any(x < 0):
        raise ValueError(f"compute_time: depths must be >= 0, got {depth!r}")
    return D * (forward + x * backward)  # H_i^comp


def max_depth(profile: DeviceProfile, num_layers: int) -> int:
    """Largest depth x ≤ num_layers with m̄ + x·m ≤ M.

    Raises:
        ValueError: if even one trainable block does not fit in the memory budget.
    """
    if num_layers < 1:
        raise ValueError(f"max_depth: num_layers must be an int >= 1, got {num_layers!r}")
    room = (profile.memory_budget_gb - profile.fixed_memory_gb) / profile.memory_per_layer_gb
    # The tiny slack keeps an exact fit (e.g. 9.0 GB / 1.5 GB = 6) from rounding down to 5.
    depth = min(num_layers, math.floor(room + 1e-9))
    if depth < 1:
        raise ValueError(
            f"device {profile.name!r}: memory_budget_gb={profile.memory_budget_gb:g} GB cannot hold one LoRA "
            f"block; it needs >= fixed_memory_gb + memory_per_layer_gb = "
            f"{profile.fixed_memory_gb + profile.memory_per_layer_gb:g} GB"
        )
    return depth


def measured_profiles(
    base: Sequence[DeviceProfile],
    host_forward_s: float,
    host_backward_per_layer_s: float,
    *,
    reference: DeviceProfile | None = None,
) -> list[DeviceProfile]:
    """Profiles whose times come from the simulating host's measurements.

    The host is taken to be as fast as ``reference`` (default: the slowest profile of ``base``,
    i.e. the one with the largest forward time); every other profile keeps its speed relative to
    it: h̄_i = host_forward · h̄_i / h̄_ref and h_i = host_backward · h_i / h_ref. Memory and
    transmit power are kept.

    Args:
        base: the profiles to rescale (e.g. :func:`paper_testbed`).
        host_forward_s: measured per-sample forward time on this host (s).
        host_backward_per_layer_s: measured per-sample backward time of one block on this host (s).
        reference: the profile the host stands for.
    """
    if len(base) == 0:
        raise ValueError("measured_profiles: base must hold at least one device profile")
    _check_positive("host_forward_s", host_forward_s)
    _check_positive("host_backward_per_layer_s", host_backward_per_layer_s)
    ref = reference if reference is not None else max(base, key=lambda p: p.forward_time_s)
    return [
        replace(
            p,
            forward_time_s=host_forward_s * p.forward_time_s / ref.forward_time_s,
            backward_time_per_layer_s=(host_backward_per_layer_s * p.backward_time_per_layer_s / ref.backward_time_per_layer_s),
        )
        for p in base
    ]
