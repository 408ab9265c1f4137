"""The FeDiSyn family's synthesis stage (round 0): steps 1 and 2 — clients' uploads → synthetic images → a pre-trained ViT.

The seam is :class:`SynthesisStage`: a source says what a client uploads (:meth:`~SynthesisStage.client_update`)
and how the server turns the uploads into a pre-trained model (:meth:`~SynthesisStage.synthesise`); the
stage writes that model and the clock into the State. The sources here denoise with Stable Diffusion
(:class:`DiffusionSynthesis`), starting from

* :class:`FeatureGuidedSynthesis` (FeDiSyn): the clients' noised class latents — each client VAE-encodes
  its images (the ViT normalisation undone, resized to the VAE's resolution), clusters each class into
  Z noised centroids + a noised mean and uploads them with their counts D_i^k;
* :class:`TextOnlySynthesis` (GPT-FL, FeDiSyn's "w/o FG" ablation): pure noise and the prompt; clients
  upload their class counts only;
* FGL's captions (``algorithms/fgl.py``).

The server takes λ (config, or λ* of the scaling law), expands labels into prompts, denoises
round(λ·D^k) images per class into ``<run_dir>/synthetic/`` and pre-trains a timm ViT on them
(``synthesis_step.py``). A new source — e.g. the paper's w/o DM, a class-conditional GAN trained on the
server from the uploads — is one new file: a :class:`SynthesisStage` subclass with its config and its
two methods, and a method that declares ``stages = (GANSynthesis, LoRAFineTuning)``. (w/o DM is not
implemented: the paper gives neither the GAN's architecture nor its budget, and Z + 1 noised latents
per client and class are far too little to train one that stands in for Stable Diffusion at 224 px.)
"""

from __future__ import annotations

import dataclasses
import math
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from fl_lightning.algorithms.synthetic_family.config import ViTConfig
from fl_lightning.algorithms.synthetic_family.planning import upload_time_s
from fl_lightning.algorithms.synthetic_family.synthesis_step import SynthesisResult, synthesise_and_pretrain
from fl_lightning.errors import check
from fl_lightning.federation.algorithm import State
from fl_lightning.federation.precision import compute_dtype
from fl_lightning.federation.ranks.collectives import Ranks
from fl_lightning.federation.ranks.placement import client_seed
from fl_lightning.federation.stages import Stage, StageConfig
from fl_lightning.federation.transport import Upload
from fl_lightning.synthesis.latents import ClassLatentUpload, client_latent_uploads, from_upload, to_upload

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from fl_lightning.federation.algorithm import Client, RoundPlan
    from fl_lightning.federation.transport import Download

__all__ = [
    "PretrainingConfig",
    "DiffusionConfig",
    "PromptConfig",
    "TextOnlyConfig",
    "FeatureGuidedConfig",
    "SynthesisState",
    "GenerationInputs",
    "SynthesisStage",
    "DiffusionSynthesis",
    "TextOnlySynthesis",
    "FeatureGuidedSynthesis",
]

_COUNTS = "class_counts"  # the text-only upload: D_i^k per class (int64, C)
# a stage's keys that say where round 0's inputs and results are kept, how often pre-training's ranks check in or
# where the pilots run, never what round 0 makes (the λ the pilots give is in its requests): left out of its content
# key (round0_description)
_NOT_CONTENT = frozenset({"round0_inputs", "round0_dir", "pretrain_check_every", "pilot_ranks"})


