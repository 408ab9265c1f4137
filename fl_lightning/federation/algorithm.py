"""The narrow interface every federated method implements (cf. Flower's Strategy, for a simulator).

The simulation calls, for each round ``t``:

    plan(t, clients, state, history)              server: a RoundPlan — per-client Downloads plus what
                                                  the server decided (depths, bandwidth, …)
    client_update(t, client, download)            each rank, each of its clients: → Upload
    aggregate(t, state, uploads, failures, plan)  server, once: → new global state
    evaluate(state)                               server: → metrics (at least "accuracy")

The plan is checkpointed with the round, so a resumed round aggregates with the very plan its
clients ran under; a method keeps no round state on ``self``. ``uploads`` is a read-only mapping in
client order that may load each upload only when it is read (the engine keeps them on disk): a
method whose aggregate is a sum folds them one at a time and its server memory stays flat in K.

One-shot methods are the one-round case. A method is one file under ``fl_lightning/algorithms/``
(found by discovery) that subclasses :class:`Algorithm`, declares its config section as
``config_class`` and registers itself with :func:`register`. This module imports no config code at
run time: the loader (``fl_lightning.config.loading``) reads the registry, never the other way round
(docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

from fl_lightning.data.relabelled import Relabelled, RelabelledBatches
from fl_lightning.federation.ranks.placement import client_seed
from fl_lightning.federation.transport import Download, Upload

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from fl_lightning.config import RunConfig
    from fl_lightning.data.loader import LoaderSettings
    from fl_lightning.data.registry import DatasetSplits
    from fl_lightning.federation.local_training import DPSGD
    from fl_lightning.federation.ranks.summed_uploads import UploadSum

__all__ = [
    "Algorithm",
    "Client",
    "Environment",
    "InputSpec",
    "NoConfig",
    "RoundHistory",
    "RoundPlan",
    "register",
    "ALGORITHMS",
    "RENAMED",
    "State",
    "every_key",
]

State = dict[str, Tensor]  # the server's global state: named tensors only (checkpointable, broadcastable)


@dataclass
class NoConfig:
    """The section of a method that has no options of its own (it stays empty in the YAML)."""


@dataclass
class RoundPlan:
    """What the server decided for one round: each sampled client's Download, plus its decisions.

    ``decisions`` holds plain, checkpointable values only (tensors, numbers, strings, lists and dicts
    of them): e.g. FeDiSyn's depths, bandwidths and round time. The engine checkpoints the plan at the
    start of the round and hands it back to :meth:`Algorithm.aggregate`.
    """

    downloads: dict[int, Download]
    decisions: dict[str, Any] = field(default_factory=dict)

    @property
    def clients(self) -> list[int]:
        return sorted(self.downloads)

    def state_dict(self) -> dict:
        return {"downloads": {c: d.state_dict() for c, d in self.downloads.items()}, "decisions": self.decisions}

    @classmethod
    def from_state_dict(cls, state: dict) -> RoundPlan:
        return cls({int(c): Download.from_state_dict(d) for c, d in state["downloads"].items()}, dict(state["decisions"]))


@dataclass(frozen=True)
class InputSpec:
    """What the model expects of an image: it chooses the data transforms."""

    image_size: int
    normalization: str = "none"  # "clip" (bicubic, no augmentation), "imagenet" or "none"
    mean: tuple[float, ...] | None = None  # the weights' own statistics, when they differ from the name's
    std: tuple[float, ...] | None = None
    # the training split's augmentation when the method's ``augment`` is on (data/transforms.AUGMENTATIONS):
    # "random_resized_crop" + flip, or CIFAR's "crop_flip" (pad by S/8 — 4 px at 32 — random crop + flip)
    augmentation: str = "random_resized_crop"

    @classmethod
    def of_backbone(cls, backbone: Any, image_size: int | None = None) -> InputSpec:
        style = "clip" if backbone.library == "open_clip" else "imagenet"
        return cls(image_size or backbone.image_size, style, tuple(backbone.mean), tuple(backbone.std))


@dataclass
class Client:
    """One simulated client: its index and its private slice of the training set."""

    index: int
    dataset: Dataset
    num_samples: int
    class_counts: np.ndarray  # (C,) — known to the client itself only
    # (C,) the label each true class is read as, for a client that trains on changed labels (federation.attack's
    # label_flip): ``dataset`` already reads through it; a method that reads the labels elsewhere (a feature table's)
    # maps them with it. None: the labels as they are.
    label_map: np.ndarray | None = None


@dataclass
class RoundHistory:
    """What the server knows about past rounds when it plans the next one."""

    client_compute_s: dict[int, float] = field(default_factory=dict)  # last measured compute time per client
    round_s: list[float] = field(default_factory=list)
    metrics: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Environment:
    """Per-rank context handed to an algorithm: Fabric, data, partition, run folder."""

    fabric: Fabric
    cfg: RunConfig
    splits: DatasetSplits
    partition: list[np.ndarray]
    run_dir: Path
    privacy: Any = None  # federation/privacy.FederationPrivacy when federation.privacy is on
    # True while every rank runs a server phase together (the engine sets it around a shared evaluation): the
    # helpers of algorithms/common.py then split their work over the ranks and gather it (docs/ranks.md)
    shared: bool = False
    # the DataLoader settings of this rank (data/loader.py; the simulation resolves data.num_workers & co.);
    # None: resolved here from the config, for this rank's device
    loading: LoaderSettings | None = None
    # whether one loader kept for the run may serve every client's pass over splits.train (its transform has no
    # random step, so the batches do not depend on which worker made them); used when there are workers
    one_train_loader: bool = False
    # the clients that train on changed labels, each with its (C,) label map (federation.attack's label_flip)
    label_maps: dict[int, np.ndarray] = field(default_factory=dict)
    # partition.client_test_fraction > 0: each client's own test rows of the training split (data/client_test.py;
    # ``partition`` then holds its training rows), on which algorithms/common.py's helpers also evaluate the model
    client_test: list[np.ndarray] | None = None
    _passes: dict[str, Any] = field(default_factory=dict, init=False, repr=False)  # the loaders kept, by split

    def dp_sgd(self, round_idx: int, client: Client) -> DPSGD | None:
        """The DP-SGD settings of ``client``'s local training (``fit_local(dp_sgd=...)``), or None."""
        return None if self.privacy is None else self.privacy.dp_sgd(round_idx, client.index)

    @property
    def num_classes(self) -> int:
        return len(self.splits.classes)

    def client(self, index: int) -> Client:
        """Client ``index``: its rows of the training split, read with its label map if it has one."""
        idx = self.partition[index]
        label_map = self.label_maps.get(index)
        dataset: Dataset = Subset(self.splits.train, idx.tolist())
        targets = self.splits.train_targets[idx]
        if label_map is not None:
            dataset, targets = Relabelled(dataset, label_map), label_map[targets]
        counts = np.bincount(targets, minlength=self.num_classes)
        return Client(index, dataset, len(idx), counts, label_map)

    def loader(
        self, dataset: Dataset, *, shuffle: bool, seed: int = 0, batch_size: int | None = None, dp_sgd: DPSGD | None = None
    ) -> Any:
        """A DataLoader on this rank; shuffling from its own seeded generator (never the global RNG).

        With ``dp_sgd`` (:meth:`dp_sgd`'s settings), DP-SGD's Poisson-sampled lots instead
        (:class:`~fl_lightning.privacy.poisson_sampling.PoissonBatches`; ``shuffle``, ``seed`` and ``batch_size`` are
        not used: the rate and the step count are the privacy's, the draws come from its noise source).

        With workers (``data.num_workers``), a client's rows of the training split (``client.dataset``) are read
        through one loader kept for the run (:class:`~fl_lightning.data.loader.ClientPasses`): the same batches as
        this per-client DataLoader, without starting the workers again for every client and pass; so are the test
        split and a rank's block of it (every evaluation's, unshuffled), through a second one. With
        ``data.normalize_on_device`` (on CUDA), a uint8 store's batches arrive with their images already on the
        rank's device, finished there (:class:`~fl_lightning.data.loader.DeviceFloatPart`)."""
        from fl_lightning.data.loader import ClientPasses, DeviceFloatPart
        from fl_lightning.data.preprocessed import collate, collate_uint8, float_part_of, store_of

        loading = self.loader_settings()
        batch_size = batch_size or self.cfg.data.batch_size
        store = store_of(dataset)
        if loading.num_workers > 0 and store is not None:
            store.prime()  # the rank's one store, allocated before the workers start: whatever they decode, all read
        float_part = float_part_of(dataset) if loading.normalize_on_device else None
        collate_fn = collate if float_part is None else collate_uint8
        if dp_sgd is not None:
            return self._poisson_loader(dataset, dp_sgd, collate_fn, float_part)
        rows = dataset.dataset if isinstance(dataset, Relabelled) else dataset  # a label flipper's rows
        kept = self._kept_rows(rows, shuffle) if loading.num_workers > 0 else None
        if kept is not None:
            name, indices = kept
            if name not in self._passes:
                self._passes[name] = ClientPasses(
                    getattr(self.splits, name),
                    num_workers=loading.num_workers,
                    pin_memory=loading.pin_memory,
                    persistent_workers=loading.persistent_workers,
                    collate_fn=collate_fn,
                )
            loader = self._passes[name].pass_over(indices, batch_size=batch_size, shuffle=shuffle, seed=seed)
            if rows is not dataset:
                loader = RelabelledBatches(loader, dataset.label_map)
        else:
            generator = torch.Generator().manual_seed(seed) if shuffle else None
            loader = DataLoader(
                dataset,
                batch_size=batch_size,
                shuffle=shuffle,
                generator=generator,
                num_workers=loading.num_workers,
                pin_memory=loading.pin_memory,
                persistent_workers=False,
                collate_fn=collate_fn,
            )
        return loader if float_part is None else DeviceFloatPart(loader, device=self.fabric.device, float_part=float_part)

    def _kept_rows(self, rows: Dataset, shuffle: bool) -> tuple[str, Sequence[int]] | None:
        """Which split's kept loader reads ``rows``, and which of its rows: a client's rows of the training split
        (when its transform has no random step: ``one_train_loader``), the test split or a block of it, unshuffled
        (an evaluation); None for anything else (a fresh DataLoader)."""
        if isinstance(rows, Subset) and rows.dataset is self.splits.train and self.one_train_loader:
            return "train", rows.indices
        if shuffle:
            return None
        if isinstance(rows, Subset) and rows.dataset is self.splits.test:
            return "test", rows.indices
        return ("test", range(len(rows))) if rows is self.splits.test else None

    def _poisson_loader(self, dataset: Dataset, dp: DPSGD, collate_fn: Callable, float_part: Callable | None) -> Any:
        """:meth:`loader`'s DP-SGD lots: each epoch's non-empty lots read by one DataLoader (this rank's workers,
        pinned memory and collate), finished on the device as the other loaders are."""
        from fl_lightning.data.loader import DeviceFloatPart
        from fl_lightning.privacy.poisson_sampling import PoissonBatches

        loading = self.loader_settings()

        def lots_loader(lots: list[list[int]]) -> Any:
            loader = DataLoader(
                dataset, batch_sampler=lots, num_workers=loading.num_workers, pin_memory=loading.pin_memory, collate_fn=collate_fn
            )
            return loader if float_part is None else DeviceFloatPart(loader, device=self.fabric.device, float_part=float_part)

        return PoissonBatches(
            len(dataset),
            rate=dp.sampling_rate,
            steps_per_epoch=dp.steps_per_epoch,
            generator=torch.Generator().manual_seed(dp.sampling_seed),
            make_loader=lots_loader,
        )

    def client_loader(self, client: Client, round_idx: int, *, dp_sgd: DPSGD | None = None) -> Any:
        """:meth:`loader` of ``client``'s rows for its local training in round ``round_idx``: shuffled by the client's
        seed for the round (``ranks/placement.client_seed``), ``train.batch_size`` (null: ``data.batch_size``)."""
        seed = client_seed(self.cfg.seed, round_idx, client.index)
        return self.loader(client.dataset, shuffle=True, batch_size=self.cfg.train.batch_size, seed=seed, dp_sgd=dp_sgd)

    def loader_settings(self) -> LoaderSettings:
        """This rank's DataLoader settings: ``loading``, or ``data.num_workers`` & co. resolved for its device
        (:func:`~fl_lightning.data.loader.resolve_loader_settings`), once."""
        if self.loading is not None:
            return self.loading
        from fl_lightning.cores import available_cpus, ranks_sharing_cores
        from fl_lightning.data.loader import resolve_loader_settings

        d = self.cfg.data
        cuda = getattr(getattr(self.fabric, "device", None), "type", "cpu") == "cuda"
        cpus = available_cpus()  # under SLURM's one task per rank, that task's own cores: shared by none
        self.loading = resolve_loader_settings(
            d.num_workers,
            d.pin_memory,
            d.persistent_workers,
            cuda=cuda,
            normalize_on_device=d.normalize_on_device,
            cpus=cpus,
            ranks_on_node=ranks_sharing_cores(self.cfg.federation.devices, cpus),
        )
        return self.loading


