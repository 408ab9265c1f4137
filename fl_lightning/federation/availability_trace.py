"""Which clients are online in each round, from a trace (``federation.clients.availability_trace``): FLGo's
availability modes and the device traces of Yang et al. 2021 ("Characterizing impacts of heterogeneity in federated
learning upon large-scale smartphone data", FLASH) as one input any method takes.

The trace is a table of 0/1 values, one row per round and one column per client (K = ``partition.num_clients``):
a text file (comma- or whitespace-separated, ``#`` comments) or a ``.npy`` array of shape (rows, K). Round t reads
row t mod rows: a trace shorter than the run repeats, as a day's trace repeats over the days of a longer study.
The server samples the round's clients from those online exactly as under a drawn ``availability``
(:class:`~fl_lightning.federation.client_behaviour.ClientBehaviour`).

The run keeps a copy (``availability_trace.csv`` in its folder): a resumed run whose file no longer says the same is
refused in one line, and rank 0's table is the one every rank samples from.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fl_lightning.errors import ConfigError, UsageError

__all__ = ["TRACE_KEY", "TRACE_COPY", "read_availability_trace", "trace_text", "check_recorded_trace"]

TRACE_KEY = "federation.clients.availability_trace"
TRACE_COPY = "availability_trace.csv"  # the run folder's copy
_SHAPE = "a table of 0/1, one row per round and one column per client"


def read_availability_trace(path: str | Path, num_clients: int) -> np.ndarray:
    """The trace at ``path`` as a (rows, K) bool array; a :class:`ConfigError` (one line) when it is missing,
    unreadable, not K columns wide or holds anything but 0 and 1."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(TRACE_KEY, str(path), f"a file holding {_SHAPE}; there is no file at that path")
    try:
        table = np.load(file, allow_pickle=False) if file.suffix == ".npy" else _read_text(file)
    except (ValueError, OSError, EOFError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(TRACE_KEY, str(path), f"{_SHAPE}; it could not be read: {first}") from None
    return _checked(np.asarray(table), str(path), num_clients)


def _read_text(file: Path) -> np.ndarray:
    text = file.read_text()
    if not any(line.partition("#")[0].strip() for line in text.splitlines()):
        return np.empty((0, 0))  # no row: refused by its shape (loadtxt would warn)
    return np.loadtxt(file, delimiter="," if "," in text else None, ndmin=2, comments="#", dtype=np.float64)


def _checked(table: np.ndarray, path: str, num_clients: int) -> np.ndarray:
    if table.ndim != 2 or table.shape[0] == 0:
        raise ConfigError(TRACE_KEY, path, f"{_SHAPE}; it has shape {table.shape}")
    if table.shape[1] != num_clients:
        raise ConfigError(TRACE_KEY, path, f"{_SHAPE}: {num_clients} columns (partition.num_clients); it has {table.shape[1]}")
    bad = np.argwhere(~np.isin(table, (0, 1)))
    if len(bad):
        row, column = (int(i) for i in bad[0])
        raise ConfigError(TRACE_KEY, path, f"{_SHAPE}; row {row + 1}, column {column + 1} holds {table[row, column]!r}")
    return table.astype(bool)


def trace_text(trace: np.ndarray) -> str:
    """The run folder's copy of ``trace``: one CSV line of 0/1 per round."""
    return "".join(",".join("1" if v else "0" for v in row) + "\n" for row in trace)


def check_recorded_trace(recorded: Path, trace: np.ndarray, path: str) -> None:
    """Refuse (one line) a resumed run whose trace (from ``path``) is not the copy the run started with."""
    kept = _read_text(recorded).astype(bool)
    if kept.shape != trace.shape or not np.array_equal(kept, trace):
        raise UsageError(
            f"usage error: {TRACE_KEY}={path!r} is not the trace this run started with (its copy: "
            f"{recorded}); put that file back or point the key at the copy, or start a new run "
            f"(another --run_name)"
        )
