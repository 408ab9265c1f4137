"""Typed run configuration, the schema: the core sections and :class:`RunConfig`.

A config has the **core sections** that every method shares (``data``, ``partition``, ``model``,
``federation``, ``train``, ``logging``) plus **one section owned by the method** named by
``algorithm:`` (e.g. ``fedopal: {mu: 0.1}``). A method declares that section's dataclass on its own
class (``config_class``); the loader finds it through the algorithm registry, so a new method adds
its file and nothing here. A config is built once at the entry point (``load_config``) and passed
down as objects — never a dict or an ``args`` namespace. The method's section is read in one way:
``cfg.method`` (inside the method, ``self.config``).

This module holds only the dataclasses, each checking its own values in ``__post_init__``; the package
:mod:`fl_lightning.config` exports them, and imports nothing else (no YAML, no registry, no method). Reading a
config lives beside it, each imported from its own module:

* :mod:`fl_lightning.config.loading` — the strict loader (``load_config``, ``build_config``, ``schema_keys``)
  and its inverse (``config_to_dict``, ``dump_config``);
* :mod:`fl_lightning.config.yaml_io` — a config's text as plain mappings: YAML files (unique keys, the alias
  guard), ``--dotted.key value`` overrides, the merge of one mapping over another;
* :mod:`fl_lightning.config.history` — configs written earlier: a method's former name, the keys added since
  a run recorded its config;
* :mod:`fl_lightning.config.variants` — a comparison's runs (``variants`` × ``sweep``).

Example:
    >>> from fl_lightning.config.loading import load_config
    >>> cfg = load_config("conf/quickstart.yaml", ["--partition.alpha", "0.01"])
    >>> cfg.partition.alpha, cfg.method.mu
    (0.01, 0.1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fl_lightning.errors import check, did_you_mean

# What Fabric accepts (lightning.fabric.connector._PRECISION_INPUT and accelerator names), checked here
# so that a typo stops in the config layer, not in a traceback from inside Fabric.
PRECISIONS = (
    "32-true",
    "32",
    "64-true",
    "64",
    "16-mixed",
    "16",
    "bf16-mixed",
    "bf16",
    "16-true",
    "bf16-true",
    "transformer-engine",
    "transformer-engine-float16",
)
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")
_MATMUL_PRECISIONS = ("highest", "high", "medium")  # torch.set_float32_matmul_precision's
_SEED_MAX = 2**32 - 1  # numpy's and seed_everything's range
_FLOAT32_MAX = 3.4028234663852886e38  # a larger step size overflows inside a float32 optimiser


def _check_seed(key: str, value: int) -> None:
    check(0 <= value <= _SEED_MAX, key, value, f"an int in [0, {_SEED_MAX}]")


@dataclass
class DataConfig:
    name: str = "digits"  # a name in fl_lightning.data.registry.DATASETS, the one list of data sets; hf:<id> = hf + path
    root: str = "data"  # datasets are looked for here (torchvision layout; imagefolder: the folder)
    download: bool = False  # opt-in: only on machines that can reach the dataset hosts
    image_size: int | None = None  # None: the backbone's input size
    batch_size: int = 64  # images per batch of every pass over the data (local training, statistics, evaluation)
    # DataLoader processes per rank (data/loader.py, docs/gpu.md): an int, or auto — 0 on the CPU (no worker
    # start-up; every CPU run loads in the rank), on CUDA min(4, cores this process may use // ranks - 1)
    num_workers: int | Literal["auto"] = "auto"
    pin_memory: bool | Literal["auto"] = "auto"  # page-locked batches; auto: on CUDA
    persistent_workers: bool | Literal["auto"] = "auto"  # one loader (and its workers) for the run; auto: with workers
    # the uint8 store's float part (ToDtype, clamp, Normalize) on the rank's device, after the uint8 batch's copy
    # (a quarter of the bytes), instead of in the loader; auto: on CUDA. Speed only: on the CPU the same values
    normalize_on_device: bool | Literal["auto"] = "auto"
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
    # a deterministic transform that ends "uint8 image → ToDtype(float32, scale) → Normalize" keeps the uint8 image
    # (a quarter of the bytes) within this many MiB and converts each batch as it is read, bit-identically;
    # 12 GiB holds CIFAR-10, SVHN or DTD's training split at 224 px; 0 turns it off (the float32 cache_mb then)
    cache_uint8_mb: int = 12288
    # name: hf — a Hugging Face dataset (data/hf.py, docs/data_and_weights.md): a hub id read from the HF cache
    # (fetched only with download: true), or a local path: a save_to_disk folder, a .parquet/.arrow file, a folder
    path: str | None = None
    # a split's name, or a slice of splits as datasets reads it: "train[:10%]", "train[1000:]+validation" (hf)
    train_split: str = "train"
    test_split: str | None = "test"  # null: a seeded 4:1 split of train_split (split_seed), as imagefolder
    image_column: str | None = None  # null: the first Image feature, else a column named image / img
    label_column: str | None = None  # null: the one ClassLabel or label / labels column (several: one named label /
    # labels, else an error listing them), else fine_label / target / class
    # a hub id's branch, tag or commit (the snapshot read from the cache, or fetched); null: main. Not for local paths
    revision: str | None = None
    # data.name hf: the hub cache its snapshots are read from (and downloaded to), with datasets' Arrow tables in
    # <cache_dir>/datasets; null: HF_HUB_CACHE / HF_DATASETS_CACHE / HF_HOME, else the libraries' defaults
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        from fl_lightning.data.hf import hf_shorthand
        from fl_lightning.data.registry import DATASETS

        self.name, self.path = hf_shorthand(self.name, self.path)  # hf:<id> is name: hf, path: <id> from here on
        check(
            self.name in DATASETS,
            "name",
            self.name,
            f"one of {', '.join(DATASETS)}{did_you_mean(str(self.name), list(DATASETS))}",
        )
        check(self.name != "hf" or bool(self.path), "path", self.path, "a hub id (org/name) or a local path when name is 'hf'")
        check(
            self.revision is None or (self.name == "hf" and bool(self.revision.strip())),
            "revision",
            self.revision,
            "null, or a branch, tag or commit of the hub id in data.path (data.name: hf)",
        )
        check(
            self.cache_dir is None or (self.name == "hf" and bool(str(self.cache_dir).strip())),
            "cache_dir",
            self.cache_dir,
            "null, or a folder for data.name hf's hub snapshots and Arrow tables (torchvision data sets live in data.root)",
        )
        check(self.image_size is None or self.image_size >= 8, "image_size", self.image_size, "an int >= 8 or null")
        check(self.cache_mb >= 0, "cache_mb", self.cache_mb, "an int >= 0 (MiB; 0: no cache)")
        check(self.batch_size >= 1, "batch_size", self.batch_size, "an int >= 1")
        check(self.cache_uint8_mb >= 0, "cache_uint8_mb", self.cache_uint8_mb, "an int >= 0 (MiB; 0: no uint8 cache)")
        check(
            self.num_workers == "auto"
            or not isinstance(self.num_workers, bool)
            and isinstance(self.num_workers, int)
            and self.num_workers >= 0,
            "num_workers",
            self.num_workers,
            "an int >= 0 or auto",
        )
        for key in ("pin_memory", "persistent_workers", "normalize_on_device"):
            check(
                getattr(self, key) == "auto" or isinstance(getattr(self, key), bool),
                key,
                getattr(self, key),
                "true, false or auto",
            )
        if self.split_seed is not None:
            _check_seed("split_seed", self.split_seed)
        check(
            not isinstance(self.feature_cache, str) or self.feature_cache.strip() != "",
            "feature_cache",
            self.feature_cache,
            "true, false or a folder",
        )


@dataclass
class PartitionConfig:
    # pathological: each client holds classes_per_client classes (flwr-datasets' PathologicalPartitioner, either
    # convention: data/flower_partition.py)
    scheme: Literal["dirichlet", "iid", "shards", "file", "natural", "pathological"] = "dirichlet"
    # null: for scheme natural one client per distinct value of partition.by (read from the data before the run
    # starts: the resolved number is what config.yaml records), for scheme file the file's clients, for any other
    # scheme 10
    num_clients: int | None = None
    alpha: float = 0.1  # Dirichlet concentration; inf means IID
    min_samples: int = 1  # every client gets at least this many training samples
    # `shards` scheme only (McMahan et al. 2017); flower convention: num_shards_per_partition (null: as many as
    # shard_size makes, dealt evenly)
    shards_per_client: int | None = 2
    shard_size: int | None = None  # flower shards: rows per shard (null: int(N / (num_clients * shards_per_client)))
    keep_incomplete_shard: bool = False  # flower shards: the last, shorter shard is a shard too
    classes_per_client: int = 2  # `pathological` scheme: num_classes_per_partition
    # `pathological` scheme: which classes each client holds — random (Flower's default), deterministic (k, k+1,
    # ...), first-deterministic (k, then random)
    class_assignment: Literal["random", "deterministic", "first-deterministic"] = "random"
    balance: bool = False  # flwr-datasets' self-balancing rule (off: plain Hsu et al. 2019)
    seed: int = 0  # its own seed: the same partition whatever the training seed
    path: str | None = None  # `file` scheme: a partition.json written by an earlier run (or another framework)
    by: str | None = None  # `natural` scheme: the column whose values are the clients (a writer id); data.name: hf
    # "flower": dirichlet / iid / natural / shards / pathological exactly as flwr-datasets' partitioners make them
    # (data/flower_partition.py; min_samples is its min_partition_size, balance its self_balancing, seed the
    # partitioner's seed, shards its ShardPartitioner)
    convention: Literal["fl_lightning", "flower"] = "fl_lightning"
    # flower: the seed of FederatedDataset(shuffle=True, seed=...)'s shuffle before partitioning (Flower's default:
    # 42); null: no shuffle (FederatedDataset(shuffle=False))
    flower_shuffle_seed: int | None = None
    # > 0: every client keeps this fraction of its rows as its own test set, cut as Hugging Face's
    # train_test_split(test_size=..., seed=client_test_seed) cuts a Flower partition (data/client_test.py), and the
    # global model is also evaluated on them: fed_test_acc & co. in metrics.csv (Flower's federated evaluation)
    client_test_fraction: float = 0.0
    client_test_seed: int | None = None  # null: 42 (Flower's tutorials) under convention flower, else partition.seed

    def __post_init__(self) -> None:
        check(
            self.scheme != "natural" or bool(self.by),
            "by",
            self.by,
            "the column whose values are the clients when scheme is 'natural'",
        )
        check(
            self.convention != "flower" or self.scheme != "file",
            "convention",
            self.convention,
            "'fl_lightning' for scheme 'file' (the file is the partition)",
        )
        if self.flower_shuffle_seed is not None:
            _check_seed("flower_shuffle_seed", self.flower_shuffle_seed)
            check(
                self.convention == "flower",
                "flower_shuffle_seed",
                self.flower_shuffle_seed,
                "null unless partition.convention is 'flower'",
            )
        if self.num_clients is None and self.scheme not in ("natural", "file"):
            self.num_clients = 10  # every other scheme's default
        check(
            self.num_clients is None or self.num_clients >= 1,
            "num_clients",
            self.num_clients,
            "an int >= 1 (null: one client per value of partition.by under scheme natural, the file's under file, else 10)",
        )
        _check_seed("seed", self.seed)
        check(
            self.scheme != "file" or self.path is not None,
            "path",
            self.path,
            "the path of a partition.json when scheme is 'file'",
        )
        check(self.alpha > 0, "alpha", self.alpha, "a float > 0, or inf for IID")
        check(self.min_samples >= 0, "min_samples", self.min_samples, "an int >= 0")
        flower_shards = self.convention == "flower" and self.shard_size is not None
        check(
            self.shards_per_client is None
            and flower_shards
            or isinstance(self.shards_per_client, int)
            and self.shards_per_client >= 1,
            "shards_per_client",
            self.shards_per_client,
            "an int >= 1 (null only with partition.convention: flower and a shard_size)",
        )
        check(self.shard_size is None or self.shard_size >= 1, "shard_size", self.shard_size, "an int >= 1, or null")
        check(
            self.convention == "flower" or (self.shard_size is None and not self.keep_incomplete_shard),
            "shard_size" if self.shard_size is not None else "keep_incomplete_shard",
            self.shard_size if self.shard_size is not None else self.keep_incomplete_shard,
            "unset unless partition.convention is 'flower' (Flower's ShardPartitioner; ours deals near-equal "
            "shards of the whole split)",
        )
        check(self.classes_per_client >= 1, "classes_per_client", self.classes_per_client, "an int >= 1")
        check(
            0.0 <= self.client_test_fraction < 1.0,
            "client_test_fraction",
            self.client_test_fraction,
            "a float in [0, 1) (0: no client test sets)",
        )
        if self.client_test_seed is not None:
            _check_seed("client_test_seed", self.client_test_seed)
            check(
                self.client_test_fraction > 0,
                "client_test_seed",
                self.client_test_seed,
                "null unless partition.client_test_fraction > 0",
            )


@dataclass
class ModelConfig:
    # who builds the backbone: open_clip (CLIP towers) or timm (ViTs, CNNs)
    library: Literal["open_clip", "timm"] = "open_clip"
    # the architecture in that library (open_clip's ViT-B-16, timm's vit_small_patch14_dinov2 …)
    name: str = "ViT-B-16"
    pretrained: str | None = "openai"  # open_clip tag, or for timm any non-null value means "pretrained"
    checkpoint: str | None = None  # a local weights file; wins over `pretrained`
    # ViTs: "proj" the CLIP image embedding (ln_post(CLS) @ proj; timm: = pre_proj), "pre_proj" the width-D
    # ln_post(CLS), "cls" the last block's CLS state (no final norm). timm CNNs: pooled features, key unused
    feature: Literal["proj", "pre_proj", "cls"] = "proj"
    # true: fetch missing weights from the hub into cache_dir; false: a missing file stops the run in one line
    download: bool = False
    # where weights are read from and downloaded to; null: the libraries' caches (HF_HOME …)
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

    # which DP mechanism (docs/privacy.md: which method each covers); off: none
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
    # C: each update's (dp_fedavg) or sample's (dp_sgd) L2 norm is clipped to C before noise
    grad_clip_norm: float = 1.0
    # DP-SGD's Poisson sampling rate q (public: each record in each step's lot with probability q, ⌈1/q⌉ steps an
    # epoch, the noisy sum divided by q·N/K); null: q = min(1, B·K/N), B the training batch size
    sampling_rate: float | None = None
    # the noise's source: false (default) — OS entropy, never recorded (no one with config.yaml can replay and
    # subtract it); true — generators seeded from (seed, round, client), for tests and exact resume only: the run's
    # summary then warns that its noise can be regenerated and its ε does not hold against whoever has the seed
    reproducible_noise: bool = False

    def __post_init__(self) -> None:
        if self.mechanism == "off":
            return
        check(
            self.epsilon is not None or self.noise_multiplier is not None,
            "epsilon",
            self.epsilon,
            "a float > 0 (the target ε), or set noise_multiplier instead",
        )
        check(
            self.epsilon is None or self.noise_multiplier is None,
            "noise_multiplier",
            self.noise_multiplier,
            "null when epsilon is set (the noise is then calibrated to it)",
        )
        check(
            self.epsilon is None or (self.epsilon > 0 and math.isfinite(self.epsilon)),
            "epsilon",
            self.epsilon,
            "a finite float > 0",
        )
        check(0 < self.delta < 1, "delta", self.delta, "a float in (0, 1), below 1/N")
        check(self.clip_norm > 0, "clip_norm", self.clip_norm, "a float > 0 (inf: no clipping)")
        check(
            self.noise_multiplier is None or 0 <= self.noise_multiplier < math.inf,
            "noise_multiplier",
            self.noise_multiplier,
            "a finite float >= 0 (0: no noise, ε = inf)",
        )
        check(
            not self.dp_sgd or self.mechanism.startswith("statistics"),
            "dp_sgd",
            self.dp_sgd,
            "false unless mechanism is statistics_local or statistics_central (record-level DP)",
        )
        check(0 < self.grad_clip_norm < math.inf, "grad_clip_norm", self.grad_clip_norm, "a finite float > 0")
        check(
            self.sampling_rate is None or 0 < self.sampling_rate <= 1,
            "sampling_rate",
            self.sampling_rate,
            "a float in (0, 1] or null (DP-SGD's Poisson sampling rate)",
        )


@dataclass
class ServerOptimizerConfig:
    """The server's step from the round's aggregate (docs/server_optimizers.md; federation/policies/server_optimizer.py).

    ``name``: a registered server optimizer — ``fedavg`` (the aggregate is the new state, today's behaviour bit for
    bit), ``fedavgm``, ``fedadagrad``, ``fedadam``, ``fedyogi`` (Flower's strategies of those names, Reddi et al.,
    ICLR 2021), or one registered outside the package (docs/adding_a_method.md), for the methods whose state is the
    mean of their clients' weights. Each optimizer reads the keys below it states; a null value takes its default
    (Flower's), a value it does not read is one line.
    """

    name: str = "fedavg"  # a registered server optimizer (fedavg: the aggregate as is; docs/policies.md)
    lr: float | None = None  # η, the server learning rate (Flower: eta / server_learning_rate)
    momentum: float | None = None  # fedavgm's μ (Flower: server_momentum; default 0)
    beta_1: float | None = None  # first-moment decay (fedadagrad default 0, fedadam / fedyogi 0.9)
    beta_2: float | None = None  # second-moment decay (fedadam / fedyogi: 0.99)
    tau: float | None = None  # adaptivity τ (fedadagrad / fedadam: 1e-9, fedyogi: 1e-3)
    weight_decay: float | None = None  # λ of a decoupled weight decay (none of Flower's optimizers has one)

    def __post_init__(self) -> None:
        check(isinstance(self.name, str) and self.name.isidentifier(), "name", self.name, "a server optimizer's name")
        check(self.lr is None or 0 < self.lr < math.inf, "lr", self.lr, "a finite float > 0 or null")
        for key in ("momentum", "beta_1", "beta_2"):
            value = getattr(self, key)
            check(value is None or 0 <= value < 1, key, value, "a float in [0, 1) or null")
        check(self.tau is None or 0 <= self.tau < math.inf, "tau", self.tau, "a finite float >= 0 or null")
        check(
            self.weight_decay is None or 0 <= self.weight_decay < math.inf,
            "weight_decay",
            self.weight_decay,
            "a finite float >= 0 or null",
        )


@dataclass
class AggregatorConfig:
    """How the server combines the clients' weights (docs/robust_aggregation.md; federation/policies/robust_aggregation.py):
    ``mean`` — the method's own (weighted) mean, today's behaviour bit for bit; ``median``, ``trimmed_mean``,
    ``krum``, ``multi_krum``, ``bulyan`` — Flower's FedMedian, FedTrimmedAvg, Krum / Multi-Krum and Bulyan — or a
    rule registered outside the package (docs/adding_a_method.md). For the methods whose state is the mean of their
    clients' weights."""

    name: str = "mean"  # a registered robust aggregator (mean: the method's own aggregate; docs/policies.md)
    trim_fraction: float = 0.2  # trimmed_mean's β: ⌊β·n⌋ values cut at each end (Flower's default 0.2)
    num_malicious: int = 0  # f, for krum / multi_krum / bulyan (bulyan needs n >= 4f + 3 uploads)
    num_to_keep: int | None = None  # multi_krum's q (null: n − f)

    def __post_init__(self) -> None:
        check(isinstance(self.name, str) and self.name.isidentifier(), "name", self.name, "an aggregator's name")
        check(0 <= self.trim_fraction < 0.5, "trim_fraction", self.trim_fraction, "a float in [0, 0.5)")
        check(self.num_malicious >= 0, "num_malicious", self.num_malicious, "an int >= 0")
        check(
            self.num_to_keep is None or (self.num_to_keep >= 1 and self.name == "multi_krum"),
            "num_to_keep",
            self.num_to_keep,
            "an int >= 1 for multi_krum, else null",
        )


ATTACKS = ("none", "sign_flip", "scale", "gaussian", "label_flip")


@dataclass
class AttackConfig:
    """Model-poisoning clients (docs/robust_aggregation.md; federation/policies/attacks.py): a seeded ``fraction`` of the
    clients send x_t − s·Δ (``sign_flip``), x_t + s·Δ (``scale``) or x_t + N(0, std²) (``gaussian``) instead of
    their trained weights, or train on their data with every label l read as C − 1 − l (``label_flip``). For the
    methods whose state is the mean of their clients' weights."""

    # what the attacking clients do to their update (docs/robust_aggregation.md)
    kind: Literal[ATTACKS] = "none"  # type: ignore[valid-type]
    fraction: float = 0.0  # of the K clients, drawn once for the run (0: none attacks, e.g. a sweep's first point)
    scale: float | None = None  # s; null: 1 for sign_flip, 10 for scale
    std: float = 1.0  # gaussian's σ
    seed: int = 0  # which clients attack, and gaussian's noise

    def __post_init__(self) -> None:
        check(0 <= self.fraction < 1, "fraction", self.fraction, "a float in [0, 1)")
        check(
            self.scale is None or (math.isfinite(self.scale) and self.kind in ("sign_flip", "scale")),
            "scale",
            self.scale,
            "a finite float for sign_flip / scale, else null",
        )
        check(0 <= self.std < math.inf, "std", self.std, "a finite float >= 0")
        _check_seed("seed", self.seed)


@dataclass
class ClientBehaviourConfig:
    """Clients that are not always there, for any method (federation/client_behaviour.py, FLGo's availability and
    dropout, FedProx's stragglers): each round a client is online with probability ``availability`` (or as the
    ``availability_trace`` file says) and the round's
    clients are sampled from those online; a sampled client drops out after its download with probability
    ``dropout``, is a straggler with probability ``stragglers``, and, with a ``deadline_s``, is dropped when its
    simulated time (its steps at its seeded speed, FedScale's and FLGo's system heterogeneity) exceeds it."""

    availability: float = 1.0  # P(a client is online in a round); 1: always
    # a file saying who is online each round instead of the draw: one 0/1 row per round, one column per client (text
    # or .npy; round t reads row t mod rows); null: availability's draw (federation/availability_trace.py)
    availability_trace: str | None = None
    # who is online: a model registered for the kind "availability" (federation/policies/availability.py: always,
    # bernoulli, trace, or one of your own); null: bernoulli with availability < 1, trace with availability_trace
    availability_model: str | None = None
    dropout: float = 0.0  # P(a sampled client drops out after its download: no upload, a failure that is no error)
    # who drops out: a model registered for the kind "dropout" (federation/policies/dropout.py: none, bernoulli, or
    # one of your own); null: bernoulli with dropout > 0
    dropout_model: str | None = None
    # P(a sampled client is a straggler): it runs E_k ~ U{1..E} of its E local epochs (train.epochs) — FedProx's
    # systems heterogeneity (Li et al., MLSys 2020, Sec. 5.2)
    stragglers: float = 0.0
    # true: a straggler misses the round's deadline and is dropped (its download counted, no upload), as FedAvg
    # treats stragglers in that paper; false: its partial work is aggregated, as FedProx does
    drop_stragglers: bool = False
    # σ of the clients' speeds s_k = exp(σ z_k), z_k ~ N(0, 1) drawn once per client from the seed — FedScale's
    # and FLGo's heterogeneous devices; 0: every client as fast. Only with deadline_s (speeds alone change nothing)
    speed_spread: float = 0.0
    step_s: float = 1.0  # simulated seconds of one local step (a batch) on a client of speed 1
    # the round's deadline in simulated seconds: a client whose time t_k = ceil(n_k / B) · E_k · step_s / s_k exceeds
    # it is late and dropped (its download counted, no upload); null: no deadline
    deadline_s: float | None = None
    # a late client: drop (no upload), or stale: it trains, and its update arrives τ = ceil(t_k / D) − 1 rounds later,
    # aggregated then at weight (1 + τ)^−a · n_k (FedAsync's polynomial staleness; averaging methods only)
    late: Literal["drop", "stale"] = "drop"
    staleness_exponent: float = 0.5  # a in the staleness weight (1 + τ)^−a (Xie et al. 2019); 0: a late update in full
    seed: int = 0  # every draw, from (seed, round, client)

    def __post_init__(self) -> None:
        check(0 < self.availability <= 1, "availability", self.availability, "a float in (0, 1]")
        check(
            self.availability_trace is None or (isinstance(self.availability_trace, str) and self.availability == 1),
            "availability_trace",
            self.availability_trace,
            "null, or a file's path with availability 1 (the trace says who is online)",
        )
        check(0 <= self.dropout < 1, "dropout", self.dropout, "a float in [0, 1)")
        check(0 <= self.stragglers <= 1, "stragglers", self.stragglers, "a float in [0, 1]")
        check(
            isinstance(self.drop_stragglers, bool) and (self.stragglers > 0 or not self.drop_stragglers),
            "drop_stragglers",
            self.drop_stragglers,
            "true or false; true only with federation.clients.stragglers > 0",
        )
        check(
            not isinstance(self.deadline_s, (bool, str)) and (self.deadline_s is None or 0 < self.deadline_s < math.inf),
            "deadline_s",
            self.deadline_s,
            "a finite number of seconds > 0, or null",
        )
        check(
            0 <= self.speed_spread < math.inf and (self.deadline_s is not None or self.speed_spread == 0),
            "speed_spread",
            self.speed_spread,
            "a finite float >= 0; > 0 only with federation.clients.deadline_s (speeds alone change nothing)",
        )
        check(0 < self.step_s < math.inf, "step_s", self.step_s, "a finite number of seconds > 0")
        check(
            self.late in ("drop", "stale") and (self.late == "drop" or self.deadline_s is not None),
            "late",
            self.late,
            "drop or stale; stale only with federation.clients.deadline_s",
        )
        check(0 <= self.staleness_exponent < math.inf, "staleness_exponent", self.staleness_exponent, "a finite float >= 0")
        _check_seed("seed", self.seed)


@dataclass
class FederationConfig:
    rounds: int = 1  # communication rounds T (one-shot methods: 1; a method with a fixed count refuses others)
    client_fraction: float = 1.0  # fraction of clients sampled per round (multi-round methods)
    sampling_seed: int = 0  # its own seed for client sampling
    accelerator: Literal[ACCELERATORS] = "auto"  # type: ignore[valid-type] # GPUs when there are any, else the CPU
    devices: int = 1  # Fabric ranks on this node; clients are dealt to them
    # machines of the run (devices per node × num_nodes ranks); several: launch with torchrun / SLURM
    num_nodes: int = 1
    strategy: str = "auto"  # "auto" → ddp when devices * num_nodes > 1
    # the default process group's backend, which carries the compute collectives (DDP's all-reduce, the split
    # ensemble's gathers): auto is Fabric's pick (nccl with CUDA, gloo on the CPU); gloo on GPUs lets several ranks
    # share one GPU (NCCL refuses two ranks on one device) — the GPU check's 2-process runs on one GPU — or runs
    # where NCCL is unavailable, at gloo's speed (CUDA tensors cross through host memory). The object collectives
    # run on their own gloo group whatever this says (federation/ranks/ddp_strategy.py)
    process_group_backend: Literal["auto", "nccl", "gloo"] = "auto"
    precision: Literal[PRECISIONS] = "32-true"  # type: ignore[valid-type] # e.g. "bf16-mixed" on GPUs
    # a client that raises: stop the run (raise) or leave it out of the round and record it (skip)
    on_client_error: Literal["raise", "skip"] = "raise"
    # a round with fewer successful clients than this stops the run (exit 1, checkpoint kept), as Flower's
    # min_fit_clients: failure is never reported as success. 0 (averaging methods): a round in which no update
    # arrived — every client offline, dropped, late or failed under on_client_error: skip — keeps the global state
    # and the run goes on, as Flower's server does when aggregate_fit has no results
    min_clients: int = 1
    # crash safety that pays for itself (federation/storage/round_store.py): the server's finished clients stay in
    # memory until their round has run this many seconds, then every record is written to disk; a crash
    # (SIGKILL) earlier costs at most this much work, re-run to the same result. 0: write each record at once
    # (also in rounds whose whole-model uploads are otherwise folded where they are trained, never recorded:
    # federation/ranks/summed_uploads.py)
    record_after_s: float = 10.0
    # the longest a rank waits in one collective (the start-up's rendezvous included) before it stops with one
    # line (exit 1). The longest wait is the server's phase: ranks 1..N-1 wait while rank 0 plans, aggregates and
    # evaluates — hours in FeDiSyn's round 0 (the synthesis on the server), where torch's default (30 min for
    # NCCL) lets the watchdog abort them. 24 h covers that phase; a failure on rank 0 still ends every rank at
    # once (federation/ranks/collectives.py), so the long default never makes a failed run wait
    collective_timeout_s: float = 86400.0
    # the longest a rank waits in one *compute* collective on several ranks (DDP's gradient all-reduce in the joined
    # pre-training, its failure flag, the split ensemble's gathers; the start-up's rendezvous): these run in
    # lockstep, so a rank that has not arrived after minutes is stuck (a mismatched collective), and NCCL's
    # watchdog ends it after this long instead of a day. The waits for rank 0's server phases run on a separate
    # gloo group under collective_timeout_s (federation/ranks/ddp_strategy.py)
    compute_timeout_s: float = 900.0
    # on several ranks, each keeps a heartbeat in the launcher's store and watches its peers' (federation/ranks/liveness.py):
    # a rank silent this long (killed, frozen by SIGSTOP or a hung file system, its host lost), a rank that failed
    # outside an exchange, or a store that stopped answering ends every rank with one line (exit 1), however long
    # the legitimate wait it interrupts — NCCL notices none of these itself. A beat every sixth of it (at most 10 s)
    liveness_timeout_s: float = 300.0
    # CUDA only, set for the run and restored after it (by Simulation.run and the CLI: federation/numerics.py); on
    # the CPU nothing changes. torch.set_float32_matmul_precision, for float32 matmuls (linear layers, attention):
    # "highest" full float32 products; "high" (default) TF32 tensor cores on Ampere and newer (10 mantissa bits
    # in the products, float32 accumulation: several times faster; results differ from "highest" from about the
    # 4th significant digit, and between GPU models); "medium" bf16 products (faster still, ~3 digits).
    # The run sets cuDNN's TF32 for float32 convolutions with it (torch.backends.cudnn.allow_tf32: on, unless
    # "highest"), so TF32 is on for float32 matmuls and convolutions on CUDA by default. It changes the numbers a
    # run computes, so a resumed run cannot change it. Under bf16-mixed/16-mixed most matmuls run in half
    # precision anyway; this governs those left in float32 (and every one of a 32-true run)
    matmul_precision: Literal["highest", "high", "medium"] = "high"
    # true: the run calls torch.use_deterministic_algorithms(True) (and sets CUBLAS_WORKSPACE_CONFIG=:4096:8 when
    # it is unset) for the run, so that a rerun on the same machine and software gives the same bits on a GPU
    # too. It costs speed (deterministic cuDNN convolutions, scatter/index_add without atomics: slower kernels),
    # and an op with no deterministic CUDA kernel raises a RuntimeError instead of running (torch's list names
    # e.g. the backward of AdaptiveAvgPool2d, as in timm CNNs' pooling, and of bilinear interpolation). The CPU
    # runs here give the same numbers either way. It changes which kernels run, so a resumed run cannot change it
    deterministic: bool = False
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)  # differential privacy (docs/privacy.md)
    # the server's step from the aggregate: fedavg (the mean), fedavgm, fedadagrad, fedadam, fedyogi
    server_optimizer: ServerOptimizerConfig = field(default_factory=ServerOptimizerConfig)
    # how the clients' weights are combined: mean (the method's own), median, trimmed_mean, krum, multi_krum, bulyan
    aggregator: AggregatorConfig = field(default_factory=AggregatorConfig)
    # poisoned uploads from a seeded fraction of the clients (none, sign_flip, scale, gaussian)
    attack: AttackConfig = field(default_factory=AttackConfig)
    # clients that are not always there: availability per round, dropout mid-round (any method)
    clients: ClientBehaviourConfig = field(default_factory=ClientBehaviourConfig)

    def __post_init__(self) -> None:
        check(self.rounds >= 1, "rounds", self.rounds, "an int >= 1")
        check(
            self.matmul_precision in _MATMUL_PRECISIONS,
            "matmul_precision",
            self.matmul_precision,
            f"one of {', '.join(_MATMUL_PRECISIONS)} (torch.set_float32_matmul_precision; CUDA only)",
        )
        check(isinstance(self.deterministic, bool), "deterministic", self.deterministic, "true or false")
        check(
            1 <= self.collective_timeout_s <= 1e9,
            "collective_timeout_s",
            self.collective_timeout_s,
            "a float in [1, 1e9] (seconds; 86400 is a day; below a second no rendezvous or gather completes)",
        )
        check(
            1 <= self.compute_timeout_s <= 1e9,
            "compute_timeout_s",
            self.compute_timeout_s,
            "a float in [1, 1e9] (seconds; 900 is 15 min; below a second no rendezvous or gather completes)",
        )
        check(
            5 <= self.liveness_timeout_s <= 1e9,
            "liveness_timeout_s",
            self.liveness_timeout_s,
            "a float in [5, 1e9] (seconds; a beat every sixth of it, and a busy host may delay one by seconds)",
        )
        check(0 <= self.record_after_s <= _FLOAT32_MAX, "record_after_s", self.record_after_s, "a finite float >= 0 (seconds)")
        check(0 < self.client_fraction <= 1, "client_fraction", self.client_fraction, "a float in (0, 1]")
        check(self.devices >= 1, "devices", self.devices, "an int >= 1")
        check(self.num_nodes >= 1, "num_nodes", self.num_nodes, "an int >= 1")
        check(
            self.process_group_backend != "nccl" or self.accelerator in ("auto", "gpu", "cuda"),
            "process_group_backend",
            self.process_group_backend,
            f"auto or gloo with federation.accelerator {self.accelerator} (nccl runs only on CUDA GPUs)",
        )
        check(
            self.min_clients >= 0,
            "min_clients",
            self.min_clients,
            "an int >= 0 (0: a round with no update keeps the state; averaging methods)",
        )
        _check_seed("sampling_seed", self.sampling_seed)


