"""Command-line entry: ``python -m fl_lightning.train --config FILE [--section.key value ...]``.

Other forms:
    --print-config      print the resolved config (YAML) and exit
    --resume RUN_DIR    continue an interrupted run from its folder (its config.yaml and checkpoints)

Exit status: 0 on success; 2 for a usage or config error (one line on stderr, no traceback);
1 for anything else.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["main", "parse_args"]

_USAGE = ("usage: python -m fl_lightning.train --config FILE [--section.key VALUE ...] [--print-config]\n"
          "       python -m fl_lightning.train --resume RUN_DIR [--federation.devices N ...]")


def parse_args(argv: list[str]) -> tuple[str | None, str | None, bool, list[str]]:
    """Split argv into (config path, resume dir, print-config flag, dotted overrides)."""
    from fl_lightning.errors import UsageError

    config = resume = None
    print_config = False
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("--config", "--resume"):
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"usage error: {name} needs a value")
                value, i = argv[i + 1], i + 1
            config, resume = (value, resume) if name == "--config" else (config, value)
        elif arg == "--print-config":
            print_config = True
        elif arg in ("-h", "--help"):
            print(_USAGE)
            raise SystemExit(0)
        else:
            rest.append(arg)
        i += 1
    if config is None and resume is None:
        raise UsageError("usage error: --config FILE (or --resume RUN_DIR) is required; see conf/ for examples")
    return config, resume, print_config, rest


def main(argv: list[str] | None = None) -> int:
    from fl_lightning.errors import UsageError

    try:
        config_path, resume, print_config, overrides = parse_args(sys.argv[1:] if argv is None else argv)
        from fl_lightning.config import dump_config, expand_variants, load_config
        from fl_lightning.errors import ConfigError

        if resume is not None:
            run_dir = Path(resume)
            if not (run_dir / "config.yaml").is_file():
                raise UsageError(f"usage error: --resume {resume}: no config.yaml there; pass the folder of an "
                                 f"earlier run (<output_dir>/<run_name>)")
            # the run keeps its folder: output_dir/run_name are pinned to where it is
            overrides = [*overrides, "--output_dir", str(run_dir.parent), "--run_name", run_dir.name]
            config_path = str(run_dir / "config.yaml")
        cfg = load_config(config_path, overrides)
        if print_config:
            print(dump_config(cfg), end="")
            return 0
        runs = expand_variants(cfg)
        if len(runs) > 1 and cfg.federation.devices * cfg.federation.num_nodes > 1:
            raise ConfigError("variants", f"{len(runs)} runs", "a single run when federation.devices > 1 "
                              "(launch one process group per run)")
        from fl_lightning.federation.simulation import Simulation

        summaries = []
        for run in runs:
            try:
                summaries.append((run, Simulation(cfg=run, resume=resume is not None).run()))
            except KeyboardInterrupt:
                print(f"fl_lightning: interrupted; the checkpoint is kept: continue with "
                      f"python -m fl_lightning.train --resume {run.run_dir}", file=sys.stderr)
                return 130
    except UsageError as err:
        print(f"fl_lightning: {err}", file=sys.stderr)
        return 2
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print_results(summaries)
    return 0


def print_results(summaries: list) -> None:
    """One line per run (a rich table): method, accuracy, bytes uploaded per client, run folder."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fl_lightning results")
    for column in ("run", "algorithm", "accuracy", "bytes up / client", "wall time (s)", "run folder"):
        table.add_column(column)
    for cfg, s in summaries:
        table.add_row(cfg.resolved_run_name, cfg.algorithm, f"{s['accuracy']:.4f}",
                      f"{s['bytes_up_per_client']:,.0f}", f"{s['wall_time_s']:.1f}", str(cfg.run_dir))
    Console(width=max(Console().width, 160)).print(table)


if __name__ == "__main__":
    sys.exit(main())
