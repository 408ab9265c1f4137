"""Running a planned comparison: skip what finished, resume what was interrupted, lock each run folder, run this
process's share (or start ``--jobs`` processes of shares), and report the results (the table of every finished
run). The command line that calls it is :mod:`fl_lightning.experiments.cli`."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fl_lightning.experiments.comparison import BYTES_UP_COLUMN
from fl_lightning.experiments.plan import finished_summary, list_runs, plan_runs, record_comparison, select_shard
from fl_lightning.federation.numerics import torch_numerics

if TYPE_CHECKING:
    from fl_lightning.experiments.collector import StartupCollector
    from fl_lightning.experiments.train_args import Args

__all__ = ["run", "print_results", "on_sigterm"]

# set in the environment of a share that --jobs started (experiments/runner.py): --jobs builds the table once
JOBS_SHARE_ENV = "FL_LIGHTNING_JOBS_SHARE"


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or ``kill``'s stop), handled like Ctrl-C: the checkpoint is kept."""


def on_sigterm(signum: int, frame: object) -> None:
    """The SIGTERM handler of the CLI: raise :class:`_Terminated`."""
    raise _Terminated


def _is_primary() -> bool:
    """The process that checks and locks the run folder: rank 0 before any launch (Fabric's children and
    an external launcher's other ranks have a non-zero rank in their environment)."""
    return all(os.environ.get(k, "0") == "0" for k in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "RANK", "SLURM_PROCID"))


def run(args: Args, argv: list[str], locks: list, collector: StartupCollector | None) -> int:
    """Plan the config's runs, run this process's share of them (skipping finished ones, resuming interrupted
    ones, each run folder locked) or start ``--jobs`` processes, then report them. Returns the exit status."""
    try:
        share = _plan(args, argv, locks)
    except KeyboardInterrupt as err:
        print("fl_lightning: interrupted before the run started", file=sys.stderr)
        return _exit_status(err)
    if isinstance(share, int):  # nothing to run here: --print-config, --list-runs, --jobs, or an empty --shard
        return share
    summaries = dict(share.finished)
    started = time.monotonic()
    for k, i in enumerate(share.todo):
        share.announce(k, started)
        try:
            summaries[i] = share.run(i, collector)
        except KeyboardInterrupt as err:
            share.explain_interruption(i, err)
            return _exit_status(err)
    share.report(summaries)
    return 0


def _exit_status(interruption: KeyboardInterrupt) -> int:
    """The exit status of an interrupted command: 143 for SIGTERM (:class:`_Terminated`), 130 for Ctrl-C."""
    return 143 if isinstance(interruption, _Terminated) else 130


