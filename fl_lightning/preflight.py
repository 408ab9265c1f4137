"""Checks before anything launches: what the machine can give, and values that pass the config's
types but that Fabric, torch or a model library would reject minutes later.

``python -m fl_lightning.train`` calls :func:`preflight` for EVERY run of a config (each entry of
``variants:``) before the first one starts, so a bad later variant stops the command in seconds,
not after the earlier variants have run. Each failure is one line (:class:`~fl_lightning.errors.UsageError`,
exit status 2) that names the key, the value and what this machine has.

What is checked:

* ranks: ``federation.devices`` (and ``data.num_workers``) against the CPU cores this process may use (``os.sched_getaffinity``)
  or the visible GPUs, a GPU accelerator on a machine without one, a rough memory floor per rank;
  accelerator/precision/strategy as Fabric's connector sees them (without launching anything), and
  a strategy that would spawn its processes (``ddp_spawn``…; this program launches by re-running
  its command, as ``ddp`` does);
* ``output_dir``: a file where a folder should be, a folder this process cannot write;
* ``model.checkpoint``: readable, and a torch archive or safetensors file (the header only); a hub id in the
  Hugging Face cache;
* ``data.path`` of a Hugging Face data set: a local path that exists, or a hub id in the cache (unless
  ``data.download``);
* ``model.overrides``: keys the open_clip model (or a timm ViT) accepts;
* ``data.image_size``: the size a ViT's ``model.overrides`` fixes, and at least one patch;
* ``federation.min_clients``: at most the clients a round samples;
* ``data.image_size`` whose attention would not fit any machine (``train.*`` values torch rejects are
  already refused by the config loader);
* the method's own preflight (``Algorithm.preflight``: its weights and files).

Set ``FL_LIGHTNING_SKIP_RESOURCE_CHECK=1`` to skip the CPU/memory checks (e.g. to oversubscribe a
small CI machine on purpose).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import os
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

from fl_lightning.config import RunConfig
from fl_lightning.cores import available_cpus, ranks_sharing_cores
from fl_lightning.errors import ConfigError, ResourceError, UsageError, did_you_mean

__all__ = [
    "preflight",
    "preflight_run",
    "available_memory_bytes",
    "check_devices",
    "check_fabric_settings",
    "check_output_dir",
    "check_model",
    "check_image_size",
    "check_federation",
    "check_values",
]

# A rank imports torch, Lightning and the model library before it holds any data. An assumed floor
# (not measured per model): below it the ranks cannot even start; it is no estimate of a real run's needs.
RANK_MEMORY_FLOOR = 512 * 2**20
# ViT attention memory grows as (image_size / patch)^4: at 1024 px and 16 px patches one attention map
# of one head of one image is already 64 MiB. Larger inputs are a typo, not an experiment.
MAX_IMAGE_SIZE = 1024


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo, or None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()  # NVML-based: does not initialise CUDA


def check_devices(
    cfg: RunConfig, *, cpus: int | None = None, gpus: int | None = None, memory: int | None = None, launcher: str | None = None
) -> None:
    """The ranks the config asks for, against what this machine has.

    Args:
        cpus, gpus, memory: what the machine has (default: measured here); for tests.
        launcher: an external launcher started the processes (its world size is checked elsewhere).

    Raises:
        ResourceError: one line naming ``federation.devices`` / ``federation.accelerator`` and what is here.
    """
    f = cfg.federation
    if launcher is not None:
        return
    gpus = _gpu_count() if gpus is None else gpus
    wants_gpu = f.accelerator in ("gpu", "cuda") or f.accelerator == "auto" and gpus > 0
    if f.accelerator in ("gpu", "cuda") and gpus == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        why = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        raise ResourceError(
            f"resource error: federation.accelerator={f.accelerator!r} but this machine has no "
            f"visible GPU{why}; use --federation.accelerator cpu (or auto)"
        )
    if wants_gpu and f.devices > gpus:
        raise ResourceError(
            f"resource error: federation.devices={f.devices} asks for {f.devices} GPU ranks but "
            f"{gpus} GPU(s) are visible; use --federation.devices {gpus} or fewer (clients are "
            f"dealt to the ranks there are)"
        )
    if wants_gpu or os.environ.get("FL_LIGHTNING_SKIP_RESOURCE_CHECK") == "1":
        return
    cpus = available_cpus() if cpus is None else cpus
    if f.devices > cpus:
        raise ResourceError(
            f"resource error: federation.devices={f.devices} asks for {f.devices} CPU ranks but "
            f"this process may use {cpus} CPU core(s); use --federation.devices {cpus} or fewer "
            f"(clients are dealt to the ranks there are)"
        )
    from fl_lightning.data.loader import resolve_loader_settings

    workers = resolve_loader_settings(
        cfg.data.num_workers,
        cfg.data.pin_memory,
        cfg.data.persistent_workers,
        cuda=False,
        cpus=cpus,
        ranks_on_node=ranks_sharing_cores(f.devices, cpus),
    ).num_workers  # auto: 0 here
    if workers > cpus:  # torch's DataLoader would start them all (a process each) for every client
        raise ResourceError(
            f"resource error: data.num_workers={workers} loader processes per rank but this "
            f"process may use {cpus} CPU core(s); use --data.num_workers {cpus} or fewer (0 loads "
            f"in the rank itself)"
        )
    memory = available_memory_bytes() if memory is None else memory
    if f.devices > 1 and memory is not None and memory < f.devices * RANK_MEMORY_FLOOR:
        raise ResourceError(
            f"resource error: federation.devices={f.devices} ranks need at least "
            f"{f.devices * RANK_MEMORY_FLOOR / 2**30:.1f} GiB to start, but "
            f"{memory / 2**30:.1f} GiB are available; use fewer --federation.devices"
        )


def check_fabric_settings(cfg: RunConfig) -> None:
    """Accelerator, precision and strategy as Fabric's connector resolves them (nothing is launched).

    Raises:
        ConfigError: Fabric rejects the combination, or the strategy spawns its processes.
    """
    f = cfg.federation
    try:
        from lightning.fabric.connector import _Connector
        from lightning.fabric.strategies.launchers.multiprocessing import _MultiProcessingLauncher
    except ImportError:  # a Lightning without this private API: Fabric itself will check
        return
    strategy = f.strategy if f.strategy != "auto" else ("ddp" if f.devices * f.num_nodes > 1 else "auto")
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            connector = _Connector(
                accelerator=f.accelerator, devices=f.devices, num_nodes=f.num_nodes, strategy=strategy, precision=f.precision
            )
    except Exception as err:  # noqa: BLE001 — Fabric's own words, on one line
        text = " ".join(str(err).split()).split(". ")[0]
        lower = text.lower()
        key = next(
            (k for k in ("strategy", "precision", "accelerator", "devices") if k in lower),
            "precision" if "transformer_engine" in lower else "accelerator",
        )
        raise ConfigError(
            f"federation.{key}",
            getattr(f, key),
            f"a value Fabric accepts here with "
            f"accelerator={f.accelerator!r}, devices={f.devices}, strategy={f.strategy!r}, "
            f"precision={f.precision!r} (Fabric: {type(err).__name__}: {text})",
        ) from None
    if isinstance(getattr(connector.strategy, "launcher", None), _MultiProcessingLauncher):
        raise ConfigError(
            "federation.strategy",
            f.strategy,
            "'auto' or 'ddp' (this program launches its ranks by "
            "re-running its command; spawn/fork strategies are not supported)",
        )


def check_output_dir(cfg: RunConfig) -> None:
    """The run folder can be created and written: no file in the way, write permission.

    Raises:
        ResourceError: one line naming ``output_dir`` and what is wrong.
    """
    out, run_dir = Path(cfg.output_dir), cfg.run_dir
    for path, key in ((out, "output_dir"), (run_dir, "the run folder")):
        if path.exists() and not path.is_dir():
            raise ResourceError(
                f"resource error: {key} '{path}' is a file, not a folder; choose another --output_dir (or --run_name)"
            )
    existing = run_dir
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise ResourceError(f"resource error: output_dir '{out}' cannot be created: '{existing}' is a file")
    try:  # os.access is not enough (root, read-only mounts): try it
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".fl_lightning_probe_")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ResourceError(
            f"resource error: output_dir '{out}' is not writable ('{existing}': "
            f"{err.strerror or err}); choose another --output_dir"
        ) from None


def _allowed_keys(*targets: object) -> set[str]:
    keys: set[str] = set()
    for target in targets:
        if dataclasses.is_dataclass(target):
            keys |= {f.name for f in dataclasses.fields(target)}
        else:
            keys |= {p for p in inspect.signature(target).parameters if p not in ("self", "kwargs")}
    return keys


def _check_keys(given: dict, allowed: set[str], key: str, what: str) -> None:
    for name in given:
        if name not in allowed:
            raise ConfigError(f"{key}.{name}", given[name], f"a key {what} accepts{did_you_mean(str(name), sorted(allowed))}")


def check_data(cfg: RunConfig) -> None:
    """``data.name: hf``: the data set is on disk, or its hub id in the Hugging Face cache (no request is made).

    Raises:
        MissingResourceError: one line naming ``data.path``, where it looked and the command that fetches it.
    """
    d = cfg.data
    if d.name != "hf" or not d.path:
        return
    if os.path.exists(os.path.expanduser(d.path)):
        if d.revision is not None:
            raise ConfigError(
                "data.revision",
                d.revision,
                f"null for the local path '{d.path}' (a revision picks a "
                f"snapshot of a hub id; a folder or file on disk is one version)",
            )
        return
    from fl_lightning.data.hf import hub_folder
    from fl_lightning.models.hub import looks_like_hub_id

    if not d.download and looks_like_hub_id(d.path):
        hub_folder(d.path, download=False, revision=d.revision, cache_dir=d.cache_dir)  # and no local folder


def check_model(cfg: RunConfig) -> None:
    """``model.checkpoint`` readable and of a known format; ``model.overrides`` keys the factory accepts.

    Raises:
        MissingResourceError: the checkpoint (one line naming the file).
        ConfigError: an override key the model does not take.
    """
    m = cfg.model
    if m.checkpoint:
        from fl_lightning.models.hub import looks_like_hub_id, resolve_weights_file
        from fl_lightning.models.weights import check_checkpoint

        local = os.path.exists(os.path.expanduser(m.checkpoint))
        if not (m.download and looks_like_hub_id(m.checkpoint) and not local):
            # a hub id to fetch is fetched when the model is built, not in the preflight
            check_checkpoint(resolve_weights_file(m.checkpoint, download=False, cache_dir=m.cache_dir), label="model.checkpoint")
    if not m.overrides:
        return
    if m.library == "open_clip":
        import open_clip

        models = [getattr(open_clip, n) for n in ("CLIP", "CustomTextCLIP", "CoCa") if hasattr(open_clip, n)]
        _check_keys(m.overrides, _allowed_keys(*[c.__init__ for c in models]), "model.overrides", "an open_clip model")
        for section, cfg_class in (("vision_cfg", "CLIPVisionCfg"), ("text_cfg", "CLIPTextCfg")):
            if isinstance(m.overrides.get(section), dict) and hasattr(open_clip, cfg_class):
                _check_keys(
                    m.overrides[section],
                    _allowed_keys(getattr(open_clip, cfg_class)),
                    f"model.overrides.{section}",
                    f"open_clip's {cfg_class}",
                )
    elif m.library == "timm" and m.name.startswith("vit_") and "hybrid" not in m.name:
        import timm
        from timm.models.vision_transformer import VisionTransformer

        _check_keys(
            m.overrides,
            _allowed_keys(VisionTransformer.__init__, timm.create_model),
            "model.overrides",
            "timm's VisionTransformer",
        )


def check_values(cfg: RunConfig) -> None:
    """Values of the right type that torch would reject (or overflow on) at run time.

    Raises:
        ConfigError: one line naming the key.
    """
    # train.lr / momentum / weight_decay beyond float32 or negative cannot get here: LocalTrainingConfig
    # rejects them when the config is built
    if cfg.data.image_size is not None and cfg.data.image_size > MAX_IMAGE_SIZE:
        raise ConfigError(
            "data.image_size",
            cfg.data.image_size,
            f"an int in [8, {MAX_IMAGE_SIZE}] (ViT attention memory grows as the 4th power of it)",
        )


def _vit_input(cfg: RunConfig) -> tuple[int | None, str | None, int | None]:
    """For a ViT backbone: (the input size ``model.overrides`` fixes, the key that fixes it, the patch size);
    ``(None, None, None)`` for other models (a CNN takes any size). Read from the config and the library's
    model table, without building anything."""
    import re

    m, overrides = cfg.model, cfg.model.overrides or {}
    if m.library == "open_clip":
        vision = overrides.get("vision_cfg") if isinstance(overrides.get("vision_cfg"), dict) else {}
        fixed = vision.get("image_size")
        patch = vision.get("patch_size")
        if patch is None and ":" not in m.name:
            import open_clip

            patch = ((open_clip.get_model_config(m.name) or {}).get("vision_cfg") or {}).get("patch_size")
        return fixed, "model.overrides.vision_cfg.image_size", patch
    if m.library == "timm" and m.name.startswith("vit_") and "hybrid" not in m.name:
        match = re.search(r"patch(\d+)", m.name)
        patch = overrides.get("patch_size", int(match.group(1)) if match else None)
        return overrides.get("img_size"), "model.overrides.img_size", patch
    return None, None, None


def check_image_size(cfg: RunConfig) -> None:
    """``data.image_size`` that the model can take: the size ``model.overrides`` fixes for a ViT (the data are
    resized to ``data.image_size``, the model would get images of another size), and at least one patch.

    Raises:
        ConfigError: one line naming ``data.image_size``.
    """
    size = cfg.data.image_size
    if size is None:
        return
    fixed, key, patch = _vit_input(cfg)
    if fixed is not None and set(fixed if isinstance(fixed, (list, tuple)) else [fixed]) != {size}:
        raise ConfigError(
            "data.image_size",
            size,
            f"{fixed!r}, the input size {key} builds the model for (or null: the model's size); or change both",
        )
    if isinstance(patch, int) and size < patch:
        raise ConfigError(
            "data.image_size", size, f"at least the model's patch size, {patch} (a multiple of it, or null: the model's size)"
        )


def check_federation(cfg: RunConfig) -> None:
    """``federation.min_clients`` that a round can reach: at most the clients it samples.

    Raises:
        ConfigError: one line naming ``federation.min_clients``.
    """
    from fl_lightning.federation.ranks.placement import clients_per_round

    f, k = cfg.federation, cfg.partition.num_clients
    sampled = clients_per_round(k, f.client_fraction)
    if f.min_clients > sampled:
        raise ConfigError(
            "federation.min_clients",
            f.min_clients,
            f"at most {sampled}, the clients a round samples (partition.num_clients={k} × "
            f"federation.client_fraction={f.client_fraction:g}): no round could succeed",
        )


def preflight_run(cfg: RunConfig) -> None:
    """Every check of one run (see the module docstring), cheapest first."""
    from fl_lightning.algorithms import available_algorithms
    from fl_lightning.federation.ranks.launch import check_launcher

    check_values(cfg)
    check_federation(cfg)
    launcher = check_launcher(cfg.federation.devices, cfg.federation.num_nodes)
    check_devices(cfg, launcher=launcher)
    if launcher is None:
        check_fabric_settings(cfg)
    check_output_dir(cfg)
    check_data(cfg)
    check_model(cfg)
    check_image_size(cfg)
    from fl_lightning.federation.precision import check_precision

    check_precision(cfg, available_algorithms()[cfg.algorithm])
    from fl_lightning.federation.policies.order import check_policies

    # privacy that would not cover the method; FedAdam, Krum, attacks, late updates where no mean is aggregated
    check_policies(cfg, available_algorithms()[cfg.algorithm])
    available_algorithms()[cfg.algorithm].preflight(cfg)


def preflight(runs: Sequence[RunConfig]) -> None:
    """:func:`preflight_run` for every run, before any starts; a variant's error names the variant.

    Raises:
        UsageError: the first failing check (one line).
    """
    for i, cfg in enumerate(runs):
        try:
            preflight_run(cfg)
        except UsageError as err:
            if len(runs) == 1:
                raise
            raise UsageError(f"{err} (in variants[{i}])") from None
