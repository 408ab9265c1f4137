"""The FeDiSyn family's server round 0: latents → prompts → synthetic images → pre-trained ViT (orchestration only).

The math lives in ``fl_lightning.synthesis`` (plan, sampling) and ``fl_lightning.modules.pretraining``
(pre-training); this file wires them to the run folder:

    <run_dir>/prompts.json            the label → prompts cache (the LLM runs once per label)
    <run_dir>/synthetic/<class>/*.png  the generated images + manifest.jsonl (re-running skips existing ones)
    <run_dir>/pretrain/               the pre-training checkpoints and CSV logs (+ epoch_state.ckpt while unfinished:
                                      a resumed round 0 continues pre-training from its last finished epoch)

and charges generation and pre-training on the simulated clock with the **server profile**
(``<method>.server``, default ``rtx_4090``, the paper's server: ``systems/server.py``) — ĥ per image from
its start timestep, h̃ per image and epoch from the backbone's MACs — unless the config fixes ĥ and h̃
as numbers; ``server: host`` charges this host's wall clock instead (h̃ then falls back to ĥ / K when
λ* is needed before pre-training has run). The host's wall times are reported beside the charged ones
(``summary.json``: ``host_generation_s``, ``host_pretraining_s``), never mixed into the clock.

Two ways to start an image (``generation``):

* ``feature_guided`` (FeDiSyn): from a client's noised latent centroid mixed with its class average
  (``synthesis.generate.plan_generation``), denoised from the upload's timestep s;
* ``text_only`` (GPT-FL, FGL and FeDiSyn w/o FG): from pure noise at the last training timestep
  T − 1, conditioned on the prompt only — x_{T−1} = sqrt(1 − ᾱ_{T−1}) ξ, the ``noise_fraction = 0``
  case of ``synthesis.generate.top_up_latent`` on a zero latent (SD's text-to-image start N(0, I)
  up to 1 − ᾱ_{T−1} ≈ 0.995). The volumes are the same λ·D^k per class as FeDiSyn's, so an
  ablation changes the generation only.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

from fl_lightning.algorithms.synthetic_family.shared_round0 import SharedRound0
from fl_lightning.data.loader import LoaderSettings
from fl_lightning.data.transforms import build_transform
from fl_lightning.dealing import Deal
from fl_lightning.errors import ConfigError
from fl_lightning.federation.algorithm import InputSpec
from fl_lightning.federation.ranks.collectives import Ranks
from fl_lightning.federation.ranks.placement import derive_seed
from fl_lightning.models.diffusion import DiffusionComponents
from fl_lightning.modules.pretraining import EPOCH_STATE, load_pretrained_vit, pretrain_classifier, split_holdout
from fl_lightning.phase_times import note, timed
from fl_lightning.synthesis.generate import (
    MANIFEST_NAME,
    GenerationRequest,
    generate_images,
    plan_generation,
    synthetic_volume,
)
from fl_lightning.synthesis.latents import ClassLatentUpload
from fl_lightning.synthesis.prompts import LLMPromptExpander, TemplatePromptExpander, expand_with_cache
from fl_lightning.synthesis.store import remove_stores, stored_splits
from fl_lightning.systems.backbones import backbone
from fl_lightning.systems.scaling_law import ScalingLawParams, optimal_lambda, synthesis_cost_per_unit_lambda
from fl_lightning.systems.server import SERVERS, ServerProfile, generation_time, pretrain_time_per_image_epoch

__all__ = [
    "SynthesisResult",
    "SyntheticFolder",
    "SharedRound0",
    "round0_key",
    "choose_lambda",
    "text_only_requests",
    "synthesise_and_pretrain",
    "pretrain_on_synthetic",
    "release_accelerator_memory",
    "parked_on_cpu",
]


@dataclass
class SynthesisResult:
    """What round 0 produced on the server."""

    model: nn.Module  # the pre-trained timm ViT (with its head)
    lam: float
    images_per_class: dict[int, int]
    generation_s: float  # H_gene charged on the simulated clock (server profile, config ĥ, or host wall time)
    pretraining_s: float  # H_pre charged likewise
    pretrain_checkpoint: Path
    host_generation_s: float = 0.0  # this host's wall time, reported beside the charged one
    host_pretraining_s: float = 0.0
    lambda_fit: Any = None  # synthetic_lambda: auto — the pilots' Calibration (κ1..κ4, λ*); None otherwise


class SyntheticFolder(Dataset):
    """The generated images with the REAL label indices from the manifest (not the folder order)."""

    def __init__(self, root: Path, transform=None) -> None:
        rows = [json.loads(line) for line in (root / MANIFEST_NAME).read_text(encoding="utf-8").splitlines() if line]
        self.root, self.transform = root, transform
        self.items = [(row["path"], int(row["label"])) for row in rows]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        path, label = self.items[index]
        with Image.open(self.root / path) as img:
            image = img.convert("RGB")
        return (self.transform(image) if self.transform else image), label


def choose_lambda(
    cfg: Any, *, gen_time_per_image: float, pretrain_time_per_image_epoch: float, num_real_samples: int, section: str = "fedisyn"
) -> float:
    """λ from the config, or λ* of the scaling law with h0 = (ĥ + h̃ T̂) D.

    Raises:
        ConfigError: λ* is not a finite number > 0 (e.g. e^{κ3 Acc} overflows, or h0 is 0 because ĥ and
            h̃ are both 0): named ``<section>.scaling_kappa``.
    """
    if cfg.synthetic_lambda is not None:
        return float(cfg.synthetic_lambda)
    h0 = synthesis_cost_per_unit_lambda(gen_time_per_image, pretrain_time_per_image_epoch, cfg.pretrain_epochs, num_real_samples)
    k1, k2, k3, k4 = (float(k) for k in cfg.scaling_kappa or ())
    try:
        lam = optimal_lambda(cfg.target_accuracy, h0=h0, params=ScalingLawParams(kappa1=k1, kappa2=k2, kappa3=k3, kappa4=k4))
    except (ValueError, OverflowError) as err:
        raise ConfigError(
            f"{section}.scaling_kappa",
            cfg.scaling_kappa,
            f"κ that give a finite λ* > 0 at target_accuracy {cfg.target_accuracy} with h0 = {h0:g} s ({err})",
        ) from None
    if not (math.isfinite(lam) and lam > 0):
        raise ConfigError(
            f"{section}.scaling_kappa", cfg.scaling_kappa, f"κ that give a finite λ* > 0 (got λ* = {lam!r} with h0 = {h0:g} s)"
        )
    return lam


def release_accelerator_memory(*park: Any) -> None:
    """Give the accelerator's memory back before another process needs it (FeDiSyn's pilots).

    Moves the modules in ``park`` (``nn.Module`` or :class:`DiffusionComponents`, anything with ``.to(device=)``)
    to the CPU — their dtype is kept, so moving them back is exact —, collects the reference cycles that keep
    dropped models alive (a transformers LLM has some), and, when CUDA is initialised, returns the caching
    allocator's free blocks to the driver (``torch.cuda.empty_cache``): memory this process freed is otherwise
    still reserved by it, and a child process cannot use it. Without CUDA it only moves and collects.
    """
    import gc

    for item in park:
        item.to(device="cpu")
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@contextmanager
def parked_on_cpu(*modules: nn.Module) -> Iterator[None]:
    """``modules`` on the CPU for the block, then back on the device each was on — also when the block raises.

    For what the parent still needs after the pilots (the fine-tuning ViT with its frozen backbone): the move
    keeps every dtype and ``requires_grad`` (``Module.to(device=)``), so both ways are exact copies. The memory it
    frees on the accelerator reaches another process with :func:`release_accelerator_memory`. A module without
    parameters or buffers is left where it is.
    """
    homes = []
    for module in modules:
        first = next(chain(module.parameters(), module.buffers()), None)
        homes.append(None if first is None else first.device)
        if first is not None:
            module.to(device="cpu")
    try:
        yield
    finally:
        for module, home in zip(modules, homes):
            if home is not None:
                module.to(device=home)


def _auto_lambda(cfg: Any, *, run_dir: Path, section: str, device: torch.device | None = None):
    """``synthetic_lambda: auto``: run the pilots (``<run_dir>/pilots/``), fit Eq. (13), return (λ*, the fit).

    Args:
        device: this rank's device; on CUDA each pilot sees that device only.

    Raises:
        ConfigError: a pilot failed, or the pilots' fit has no minimiser (named ``<section>.synthetic_lambda``).
    """
    from fl_lightning.algorithms.synthetic_family.pilots import auto_lambda, pilot_points, run_pilot_processes

    cuda_device = None
    if device is not None and device.type == "cuda":
        cuda_device = torch.cuda.current_device() if device.index is None else int(device.index)
    try:
        with timed("pilots"):
            runs = run_pilot_processes(
                run_dir,
                section,
                [float(v) for v in cfg.pilot_lambdas],
                rounds=cfg.pilot_rounds,
                cuda_device=cuda_device,
                round0_root=shared_round0_root(cfg, run_dir),
            )
        fit = auto_lambda(pilot_points(runs, pretrain_epochs=cfg.pretrain_epochs), cfg.target_accuracy)
    except (RuntimeError, ValueError) as err:
        raise ConfigError(f"{section}.synthetic_lambda", "auto", f"pilots whose fit gives λ* ({err})") from None
    return float(fit.lam_star), fit


def _auto_lambda_on_ranks(
    cfg: Any, ranks: Ranks, *, components: DiffusionComponents, run_dir: Path, section: str, device: torch.device
) -> tuple[float, Any]:
    """:func:`_auto_lambda` on several ranks: under ``pilot_ranks: one`` rank r runs the pilots λ_i with i ≡ r (mod N)
    (``Deal.strided``), each a single-process run on its own device (the fit of one rank); under ``all`` every pilot
    runs over all the ranks, one after another (``pilot_launch.py``). Rank 0 fits Eq. (13) to all of them in
    ``pilot_lambdas`` order.

    Raises:
        ConfigError: a pilot failed on any rank, or the fit has no minimiser (named ``<section>.synthetic_lambda``).
    """
    from fl_lightning.algorithms.synthetic_family.pilots import auto_lambda, pilot_points

    lambdas = [float(v) for v in cfg.pilot_lambdas]
    cuda_device = None
    if device.type == "cuda":
        cuda_device = torch.cuda.current_device() if device.index is None else int(device.index)
    release_accelerator_memory(components)  # the pilots are processes of their own: hand them the accelerator
    if cfg.pilot_ranks == "all":
        runs = _pilots_over_all_ranks(cfg, ranks, lambdas, run_dir=run_dir, section=section)
    else:
        runs = _pilots_one_per_rank(cfg, ranks, lambdas, run_dir=run_dir, section=section, cuda_device=cuda_device)

    def fit() -> tuple[float, Any]:
        try:
            result = auto_lambda(pilot_points(runs, pretrain_epochs=cfg.pretrain_epochs), cfg.target_accuracy)
        except (RuntimeError, ValueError) as err:
            raise ConfigError(f"{section}.synthetic_lambda", "auto", f"pilots whose fit gives λ* ({err})") from None
        return float(result.lam_star), result

    return ranks.on_server(fit, "the pilots' fit")


def _pilots_one_per_rank(
    cfg: Any, ranks: Ranks, lambdas: list[float], *, run_dir: Path, section: str, cuda_device: int | None
) -> list[Path]:
    """``pilot_ranks: one``: rank r runs the pilots λ_i with i ≡ r (mod N), each a one-process run on its device;
    the runs' folders in ``pilot_lambdas`` order on every rank."""
    from fl_lightning.algorithms.synthetic_family.pilots import run_pilot_processes

    def mine() -> list[Path]:
        try:
            with timed("pilots"):
                return run_pilot_processes(
                    run_dir,
                    section,
                    [lambdas[i] for i in ranks.deal.strided(len(lambdas))],
                    rounds=cfg.pilot_rounds,
                    cuda_device=cuda_device,
                    round0_root=shared_round0_root(cfg, run_dir),
                )
        except RuntimeError as err:
            raise ConfigError(f"{section}.synthetic_lambda", "auto", f"pilots whose fit gives λ* ({err})") from None

    return Deal.unstride(ranks.gather(mine, "the pilots"))  # back in pilot_lambdas order


