"""Errors that end a run with one clear line on stderr and exit status 2.

Anything raised as a :class:`UsageError` (or a subclass) is reported by ``fl_lightning.train`` as a
single line, without a traceback: bad configuration, a missing file, weights or a data set that are
not on disk. Everything else is a bug or a runtime failure and exits with status 1.
"""

from __future__ import annotations

__all__ = ["UsageError", "ConfigError", "MissingResourceError"]


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
