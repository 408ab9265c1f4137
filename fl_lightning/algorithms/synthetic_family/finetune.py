"""The FeDiSyn family's fine-tuning stage (step 3, rounds 1..T) and the ImageNet start of the baselines without synthesis.

Every fine-tuning round (:class:`FineTuningStage`): plan — depths x_i by ``systems.depth_policy`` (CLC,
Alg. 1, from the measured gradient contributions), bandwidths by ``systems.bandwidth_allocation``
(WFBA, Alg. 2, or B/N) over the simulated FDMA channel, H^t = the round time; client — train for E
epochs; server — fold the uploads, then advance the depths, the memory report and the clock.

:class:`LoRAFineTuning` (FeDiSyn, SFLF, CAFF): a device trains the LoRA of its last x_i blocks and uploads
them with its per-block contribution ||∇θ_l||²; the server averages each block over the devices that
trained it (Iverson indicator, data-size weights). The head (``train_head: auto``, one reading for all
LoRA methods): a head newly drawn for the task trains with LoRA — SFLF and CAFF start from ImageNet
weights with a fresh C-way head, which LoRA alone cannot turn into a classifier — while a head that
synthetic pre-training already trained on the task's classes stays frozen (FeDiSyn and its ablations:
the paper's "LoRA-only" fine-tuning, and its 7.4 MB of Food-101 traffic leave no room for a
0.4 MB ViT-L head per device and round). A trained head is uploaded and averaged, and its bits count
in the traffic and in every device's channel time; ``true`` / ``false`` force either way. Wire format: the
stage's first download carries the whole model (backbone, head, LoRA); every download carries the global LoRA of
ALL blocks (+ the head), since a device's frozen lower blocks take part in its forward pass with the global
adapters (``models/lora.py``); an upload carries only the x_i trained blocks (τ·x_i bits in the channel model).

Memory: a device whose memory holds fewer blocks than the policy asks for trains what it can hold; the
round's metrics (``over_memory_devices``, ``mean_requested_depth``) and the summary say so.

:class:`ImageNetInit` (SFLF, CAFF): no rounds; the global state starts from ``pretrain_checkpoint``
(random when null), a fresh head for this dataset.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from fl_lightning.algorithms.synthetic_family.config import LoraConfig, SystemsConfig, ViTConfig
from fl_lightning.algorithms.synthetic_family.model import BACKBONE, HEAD, LORA, bits, strip, with_prefix
from fl_lightning.algorithms.synthetic_family.planning import SystemPlan, fit_host_times, plan_round
from fl_lightning.errors import check
from fl_lightning.federation.aggregate import WeightedMean, check_whole_layers
from fl_lightning.federation.algorithm import Client, RoundHistory, RoundPlan, State
from fl_lightning.federation.local_training import fit_local
from fl_lightning.federation.ranks.placement import client_seed
from fl_lightning.federation.stages import Stage
from fl_lightning.federation.transport import Download, Upload
from fl_lightning.models.lora import lora_bits_per_layer, lora_layer_index
from fl_lightning.systems.contributions import estimate_contributions
from fl_lightning.systems.devices import measured_profiles

__all__ = [
    "FineTuningConfig",
    "LoRAFineTuningConfig",
    "ImageNetInitConfig",
    "FineTuningState",
    "FineTuningStage",
    "LoRAFineTuning",
    "ImageNetInit",
    "LORA_UPLOADS_GAP",
]

# what a LoRA fine-tuning round's uploads leave unprotected, in a baseline's privacy_gap (federation.privacy)
LORA_UPLOADS_GAP = (
    "its LoRA uploads carry each device's per-block gradient contributions in the clear, and the server "
    "plans the next depths from them"
)


@dataclass
class FineTuningConfig(ViTConfig):
    finetune_lr: float = 1e-3  # AdamW on what the devices train (local epochs and batch size: `train`)
    systems: SystemsConfig = field(default_factory=SystemsConfig)  # devices, channel, depth policy (<method>.systems.*)
    # the adapters in every block of the family's ViT (<method>.lora.*): trained by LoRA fine-tuning; under
    # full-parameter FedAvg they stay at peft's zero-effect init but are part of the model that is downloaded
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.finetune_lr > 0, "finetune_lr", self.finetune_lr, "a float > 0")


@dataclass
class LoRAFineTuningConfig(FineTuningConfig):
    # auto: the head trains (with LoRA) exactly when it was newly drawn for the task — SFLF and CAFF, whose
    # ImageNet model gets a fresh C-way head — and stays frozen when synthetic pre-training already trained it
    # on the task's classes (FeDiSyn and its ablations: the paper's LoRA-only fine-tuning). A trained head is
    # uploaded and averaged, and its bytes count in the traffic and in every device's channel time.
    train_head: bool | Literal["auto"] = "auto"


@dataclass
class ImageNetInitConfig(ViTConfig):
    """``pretrain_checkpoint`` = the local ImageNet weights of ``pretrain_model`` (null: random init)."""


@dataclass
class FineTuningState:
    """The fine-tuning stage's server memory, checkpointed in the State under ``sys.*`` (survives ``--resume``)."""

    contrib: torch.Tensor  # (N, L) float64: each device's last measured ||∇θ_l||² per block
    contrib_round: torch.Tensor  # (N, L) int64: the round it was measured in (−1: never)
    depths: torch.Tensor  # (N,) int64: x_i of the device's last round (0: not yet)
    requested: torch.Tensor  # (N,) int64: what the depth policy asked for, before memory
    limits: torch.Tensor  # (N,) int64: the device's memory limit (blocks)
    over_memory_rounds: torch.Tensor  # (N,) int64: rounds in which it could not hold what was asked
    round_time: torch.Tensor  # () float64: H^t of the last round

    _KEYS = {
        "contrib": "sys.contrib",
        "contrib_round": "sys.contrib_round",
        "depths": "sys.depths",
        "requested": "sys.requested",
        "limits": "sys.limits",
        "over_memory_rounds": "sys.over_memory_rounds",
        "round_time": "sys.round_time",
    }

    @classmethod
    def zeros(cls, num_clients: int, num_blocks: int) -> FineTuningState:
        N, L = num_clients, num_blocks
        depths, requested, limits, over = (torch.zeros(N, dtype=torch.int64) for _ in range(4))
        return cls(
            torch.zeros(N, L, dtype=torch.float64),
            torch.full((N, L), -1, dtype=torch.int64),
            depths,
            requested,
            limits,
            over,
            torch.tensor(0.0, dtype=torch.float64),
        )

    def state_dict(self) -> State:
        return {key: getattr(self, name) for name, key in self._KEYS.items()}

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor]) -> FineTuningState:
        return cls(**{name: state[key] for name, key in cls._KEYS.items()})