@dataclass
class PretrainingConfig(ViTConfig):
    """λ and step 2 (server pre-training on the synthetic images)."""

    # λ: synthetic images per real image. auto: run the pilots (pilot_lambdas × pilot_rounds, in <run_dir>/pilots/),
    # fit Eq. (13) and use its minimiser λ* (the fit is in summary.json); null: λ* of the given scaling_kappa
    synthetic_lambda: float | Literal["auto"] | None = 1.0
    scaling_kappa: list | None = None  # κ1..κ4 fitted on pilot runs (notebooks/fedisyn_scaling_law.ipynb)
    pilot_lambdas: list = field(default_factory=lambda: [0.05, 0.1, 0.2, 0.4])  # small λ: cheap pilots
    pilot_rounds: int = 3  # fine-tuning rounds of each pilot (every round is one (λ, Acc, H) observation)
    # over several ranks: one = each rank runs its share of the pilots, each a one-process run (the fit of one rank);
    # all = the pilots one after another, each over all the ranks as the run's round 0 is (pilot_launch.py: faster
    # with fewer pilots than ranks; its pre-training, hence λ*, within round-off of one rank's, not bit for bit)
    pilot_ranks: Literal["one", "all"] = "one"
    # a folder of round 0's client uploads and prompt cache to read instead of computing them again: what the pilots
    # of synthetic_lambda: auto get from their run (<run_dir>/pilots/round0_inputs, round0_inputs.py); null: compute
    round0_inputs: str | None = None
    # where round 0's images and pre-trained ViT are shared by content key (synthesis_step.SharedRound0; null:
    # <output_dir>/round0). The pilots of synthetic_lambda: auto get their run's, so a comparison's variants that
    # differ only after round 0 make each pilot's round 0 once
    round0_dir: str | None = None
    target_accuracy: float = 0.8  # Acc of λ* = (κ2 e^{κ3 Acc} / (h0 κ1))^{1/(κ2+1)}
    # the server the clock charges generation and pre-training on (systems/server.py): the paper's RTX 4090, or
    # host = this machine's wall clock. The host's wall times are reported beside the charged ones either way
    server: Literal["rtx_4090", "host"] = "rtx_4090"
    # ĥ and h̃ (s): numbers override the server profile (null: from `server`)
    generation_time_per_image_s: float | None = None
    pretrain_time_per_image_epoch_s: float | None = None  # h̃, pre-training seconds per image and epoch
    pretrain_epochs: int = 10  # T̂
    pretrain_lr: float = 3e-4  # AdamW peak, cosine decay (ViT fine-tuning order)
    pretrain_batch_size: int = 64  # images per pre-training step (pretrain_batch says per rank or global)
    pretrain_holdout: float = 0.1  # held-out synthetic fraction for early stopping
    pretrain_patience: int = 3  # epochs without held-out improvement before stopping
    # over several ranks, the steps between two checks that every rank's step went well (an all-reduce and a host
    # sync each, modules/pretraining_ranks.py RankGuard); between checks a failing rank is ended by the ranks'
    # liveness watch (federation.liveness_timeout_s). 1: every step. The weights do not depend on it
    pretrain_check_every: int = 25
    # over several ranks: global = pretrain_batch_size is the global batch, split over the ranks (the one-rank
    # training); per_rank = every rank loads pretrain_batch_size rows (global batch N·B, N times fewer steps) and the
    # peak rate is scaled by pretrain_lr_scaling: sqrt (η·√N, Adam's square-root rule), linear (η·N) or none
    pretrain_batch: Literal["global", "per_rank"] = "global"
    pretrain_lr_scaling: Literal["sqrt", "linear", "none"] = "sqrt"  # how the peak rate grows with the ranks (above)
    # how pre-training reads the images (synthesis/store.py): exact = a uint8 store decoded once, the same items bit
    # for bit; input = one store at the ViT's input size, training crops taken from it (not bit-identical); off = PNGs
    pretrain_store: Literal["exact", "input", "off"] = "exact"

    def __post_init__(self) -> None:
        super().__post_init__()
        check(
            self.synthetic_lambda in (None, "auto") or self.synthetic_lambda > 0,
            "synthetic_lambda",
            self.synthetic_lambda,
            "a float > 0, auto or null",
        )
        check(
            len(self.pilot_lambdas) >= 2
            and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in self.pilot_lambdas
            ),
            "pilot_lambdas",
            self.pilot_lambdas,
            "a list of at least 2 floats > 0",
        )
        check(
            self.pilot_rounds >= 1 and len(self.pilot_lambdas) * (self.pilot_rounds + 1) >= 4,
            "pilot_rounds",
            self.pilot_rounds,
            "an int >= 1 giving >= 4 pilot observations (len(pilot_lambdas) x (rounds + 1))",
        )
        check(
            self.scaling_kappa is None
            or len(self.scaling_kappa) == 4
            and all(isinstance(k, (int, float)) and not isinstance(k, bool) for k in self.scaling_kappa),
            "scaling_kappa",
            self.scaling_kappa,
            "null or a list of 4 numbers [κ1, κ2, κ3, κ4]",
        )
        check(
            self.scaling_kappa is None
            or all(math.isfinite(k) for k in self.scaling_kappa)
            and self.scaling_kappa[0] > 0
            and self.scaling_kappa[1] > 0,
            "scaling_kappa",
            self.scaling_kappa,
            "finite [κ1, κ2, κ3, κ4] with κ1 > 0 and κ2 > 0 (otherwise H(λ) has no minimum: no λ*)",
        )
        check(
            self.synthetic_lambda is not None or self.scaling_kappa is not None,
            "scaling_kappa",
            self.scaling_kappa,
            "[κ1, κ2, κ3, κ4] when synthetic_lambda is null (λ* needs the fitted law)",
        )
        check(0 < self.target_accuracy <= 1, "target_accuracy", self.target_accuracy, "a float in (0, 1]")
        for key in ("generation_time_per_image_s", "pretrain_time_per_image_epoch_s"):
            value = getattr(self, key)
            check(value is None or value >= 0, key, value, "null or a float >= 0")
        check(self.pretrain_epochs >= 1, "pretrain_epochs", self.pretrain_epochs, "an int >= 1")
        check(self.pretrain_lr > 0, "pretrain_lr", self.pretrain_lr, "a float > 0")
        check(self.pretrain_batch_size >= 1, "pretrain_batch_size", self.pretrain_batch_size, "an int >= 1")
        check(0 < self.pretrain_holdout < 1, "pretrain_holdout", self.pretrain_holdout, "a float in (0, 1)")
        check(self.pretrain_patience >= 1, "pretrain_patience", self.pretrain_patience, "an int >= 1")
        check(self.pretrain_check_every >= 1, "pretrain_check_every", self.pretrain_check_every, "an int >= 1 (steps)")


