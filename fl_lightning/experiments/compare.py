"""A comparison's table from what is on disk: which of its runs have finished, and the table of those.

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

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fl_lightning.experiments.plan import COMPARISON_CONFIG, finished_summary

__all__ = ["collect", "write_table", "main"]


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
    from fl_lightning.experiments.comparison import write_comparison

    paths = write_comparison(finished, out_dir, missing=[run.resolved_run_name for run in missing])
    print("comparison: " + ", ".join(str(p) for p in paths.values()))
    logged = [run for run, _ in finished if run.logging.wandb]
    if logged:  # the table and the plot, once per comparison, in a W&B run of its own
        from fl_lightning.callbacks.wandb_logging import log_comparison
        from fl_lightning.experiments.comparison import comparison_rows

        log_comparison(logged[0], comparison_rows(finished), paths["png"], Path(out_dir))
    if missing:
        names = ", ".join(run.resolved_run_name for run in missing)
        print(f"fl_lightning: the table holds {len(finished)} of {len(finished) + len(missing)} runs; not finished "
              f"yet: {names}", file=sys.stderr)
    return paths


def _runs_in(out_dir: Path) -> tuple[list[Any], bool]:
    """The comparison's runs (from its comparison.yaml, located in ``out_dir``), or those found in its folders;
    and whether the list is the comparison's own (so that runs not there are missing)."""
    from fl_lightning.config_loading import load_config
    from fl_lightning.config_variants import expand_variants

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
    from fl_lightning.experiments.command import run_command

    return run_command(_compare, argv, usage="usage: python -m fl_lightning.compare DIR   (DIR: a comparison's "
                                             "output_dir)")


def _compare(argv: list[str]) -> int:
    from fl_lightning.errors import UsageError

    if len(argv) != 1 or argv[0].startswith("-"):
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