class ImageNetInit(Stage):
    """No rounds: fine-tuning starts from ImageNet weights, seeded by the run seed (every rank builds the same)."""

    config_class = ImageNetInitConfig
    draws_head = True  # the C-way head is newly drawn for the task (``train_head: auto`` trains it)

    def rounds(self) -> int:
        return 0

    def initial_state(self) -> State:
        from fl_lightning.modules.pretraining import build_timm_vit

        f, m = self.method.config, self.method
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(m.cfg.seed)
            model = build_timm_vit(
                model_name=f.pretrain_model,
                num_classes=m.env.num_classes,
                overrides=f.pretrain_overrides,
                checkpoint=f.pretrain_checkpoint,
            )
        return m.model_state(model)

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        raise RuntimeError("ImageNetInit owns no rounds")

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        raise RuntimeError("ImageNetInit owns no rounds")

    def summary_extras(self, state: State) -> dict[str, Any]:
        return {"generation": "none", "synthetic_images": 0, "real_samples": 0, "lambda": 0.0}


class FineTuningStage(Stage):
    """T = ``federation.rounds`` rounds of federated fine-tuning on the simulated devices."""

    config_class = FineTuningConfig

    def rounds(self) -> int:
        return self.method.cfg.federation.rounds

    def initial_state(self) -> State:
        return FineTuningState.zeros(self.method.cfg.partition.num_clients, self.method.num_blocks).state_dict()

    # -- what differs between LoRA and full-parameter fine-tuning -----------------------------------
    @abstractmethod
    def ensure_backbone(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Make the module's backbone the global one held in ``tensors``."""

    @abstractmethod
    def payload_bits(self, state: State) -> dict[str, float]:
        """What one device uploads, for the channel model (keyword arguments of ``plan_round``)."""

    @abstractmethod
    def sends(self, key: str, round_idx: int) -> bool:
        """Whether the global ``key`` goes out in this round's downloads."""

    @abstractmethod
    def train(self, client: Client, download: Download, loader) -> dict[str, torch.Tensor]:
        """Local training of one device; returns the tensors it uploads."""

    @abstractmethod
    def fold(self, round_idx: int, state: State, uploads: Mapping[int, Upload]) -> State:
        """The new global tensors from the uploads."""

    # -- one round ------------------------------------------------------------------------------------
    def load_global(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """The global model into the rank's module: backbone, LoRA, head."""
        module = self.method.module
        self.ensure_backbone(tensors)
        module.load_lora_state(strip(LORA, tensors))
        module.load_head_state(with_prefix(HEAD, strip(HEAD, tensors)))

    def plan(self, round_idx: int, clients: Sequence[int], state: State, history: RoundHistory) -> RoundPlan:
        m = self.method
        self.ensure_backbone(state)
        E = max(m.cfg.train.epochs, 1)
        sizes = np.array([len(p) for p in m.env.partition], dtype=np.float64)
        profiles, own = m.profiles, FineTuningState.from_state(state)
        if m.config.systems.timing == "measured" and round_idx > self.first_round:
            depths = {int(c): int(x) for c, x in enumerate(own.depths.tolist()) if x > 0}
            fit = fit_host_times(history.client_compute_s, {c: sizes[c] * E for c in depths}, depths)
            if fit is not None:
                profiles = measured_profiles(m.profiles, *fit)
        plan = plan_round(
            m.config.systems,
            clients=clients,
            profiles=profiles,
            samples=sizes * E,
            contributions=estimate_contributions(own.contrib.numpy(), own.contrib_round.numpy()),
            num_layers=m.num_blocks,
            **self.payload_bits(state),
        )
        model = {k: v for k, v in state.items() if self.sends(k, round_idx)}
        return RoundPlan({c: Download(model, {"depth": int(x)}) for c, x in zip(plan.clients, plan.depths)}, plan.as_decisions())

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        m = self.method
        self.load_global(download.tensors)
        loader = m.env.loader(
            client.dataset, shuffle=True, seed=client_seed(m.cfg.seed, round_idx, client.index), batch_size=m.cfg.train.batch_size
        )
        return Upload(self.train(client, download, loader), {"num_samples": client.num_samples})

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], round_plan: RoundPlan
    ) -> State:
        plan = SystemPlan.from_decisions(round_plan.decisions)
        new = dict(state)
        new.update(self.fold(round_idx, state, uploads))
        own, clients = FineTuningState.from_state(new), plan.clients

        def column(values: torch.Tensor, plan_values) -> torch.Tensor:
            out = values.clone()
            out[clients] = torch.as_tensor(plan_values if plan_values is not None else plan.depths, dtype=torch.int64)
            return out

        own.depths, own.requested, own.limits = (
            column(own.depths, plan.depths),
            column(own.requested, plan.requested),
            column(own.limits, plan.limits),
        )
        own.over_memory_rounds = own.over_memory_rounds.clone()
        own.over_memory_rounds[clients] += torch.as_tensor(plan.over_memory, dtype=torch.int64)
        own.round_time = torch.tensor(plan.round_time_s, dtype=torch.float64)
        clock = state["sys.clock"].clone()
        clock[2] += plan.round_time_s  # H^t: the last device has computed and uploaded
        traffic = state["sys.bytes_up"].clone()
        traffic[1] += sum(float(u.num_bytes) for _, u in uploads.items())  # the fine-tuning uploads
        new.update({**own.state_dict(), "sys.clock": clock, "sys.bytes_up": traffic})
        return new

    def round_extras(self, state: State) -> dict[str, float]:
        own = FineTuningState.from_state(state)
        active = own.depths > 0
        tuning = bool(active.any())  # no depths before the first fine-tuning round
        return {
            "simulated_round_s": float(own.round_time) if tuning else 0.0,
            "mean_depth": float(own.depths[active].float().mean()) if tuning else 0.0,
            "mean_requested_depth": float(own.requested[active].float().mean()) if tuning else 0.0,
            # devices (of those that last took part) whose memory holds fewer blocks than requested
            "over_memory_devices": float((own.requested[active] > own.limits[active]).sum()) if tuning else 0.0,
        }

    def summary_extras(self, state: State) -> dict[str, Any]:
        own, systems = FineTuningState.from_state(state), self.method.config.systems
        return {
            "bandwidth_allocation": systems.bandwidth_allocation,
            "timing": systems.timing,
            "final_depths": [int(x) for x in own.depths.tolist()],
            "requested_depths": [int(x) for x in own.requested.tolist()],
            "memory_limits": [int(x) for x in own.limits.tolist()],
            "over_memory_clients": [int(c) for c in torch.nonzero(own.over_memory_rounds > 0).flatten().tolist()],
        }