class Algorithm(ABC):
    """Base class of a federated method. Keyword-only constructor: ``Algo(cfg=...)``.

    ``self.cfg`` is the whole :class:`~fl_lightning.config.RunConfig` (core sections: data, partition,
    model, federation, train, logging); ``self.config`` is this method's own section, an instance of
    ``config_class``; ``self.fabric`` is the rank's launched Fabric, given by the engine before :meth:`build`.
    """

    name: str = ""
    fabric: Fabric  # set by the engine (federation/simulation.py) before build(); never by a method
    config_class: type = NoConfig  # the dataclass of this method's YAML section (named like the method)
    augment: bool = False  # random crops/flips on the training split (frozen-feature methods: off)
    # evaluate() depends on the state alone and evaluates through algorithms/common.py's helpers: on several ranks
    # the engine runs it on every rank, each evaluating its shard of the test split (the numbers of one rank)
    shared_evaluation: bool = False
    # evaluate() reaches algorithms/common.py's evaluate_on_test / FrozenFeatures.evaluate with the global model, so
    # partition.client_test_fraction's federated evaluation (fed_test_acc & co.) runs there; else that key is refused
    federated_evaluation: bool = False
    # federation.precision bf16-true / 16-true (federation/precision.py): None when the method converts what it
    # trains to half precision as Fabric does (convert_module, convert_input); else why it cannot, the reason a
    # run with one of them is refused with (one line, exit status 2)
    true_precision: str | None = "its modules are not converted to half precision"
    # True: aggregate() returns the weighted mean (by meta["num_samples"]) of the uploads' floating-point tensors of
    # the state, and nothing else — FedAvg's kind. Only then do the update policies that read or replace a mean
    # compose with the method: a server optimizer, a robust aggregator, an attack on weights, late (stale) updates
    # (federation/policies/order.py). Declared by the method's own class, never inherited (averages_weights()): a
    # subclass whose server does more than average (DENSE distils from each model) says nothing and is refused.
    averages_weights: bool = False

    def averaged_keys(self, state: State) -> frozenset[str]:
        """The keys of ``state`` whose new value :meth:`aggregate` makes the weighted mean of the uploads' — declared by
        a method with ``averages_weights``: what the update policies that read or replace a mean may touch (an
        attack, late updates, a robust rule, a server optimizer; of these keys, the floating-point tensors: a count
        stays the method's). The default: none."""
        return frozenset()

    def shared_aggregate(self, round_idx: int) -> bool:
        """Whether every rank runs round ``round_idx``'s :meth:`aggregate` together (``env.shared`` set; the uploads
        read back from the round's files on every rank), sharing its work through
        :class:`~fl_lightning.federation.ranks.collectives.Ranks`; rank 0's returned state is the round's. False: rank 0
        aggregates alone (the default)."""
        return False

    def summed_uploads(self, round_idx: int) -> UploadSum | None:
        """What of round ``round_idx``'s uploads :meth:`aggregate` only sums, weighted by a meta count, when that is all
        it reads of them besides their meta and other tensors: the engine may then fold them on the ranks that made
        them, in client order (federation/ranks/summed_uploads.py; :meth:`aggregate` gets the fold through
        ``summed_uploads.summed_mean``). None: the aggregate reads every upload itself (the default)."""
        return None

    def __init__(self, *, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.config = cfg.method if cfg.method is not None else self.config_class()
        self.env: Environment | None = None

    # -- set-up (each rank) -------------------------------------------------------------------
    @classmethod
    def preflight(cls, cfg: RunConfig) -> None:
        """Cheap checks of local resources (paths exist) before any process or model starts;
        raise :class:`~fl_lightning.errors.MissingResourceError` with one line."""

    @property
    def num_rounds(self) -> int:
        return self.cfg.federation.rounds

    def input_spec(self) -> InputSpec:
        """What the model expects of an image (called after :meth:`build`)."""
        return InputSpec(self.cfg.data.image_size or 32)

    def build(self, fabric: Fabric) -> None:
        """Build what is shared by all clients of a rank (e.g. the frozen backbone) ONCE, before data."""

    def setup(self, env: Environment) -> None:
        self.env = env

    @abstractmethod
    def initial_state(self) -> State:
        """The server's global state before round 0 (identical on every rank)."""

    def load_state(self, state: State) -> None:
        """Called on every rank when a run resumes, with the checkpointed global state (e.g. to restore
        weights that reached the ranks in an earlier round's download)."""

    # -- one round ------------------------------------------------------------------------------
    def plan(self, round_idx: int, clients: Sequence[int], state: State, history: RoundHistory) -> RoundPlan:
        """Per-client instructions. Default: every client receives the whole global state."""
        return RoundPlan({c: Download(dict(state)) for c in clients})

    @abstractmethod
    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        """Local work of one client; returns what it sends to the server.

        The upload may hold the method's own live tensors (e.g. its module's ``state_dict()``): the engine
        copies it to the CPU, or writes it, before anything else runs (``RoundStore.save_client``)."""

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]] | None:
        """Shapes the server requires of an upload (None: only the finiteness check)."""
        return None

    @abstractmethod
    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        """Server step: runs once (rank 0); the result is broadcast to every rank.

        ``uploads`` iterates in client order and may load each upload only when read: fold them one at a
        time (``for client, upload in uploads.items()``) rather than listing them, where the method allows.
        """

    @abstractmethod
    def evaluate(self, state: State) -> dict[str, Any]:
        """Metrics of the global state on the test split (rank 0): at least ``accuracy`` in [0, 1]."""

    def round_extras(self, round_idx: int, state: State) -> dict[str, float]:
        """Extra per-round numbers for metrics.csv (e.g. the simulated clock), from the new state."""
        return {}

    def summary_extras(self, state: State) -> dict[str, Any]:
        """Extra keys for summary.json."""
        return {}