@dataclass
class DiffusionConfig(PretrainingConfig):
    """Stable Diffusion on the server (a local folder or a hub id read from the HF cache; model.download fetches)."""

    # a diffusers SD v1-5 folder or hub id (stable-diffusion-v1-5/stable-diffusion-v1-5); null: tiny random (tests)
    diffusion_path: str | None = None
    vae_image_size: int = 512  # SD v1-5's native resolution (clients resize their images to it)
    guidance_scale: float = 7.5  # SD's usual classifier-free guidance
    num_inference_steps: int = 50  # PNDM steps of the full 0..T chain (a start at s runs ≈ 50·s/T)
    generation_batch_size: int = 16  # images per Stable Diffusion call
    min_fresh_fraction: float = 0.25  # floor on each image's own share of its start noise (synthesis/generate.py)
    diffusion_precision: Literal["auto", "float32", "float16", "bfloat16"] = "auto"  # auto: fp16 on GPU, fp32 on CPU
    generation: Literal["text_only"] = "text_only"  # where an image starts: pure noise + its prompt

    def __post_init__(self) -> None:
        super().__post_init__()
        check(
            self.vae_image_size >= 8 and self.vae_image_size % 8 == 0,
            "vae_image_size",
            self.vae_image_size,
            "a multiple of 8 (>= 8)",
        )
        check(self.guidance_scale >= 0, "guidance_scale", self.guidance_scale, "a float >= 0")
        check(1 <= self.num_inference_steps <= 1000, "num_inference_steps", self.num_inference_steps, "an int in [1, 1000]")
        check(self.generation_batch_size >= 1, "generation_batch_size", self.generation_batch_size, "an int >= 1")
        check(0 <= self.min_fresh_fraction < 1, "min_fresh_fraction", self.min_fresh_fraction, "a float in [0, 1)")


@dataclass
class PromptConfig(StageConfig):
    """Label → prompts expansion (the paper: LLaMA-7B)."""

    llm_path: str | None = None  # a causal LM folder or hub id for prompt expansion; null: templates
    prompts_per_label: int = 8  # prompts the LLM (or the templates) writes per class

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.prompts_per_label >= 1, "prompts_per_label", self.prompts_per_label, "an int >= 1")


@dataclass
class TextOnlyConfig(DiffusionConfig, PromptConfig):
    """Text-only generation from the label prompts (GPT-FL; FeDiSyn w/o FG)."""


