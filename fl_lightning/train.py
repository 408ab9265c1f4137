"""Command-line entry: ``python -m fl_lightning.train --config FILE [--section.key value ...]``.

Other forms:
    --print-config      print the resolved config (YAML) and exit
    --resume RUN_DIR    continue an interrupted run from its folder (its config.yaml and checkpoints);
                        only keys that cannot change what already ran may differ (federation.rounds,
                        federation.devices, the failure policy, logging.*; see federation/run_folder.py)
    --overwrite         start afresh in a run folder that already holds a run (its files are deleted)
    --list-runs         print the runs of the config (a comparison's, in their fixed order) and their state; exit
    --shard I/N         run only the I-th of N shares of a comparison's runs (0 <= I < N): one share per job of a
                        SLURM array or per GPU; the table is built from whatever runs have finished
                        (``python -m fl_lightning.compare DIR`` rebuilds it once every share is done)
    --jobs N            run a comparison as N processes on this machine (each one --shard i/N; with GPUs, one
                        GPU each, round-robin), then build the table
    --debug             show the full traceback of the one-line errors too

A run folder is a record that is never silently changed. The same command again is safe: a run that
finished under the same config is not run again (its summary is reported, the comparison's table
rebuilt, its folder untouched); an interrupted one continues from its checkpoint, as ``--resume`` would.
A start into a folder that holds a different run stops with one line naming the keys (``--overwrite``
empties it; another ``--run_name`` keeps both), and a second run into a folder in use stops (``.lock``
names the holder; a lock of a dead process is taken over).

Exit status: 0 on success; 2 for a usage, config or resource error, found before anything runs
where it can be (one line on stderr, no traceback); 1 when the run fails while it runs (e.g. fewer
than ``federation.min_clients`` clients succeed: one line, the checkpoint is kept; the error classes
are in fl_lightning/errors.py) and for bugs (a traceback; ``--debug`` also shows the traceback of a
client that failed, not only the one line); 130 on Ctrl-C (SIGINT) and 143 on SIGTERM, both with
the checkpoint kept and the ``--resume`` command printed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fl_lightning.config import FederationConfig
    from fl_lightning.experiments.collector import StartupCollector

__all__ = ["main", "parse_args", "Args"]

_USAGE = ("usage: python -m fl_lightning.train --config FILE [--section.key VALUE ...] [--print-config] "
          "[--list-runs] [--shard I/N] [--jobs N] [--overwrite] [--debug]\n"
          "       python -m fl_lightning.train --resume RUN_DIR [--federation.rounds N ...] [--debug]")


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


def parse_args(argv: list[str]) -> Args:
    """Split argv into :class:`Args`; a repeated or contradictory option is one usage error."""
    from fl_lightning.errors import UsageError

    args = Args()
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("--config", "--resume"):
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"usage error: {name} needs a value")
                value, i = argv[i + 1], i + 1
            if getattr(args, name[2:]) is not None:
                raise UsageError(f"usage error: {name} given twice ({getattr(args, name[2:])!r} and {value!r}); "
                                 f"give it once (a config file's values can be overridden with --section.key VALUE)")
            setattr(args, name[2:], value)
        elif arg == "--print-config":
            args.print_config = True
        elif arg == "--list-runs":
            args.list_runs = True
        elif name == "--shard":
            from fl_lightning.compare import parse_shard

            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError("usage error: --shard needs a value, I/N (e.g. --shard 0/4)")
                value, i = argv[i + 1], i + 1
            if args.shard is not None:
                raise UsageError("usage error: --shard given twice; give it once")
            args.shard = parse_shard(value)
        elif name == "--jobs":
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError("usage error: --jobs needs a value, the number of processes (e.g. --jobs 4)")
                value, i = argv[i + 1], i + 1
            try:
                args.jobs = int(value)
            except ValueError:
                args.jobs = 0
            if args.jobs < 1:
                raise UsageError(f"usage error: --jobs {value!r}: expected a number of processes >= 1")
        elif arg == "--overwrite":
            args.overwrite = True
        elif arg == "--debug":
            args.debug = True
        elif arg in ("-h", "--help"):
            print(_USAGE)
            raise SystemExit(0)
        else:
            args.overrides.append(arg)
        i += 1
    if args.config is None and args.resume is None:
        raise UsageError("usage error: --config FILE (or --resume RUN_DIR) is required; see conf/ for examples")
    if args.config is not None and args.resume is not None:
        raise UsageError("usage error: --config and --resume together: a resumed run keeps its own config.yaml; "
                         "pass only --resume RUN_DIR (plus overrides such as --federation.rounds N)")
    if args.resume is not None and args.overwrite:
        raise UsageError("usage error: --overwrite and --resume together: --resume continues the run, --overwrite "
                         "would delete it; choose one")
    if args.jobs is not None and (args.shard is not None or args.resume is not None):
        raise UsageError(f"usage error: --jobs with {'--shard' if args.shard is not None else '--resume'}: --jobs "
                         f"starts the shares itself (each process one --shard i/N)")
    if args.resume is not None and args.shard is not None:
        raise UsageError("usage error: --shard and --resume together: --resume continues one run; run the "
                         "comparison's command with --shard instead (an interrupted run continues by itself)")
    pinned = [o for o in args.overrides if o.split("=")[0] in ("--output_dir", "--run_name")]
    if args.resume is not None and pinned:
        raise UsageError(f"usage error: {pinned[0].split('=')[0]} with --resume: a resumed run stays in its folder "
                         f"({args.resume})")
    return args


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or ``kill``'s stop), handled like Ctrl-C: the checkpoint is kept."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated


def _is_primary() -> bool:
    """The process that checks and locks the run folder: rank 0 before any launch (Fabric's children and
    an external launcher's other ranks have a non-zero rank in their environment)."""
    return all(os.environ.get(k, "0") == "0" for k in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "RANK",
                                                       "SLURM_PROCID"))


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> int:
    from fl_lightning.experiments.startup import fast_start, fast_start_requested

    # opt-in start-up tuning (FL_LIGHTNING_FAST_START=1): before anything imports Lightning
    collector = fast_start() if fast_start_requested() else None
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    locks: list = []
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    from fl_lightning.errors import RunFailure, UsageError

    try:
        return _main(argv, locks, collector)
    except UsageError as err:
        return _report(err, 2, debug)
    except RunFailure as err:
        return _report(err, 1, debug)
    # anything else is our bug: the traceback is the report
    finally:
        if collector is not None:
            collector.release()  # back on, whether or not a run began
        for lock in locks:
            lock.release()
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def _report(err: BaseException, status: int, debug: bool) -> int:
    """One line on stderr; with ``--debug`` the traceback first, which for a client's failure starts with the
    client's own traceback (its ``__cause__``, see :class:`fl_lightning.errors.RemoteTraceback`)."""
    if debug:
        traceback.print_exception(err)
    print(f"fl_lightning: {_one_line(str(err))}", file=sys.stderr)
    return status