def every_key(self: Algorithm, state: State) -> frozenset[str]:
    """:meth:`Algorithm.averaged_keys` of a method whose aggregate folds every key of its state by the uploads'
    weighted mean (FedAvg's kind): ``averaged_keys = every_key``."""
    return frozenset(state)


def averages_weights(algorithm: type) -> bool:
    """Whether ``algorithm``'s own class declares ``averages_weights = True`` (an inherited value does not count:
    :attr:`Algorithm.averages_weights`)."""
    return algorithm.__dict__.get("averages_weights", False) is True


ALGORITHMS: dict[str, type[Algorithm]] = {}
RENAMED: dict[str, str] = {}  # a method's former name → its name now (a config may still use the former)


def register(name: str, *, renamed_from: Sequence[str] = ()) -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator: make a method selectable as ``algorithm: <name>`` with its section ``<name>:``.

    Args:
        name: the method's name, an identifier. The config layer refuses one that is a core key
            (``data``, ``seed``, …) when it reads the registry: the core keys are its to know, and the
            registry does not import the config (the arrow points one way: config → registry).
        renamed_from: names the method had before. A config that still uses one (as ``algorithm:`` or as
            its section) runs this method, and the loader prints one line naming the new name.

    Example:
        >>> @register("fedavg_prompts", renamed_from=("fedavg_clip",))
        ... class FedAvgPrompts(Algorithm): ...
    """
    for n in (name, *renamed_from):
        if not isinstance(n, str) or not n.isidentifier():
            raise ValueError(f"cannot register a method named {n!r}: a method name is an identifier")

    def deco(cls: type[Algorithm]) -> type[Algorithm]:
        if not dataclasses.is_dataclass(cls.config_class):
            raise TypeError(f"{cls.__name__}.config_class must be a dataclass, got {cls.config_class!r}")
        previous = ALGORITHMS.get(name)
        if previous is not None and previous.__qualname__ != cls.__qualname__:
            raise ValueError(
                f"two methods named {name!r}: {previous.__module__}.{previous.__qualname__} and "
                f"{cls.__module__}.{cls.__qualname__}"
            )
        if name in RENAMED:
            raise ValueError(f"cannot register a method named {name!r}: it is the former name of {RENAMED[name]!r}")
        for old in renamed_from:
            if old in ALGORITHMS or RENAMED.get(old, name) != name:
                taken = old if old in ALGORITHMS else RENAMED[old]
                raise ValueError(f"{cls.__qualname__}: {old!r} cannot be a former name of {name!r}: it names {taken!r}")
        RENAMED.update(dict.fromkeys(renamed_from, name))
        cls.name = name
        ALGORITHMS[name] = cls
        return cls

    return deco
