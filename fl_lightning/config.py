"""Typed run configuration: the core sections, the method's own section, and the strict loader.

A config has the **core sections** that every method shares (``data``, ``partition``, ``model``,
``federation``, ``train``, ``logging``) plus **one section owned by the method** named by
``algorithm:`` (e.g. ``fedopal: {mu: 0.1}``). A method declares that section's dataclass on its own
class (``config_class``); the loader finds it through the algorithm registry, so a new method adds
its file and nothing here. A config is built once at the entry point (``load_config``) and passed
down as objects — never a dict or an ``args`` namespace. The method's section is read in one way:
``cfg.method`` (inside the method, ``self.config``).

Imports point one way: this module reads the registry (``fl_lightning.algorithms``, imported on first
use so that ``import fl_lightning.config`` stays cheap); the registry and the methods never import it
at run time (a method's config checks use :func:`fl_lightning.errors.check`).

Why our own loader rather than jsonargparse/LightningCLI: we need (a) ONE line per error naming the
dotted key, the value and what is allowed (jsonargparse prints a multi-line usage block), (b) a
did-you-mean for unknown keys, and (c) strict types (an int for a float is fine, a string is not)
with no coercion surprises. The mechanism is plain ``dataclasses`` + ``typing`` introspection, and
the YAML files stay the shape LightningCLI users know.

Example:
    >>> cfg = load_config("conf/quickstart.yaml", ["--partition.alpha", "0.01"])
    >>> cfg.partition.alpha, cfg.method.mu
    (0.01, 0.1)
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from fl_lightning.errors import ConfigError, UsageError, check

__all__ = [
    "DataConfig", "PartitionConfig", "ModelConfig", "FederationConfig", "PrivacyConfig", "PRIVACY_MECHANISMS",
    "LocalTrainingConfig", "LoggingConfig",
    "RunConfig", "check", "load_config", "build_config", "config_to_dict", "dump_config", "expand_variants",
    "schema_keys", "current_names", "recorded_config", "added_key_overrides", "CORE_SECTIONS", "PRECISIONS", "ACCELERATORS",
]  # check lives in fl_lightning.errors (method configs import it from there, not from here)

# What Fabric accepts (lightning.fabric.connector._PRECISION_INPUT and accelerator names), checked here
# so that a typo stops in the config layer, not in a traceback from inside Fabric.
PRECISIONS = ("32-true", "32", "64-true", "64", "16-mixed", "16", "bf16-mixed", "bf16", "16-true", "bf16-true",
              "transformer-engine", "transformer-engine-float16")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")
_MATMUL_PRECISIONS = ("highest", "high", "medium")  # torch.set_float32_matmul_precision's
_SEED_MAX = 2**32 - 1  # numpy's and seed_everything's range
_FLOAT32_MAX = 3.4028234663852886e38  # a larger step size overflows inside a float32 optimiser


def _check_seed(key: str, value: int) -> None:
    check(0 <= value <= _SEED_MAX, key, value, f"an int in [0, {_SEED_MAX}]")


@dataclass
class DataConfig:
    name: str = "digits"  # a name in fl_lightning.data.registry.DATASETS, the one list of data sets
    root: str = "data"  # datasets are looked for here (torchvision layout; imagefolder: the folder)
    download: bool = False  # opt-in: only on machines that can reach the dataset hosts
    image_size: int | None = None  # None: the backbone's input size
    batch_size: int = 64
    num_workers: int = 0  # 0 keeps tiny runs free of worker start-up cost
    num_samples: int | None = None  # a seeded subset of this many training images (`synthetic`: how many to make)
    # the seed of the data set's own train/test split and of the num_samples subset (digits, synthetic,
    # caltech101, imagefolder); null: the run's seed. Fixed, seeds vary only the partition and the training,
    # as with CIFAR's official split (and a comparison's frozen features are shared across its seeds)
    split_seed: int | None = None
    # frozen-backbone features of each split (AFL, FedCGS, FedPFT, FedAvg of a head), computed once and read
    # by every later run with the same key: true = <output_dir>/feature_cache, a folder, or false (no disk)
    feature_cache: bool | str = True
    # a split whose transform is deterministic keeps its preprocessed tensors in memory when they fit this
    # many MiB (data/preprocessed.py: each item is transformed once, not once per pass); 0 turns it off
    cache_mb: int = 2048
    # name: hf — a Hugging Face dataset (data/hf.py, docs/data_and_weights.md): a hub id read from the HF cache
    # (fetched only with download: true), or a local path: a save_to_disk folder, a .parquet/.arrow file, a folder
    path: str | None = None
    train_split: str = "train"
    test_split: str | None = "test"  # null: a seeded 4:1 split of train_split (split_seed), as imagefolder
    image_column: str | None = None  # null: the first Image feature, else a column named image / img
    label_column: str | None = None  # null: the first ClassLabel feature, else label / labels / fine_label / target

    def __post_init__(self) -> None:
        from fl_lightning.data.registry import DATASETS

        check(self.name in DATASETS, "name", self.name,
              f"one of {', '.join(DATASETS)}{_did_you_mean(str(self.name), list(DATASETS))}")
        check(self.name != "hf" or bool(self.path), "path", self.path,
              "a hub id (org/name) or a local path when name is 'hf'")
        check(self.image_size is None or self.image_size >= 8, "image_size", self.image_size, "an int >= 8 or null")
        check(self.cache_mb >= 0, "cache_mb", self.cache_mb, "an int >= 0 (MiB; 0: no cache)")
        check(self.batch_size >= 1, "batch_size", self.batch_size, "an int >= 1")
        check(self.num_workers >= 0, "num_workers", self.num_workers, "an int >= 0")
        if self.split_seed is not None:
            _check_seed("split_seed", self.split_seed)
        check(not isinstance(self.feature_cache, str) or self.feature_cache.strip() != "", "feature_cache",
              self.feature_cache, "true, false or a folder")


@dataclass
class PartitionConfig:
    scheme: Literal["dirichlet", "iid", "shards", "file", "natural"] = "dirichlet"
    num_clients: int = 10
    alpha: float = 0.1  # Dirichlet concentration; inf means IID
    min_samples: int = 1  # every client gets at least this many training samples
    shards_per_client: int = 2  # `shards` scheme only (McMahan et al. 2017)
    balance: bool = False  # flwr-datasets' self-balancing rule (off: plain Hsu et al. 2019)
    seed: int = 0  # its own seed: the same partition whatever the training seed
    path: str | None = None  # `file` scheme: a partition.json written by an earlier run (or another framework)
    by: str | None = None  # `natural` scheme: the column whose values are the clients (a writer id); data.name: hf
    # "flower": dirichlet / iid / natural exactly as flwr-datasets' partitioners make them (data/flower_partition.py;
    # min_samples is its min_partition_size, balance its self_balancing, seed the partitioner's seed)
    convention: Literal["fl_lightning", "flower"] = "fl_lightning"
    # flower: the seed of FederatedDataset(shuffle=True, seed=...)'s shuffle before partitioning (Flower's default:
    # 42); null: no shuffle (FederatedDataset(shuffle=False))
    flower_shuffle_seed: int | None = None

    def __post_init__(self) -> None:
        check(self.scheme != "natural" or bool(self.by), "by", self.by,
              "the column whose values are the clients when scheme is 'natural'")
        check(self.convention != "flower" or self.scheme in ("dirichlet", "iid", "natural"), "convention",
              self.convention, f"'fl_lightning' for scheme {self.scheme!r} (flwr-datasets: dirichlet, iid, natural)")
        if self.flower_shuffle_seed is not None:
            _check_seed("flower_shuffle_seed", self.flower_shuffle_seed)
            check(self.convention == "flower", "flower_shuffle_seed", self.flower_shuffle_seed,
                  "null unless partition.convention is 'flower'")
        check(self.num_clients >= 1, "num_clients", self.num_clients, "an int >= 1")
        _check_seed("seed", self.seed)
        check(self.scheme != "file" or self.path is not None, "path", self.path,
               "the path of a partition.json when scheme is 'file'")
        check(self.alpha > 0, "alpha", self.alpha, "a float > 0, or inf for IID")
        check(self.min_samples >= 0, "min_samples", self.min_samples, "an int >= 0")
        check(self.shards_per_client >= 1, "shards_per_client", self.shards_per_client, "an int >= 1")


@dataclass
class ModelConfig:
    library: Literal["open_clip", "timm"] = "open_clip"
    name: str = "ViT-B-16"
    pretrained: str | None = "openai"  # open_clip tag, or for timm any non-null value means "pretrained"
    checkpoint: str | None = None  # a local weights file; wins over `pretrained`
    # ViTs: "proj" the CLIP image embedding (ln_post(CLS) @ proj; timm: = pre_proj), "pre_proj" the width-D
    # ln_post(CLS), "cls" the last block's CLS state (no final norm). timm CNNs: pooled features, key unused
    feature: Literal["proj", "pre_proj", "cls"] = "proj"
    download: bool = False
    cache_dir: str | None = None
    overrides: dict = field(default_factory=dict)  # passed to the library's factory (tiny test models)


PRIVACY_MECHANISMS = ("off", "dp_fedavg", "statistics_local", "statistics_central")


@dataclass
class PrivacyConfig:
    """Differential privacy of what clients upload (docs/privacy.md; fl_lightning/privacy/).

    ``mechanism``: ``off`` (today's behaviour, bit for bit); ``dp_fedavg`` — user-level DP of every averaging
    method (McMahan et al. 2018): each client's update clipped to ``clip_norm``, Gaussian noise on the mean;
    ``statistics_local`` / ``statistics_central`` — record-level DP of the sufficient statistics (AFL, FedOPAL,
    FedCGS): features clipped to ``clip_norm``, Gaussian noise on each client's R_k, C_k (local: against the
    server too) or on their sum (central: against everyone but the server).
    """

    mechanism: Literal[PRIVACY_MECHANISMS] = "off"  # type: ignore[valid-type]
    # the run's target ε; null: take noise_multiplier as given and report the ε it gives
    epsilon: float | None = None
    # δ of (ε, δ)-DP; must be < 1/N (N: clients for dp_fedavg, training records for the statistics)
    delta: float = 1e-5
    clip_norm: float = 1.0  # S: L2 bound of a client's update (dp_fedavg) or of one feature vector (statistics)
    noise_multiplier: float | None = None  # σ (noise std σ·sensitivity); null: calibrated to epsilon
    accountant: Literal["rdp", "pld"] = "rdp"  # dp-accounting's RDP (fast) or PLD (tighter, slower) accountant
    # with statistics_*: the local training (FedOPAL's prompts) runs DP-SGD too — per-sample gradients clipped to
    # grad_clip_norm, noise σ·grad_clip_norm per step, the same σ as the statistics', calibrated to ε jointly
    dp_sgd: bool = False
    grad_clip_norm: float = 1.0

    def __post_init__(self) -> None:
        if self.mechanism == "off":
            return
        check(self.epsilon is not None or self.noise_multiplier is not None, "epsilon", self.epsilon,
              "a float > 0 (the target ε), or set noise_multiplier instead")
        check(self.epsilon is None or self.noise_multiplier is None, "noise_multiplier", self.noise_multiplier,
              "null when epsilon is set (the noise is then calibrated to it)")
        check(self.epsilon is None or (self.epsilon > 0 and math.isfinite(self.epsilon)), "epsilon", self.epsilon,
              "a finite float > 0")
        check(0 < self.delta < 1, "delta", self.delta, "a float in (0, 1), below 1/N")
        check(self.clip_norm > 0, "clip_norm", self.clip_norm, "a float > 0 (inf: no clipping)")
        check(self.noise_multiplier is None or 0 <= self.noise_multiplier < math.inf, "noise_multiplier",
              self.noise_multiplier, "a finite float >= 0 (0: no noise, ε = inf)")
        check(not self.dp_sgd or self.mechanism.startswith("statistics"), "dp_sgd", self.dp_sgd,
              "false unless mechanism is statistics_local or statistics_central (record-level DP)")
        check(0 < self.grad_clip_norm < math.inf, "grad_clip_norm", self.grad_clip_norm, "a finite float > 0")


@dataclass
class FederationConfig:
    rounds: int = 1
    client_fraction: float = 1.0  # fraction of clients sampled per round (multi-round methods)
    sampling_seed: int = 0  # its own seed for client sampling
    accelerator: Literal[ACCELERATORS] = "auto"  # type: ignore[valid-type] # GPUs when there are any, else the CPU
    devices: int = 1  # Fabric ranks on this node; clients are dealt to them
    num_nodes: int = 1
    strategy: str = "auto"  # "auto" → ddp when devices * num_nodes > 1
    precision: Literal[PRECISIONS] = "32-true"  # type: ignore[valid-type] # e.g. "bf16-mixed" on GPUs
    on_client_error: Literal["raise", "skip"] = "raise"
    # a round with fewer successful clients than this stops the run (exit 1, checkpoint kept), as Flower's
    # min_fit_clients: failure is never reported as success
    min_clients: int = 1
    # crash safety that pays for itself (federation/round_store.py): the server's finished clients stay in
    # memory until their round has run this many seconds, then every record is written to disk; a crash
    # (SIGKILL) earlier costs at most this much work, re-run to the same result. 0: write each record at once
    record_after_s: float = 10.0
    # the longest a rank waits in one collective (the start-up's rendezvous included) before it stops with one
    # line (exit 1). The longest wait is the server's phase: ranks 1..N-1 wait while rank 0 plans, aggregates and
    # evaluates — hours in FeDiSyn's round 0 (the synthesis on the server), where torch's default (30 min for
    # NCCL) lets the watchdog abort them. 24 h covers that phase; a failure on rank 0 still ends every rank at
    # once (federation/collectives.py), so the long default never makes a failed run wait
    collective_timeout_s: float = 86400.0
    # CUDA only, set by the CLI (python -m fl_lightning.train) for the run; on the CPU nothing changes (the library
    # itself never sets it). torch.set_float32_matmul_precision, for float32 matmuls (linear layers, attention):
    # "highest" full float32 products; "high" (default) TF32 tensor cores on Ampere and newer (10 mantissa bits
    # in the products, float32 accumulation: several times faster; results differ from "highest" from about the
    # 4th significant digit, and between GPU models); "medium" bf16 products (faster still, ~3 digits).
    # The CLI sets cuDNN's TF32 for float32 convolutions with it (torch.backends.cudnn.allow_tf32: on, unless
    # "highest"), so TF32 is on for float32 matmuls and convolutions on CUDA by default. It changes the numbers a
    # run computes, so a resumed run cannot change it. Under bf16-mixed/16-mixed most matmuls run in half
    # precision anyway; this governs those left in float32 (and every one of a 32-true run)
    matmul_precision: Literal["highest", "high", "medium"] = "high"
    # true: the CLI calls torch.use_deterministic_algorithms(True) (and sets CUBLAS_WORKSPACE_CONFIG=:4096:8 when
    # it is unset) for the run, so that a rerun on the same machine and software gives the same bits on a GPU
    # too. It costs speed (deterministic cuDNN convolutions, scatter/index_add without atomics: slower kernels),
    # and an op with no deterministic CUDA kernel raises a RuntimeError instead of running (torch's list names
    # e.g. the backward of AdaptiveAvgPool2d, as in timm CNNs' pooling, and of bilinear interpolation). The CPU
    # runs here give the same numbers either way. It changes which kernels run, so a resumed run cannot change it
    deterministic: bool = False
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)  # differential privacy (docs/privacy.md)

    def __post_init__(self) -> None:
        check(self.rounds >= 1, "rounds", self.rounds, "an int >= 1")
        check(self.matmul_precision in _MATMUL_PRECISIONS, "matmul_precision", self.matmul_precision,
              f"one of {', '.join(_MATMUL_PRECISIONS)} (torch.set_float32_matmul_precision; CUDA only)")
        check(isinstance(self.deterministic, bool), "deterministic", self.deterministic, "true or false")
        check(0 < self.collective_timeout_s <= 1e9, "collective_timeout_s", self.collective_timeout_s,
              "a float in (0, 1e9] (seconds; 86400 is a day)")
        check(0 <= self.record_after_s <= _FLOAT32_MAX, "record_after_s", self.record_after_s,
              "a finite float >= 0 (seconds)")
        check(0 < self.client_fraction <= 1, "client_fraction", self.client_fraction, "a float in (0, 1]")
        check(self.devices >= 1, "devices", self.devices, "an int >= 1")
        check(self.num_nodes >= 1, "num_nodes", self.num_nodes, "an int >= 1")
        check(self.min_clients >= 1, "min_clients", self.min_clients, "an int >= 1")
        _check_seed("sampling_seed", self.sampling_seed)


@dataclass
class LocalTrainingConfig:
    epochs: int = 5  # E local epochs (FedOPAL: 5)
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = 0.01  # VPT's usual order for SGD on prompts
    momentum: float = 0.9
    weight_decay: float = 0.0
    batch_size: int | None = None  # None: data.batch_size

    def __post_init__(self) -> None:
        check(self.epochs >= 0, "epochs", self.epochs, "an int >= 0")
        check(0 < self.lr <= _FLOAT32_MAX, "lr", self.lr, "a finite float > 0 (the optimisers run in float32)")
        check(0 <= self.momentum < 1, "momentum", self.momentum, "a float in [0, 1)")
        check(0 <= self.weight_decay <= _FLOAT32_MAX, "weight_decay", self.weight_decay, "a finite float >= 0")
        check(self.batch_size is None or self.batch_size >= 1, "batch_size", self.batch_size, "an int >= 1 or null")


@dataclass
class LoggingConfig:
    wandb: bool = False
    project: str = "fl_lightning"
    entity: str | None = None
    mode: Literal["online", "offline"] = "offline"  # offline needs no network: `wandb sync` later
    tensorboard: bool = False
    progress: bool = True  # rich progress bars (shown only on a terminal)


CORE_SECTIONS = ("data", "partition", "model", "federation", "train", "logging")


@dataclass
class RunConfig:
    algorithm: str = "fedopal"  # a registered method (fl_lightning/algorithms/); its section is its own name
    seed: int = 0  # training seed (the partition and client sampling have their own)
    output_dir: str = "runs"
    run_name: str | None = None  # one folder name; null: "<algorithm>_<dataset>_a<alpha>_s<seed>"
    # A comparison: each entry is a mapping merged over this config (e.g. {algorithm: afl}); the CLI
    # runs them one after another and prints a table. Empty: one run of this config.
    variants: list = field(default_factory=list)
    # Sweeps over dotted keys, crossed with every variant: {partition.alpha: [0.01, 0.1, 1, .inf], seed: [0, 1, 2]}.
    # Keys joined by commas vary together: {"seed,partition.seed": [[0, 0], [1, 1], [2, 2]]} (each seed its own
    # partition). A comparison writes comparison.csv/.md (mean ± sample std over the seeds) and comparison.png.
    sweep: dict = field(default_factory=dict)
    label: str | None = None  # this run's row in a comparison table; null: run_name of its variant, or algorithm
    data: DataConfig = field(default_factory=DataConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)
    train: LocalTrainingConfig = field(default_factory=LocalTrainingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    # The method's own section (an instance of the method's ``config_class``), written in YAML under
    # the method's name. Filled by the loader; ``RunConfig()`` alone leaves it None.
    method: Any = field(default=None, metadata={"loader": "method"})

    def __post_init__(self) -> None:
        _check_seed("seed", self.seed)
        p = self.federation.privacy
        if p.mechanism == "dp_fedavg":  # user-level: δ < 1/K (a δ of 1/K could release one user's update whole)
            check(p.delta < 1 / self.partition.num_clients, "federation.privacy.delta", p.delta,
                  f"a float < 1/num_clients = {1 / self.partition.num_clients:g} (user-level DP over "
                  f"{self.partition.num_clients} clients)")
        if self.run_name is not None:
            name = self.run_name
            check(name not in ("", ".", "..") and "/" not in name and "\\" not in name and "\0" not in name,
                  "run_name", name, "a single folder name (no '/', no '..', not absolute)")

    @property
    def resolved_run_name(self) -> str:
        if self.run_name:
            return self.run_name
        alpha = "inf" if math.isinf(self.partition.alpha) else f"{self.partition.alpha:g}"
        return f"{self.algorithm}_{self.data.name}_a{alpha}_s{self.seed}"

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.resolved_run_name

    @property
    def data_seed(self) -> int:
        """The seed of the data set's own split and subset: ``data.split_seed``, else the run's seed."""
        return self.seed if self.data.split_seed is None else self.data.split_seed


# ----------------------------------------------------------------------------- loading


def _registry() -> dict[str, type]:
    """The registered methods (discovery imports them here, on first use: ``import fl_lightning.config`` stays
    cheap, and the registry never imports the config). A method named like a core key is refused here, where
    the core keys are known."""
    from fl_lightning.algorithms import available_algorithms, renamed_algorithms

    registry = available_algorithms()
    reserved = {*CORE_SECTIONS, *(f.name for f in dataclasses.fields(RunConfig))}
    clash = sorted(reserved & {*registry, *renamed_algorithms()})
    if clash:
        raise ValueError(f"cannot register a method named {clash[0]!r}: a method name is not one of the core keys "
                         f"{sorted(reserved)}")
    return registry


def _renamed() -> dict[str, str]:
    from fl_lightning.algorithms import renamed_algorithms

    return renamed_algorithms()


def current_names(values: dict) -> dict:
    """``values`` (a config's mapping) with a method's former name replaced by its name now, both as
    ``algorithm:`` and as the section's key; one line on stderr says which name to use (see ``register``)."""
    renamed = _renamed()
    if not isinstance(values, dict) or not renamed:
        return values
    out = dict(values)
    old = out.get("algorithm")
    if isinstance(old, str) and old in renamed:
        _hint_renamed(old, renamed[old])
        out["algorithm"] = renamed[old]
    for key in [k for k in out if k in renamed]:
        new = renamed[key]
        _hint_renamed(key, new)
        if new in out:
            raise UsageError(f"config error: sections {key!r} and {new!r} both given; {key!r} is the former name of "
                             f"{new!r}: keep only {new!r}")
        out[new] = out.pop(key)
    return out


# Keys added after runs were first recorded, with the value a run recorded without them ran under: such a
# recorded config (run.json) is read with that value — its numbers were made so — not with today's default.
_ADDED_KEYS: dict[str, dict[str, Any]] = {
    "federation": {"matmul_precision": "highest", "deterministic": False,  # torch's defaults, which ran then
                   "privacy": {"mechanism": "off"}},  # no differential privacy before it existed
    # Hugging Face data sets, natural and Flower partitions: every earlier run ran with none of them
    "data": {"path": None, "train_split": "train", "test_split": "test", "image_column": None, "label_column": None},
    "partition": {"by": None, "convention": "fl_lightning", "flower_shuffle_seed": None},
}


def recorded_config(values: dict) -> dict:
    """A config a run recorded (``run.json``), in today's terms: :func:`current_names`, and every key added since
    (:data:`_ADDED_KEYS`) with the value the run ran under, so that ``--resume`` continues it as it ran and a
    comparison compares like with like."""
    out = current_names(values)
    if not isinstance(out, dict):
        return out
    out = dict(out)
    for section, added in _ADDED_KEYS.items():
        if isinstance(out.get(section), dict):
            out[section] = {**added, **out[section]}  # what the run recorded wins
    return out


def added_key_overrides(recorded: dict) -> list[str]:
    """``--section.key value`` for every key added since (:data:`_ADDED_KEYS`), with the value the run ``recorded``
    (its ``run.json`` config, or its ``config.yaml`` for a folder from before records) ran with: the recorded
    value, or the key's value from before it existed. ``--resume`` loads the run's ``config.yaml`` with them, so
    a folder written before a key existed resumes as it ran, not under today's default."""
    out: list[str] = []
    for section, added in _ADDED_KEYS.items():
        present = recorded.get(section) if isinstance(recorded, dict) else None
        for key, before in added.items():
            value = present[key] if isinstance(present, dict) and key in present else before
            out += [f"--{section}.{key}", json.dumps(value)]
    return out


@functools.cache  # once per name and process (a comparison builds every variant)
def _hint_renamed(old: str, new: str) -> None:
    print(f"fl_lightning: method {old!r} is now called {new!r}; the old name still works, but use {new!r} "
          f"(algorithm: {new}, section {new}:)", file=sys.stderr)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    return {bool: "a bool", int: "an int", float: "a float", str: "a string", dict: "a mapping",
            list: "a list"}.get(tp, getattr(tp, "__name__", str(tp)))


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _convert(tp: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return it (ints widened to float)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices:
            return value
        hint = _did_you_mean(str(value), [str(c) for c in choices])
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


def _loaded_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.metadata.get("loader") != "method"]


def _build(cls: type, values: Any, prefix: str, known: list[str] | None = None) -> Any:
    """Build dataclass ``cls`` from ``values`` strictly; ``known``: every dotted key, for did-you-mean."""
    if not isinstance(values, dict):
        raise ConfigError(prefix or "<root>", values, "a mapping of keys to values")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in _loaded_fields(cls)]
    kwargs = {}
    for key, value in values.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            local = [f"{prefix}.{n}" if prefix else n for n in names]
            hint = _did_you_mean(dotted, local + (known or []))
            allowed = (f"one of {', '.join(names)}" if len(names) <= 12 or not prefix else
                       f"a key of the '{prefix}' section")
            if not prefix:
                allowed += " and the section of the selected algorithm"
            raise UsageError(f"config error: unknown key {dotted!r}{hint}; allowed here: {allowed}")
        kwargs[key] = _convert(hints[key], value, dotted)
    try:
        return cls(**kwargs)
    except ConfigError as err:  # __post_init__ checks know only their own key: add the section
        raise ConfigError(f"{prefix}.{err.key}" if prefix else err.key, err.value, err.allowed) from None


