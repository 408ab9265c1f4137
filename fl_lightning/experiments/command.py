"""The error contract every command of the package runs under (:func:`run_command`): a usage error is one line and
exit status 2, a run's failure one line and status 1, anything else a traceback (docs/usage.md; the error classes are
in fl_lightning/errors.py). ``python -m fl_lightning.train`` (:mod:`fl_lightning.experiments.cli`), ``compare``,
``curves`` and ``paired`` share it."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence

__all__ = ["run_command"]


def run_command(body: Callable[[list[str]], int], argv: Sequence[str] | None = None, *,
                usage: str | None = None) -> int:
    """Run a command's ``body(argv)`` under the package's error contract (see the module docstring): a usage
    error is one line and status 2, a run's failure one line and status 1, anything else a traceback.
    ``usage``: printed for ``-h`` / ``--help`` by a command without a parser of its own."""
    from fl_lightning.errors import RunFailure, UsageError

    argv = sys.argv[1:] if argv is None else list(argv)
    if usage is not None and argv in (["-h"], ["--help"]):
        print(usage)
        return 0
    debug = "--debug" in argv
    try:
        return body(argv)
    except UsageError as err:
        return _report(err, 2, debug)
    except RunFailure as err:
        return _report(err, 1, debug)
    # anything else is our bug: the traceback is the report


def _report(err: BaseException, status: int, debug: bool) -> int:
    """One line on stderr; with ``--debug`` the traceback first, which for a client's failure starts with the
    client's own traceback (its ``__cause__``, see :class:`fl_lightning.errors.RemoteTraceback`)."""
    if debug:
        traceback.print_exception(err)
    print(f"fl_lightning: {' '.join(str(err).split())}", file=sys.stderr)
    return status
