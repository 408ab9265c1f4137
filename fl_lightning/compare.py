"""A comparison's runs on disk: which have finished, the shares of ``--shard``, and the table of what is there.

``python -m fl_lightning.compare DIR`` builds ``comparison.{csv,md,png}`` (and the curves, where the
runs have a simulated clock) in ``DIR`` — a comparison's ``output_dir`` — from whatever runs have
finished, and names those that have not: the way to see a comparison spread over jobs or GPUs
(``--shard I/N``) while it runs, or once its last share is done. ``DIR/comparison.yaml`` (written
when a comparison starts) says which runs there should be; a folder from before it is read run by run
(every ``DIR/*/`` with a ``summary.json``), with no list of missing runs.

Exit status: 0 when a table was written (missing runs are named on stderr, and in ``comparison.md``);
2 when ``DIR`` holds no finished run of the comparison, or no comparison at all (one line).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["COMPARISON_CONFIG", "finished_summary", "select_shard", "parse_shard", "collect", "write_table", "main"]

COMPARISON_CONFIG = "comparison.yaml"  # the comparison's own config, in its output_dir: the list of its runs


def finished_summary(cfg: Any) -> dict[str, Any] | None:
    """The summary of the run in ``cfg.run_dir`` when that run finished under this very config (every key
    alike but where the folder is and ``logging.*``; see ``config_diff``), else None.

    Finished means: ``summary.json`` is there, and it and ``metrics.csv`` hold all the rounds the method runs
    (a run extended with ``--resume`` and stopped again keeps the shorter run's summary: not finished).
    Only reads: a finished folder is not touched.
    """
    from fl_lightning.config import config_to_dict, recorded_config
    from fl_lightning.federation.algorithm import ALGORITHMS
    from fl_lightning.federation.run_folder import completed_rounds, config_diff, read_record

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
        raise UsageError(f"usage error: --shard {text!r}: expected I/N, the I-th of N shares with 0 <= I < N "
                         f"(--shard 0/4 … --shard 3/4; under SLURM: --array=0-3 and --shard "
                         f"$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)")
    return i, n


def select_shard(items: Sequence[Any], index: int, count: int) -> list[Any]:
    """The ``index``-th of ``count`` shares of ``items``: every ``count``-th item from position ``index``.

    Dealt round-robin, so that each share gets a like mix of a comparison's methods (its runs are listed
    method by method); the shares are disjoint and together are ``items``, in order.
    """
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"a share index in [0, {count}), got {index}")
    return list(items[index::count])


def collect(runs: Sequence[Any], known: dict[int, dict[str, Any]] | None = None
            ) -> tuple[list[tuple[Any, dict[str, Any]]], list[Any]]:
    """``(finished (config, summary) pairs, unfinished configs)`` of ``runs``, in their order; ``known`` maps
    a run's position to a summary already in hand (this process ran it)."""
    known = known or {}
    finished, missing = [], []
    for i, run in enumerate(runs):
        summary = known.get(i) or finished_summary(run)
        if summary is None:
            missing.append(run)
        else:
            finished.append((run, summary))
    return finished, missing


def write_table(finished: Sequence[tuple[Any, dict[str, Any]]], missing: Sequence[Any],
                out_dir: str | Path) -> dict[str, Path]:
    """Write the comparison of the finished runs into ``out_dir`` and say on stdout/stderr what is there."""
    from fl_lightning.comparison import write_comparison

    paths = write_comparison(finished, out_dir, missing=[run.resolved_run_name for run in missing])
    print("comparison: " + ", ".join(str(p) for p in paths.values()))
    logged = [run for run, _ in finished if run.logging.wandb]
    if logged:  # the table and the plot, once per comparison, in a W&B run of its own
        from fl_lightning.callbacks.wandb_logging import log_comparison
        from fl_lightning.comparison import comparison_rows

        log_comparison(logged[0], comparison_rows(finished), paths["png"], Path(out_dir))
    if missing:
        names = ", ".join(run.resolved_run_name for run in missing)
        print(f"fl_lightning: the table holds {len(finished)} of {len(finished) + len(missing)} runs; not finished "
              f"yet: {names}", file=sys.stderr)
    return paths


def _runs_in(out_dir: Path) -> tuple[list[Any], bool]:
    """The comparison's runs (from its comparison.yaml, located in ``out_dir``), or those found in its folders;
    and whether the list is the comparison's own (so that runs not there are missing)."""
    from fl_lightning.config import expand_variants, load_config

    config = out_dir / COMPARISON_CONFIG
    if config.is_file():
        return expand_variants(load_config(config, ["--output_dir", str(out_dir)])), True
    runs = []
    for folder in sorted(p for p in out_dir.iterdir() if (p / "summary.json").is_file()):
        if (folder / "config.yaml").is_file():
            runs.append(load_config(folder / "config.yaml", ["--output_dir", str(out_dir), "--run_name", folder.name]))
    return runs, False


def main(argv: list[str] | None = None) -> int:
    """``python -m fl_lightning.compare DIR``."""
    from fl_lightning.errors import UsageError

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if len(argv) != 1 or argv[0].startswith("-"):
            if argv in (["-h"], ["--help"]):
                print("usage: python -m fl_lightning.compare DIR   (DIR: a comparison's output_dir)")
                return 0
            raise UsageError("usage error: python -m fl_lightning.compare DIR: pass one folder, a comparison's "
                             "output_dir")
        out_dir = Path(argv[0])
        if not out_dir.is_dir():
            raise UsageError(f"usage error: '{out_dir}' is not a folder; pass a comparison's output_dir")
        runs, listed = _runs_in(out_dir)
        finished, missing = collect(runs)
        if not finished:
            what = (f"none of its {len(runs)} runs has finished" if listed else
                    f"no run folder with a summary.json, and no {COMPARISON_CONFIG}")
            raise UsageError(f"usage error: '{out_dir}': {what}; nothing to tabulate yet")
        write_table(finished, missing, out_dir)
    except UsageError as err:
        print(f"fl_lightning: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
