"""What every command of the package shares: the error contract it runs under (:func:`run_command`): a usage error is
one line and exit status 2, a run's failure one line and status 1, anything else a traceback (docs/usage.md; the error
classes are in fl_lightning/errors.py); and its parser (:class:`CommandParser`): argparse whose refusals are such a
usage error and whose ``--help`` says what the command does, with an example. ``python -m fl_lightning.train``
(:mod:`fl_lightning.experiments.cli`), ``compare``, ``curves`` and ``paired`` share both."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence

__all__ = ["CommandParser", "run_command"]


class _Exit(SystemExit):
    """argparse ending the command (``--help``): outside :func:`run_command` a plain :class:`SystemExit`, inside it
    the command's exit status."""


class _Formatter(argparse.HelpFormatter):
    """Paragraphs wrapped to the terminal as argparse does; a line that starts with two spaces (an example) kept."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(
            line if line.startswith("  ") else super(_Formatter, self)._fill_text(line, width, indent)
            for line in text.splitlines()
        )


class CommandParser(argparse.ArgumentParser):
    """argparse under the package's error contract: a refused command line is one usage error (one line, exit status 2
    through :func:`run_command`) instead of argparse's usage and message; ``--help`` prints ``description``, the
    arguments, ``epilog`` and ``example`` (command lines, one a line) and ends the command with status 0.
    Abbreviated options are refused (``--ou`` is not ``--out``)."""

    def __init__(self, prog: str, *, description: str, example: str, epilog: str = "", **kwargs: object) -> None:
        examples = "\n".join(f"  {line}" for line in example.splitlines())
        super().__init__(
            prog=prog,
            description=description,
            epilog=f"{epilog}\n\nexample:\n{examples}".lstrip(),
            formatter_class=_Formatter,
            allow_abbrev=False,
            **kwargs,
        )  # type: ignore[arg-type]
        self._words: list[str] = []

    def parse_known_args(
        self,
        args: Sequence[str] | None = None,  # type: ignore[override]
        namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        self._words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        from fl_lightning.errors import UsageError

        if message.startswith("the following arguments are required"):  # argparse checks this before unknown flags
            words = self._words[: self._words.index("--")] if "--" in self._words else self._words
            unknown = [
                w
                for w in words
                if w[:1] == "-" and w[1:2] not in ("", *"0123456789") and w.split("=")[0] not in self._option_string_actions
            ]
            if unknown:
                message = f"unrecognized arguments: {' '.join(unknown)}; {message}"
        raise UsageError(f"usage error: {message} (see --help)")

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        if message:
            print(message, end="", file=sys.stderr)
        raise _Exit(status)


def run_command(body: Callable[[list[str]], int], argv: Sequence[str] | None = None) -> int:
    """Run a command's ``body(argv)`` under the package's error contract (see the module docstring): a usage
    error is one line and status 2, a run's failure one line and status 1, anything else a traceback; a
    :class:`CommandParser` that ends the command (``--help``) gives its status."""
    from fl_lightning.errors import RunFailure, UsageError

    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    try:
        return body(argv)
    except _Exit as done:
        return int(done.code or 0)
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