def _main(argv: list[str], locks: list, collector: StartupCollector | None) -> int:
    args = parse_args(argv)
    try:
        from fl_lightning.config import added_key_overrides, dump_config, expand_variants, load_config, read_yaml
        from fl_lightning.errors import ConfigError

        config_path, overrides, recorded = args.config, list(args.overrides), None
        if args.resume is not None:
            run_dir = Path(args.resume)
            recorded = _check_resume_folder(run_dir)
            # the run keeps its folder: output_dir/run_name are pinned to where it is
            overrides = [*overrides, "--output_dir", str(run_dir.parent), "--run_name", run_dir.name]
            config_path = str(run_dir / "config.yaml")
            # a folder written before a key existed resumes under the value it ran with, not today's default
            overrides = [*added_key_overrides(recorded if recorded is not None else read_yaml(config_path)),
                         *overrides]
        cfg = load_config(config_path, overrides)
        if args.print_config:
            print(dump_config(cfg), end="")
            return 0
        runs = expand_variants(cfg)
        from fl_lightning.compare import finished_summary, select_shard

        mine = list(range(len(runs))) if args.shard is None else select_shard(range(len(runs)), *args.shard)
        if args.list_runs:
            _list_runs(runs, mine)
            return 0
        if len(mine) > 1 and cfg.federation.devices * cfg.federation.num_nodes > 1:
            raise ConfigError("variants", f"{len(mine)} runs", "a single run when federation.devices > 1 "
                              "(launch one process group per run, e.g. with --shard I/N)")
        if args.jobs is not None and _is_primary():
            return _run_jobs(args, argv, cfg, runs)
        if not mine:
            print(f"fl_lightning: --shard {args.shard[0]}/{args.shard[1]} holds no run ({len(runs)} run(s) in all)",
                  file=sys.stderr)
            return 0
        primary = _is_primary()
        # the same command again: a run that finished under this very config is not run again (every rank
        # sees the same folder, so no rank launches for it); --overwrite and --resume always run
        finished = {} if args.overwrite or args.resume is not None else {
            i: s for i in mine if (s := finished_summary(runs[i])) is not None}
        todo = [i for i in mine if i not in finished]
        resume = {i: args.resume is not None for i in todo}
        held = {}  # a run's lock, released when it has finished (a killed comparison leaves none on those)
        if primary and todo:
            from fl_lightning.preflight import preflight

            preflight([runs[i] for i in todo])  # every run still to run, before the first one starts
            for i in todo:
                resume[i] = _claim_run_folder(runs[i], args, recorded, argv, locks)
                held[i] = locks[-1]
        if primary and len(runs) > 1:  # the comparison's own config: which runs it has (fl_lightning.compare);
            _record_comparison(cfg)  # written even when every run finished already (under a narrower --sweep)
        if finished and primary:
            print(f"fl_lightning: {len(finished)} of {len(mine)} run(s) finished already with this config, not run "
                  f"again: {', '.join(runs[i].resolved_run_name for i in finished)}", file=sys.stderr)
        if todo:
            from fl_lightning.federation.simulation import Simulation
    except KeyboardInterrupt as err:
        print("fl_lightning: interrupted before the run started", file=sys.stderr)
        return 143 if isinstance(err, _Terminated) else 130

    summaries = dict(finished)
    started = time.monotonic()
    for k, i in enumerate(todo):
        run = runs[i]
        if primary and len(mine) > 1 and run.logging.progress:  # the comparison's progress: run k/N, its ETA
            from fl_lightning.callbacks.progress import eta_s, format_duration

            eta = eta_s(time.monotonic() - started, k, len(todo))
            print(f"fl_lightning: run {k + 1}/{len(todo)}{' to run' if finished else ''} "
                  f"({len(finished) + k} of {len(mine)} done): {run.resolved_run_name}, ETA of the rest "
                  f"{format_duration(eta)}", flush=True)
        try:
            try:
                with _torch_numerics(run.federation):
                    summaries[i] = Simulation(cfg=run, resume=resume[i],
                                              callbacks=[] if collector is None else [collector]).run()
            finally:
                if collector is not None:
                    collector.end_run()
            if i in held:
                held[i].release()
        except KeyboardInterrupt as err:
            if primary:
                how = "terminated (SIGTERM)" if isinstance(err, _Terminated) else "interrupted"
                again = (" (or run the same command again: finished runs are not run again, this one continues)"
                         if len(runs) > 1 else "")
                print(f"fl_lightning: {how}; the checkpoint is kept: continue with "
                      f"python -m fl_lightning.train --resume {run.run_dir}{again}", file=sys.stderr)
            return 143 if isinstance(err, _Terminated) else 130
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print_results([(runs[i], summaries[i]) for i in mine])
        if len(runs) > 1:  # a comparison: methods × α, mean ± std over seeds, of every finished run (all shares)
            from fl_lightning.compare import collect, write_table

            write_table(*collect(runs, summaries), cfg.output_dir)
    return 0