def _keys_of(cls: type, prefix: str = "") -> list[str]:
    keys = []
    hints = typing.get_type_hints(cls)
    for f in _loaded_fields(cls):
        dotted = f"{prefix}{f.name}"
        tp = hints[f.name]
        keys += _keys_of(tp, dotted + ".") if dataclasses.is_dataclass(tp) else [dotted]
    return keys


def schema_keys(algorithm: str | None = None) -> list[str]:
    """Every dotted key a config can hold: the core keys, plus the sections of ``algorithm`` (or of every
    registered method when None)."""
    registry = _registry()
    keys = _keys_of(RunConfig)
    for name in [algorithm] if algorithm else sorted(registry):
        keys += _keys_of(registry[name].config_class, name + ".")
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
            value = _load_yaml(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        except _TooBig as err:
            raise UsageError(f"usage error: --{key} holds {err.what}; write the values out") from None
        except RecursionError:
            raise UsageError(f"usage error: --{key} is nested too deeply to be a config value") from None
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


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is an error, not last-wins."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)

# A config has hundreds of values; YAML aliases (&a / *a) can make a few lines mean billions (the "billion
# laughs"), which every later step (merging, printing, comparing records) would walk. Counted on the
# composed node graph, where an alias is a reference: linear in the distinct nodes, before anything is built.
MAX_YAML_VALUES = 100_000


class _TooBig(Exception):
    def __init__(self, what: str) -> None:
        self.what = what


def _expanded_values(root: yaml.Node, limit: int = MAX_YAML_VALUES) -> int:
    """How many values ``root`` stands for with every alias expanded; raises :class:`_TooBig` beyond ``limit``
    or for an alias inside its own anchor (a recursive structure). Iterative: a deep document cannot
    exhaust the stack here."""
    def children(node: yaml.Node) -> list[yaml.Node]:
        if isinstance(node, yaml.MappingNode):
            return [n for pair in node.value for n in pair]
        return list(node.value) if isinstance(node, yaml.SequenceNode) else []

    total: dict[int, int] = {}
    started: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            started.discard(key)
            total[key] = 1 + sum(total[id(c)] for c in children(node))
            if total[key] > limit:
                raise _TooBig(f"more than {limit:,} values once its aliases (*name) are expanded")
            continue
        if key in total:
            continue
        if key in started:
            raise _TooBig("an alias (*name) inside the structure its anchor (&name) marks: a recursive structure")
        started.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children(node) if id(c) not in total)
    return total[id(root)]