class LoRAFineTuning(FineTuningStage):
    """LoRA of each device's last x_i blocks, averaged block by block over the devices that trained it."""

    config_class = LoRAFineTuningConfig

    @property
    def trains_head(self) -> bool:
        """``train_head``, with ``auto`` = whether an earlier stage drew the head fresh (see the config)."""
        setting = self.method.config.train_head
        if setting != "auto":
            return bool(setting)
        return any(getattr(stage, "draws_head", False) for stage in self.method.parts[:-1])

    def ensure_backbone(self, tensors: Mapping[str, torch.Tensor]) -> None:
        if not self.method.backbone_loaded:  # LoRA: the backbone never changes, it is loaded once
            self.method.load_backbone(tensors)

    def payload_bits(self, state: State) -> dict[str, float]:
        head = bits(strip(HEAD, state))
        return {"layer_bits": float(lora_bits_per_layer(strip(LORA, state))), "extra_bits": head if self.trains_head else 0.0}

    def sends(self, key: str, round_idx: int) -> bool:
        return key.startswith((LORA, HEAD)) or key.startswith(BACKBONE) and round_idx == self.first_round

    def train(self, client: Client, download: Download, loader) -> dict[str, torch.Tensor]:
        m = self.method
        trained = m.module.set_depth(int(download.meta["depth"]))
        m.module.head.requires_grad_(self.trains_head)  # a fresh head trains; a pre-trained one stays (config)
        m.contribution.reset()
        fit_local(m.fabric, m.module, loader, epochs=m.cfg.train.epochs, callbacks=[m.contribution])
        per_layer = m.contribution.per_layer()
        tensors = {
            **with_prefix(LORA, m.module.lora_state(trained_only=True)),
            "contribution": torch.tensor([per_layer.get(l, 0.0) for l in trained], dtype=torch.float32),
        }
        if self.trains_head:
            tensors.update(with_prefix(HEAD, strip(HEAD, m.module.head_state())))
        return tensors

    def fold(self, round_idx: int, state: State, uploads: Mapping[int, Upload]) -> State:
        """Each LoRA block over the devices that trained it, the head over all (when it trains); contributions."""
        lora_global, L = strip(LORA, state), self.method.num_blocks
        mean = WeightedMean()
        own = FineTuningState.from_state(state)
        contrib, measured = own.contrib.clone(), own.contrib_round.clone()
        for c, u in uploads.items():
            check_whole_layers(lora_global, strip(LORA, u.tensors), layer_of=lora_layer_index, name=f"client {c}'s LoRA")
            mean.add({k: v for k, v in u.tensors.items() if k.startswith((LORA, HEAD))}, u.meta["num_samples"])
            g = u.tensors["contribution"].to(torch.float64)
            blocks = list(range(L - g.numel(), L))
            contrib[c, blocks], measured[c, blocks] = g, round_idx
        if len(mean) == 0:
            return {}
        own.contrib, own.contrib_round = contrib, measured
        return {**mean.result(), **own.state_dict()}

    def summary_extras(self, state: State) -> dict[str, Any]:
        return {
            **super().summary_extras(state),
            "depth_policy": self.method.config.systems.depth_policy,
            "train_head": self.trains_head,
            "train_head_setting": self.method.config.train_head,
        }
