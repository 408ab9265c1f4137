"""The errors that end a run, and the one check that turns a bad config value into one of them.

* :class:`UsageError` (and its subclasses): the user asked for something that cannot be done as
  asked — bad configuration, a missing file, weights or a data set that are not on disk, a machine
  that cannot give what the config asks for, a run folder that holds another run or is in use. The
  CLI prints one line, without a traceback, and exits with status 2.
* :class:`RunFailure` (and its subclasses :class:`ClientFailure`, :class:`TooFewClients`): the run
  started and cannot go on as configured. One line, exit status 1, the checkpoint is kept for
  ``--resume``.
* Anything else is a bug: a traceback and exit status 1.

``--debug`` prints the traceback of the one-line errors too. An error that a client raised (possibly
on another rank, where the exception object cannot travel) keeps its formatted traceback as the
``__cause__`` of the failure it led to (:class:`RemoteTraceback`, as :mod:`concurrent.futures` does),
so the traceback that ``--debug`` prints ends in the client's own code.
"""

from __future__ import annotations

__all__ = [
    "UsageError",
    "ConfigError",
    "MissingResourceError",
    "ResourceError",
    "DiskFullError",
    "RunFolderError",
    "ClientUsageError",
    "RunFailure",
    "ClientFailure",
    "TooFewClients",
    "RemoteTraceback",
    "check",
    "did_you_mean",
]


class UsageError(Exception):
    """The user asked for something that cannot be done as asked (exit status 2)."""


class ConfigError(UsageError):
    """A configuration key has a bad value, type or name.

    Args:
        key: dotted key, e.g. ``"partition.alpha"``.
        value: the offending value.
        allowed: what is allowed, in words (``"a float > 0 or inf"``).
    """

    def __init__(self, key: str, value: object, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"config error: {key}={value!r} is not allowed; expected {allowed}")

    def __reduce__(self) -> tuple:
        return type(self), (self.key, self.value, self.allowed)


def check(ok: bool, key: str, value: object, allowed: str) -> None:
    """Raise a :class:`ConfigError` for ``key`` unless ``ok``.

    Used in ``__post_init__`` of config dataclasses (the core ones in ``fl_lightning.config`` and every
    method's own): ``key`` is the field name; the loader prefixes the section (``fedopal.mu``).
    """
    if not ok:
        raise ConfigError(key, value, allowed)


def did_you_mean(word: str, choices: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to ``word`` (:func:`difflib.get_close_matches`), or ``""``:
    the hint an unknown key's or value's one line ends with."""
    import difflib

    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class MissingResourceError(UsageError):
    """Weights or data that the run needs are not on disk (and downloading is off or impossible)."""


class ResourceError(UsageError):
    """The machine cannot give what the config asks for (CPU cores, GPUs, memory, a writable folder)."""


class DiskFullError(ResourceError):
    """A file of the run could not be written: no space left (or the quota is spent) where it goes.

    The file it replaces is intact (writes go to a temp file, renamed only when whole); the message is the
    one line (the file, the bytes it needed, the space free, what to do).

    Args:
        message: the one line.
        path: the file that could not be written.
        needed: bytes it needed (None when unknown).
        free: bytes free on its filesystem after the failed write was cleaned up (None when unknown).
    """

    def __init__(self, message: str, path: str, needed: int | None = None, free: int | None = None) -> None:
        super().__init__(message)
        self.path, self.needed, self.free = path, needed, free

    def __reduce__(self) -> tuple:  # pickled when a rank's error is broadcast to the others
        return type(self), (str(self), self.path, self.needed, self.free)


class RunFolderError(UsageError):
    """The run folder holds another run, is in use by a live process, or its record was edited."""


class RemoteTraceback(Exception):
    """The formatted traceback of an exception raised in a client, kept as text.

    Set as the ``__cause__`` of the :class:`ClientFailure` (or :class:`ClientUsageError`) it led to, so
    ``traceback.print_exception`` shows it above the failure ("The above exception was the direct cause
    …"), though the client ran in another process or its exception object is long gone.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text.rstrip()}\n"""'


class _FromClient:
    """What the errors raised because of one client share: the one line, which client, which round, and the
    client's formatted traceback (shown with ``--debug``; None for a rejected upload, which the server's
    check reports in the message).

    Args:
        message: the one line.
        client: the client's index.
        round_idx: the round it failed in.
        client_traceback: the client's formatted traceback.
    """

    def __init__(self, message: str, client: int, round_idx: int, client_traceback: str | None = None) -> None:
        super().__init__(message)
        self.client, self.round_idx, self.client_traceback = client, round_idx, client_traceback
        if client_traceback:
            self.__cause__ = RemoteTraceback(client_traceback)

    def __reduce__(self) -> tuple:  # pickled when the server broadcasts it to the other ranks
        return type(self), (str(self), self.client, self.round_idx, self.client_traceback)


class ClientUsageError(_FromClient, UsageError):
    """A client hit an error that is the user's to fix (a corrupt image …): exit status 2, whatever the
    failure policy. The message names the client, the round and what the client reported."""


class RunFailure(RuntimeError):
    """The run cannot go on as configured (exit status 1; the checkpoint is kept for ``--resume``)."""


class ClientFailure(_FromClient, RunFailure):
    """A client raised (or sent a rejected upload) and ``federation.on_client_error`` is ``raise`` (the first
    such client in client order)."""


class TooFewClients(RunFailure):
    """Fewer than ``federation.min_clients`` clients of a round succeeded (under ``on_client_error: skip``).

    Args:
        message: the one line (it names the first failures).
        round_idx: the round.
        succeeded: how many clients succeeded.
        client_tracebacks: the failed clients' tracebacks by client, in client order (``--debug`` shows the
            first).
    """

    def __init__(self, message: str, round_idx: int, succeeded: int, client_tracebacks: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.round_idx, self.succeeded = round_idx, succeeded
        self.client_tracebacks = dict(client_tracebacks or {})
        first = next(iter(self.client_tracebacks.values()), None)
        if first:
            self.__cause__ = RemoteTraceback(first)

    def __reduce__(self) -> tuple:
        return type(self), (str(self), self.round_idx, self.succeeded, self.client_tracebacks)