def _load_yaml(text: str) -> Any:
    """``text`` as YAML (unique keys), refusing alias bombs and recursive aliases (:class:`_TooBig`)."""
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_values(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> dict:
    """A config file as a mapping; one line (UsageError) when it is missing, not YAML, or not a mapping."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"usage error: --config '{path}' is a directory; pass a YAML file (see conf/)")
    if not path.is_file():
        raise UsageError(f"usage error: config file '{path}' not found; pass --config with an existing YAML "
                         f"file (see conf/)")
    try:
        values = _load_yaml(path.read_text())
    except UnicodeDecodeError:
        raise UsageError(f"usage error: config file '{path}' is not a text (YAML) file") from None
    except _TooBig as err:
        raise UsageError(f"usage error: config file '{path}' holds {err.what}; write the values out") from None
    except RecursionError:
        raise UsageError(f"usage error: config file '{path}' is nested too deeply to be a config") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None)
        what = f": {problem}" if problem and "duplicate key" in str(problem) else ""
        raise UsageError(f"usage error: config file '{path}' is not valid YAML{where}{what}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise UsageError(f"usage error: config file '{path}' holds a {type(values).__name__} at the top level; "
                         f"expected a mapping of sections (data:, partition:, …)")
    return values


def build_config(values: dict) -> RunConfig:
    """Build a validated :class:`RunConfig` from a plain mapping (the YAML's shape).

    The method named by ``algorithm`` is looked up in the registry; its section (same name) is built
    with the method's own ``config_class``. A section of another registered method is an error.
    """
    if not isinstance(values, dict):
        raise UsageError(f"config error: a config is a mapping of sections (data:, partition:, …), got "
                         f"{type(values).__name__}")
    registry = _registry()
    values = current_names(values)
    algorithm = values.get("algorithm", RunConfig.algorithm)
    if algorithm not in registry:
        from fl_lightning.algorithms import import_errors

        names = sorted(registry)
        broken = "; ".join(f"{m} failed to import ({e})" for m, e in import_errors().items() if algorithm in m)
        raise ConfigError("algorithm", algorithm, f"one of {', '.join(repr(n) for n in names)}"
                          f"{_did_you_mean(str(algorithm), names)}{f' — {broken}' if broken else ''}")
    core = {k: v for k, v in values.items() if k != algorithm}
    for key in core:
        if key in registry:
            raise UsageError(f"config error: {key}: section given but algorithm is {algorithm} (a section belongs "
                             f"to its method: remove it, or set algorithm: {key}; in a comparison, put it inside "
                             f"the variant that selects {key})")
    config_class = registry[algorithm].config_class
    known = schema_keys(algorithm)
    cfg = _build(RunConfig, core, "", known)
    cfg.method = _build(config_class, values.get(algorithm) or {}, algorithm, known)
    return cfg


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Build a validated :class:`RunConfig` from a YAML file plus ``--dotted.key value`` overrides.

    Raises:
        UsageError / ConfigError: one line naming the key, the value and what is allowed.
    """
    values = current_names(read_yaml(path) if path is not None else {})
    extra = current_names(_parse_overrides(overrides or []))
    if "algorithm" in extra:  # --algorithm X on a file written for another method: as a variant would switch
        values = _switch_algorithm(values, extra["algorithm"])
    return build_config(_merge(values, extra))


def _switch_algorithm(values: dict, algorithm: Any) -> dict:
    """``values`` with its method section made fit for ``algorithm``: the section of the method it names is
    dropped, except the keys both configs share when one method extends the other (see ``_carried_section``)."""
    old = values.get("algorithm", RunConfig.algorithm)
    registry = _registry()
    if algorithm == old or algorithm not in registry or old not in registry:
        return values
    values = dict(values)
    section = values.pop(old, None) or {}
    carried = _carried_section(section, registry[old].config_class, registry[algorithm].config_class)
    values[algorithm] = _merge(carried, values.get(algorithm) or {})
    return {**values, "algorithm": algorithm}


def _carried_section(section: dict, old: type, new: type) -> dict:
    """What of method ``old``'s section a variant that switches to ``new`` keeps: the keys both configs
    declare, when one method's config extends the other's (FedOPAL's extends AFL's) or both are composed of
    a common stage's (FeDiSyn's and SFLF's of LoRA fine-tuning); otherwise nothing.

    A key whose value is ``old``'s default, where ``new`` declares another default, is not carried: the
    section may be a resolved config (every default written out), and FedOPAL's ``restat: local`` must not
    become FedOPAL+'s (whose default is ``global``). Set such a key inside the variant.
    """
    if not _share_a_section(old, new):
        return {}
    old_defaults, new_defaults = _field_defaults(old), _field_defaults(new)
    keep = old_defaults.keys() & new_defaults.keys()
    return {k: v for k, v in section.items()
            if k in keep and not (v == old_defaults[k] and old_defaults[k] != new_defaults[k])}


def _share_a_section(a: type, b: type) -> bool:
    """Whether one config extends the other, or both extend a config with keys of its own (two methods
    composed of a common stage, e.g. FeDiSyn and SFLF of LoRA fine-tuning)."""
    return any(dataclasses.is_dataclass(base) and base.__dict__.get("__annotations__") and issubclass(b, base)
               for base in a.__mro__)


def _field_defaults(config_class: type) -> dict[str, Any]:
    """Each field's default value (built from its factory where it has one)."""
    out = {}
    for f in dataclasses.fields(config_class):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = dataclasses.MISSING
    return out


_NAMED_BY_DEFAULT = ("partition.alpha", "seed")  # keys the default run name already encodes


def _sweep_groups(sweep: dict) -> list[tuple[list[str], list[tuple]]]:
    """``sweep`` as groups of keys that vary together, each with its points (one value per key).

    A plain key (``seed: [0, 1, 2]``) is a group of one. A key that names several dotted keys joined by
    commas varies them together, one list of values per point, in the key's order:
    ``"seed,partition.seed": [[0, 0], [1, 1], [2, 2]]`` is three points, not nine. Groups are crossed.
    """
    groups: list[tuple[list[str], list[tuple]]] = []
    seen: dict[str, str] = {}
    for key, values in sweep.items():
        where = f"sweep.{key}"
        names = [part.strip() for part in str(key).split(",")]
        if any(not n for n in names):
            raise ConfigError(where, values, "a dotted key, or dotted keys joined by commas "
                              "(e.g. \"seed,partition.seed\"), none of them empty")
        for name in names:
            if name in seen or names.count(name) > 1:
                raise UsageError(f"config error: sweep: key {name!r} is swept twice ({where} and "
                                 f"sweep.{seen.get(name, key)}); sweep each key in one entry")
            seen[name] = str(key)
        if not isinstance(values, list) or not values:
            raise ConfigError(where, values, "a non-empty list of values")
        if len(names) == 1:
            groups.append((names, [(v,) for v in values]))
            continue
        for point in values:
            if not isinstance(point, list) or len(point) != len(names):
                raise ConfigError(where, point, f"a list of {len(names)} values, one for each of {', '.join(names)} "
                                  f"(e.g. {[[0] * len(names), [1] * len(names)]}): the keys vary together")
        groups.append((names, [tuple(point) for point in values]))
    return groups


def _sweep_points(sweep: dict) -> list[tuple[dict, dict, dict]]:
    """The cross product of ``sweep``'s groups (see :func:`_sweep_groups`) as override trees, in a stable order:
    ``(tree, every swept key → value, the naming keys → value)``. A group's first key names its point in the
    run name (the others move with it)."""
    import itertools

    groups = _sweep_groups(sweep)
    points = []
    for combo in itertools.product(*(group_points for _, group_points in groups)):
        tree: dict = {}
        values: dict = {}
        naming: dict = {}
        for (names, _), point in zip(groups, combo):
            naming[names[0]] = point[0]
            for key, value in zip(names, point):
                values[key] = value
                node = tree
                *parents, last = key.split(".")
                for part in parents:
                    node = node.setdefault(part, {})
                node[last] = value
        points.append((tree, values, naming))
    return points


def _swept_name(run: RunConfig, named: str | None, values: dict) -> str | None:
    """A run name that tells swept runs apart: the default name encodes α and seed; other swept keys
    (and every swept key of an explicitly named variant) become suffixes."""
    suffix = "".join(f"_{key.rsplit('.', 1)[-1]}{value:g}" if isinstance(value, float) else
                     f"_{key.rsplit('.', 1)[-1]}{value}" for key, value in values.items()
                     if named is not None or key not in _NAMED_BY_DEFAULT)
    if named is None and not suffix:
        return None
    return (named or run.resolved_run_name) + suffix.replace("/", "-")


def expand_variants(cfg: RunConfig) -> list[RunConfig]:
    """The runs a config asks for: itself, or one per entry of ``variants`` (merged over it), each
    crossed with the ``sweep`` grid.

    A variant that switches ``algorithm`` keeps the base's method keys only where the two methods'
    configs share them by inheritance (AFL ⊂ FedOPAL); its own method keys go inside the variant.
    Every run is built and validated here, before anything runs.
    """
    if not cfg.variants and not cfg.sweep:
        return [cfg]
    base = config_to_dict(cfg)
    base["variants"], base["sweep"] = [], {}
    runs = []
    for i, variant in enumerate(cfg.variants or [{}]):
        if not isinstance(variant, dict):
            raise ConfigError(f"variants[{i}]", variant, "a mapping of config keys, e.g. {algorithm: afl}")
        variant = current_names(variant)
        values = _switch_algorithm(base, variant.get("algorithm", cfg.algorithm))
        for tree, point, naming in _sweep_points(cfg.sweep) if cfg.sweep else [({}, {}, {})]:
            try:
                run = build_config(_merge(_merge(values, variant), tree))
            except UsageError as err:
                where = f"variants[{i}]" if cfg.variants else "sweep"
                raise UsageError(f"{err} (in {where}{f', sweep point {point}' if point else ''})") from None
            if run.label is None:
                run.label = variant.get("run_name") or run.algorithm
            name = _swept_name(run, variant.get("run_name") or cfg.run_name, naming)
            if name is not None:
                run.run_name = name
            runs.append(run)
    names = [r.resolved_run_name for r in runs]
    if len(set(names)) != len(names):
        raise ConfigError("variants", names, "distinct run names (set run_name in each variant)")
    return runs


def config_to_dict(cfg: Any) -> dict:
    """A plain dict (inf kept as float) of a config: the core sections, then the method's own section."""
    if not isinstance(cfg, RunConfig):
        return dataclasses.asdict(cfg)
    out = {f.name: _plain(getattr(cfg, f.name)) for f in _loaded_fields(RunConfig)}
    if cfg.method is not None:
        out[cfg.algorithm] = dataclasses.asdict(cfg.method)
    return out


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as YAML that :func:`load_config` reads back unchanged."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