@dataclass
class _Share:
    """This process's share of the planned runs, ready to run: the finished ones' summaries, the ones still to run
    with whether each resumes and the lock of each this process claimed."""

    cfg: Any  # the comparison's (or the single run's) config
    runs: list  # every planned run's config
    mine: list[int]  # this process's share (indices into runs)
    finished: dict[int, dict]  # the share's runs that finished under this very config: their summaries
    todo: list[int]  # the share's runs to run, in order
    resume: dict[int, bool]  # whether each continues from its folder's checkpoint
    held: dict[int, Any]  # the run locks this process holds, released as each run finishes
    primary: bool  # the process that checks, locks and reports (see _is_primary)
    simulation: Any  # the Simulation class (imported before the first run starts)

    def announce(self, k: int, started: float) -> None:
        """The comparison's progress before its k-th run to run: run k/N, its ETA (the primary, when it logs one)."""
        run = self.runs[self.todo[k]]
        if not (self.primary and len(self.mine) > 1 and run.logging.progress):
            return
        from fl_lightning.callbacks.progress import eta_s, format_duration

        eta = eta_s(time.monotonic() - started, k, len(self.todo))
        print(
            f"fl_lightning: run {k + 1}/{len(self.todo)}{' to run' if self.finished else ''} "
            f"({len(self.finished) + k} of {len(self.mine)} done): {run.resolved_run_name}, ETA of the rest "
            f"{format_duration(eta)}",
            flush=True,
        )

    def run(self, i: int, collector: StartupCollector | None) -> dict:
        """Run ``runs[i]`` (its numerics applied from before the simulation is built), then release its lock;
        returns its summary."""
        run = self.runs[i]
        try:
            with torch_numerics(run.federation):  # before the simulation is built: CUDA reads the workspace
                summary = self.simulation(
                    cfg=run, resume=self.resume[i], callbacks=[] if collector is None else [collector]
                ).run()
        finally:
            if collector is not None:
                collector.end_run()
        if i in self.held:
            self.held[i].release()
        return summary

    def explain_interruption(self, i: int, err: KeyboardInterrupt) -> None:
        """The primary's word on an interrupted run: its checkpoint is kept, and how to continue it."""
        if not self.primary:
            return
        how = "terminated (SIGTERM)" if isinstance(err, _Terminated) else "interrupted"
        again = (
            " (or run the same command again: finished runs are not run again, this one continues)" if len(self.runs) > 1 else ""
        )
        print(
            f"fl_lightning: {how}; the checkpoint is kept: continue with "
            f"python -m fl_lightning.train --resume {self.runs[i].run_dir}{again}",
            file=sys.stderr,
        )

    def report(self, summaries: dict[int, dict]) -> None:
        """The share's results (local rank 0): one line per run, and a comparison's table of every finished run."""
        if os.environ.get("LOCAL_RANK", "0") != "0":
            return
        print_results([(self.runs[i], summaries[i]) for i in self.mine])
        # a comparison: methods × α, mean ± std over seeds, of every finished run (all shares); a share that --jobs
        # started leaves it to --jobs, which builds it once every share has ended
        if len(self.runs) > 1 and not os.environ.get(JOBS_SHARE_ENV):
            from fl_lightning.experiments.comparison import collect, write_table

            write_table(*collect(self.runs, summaries), self.cfg.output_dir)


def _plan(args: Args, argv: list[str], locks: list) -> _Share | int:
    """The config's runs and this process's share of them, claimed (:func:`_claim_share`); or the exit status where
    this process runs none: ``--print-config``, ``--list-runs``, ``--jobs`` (its processes run them), an empty share."""
    from fl_lightning.config.loading import dump_config
    from fl_lightning.errors import ConfigError

    cfg, recorded = _load_config(args)
    if args.print_config:
        print(dump_config(_printable(cfg)), end="")
        return 0
    runs = plan_runs(cfg)

    mine = list(range(len(runs))) if args.shard is None else select_shard(range(len(runs)), *args.shard)
    if args.list_runs:
        list_runs(runs, mine)
        return 0
    if any(run.partition.num_clients is None for run in runs):  # natural: one client per value, read from the data
        from fl_lightning.federation.num_clients import resolve_runs

        runs = resolve_runs(runs)
    if len(mine) > 1 and cfg.federation.devices * cfg.federation.num_nodes > 1:
        raise ConfigError(
            "variants",
            f"{len(mine)} runs",
            f"a single run when federation.devices > 1 (launch one process group per run: --shard I/{len(runs)}, "
            "docs/usage.md 'Several GPUs per run')",
        )
    if args.jobs is not None and _is_primary():
        return _run_jobs(args, argv, cfg, runs)
    if not mine:
        print(f"fl_lightning: --shard {args.shard[0]}/{args.shard[1]} holds no run ({len(runs)} run(s) in all)", file=sys.stderr)
        return 0
    return _claim_share(args, argv, locks, cfg=cfg, runs=runs, mine=mine, recorded=recorded)


def _printable(cfg: Any) -> Any:
    """``cfg`` as a run resolves it: a natural partition's ``num_clients: null`` read from the data (one client per
    value of ``partition.by``) where the data can be read, else left null with a line on stderr saying so."""
    if cfg.partition.num_clients is None:
        from fl_lightning.errors import UsageError
        from fl_lightning.federation.num_clients import resolve_num_clients

        try:
            return resolve_num_clients(cfg)
        except UsageError as err:
            print(f"fl_lightning: partition.num_clients stays null here (a run reads it from the data): {err}", file=sys.stderr)
    return cfg