def _pilots_over_all_ranks(cfg: Any, ranks: Ranks, lambdas: list[float], *, run_dir: Path, section: str) -> list[Path]:
    """``pilot_ranks: all``: the pilots one after another, each over all the ranks (``pilot_launch.py``): every rank
    starts its rank of the pilot in the run's layout, on a rendezvous rank 0 names; each pilot's outcome is agreed
    before the next starts, so a pilot failing on any rank ends every rank with one line."""
    from fl_lightning.algorithms.synthetic_family.pilot_launch import PilotLaunch, free_port, rendezvous_host
    from fl_lightning.algorithms.synthetic_family.pilots import run_pilot_processes

    devices, num_nodes = _rank_layout(ranks, section)
    runs = []
    for lam in lambdas:
        name = f"pilot_lam{lam:g}"
        host, port = ranks.on_server(lambda: (rendezvous_host(), free_port()), f"the rendezvous of the pilot at λ={lam:g}")
        launch = PilotLaunch(ranks.rank, ranks.world, devices, num_nodes, host, port, run_id=f"{name}-{port}")

        def mine(lam: float = lam, launch: PilotLaunch = launch) -> list[Path]:
            try:
                with timed("pilots"):
                    return run_pilot_processes(
                        run_dir,
                        section,
                        [lam],
                        rounds=cfg.pilot_rounds,
                        round0_root=shared_round0_root(cfg, run_dir),
                        launch=launch,
                    )
            except RuntimeError as err:
                raise ConfigError(f"{section}.synthetic_lambda", "auto", f"pilots whose fit gives λ* ({err})") from None

        runs.extend(ranks.gather(mine, f"the pilot at λ={lam:g}")[0])
    return runs


