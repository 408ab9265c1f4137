"""A run's set-up on one rank, before its first round: the method built, the data read and transformed as the
method's input spec asks, the clients' partition and own test rows cut, the update policies built with the clients'
sizes, and the environment the method reads all of it through."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from fl_lightning.data.hf import hf_source
from fl_lightning.data.partition import natural_grouping_note
from fl_lightning.data.preprocessed import PreprocessedSplit, is_deterministic
from fl_lightning.data.registry import DatasetSplits, build_dataset
from fl_lightning.data.transforms import build_transform
from fl_lightning.federation.algorithm import ALGORITHMS, Algorithm, Environment
from fl_lightning.federation.policies.order import PolicyChain
from fl_lightning.federation.policies.policy import PolicySetup
from fl_lightning.federation.run_data import check_client_test, client_test_split, partition_for

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from fl_lightning.config import RunConfig

__all__ = ["set_up_run"]


def set_up_run(cfg: RunConfig, fabric: Fabric) -> tuple[Algorithm, Environment, PolicyChain]:
    """This rank's method (built once: its shared model), the run's data and partition, the update policies and
    the :class:`~fl_lightning.federation.algorithm.Environment` the method reads them through."""
    algorithm = ALGORITHMS[cfg.algorithm](cfg=cfg)
    algorithm.fabric = fabric  # the rank's Fabric, given before anything is built (Algorithm.fabric)
    algorithm.build(fabric)  # the shared model, once per rank
    spec = algorithm.input_spec()
    transform = {"normalization": spec.normalization, "image_size": spec.image_size, "mean": spec.mean, "std": spec.std}
    train_transform = build_transform(**transform, train=algorithm.augment, augmentation=spec.augmentation)
    test_transform = build_transform(**transform, train=False)
    splits: DatasetSplits = build_dataset(
        cfg.data.name,
        root=cfg.data.root,
        download=cfg.data.download,
        seed=cfg.data_seed,
        num_samples=cfg.data.num_samples,
        train_transform=train_transform,
        test_transform=test_transform,
        source=hf_source(cfg.data),
    )
    # each split its own budgets: the float32 store (cache_mb) and the uint8 one (cache_uint8_mb)
    budgets = {"budget_bytes": cfg.data.cache_mb << 20, "uint8_budget_bytes": cfg.data.cache_uint8_mb << 20}
    if any(budgets.values()) and is_deterministic(train_transform):  # augmentation still runs per item
        splits.train = PreprocessedSplit(splits.train, **budgets)
    if any(budgets.values()) and is_deterministic(test_transform):
        splits.test = PreprocessedSplit(splits.test, **budgets)
    partition = partition_for(cfg, splits.train_targets, splits.train_column)
    check_client_test(cfg, algorithm)  # built: its augment is known
    partition, client_test = client_test_split(cfg, partition, splits.train_targets, splits.train_column)
    if cfg.partition.scheme == "natural" and fabric.global_rank == 0:  # never silent: grouped or one client
        note = natural_grouping_note(splits.train_column(cfg.partition.by), cfg.partition.num_clients, cfg.partition.by)
        if note is not None:
            print(f"fl_lightning: {note}", file=sys.stderr, flush=True)
    policies = PolicyChain.build(cfg, PolicySetup(algorithm.num_rounds, [len(p) for p in partition]))
    privacy, attack = policies.get("privacy"), policies.get("attack")
    env = Environment(
        fabric,
        cfg,
        splits,
        partition,
        cfg.run_dir,
        privacy,
        one_train_loader=is_deterministic(train_transform),
        label_maps=attack.label_maps(len(splits.classes)) if attack is not None else {},
        client_test=client_test,
    )
    algorithm.setup(env)
    return algorithm, env, policies
