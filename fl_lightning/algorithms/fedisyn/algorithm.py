"""FeDiSyn ("Scaling Synthetic-Image Pre-Training for Federated Fine-Tuning of Large Vision Models").

Round 0 — synthesis (step 1) and server pre-training (step 2):
    clients VAE-encode their own images (the ViT normalisation undone, resized to the VAE's
    resolution), cluster each class into Z noised centroids + a noised mean and upload them with
    their counts D_i^k; the server takes λ (config, or λ* of the scaling law), expands labels into
    prompts, denoises round(λ·D^k) images per class into ``<run_dir>/synthetic/`` and pre-trains a
    timm ViT on them. The State then holds the pre-trained backbone and head and zero-effect LoRA
    (B = 0) in every block. With ``generation: text_only`` (the "w/o FG" ablation) clients upload
    their class counts only and the images start from pure noise and the prompt.

Rounds 1..T (``federation.rounds`` = T) — LoRA fine-tuning (step 3):
    plan: depths x_i by ``systems.depth_policy`` (CLC, Alg. 1, from the measured gradient
    contributions), bandwidths by ``systems.bandwidth_allocation`` (WFBA, Alg. 2, or B/N) over the
    simulated FDMA channel, H^t = the round time; client: train the LoRA of its last x_i blocks for E
    epochs and upload them with its per-block contribution ||∇θ_l||²; server: each block averaged over
    the devices that trained it (Iverson indicator, data-size weights).

The head. The paper fine-tunes LoRA parameters only, and so do we by default: the head keeps its
pre-trained value. ``train_head: true`` trains it too; it is then uploaded, averaged over all devices,
and its bytes count in the traffic and in every device's channel time.

Memory. A device whose memory holds fewer blocks than the policy asks for trains what it can hold;
the round's metrics (``over_memory_devices``, ``mean_requested_depth``) and the summary
(``requested_depths``, ``memory_limits``, ``over_memory_clients``) say so — nothing is capped silently.

Variants (one file each, adding to this class rather than switching parts of it off): SFLF and CAFF
(``synthesis = False``: no round 0, ImageNet-initialised ViT), GPT-FL and FGL (``full_parameter =
True``: full-parameter FedAvg after text-only synthesis).

Wire format. The first fine-tuning round's download carries the whole model (backbone, head, LoRA);
every LoRA download carries the global LoRA of ALL blocks (+ the head), because a device's frozen lower
blocks take part in its forward pass with the global adapters (see ``models/lora.py``); the upload
carries only the x_i trained blocks, which is what the channel model times (τ·x_i bits).

Server memory lives in the State only (checkpointed, survives ``--resume``): ``backbone.*``,
``head.*``, ``lora.*``, the contribution table ``sys.contrib`` / ``sys.contrib_round`` (N, L), the
clock ``sys.clock`` (H_gene, H_pre, Σ H^t), λ, the synthetic volume, the last depths, what the policy
requested and each device's memory limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from lightning.fabric import Fabric

from fl_lightning.algorithms.common import evaluate_on_test
from fl_lightning.algorithms.fedisyn.config import UNUSED_CORE_KEYS, FeDiSynConfig
from fl_lightning.algorithms.fedisyn.planning import SystemPlan, client_profiles, fit_host_times, plan_round
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
from fl_lightning.models.lora import LoraSpec, is_lora_param, lora_bits_per_layer, lora_layer_index
from fl_lightning.modules.lora_classifier import LoRAClassifier
from fl_lightning.synthesis.latents import ClassLatentUpload, client_latent_uploads, from_upload, to_upload
from fl_lightning.systems.contributions import estimate_contributions
from fl_lightning.systems.devices import measured_profiles

__all__ = ["FeDiSyn"]

_LORA, _HEAD, _BACKBONE = "lora.", "head.", "backbone."
_CLOCK = ("generation", "pretraining", "round")  # the order of sys.clock
_COUNTS = "class_counts"  # round-0 upload of the text-only variants: D_i^k per class (int64, C)
_BITS_PER_PARAM = 32  # float32 on the wire


def _strip(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def _with(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {prefix + k: v.detach().cpu().clone() for k, v in tensors.items()}


def _bits(tensors: Mapping[str, torch.Tensor]) -> float:
    return float(sum(t.numel() for t in tensors.values()) * _BITS_PER_PARAM)


@register("fedisyn")
class FeDiSyn(Algorithm):
    """FeDiSyn on the federation engine (see the module docstring for the rounds and the State, and
    :mod:`~fl_lightning.algorithms.fedisyn.config` for the core keys it uses and those it does not)."""

    config_class = FeDiSynConfig
    synthesis: bool = True  # round 0 = synthesis + server pre-training (SFLF, CAFF: none, ImageNet init)
    full_parameter: bool = False  # fine-tuning = full-parameter FedAvg (GPT-FL, FGL) instead of LoRA
    ignored_keys: tuple[str, ...] = ()  # keys of this method's section that it does not read (in summary.json)

    # ------------------------------------------------------------------------------------- set-up
    @property
    def _offset(self) -> int:
        """Index of the first fine-tuning round (after the synthesis round, when there is one)."""
        return 1 if self.synthesis else 0

    @property
    def num_rounds(self) -> int:
        return self._offset + self.cfg.federation.rounds  # [round 0 = synthesis + pre-training,] then T rounds

    @property
    def _uses_diffusion(self) -> bool:
        return self.synthesis

    @classmethod
    def preflight(cls, cfg: Any) -> None:
        """Every local resource the method needs, checked at once (one line listing what is missing)."""
        f, name = cfg.method, cls.name
        missing = []
        if cls.synthesis and f.diffusion_path is not None and not Path(f.diffusion_path).expanduser().is_dir():
            missing.append(f"{name}.diffusion_path={f.diffusion_path} (Stable Diffusion v1-5 diffusers folder)")
        if cls.synthesis and f.llm_path is not None and not Path(f.llm_path).expanduser().is_dir():
            missing.append(f"{name}.llm_path={f.llm_path} (causal-LM folder, e.g. LLaMA-7B; null: template prompts)")
        if f.pretrain_checkpoint is not None and not Path(f.pretrain_checkpoint).expanduser().is_file():
            missing.append(f"{name}.pretrain_checkpoint={f.pretrain_checkpoint} (timm ImageNet weights of "
                           f"{f.pretrain_model}; null: random init)")
        missing += cls._missing_resources(cfg)
        if missing:
            raise MissingResourceError(f"{cls.__name__} needs local weights that are not on disk: "
                                       + "; ".join(missing) + " — copy them there (nothing is downloaded) or change "
                                       "the paths")

    @classmethod
    def _missing_resources(cls, cfg: Any) -> list[str]:
        """Extra resources of a variant (FGL: the captioner)."""
        return []

    def build(self, fabric: Fabric) -> None:
        f = self.config
        self.fabric = fabric
        self.components = None
        if self._uses_diffusion:
            self.components = (load_diffusion(f.diffusion_path) if f.diffusion_path is not None
                               else tiny_diffusion_components(seed=self.cfg.seed, image_size=f.vae_image_size))
            self.components.vae.to(fabric.device)  # clients need only the VAE; the server moves the rest

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
        vit = timm.create_model(f.pretrain_model, pretrained=False, num_classes=env.num_classes,
                                **f.pretrain_overrides)
        spec = LoraSpec(rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout,
                        target_modules=tuple(lora.target_modules))
        self.module = self.fabric.to_device(LoRAClassifier(backbone=vit, spec=spec, lr=f.finetune_lr))
        self.num_blocks = self.module.num_blocks
        systems = self.config.systems
        if systems.depth_policy == "fixed" and systems.fixed_depth > self.num_blocks:
            raise ConfigError(f"{self.name}.systems.fixed_depth", systems.fixed_depth,
                              f"an int in [1, {self.num_blocks}] (the blocks of {f.pretrain_model})")
        self.profiles = client_profiles(systems, self.cfg.partition.num_clients)
        self.contribution = GradientContribution()
        self._backbone_loaded = False

    def _backbone_keys(self) -> dict[str, str]:
        """Plain timm key → key in the LoRA-wrapped model, for every non-LoRA, non-head weight."""
        inner = self.module.model.base_model.model
        return {k.replace(".base_layer", ""): k for k in inner.state_dict()
                if ".lora_" not in k and not k.startswith(self.module.head_name + ".")}

    def _backbone_state(self) -> dict[str, torch.Tensor]:
        """The wrapped model's backbone weights under their plain timm keys."""
        inner = self.module.model.base_model.model.state_dict()
        return {plain: inner[key] for plain, key in self._backbone_keys().items()}

    def _load_backbone(self, tensors: dict[str, torch.Tensor]) -> None:
        inner = self.module.model.base_model.model
        keys = self._backbone_keys()
        backbone = _strip(_BACKBONE, tensors)
        if set(backbone) != set(keys):
            raise ValueError(f"backbone state mismatch: {len(set(keys) ^ set(backbone))} differing keys")
        inner.load_state_dict({keys[k]: v for k, v in backbone.items()}, strict=False)
        self._backbone_loaded = True

    def _ensure_backbone(self, tensors: dict[str, torch.Tensor]) -> None:
        """Load the backbone once (LoRA: it never changes) or every time (full-parameter FedAvg)."""
        if self.full_parameter or not self._backbone_loaded:
            self._load_backbone(tensors)

    def load_state(self, state: State) -> None:
        """A resumed rank: the backbone reached it in the first fine-tuning download, so restore it here."""
        if any(k.startswith(_BACKBONE) for k in state):
            self._load_backbone(state)

    def initial_state(self) -> State:
        N, L = self.cfg.partition.num_clients, self.num_blocks
        state = {"sys.clock": torch.zeros(3, dtype=torch.float64),
                 "sys.contrib": torch.zeros(N, L, dtype=torch.float64),
                 "sys.contrib_round": torch.full((N, L), -1, dtype=torch.int64),
                 "sys.depths": torch.zeros(N, dtype=torch.int64),
                 "sys.requested": torch.zeros(N, dtype=torch.int64),
                 "sys.limits": torch.zeros(N, dtype=torch.int64),
                 "sys.over_memory_rounds": torch.zeros(N, dtype=torch.int64),
                 "sys.lambda": torch.tensor(0.0, dtype=torch.float64),
                 "sys.synthetic_images": torch.tensor(0, dtype=torch.int64),
                 "sys.real_samples": torch.tensor(0, dtype=torch.int64),
                 "sys.round_time": torch.tensor(0.0, dtype=torch.float64)}
        if not self.synthesis:
            state.update(self._model_state(self._initial_model()))
        return state

    def _initial_model(self) -> torch.nn.Module:
        """The ViT fine-tuning starts from when there is no synthetic pre-training: ImageNet weights from
        ``pretrain_checkpoint`` (random init when null, e.g. in tests), a fresh head for this dataset.
        Seeded by the run seed, so every rank builds the same one."""
        from fl_lightning.modules.pretraining import build_timm_vit

        f = self.config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.cfg.seed)
            return build_timm_vit(model_name=f.pretrain_model, num_classes=self.env.num_classes,
                                  overrides=f.pretrain_overrides, checkpoint=f.pretrain_checkpoint)

    def _model_state(self, model: torch.nn.Module) -> State:
        """backbone.* / head.* of a plain timm model, and LoRA at peft's init (B = 0: no effect yet)."""
        model_state = model.state_dict()
        head = self.module.head_name + "."
        new = _with(_BACKBONE, {k: v for k, v in model_state.items() if not k.startswith(head)})
        new.update(_with(_HEAD, {k[len(head):]: v for k, v in model_state.items() if k.startswith(head)}))
        self._load_backbone(new)
        self.module.load_head_state(_with(_HEAD, _strip(_HEAD, new)))
        new.update(_with(_LORA, self.module.lora_state()))
        return new

    # ------------------------------------------------------------------------------------- plan
    def _payload_bits(self, state: State) -> dict[str, float]:
        """What one device uploads, for the channel model: τ per LoRA block and the head's bits if it
        trains; or the whole model (full-parameter FedAvg)."""
        head = _bits(_strip(_HEAD, state))
        if self.full_parameter:
            return {"layer_bits": float(lora_bits_per_layer(_strip(_LORA, state))),
                    "full_model_bits": _bits(_strip(_BACKBONE, state)) + head}
        return {"layer_bits": float(lora_bits_per_layer(_strip(_LORA, state))),
                "extra_bits": head if self.config.train_head else 0.0}

    def plan(self, round_idx: int, clients, state: State, history: RoundHistory) -> RoundPlan:
        if round_idx < self._offset:
            return RoundPlan({c: Download() for c in clients})  # clients need nothing: they hold the SD VAE
        self._ensure_backbone(state)
        E = max(self.cfg.train.epochs, 1)
        sizes = np.array([len(p) for p in self.env.partition], dtype=np.float64)
        profiles = self.profiles
        if self.config.systems.timing == "measured" and round_idx > self._offset:
            depths = {int(c): int(x) for c, x in enumerate(state["sys.depths"].tolist()) if x > 0}
            fit = fit_host_times(history.client_compute_s, {c: sizes[c] * E for c in depths}, depths)
            if fit is not None:
                profiles = measured_profiles(self.profiles, *fit)
        plan = plan_round(self.config.systems, clients=clients, profiles=profiles, samples=sizes * E,
                          contributions=estimate_contributions(state["sys.contrib"].numpy(),
                                                               state["sys.contrib_round"].numpy()),
                          num_layers=self.num_blocks, **self._payload_bits(state))
        first = round_idx == self._offset
        model = {k: v for k, v in state.items()
                 if (k.startswith(_LORA) or k.startswith(_HEAD)
                     or k.startswith(_BACKBONE) and (first or self.full_parameter))}  # LoRA: the model goes out once
        return RoundPlan({c: Download(model, {"depth": int(x)}) for c, x in zip(plan.clients, plan.depths)},
                         plan.as_decisions())

    # ------------------------------------------------------------------------------------ client
    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        seed = client_seed(self.cfg.seed, round_idx, client.index)
        if round_idx < self._offset:
            return self._synthesis_upload(client, seed)
        self._ensure_backbone(download.tensors)
        self.module.load_lora_state(_strip(_LORA, download.tensors))
        self.module.load_head_state(_with(_HEAD, _strip(_HEAD, download.tensors)))
        loader = self.env.loader(client.dataset, shuffle=True, seed=seed, batch_size=self.cfg.train.batch_size)
        if self.full_parameter:
            for name, param in self.module.model.named_parameters():
                param.requires_grad_(not is_lora_param(name))  # every weight but the (zero-effect) adapters
            fit_local(self.fabric, self.module, loader, epochs=self.cfg.train.epochs)
            tensors = {**_with(_BACKBONE, self._backbone_state()),
                       **_with(_HEAD, _strip(_HEAD, self.module.head_state()))}
            return Upload(tensors, {"num_samples": client.num_samples})
        trained = self.module.set_depth(int(download.meta["depth"]))
        self.module.head.requires_grad_(self.config.train_head)  # the paper: LoRA parameters only
        self.contribution.reset()
        fit_local(self.fabric, self.module, loader, epochs=self.cfg.train.epochs, callbacks=[self.contribution])
        per_layer = self.contribution.per_layer()
        tensors = {**_with(_LORA, self.module.lora_state(trained_only=True)),
                   "contribution": torch.tensor([per_layer.get(l, 0.0) for l in trained], dtype=torch.float32)}
        if self.config.train_head:
            tensors.update(_with(_HEAD, _strip(_HEAD, self.module.head_state())))
        return Upload(tensors, {"num_samples": client.num_samples})

    def _synthesis_upload(self, client: Client, seed: int) -> Upload:
        """Step 1 on a client: images back to [0, 1] at the VAE's resolution → noised class latents
        (``text_only``: the class counts only)."""
        f = self.config
        if f.generation == "text_only":
            return Upload({_COUNTS: torch.as_tensor(client.class_counts, dtype=torch.int64)})
        batches = self._client_images(client, batch_size=f.encode_batch_size, size=f.vae_image_size)
        uploads = client_latent_uploads(self.components.vae, self.components.scheduler, batches,
                                        num_centroids=f.num_centroids, timestep=f.timestep,
                                        max_timestep=f.max_timestep, seed=seed, batch_size=f.encode_batch_size)
        return to_upload(uploads)

    def _client_images(self, client: Client, *, batch_size: int, size: int | None = None):
        """A client's own images back in [0, 1] (the ViT normalisation undone), resized to ``size``, with labels."""
        mean = torch.tensor(self.spec.mean).view(1, 3, 1, 1)
        std = torch.tensor(self.spec.std).view(1, 3, 1, 1)
        for images, labels in self.env.loader(client.dataset, shuffle=False, batch_size=batch_size):
            x = (images * std + mean).clamp(0, 1)
            if size is not None:
                x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False).clamp(0, 1)
            yield x, labels

    # ---------------------------------------------------------------------------------- aggregate
    def aggregate(self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str],
                  round_plan: RoundPlan) -> State:
        if round_idx < self._offset:
            return self._aggregate_synthesis(state, uploads)
        plan = SystemPlan.from_decisions(round_plan.decisions)
        new = dict(state)
        if self.full_parameter:
            new.update(self._fedavg(state, uploads))
        else:
            new.update(self._aggregate_lora(round_idx, state, uploads))
        clients = plan.clients
        for key, values in (("sys.depths", plan.depths), ("sys.requested", plan.requested),
                            ("sys.limits", plan.limits)):
            column = state[key].clone()
            column[clients] = torch.as_tensor(values if values is not None else plan.depths, dtype=torch.int64)
            new[key] = column
        over = state["sys.over_memory_rounds"].clone()
        over[clients] += torch.as_tensor(plan.over_memory, dtype=torch.int64)
        clock = state["sys.clock"].clone()
        clock[2] += plan.round_time_s  # H^t: the last device has computed and uploaded
        new.update({"sys.over_memory_rounds": over, "sys.clock": clock,
                    "sys.round_time": torch.tensor(plan.round_time_s, dtype=torch.float64)})
        return new

    def _aggregate_lora(self, round_idx: int, state: State, uploads: Mapping[int, Upload]) -> State:
        """Each LoRA block averaged over the devices that trained it; the head over all (when it trains)."""
        uploads = dict(uploads)  # LoRA blocks are averaged layer by layer over all uploads at once
        if not uploads:
            return {}
        ups = [uploads[c] for c in sorted(uploads)]
        weights = [float(u.meta["num_samples"]) for u in ups]
        new = _with(_LORA, layerwise_average(_strip(_LORA, state), [_strip(_LORA, u.tensors) for u in ups], weights,
                                             layer_of=lora_layer_index))
        for key in (k for k in state if k.startswith(_HEAD)):
            if all(key in u.tensors for u in ups):
                new[key] = weighted_average([u.tensors[key] for u in ups], weights)
        contrib, measured = state["sys.contrib"].clone(), state["sys.contrib_round"].clone()
        for c, u in zip(sorted(uploads), ups):
            g = u.tensors["contribution"].to(torch.float64)
            blocks = list(range(self.num_blocks - g.numel(), self.num_blocks))
            contrib[c, blocks], measured[c, blocks] = g, round_idx
        new["sys.contrib"], new["sys.contrib_round"] = contrib, measured
        return new

    def _fedavg(self, state: State, uploads: Mapping[int, Upload]) -> State:
        """Full-parameter FedAvg: Σ n_k w_k / Σ n_k per backbone and head tensor, folded in client order
        (server memory: one model's running sum, flat in K)."""
        sums: dict[str, torch.Tensor] = {}
        total = 0.0
        for _, upload in uploads.items():
            n = float(upload.meta["num_samples"])
            for key, value in upload.tensors.items():
                if key.startswith((_BACKBONE, _HEAD)):
                    term = value.to(torch.float64) * n
                    sums[key] = sums[key] + term if key in sums else term
            total += n
        if total <= 0:
            return {}
        return {key: (acc / total).to(state[key].dtype) for key, acc in sums.items()}

    def _synthesis_inputs(self, uploads: Mapping[int, Upload]):
        """(latent uploads by client or None, D^k per class, prompts by class or None) from round 0's uploads."""
        counts = np.zeros(self.env.num_classes, dtype=np.int64)
        if self.config.generation == "text_only":
            for _, u in uploads.items():
                counts += u.tensors[_COUNTS].numpy()
            return None, {k: int(v) for k, v in enumerate(counts)}, None
        by_client: dict[int, list[ClassLatentUpload]] = {c: from_upload(u) for c, u in uploads.items()}
        for ups in by_client.values():
            for up in ups:
                counts[up.label] += up.count
        return by_client, {k: int(v) for k, v in enumerate(counts)}, None

    def _aggregate_synthesis(self, state: State, uploads: Mapping[int, Upload]) -> State:
        env, f = self.env, self.config
        by_client, counts, prompts = self._synthesis_inputs(uploads)
        result = synthesise_and_pretrain(
            f, components=self.components, uploads_by_client=by_client, class_counts=counts,
            class_names=env.splits.classes, spec=self.spec, run_dir=env.run_dir, seed=self.cfg.seed,
            device=self.fabric.device, precision=self.cfg.federation.precision, progress=self.cfg.logging.progress,
            prompts_by_class=prompts, section=self.name)
        self.components.vae.to(self.fabric.device)
        new = dict(state)
        new.update(self._model_state(result.model))
        clock = state["sys.clock"].clone()
        clock[0], clock[1] = result.generation_s, result.pretraining_s
        new.update({"sys.clock": clock, "sys.lambda": torch.tensor(result.lam, dtype=torch.float64),
                    "sys.synthetic_images": torch.tensor(sum(result.images_per_class.values())),
                    "sys.real_samples": torch.tensor(sum(counts.values()))})
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
        depths, requested, limits = state["sys.depths"], state["sys.requested"], state["sys.limits"]
        active = depths > 0
        tuning = round_idx >= self._offset and bool(active.any())
        return {"simulated_time_s": float(state["sys.clock"].sum()),
                "simulated_round_s": float(state["sys.round_time"]) if tuning else 0.0,
                "mean_depth": float(depths[active].float().mean()) if tuning else 0.0,
                "mean_requested_depth": float(requested[active].float().mean()) if tuning else 0.0,
                # devices (of those that last took part) whose memory holds fewer blocks than requested
                "over_memory_devices": float((requested[active] > limits[active]).sum()) if tuning else 0.0}

    def summary_extras(self, state: State) -> dict[str, Any]:
        clock = state["sys.clock"].tolist()
        systems = self.config.systems
        over = state["sys.over_memory_rounds"]
        return {"simulated_time_s": float(sum(clock)),
                **{f"simulated_{name}_s": float(v) for name, v in zip(_CLOCK, clock)},
                "synthetic_images": int(state["sys.synthetic_images"]), "real_samples": int(state["sys.real_samples"]),
                "lambda": float(state["sys.lambda"]),
                "depth_policy": "full (full-parameter FedAvg)" if self.full_parameter else systems.depth_policy,
                "bandwidth_allocation": systems.bandwidth_allocation, "timing": systems.timing,
                "generation": self.config.generation if self.synthesis else "none",
                "train_head": bool(self.config.train_head or self.full_parameter),
                "ignored_core_keys": list(UNUSED_CORE_KEYS), "ignored_method_keys": list(self.ignored_keys),
                "final_depths": [int(x) for x in state["sys.depths"].tolist()],
                "requested_depths": [int(x) for x in state["sys.requested"].tolist()],
                "memory_limits": [int(x) for x in state["sys.limits"].tolist()],
                "over_memory_clients": [int(c) for c in torch.nonzero(over > 0).flatten().tolist()],
                "num_blocks": int(self.num_blocks)}
