"""Errors that end a run with one clear line on stderr and exit status 2.

Anything raised as a :class:`UsageError` (or a subclass) is reported by ``fl_lightning.train`` as a
single line, without a traceback: bad configuration, a missing file, weights or a data set that are
not on disk, a machine that cannot give what the config asks for, a run folder that holds another
run or is in use. A run that fails while it runs (``RunFailure``, in ``federation.simulation``) is
one line with exit status 1. Anything else is a bug: a traceback and exit status 1 (``--debug``
shows the traceback of the one-line errors too).
"""

from __future__ import annotations

__all__ = ["UsageError", "ConfigError", "MissingResourceError", "ResourceError", "RunFolderError"]


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


class MissingResourceError(UsageError):
    """Weights or data that the run needs are not on disk (and downloading is off or impossible)."""


class ResourceError(UsageError):
    """The machine cannot give what the config asks for (CPU cores, GPUs, memory, a writable folder)."""


class RunFolderError(UsageError):
    """The run folder holds another run, is in use by a live process, or its record was edited."""