@dataclass
class FeatureGuidedConfig(TextOnlyConfig):
    """FeDiSyn's step 1: the clients' noised latent centroids guide the generation."""

    encode_batch_size: int = 16  # images per VAE call on a client
    num_centroids: int = 4  # Z k-means centroids per class per client
    timestep: int | None = None  # s; null: random in [min_timestep, max_timestep] per class
    min_timestep: int = 1  # floor of s (the paper draws s in 1..S): s = 0 would upload an almost clean latent
    max_timestep: int = 600  # S: above ~600 of 1000 the class content is mostly noise
    rho: float = 0.7  # Ē = ρ·e_z + (1−ρ)·e_avg
    # feature_guided = FeDiSyn; text_only = pure noise + prompts, clients upload counts only (w/o FG)
    generation: Literal["feature_guided", "text_only"] = "feature_guided"

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.encode_batch_size >= 1, "encode_batch_size", self.encode_batch_size, "an int >= 1")
        check(self.num_centroids >= 1, "num_centroids", self.num_centroids, "an int >= 1")
        check(
            1 <= self.min_timestep <= 999,
            "min_timestep",
            self.min_timestep,
            "an int in [1, 999] (s = 0 would upload an almost clean latent)",
        )
        check(
            self.min_timestep <= self.max_timestep < 1000,
            "max_timestep",
            self.max_timestep,
            f"an int in [min_timestep={self.min_timestep}, 999]",
        )
        check(
            self.timestep is None or self.min_timestep <= self.timestep < 1000,
            "timestep",
            self.timestep,
            f"null or an int in [min_timestep={self.min_timestep}, 999] (s >= 1: s = 0 uploads an almost clean latent)",
        )
        check(0 <= self.rho <= 1, "rho", self.rho, "a float in [0, 1]")


@dataclass
class SynthesisState:
    """The synthesis stage's server memory, checkpointed in the State under ``sys.*``."""

    lam: torch.Tensor  # () float64: λ used
    synthetic_images: torch.Tensor  # () int64: images generated (Σ_k round(λ·D^k))
    real_samples: torch.Tensor  # () int64: D, the clients' real samples

    _KEYS = {"lam": "sys.lambda", "synthetic_images": "sys.synthetic_images", "real_samples": "sys.real_samples"}

    @classmethod
    def zeros(cls) -> SynthesisState:
        return cls(torch.tensor(0.0, dtype=torch.float64), torch.tensor(0, dtype=torch.int64), torch.tensor(0, dtype=torch.int64))

    def state_dict(self) -> State:
        return {key: getattr(self, name) for name, key in self._KEYS.items()}

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor]) -> SynthesisState:
        return cls(**{name: state[key] for name, key in cls._KEYS.items()})


@dataclass
class GenerationInputs:
    """What the server generates from, read off round 0's uploads."""

    class_counts: dict[int, int]  # D^k per label, summed over the clients
    latents_by_client: dict[int, list[ClassLatentUpload]] | None = None  # feature-guided starts; None: pure noise
    prompts_by_class: dict[str, list[str]] | None = None  # None: expand the labels (llm_path or templates)


class SynthesisStage(Stage):
    """One round: clients upload what the source needs; the server synthesises and pre-trains the ViT."""

    config_class = PretrainingConfig

    def initial_state(self) -> State:
        # this host's wall times of generation and pre-training, reported beside the charged ones (not on the clock)
        return {
            **SynthesisState.zeros().state_dict(),
            "sys.host_times": torch.zeros(2, dtype=torch.float64),
            "sys.lambda_fit": torch.zeros(6, dtype=torch.float64),
        }  # λ* = 0: no fit

    @abstractmethod
    def synthesise(self, uploads: Mapping[int, Upload]) -> tuple[SynthesisResult | None, int]:
        """(the pre-trained model with λ, volumes and times; D = the real samples) from round 0's uploads; in a
        shared aggregate (``shared_aggregate``) None on the ranks other than 0."""

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        sent = {int(c): float(u.num_bytes) for c, u in uploads.items()}  # latents, captions or counts
        result, real_samples = self.synthesise(uploads)
        if result is None:  # another rank of a shared aggregate: its images are written; rank 0's state is the round's
            return state
        m = self.method
        new = dict(state)
        new.update(m.model_state(result.model))
        clock = state["sys.clock"].clone()
        clock[0], clock[1] = result.generation_s, result.pretraining_s
        # the synthesis upload is charged on the channel like any other (systems.bandwidth_allocation, no compute)
        clock[3] = upload_time_s(m.config.systems, m.profiles, {c: 8 * b for c, b in sent.items()})
        traffic = state["sys.bytes_up"].clone()
        traffic[0] += sum(sent.values())
        host = torch.tensor([result.host_generation_s, result.host_pretraining_s], dtype=torch.float64)
        own = SynthesisState(
            torch.tensor(result.lam, dtype=torch.float64),
            torch.tensor(sum(result.images_per_class.values())),
            torch.tensor(real_samples),
        )
        fit = result.lambda_fit  # synthetic_lambda: auto — κ1..κ4, λ*, h0 of the pilots' fit
        lambda_fit = (
            torch.zeros(6, dtype=torch.float64)
            if fit is None
            else torch.tensor(
                [fit.params.kappa1, fit.params.kappa2, fit.params.kappa3, fit.params.kappa4, fit.lam_star, fit.h0],
                dtype=torch.float64,
            )
        )
        new.update(
            {
                "sys.clock": clock,
                "sys.bytes_up": traffic,
                **own.state_dict(),
                "sys.host_times": host,
                "sys.lambda_fit": lambda_fit,
            }
        )
        return new

    def summary_extras(self, state: State) -> dict[str, Any]:
        own = SynthesisState.from_state(state)
        host, fit = state["sys.host_times"].tolist(), state["sys.lambda_fit"].tolist()
        lambda_fit = (
            None
            if fit[4] == 0
            else {
                "kappa": fit[:4],
                "lambda_star": fit[4],
                "h0": fit[5],
                "target_accuracy": self.method.config.target_accuracy,
                "pilots": str(self.method.env.run_dir / "pilots"),
            }
        )
        return {
            "generation": self.method.config.generation,
            "synthetic_images": int(own.synthetic_images),
            "real_samples": int(own.real_samples),
            "lambda": float(own.lam),
            "server": self.method.config.server,
            "host_generation_s": float(host[0]),
            "host_pretraining_s": float(host[1]),
            "lambda_fit": lambda_fit,
        }


