"""The command line: ``python -m fl_lightning.train`` (its flags, built on :mod:`argparse`, so ``--help`` lists
them), run under the error wrapper every command of the package shares
(:func:`~fl_lightning.experiments.command.run_command`).

Exit status of every command: 0 on success; 2 for a usage, config or resource error, found before anything runs
where it can be (one line on stderr, no traceback); 1 when a run fails while it runs (e.g. fewer than
``federation.min_clients`` clients succeed: one line, the checkpoint is kept; the error classes are in
fl_lightning/errors.py) and for bugs (a traceback; ``--debug`` also shows the traceback of a client that
failed); 130 on Ctrl-C (SIGINT) and 143 on SIGTERM, both with the checkpoint kept and the ``--resume`` command
printed. docs/usage.md says what a run folder guarantees.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import threading
from collections.abc import Sequence

from fl_lightning.experiments.command import CommandParser, run_command
from fl_lightning.experiments.train_args import Args

__all__ = ["build_parser", "parse_args", "main"]

_PROG = "python -m fl_lightning.train"


class _Once(argparse.Action):
    """An option that may be given once: a second one is a usage error naming both values."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option_string: str | None = None
    ) -> None:
        from fl_lightning.errors import UsageError

        if getattr(namespace, self.dest) is not None:
            hint = (
                " (a config file's values can be overridden with --section.key VALUE)"
                if self.dest in ("config", "resume")
                else ""
            )
            raise UsageError(
                f"usage error: {option_string} given twice ({getattr(namespace, self.dest)!r} and {values!r}); give it once{hint}"
            )
        setattr(namespace, self.dest, values)


def _shard(text: str) -> tuple[int, int]:
    from fl_lightning.experiments.plan import parse_shard

    return parse_shard(text)


def _jobs(text: str) -> int:
    from fl_lightning.errors import UsageError

    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise UsageError(f"usage error: --jobs {text!r}: expected a number of processes >= 1")
    return jobs


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m fl_lightning.train``; every other ``--section.key VALUE`` is a config override."""
    parser = CommandParser(
        _PROG,
        usage=f"{_PROG} --config FILE [--section.key VALUE ...] [flags]\n"
        f"       {_PROG} --resume RUN_DIR [--federation.rounds N ...] [--debug]",
        description="Run a federated simulation, or a comparison of them (a config's variants × sweep), each in "
        "its own run folder. Any config key is overridden as --section.key VALUE (YAML syntax).",
        epilog="The same command again is safe: a run that finished under the same config is not run again, an "
        "interrupted one continues from its checkpoint. Exit status: 0 success, 2 usage or config error "
        "(one line), 1 a run that failed, 130/143 interrupted (checkpoint kept). See docs/usage.md.",
        example=f"{_PROG} --config conf/quickstart.yaml --federation.rounds 2\n"
        f"{_PROG} --config conf/fedopal_table2_tiny.yaml --list-runs",
    )
    parser.add_argument("--config", metavar="FILE", action=_Once, default=None, help="the YAML config to run")
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        action=_Once,
        default=None,
        help="continue an interrupted run from its folder (its config.yaml and checkpoints); only "
        "keys that cannot change what already ran may differ (federation.rounds, "
        "federation.devices, the failure policy, logging.*)",
    )
    parser.add_argument("--print-config", action="store_true", help="print the resolved config (YAML) and exit")
    parser.add_argument(
        "--list-runs",
        action="store_true",
        help="print the runs of the config (a comparison's, in their fixed order) and their state",
    )
    parser.add_argument(
        "--shard",
        metavar="I/N",
        type=_shard,
        action=_Once,
        default=None,
        help="run only the I-th of N shares of a comparison's runs (0 <= I < N): one share per job "
        "of a SLURM array or per GPU; python -m fl_lightning.compare DIR rebuilds the table",
    )
    parser.add_argument(
        "--jobs",
        metavar="N",
        type=_jobs,
        action=_Once,
        default=None,
        help="run a comparison as N processes on this machine (each one --shard i/N; with GPUs one "
        "GPU each, round-robin), then build the table",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="start afresh in a run folder that already holds a run (its files are deleted)"
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback of the one-line errors too")
    return parser


def parse_args(argv: Sequence[str]) -> Args:
    """Split argv into :class:`Args`; a repeated or contradictory option is one usage error."""
    from fl_lightning.errors import UsageError

    known, overrides = build_parser().parse_known_args(_joined(argv))
    # every field but the overrides is the parser's option of that name (build_parser's dests)
    flags = {f.name: getattr(known, f.name) for f in dataclasses.fields(Args) if f.name != "overrides"}
    args = Args(**flags, overrides=overrides)
    if args.config is None and args.resume is None:
        raise UsageError("usage error: --config FILE (or --resume RUN_DIR) is required; see conf/ for examples")
    if args.config is not None and args.resume is not None:
        raise UsageError(
            "usage error: --config and --resume together: a resumed run keeps its own config.yaml; "
            "pass only --resume RUN_DIR (plus overrides such as --federation.rounds N)"
        )
    if args.resume is not None and args.overwrite:
        raise UsageError(
            "usage error: --overwrite and --resume together: --resume continues the run, --overwrite would delete it; choose one"
        )
    if args.jobs is not None and (args.shard is not None or args.resume is not None):
        raise UsageError(
            f"usage error: --jobs with {'--shard' if args.shard is not None else '--resume'}: --jobs "
            f"starts the shares itself (each process one --shard i/N)"
        )
    if args.resume is not None and args.shard is not None:
        raise UsageError(
            "usage error: --shard and --resume together: --resume continues one run; run the "
            "comparison's command with --shard instead (an interrupted run continues by itself)"
        )
    pinned = [o for o in args.overrides if o.split("=")[0] in ("--output_dir", "--run_name")]
    if args.resume is not None and pinned:
        raise UsageError(
            f"usage error: {pinned[0].split('=')[0]} with --resume: a resumed run stays in its folder ({args.resume})"
        )
    return args


_VALUED = ("--config", "--resume", "--shard", "--jobs")


def _joined(argv: Sequence[str]) -> list[str]:
    """``--shard -1/4`` as ``--shard=-1/4``: a flag's value is the next word whatever it looks like (argparse
    would take ``-1/4`` for an option and refuse it without saying why)."""
    out, words = [], list(argv)
    i = 0
    while i < len(words):
        if words[i] in _VALUED and i + 1 < len(words):
            out.append(f"{words[i]}={words[i + 1]}")
            i += 2
        else:
            out.append(words[i])
            i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fl_lightning.train``: parse, then plan, run and report (:mod:`fl_lightning.experiments.runner`)
    with SIGTERM handled as Ctrl-C and the run folders' locks released at the end."""
    from fl_lightning.experiments.startup import fast_start, fast_start_requested

    # opt-in start-up tuning (FL_LIGHTNING_FAST_START=1): before anything imports Lightning
    collector = fast_start() if fast_start_requested() else None
    locks: list = []
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = None
    if in_main_thread:
        from fl_lightning.experiments.runner import on_sigterm

        previous = signal.signal(signal.SIGTERM, on_sigterm)

    def body(args_: list[str]) -> int:
        from fl_lightning.experiments.runner import run

        return run(parse_args(args_), args_, locks, collector)

    try:
        return run_command(body, argv)
    finally:
        if collector is not None:
            collector.release()  # back on, whether or not a run began
        for lock in locks:
            lock.release()
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