@dataclass
class LocalTrainingConfig:
    epochs: int = 5  # E local epochs (FedOPAL: 5)
    optimizer: Literal["sgd", "adamw"] = "sgd"  # the clients' local optimizer
    lr: float = 0.01  # VPT's usual order for SGD on prompts
    momentum: float = 0.9  # SGD's momentum (sgd only)
    weight_decay: float = 0.0  # L2 weight decay of the local optimizer (AdamW: decoupled)
    batch_size: int | None = None  # None: data.batch_size

    def __post_init__(self) -> None:
        check(self.epochs >= 0, "epochs", self.epochs, "an int >= 0")
        check(0 < self.lr <= _FLOAT32_MAX, "lr", self.lr, "a finite float > 0 (the optimisers run in float32)")
        check(0 <= self.momentum < 1, "momentum", self.momentum, "a float in [0, 1)")
        check(0 <= self.weight_decay <= _FLOAT32_MAX, "weight_decay", self.weight_decay, "a finite float >= 0")
        check(self.batch_size is None or self.batch_size >= 1, "batch_size", self.batch_size, "an int >= 1 or null")


@dataclass
class LoggingConfig:
    wandb: bool = False  # log to Weights & Biases (Lightning's WandbLogger; offline when WANDB_MODE=offline)
    project: str = "fl_lightning"  # the W&B project
    entity: str | None = None  # the W&B entity (team or user); null: your default
    mode: Literal["online", "offline"] = "offline"  # offline needs no network: `wandb sync` later
    tensorboard: bool = False  # also write TensorBoard event files under the run folder
    progress: bool = True  # rich progress bars (shown only on a terminal)