class DiffusionSynthesis(SynthesisStage):
    """Synthesis with Stable Diffusion (PNDM) conditioned on CLIP text embeddings of the prompts."""

    config_class = DiffusionConfig
    shared_aggregate = True  # every rank samples its share of the images and pre-trains data-parallel (synthesis_step)

    @classmethod
    def missing_resources(cls, config: Any, section: str, *, download: bool = False) -> list[str]:
        from fl_lightning.models.hub import missing_weights_phrase

        path = config.diffusion_path
        phrase = (
            None
            if path is None
            else missing_weights_phrase(
                path, key=f"{section}.diffusion_path", what="Stable Diffusion v1-5 diffusers folder or hub id", download=download
            )
        )
        return [phrase] if phrase else []

    def build(self, fabric: Fabric) -> None:
        from fl_lightning.models.diffusion import load_diffusion, tiny_diffusion_components

        f = self.method.config
        download = self.method.cfg.model.download
        self.components = (
            load_diffusion(f.diffusion_path, download=download, key=f"{self.method.name}.diffusion_path")
            if f.diffusion_path is not None
            else tiny_diffusion_components(seed=self.method.cfg.seed, image_size=f.vae_image_size)
        )
        self.components.vae.to(fabric.device)  # clients need only the VAE; the server moves the rest

    def round0_description(self) -> dict[str, Any]:
        """What round 0 reads besides its requests: this stage's keys (``config_class``), the run's seed and
        precision, the classes, the ViT's input spec and the pre-training's loader workers (their number picks the
        augmentations' random streams) — the content key of ``synthesis_step.SharedRound0``."""
        m = self.method
        keys = {f.name: getattr(m.config, f.name) for f in dataclasses.fields(self.config_class) if f.name not in _NOT_CONTENT}
        return {
            "stage": type(self).__name__,
            "keys": keys,
            "seed": m.cfg.seed,
            "precision": m.cfg.federation.precision,
            "classes": list(m.env.splits.classes),
            "spec": dataclasses.asdict(m.spec),
            "pretrain_workers": m.env.loader_settings().num_workers,
        }

    @abstractmethod
    def generation_inputs(self, uploads: Mapping[int, Upload]) -> GenerationInputs:
        """Counts, latents and prompts from round 0's uploads."""

    def inputs_key(self) -> str:
        """The content key of this run's round-0 inputs (:func:`round0_inputs.inputs_key`)."""
        from fl_lightning.algorithms.synthetic_family.round0_inputs import inputs_key

        return inputs_key(dataclasses.asdict(self.method.cfg), "method")

    def _hand_round0_to_pilots(self, uploads: Mapping[int, Upload]) -> None:
        """Before the pilots: write round 0's uploads for them (``synthetic_lambda: auto``, on the server); in a pilot,
        start the prompt cache from its run's."""
        from fl_lightning.algorithms.synthetic_family import round0_inputs

        m = self.method
        if m.config.round0_inputs is not None:
            round0_inputs.seed_prompt_cache(m.config.round0_inputs, self.inputs_key(), m.env.run_dir / "prompts.json")
        elif m.config.synthetic_lambda == "auto" and m.fabric.global_rank == 0:
            round0_inputs.write_round0_inputs(m.env.run_dir / "pilots" / round0_inputs.FOLDER, self.inputs_key(), uploads)

    def synthesise(self, uploads: Mapping[int, Upload]) -> tuple[SynthesisResult | None, int]:
        m = self.method
        f = m.cfg.federation
        ranks = Ranks(m.fabric, f.collective_timeout_s, f.compute_timeout_s) if m.env.shared else None
        self._hand_round0_to_pilots(uploads)
        inputs = self.generation_inputs(uploads)
        result = synthesise_and_pretrain(
            m.config,
            components=self.components,
            uploads_by_client=inputs.latents_by_client,
            class_counts=inputs.class_counts,
            class_names=m.env.splits.classes,
            spec=m.spec,
            run_dir=m.env.run_dir,
            seed=m.cfg.seed,
            device=m.fabric.device,
            precision=m.cfg.federation.precision,
            progress=m.cfg.logging.progress,
            prompts_by_class=inputs.prompts_by_class,
            section=m.name,
            text_only=inputs.latents_by_client is None,
            ranks=ranks,
            share=self.round0_description(),
            loading=m.env.loader_settings(),
        )
        self.components.vae.to(m.fabric.device)
        return result, sum(inputs.class_counts.values())


