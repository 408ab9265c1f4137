"""Planning a comparison's runs: the runs a config expands to (variants × sweep), the shares of ``--shard I/N``,
which runs have finished already, and the comparison's own record of its runs (``comparison.yaml``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fl_lightning.dealing import Deal
from fl_lightning.durable_write import write_text_atomic

__all__ = ["COMPARISON_CONFIG", "plan_runs", "finished_summary", "parse_shard", "select_shard", "list_runs", "record_comparison"]

COMPARISON_CONFIG = "comparison.yaml"  # the comparison's own config, in its output_dir: the list of its runs


def plan_runs(cfg: Any) -> list[Any]:
    """The runs of ``cfg`` in their fixed order: one per variant × sweep point (one when it has neither)."""
    from fl_lightning.config.variants import expand_variants

    return expand_variants(cfg)


def finished_summary(cfg: Any) -> dict[str, Any] | None:
    """The summary of the run in ``cfg.run_dir`` when that run finished under this very config (every key
    alike but where the folder is and ``logging.*``; see ``config_diff``), else None.

    Finished means: ``summary.json`` is there, and it and ``metrics.csv`` hold all the rounds the method runs
    (a run extended with ``--resume`` and stopped again keeps the shorter run's summary: not finished).
    Only reads: a finished folder is not touched.
    """
    from fl_lightning.config.history import recorded_config
    from fl_lightning.config.loading import config_to_dict
    from fl_lightning.federation.algorithm import ALGORITHMS
    from fl_lightning.federation.storage.run_folder import completed_rounds, config_diff, read_record

    run_dir = Path(cfg.run_dir)
    if not (run_dir / "summary.json").is_file():
        return None
    record = read_record(run_dir)
    if record is None or config_diff(recorded_config(record["config"]), config_to_dict(cfg), include_resumable=True):
        return None  # a folder from before records, or another run: claiming it says so
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    rounds = ALGORITHMS[cfg.algorithm](cfg=cfg).num_rounds
    if not isinstance(summary, dict) or summary.get("rounds") != rounds or completed_rounds(run_dir) != rounds:
        return None
    return summary


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` → ``(I, N)`` with ``0 <= I < N``; anything else is one usage error."""
    from fl_lightning.errors import UsageError

    index, slash, count = str(text).partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = -1, 0
    if not slash or n < 1 or not 0 <= i < n:
        raise UsageError(
            f"usage error: --shard {text!r}: expected I/N, the I-th of N shares with 0 <= I < N "
            f"(--shard 0/4 … --shard 3/4; under SLURM: --array=0-3 and --shard "
            f"$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)"
        )
    return i, n


def select_shard(items: Sequence[Any], index: int, count: int) -> list[Any]:
    """The ``index``-th of ``count`` shares of ``items``: every ``count``-th item from position ``index``.

    Dealt in turn (:meth:`~fl_lightning.dealing.Deal.strided`; ``--jobs N`` runs the shares ``0/N … N-1/N``), so
    that each share gets a like mix of a comparison's methods (its runs are listed method by method); the shares are
    disjoint and together are ``items``, in order.
    """
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"a share index in [0, {count}), got {index}")
    return [items[i] for i in Deal(index, count).strided(len(items))]


def list_runs(runs: Sequence[Any], mine: Sequence[int]) -> None:
    """One line per run (of this share): its place in the fixed order, its name, whether it has finished."""
    from fl_lightning.federation.storage.run_folder import is_run_folder

    for i in mine:
        run = runs[i]
        state = (
            "finished"
            if finished_summary(run) is not None
            else "started"
            if run.run_dir.is_dir() and is_run_folder(run.run_dir)
            else "not started"
        )
        print(f"{i}\t{run.resolved_run_name}\t{state}\t{run.run_dir}")


def record_comparison(cfg: Any) -> None:
    """``<output_dir>/comparison.yaml``: the comparison's config as resolved (variants and sweep included)."""
    from fl_lightning.config.loading import dump_config

    path = Path(cfg.output_dir) / COMPARISON_CONFIG
    text = dump_config(cfg)
    if not path.is_file() or path.read_text() != text:
        write_text_atomic(path, text)  # shares may write it at once: each its own temp file