def _rank_layout(ranks: Ranks, section: str) -> tuple[int, int]:
    """(ranks per node, nodes) of the run, from every rank's (node rank, local rank) as Lightning numbers them
    (global rank = node rank · devices + local rank); a layout that is not that grid is one line."""
    fabric = ranks.fabric
    places = ranks.gather(
        lambda: (int(getattr(fabric, "node_rank", 0)), int(getattr(fabric, "local_rank", ranks.rank))), "the ranks' layout"
    )
    num_nodes = 1 + max(node for node, _ in places)
    devices = ranks.world // num_nodes
    if devices * num_nodes != ranks.world or any(node * devices + local != r for r, (node, local) in enumerate(places)):
        raise ConfigError(
            f"{section}.pilot_ranks",
            "all",
            f"ranks laid out as node rank · devices + local rank (found (node, local) = {places}); use pilot_ranks: one",
        )
    return devices, num_nodes


def text_only_requests(
    class_names: Sequence[str],
    prompts_by_class: Mapping[str, Sequence[str]],
    *,
    volume_per_class: Mapping[int, int],
    latent_shape: tuple[int, ...],
    timestep: int,
    seed: int,
) -> list[GenerationRequest]:
    """Requests that start from pure noise at ``timestep`` (T − 1), conditioned on prompts only.

    Each request carries a zero latent with ``noise_fraction = 0``: ``start_latent`` then draws the
    whole noise σ_s ξ from the image's own seed (derived from (seed, label, index)). Class k's images
    take its prompts in turn (FGL: the clients' captions; GPT-FL: the LLM's prompts).
    """
    zero = torch.zeros(latent_shape)
    requests = []
    for label in sorted(volume_per_class):
        prompts = list(prompts_by_class.get(class_names[label], []))
        if volume_per_class[label] > 0 and not prompts:
            raise ValueError(f"no prompts for class {class_names[label]!r}")
        for index in range(int(volume_per_class[label])):
            image_seed = derive_seed(seed, label, index, 1)
            requests.append(
                GenerationRequest(
                    class_name=class_names[label],
                    label=int(label),
                    client=-1,
                    centroid_index=-1,
                    latent=zero,
                    timestep=int(timestep),
                    prompt=prompts[index % len(prompts)],
                    seed=image_seed,
                    index=index,
                    noise_fraction=0.0,
                )
            )
    return requests


