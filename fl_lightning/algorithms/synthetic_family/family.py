"""What FeDiSyn and its baselines share, whatever their stages: :class:`FeDiSynFamily`.

The timm ViT with LoRA in every block (built once per rank; its weights arrive with the first fine-tuning
download), the device profiles, the evaluation and the State's bookkeeping. Each method of the family is
one file declaring its stages: FeDiSyn (``algorithms/fedisyn/``: feature-guided synthesis → LoRA), SFLF and
CAFF (``ImageNetInit`` → LoRA), GPT-FL (text-only synthesis → full-parameter FedAvg), FGL (captions →
full-parameter FedAvg).

Server memory lives in the State only (checkpointed, survives ``--resume``): ``backbone.*``,
``head.*``, ``lora.*``, the contribution table ``sys.contrib`` / ``sys.contrib_round`` (N, L), the
clock ``sys.clock`` (H_gene, H_pre, Σ H^t, the synthesis upload), the traffic ``sys.bytes_up`` (synthesis
phase, fine-tuning), λ, the synthetic volume, the last depths, what the policy
requested and each device's memory limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fl_lightning.algorithms.common import evaluate_on_test
from fl_lightning.algorithms.synthetic_family.finetune import FineTuningStage
from fl_lightning.algorithms.synthetic_family.model import BACKBONE, HEAD, LORA, backbone_keys, strip, with_prefix
from fl_lightning.algorithms.synthetic_family.planning import client_profiles
from fl_lightning.algorithms.synthetic_family.synthesis import SynthesisStage
from fl_lightning.algorithms.synthetic_family.synthesis_step import parked_on_cpu
from fl_lightning.callbacks.contribution import GradientContribution
from fl_lightning.errors import ConfigError
from fl_lightning.federation.algorithm import Client, Environment, InputSpec, RoundPlan, State
from fl_lightning.federation.stages import StagedAlgorithm
from fl_lightning.federation.transport import Upload
from fl_lightning.models.lora import LoraSpec
from fl_lightning.modules.lora_classifier import LoRAClassifier

__all__ = ["FeDiSynFamily"]

_CLOCK = ("generation", "pretraining", "round", "synthesis_upload")  # the order of sys.clock
_TRAFFIC = ("synthesis", "finetune")  # the order of sys.bytes_up: what the paper counts is the fine-tuning uploads


class FeDiSynFamily(StagedAlgorithm):
    """The ViT, devices, evaluation and State shared by FeDiSyn and its baselines; the last stage fine-tunes."""

    shared_evaluation = True  # evaluate(state) is the test split through common.py: every rank its shard
    true_precision = "LoRA and the server's pre-training keep float32 master weights, the diffusion synthesis its own dtype"

    @classmethod
    def missing_resources(cls, config: Any, section: str, *, download: bool = False) -> list[str]:
        from fl_lightning.models.hub import looks_like_hub_id, missing_weights_phrase

        path = config.pretrain_checkpoint
        what = f"timm ImageNet weights of {config.pretrain_model}; null: random init"
        if path is None or Path(path).expanduser().is_file():
            return []
        if not Path(path).expanduser().exists() and looks_like_hub_id(path):  # its snapshot's weights file
            phrase = missing_weights_phrase(path, key=f"{section}.pretrain_checkpoint", what=what, download=download)
            return [phrase] if phrase else []
        return [f"{section}.pretrain_checkpoint={path} ({what})"]

    @property
    def tuning(self) -> FineTuningStage:
        """The fine-tuning stage (the last one): it owns how the global model is loaded."""
        return self.parts[-1]

    def input_spec(self) -> InputSpec:
        import timm

        pre = timm.models.get_pretrained_cfg(self.config.pretrain_model)
        size = self.cfg.data.image_size or self.config.pretrain_overrides.get("img_size") or pre.input_size[-1]
        self.spec = InputSpec(int(size), "imagenet", tuple(pre.mean), tuple(pre.std))
        return self.spec

    def setup(self, env: Environment) -> None:
        """Build the timm ViT + LoRA once per rank; its weights arrive with the first fine-tuning round."""
        import timm

        super().setup(env)
        f, lora = self.config, self.config.lora
        vit = timm.create_model(f.pretrain_model, pretrained=False, num_classes=env.num_classes, **f.pretrain_overrides)
        spec = LoraSpec(rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout, target_modules=tuple(lora.target_modules))
        self.module = self.fabric.to_device(LoRAClassifier(backbone=vit, spec=spec, lr=f.finetune_lr))
        self.num_blocks = self.module.num_blocks
        systems = self.config.systems
        if systems.depth_policy == "fixed" and systems.fixed_depth > self.num_blocks:
            raise ConfigError(
                f"{self.name}.systems.fixed_depth",
                systems.fixed_depth,
                f"an int in [1, {self.num_blocks}] (the blocks of {f.pretrain_model})",
            )
        self.profiles = self.device_profiles()
        self.contribution = GradientContribution()
        self.backbone_loaded = False

    def device_profiles(self) -> list:
        """Each client's board, priced for the named backbone (``systems.backbone`` or ``pretrain_model``) at
        ``train.batch_size`` (``systems/devices.py``)."""
        from fl_lightning.systems.backbones import backbone

        systems, name = self.config.systems, self.config.systems.backbone or self.config.pretrain_model
        key = f"{self.name}.systems.backbone" if systems.backbone else f"{self.name}.pretrain_model"
        try:
            vit = backbone(name)
        except ValueError as err:
            raise ConfigError(
                key,
                name,
                f"a backbone the system model prices ({err}); or set {self.name}.systems.backbone to the one it stands for",
            ) from None
        profiles = client_profiles(
            systems,
            self.cfg.partition.num_clients,
            backbone=vit,
            batch_size=self.cfg.train.batch_size,
            lora_rank=self.config.lora.rank,
        )
        for p in profiles:
            if p.fixed_memory_gb + p.memory_per_layer_gb > p.memory_budget_gb:
                raise ConfigError(
                    f"{self.name}.systems.profiles.{p.name}.memory_budget_gb",
                    p.memory_budget_gb,
                    f"a budget that holds one LoRA block of {vit.name} at batch "
                    f"{self.cfg.train.batch_size}: >= {p.fixed_memory_gb + p.memory_per_layer_gb:.3g} GB",
                )
        return profiles

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        """The stage's server step. With ``synthetic_lambda: auto`` the synthesis round starts the pilots,
        processes of their own on this rank's accelerator: the fine-tuning ViT (frozen backbone, LoRA and head,
        unused until the first fine-tuning round) waits on the CPU through the step — pilots, generation,
        pre-training — and is back, exactly, before evaluation (the synthesis step parks its own networks)."""
        if not (
            isinstance(self.stage_of(round_idx), SynthesisStage) and getattr(self.config, "synthetic_lambda", None) == "auto"
        ):
            return super().aggregate(round_idx, state, uploads, failures, plan)
        with parked_on_cpu(self.module):
            return super().aggregate(round_idx, state, uploads, failures, plan)

    # -- the global model on this rank ------------------------------------------------------------
    def load_backbone(self, tensors: dict[str, torch.Tensor]) -> None:
        inner = self.module.model.base_model.model
        keys = backbone_keys(self.module)
        backbone = strip(BACKBONE, tensors)
        if set(backbone) != set(keys):
            raise ValueError(f"backbone state mismatch: {len(set(keys) ^ set(backbone))} differing keys")
        inner.load_state_dict({keys[k]: v for k, v in backbone.items()}, strict=False)
        self.backbone_loaded = True

    def load_state(self, state: State) -> None:
        """A resumed rank: the backbone reached it in the first fine-tuning download, so restore it here."""
        if any(k.startswith(BACKBONE) for k in state):
            self.load_backbone(state)

    def model_state(self, model: torch.nn.Module) -> State:
        """backbone.* / head.* of a plain timm model (loaded into this rank's module), and LoRA at peft's
        init (B = 0: no effect yet)."""
        model_state = model.state_dict()
        head = self.module.head_name + "."
        new = with_prefix(BACKBONE, {k: v for k, v in model_state.items() if not k.startswith(head)})
        new.update(with_prefix(HEAD, {k[len(head) :]: v for k, v in model_state.items() if k.startswith(head)}))
        self.load_backbone(new)
        self.module.load_head_state(with_prefix(HEAD, strip(HEAD, new)))
        new.update(with_prefix(LORA, self.module.lora_state()))
        return new

    def client_images(self, client: Client, *, batch_size: int, size: int | None = None, device: torch.device | None = None):
        """A client's own images back in [0, 1] (the ViT normalisation undone), resized to ``size``, with labels; the
        batch is moved to ``device`` first (None: the CPU), where the de-normalisation and resize run
        (``synthesis.latents.vae_inputs``)."""
        from fl_lightning.synthesis.latents import vae_inputs

        for images, labels in self.env.loader(client.dataset, shuffle=False, batch_size=batch_size):
            yield vae_inputs(images, mean=self.spec.mean, std=self.spec.std, size=size, device=device), labels

    # -- state, evaluation, reports ---------------------------------------------------------------
    def initial_state(self) -> State:
        """The simulated clock (H_gene, H_pre, Σ H^t: one timeline for all stages), then each stage's own state."""
        return {
            "sys.clock": torch.zeros(len(_CLOCK), dtype=torch.float64),
            "sys.bytes_up": torch.zeros(len(_TRAFFIC), dtype=torch.float64),
            **super().initial_state(),
        }

    def evaluate(self, state: State) -> dict[str, Any]:
        self.tuning.load_global(state)
        self.module.eval()
        return evaluate_on_test(self.env, self.module)

    def round_extras(self, round_idx: int, state: State) -> dict[str, float]:
        return {"simulated_time_s": float(state["sys.clock"].sum()), **self._traffic(state), **self.tuning.round_extras(state)}

    @staticmethod
    def _traffic(state: State) -> dict[str, float]:
        """The synthesis-phase upload (latents, captions, counts) and the fine-tuning uploads, cumulative bytes."""
        return {f"bytes_up_{name}": float(v) for name, v in zip(_TRAFFIC, state["sys.bytes_up"].tolist())}

    def summary_extras(self, state: State) -> dict[str, Any]:
        clock = state["sys.clock"].tolist()
        return {
            "simulated_time_s": float(sum(clock)),
            **{f"simulated_{name}_s": float(v) for name, v in zip(_CLOCK, clock)},
            **self._traffic(state),
            # what the paper's traffic figures (and the curves' traffic axis) count: fine-tuning uploads
            "traffic_counted": "bytes_up_finetune",
            **super().summary_extras(state),
            "stages": [type(stage).__name__ for stage in self.parts],
            "num_blocks": int(self.num_blocks),
        }
