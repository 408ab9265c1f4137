"""The CLI with two test methods whose server phase sleeps or fails, for tests/federation/test_rank_safety.py.

``python tests/federation/rank_safety_job.py OUT_DIR CLI_ARGS...`` registers the methods, then runs
``fl_lightning.train.main(CLI_ARGS)``, as a user's ``python -m fl_lightning.train`` would. Fabric's launcher
starts rank 1 by running this same command again (torchrun starts both), so every rank knows the methods.
Each rank writes its stderr to ``OUT_DIR/rank<R>.err``, its pid to ``rank<R>.pid`` and its exit status to
``rank<R>.rc``; the failing method writes the time it raised to ``raised``.

* ``test_slow_server``: FedAvg whose aggregate first sleeps ``FL_TEST_SERVER_SLEEP_S`` seconds.
* ``test_failing_server``: FedAvg whose aggregate raises a :class:`MissingResourceError` (a usage error: one
  line, exit status 2).
* ``test_failing_records``: FedAvg whose rank 1 cannot save its clients' records (its record step raises):
  ``FL_TEST_RECORD_ERROR=disk`` a :class:`DiskFullError` (a usage error), ``io`` an ``OSError`` (not ours).

``FL_TEST_FAILING_HOOK=HOOK:R`` (e.g. ``on_round_end:1``) adds a callback whose ``HOOK`` raises on rank ``R``:
on rank 0 a :class:`MissingResourceError` (a usage error: one line, exit status 2), on another rank a
``ValueError`` (not ours).

``FL_TEST_SIGNAL_HOOK=HOOK:R:SIGNAL`` (e.g. ``on_round_start:1:SIGSTOP``) adds a callback whose ``HOOK`` sends
``SIGNAL`` to rank ``R``'s own process (a rank frozen, or killed, where it stands); the time goes to ``raised``.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

OUT = Path(sys.argv[1])
RANK = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
OUT.mkdir(parents=True, exist_ok=True)
_err = open(OUT / f"rank{RANK}.err", "w")  # noqa: SIM115 — this process's stderr until it exits
os.dup2(_err.fileno(), 2)
sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
(OUT / f"rank{RANK}.pid").write_text(str(os.getpid()))

import fl_lightning.callbacks  # noqa: E402 — imported before torchrun's ranks meet
from fl_lightning.algorithms.fedavg import FedAvg  # noqa: E402
from fl_lightning.errors import DiskFullError, MissingResourceError  # noqa: E402
from fl_lightning.federation.algorithm import register  # noqa: E402
from fl_lightning.federation.storage.round_store import RoundStore  # noqa: E402
from fl_lightning.train import main  # noqa: E402


@register("test_slow_server")
class _SlowServer(FedAvg):
    def aggregate(self, *args, **kwargs):
        time.sleep(float(os.environ["FL_TEST_SERVER_SLEEP_S"]))
        return super().aggregate(*args, **kwargs)


@register("test_failing_server")
class _FailingServer(FedAvg):
    def aggregate(self, *args, **kwargs):
        (OUT / "raised").write_text(repr(time.time()))
        raise MissingResourceError("the server's test weights are not on disk: /nowhere/weights.pt")


def _cannot_save(self, client, record, upload):
    (OUT / "raised").write_text(repr(time.time()))
    if os.environ["FL_TEST_RECORD_ERROR"] == "disk":
        raise DiskFullError(
            f"no space left for client {client}'s record in /full/disk (needs 1 MB, 0 B free)", "/full/disk", 1 << 20, 0
        )
    raise OSError(5, "Input/output error", f"/flaky/mount/client{client}.pt")


@register("test_failing_records")
class _FailingRecords(FedAvg):
    def setup(self, env):
        super().setup(env)
        if env.fabric.global_rank == 1:  # rank 1's record step raises; rank 0's works
            RoundStore.save_client = _cannot_save


class _FailingHook:
    """A callback whose ``hook`` raises on rank ``rank``."""

    def __init__(self, hook: str, rank: int) -> None:
        if rank == RANK:
            setattr(self, hook, self._fail)

    def _fail(self, **kwargs):
        (OUT / "raised").write_text(repr(time.time()))
        if RANK == 0:
            raise MissingResourceError(f"the test callback's file is not on disk on rank {RANK}: /nowhere/cb.json")
        raise ValueError(f"the test callback failed on rank {RANK}")


class _SignalHook:
    """A callback whose ``hook`` sends ``signum`` to this process on rank ``rank``."""

    def __init__(self, hook: str, rank: int, signum: int) -> None:
        self.signum = signum
        if rank == RANK:
            setattr(self, hook, self._signal)

    def _signal(self, **kwargs):
        (OUT / "raised").write_text(repr(time.time()))
        os.kill(os.getpid(), self.signum)


if os.environ.get("FL_TEST_SIGNAL_HOOK"):
    import signal

    _hook, _rank, _name = os.environ["FL_TEST_SIGNAL_HOOK"].split(":")
    _defaults_s = fl_lightning.callbacks.default_callbacks
    fl_lightning.callbacks.default_callbacks = lambda cfg, loggers: [
        *_defaults_s(cfg, loggers),
        _SignalHook(_hook, int(_rank), getattr(signal, _name)),
    ]

if os.environ.get("FL_TEST_FAILING_HOOK"):
    _hook, _rank = os.environ["FL_TEST_FAILING_HOOK"].split(":")
    _defaults = fl_lightning.callbacks.default_callbacks  # Simulation looks it up when it is built
    fl_lightning.callbacks.default_callbacks = lambda cfg, loggers: [*_defaults(cfg, loggers), _FailingHook(_hook, int(_rank))]


if __name__ == "__main__":
    try:
        status = main(sys.argv[2:])
    except SystemExit as err:
        status = err.code if isinstance(err.code, int) else 1
    except BaseException:  # noqa: BLE001 — an uncaught error is reported as the CLI would
        traceback.print_exc()
        status = 1
    (OUT / f"rank{RANK}.rc").write_text(str(status))
    sys.stderr.flush()
    sys.exit(status)
