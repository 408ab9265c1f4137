"""``python -m fl_lightning.train``'s command line as the runner reads it (parsed by :mod:`fl_lightning.experiments.cli`)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Args"]


@dataclass
class Args:
    """The command line, split: the config (or the run to resume), flags, and ``--section.key value`` overrides."""

    config: str | None = None
    resume: str | None = None
    print_config: bool = False
    overwrite: bool = False
    debug: bool = False
    list_runs: bool = False
    shard: tuple[int, int] | None = None  # (I, N): the I-th of N shares of the runs
    jobs: int | None = None  # run the shares as this many local processes
    overrides: list[str] = field(default_factory=list)
