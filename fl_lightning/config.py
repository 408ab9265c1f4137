"""Typed run configuration: dataclasses, loaded from YAML with dotted command-line overrides.

One dataclass per component; ``RunConfig`` nests them. A config is built once at the entry point
(``load_config``) and passed down as objects — never a dict or an ``args`` namespace.

Why our own loader rather than jsonargparse/LightningCLI: we need (a) ONE line per error naming the
dotted key, the value and what is allowed (jsonargparse prints a multi-line usage block), (b) a
did-you-mean for unknown keys, and (c) strict types (an int for a float is fine, a string is not)
with no coercion surprises. The whole mechanism is ~150 lines of plain ``dataclasses`` + ``typing``
introspection below, and the YAML files stay the same shape LightningCLI users know.

Example:
    >>> cfg = load_config("conf/quickstart.yaml", ["--partition.alpha", "0.01"])
    >>> cfg.partition.alpha
    0.01
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from fl_lightning.errors import ConfigError, UsageError

__all__ = [
    "DataConfig", "PartitionConfig", "ModelConfig", "FederationConfig", "LocalTrainingConfig",
    "LoggingConfig", "AnalyticConfig", "FedOPALConfig", "FedAvgConfig", "LoraConfig",
    "SystemsConfig", "FeDiSynConfig", "RunConfig", "load_config", "config_to_dict", "dump_config", "expand_variants",
    "DATASET_NAMES", "ALGORITHM_NAMES",
]

DATASET_NAMES = ("cifar10", "cifar100", "svhn", "dtd", "food101", "caltech101", "imagefolder", "digits",
                 "synthetic")
ALGORITHM_NAMES = ("fedopal", "afl", "fedavg", "fedisyn")


def _check(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(key, value, allowed)


@dataclass
class DataConfig:
    name: Literal[DATASET_NAMES] = "digits"  # type: ignore[valid-type]
    root: str = "data"  # datasets are looked for here (torchvision layout; imagefolder: the folder)
    download: bool = False  # opt-in: only on machines that can reach the dataset hosts
    image_size: int | None = None  # None: the backbone's input size
    batch_size: int = 64
    num_workers: int = 0  # 0 keeps tiny runs free of worker start-up cost
    num_samples: int | None = None  # a seeded subset of this many training images (`synthetic`: how many to make)

    def __post_init__(self) -> None:
        _check(self.image_size is None or self.image_size >= 8, "image_size", self.image_size, "an int >= 8 or null")
        _check(self.batch_size >= 1, "batch_size", self.batch_size, "an int >= 1")
        _check(self.num_workers >= 0, "num_workers", self.num_workers, "an int >= 0")


@dataclass
class PartitionConfig:
    scheme: Literal["dirichlet", "iid", "shards"] = "dirichlet"
    num_clients: int = 10
    alpha: float = 0.1  # Dirichlet concentration; inf means IID
    min_samples: int = 1  # every client gets at least this many training samples
    shards_per_client: int = 2  # `shards` scheme only (McMahan et al. 2017)
    balance: bool = False  # flwr-datasets' self-balancing rule (off: plain Hsu et al. 2019)
    seed: int = 0  # its own seed: the same partition whatever the training seed

    def __post_init__(self) -> None:
        _check(self.num_clients >= 1, "num_clients", self.num_clients, "an int >= 1")
        _check(self.alpha > 0, "alpha", self.alpha, "a float > 0, or inf for IID")
        _check(self.min_samples >= 0, "min_samples", self.min_samples, "an int >= 0")
        _check(self.shards_per_client >= 1, "shards_per_client", self.shards_per_client, "an int >= 1")


@dataclass
class ModelConfig:
    library: Literal["open_clip", "timm"] = "open_clip"
    name: str = "ViT-B-16"
    pretrained: str | None = "openai"  # open_clip tag, or for timm any non-null value means "pretrained"
    checkpoint: str | None = None  # a local weights file; wins over `pretrained`
    feature: Literal["proj", "pre_proj"] = "proj"  # CLIP: image embedding (after proj) or the width-D state
    download: bool = False
    cache_dir: str | None = None
    overrides: dict = field(default_factory=dict)  # passed to the library's factory (tiny test models)


@dataclass
class FederationConfig:
    rounds: int = 1
    client_fraction: float = 1.0  # fraction of clients sampled per round (multi-round methods)
    sampling_seed: int = 0  # its own seed for client sampling
    accelerator: str = "auto"  # Fabric picks the GPUs when there are any, else the CPU
    devices: int = 1  # Fabric ranks on this node; clients are dealt to them
    num_nodes: int = 1
    strategy: str = "auto"  # "auto" → ddp when devices * num_nodes > 1
    precision: str = "32-true"  # e.g. "bf16-mixed" on GPUs
    on_client_error: Literal["raise", "skip"] = "raise"

    def __post_init__(self) -> None:
        _check(self.rounds >= 1, "rounds", self.rounds, "an int >= 1")
        _check(0 < self.client_fraction <= 1, "client_fraction", self.client_fraction, "a float in (0, 1]")
        _check(self.devices >= 1, "devices", self.devices, "an int >= 1")
        _check(self.num_nodes >= 1, "num_nodes", self.num_nodes, "an int >= 1")


@dataclass
class LocalTrainingConfig:
    epochs: int = 5  # E local epochs (FedOPAL: 5)
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = 0.01  # VPT's usual order for SGD on prompts
    momentum: float = 0.9
    weight_decay: float = 0.0
    batch_size: int | None = None  # None: data.batch_size

    def __post_init__(self) -> None:
        _check(self.epochs >= 0, "epochs", self.epochs, "an int >= 0")
        _check(self.lr > 0, "lr", self.lr, "a float > 0")
        _check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a float >= 0")
        _check(self.batch_size is None or self.batch_size >= 1, "batch_size", self.batch_size, "an int >= 1 or null")


@dataclass
class LoggingConfig:
    wandb: bool = False
    project: str = "fl_lightning"
    entity: str | None = None
    mode: Literal["online", "offline"] = "offline"  # offline needs no network: `wandb sync` later
    tensorboard: bool = False
    progress: bool = True  # rich progress bars (shown only on a terminal)


@dataclass
class AnalyticConfig:
    lam: float = 1e-6  # λ of Eq. (9)
    regularization: Literal["once", "per_client"] = "once"  # FedOPAL adds λ once; AFL's code K·γ
    remove_regularization: bool = False  # AFL's option to take the per-client γ back out
    dtype: Literal["float64", "float32"] = "float64"  # accumulation and solve precision

    def __post_init__(self) -> None:
        _check(self.lam >= 0, "lam", self.lam, "a float >= 0")


@dataclass
class FedOPALConfig:
    num_prompts: int = 10  # M prompt tokens (VPT-shallow)
    mu: float = 0.1  # proximal strength of Eq. (6)
    prompt_aggregation: Literal["mean", "weighted"] = "mean"  # Eq. (8): the paper's plain mean
    restat: Literal["local", "global"] = "local"  # global: recompute statistics under P_global (beyond the paper)
    prompt_seed: int = 0  # identical P_init on every client

    def __post_init__(self) -> None:
        _check(self.num_prompts >= 0, "num_prompts", self.num_prompts, "an int >= 0")
        _check(self.mu >= 0, "mu", self.mu, "a float >= 0")


@dataclass
class FedAvgConfig:
    weighted: bool = True  # weight client heads by their sample counts


@dataclass
class LoraConfig:
    rank: int = 8  # r: the paper's adapters (same rank for every method compared)
    alpha: float = 16.0  # update scale alpha / r = 2, peft's common default ratio
    dropout: float = 0.0  # none: local data are small and the rounds few
    # dotted names: a bare "proj" would also catch timm's patch_embed.proj
    target_modules: list = field(default_factory=lambda: ["attn.qkv", "attn.proj"])

    def __post_init__(self) -> None:
        _check(self.rank >= 1, "rank", self.rank, "an int >= 1")
        _check(self.alpha > 0, "alpha", self.alpha, "a float > 0")
        _check(0 <= self.dropout < 1, "dropout", self.dropout, "a float in [0, 1)")
        _check(len(self.target_modules) > 0 and all(isinstance(m, str) for m in self.target_modules),
               "target_modules", self.target_modules, "a non-empty list of dotted module names")


_PROFILE_FIELDS = ("forward_time_s", "backward_time_per_layer_s", "fixed_memory_gb", "memory_per_layer_gb",
                   "memory_budget_gb", "transmit_power_w")


@dataclass
class SystemsConfig:
    devices: str | list = "paper_testbed"  # the paper's 10 boards, cycled over the clients; or a list of profile names
    profiles: dict = field(default_factory=dict)  # {profile name: {field: value}} overrides of the calibrated boards
    timing: Literal["profiles", "measured"] = "profiles"  # measured: h̄, h fitted to this host's client compute times
    depth_policy: Literal["clc", "capacity", "full", "fixed"] = "clc"  # clc = FeDiSyn; capacity = CAFF; full = SFLF
    fixed_depth: int = 1  # x of the `fixed` policy (capped by each device's memory)
    radius_m: float = 50.0  # devices dropped uniformly in a 50 m disc ...
    center_x_m: float = 300.0  # ... centred 300 m from the server (paper setting)
    path_loss_exponent: float = 3.5  # (d / d0)^-3.5 large-scale fading
    d0_m: float = 10.0
    noise_power_w: float = 1e-11  # sigma^2
    total_bandwidth_hz: float = 10e6  # B = 10 MHz shared by FDMA
    placement_seed: int = 0  # its own seed: the same device positions whatever the training seed

    def __post_init__(self) -> None:
        from fl_lightning.systems.devices import PROFILES

        if isinstance(self.devices, str):
            _check(self.devices == "paper_testbed", "devices", self.devices,
                   "'paper_testbed' or a list of profile names")
        else:
            names = sorted(PROFILES) + sorted(set(self.profiles) - set(PROFILES))
            bad = [d for d in self.devices if d not in names]
            _check(len(self.devices) > 0 and not bad, "devices", self.devices,
                   f"a non-empty list of profile names from {names}")
        for name, fields in self.profiles.items():
            _check(isinstance(fields, dict) and set(fields) <= set(_PROFILE_FIELDS), f"profiles.{name}", fields,
                   f"a mapping with keys among {list(_PROFILE_FIELDS)}")
            _check(name in PROFILES or set(fields) == set(_PROFILE_FIELDS), f"profiles.{name}", fields,
                   f"all of {list(_PROFILE_FIELDS)} for a new profile (known: {sorted(PROFILES)})")
        _check(self.fixed_depth >= 1, "fixed_depth", self.fixed_depth, "an int >= 1")
        _check(self.radius_m > 0, "radius_m", self.radius_m, "a float > 0")
        _check(self.center_x_m > self.radius_m, "center_x_m", self.center_x_m, "a float > radius_m (server outside the disc)")
        _check(self.path_loss_exponent > 0, "path_loss_exponent", self.path_loss_exponent, "a float > 0")
        _check(self.d0_m > 0, "d0_m", self.d0_m, "a float > 0")
        _check(self.noise_power_w > 0, "noise_power_w", self.noise_power_w, "a float > 0")
        _check(self.total_bandwidth_hz > 0, "total_bandwidth_hz", self.total_bandwidth_hz, "a float > 0")


@dataclass
class FeDiSynConfig:
    # --- resources (weights are read from local paths only) ---
    diffusion_path: str | None = None  # a diffusers SD v1-5 folder; null: tiny random components (tests)
    llm_path: str | None = None  # a causal LM folder for prompt expansion (paper: LLaMA-7B); null: templates
    # --- step 1: client latents ---
    vae_image_size: int = 512  # SD v1-5's native resolution: clients resize their images to it before encoding
    encode_batch_size: int = 16  # images per VAE call on a client
    num_centroids: int = 4  # Z k-means centroids per class per client
    timestep: int | None = None  # s; null: random in [0, max_timestep] per class
    max_timestep: int = 600  # S: above ~600 of 1000 the class content is mostly noise
    # --- step 1: server generation ---
    prompts_per_label: int = 8
    rho: float = 0.7  # Ē = ρ·e_z + (1−ρ)·e_avg
    guidance_scale: float = 7.5  # SD's usual classifier-free guidance
    num_inference_steps: int = 50  # PNDM steps of the full 0..T chain (a start at s runs ≈ 50·s/T)
    generation_batch_size: int = 16
    diffusion_precision: Literal["auto", "float32", "float16", "bfloat16"] = "auto"  # auto: fp16 on GPU, fp32 on CPU
    synthetic_lambda: float | None = 1.0  # λ: synthetic images per real image; null → λ* of the scaling law
    scaling_kappa: list | None = None  # κ1..κ4 fitted on pilot runs (notebooks/fedisyn_scaling_law.ipynb)
    target_accuracy: float = 0.8  # Acc of λ* = (κ2 e^{κ3 Acc} / (h0 κ1))^{1/(κ2+1)}
    # ĥ and h̃ (s): null → measured on this host (wall time); numbers make the simulated clock reproducible
    generation_time_per_image_s: float | None = None
    pretrain_time_per_image_epoch_s: float | None = None
    # --- step 2: server pre-training ---
    pretrain_model: str = "vit_base_patch16_224"
    pretrain_checkpoint: str | None = None  # local ImageNet weights file; null: random init
    pretrain_overrides: dict = field(default_factory=dict)  # timm.create_model kwargs (tiny test models)
    pretrain_epochs: int = 10  # T̂
    pretrain_lr: float = 3e-4  # AdamW peak, cosine decay (ViT fine-tuning order)
    pretrain_batch_size: int = 64
    pretrain_holdout: float = 0.1  # held-out synthetic fraction for early stopping
    pretrain_patience: int = 3  # epochs without held-out improvement before stopping
    # --- step 3: LoRA fine-tuning (local epochs and batch size: the `train` section) ---
    finetune_lr: float = 1e-3  # AdamW on LoRA + head

    def __post_init__(self) -> None:
        _check(self.vae_image_size >= 8 and self.vae_image_size % 8 == 0, "vae_image_size", self.vae_image_size, "a multiple of 8 (>= 8)")
        _check(self.encode_batch_size >= 1, "encode_batch_size", self.encode_batch_size, "an int >= 1")
        _check(self.num_centroids >= 1, "num_centroids", self.num_centroids, "an int >= 1")
        _check(0 <= self.max_timestep < 1000, "max_timestep", self.max_timestep, "an int in [0, 999]")
        _check(self.timestep is None or 0 <= self.timestep < 1000, "timestep", self.timestep,
               "null or an int in [0, 999]")
        _check(self.prompts_per_label >= 1, "prompts_per_label", self.prompts_per_label, "an int >= 1")
        _check(0 <= self.rho <= 1, "rho", self.rho, "a float in [0, 1]")
        _check(self.guidance_scale >= 0, "guidance_scale", self.guidance_scale, "a float >= 0")
        _check(1 <= self.num_inference_steps <= 1000, "num_inference_steps", self.num_inference_steps,
               "an int in [1, 1000]")
        _check(self.generation_batch_size >= 1, "generation_batch_size", self.generation_batch_size, "an int >= 1")
        _check(self.synthetic_lambda is None or self.synthetic_lambda > 0, "synthetic_lambda",
               self.synthetic_lambda, "a float > 0 or null")
        _check(self.scaling_kappa is None or len(self.scaling_kappa) == 4 and all(
            isinstance(k, (int, float)) and not isinstance(k, bool) for k in self.scaling_kappa),
               "scaling_kappa", self.scaling_kappa, "null or a list of 4 numbers [κ1, κ2, κ3, κ4]")
        _check(self.synthetic_lambda is not None or self.scaling_kappa is not None, "scaling_kappa",
               self.scaling_kappa, "[κ1, κ2, κ3, κ4] when synthetic_lambda is null (λ* needs the fitted law)")
        _check(0 < self.target_accuracy <= 1, "target_accuracy", self.target_accuracy, "a float in (0, 1]")
        for key in ("generation_time_per_image_s", "pretrain_time_per_image_epoch_s"):
            value = getattr(self, key)
            _check(value is None or value >= 0, key, value, "null or a float >= 0")
        _check(self.pretrain_epochs >= 1, "pretrain_epochs", self.pretrain_epochs, "an int >= 1")
        _check(self.pretrain_lr > 0, "pretrain_lr", self.pretrain_lr, "a float > 0")
        _check(self.pretrain_batch_size >= 1, "pretrain_batch_size", self.pretrain_batch_size, "an int >= 1")
        _check(0 < self.pretrain_holdout < 1, "pretrain_holdout", self.pretrain_holdout, "a float in (0, 1)")
        _check(self.pretrain_patience >= 1, "pretrain_patience", self.pretrain_patience, "an int >= 1")
        _check(self.finetune_lr > 0, "finetune_lr", self.finetune_lr, "a float > 0")


@dataclass
class RunConfig:
    algorithm: Literal[ALGORITHM_NAMES] = "fedopal"  # type: ignore[valid-type]
    seed: int = 0  # training seed (the partition and client sampling have their own)
    output_dir: str = "runs"
    run_name: str | None = None  # null: "<algorithm>_<dataset>_a<alpha>_s<seed>"
    # A comparison: each entry is a mapping merged over this config (e.g. {algorithm: afl}); the CLI
    # runs them one after another and prints a table. Empty: one run of this config.
    variants: list = field(default_factory=list)
    data: DataConfig = field(default_factory=DataConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)
    train: LocalTrainingConfig = field(default_factory=LocalTrainingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    analytic: AnalyticConfig = field(default_factory=AnalyticConfig)
    fedopal: FedOPALConfig = field(default_factory=FedOPALConfig)
    fedavg: FedAvgConfig = field(default_factory=FedAvgConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    systems: SystemsConfig = field(default_factory=SystemsConfig)
    fedisyn: FeDiSynConfig = field(default_factory=FeDiSynConfig)

    @property
    def resolved_run_name(self) -> str:
        if self.run_name:
            return self.run_name
        alpha = "inf" if math.isinf(self.partition.alpha) else f"{self.partition.alpha:g}"
        return f"{self.algorithm}_{self.data.name}_a{alpha}_s{self.seed}"

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.resolved_run_name


# ----------------------------------------------------------------------------- loading


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    return {bool: "a bool", int: "an int", float: "a float", str: "a string", dict: "a mapping",
            list: "a list"}.get(tp, getattr(tp, "__name__", str(tp)))


def _convert(tp: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return it (ints widened to float)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices:
            return value
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(key, value, f"one of {', '.join(repr(c) for c in choices)}{hint}")
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, key)
            except ConfigError:
                continue
        raise ConfigError(key, value, _type_name(tp))
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-6 (no dot) as a string; "inf" for IID
            try:
                return float(value.strip().lstrip("."))
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is dict:
        if isinstance(value, dict):
            return value
    elif tp is list:
        if isinstance(value, (list, tuple)):
            return list(value)
    elif dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    raise ConfigError(key, value, _type_name(tp))


def _build(cls: type, values: Any, prefix: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(prefix or "<root>", values, "a mapping of keys to values")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            known = [f"{prefix}.{n}" if prefix else n for n in names]
            close = difflib.get_close_matches(dotted, known + _all_keys(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            allowed = f"one of {', '.join(names)}" if len(names) <= 12 else f"a key of {cls.__name__}"
            raise UsageError(f"config error: unknown key {dotted!r}{hint}; allowed here: {allowed}")
        kwargs[key] = _convert(hints[key], value, dotted)
    try:
        return cls(**kwargs)
    except ConfigError as err:  # __post_init__ checks know only their own key: add the section
        raise ConfigError(f"{prefix}.{err.key}" if prefix else err.key, err.value, err.allowed) from None


def _all_keys(cls: type = RunConfig, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}{f.name}"
        tp = typing.get_type_hints(cls)[f.name]
        keys += _all_keys(tp, dotted + ".") if dataclasses.is_dataclass(tp) else [dotted]
    return keys


def _parse_overrides(overrides: list[str]) -> dict:
    """``["--a.b", "1", "--c=x"]`` → ``{"a": {"b": 1}, "c": "x"}`` (values parsed as YAML scalars)."""
    tree: dict = {}
    i = 0
    while i < len(overrides):
        token = overrides[i]
        if not token.startswith("--") or token == "--":
            raise UsageError(f"usage error: expected --key value, got {token!r}")
        key, sep, raw = token[2:].partition("=")
        if not sep:
            if i + 1 >= len(overrides):
                raise UsageError(f"usage error: --{key} needs a value")
            raw, i = overrides[i + 1], i + 1
        i += 1
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UsageError(f"usage error: --{key} conflicts with another override")
        node[parts[-1]] = value
    return tree


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Build a validated :class:`RunConfig` from a YAML file plus ``--dotted.key value`` overrides.

    Raises:
        UsageError / ConfigError: one line naming the key, the value and what is allowed.
    """
    values: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise UsageError(f"usage error: config file '{path}' not found; pass --config with an existing YAML "
                             f"file (see conf/)")
        try:
            values = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise UsageError(f"usage error: config file '{path}' is not valid YAML{where}") from None
    return _build(RunConfig, _merge(values, _parse_overrides(overrides or [])), "")


def expand_variants(cfg: RunConfig) -> list[RunConfig]:
    """The runs a config asks for: itself, or one per entry of ``variants`` (merged over it)."""
    if not cfg.variants:
        return [cfg]
    base = config_to_dict(cfg)
    base["variants"] = []
    runs = []
    for i, variant in enumerate(cfg.variants):
        if not isinstance(variant, dict):
            raise ConfigError(f"variants[{i}]", variant, "a mapping of config keys, e.g. {algorithm: afl}")
        runs.append(_build(RunConfig, _merge(base, variant), ""))
    names = [r.resolved_run_name for r in runs]
    if len(set(names)) != len(names):
        raise ConfigError("variants", names, "distinct run names (set run_name in each variant)")
    return runs


def config_to_dict(cfg: Any) -> dict:
    """A plain dict (inf kept as float) of a config dataclass, for YAML, W&B and the checkpoint."""
    return dataclasses.asdict(cfg)


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as YAML that :func:`load_config` reads back unchanged."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