def _load_config(args: Args) -> tuple[Any, dict | None]:
    """The config to run and, with ``--resume``, the run's recorded config (None for a folder written before
    records): the folder's config.yaml, checked, pinned to that folder, under the values of keys added since."""
    from fl_lightning.config.history import added_key_overrides
    from fl_lightning.config.loading import load_config
    from fl_lightning.config.yaml_io import read_yaml

    config_path, overrides, recorded = args.config, list(args.overrides), None
    if args.resume is not None:
        run_dir = Path(args.resume)
        recorded = _check_resume_folder(run_dir)
        # the run keeps its folder: output_dir/run_name are pinned to where it is
        overrides = [*overrides, "--output_dir", str(run_dir.parent), "--run_name", run_dir.name]
        config_path = str(run_dir / "config.yaml")
        # a folder written before a key existed resumes under the value it ran with, not today's default
        overrides = [*added_key_overrides(recorded if recorded is not None else read_yaml(config_path)), *overrides]
    return load_config(config_path, overrides), recorded


def _claim_share(
    args: Args, argv: list[str], locks: list, *, cfg: Any, runs: list, mine: list[int], recorded: dict | None
) -> _Share:
    """Skip the share's finished runs; on the primary, check every run still to run, then lock and claim each
    folder, and record a comparison's config. Returns the share, ready to run."""
    primary = _is_primary()
    # the same command again: a run that finished under this very config is not run again (every rank
    # sees the same folder, so no rank launches for it); --overwrite and --resume always run
    finished = (
        {} if args.overwrite or args.resume is not None else {i: s for i in mine if (s := finished_summary(runs[i])) is not None}
    )
    todo = [i for i in mine if i not in finished]
    resume = {i: args.resume is not None for i in todo}
    held = {}  # a run's lock, released when it has finished (a killed comparison leaves none on those)
    if primary and todo:
        from fl_lightning.preflight import preflight

        preflight([runs[i] for i in todo])  # every run still to run, before the first one starts
        for i in todo:
            resume[i] = _claim_run_folder(runs[i], args, recorded, argv, locks)
            held[i] = locks[-1]
    if primary and len(runs) > 1:  # the comparison's own config: which runs it has (experiments/plan.py);
        record_comparison(cfg)  # written even when every run finished already (under a narrower --sweep)
    if finished and primary:
        print(
            f"fl_lightning: {len(finished)} of {len(mine)} run(s) finished already with this config, not run "
            f"again: {', '.join(runs[i].resolved_run_name for i in finished)}",
            file=sys.stderr,
        )
    simulation = None
    if todo:  # imported before the first run: an interruption here is one before the run started
        from fl_lightning.federation.simulation import Simulation as simulation
    return _Share(cfg, runs, mine, finished, todo, resume, held, primary, simulation)


