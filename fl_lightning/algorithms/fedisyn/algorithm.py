"""FeDiSyn ("Scaling Synthetic-Image Pre-Training for Federated Fine-Tuning of Large Vision Models").

Round 0 — synthesis (step 1) and server pre-training (step 2):
    clients VAE-encode their own images (the ViT normalisation undone, resized to the VAE's
    resolution), cluster each class into Z noised centroids + a noised mean and upload them with
    their counts D_i^k; the server takes λ (config, or λ* of the scaling law), expands labels into
    prompts, denoises round(λ·D^k) images per class into ``<run_dir>/synthetic/`` and pre-trains a
    timm ViT on them. The State then holds the pre-trained backbone and head and zero-effect LoRA
    (B = 0) in every block.

Rounds 1..T (``federation.rounds`` = T) — LoRA fine-tuning (step 3):
    plan: depths x_i by ``systems.depth_policy`` (CLC, Alg. 1, from the measured gradient
    contributions), bandwidths by WFBA (Alg. 2) over the simulated FDMA channel, H^t = the WFBA
    round time; client: train the LoRA of its last x_i blocks + the head for E epochs and upload
    them with its per-block contribution ||∇θ_l||²; server: each block averaged over the devices
    that trained it (Iverson indicator, data-size weights), the head averaged over all.

Wire format. The first fine-tuning round's download carries the whole pre-trained model (backbone,
head, LoRA); every download carries the global LoRA of ALL blocks + head, because a device's frozen
lower blocks take part in its forward pass with the global adapters (see ``models/lora.py``); the
upload carries only the x_i trained blocks, which is what the channel model times (τ·x_i bits).

Server memory lives in the State only (checkpointed, survives ``--resume``): ``backbone.*``,
``head.*``, ``lora.*``, the contribution table ``sys.contrib`` / ``sys.contrib_round`` (N, L), the
clock ``sys.clock`` (H_gene, H_pre, Σ H^t), λ, the synthetic volume and the last depths.
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from lightning.fabric import Fabric

from fl_lightning.algorithms.common import evaluate_on_test
from fl_lightning.algorithms.fedisyn.config import UNUSED_CORE_KEYS, FeDiSynConfig
from fl_lightning.algorithms.fedisyn.planning import (
    SystemPlan,
    client_profiles,
    estimate_contributions,
    fit_host_times,
    plan_round,
)
from fl_lightning.algorithms.fedisyn.synthesis_step import synthesise_and_pretrain
from fl_lightning.callbacks.contribution import GradientContribution
from fl_lightning.errors import ConfigError, MissingResourceError
from fl_lightning.federation.aggregate import layerwise_average, weighted_average
from fl_lightning.federation.algorithm import (
    Algorithm,
    Client,
    Environment,
    InputSpec,
    RoundHistory,
    RoundPlan,
    State,
    register,
)
from fl_lightning.federation.local_training import fit_local
from fl_lightning.federation.placement import client_seed
from fl_lightning.federation.transport import Download, Upload
from fl_lightning.models.diffusion import load_diffusion, tiny_diffusion_components
from fl_lightning.models.lora import LoraSpec, lora_bits_per_layer, lora_layer_index
from fl_lightning.modules.lora_classifier import LoRAClassifier
from fl_lightning.synthesis.latents import client_latent_uploads, from_upload, to_upload
from fl_lightning.systems.devices import measured_profiles

__all__ = ["FeDiSyn"]

_LORA, _HEAD, _BACKBONE = "lora.", "head.", "backbone."
_CLOCK = ("generation", "pretraining", "round")  # the order of sys.clock


def _strip(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def _with(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {prefix + k: v.detach().cpu().clone() for k, v in tensors.items()}


@register("fedisyn")
class FeDiSyn(Algorithm):
    """FeDiSyn on the federation engine (see the module docstring for the rounds and the State, and
    :mod:`~fl_lightning.algorithms.fedisyn.config` for the core keys it uses and those it does not)."""

    config_class = FeDiSynConfig

    # ------------------------------------------------------------------------------------- set-up
    @property
    def num_rounds(self) -> int:
        return 1 + self.cfg.federation.rounds  # round 0 = synthesis + pre-training, then T LoRA rounds

    @classmethod
    def preflight(cls, cfg: Any) -> None:
        """Every local resource FeDiSyn needs, checked at once (one line listing what is missing)."""
        f = cfg.method
        missing = []
        if f.diffusion_path is not None and not Path(f.diffusion_path).expanduser().is_dir():
            missing.append(f"fedisyn.diffusion_path={f.diffusion_path} (Stable Diffusion v1-5 diffusers folder)")
        if f.llm_path is not None and not Path(f.llm_path).expanduser().is_dir():
            missing.append(f"fedisyn.llm_path={f.llm_path} (causal-LM folder, e.g. LLaMA-7B; null: template prompts)")
        if f.pretrain_checkpoint is not None and not Path(f.pretrain_checkpoint).expanduser().is_file():
            missing.append(f"fedisyn.pretrain_checkpoint={f.pretrain_checkpoint} (timm ImageNet weights of "
                           f"{f.pretrain_model}; null: random init)")
        if missing:
            raise MissingResourceError("FeDiSyn needs local weights that are not on disk: " + "; ".join(missing)
                                       + " — copy them there (nothing is downloaded) or change the paths")

    def build(self, fabric: Fabric) -> None:
        f = self.config
        self.fabric = fabric
        self.components = (load_diffusion(f.diffusion_path) if f.diffusion_path is not None
                           else tiny_diffusion_components(seed=self.cfg.seed, image_size=f.vae_image_size))
        self.components.vae.to(fabric.device)  # clients need only the VAE; the server moves the rest when it generates

    def input_spec(self) -> InputSpec:
        import timm

        pre = timm.models.get_pretrained_cfg(self.config.pretrain_model)
        size = self.cfg.data.image_size or self.config.pretrain_overrides.get("img_size") or pre.input_size[-1]
        self.spec = InputSpec(int(size), "imagenet", tuple(pre.mean), tuple(pre.std))
        return self.spec

    def setup(self, env: Environment) -> None:
        """Build the timm ViT + LoRA once per rank; its weights arrive after round 0."""
        import timm

        super().setup(env)
        f, lora = self.config, self.config.lora
        vit = timm.create_model(f.pretrain_model, pretrained=False, num_classes=env.num_classes,
                                **f.pretrain_overrides)
        spec = LoraSpec(rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout,
                        target_modules=tuple(lora.target_modules))
        self.module = self.fabric.to_device(LoRAClassifier(backbone=vit, spec=spec, lr=f.finetune_lr))
        self.num_blocks = self.module.num_blocks
        systems = self.config.systems
        if systems.depth_policy == "fixed" and systems.fixed_depth > self.num_blocks:
            raise ConfigError("fedisyn.systems.fixed_depth", systems.fixed_depth,
                              f"an int in [1, {self.num_blocks}] (the blocks of {f.pretrain_model})")
        self.profiles = client_profiles(systems, self.cfg.partition.num_clients)
        self.contribution = GradientContribution()
        self._backbone_loaded = False

    def _backbone_keys(self) -> dict[str, str]:
        """Plain timm key → key in the LoRA-wrapped model, for every non-LoRA, non-head weight."""
        inner = self.module.model.base_model.model
        return {k.replace(".base_layer", ""): k for k in inner.state_dict()
                if ".lora_" not in k and not k.startswith(self.module.head_name + ".")}

    def _load_backbone(self, tensors: dict[str, torch.Tensor]) -> None:
        inner = self.module.model.base_model.model
        keys = self._backbone_keys()
        backbone = _strip(_BACKBONE, tensors)
        if set(backbone) != set(keys):
            raise ValueError(f"backbone state mismatch: {len(set(keys) ^ set(backbone))} differing keys")
        inner.load_state_dict({keys[k]: v for k, v in backbone.items()}, strict=False)
        self._backbone_loaded = True

    def _ensure_backbone(self, tensors: dict[str, torch.Tensor]) -> None:
        if not self._backbone_loaded:
            self._load_backbone(tensors)

    def load_state(self, state: State) -> None:
        """A resumed rank: the pre-trained backbone reached it in round 1's download, so restore it here."""
        if any(k.startswith(_BACKBONE) for k in state):
            self._load_backbone(state)

    def initial_state(self) -> State:
        N, L = self.cfg.partition.num_clients, self.num_blocks
        return {"sys.clock": torch.zeros(3, dtype=torch.float64),
                "sys.contrib": torch.zeros(N, L, dtype=torch.float64),
                "sys.contrib_round": torch.full((N, L), -1, dtype=torch.int64),
                "sys.depths": torch.zeros(N, dtype=torch.int64),
                "sys.lambda": torch.tensor(0.0, dtype=torch.float64),
                "sys.synthetic_images": torch.tensor(0, dtype=torch.int64),
                "sys.real_samples": torch.tensor(0, dtype=torch.int64),
                "sys.round_time": torch.tensor(0.0, dtype=torch.float64)}

    # ------------------------------------------------------------------------------------- plan
    def plan(self, round_idx: int, clients, state: State, history: RoundHistory) -> RoundPlan:
        if round_idx == 0:
            return RoundPlan({c: Download() for c in clients})  # clients need nothing: they hold the SD VAE
        self._ensure_backbone(state)
        E = max(self.cfg.train.epochs, 1)
        sizes = np.array([len(p) for p in self.env.partition], dtype=np.float64)
        profiles = self.profiles
        if self.config.systems.timing == "measured" and round_idx >= 2:
            depths = {int(c): int(x) for c, x in enumerate(state["sys.depths"].tolist()) if x > 0}
            fit = fit_host_times(history.client_compute_s, {c: sizes[c] * E for c in depths}, depths)
            if fit is not None:
                profiles = measured_profiles(self.profiles, *fit)
        lora = _strip(_LORA, state)
        plan = plan_round(self.config.systems, clients=clients, profiles=profiles, samples=sizes * E,
                          contributions=estimate_contributions(state["sys.contrib"].numpy(),
                                                               state["sys.contrib_round"].numpy()),
                          layer_bits=float(lora_bits_per_layer(lora)), num_layers=self.num_blocks)
        model = {k: v for k, v in state.items() if k.startswith((_LORA, _HEAD))
                 or round_idx == 1 and k.startswith(_BACKBONE)}  # the full pre-trained model goes out once
        return RoundPlan({c: Download(model, {"depth": int(x)}) for c, x in zip(plan.clients, plan.depths)},
                         plan.as_decisions())

    # ------------------------------------------------------------------------------------ client
    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        seed = client_seed(self.cfg.seed, round_idx, client.index)
        if round_idx == 0:
            return self._synthesis_upload(client, seed)
        self._ensure_backbone(download.tensors)
        self.module.load_lora_state(_strip(_LORA, download.tensors))
        self.module.load_head_state(_with(_HEAD, _strip(_HEAD, download.tensors)))
        trained = self.module.set_depth(int(download.meta["depth"]))
        loader = self.env.loader(client.dataset, shuffle=True, seed=seed, batch_size=self.cfg.train.batch_size)
        self.contribution.reset()
        fit_local(self.fabric, self.module, loader, epochs=self.cfg.train.epochs, callbacks=[self.contribution])
        per_layer = self.contribution.per_layer()
        tensors = {**_with(_LORA, self.module.lora_state(trained_only=True)),
                   **_with(_HEAD, _strip(_HEAD, self.module.head_state())),
                   "contribution": torch.tensor([per_layer.get(l, 0.0) for l in trained], dtype=torch.float32)}
        return Upload(tensors, {"num_samples": client.num_samples})

    def _synthesis_upload(self, client: Client, seed: int) -> Upload:
        """Step 1 on a client: images back to [0, 1] at the VAE's resolution → noised class latents."""
        f, spec = self.config, self.spec
        mean = torch.tensor(spec.mean).view(1, 3, 1, 1)
        std = torch.tensor(spec.std).view(1, 3, 1, 1)

        def batches():
            for images, labels in self.env.loader(client.dataset, shuffle=False, batch_size=f.encode_batch_size):
                x = (images * std + mean).clamp(0, 1)  # undo the ViT normalisation
                x = F.interpolate(x, size=(f.vae_image_size,) * 2, mode="bilinear", antialias=True,
                                  align_corners=False).clamp(0, 1)
                yield x, labels

        uploads = client_latent_uploads(self.components.vae, self.components.scheduler, batches(),
                                        num_centroids=f.num_centroids, timestep=f.timestep,
                                        max_timestep=f.max_timestep, seed=seed, batch_size=f.encode_batch_size)
        return to_upload(uploads)

    # ---------------------------------------------------------------------------------- aggregate
    def aggregate(self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str],
                  round_plan: RoundPlan) -> State:
        if round_idx == 0:
            return self._aggregate_synthesis(state, uploads)
        plan = SystemPlan.from_decisions(round_plan.decisions)
        uploads = dict(uploads)  # LoRA blocks are averaged layer by layer over all uploads at once
        new = dict(state)
        if uploads:
            ups = [uploads[c] for c in sorted(uploads)]
            weights = [float(u.meta["num_samples"]) for u in ups]
            lora = layerwise_average(_strip(_LORA, state), [_strip(_LORA, u.tensors) for u in ups], weights,
                                     layer_of=lora_layer_index)
            new.update(_with(_LORA, lora))
            for key in (k for k in state if k.startswith(_HEAD)):
                new[key] = weighted_average([u.tensors[key] for u in ups], weights)
            contrib, measured = state["sys.contrib"].clone(), state["sys.contrib_round"].clone()
            for c, u in sorted(uploads.items()):
                g = u.tensors["contribution"].to(torch.float64)
                blocks = list(range(self.num_blocks - g.numel(), self.num_blocks))
                contrib[c, blocks], measured[c, blocks] = g, round_idx
            new["sys.contrib"], new["sys.contrib_round"] = contrib, measured
        depths = state["sys.depths"].clone()
        depths[plan.clients] = torch.as_tensor(plan.depths, dtype=torch.int64)
        clock = state["sys.clock"].clone()
        clock[2] += plan.round_time_s  # H^t: every device finishes compute + upload together (WFBA)
        new.update({"sys.depths": depths, "sys.clock": clock,
                    "sys.round_time": torch.tensor(plan.round_time_s, dtype=torch.float64)})
        return new

    def _aggregate_synthesis(self, state: State, uploads: Mapping[int, Upload]) -> State:
        env, f = self.env, self.config
        by_client = {c: from_upload(u) for c, u in uploads.items()}
        result = synthesise_and_pretrain(
            f, components=self.components, uploads_by_client=by_client, class_names=env.splits.classes,
            spec=self.spec, run_dir=env.run_dir, seed=self.cfg.seed, device=self.fabric.device,
            precision=self.cfg.federation.precision, progress=self.cfg.logging.progress)
        self.components.vae.to(self.fabric.device)
        model_state = result.model.state_dict()
        head = self.module.head_name + "."
        new = dict(state)
        new.update(_with(_BACKBONE, {k: v for k, v in model_state.items() if not k.startswith(head)}))
        new.update(_with(_HEAD, {k[len(head):]: v for k, v in model_state.items() if k.startswith(head)}))
        self._load_backbone(new)
        self.module.load_head_state(_with(_HEAD, _strip(_HEAD, new)))
        new.update(_with(_LORA, self.module.lora_state()))  # peft's init: A random, B = 0 → no change yet
        clock = state["sys.clock"].clone()
        clock[0], clock[1] = result.generation_s, result.pretraining_s
        new.update({"sys.clock": clock, "sys.lambda": torch.tensor(result.lam, dtype=torch.float64),
                    "sys.synthetic_images": torch.tensor(sum(result.images_per_class.values())),
                    "sys.real_samples": torch.tensor(sum(up.count for ups in by_client.values() for up in ups))})
        return new

    # ----------------------------------------------------------------------------------- evaluate
    def evaluate(self, state: State) -> dict[str, Any]:
        self._ensure_backbone(state)
        device = self.fabric.device
        self.module.load_lora_state({k: v.to(device) for k, v in _strip(_LORA, state).items()})
        self.module.load_head_state({k: v.to(device) for k, v in state.items() if k.startswith(_HEAD)})
        self.module.eval()
        return evaluate_on_test(self.env, self.module)

    def round_extras(self, round_idx: int, state: State) -> dict[str, float]:
        depths = state["sys.depths"]
        return {"simulated_time_s": float(state["sys.clock"].sum()),
                "simulated_round_s": float(state["sys.round_time"]) if round_idx > 0 else 0.0,
                "mean_depth": float(depths[depths > 0].float().mean()) if bool((depths > 0).any()) else 0.0}

    def summary_extras(self, state: State) -> dict[str, Any]:
        clock = state["sys.clock"].tolist()
        return {"simulated_time_s": float(sum(clock)),
                **{f"simulated_{name}_s": float(v) for name, v in zip(_CLOCK, clock)},
                "synthetic_images": int(state["sys.synthetic_images"]), "real_samples": int(state["sys.real_samples"]),
                "lambda": float(state["sys.lambda"]),
                "depth_policy": self.config.systems.depth_policy, "timing": self.config.systems.timing,
                "ignored_core_keys": list(UNUSED_CORE_KEYS),
                "final_depths": [int(x) for x in state["sys.depths"].tolist()],
                "num_blocks": int(self.num_blocks)}