def _expander(cfg: Any, *, seed: int, device: torch.device):
    if cfg.llm_path is None:
        return TemplatePromptExpander(seed=seed)
    return LLMPromptExpander(
        cfg.llm_path, device=device, seed=seed, dtype=torch.float16 if device.type == "cuda" else torch.float32
    )


def _dtype(cfg: Any, device: torch.device) -> torch.dtype:
    if cfg.diffusion_precision == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return getattr(torch, cfg.diffusion_precision)


def _sampler_args(cfg: Any, device: torch.device) -> dict[str, Any]:
    """The stage's sampler settings as ``generate_images`` takes them (the probe of ĥ times the same sampler)."""
    return dict(
        batch_size=cfg.generation_batch_size,
        num_inference_steps=cfg.num_inference_steps,
        guidance_scale=cfg.guidance_scale,
        device=device,
        dtype=_dtype(cfg, device),
        min_fresh_fraction=cfg.min_fresh_fraction,
    )


def _server(cfg: Any) -> ServerProfile | None:
    """The server profile the clock charges (None: ``server: host``, this host's wall time)."""
    return None if cfg.server == "host" else SERVERS[cfg.server]


def _server_pretrain_s(cfg: Any, server: ServerProfile, section: str) -> float:
    """h̃ of the server for ``pretrain_model`` (as the backbone it is named after)."""
    try:
        return pretrain_time_per_image_epoch(server, backbone(cfg.pretrain_model))
    except ValueError as err:
        raise ConfigError(f"{section}.server", cfg.server, f"'host' for a ViT the server profile cannot price ({err})") from None


def _probe_generation(cfg: Any, components: DiffusionComponents, requests, folder: Path, device: torch.device) -> float:
    """ĥ on this host: time one batch of real requests into a scratch folder (discarded)."""
    batch = list(requests[: cfg.generation_batch_size])
    start = time.monotonic()
    with timed("probe"):
        generate_images(components, batch, folder, **_sampler_args(cfg, device), progress=False)
    shutil.rmtree(folder, ignore_errors=True)
    return (time.monotonic() - start) / max(len(batch), 1)