def _uses_cuda(accelerator: str) -> bool:
    """Whether ``federation.accelerator`` runs on CUDA: ``cuda``, or ``gpu``/``auto`` with CUDA available (``gpu``
    on a Mac is MPS)."""
    import torch

    return accelerator == "cuda" or (accelerator in ("gpu", "auto") and torch.cuda.is_available())


@contextlib.contextmanager
def _torch_numerics(federation: FederationConfig) -> Iterator[None]:
    """The run's process-wide torch settings, set here (the library never sets them) and restored afterwards, so
    that each run of a comparison has its own and an in-process ``main()`` leaves the process as it found it.

    * ``federation.matmul_precision``: ``torch.set_float32_matmul_precision`` on CUDA only (TF32 at "high");
      on the CPU nothing changes.
    * ``federation.deterministic``: ``torch.use_deterministic_algorithms(True)`` (an op without a deterministic
      kernel raises) and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` when unset (cuBLAS needs it for deterministic
      matmuls; read when CUDA starts, so set before the run builds anything).

    The ranks of a DDP run each start in this CLI (Fabric's ``ddp`` re-runs the command), so each sets them;
    processes created by ``ddp_spawn`` do not inherit them.
    """
    import torch

    matmul = torch.get_float32_matmul_precision()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    set_workspace = federation.deterministic and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    try:
        if _uses_cuda(federation.accelerator):
            torch.set_float32_matmul_precision(federation.matmul_precision)
        if set_workspace:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        if federation.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=False)
        yield
    finally:
        if torch.get_float32_matmul_precision() != matmul:
            torch.set_float32_matmul_precision(matmul)
        if federation.deterministic:
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        if set_workspace:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def _run_jobs(args: Args, argv: list[str], cfg: object, runs: list) -> int:
    """``--jobs N``: the comparison as N processes of this command, each ``--shard i/N`` (checked here first, so a
    bad run stops before any starts); then the table of every finished run. Exit status: the worst of theirs."""
    import subprocess

    from fl_lightning.compare import collect, finished_summary, write_table
    from fl_lightning.preflight import available_cpus, preflight

    todo = [run for run in runs if args.overwrite or finished_summary(run) is None]
    if todo:
        preflight(todo)
    n = min(args.jobs, max(len(todo), 1))
    child_argv = [a for k, a in enumerate(argv) if a != "--jobs" and not a.startswith("--jobs=")
                  and not (k > 0 and argv[k - 1] == "--jobs")]
    gpus = _visible_gpus() if cfg.federation.accelerator in ("auto", "gpu", "cuda") else []
    procs = []
    try:
        for i in range(n):
            env = dict(os.environ)
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = gpus[i % len(gpus)]
            else:
                env.setdefault("OMP_NUM_THREADS", str(max(1, available_cpus() // n)))
            procs.append(subprocess.Popen([sys.executable, "-m", "fl_lightning.train", *child_argv, "--shard",
                                           f"{i}/{n}"], env=env))
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt as err:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait()
        print("fl_lightning: interrupted; the shares keep their checkpoints: run the same command again",
              file=sys.stderr)
        return 143 if isinstance(err, _Terminated) else 130
    if len(runs) > 1:
        finished, missing = collect(runs)
        if finished:
            write_table(finished, missing, cfg.output_dir)
    return max(codes, default=0)


def _visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries ([] without any)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def _list_runs(runs: list, mine: list[int]) -> None:
    """One line per run (of this share): its place in the fixed order, its name, whether it has finished."""
    from fl_lightning.compare import finished_summary
    from fl_lightning.federation.run_folder import is_run_folder

    for i in mine:
        run = runs[i]
        state = ("finished" if finished_summary(run) is not None else
                 "started" if run.run_dir.is_dir() and is_run_folder(run.run_dir) else "not started")
        print(f"{i}\t{run.resolved_run_name}\t{state}\t{run.run_dir}")


def _record_comparison(cfg: object) -> None:
    """``<output_dir>/comparison.yaml``: the comparison's config as resolved (variants and sweep included)."""
    from fl_lightning.compare import COMPARISON_CONFIG
    from fl_lightning.config import dump_config

    path = Path(cfg.output_dir) / COMPARISON_CONFIG
    text = dump_config(cfg)
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # shares may write it at once
        tmp.write_text(text)
        os.replace(tmp, path)


def _check_resume_folder(run_dir: Path) -> dict | None:
    """The config the run recorded when it started (None for a folder written before records), after
    checking that the folder's config.yaml was not edited in a way that changes what ran."""
    from fl_lightning.config import read_yaml, recorded_config
    from fl_lightning.errors import RunFolderError, UsageError
    from fl_lightning.federation.run_folder import RECORD, config_diff, format_diff, read_record

    if not (run_dir / "config.yaml").is_file():
        raise UsageError(f"usage error: --resume {run_dir}: no config.yaml there; pass the folder of an "
                         f"earlier run (<output_dir>/<run_name>)")
    record = read_record(run_dir)
    if record is None:
        return None
    edited = config_diff(record["config"], read_yaml(run_dir / "config.yaml"))
    if edited:
        raise RunFolderError(f"run folder error: {run_dir / 'config.yaml'} was edited after the run started "
                             f"({format_diff(edited)}); the completed rounds ran under the recorded values "
                             f"({run_dir / RECORD}): put them back, or start a new run with --config")
    # a run recorded under a method's former name resumes under its name now, and without a key added since
    # under the value it ran with
    return recorded_config(record["config"])


def _claim_run_folder(cfg: object, args: Args, recorded: dict | None, argv: list[str], locks: list) -> bool:
    """Lock the run's folder, check that this start may write there, and record the start (run.json).

    Returns whether the run continues from the folder's checkpoint: with ``--resume``, and when the folder
    holds an unfinished run of this very config (the same command again, after an interruption)."""
    from fl_lightning.config import (added_key_overrides, config_to_dict, dump_config, load_config, read_yaml,
                                     recorded_config)
    from fl_lightning.errors import ConfigError, RunFolderError
    from fl_lightning.federation.run_folder import (
        LOCK,
        RunLock,
        clear_run_folder,
        completed_rounds,
        config_diff,
        format_diff,
        is_run_folder,
        read_record,
        write_record,
        write_text_atomic,
    )

    run_dir: Path = cfg.run_dir
    lock = RunLock(run_dir)
    lock.acquire()
    locks.append(lock)
    current = config_to_dict(cfg)
    if args.resume is not None:
        if recorded is None:  # a folder from before run.json: its config.yaml (resolved) is the record
            recorded = config_to_dict(load_config(run_dir / "config.yaml",
                                                  added_key_overrides(read_yaml(run_dir / "config.yaml"))))
        changed = config_diff(recorded, current)
        if changed:
            raise RunFolderError(f"run folder error: --resume cannot change {format_diff(changed)}: the completed "
                                 f"rounds ran under the recorded values; only federation.rounds, "
                                 f"federation.devices, the failure policy and logging.* may change on resume; "
                                 f"start a new run (another --run_name) for other settings")
        done = completed_rounds(run_dir)
        if cfg.federation.rounds < done:
            raise ConfigError("federation.rounds", cfg.federation.rounds,
                              f"at least the {done} rounds this run has already completed")
    elif any(p.name != LOCK for p in run_dir.iterdir()):
        if not is_run_folder(run_dir):
            raise RunFolderError(f"run folder error: '{run_dir}' already holds files that are not a run's; "
                                 f"choose another --run_name or --output_dir")
        if not args.overwrite and not _nothing_ran(run_dir):
            record = read_record(run_dir)
            before = recorded_config(record["config"] if record else (read_yaml(run_dir / "config.yaml")
                                                                      if (run_dir / "config.yaml").is_file() else {}))
            differs = config_diff(before, current, include_resumable=True)
            if not differs:  # the same command after an interruption (a finished run is not claimed at all)
                write_record(run_dir, current, resumed=True, argv=argv)
                write_text_atomic(run_dir / "config.yaml", dump_config(cfg))
                return True
            what = f"a different run ({format_diff(differs)})" if differs else "this run already"
            hint = (" (continue it with --resume instead)" if not config_diff(before, current) else "")
            raise RunFolderError(f"run folder error: '{run_dir}' holds {what}; pass --overwrite to delete it and "
                                 f"start afresh{hint}, or choose another --run_name / --output_dir")
        clear_run_folder(run_dir)
    write_record(run_dir, current, resumed=args.resume is not None, argv=argv)
    write_text_atomic(run_dir / "config.yaml", dump_config(cfg))
    return args.resume is not None


def _nothing_ran(run_dir: Path) -> bool:
    """A start that failed before any client finished (e.g. a model that did not build): nothing to lose,
    so a new start may take the folder over without --overwrite."""
    checkpoints = run_dir / "checkpoints"
    return not (run_dir / "summary.json").exists() and not (run_dir / "metrics.csv").exists() and not (
        checkpoints.is_dir() and any(p.is_file() for p in checkpoints.rglob("*")))


def print_results(summaries: list) -> None:
    """One line per run (a rich table): method, accuracy, bytes uploaded per client, run folder."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fl_lightning results")
    for column in ("run", "algorithm", "accuracy", "bytes up / client", "wall time (s)", "run folder"):
        table.add_column(column)
    for cfg, s in summaries:
        accuracy = s.get("accuracy")
        table.add_row(cfg.resolved_run_name, cfg.algorithm, "-" if accuracy is None else f"{accuracy:.4f}",
                      f"{s['bytes_up_per_client']:,.0f}", f"{s['wall_time_s']:.1f}", str(cfg.run_dir))
    Console(width=max(Console().width, 160)).print(table)


if __name__ == "__main__":
    sys.exit(main())
