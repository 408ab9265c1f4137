"""What a client keeps from one round it takes part in to the next (SCAFFOLD's control variate c_i), for any number
of clients, on disk: two memory-mapped files under ``<run_dir>/checkpoints/client_state/<name>/``.

* ``values.npy`` — float32 ``(N, 2, P)``: two slots per client, each P values (padded to whole 4 KiB pages, so no
  two clients share a page: writes of different clients never touch the same page, on a local disk or NFS);
* ``rounds.npy`` — int64 ``(N, 2)``: the round whose aggregate wrote each slot (−1: never).

**Exact under a kill.** A round's aggregate writes a client's new value into the slot that does *not* hold its
value as of that round, then stamps the slot with the round. Reading "as of round r" (the rounds 0..r−1 committed
in ``server.pt``) takes the slot with the largest stamp below r. So a kill anywhere — mid-value, between value and
stamp, or after both but before ``server.pt`` was written — leaves the committed value where it was, and the
resumed round reads it and writes the new value again; that round's write first unstamps whatever the killed
attempt stamped, so a client the new attempt does not write (it failed this time) keeps its committed value.

Nothing is read whole: a read is one row (P values), a write one row per client of the round; memory stays at the
pages touched, whatever N (10,000 clients of a 7,690-value head: 655 MB on disk, a few MB in memory).

The server writes (the aggregate sees every upload), on rank 0; the ranks running clients read, each opening the
files anew per read (a file another node wrote is read as it is now). A fresh start removes the folder
(``Simulation``); a resume keeps it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from fl_lightning.federation.storage.checkpoint import reserved_memmap

__all__ = ["CLIENT_STATE_DIR", "ClientStateStore"]

CLIENT_STATE_DIR = "client_state"  # under the run's checkpoints/
_PAGE_VALUES = 4096 // 4  # float32 values per 4 KiB page


class ClientStateStore:
    """Per-client vectors of ``numel`` float32 values for ``num_clients`` clients (module docstring).

    Args:
        folder: ``<run_dir>/checkpoints/client_state/<name>`` (created at the first write).
        num_clients: N.
        numel: P, the values one client keeps.
    """

    def __init__(self, folder: str | Path, num_clients: int, numel: int) -> None:
        self.folder, self.num_clients, self.numel = Path(folder), int(num_clients), int(numel)
        self._width = -(-self.numel // _PAGE_VALUES) * _PAGE_VALUES  # whole pages per slot

    @classmethod
    def of_run(cls, run_dir: str | Path, name: str, num_clients: int, numel: int) -> ClientStateStore:
        """The store a method ``name`` keeps in its run: ``<run_dir>/checkpoints/client_state/<name>``."""
        return cls(Path(run_dir) / "checkpoints" / CLIENT_STATE_DIR / name, num_clients, numel)

    @property
    def _values_path(self) -> Path:
        return self.folder / "values.npy"

    @property
    def _rounds_path(self) -> Path:
        return self.folder / "rounds.npy"

    @staticmethod
    def _slot(stamps: np.ndarray, round_idx: int) -> int | None:
        """The slot holding the value as of ``round_idx`` (largest stamp below it), or None: never written before."""
        valid = [s for s in (0, 1) if 0 <= stamps[s] < round_idx]
        return max(valid, key=lambda s: stamps[s]) if valid else None

    def read(self, client: int, round_idx: int) -> np.ndarray:
        """Client ``client``'s vector as of round ``round_idx`` (its rounds 0..round_idx−1), a (P,) float32 copy;
        zeros for a client no committed round has written."""
        if not self._rounds_path.is_file():
            return np.zeros(self.numel, np.float32)
        stamps = np.load(self._rounds_path, mmap_mode="r")[client]
        slot = self._slot(stamps, round_idx)
        if slot is None:
            return np.zeros(self.numel, np.float32)
        return np.array(np.load(self._values_path, mmap_mode="r")[client, slot, : self.numel])

    def write(self, values: dict[int, np.ndarray], round_idx: int) -> None:
        """Round ``round_idx``'s new vectors, ``{client: (P,)}``: each into the slot its committed value is not in,
        stamped after it (module docstring); on disk (page cache) when this returns. Call it once in every round's
        aggregate, with no values too: it first unstamps what an aborted attempt of this round wrote (a client the
        attempt that commits does not write must not keep it)."""
        if self._rounds_path.is_file():
            stamps = np.load(self._rounds_path, mmap_mode="r+")
            aborted = stamps >= round_idx
            if aborted.any():
                stamps[aborted] = -1
                stamps.flush()
            del stamps
        if not values:
            return
        if not self._rounds_path.is_file():
            self.folder.mkdir(parents=True, exist_ok=True)
            reserved_memmap(self._values_path, (self.num_clients, 2, self._width), np.float32).flush()
            rounds = reserved_memmap(self._rounds_path.with_suffix(".tmp"), (self.num_clients, 2), np.int64)
            rounds[:] = -1
            rounds.flush()
            del rounds
            self._rounds_path.with_suffix(".tmp").replace(self._rounds_path)  # present: both files whole
        array = np.load(self._values_path, mmap_mode="r+")
        stamps = np.load(self._rounds_path, mmap_mode="r+")
        for client, value in sorted(values.items()):
            keep = self._slot(stamps[client], round_idx)
            slot = 1 - keep if keep is not None else int(np.argmin(stamps[client]))
            array[client, slot, : self.numel] = np.asarray(value, np.float32).reshape(self.numel)
            array.flush()  # the value before its stamp
            stamps[client, slot] = round_idx
        stamps.flush()
        del array, stamps

    def clear(self) -> None:
        """Remove every client's state (a fresh start)."""
        shutil.rmtree(self.folder, ignore_errors=True)