class TextOnlySynthesis(DiffusionSynthesis):
    """Clients upload their class counts D_i^k (C int64 scalars); images start from pure noise and prompts."""

    config_class = TextOnlyConfig

    @classmethod
    def missing_resources(cls, config: Any, section: str, *, download: bool = False) -> list[str]:
        from fl_lightning.models.hub import missing_weights_phrase

        missing = super().missing_resources(config, section, download=download)
        phrase = (
            None
            if config.llm_path is None
            else missing_weights_phrase(
                config.llm_path,
                key=f"{section}.llm_path",
                download=download,
                what="causal-LM folder or hub id, e.g. LLaMA-7B; null: template prompts",
            )
        )
        return missing + ([phrase] if phrase else [])

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        return Upload({_COUNTS: torch.as_tensor(client.class_counts, dtype=torch.int64)})

    def generation_inputs(self, uploads: Mapping[int, Upload]) -> GenerationInputs:
        counts = np.zeros(self.method.env.num_classes, dtype=np.int64)
        for _, u in uploads.items():
            counts += u.tensors[_COUNTS].numpy()
        return GenerationInputs({k: int(v) for k, v in enumerate(counts)})


class FeatureGuidedSynthesis(TextOnlySynthesis):
    """FeDiSyn's step 1 on a client: images back to [0, 1] at the VAE's resolution → noised class latents."""

    config_class = FeatureGuidedConfig

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        f, m = self.method.config, self.method
        if f.round0_inputs is not None:  # a pilot: its run's round 0 already encoded this client (round0_inputs.py)
            from fl_lightning.algorithms.synthetic_family.round0_inputs import stored_upload

            stored = stored_upload(f.round0_inputs, self.inputs_key(), client.index)
            if stored is not None:
                return stored
        vae = self.components.vae  # batches go to its device, are resized there and encoded in the compute dtype
        batches = m.client_images(client, batch_size=f.encode_batch_size, size=f.vae_image_size, device=vae.device)
        uploads = client_latent_uploads(
            vae,
            self.components.scheduler,
            batches,
            num_centroids=f.num_centroids,
            timestep=f.timestep,
            max_timestep=f.max_timestep,
            min_timestep=f.min_timestep,
            seed=client_seed(m.cfg.seed, round_idx, client.index),
            batch_size=f.encode_batch_size,
            dtype=compute_dtype(m.cfg.federation.precision, vae.device),
        )
        return to_upload(uploads)

    def generation_inputs(self, uploads: Mapping[int, Upload]) -> GenerationInputs:
        counts = np.zeros(self.method.env.num_classes, dtype=np.int64)
        by_client: dict[int, list[ClassLatentUpload]] = {c: from_upload(u) for c, u in uploads.items()}
        for ups in by_client.values():
            for up in ups:
                counts[up.label] += up.count
        return GenerationInputs({k: int(v) for k, v in enumerate(counts)}, latents_by_client=by_client)
