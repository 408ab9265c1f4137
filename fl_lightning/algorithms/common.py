"""Pieces several algorithms share: the frozen backbone from the config, its features of a whole split
(computed once per comparison, :mod:`fl_lightning.data.feature_cache`) and test evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from fl_lightning.dealing import Deal
from fl_lightning.errors import ConfigError
from fl_lightning.federation.precision import convert_input, hold_trunk
from fl_lightning.federation.ranks.collectives import from_server, gathered
from fl_lightning.models.backbones import BackboneArgumentError, ViTBackbone, build_feature_backbone
from fl_lightning.models.cnn_backbone import CNNBackbone
from fl_lightning.modules.evaluation import eval_counts, evaluate_classifier, scores
from fl_lightning.modules.federated_evaluation import federated_scores, row_outcomes
from fl_lightning.phase_times import note

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from fl_lightning.config import RunConfig
    from fl_lightning.federation.algorithm import Algorithm, Environment
    from fl_lightning.modules.prompt_tuning import PromptTuningModule

__all__ = [
    "FrozenFeatures",
    "prompt_tuning_module",
    "frozen_backbone",
    "held_backbone",
    "evaluate_on_test",
    "evaluate_on_test_features",
    "federated_test",
    "feature_cache_folder",
    "client_feature_batches",
    "require_vit",
    "rank_rows",
    "splits_work",
]


def frozen_backbone(cfg: RunConfig) -> ViTBackbone | CNNBackbone:
    """The config's backbone, frozen and in eval mode (built once per rank): a ViT, or for a timm CNN
    (``model.name: resnet18``) its pooled pre-logit features (:class:`CNNBackbone`)."""
    m = cfg.model
    try:
        backbone = build_feature_backbone(
            library=m.library,
            name=m.name,
            pretrained=m.pretrained,
            checkpoint=m.checkpoint,
            feature=m.feature,
            image_size=cfg.data.image_size,
            overrides=m.overrides,
            cache_dir=m.cache_dir,
            download=m.download,
        )
    except BackboneArgumentError as err:  # the library cannot use a value: name the model.* key
        raise ConfigError(f"model.{err.argument}", err.value, err.allowed) from None
    return backbone.freeze()


def held_backbone(cfg: RunConfig, fabric: Any) -> ViTBackbone | CNNBackbone:
    """:func:`frozen_backbone` on ``fabric``'s device, in the compute dtype under a mixed precision on CUDA
    (:func:`~fl_lightning.federation.precision.hold_trunk`: cast once, not at every autocast forward); on the CPU
    as built (float32)."""
    return hold_trunk(fabric, frozen_backbone(cfg))


def prompt_tuning_module(model: nn.Module, num_classes: int, cfg: RunConfig) -> PromptTuningModule:
    """The Lightning module that tunes ``model``'s prompts under a fresh head seeded by the run's seed, its optimiser
    as ``train.*`` sets it (FedAvg of prompts; FedOPAL's Eq. (6))."""
    from fl_lightning.modules.prompt_tuning import PromptTuningModule

    t = cfg.train
    return PromptTuningModule(
        model=model,
        num_classes=num_classes,
        optimizer=t.optimizer,
        lr=t.lr,
        weight_decay=t.weight_decay,
        momentum=t.momentum,
        head_seed=cfg.seed,
    )


def require_vit(cfg: RunConfig, backbone: ViTBackbone | CNNBackbone) -> ViTBackbone:
    """``backbone`` if it is a ViT; else a ConfigError on ``model.name`` (prompts need a ViT's tokens)."""
    if not isinstance(backbone, ViTBackbone):
        raise ConfigError(
            "model.name",
            cfg.model.name,
            f"a ViT for {cfg.algorithm} (its prompts go between a "
            "ViT's embedding and its blocks); a CNN's pooled features serve afl, fedcgs, fedpft, fedavg",
        )
    return backbone


def evaluate_on_test(
    env: Environment, logits_fn: Callable[[Tensor], Tensor], *, autocast: bool = True, split: bool = True
) -> dict[str, Any]:
    """:func:`~fl_lightning.modules.evaluation.evaluate_classifier` of ``logits_fn`` (images → logits) on the
    test split, the forward under the run's precision (``fabric.autocast()``, as in local training).

    Under ``32-true`` Fabric's autocast is a null context: the numbers are those of the plain call, bit for bit.
    Under a mixed precision the logits come back in bf16/fp16 and are read in float32 (``evaluate_classifier``
    casts them before the loss and the arg-max).

    Args:
        env: the run's environment (its Fabric, test split and batch size).
        logits_fn: images (B, C, H, W) → logits (B, num_classes).
        autocast: False runs ``logits_fn`` as it is, for a caller that places the precision itself (e.g. a
            backbone under autocast and an analytic head in float32/64 outside it).
        split: False evaluates the whole split on this rank even in a shared phase (a ``logits_fn`` that is itself
            shared over the ranks, or a rank's own model of a set dealt over them).
    """
    fn = _under_autocast(env.fabric, logits_fn) if autocast else logits_fn
    if split:  # the test batches a shared evaluation deals in blocks (benchmarks/rank_model.py)
        note("evaluation batches", lambda: -(-len(env.splits.test) // env.cfg.data.batch_size), within="evaluation")
    if split and splits_work(env):  # each rank its block of the test batches; the counts gathered (the numbers of one rank)

        def mine() -> Any:
            loader = env.loader(_my_rows(env, env.splits.test, env.cfg.data.batch_size), shuffle=False)
            return eval_counts(fn, loader, num_classes=env.num_classes, device=env.fabric.device)

        metrics = scores(
            gathered(env.fabric, mine, what="the test split's evaluation", timeout_s=env.cfg.federation.collective_timeout_s)
        )
    else:
        loader: DataLoader = env.loader(env.splits.test, shuffle=False)
        metrics = evaluate_classifier(fn, loader, num_classes=env.num_classes, device=env.fabric.device)
    if env.client_test is None or not split:  # split=False: not the global model (a client's, of a set dealt out)
        return metrics
    rows = Subset(env.splits.train, np.concatenate(env.client_test).tolist())  # read as the clients' rows are
    return metrics | federated_test(env, fn, rows, lambda dataset: env.loader(dataset, shuffle=False))


def federated_test(
    env: Environment,
    fn: Callable[[Tensor], Tensor],
    rows: Dataset,
    batches: Callable[[Dataset], Iterable[tuple[Tensor, Tensor]]],
) -> dict:
    """Flower's federated evaluation of ``fn`` on every client's own test rows (``env.client_test``): ``rows`` holds
    them client after client, ``batches(dataset)`` reads a dataset in ``data.batch_size`` batches, in order.
    ``fed_test_acc`` & co. (:func:`~fl_lightning.modules.federated_evaluation.federated_scores`). On several ranks in
    a shared phase each rank evaluates its block of whole batches (:func:`rank_rows`, as the test split) and the
    rows' outcomes are gathered in rank order — the same batches, hence the numbers of one rank."""
    device = env.fabric.device
    if splits_work(env):
        parts = gathered(
            env.fabric,
            lambda: row_outcomes(fn, batches(_my_rows(env, rows, env.cfg.data.batch_size)), device=device),
            what="the clients' test rows",
            timeout_s=env.cfg.federation.collective_timeout_s,
        )
        hits, losses = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    else:
        hits, losses = row_outcomes(fn, batches(rows), device=device)
    return federated_scores(hits, losses, [len(client) for client in env.client_test])


def splits_work(env: Environment) -> bool:
    """Every rank is in this server phase together (``env.shared``, set by the engine) and there are several."""
    return env.shared and env.fabric.world_size > 1


def rank_rows(rows: int, batch_size: int, rank: int, world: int) -> range:
    """This rank's rows of a split read in the fixed batches ``[0, B), [B, 2B), …``: a contiguous block of whole
    batches (rank r gets batches ⌊b·r/N⌋ … ⌊b·(r+1)/N⌋ - 1 of the b), so every batch is one rank's and the same
    batch it is on one rank; a rank past the last batch gets no rows. The batches are dealt in blocks
    (:meth:`~fl_lightning.dealing.Deal.blocks`): the gathered blocks joined in rank order are the split in order."""
    mine = Deal(rank, world).blocks(-(-rows // batch_size))
    return range(mine.start * batch_size, min(mine.stop * batch_size, rows))


def _my_rows(env: Environment, dataset: Dataset, batch_size: int) -> Subset:
    """This rank's block of ``dataset`` (:func:`rank_rows`)."""
    fabric = env.fabric
    return Subset(dataset, list(rank_rows(len(dataset), batch_size, fabric.global_rank, fabric.world_size)))


def _under_autocast(fabric: Any, fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """``fn`` called inside ``fabric.autocast()`` (under ``*-true`` on its input in the modules' dtype)."""

    def wrapped(x: Tensor) -> Tensor:
        with fabric.autocast():
            return fn(convert_input(fabric, x))

    return wrapped


def feature_cache_folder(cfg: RunConfig) -> Path | None:
    """Where feature tables live: ``data.feature_cache`` (true: ``<output_dir>/feature_cache``, shared by
    every run of a comparison; a path; false: nowhere, each run computes its own)."""
    where = cfg.data.feature_cache
    if where is False:
        return None
    return Path(cfg.output_dir) / "feature_cache" if where is True else Path(where).expanduser()


class FrozenFeatures:
    """The frozen ``backbone``'s features of whole splits for one run, (N, d) on the CPU in dataset order.

    Computed by :func:`~fl_lightning.data.feature_cache.split_features` (the split's own fixed batches),
    read from ``data.feature_cache`` when a valid table of the same key is there, written there otherwise.
    Only for methods whose training split is not augmented. The backbone's weights are hashed once.

    Args:
        algorithm: the method (its environment, input spec and ``augment``), after ``setup``.
        backbone: the frozen feature extractor, on the rank's device.

    Example:
        >>> self._features = FrozenFeatures(self, self.backbone)  # doctest: +SKIP
        >>> H = self._features.table("train", all_ranks=True)  # (N_train, d)  # doctest: +SKIP
        >>> metrics = self._features.evaluate(head_fn)  # the test split's table, read once  # doctest: +SKIP
    """

    def __init__(self, algorithm: Algorithm, backbone: nn.Module) -> None:
        from fl_lightning.data.feature_cache import FeatureCache, state_dict_digest

        if algorithm.augment:
            raise RuntimeError(f"{type(algorithm).__name__} augments its training split: its features are not fixed")
        self.algorithm, self.backbone = algorithm, backbone.eval()
        self.weights = state_dict_digest(backbone)
        self.cache = FeatureCache(feature_cache_folder(algorithm.env.cfg))
        self._test: Tensor | None = None
        self._train: Tensor | None = None  # the training split's table, kept when the clients have test rows

    def key(self, split: Literal["train", "test"]) -> str:
        """The table's key: the weights, the module, the transform, the data set and split, the batching, the GPU."""
        from fl_lightning.data.feature_cache import accelerator_name, cache_key, targets_digest
        from fl_lightning.data.transforms import build_transform

        env = self.algorithm.env
        cfg, d = env.cfg, env.cfg.data
        targets = env.splits.train_targets if split == "train" else env.splits.test_targets
        spec = self.algorithm.input_spec()
        transform = build_transform(
            normalization=spec.normalization, image_size=spec.image_size, train=False, mean=spec.mean, std=spec.std
        )
        description = {
            "transform": repr(transform),
            "model": {
                "library": cfg.model.library,
                "name": cfg.model.name,
                "feature": cfg.model.feature,
                "overrides": cfg.model.overrides,
            },
            "dataset": {
                "name": d.name,
                "root": str(Path(d.root).expanduser().resolve()),
                "split": split,
                "split_seed": cfg.data_seed,
                "num_samples": d.num_samples,
                "rows": len(targets),
                "targets": targets_digest(targets),
            },
            "batch_size": d.batch_size,
            "precision": cfg.federation.precision,
            "device": accelerator_name(env.fabric.device),  # the GPU's name: another GPU, other round-off
        }
        if env.splits.fingerprint is not None:  # a Hugging Face data set: its content, not only its name and root
            description["dataset"]["fingerprint"] = env.splits.fingerprint
        return cache_key(self.backbone, description, weights=self.weights)

    def table(self, split: Literal["train", "test"], *, all_ranks: bool) -> Tensor:
        """The features of ``split``: ``train`` (the clients' rows) or ``test`` (the server's evaluation).

        On several ranks, when every rank calls this at the same point (``all_ranks``, or inside a phase every
        rank shares: ``env.shared``), rank 0 looks for a valid table in the cache; on a miss every rank computes
        its block of the split's batches (:func:`rank_rows`), the blocks are gathered in order on every rank (the
        rows of one rank: the same batches) and rank 0 stores the table.

        Args:
            all_ranks: every rank calls this at the same point (set-up); False: one rank alone (the server), unless
                the engine runs the phase on every rank.
        """
        from fl_lightning.data.feature_cache import split_features

        env = self.algorithm.env
        fabric, d = env.fabric, env.cfg.data
        dataset = env.splits.train if split == "train" else env.splits.test
        rows, key, cache = len(dataset), self.key(split), self.cache

        def compute(part: Dataset = dataset) -> Tensor:
            return split_features(
                self.backbone,
                part,
                batch_size=d.batch_size,
                device=fabric.device,
                autocast=fabric.autocast,
                num_workers=env.loader_settings().num_workers,
                normalize_on_device=env.loader_settings().normalize_on_device,
            )

        if fabric.world_size == 1 or not (all_ranks or env.shared):
            table = cache.get(key, rows=rows, compute=compute)
        else:
            table = self._split_table(split, key, rows, compute)
        if split == "train" and env.client_test is not None:  # read again at every evaluation: kept
            self._train = table
        return table

    def _split_table(self, split: str, key: str, rows: int, compute: Callable[[Dataset], Tensor]) -> Tensor:
        """:meth:`table` on every rank together: the cached table, or the gathered blocks (rank 0 stores them)."""
        env = self.algorithm.env
        fabric, cache, timeout_s = env.fabric, self.cache, env.cfg.federation.collective_timeout_s
        found: Tensor | None = None

        def look() -> bool:
            nonlocal found
            found = cache.load(key, rows=rows) if cache.folder is not None else None
            return found is not None

        if from_server(fabric, look, what=f"the {split} feature table's look-up", timeout_s=timeout_s):
            if fabric.global_rank != 0:
                found = cache.load(key, rows=rows)  # written before rank 0's look-up answered
            if found is not None:  # else (another node's folder): this rank computes the whole split
                cache.hits += 1
                return found
            return compute()
        cache.misses += 1
        mine = _my_rows(env, env.splits.train if split == "train" else env.splits.test, env.cfg.data.batch_size)
        blocks = gathered(
            fabric, lambda: compute(mine) if len(mine) else None, what=f"the {split} feature table's blocks", timeout_s=timeout_s
        )
        features = torch.cat([b for b in blocks if b is not None])
        if features.shape[0] != rows:
            raise RuntimeError(f"gathered {features.shape[0]} feature rows for a split of {rows}")
        if cache.folder is not None:
            from_server(
                fabric,
                lambda: cache.store(key, features),
                what=f"the {split} feature table's write",
                timeout_s=timeout_s,
                send=False,
            )
        return features

    def evaluate(self, head_fn: Callable[[Tensor], Tensor]) -> dict[str, Any]:
        """The test metrics of ``head_fn`` (features → logits) on the test split's table, read on the first call
        (the server alone evaluates: ``all_ranks=False``)."""
        if self._test is None:
            self._test = self.table("test", all_ranks=False)
        env = self.algorithm.env
        if env.client_test is not None and self._train is None:  # the clients' test rows: the train table's
            self._train = self.table("train", all_ranks=False)
        return evaluate_on_test_features(env, self._test, head_fn, self._train)


def client_feature_batches(features: Tensor, targets: Any, indices: Any, batch_size: int) -> list[tuple[Tensor, Tensor]]:
    """A client's rows of a split's feature table in the batches its DataLoader would make (client order)."""
    idx = torch.as_tensor(indices, dtype=torch.int64)
    h, y = features[idx], torch.as_tensor(targets, dtype=torch.int64)[idx]
    return list(zip(h.split(batch_size), y.split(batch_size)))


def evaluate_on_test_features(
    env: Environment, features: Tensor, head_fn: Callable[[Tensor], Tensor], train_features: Tensor | None = None
) -> dict[str, Any]:
    """:func:`evaluate_on_test` on the test split's feature table: the same batches, ``head_fn`` features → logits;
    with ``env.client_test``, also on the clients' test rows of ``train_features`` (the training split's table)."""
    dataset = TensorDataset(features, torch.as_tensor(env.splits.test_targets, dtype=torch.int64))
    batch_size = env.cfg.data.batch_size
    note("evaluation batches", -(-len(dataset) // batch_size), within="evaluation")  # dealt in blocks when shared
    if splits_work(env):  # each rank its block of the batches, the counts gathered (as evaluate_on_test)

        def mine() -> Any:
            loader = DataLoader(_my_rows(env, dataset, batch_size), batch_size=batch_size, shuffle=False)
            return eval_counts(head_fn, loader, num_classes=env.num_classes, device=env.fabric.device)

        metrics = scores(
            gathered(env.fabric, mine, what="the test split's evaluation", timeout_s=env.cfg.federation.collective_timeout_s)
        )
    else:
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=False)
        metrics = evaluate_classifier(head_fn, loader, num_classes=env.num_classes, device=env.fabric.device)
    if env.client_test is None:
        return metrics
    if train_features is None:
        raise RuntimeError("the clients' test rows need the training split's feature table")
    rows = torch.as_tensor(np.concatenate(env.client_test), dtype=torch.int64)
    targets = torch.as_tensor(env.splits.train_targets, dtype=torch.int64)[rows]
    return metrics | federated_test(
        env, head_fn, TensorDataset(train_features[rows], targets), lambda d: DataLoader(d, batch_size=batch_size, shuffle=False)
    )