def _latent_shape(components: DiffusionComponents, image_size: int) -> tuple[int, int, int]:
    """(C, h, w) of the VAE's latents for ``image_size`` images (SD: 4 channels, ÷8)."""
    config = components.vae.config
    factor = 2 ** (len(config.block_out_channels) - 1)
    return (int(config.latent_channels), image_size // factor, image_size // factor)


def synthesise_and_pretrain(
    cfg: Any,
    *,
    components: DiffusionComponents,
    uploads_by_client: Mapping[int, Sequence[ClassLatentUpload]] | None,
    class_counts: Mapping[int, int],
    class_names: Sequence[str],
    spec: InputSpec,
    run_dir: Path,
    seed: int,
    device: torch.device,
    precision: str,
    progress: bool,
    prompts_by_class: Mapping[str, Sequence[str]] | None = None,
    section: str = "fedisyn",
    text_only: bool = False,
    ranks: Ranks | None = None,
    share: Mapping[str, Any] | None = None,
    loading: LoaderSettings | None = None,
) -> SynthesisResult | None:
    """Steps 1 (server side) and 2 of FeDiSyn; resumable (prompts cached, images skipped when present).

    Args:
        cfg: the method's section (the keys of ``synthesis.DiffusionConfig``, and of the prompt and
            feature-guided configs where those are used).
        uploads_by_client: the clients' noised latents (``feature_guided``; None for ``text_only``).
        class_counts: D^k per label, summed over the clients.
        prompts_by_class: prompts to use instead of the label expansion (FGL: the clients' captions).
        section: the method's config section, for error keys.
        text_only: images start from pure noise and the prompts (``uploads_by_client`` is None).
        ranks: the ranks that share the generation (every rank calls this together): rank 0 decides the prompts
            and λ, every rank samples the batches dealt to it (the images of one rank), and every rank pre-trains
            its shard of each batch (data-parallel, ``modules/pretraining_ranks.py``); rank 0 writes the files.

        share: what round 0 reads besides the requests (the stage's keys, the precision, the classes): with it,
            the images and the pre-trained ViT are published under ``<output_dir>/round0/<key>/`` and a later run
            of the same content key (a comparison's variants that differ in their fine-tuning) reuses them
            (:class:`SharedRound0`), its recorded host times included: the numbers of a run that made them.
        loading: the rank's DataLoader settings for the pre-training (workers, pinned memory); None: 0 workers.

    Returns:
        The result on rank 0 (or alone); None on the other ranks of ``ranks``.
    """
    if not text_only and uploads_by_client is None:
        raise ValueError("feature-guided generation needs the clients' latent uploads")
    server = _server(cfg)
    lam, fit, h_pre, volume, requests = _synthesis_plan(
        cfg,
        components=components,
        uploads_by_client=uploads_by_client,
        class_counts=class_counts,
        class_names=class_names,
        prompts_by_class=prompts_by_class,
        server=server,
        run_dir=run_dir,
        seed=seed,
        device=device,
        section=section,
        text_only=text_only,
        ranks=ranks,
    )
    folder = run_dir / "synthetic"
    rank, world = (0, 1) if ranks is None else (ranks.rank, ranks.world)
    shared, reused = _shared_images(cfg, share, requests, device, run_dir=run_dir, folder=folder, ranks=ranks)
    host_generation_s = _generate_on_ranks(cfg, components, requests, folder, device=device, progress=progress, ranks=ranks)
    components.to(device="cpu")  # free the accelerator for pre-training and fine-tuning
    if ranks is not None and world == 1:
        ranks = None
    if rank != 0 and ranks is None:  # not reached (several ranks share the phase): the others pre-train with rank 0
        return None
    published = _published_on_rank0(
        partial(_publish_or_reuse, shared, reused=reused, folder=folder, run_dir=run_dir, host_s=host_generation_s),
        ranks,
        host_s=host_generation_s,
    )
    if published is None:  # another rank, and rank 0 found a published ViT: rank 0 holds the round's result
        return None
    host_generation_s, pretrained = published
    generation_s = _charged_generation_s(cfg, server, requests, host_s=host_generation_s)
    if pretrained is None:  # several ranks: every one trains its shard of each batch (modules/pretraining_ranks.py)
        pretrained = _pretrain_and_publish(
            cfg,
            folder,
            shared,
            num_classes=len(class_names),
            spec=spec,
            run_dir=run_dir,
            seed=seed,
            device=device,
            precision=precision,
            per_image_epoch_s=h_pre if cfg.pretrain_time_per_image_epoch_s is not None or server is not None else None,
            ranks=ranks,
            loading=loading,
        )
        if pretrained is None:  # another rank: rank 0 holds the result, and its state is the round's
            return None
    model, pretraining_s, best, host_pretraining_s = pretrained
    per_class = {label: int(v) for label, v in volume.items()}
    return SynthesisResult(model, lam, per_class, generation_s, pretraining_s, best, host_generation_s, host_pretraining_s, fit)


def _shared_images(
    cfg: Any,
    share: Mapping[str, Any] | None,
    requests: list,
    device: torch.device,
    *,
    run_dir: Path,
    folder: Path,
    ranks: Ranks | None,
) -> tuple[SharedRound0 | None, bool]:
    """Round 0's shared folder for this content key (None without ``share``) and whether its published images were
    linked into ``folder`` (rank 0 looks; every rank gets its answer)."""
    world = 1 if ranks is None else ranks.world
    if share is None:
        return None, False
    shared = SharedRound0(shared_round0_root(cfg, run_dir), round0_key(share, requests, device, world=world))
    reused = (
        shared.images_into(folder)
        if ranks is None
        else ranks.on_server(partial(shared.images_into, folder), "round 0's shared images")
    )
    return shared, bool(reused)


def shared_round0_root(cfg: Any, run_dir: Path) -> Path:
    """Where round 0 is shared: the section's ``round0_dir``, else ``<output_dir>/round0`` (``run_dir``'s parent)."""
    where = getattr(cfg, "round0_dir", None)
    return Path(where).expanduser() if where else run_dir.parent / "round0"


def _synthesis_plan(
    cfg: Any,
    *,
    components: DiffusionComponents,
    uploads_by_client: Mapping[int, Sequence[ClassLatentUpload]] | None,
    class_counts: Mapping[int, int],
    class_names: Sequence[str],
    prompts_by_class: Mapping[str, Sequence[str]] | None,
    server: Any,
    run_dir: Path,
    seed: int,
    device: torch.device,
    section: str,
    text_only: bool,
    ranks: Ranks | None,
) -> tuple[float, Any, float, dict[int, int], list]:
    """The server's plan before generation, the same on every rank: the prompts and λ (rank 0's decision,
    :func:`_plan_once`), the synthetic images per class and the generation requests. Returns (λ, the pilots' fit or
    None, h̃, the images per class, the requests)."""
    totals = {int(k): int(v) for k, v in class_counts.items() if v > 0}
    requests_for = partial(
        _requests_for,
        cfg,
        components=components,
        uploads_by_client=uploads_by_client,
        class_names=class_names,
        seed=seed,
        text_only=text_only,
        last_t=int(components.scheduler.config.num_train_timesteps) - 1,
    )
    decide = partial(
        _decide_lambda,
        cfg,
        components=components,
        totals=totals,
        class_names=class_names,
        requests_for=requests_for,
        prompts_by_class=prompts_by_class,
        server=server,
        run_dir=run_dir,
        seed=seed,
        device=device,
        section=section,
    )
    prompts_by_class, lam, fit, _, h_pre = _plan_once(
        cfg, decide, ranks, components=components, run_dir=run_dir, section=section, device=device
    )
    volume = synthetic_volume(totals, lam)
    if sum(volume.values()) < 2:
        raise ConfigError(
            f"{section}.synthetic_lambda",
            lam,
            f"a λ that gives at least 2 synthetic images (D = {sum(totals.values())} real samples)",
        )
    requests = requests_for(volume, prompts_by_class)  # a pure function of the uploads: the same on every rank
    return lam, fit, h_pre, volume, requests


def _requests_for(
    cfg: Any,
    volume: Mapping[int, int],
    prompts: Mapping[str, Sequence[str]],
    *,
    components: DiffusionComponents,
    uploads_by_client: Mapping[int, Sequence[ClassLatentUpload]] | None,
    class_names: Sequence[str],
    seed: int,
    text_only: bool,
    last_t: int,
) -> list[GenerationRequest]:
    """The generation requests for ``volume`` images per class: from pure noise at ``last_t`` (``text_only``) or from
    the clients' uploads (:func:`~fl_lightning.synthesis.generate.plan_generation`)."""
    if text_only:
        return text_only_requests(
            class_names,
            prompts,
            volume_per_class=volume,
            seed=seed,
            latent_shape=_latent_shape(components, cfg.vae_image_size),
            timestep=last_t,
        )
    return plan_generation(uploads_by_client, class_names, prompts, volume_per_class=volume, rho=cfg.rho, seed=seed)


# the server's decisions before generation: (prompts by class, λ, the pilots' fit or None, ĥ, h̃)
_Plan = tuple[Mapping[str, Sequence[str]], float | None, Any, float | None, float | None]


def _plan_once(
    cfg: Any,
    decide: Callable[..., _Plan],
    ranks: Ranks | None,
    *,
    components: DiffusionComponents,
    run_dir: Path,
    section: str,
    device: torch.device,
) -> _Plan:
    """The prompts, the probe or the pilots and λ (``decide``, :func:`_decide_lambda`): the server's decision, made
    once (on rank 0 when shared); over several ranks ``synthetic_lambda: auto`` gives each rank its share of the
    pilots, on its own device, and rank 0 fits them all."""
    parallel_pilots = ranks is not None and ranks.world > 1 and cfg.synthetic_lambda == "auto"
    prompts_by_class, lam, fit, h_gen, h_pre = (
        decide()
        if ranks is None
        else ranks.on_server(partial(decide, pilots=not parallel_pilots), "the synthesis plan (prompts, λ)")
    )
    if parallel_pilots:
        lam, fit = _auto_lambda_on_ranks(cfg, ranks, components=components, run_dir=run_dir, section=section, device=device)
    return prompts_by_class, lam, fit, h_gen, h_pre


def _generate_on_ranks(
    cfg: Any,
    components: DiffusionComponents,
    requests: Sequence[GenerationRequest],
    folder: Path,
    *,
    device: torch.device,
    progress: bool,
    ranks: Ranks | None,
) -> float:
    """Round 0's images into ``folder``, each rank the batches dealt to it; returns this host's wall time, taken once
    every rank's images are in the folder (before anyone reads it)."""
    rank, world = (0, 1) if ranks is None else (ranks.rank, ranks.world)
    start = time.monotonic()
    with timed("generation"):
        generate_images(
            components, requests, folder, **_sampler_args(cfg, device), progress=progress and rank == 0, rank=rank, world=world
        )
    if ranks is not None:  # every rank's images are in the folder before anyone reads it
        ranks.gather(lambda: None, "the synthetic images")
    return time.monotonic() - start


_Pretrained = tuple[nn.Module, float, Path, float]  # the ViT, H_pre charged, its checkpoint, the host's wall time


def _publish_or_reuse(
    shared: SharedRound0 | None, *, reused: bool, folder: Path, run_dir: Path, host_s: float
) -> tuple[float, _Pretrained | None]:
    """Rank 0: round 0's images published (or their recorded host time, when reused) and the published ViT, if any."""
    if shared is None:
        return host_s, None
    if reused:
        host_s = shared.recorded("generation")["host_s"]
    else:
        shared.publish_images(folder, host_s)
    return host_s, shared.pretrained_into(run_dir / "pretrain")


def _published_on_rank0(
    publish: Callable[[], tuple[float, _Pretrained | None]], ranks: Ranks | None, *, host_s: float
) -> tuple[float, _Pretrained | None] | None:
    """``publish`` run on rank 0 alone: (the host's generation time, the published ViT or None). Over ranks every rank
    learns whether rank 0 found a published ViT: then the others are done (None), else they pre-train with it."""
    if ranks is None:
        return publish()
    on_zero: dict[str, Any] = {}
    found = ranks.on_server(lambda: on_zero.setdefault("r", publish())[1] is not None, "round 0's published pre-training")
    if ranks.rank != 0 and found:
        return None
    return on_zero.get("r", (host_s, None))


def _charged_generation_s(
    cfg: Any, server: ServerProfile | None, requests: Sequence[GenerationRequest], *, host_s: float
) -> float:
    """H_gene charged on the simulated clock: the config's ĥ per image, the server profile's time, or ``host_s``."""
    if cfg.generation_time_per_image_s is not None:
        return cfg.generation_time_per_image_s * len(requests)
    if server is not None:  # H_gene on the server: n(s) guided UNet steps + a decode per image
        return generation_time(server, [r.timestep for r in requests], cfg.num_inference_steps)
    return host_s


def _pretrain_and_publish(cfg: Any, folder: Path, shared: SharedRound0 | None, **kwargs: Any) -> _Pretrained | None:
    """:func:`pretrain_on_synthetic` (``kwargs``), its ViT then published on rank 0 when round 0 is shared; None on
    the other ranks."""
    trained = pretrain_on_synthetic(cfg, folder, **kwargs)
    if trained is not None and shared is not None:
        _, pretraining_s, best, host_pretraining_s = trained
        shared.publish_pretraining(best, pretraining_s, host_pretraining_s)
    return trained


def round0_key(share: Mapping[str, Any], requests: Sequence[GenerationRequest], device: torch.device, world: int = 1) -> str:
    """sha256 of what round 0's images and pre-trained ViT depend on: ``share`` (the stage's keys, the precision,
    the classes, the input spec), every request (its latent's bytes, prompt, seed, timestep, noise fraction and
    file), the device type and torch version (float round-off) and, above one, the ranks the pre-training is
    data-parallel over (their shards' round-off and augmentation streams). Equal keys: equal images and ViT."""
    import hashlib

    import fl_lightning.modules.pretraining as pretraining_code
    import fl_lightning.synthesis.generate as generation_code

    code = [Path(m.__file__).read_bytes() for m in (generation_code, pretraining_code)] + [Path(__file__).read_bytes()]
    ranks = {"pretrain_ranks": int(world)} if world > 1 else {}  # one rank: the key of before
    digest = hashlib.sha256(
        json.dumps({**share, "device": device.type, "torch": torch.__version__, **ranks}, sort_keys=True, default=str).encode()
    )
    for text in code:  # the code that makes them: a changed sampler or trainer never reuses older images
        digest.update(hashlib.sha256(text).digest())
    for r in requests:
        digest.update(
            json.dumps(
                [r.relpath, r.label, r.client, r.centroid_index, r.prompt, r.seed, r.timestep, float(r.noise_fraction)]
            ).encode()
        )
        latent = r.latent.detach().to("cpu").contiguous()
        digest.update(str((latent.dtype, tuple(latent.shape))).encode())
        digest.update(latent.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:32]


def _decide_lambda(
    cfg: Any,
    *,
    components: DiffusionComponents,
    totals: Mapping[int, int],
    class_names: Sequence[str],
    requests_for: Any,
    prompts_by_class: Mapping[str, Sequence[str]] | None,
    server: ServerProfile | None,
    run_dir: Path,
    seed: int,
    device: torch.device,
    section: str,
    pilots: bool = True,
) -> tuple[Mapping[str, Sequence[str]], float | None, Any, float | None, float | None]:
    """The server's decisions before generation: the prompts (expanded and cached unless given), ĥ and h̃ (the
    probe, the server profile or the config) and λ (the config, the time budget or the pilots' fit).

    Args:
        pilots: run the pilots of ``synthetic_lambda: auto`` here (False: the ranks run them together, and λ is
            None here).

    Returns:
        (prompts by class, λ, the pilots' fit or None, ĥ, h̃).
    """
    if prompts_by_class is None:
        expander = _expander(cfg, seed=seed, device=device)
        prompts_by_class = expand_with_cache(expander, list(class_names), cfg.prompts_per_label, run_dir / "prompts.json")
        expander.release()  # the LLM is not needed again: its weights go (their memory with the next collection)
        del expander
    D = sum(totals.values())
    h_gen, h_pre = cfg.generation_time_per_image_s, cfg.pretrain_time_per_image_epoch_s
    if server is not None and h_pre is None:
        h_pre = _server_pretrain_s(cfg, server, section)
    if cfg.synthetic_lambda is None and h_gen is None:  # (auto reads h0 off the pilots instead)
        if server is not None:  # ĥ: the server's mean time over the images' start timesteps
            probe = requests_for(totals, prompts_by_class)
            h_gen = generation_time(server, [r.timestep for r in probe], cfg.num_inference_steps) / max(len(probe), 1)
        else:
            h_gen = _probe_generation(cfg, components, requests_for(totals, prompts_by_class), run_dir / "probe", device)
    if cfg.synthetic_lambda is None and h_pre is None:
        # server: host and no h̃ yet: a first-order stand-in until pre-training is measured (a ViT step ~ a UNet step)
        h_pre = h_gen / max(cfg.num_inference_steps, 1)
    fit = None
    if cfg.synthetic_lambda == "auto" and not pilots:
        lam = None
    elif cfg.synthetic_lambda == "auto":
        # the pilots are processes of their own: hand them the accelerator (generate_images moves the networks back)
        release_accelerator_memory(components)
        lam, fit = _auto_lambda(cfg, run_dir=run_dir, section=section, device=device)
    else:
        lam = choose_lambda(
            cfg, gen_time_per_image=h_gen or 0.0, pretrain_time_per_image_epoch=h_pre or 0.0, num_real_samples=D, section=section
        )
    return prompts_by_class, lam, fit, h_gen, h_pre


def pretrain_on_synthetic(
    cfg: Any,
    folder: Path,
    *,
    num_classes: int,
    spec: InputSpec,
    run_dir: Path,
    seed: int,
    device: torch.device,
    precision: str,
    per_image_epoch_s: float | None = None,
    ranks: Ranks | None = None,
    loading: LoaderSettings | None = None,
) -> tuple[nn.Module, float, Path, float] | None:
    """Step 2: pre-train the timm ViT on the images of ``folder`` (a :class:`SyntheticFolder`, whatever made it).

    Args:
        per_image_epoch_s: h̃ to charge (server profile or config); None: this host's wall time.
        ranks: several ranks that all call this together: the training is data-parallel over them
            (``pretrain_classifier(ranks=)``), rank 0 writes the folder.
        loading: the DataLoader workers and pinned memory of the rank (None: 0 workers, no pinning).

    Returns:
        the best model (by held-out loss), H_pre (h̃ · images · epochs run, or the host's wall time), its
        checkpoint, and the host's wall time; None on the ranks other than 0.
    """
    transform = dict(normalization=spec.normalization, image_size=spec.image_size, mean=spec.mean, std=spec.std)
    train_tf, val_tf = build_transform(**transform, train=True), build_transform(**transform, train=False)
    start = time.monotonic()  # the host's pre-training time counts the store's build (the PNGs' one decode)
    with timed("store"):
        stored = stored_splits(folder, train_tf, val_tf, mode=cfg.pretrain_store, defer=True, ranks=ranks)  # every rank
    train_all, val_all = stored or (SyntheticFolder(folder, train_tf), SyntheticFolder(folder, val_tf))
    note("store rows", len(train_all))  # what the ranks deal in blocks (benchmarks/rank_model.py)
    train_set, _ = split_holdout(train_all, cfg.pretrain_holdout, seed)
    _, val_set = split_holdout(val_all, cfg.pretrain_holdout, seed)
    out = run_dir / "pretrain"

    def clean() -> None:
        if not (out / EPOCH_STATE).is_file():  # interrupted mid-way: continue from its last epoch; else start clean
            shutil.rmtree(out, ignore_errors=True)  # (no stale "best" of a run that had finished or never saved)

    if ranks is None:
        clean()
    else:  # rank 0 alone, before any rank looks for the epoch state
        ranks.on_server(clean, "the pre-training folder", send=False)
    with timed("pretraining"):
        best, epochs_run = pretrain_classifier(
            model_name=cfg.pretrain_model,
            overrides=cfg.pretrain_overrides,
            checkpoint=cfg.pretrain_checkpoint,
            num_classes=num_classes,
            train_dataset=train_set,
            val_dataset=val_set,
            out_dir=out,
            max_epochs=cfg.pretrain_epochs,
            batch_size=cfg.pretrain_batch_size,
            lr=cfg.pretrain_lr,
            accelerator=device.type,
            devices=1,
            precision=precision,
            seed=seed,
            patience=cfg.pretrain_patience,
            ranks=ranks,
            batch_transform=stored[0].deferred if stored else None,  # a store's float part: on the device
            num_workers=loading.num_workers if loading else 0,
            pin_memory=bool(loading and loading.pin_memory),
            check_every=cfg.pretrain_check_every,
            batch_per_rank=cfg.pretrain_batch == "per_rank",
            lr_scaling=cfg.pretrain_lr_scaling,
        )
    # the one-rank steps (pretrain_batch: global) and the fp32 gradient each step all-reduces (benchmarks/rank_model.py)
    note("pretraining steps", epochs_run * math.ceil(len(train_set) / cfg.pretrain_batch_size))
    host_s = pretraining_s = time.monotonic() - start
    if ranks is not None and ranks.rank != 0:
        return None
    if stored:
        remove_stores(folder)  # a cache of the PNGs: round 0's pre-training is done
    if per_image_epoch_s is not None:
        pretraining_s = per_image_epoch_s * len(train_set) * epochs_run
    model = load_pretrained_vit(best, map_location="cpu")
    note("pretraining gradient bytes", lambda: 4 * sum(p.numel() for p in model.parameters() if p.requires_grad))
    return model, pretraining_s, best, host_s