CORE_SECTIONS = ("data", "partition", "model", "federation", "train", "logging")


@dataclass
class RunConfig:
    algorithm: str = "fedopal"  # a registered method (fl_lightning/algorithms/); its section is its own name
    seed: int = 0  # training seed (the partition and client sampling have their own)
    output_dir: str = "runs"  # where run folders go: <output_dir>/<run name>/
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
        # user-level: δ < 1/K (a δ of 1/K could release one user's update whole); a natural partition's K is read from
        # the data before the run (federation/simulation.py: resolve_num_clients), and checked again then
        if p.mechanism == "dp_fedavg" and self.partition.num_clients is not None:
            check(
                p.delta < 1 / self.partition.num_clients,
                "federation.privacy.delta",
                p.delta,
                f"a float < 1/num_clients = {1 / self.partition.num_clients:g} (user-level DP over "
                f"{self.partition.num_clients} clients)",
            )
        if self.partition.convention == "flower":  # flwr-datasets partitions the whole training split
            check(
                self.data.num_samples is None,
                "data.num_samples",
                self.data.num_samples,
                "null with partition.convention: flower (Flower partitions the whole training split; a subset's "
                "clients are not Flower's)",
            )
            check(
                self.data.name != "hf" or self.data.test_split is not None,
                "data.test_split",
                None,
                "a split's name with partition.convention: flower (null carves a test set out of the training "
                "split, and Flower partitions that split whole)",
            )
            check(
                self.data.name != "hf" or not any(c in self.data.train_split for c in "[+"),
                "data.train_split",
                self.data.train_split,
                "a whole split's name with partition.convention: flower (Flower partitions "
                "the whole training split; a slice's clients are not Flower's)",
            )
        if self.run_name is not None:
            name = self.run_name
            check(
                name not in ("", ".", "..") and "/" not in name and "\\" not in name and "\0" not in name,
                "run_name",
                name,
                "a single folder name (no '/', no '..', not absolute)",
            )

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