def _run_jobs(args: Args, argv: list[str], cfg: object, runs: list) -> int:
    """``--jobs N``: the comparison as N processes of this command, each ``--shard i/N`` (checked here first, so a
    bad run stops before any starts); then the table of every finished run. Exit status: the worst of theirs."""
    import subprocess

    from fl_lightning.cores import core_shares
    from fl_lightning.experiments.comparison import collect, write_table
    from fl_lightning.preflight import preflight

    todo = [r for r in runs if args.overwrite or finished_summary(r) is None]
    if todo:
        preflight(todo)
    n = min(args.jobs, max(len(todo), 1))
    child_argv = [
        a for k, a in enumerate(argv) if a != "--jobs" and not a.startswith("--jobs=") and not (k > 0 and argv[k - 1] == "--jobs")
    ]
    gpus = _visible_gpus() if cfg.federation.accelerator in ("auto", "gpu", "cuda") else []
    # each job its own cores (its threads and its loader workers: data.num_workers auto counts them), on GPUs too
    shares = core_shares(sorted(os.sched_getaffinity(0)), n) if hasattr(os, "sched_getaffinity") else None
    procs, relays = [], []
    try:
        for i in range(n):
            env = dict(os.environ)
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = gpus[i % len(gpus)]
            cores = None if shares is None else shares[i]
            env.setdefault("OMP_NUM_THREADS", str(len(cores) if cores else max(1, (os.cpu_count() or 1) // n)))
            env[JOBS_SHARE_ENV] = "1"  # the table is built here, once, not by each share as it ends
            proc = subprocess.Popen(
                [sys.executable, "-m", "fl_lightning.train", *child_argv, "--shard", f"{i}/{n}"],
                env=env,
                preexec_fn=_pinned_to(cores),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
            )
            relays += [_relay(proc.stdout, sys.stdout, f"[{i}/{n}] "), _relay(proc.stderr, sys.stderr, f"[{i}/{n}] ")]
            procs.append(proc)
        codes = [p.wait() for p in procs]
        for relay in relays:
            relay.join()
    except KeyboardInterrupt as err:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait()
        print("fl_lightning: interrupted; the shares keep their checkpoints: run the same command again", file=sys.stderr)
        return _exit_status(err)
    if len(runs) > 1:
        finished, missing = collect(runs)
        if finished:
            write_table(finished, missing, cfg.output_dir)
    return max(codes, default=0)


def _relay(source: Any, sink: Any, prefix: str) -> threading.Thread:
    """A thread that copies ``source``'s lines to ``sink``, each whole and led by ``prefix`` (the share it came from),
    so the shares' output does not interleave within a line."""

    def copy() -> None:
        for line in source:
            sink.write(prefix + line)
            sink.flush()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def _pinned_to(cores: list[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that gives the child process ``cores`` as its affinity mask (None: no change)."""
    if not cores:
        return None
    return lambda: os.sched_setaffinity(0, cores)


def _visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries ([] without any)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def _check_resume_folder(run_dir: Path) -> dict | None:
    """The config the run recorded when it started (None for a folder written before records), after
    checking that the folder's config.yaml was not edited in a way that changes what ran."""
    from fl_lightning.config.history import recorded_config
    from fl_lightning.config.yaml_io import read_yaml
    from fl_lightning.errors import RunFolderError, UsageError
    from fl_lightning.federation.storage.run_folder import RECORD, config_diff, format_diff, read_record

    if not (run_dir / "config.yaml").is_file():
        raise UsageError(
            f"usage error: --resume {run_dir}: no config.yaml there; pass the folder of an earlier run (<output_dir>/<run_name>)"
        )
    record = read_record(run_dir)
    if record is None:
        return None
    edited = config_diff(record["config"], read_yaml(run_dir / "config.yaml"))
    if edited:
        raise RunFolderError(
            f"run folder error: {run_dir / 'config.yaml'} was edited after the run started "
            f"({format_diff(edited)}); the completed rounds ran under the recorded values "
            f"({run_dir / RECORD}): put them back, or start a new run with --config"
        )
    # a run recorded under a method's former name resumes under its name now, and without a key added since
    # under the value it ran with
    return recorded_config(record["config"])


def _claim_run_folder(cfg: object, args: Args, recorded: dict | None, argv: list[str], locks: list) -> bool:
    """Lock the run's folder, check that this start may write there, and record the start (run.json).

    Returns whether the run continues from the folder's checkpoint: with ``--resume``, and when the folder
    holds an unfinished run of this very config (the same command again, after an interruption)."""
    from fl_lightning.config.history import added_key_overrides, recorded_config
    from fl_lightning.config.loading import config_to_dict, dump_config, load_config
    from fl_lightning.config.yaml_io import read_yaml
    from fl_lightning.durable_write import write_text_atomic
    from fl_lightning.errors import ConfigError, RunFolderError
    from fl_lightning.federation.storage.run_folder import (
        LOCK,
        clear_run_folder,
        completed_rounds,
        config_diff,
        format_diff,
        is_run_folder,
        read_record,
        write_record,
    )
    from fl_lightning.federation.storage.run_lock import RunLock

    run_dir: Path = cfg.run_dir
    lock = RunLock(run_dir)
    lock.acquire()
    locks.append(lock)
    current = config_to_dict(cfg)
    if args.resume is not None:
        if recorded is None:  # a folder from before run.json: its config.yaml (resolved) is the record
            recorded = config_to_dict(
                load_config(run_dir / "config.yaml", added_key_overrides(read_yaml(run_dir / "config.yaml")))
            )
        changed = config_diff(recorded, current)
        if changed:
            raise RunFolderError(
                f"run folder error: --resume cannot change {format_diff(changed)}: the completed "
                f"rounds ran under the recorded values; only federation.rounds, "
                f"federation.devices, the failure policy and logging.* may change on resume; "
                f"start a new run (another --run_name) for other settings"
            )
        done = completed_rounds(run_dir)
        if cfg.federation.rounds < done:
            raise ConfigError(
                "federation.rounds", cfg.federation.rounds, f"at least the {done} rounds this run has already completed"
            )
    elif any(p.name != LOCK for p in run_dir.iterdir()):
        if not is_run_folder(run_dir):
            raise RunFolderError(
                f"run folder error: '{run_dir}' already holds files that are not a run's; "
                f"choose another --run_name or --output_dir"
            )
        if not args.overwrite and not _nothing_ran(run_dir):
            record = read_record(run_dir)
            before = recorded_config(
                record["config"]
                if record
                else (read_yaml(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else {})
            )
            differs = config_diff(before, current, include_resumable=True)
            if not differs:  # the same command after an interruption (a finished run is not claimed at all)
                write_record(run_dir, current, resumed=True, argv=argv)
                write_text_atomic(run_dir / "config.yaml", dump_config(cfg))
                return True
            what = f"a different run ({format_diff(differs)})" if differs else "this run already"
            hint = " (continue it with --resume instead)" if not config_diff(before, current) else ""
            raise RunFolderError(
                f"run folder error: '{run_dir}' holds {what}; pass --overwrite to delete it and "
                f"start afresh{hint}, or choose another --run_name / --output_dir"
            )
        clear_run_folder(run_dir)
    write_record(run_dir, current, resumed=args.resume is not None, argv=argv)
    write_text_atomic(run_dir / "config.yaml", dump_config(cfg))
    return args.resume is not None


# what a run makes before its first round is recorded: the server's round 0 of the synthetic family (the images,
# the pre-training's epochs and best checkpoint, the pilots) and the checkpoints; prompts.json is the LLM's output
_WORK_FOLDERS = ("checkpoints", "synthetic", "pretrain", "pilots")
_WORK_FILES = ("summary.json", "metrics.csv", "prompts.json")


def _nothing_ran(run_dir: Path) -> bool:
    """A start that failed before it made anything (e.g. a model that did not build): nothing to lose, so a new
    start may take the folder over without --overwrite. Images generated, a pre-training's epochs or prompts from
    the LLM are work, even before round 0's records reach disk: the same command continues from them."""
    if any((run_dir / name).exists() for name in _WORK_FILES):
        return False
    return not any((run_dir / name).is_dir() and any(p.is_file() for p in (run_dir / name).rglob("*")) for name in _WORK_FOLDERS)


def print_results(summaries: list) -> None:
    """One line per run (a rich table): its method as the comparison table names it (``label``), the run's name,
    accuracy, bytes each client uploaded over all rounds, wall time, run folder."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fl_lightning results")
    for column in ("method", "run", "accuracy", BYTES_UP_COLUMN, "wall time (s)", "run folder"):
        table.add_column(column)
    for cfg, s in summaries:
        accuracy = s.get("accuracy")
        table.add_row(
            cfg.label or cfg.algorithm,
            cfg.resolved_run_name,
            "-" if accuracy is None else f"{accuracy:.4f}",
            f"{s['bytes_up_per_client']:,.0f}",
            f"{s['wall_time_s']:.1f}",
            str(cfg.run_dir),
        )
    Console(width=max(Console().width, 160)).print(table)
