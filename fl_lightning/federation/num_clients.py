"""``partition.num_clients: null`` under ``partition.scheme: natural``: one client per value of ``partition.by``
(under ``scheme: file``: the file's clients).

The number of clients is read in many places before the data is (the privacy's δ < 1/K, the robust aggregators'
clients per round, the attack's and the availability trace's clients, the preflight's ``min_clients``, the synthetic
family's client profiles, the summary). So the count is resolved once, where a run's config is final and before any
of them reads it: :func:`resolve_num_clients` reads the training split's ``partition.by`` column (after the
``data.num_samples`` subset, as the partition does) and writes its number of distinct values V into the config
that everything else reads — config.yaml records V. The experiments runner resolves every planned run (a data
set read once for all the runs that share it); :class:`~fl_lightning.federation.simulation.Simulation` resolves the
config it is given (a no-op for a resolved one). Every other scheme's null is 10 from the start (the schema).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fl_lightning.data.hf import HF_PREFIX, hf_source
from fl_lightning.data.partition import partition_file_clients
from fl_lightning.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig

__all__ = ["resolve_num_clients", "resolve_runs"]


def resolve_num_clients(cfg: RunConfig, _seen: dict | None = None) -> RunConfig:
    """``cfg`` with ``partition.num_clients`` the number of distinct values of ``partition.by`` when it is null
    (scheme natural; scheme file: the file's clients); ``cfg`` itself otherwise. ``_seen``: counts already read,
    by data set and column."""
    p = cfg.partition
    if p.num_clients is not None:
        return cfg
    if p.scheme == "file":  # the file's clients
        try:
            count = partition_file_clients(p.path)
        except ValueError as err:
            raise UsageError(f"config error: partition.path: {err}") from None
        return dataclasses.replace(cfg, partition=dataclasses.replace(p, num_clients=count))
    if not (cfg.data.name == "hf" or cfg.data.name.startswith(HF_PREFIX)):  # the same line as partition_for's
        raise ConfigError(
            "partition.scheme",
            p.scheme,
            f"a scheme other than 'natural' for data.name "
            f"{cfg.data.name!r} (it has no columns besides its labels; natural needs data.name: hf)",
        )
    key = (repr(cfg.data), cfg.data_seed, p.by)
    if _seen is None or key not in _seen:
        from fl_lightning.data.registry import build_dataset

        d = cfg.data
        splits = build_dataset(
            d.name, root=d.root, download=d.download, seed=cfg.data_seed, num_samples=d.num_samples, source=hf_source(d)
        )
        count = int(np.unique(splits.train_column(p.by)).size)
        if _seen is not None:
            _seen[key] = count
    else:
        count = _seen[key]
    return dataclasses.replace(cfg, partition=dataclasses.replace(p, num_clients=count))  # checked again: δ < 1/K


def resolve_runs(runs: Sequence[RunConfig]) -> list[RunConfig]:
    """:func:`resolve_num_clients` of every run, each data set's column read once."""
    seen: dict = {}
    return [resolve_num_clients(cfg, seen) for cfg in runs]
