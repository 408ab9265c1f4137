"""A round in progress: the plan, then one record per finished client — in memory while the round is
short, on disk once losing it would hurt.

Layout on disk: ``checkpoints/round0003/plan.pt`` and ``checkpoints/round0003/client000042.pt`` (the
record of client 42: its upload and a few numbers). Each file is written atomically (temp file +
rename), so a run killed at any moment — during a write included — leaves only whole records behind;
a resumed round re-runs exactly the clients that have none. Writing a client costs O(its upload),
never O(clients so far).

When the records are written (``federation.record_after_s``, default 10 s): a store that may *hold*
keeps the plan and its finished clients' records in memory until the round has run ``hold_s`` seconds
(or the held uploads pass ``hold_bytes``, 1 GiB by default); then it writes everything it holds and every
later record goes straight to disk. A short round therefore writes nothing but the server's checkpoint
after it, and a kill during it costs at most ``hold_s`` seconds of clients, which the resumed run
re-runs to the same result: with no record on disk there is no plan on disk either, and the plan is
recomputed from the checkpointed state it was first computed from (``Algorithm.plan`` is a function of
its arguments and seeds). Every rank holds its own clients the same way; at the end of the client phase the
other ranks hand their held records, uploads included, to rank 0 in the gather of the round's records
(:meth:`RoundStore.held_records` → :meth:`RoundStore.receive`): the uploads of a short round cross the backend
as tensors and never touch the file system, and rank 0 keeps them under its own hold rules (past ``hold_s`` or
``hold_bytes`` it writes them, as its own). A record a rank has written already reaches rank 0 through the disk.
``hold_s = 0`` writes every record at once (the crash-safety tests, and a user who wants the finest-grained
resume).

The server reads uploads back one at a time, in client order, through :class:`StoredUploads`: a
sum-type aggregate (AFL, FedOPAL's statistics) then holds one upload in memory at a time, and the
order — hence every float — is the same for any number of ranks. Multi-node runs need the run
folder on a file system all nodes share (as resuming does).

A store with a fold (``fold``: a round whose aggregate only sums the uploads' large tensors, GPT-FL's whole models)
folds each client's summed tensors as it saves the client (federation/ranks/summed_uploads.py) and keeps the rest of the
upload and the record in memory, never on disk — whatever ``hold_s`` and ``hold_bytes``: without its folded tensors a
record could not stand for its client on resume, so a killed round re-runs every client of it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fl_lightning.federation.algorithm import RoundPlan
from fl_lightning.federation.ranks.summed_uploads import FoldedUploads
from fl_lightning.federation.storage.checkpoint import atomic_save, safe_load
from fl_lightning.federation.transport import Upload

if TYPE_CHECKING:
    from fl_lightning.federation.ranks.summed_uploads import UploadFold

__all__ = ["HOLD_BYTES", "ClientRecord", "RoundResult", "RoundStore", "StoredUploads"]


@dataclass
class ClientRecord:
    """What the server learns of one client besides its upload (small; gathered to rank 0)."""

    compute_s: float
    bytes_down: int
    bytes_up: int = 0
    failure: str | None = None  # "ExceptionType: message" when the client failed or its upload was rejected
    user_error: bool = False  # the failure is the user's to fix (a corrupt image…): the run stops with exit 2
    traceback: str | None = None  # the failure's formatted traceback (its cause, which --debug prints)

    def state_dict(self) -> dict[str, Any]:
        return {
            "compute_s": self.compute_s,
            "bytes_down": self.bytes_down,
            "bytes_up": self.bytes_up,
            "failure": self.failure,
            "user_error": self.user_error,
            "traceback": self.traceback,
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> ClientRecord:
        return cls(
            float(d["compute_s"]),
            int(d["bytes_down"]),
            int(d["bytes_up"]),
            d["failure"],
            bool(d.get("user_error", False)),
            d.get("traceback"),
        )  # records written before tracebacks


@dataclass
class RoundResult:
    """Every sampled client's record of one round, in client order (uploads stay in the store)."""

    records: dict[int, ClientRecord] = field(default_factory=dict)

    @property
    def failures(self) -> dict[int, str]:
        return {c: r.failure for c, r in sorted(self.records.items()) if r.failure is not None}

    @property
    def succeeded(self) -> list[int]:
        return [c for c, r in sorted(self.records.items()) if r.failure is None]

    @property
    def compute_s(self) -> dict[int, float]:
        return {c: r.compute_s for c, r in sorted(self.records.items())}

    @property
    def bytes_down(self) -> dict[int, int]:
        return {c: r.bytes_down for c, r in sorted(self.records.items())}

    @property
    def bytes_up(self) -> int:
        return sum(r.bytes_up for r in self.records.values())


class StoredUploads(Mapping[int, Upload]):
    """Read-only ``client → Upload`` in client order, each loaded from its record when read."""

    def __init__(self, store: RoundStore, clients: list[int]) -> None:
        self._store, self._clients = store, sorted(clients)

    def __getitem__(self, client: int) -> Upload:
        if client not in self._clients:
            raise KeyError(client)
        upload = self._store.load_client(client)[1]
        assert upload is not None  # a client in this mapping succeeded
        return upload

    def __iter__(self) -> Iterator[int]:
        return iter(self._clients)

    def __len__(self) -> int:
        return len(self._clients)


HOLD_BYTES = 1 << 30  # the most upload bytes a store holds in memory before it writes them


def _snapshot(upload: Upload | None) -> Upload | None:
    """What reading the record back would give: CPU copies (an upload may alias a module's parameters, which
    the next client trains in place, or live on the GPU)."""
    if upload is None:
        return None
    return Upload({k: v.detach().to("cpu", copy=True) for k, v in upload.tensors.items()}, dict(upload.meta))


class RoundStore:
    """The records of round ``round_idx``: on disk under ``checkpoint_dir``, or held in memory while the
    round is younger than ``hold_s`` seconds (see the module docstring).

    Args:
        checkpoint_dir: the run's ``checkpoints/`` folder.
        round_idx: the round.
        hold_s: hold the plan and the records in memory until the store is this many seconds old (0: write
            each at once).
        hold_bytes: ... and while the held uploads take at most this many bytes.
        fold: this rank's fold of the uploads' summed tensors (see the module docstring); None: whole uploads.
    """

    def __init__(
        self,
        checkpoint_dir: Path,
        round_idx: int,
        *,
        hold_s: float = 0.0,
        hold_bytes: int = HOLD_BYTES,
        fold: UploadFold | None = None,
    ) -> None:
        self.folder = Path(checkpoint_dir) / f"round{round_idx:04d}"
        self.fold = fold
        self.hold_s, self.hold_bytes = float(hold_s), int(hold_bytes)
        self._born = time.monotonic()
        self._plan: RoundPlan | None = None  # held, not yet written
        self._held: dict[int, tuple[ClientRecord, Upload | None]] = {}
        self._held_bytes = 0
        self._writing = self.hold_s <= 0  # once True, everything goes to disk

    def _client_path(self, client: int) -> Path:
        return self.folder / f"client{client:06d}.pt"

    @property
    def held(self) -> int:
        """How many client records are held in memory (not on disk)."""
        return len(self._held)

    def _may_hold(self, extra_bytes: int) -> bool:
        if not self._writing and (
            time.monotonic() - self._born >= self.hold_s or self._held_bytes + extra_bytes > self.hold_bytes
        ):
            self.write_held()
        return not self._writing

    def write_held(self) -> None:
        """Write the held plan and records to disk; from now on every record is written at once."""
        self._writing = True
        if self._plan is not None:
            atomic_save(self._plan.state_dict(), self.folder / "plan.pt")
            self._plan = None
        if self.fold is not None:  # a folded client's record holds no upload to resume from: it runs again
            return
        for client, (record, upload) in sorted(self._held.items()):
            self._write_client(client, record, upload)
        self._held.clear()
        self._held_bytes = 0

    # -- the plan -------------------------------------------------------------------------------
    def save_plan(self, plan: RoundPlan) -> None:
        if self._may_hold(0):
            self._plan = plan
            return
        atomic_save(plan.state_dict(), self.folder / "plan.pt")

    def load_plan(self) -> RoundPlan | None:
        path = self.folder / "plan.pt"
        return RoundPlan.from_state_dict(safe_load(path)) if path.is_file() else None

    # -- clients --------------------------------------------------------------------------------
    def save_client(self, client: int, record: ClientRecord, upload: Upload | None) -> None:
        if self.fold is not None:
            self._held[client] = (record, None if upload is None else self.fold.add(upload))
            return
        num_bytes = upload.num_bytes if upload is not None else 0
        if self._may_hold(num_bytes):
            self._held[client] = (record, _snapshot(upload))
            self._held_bytes += num_bytes
            return
        self._write_client(client, record, upload)

    def _write_client(self, client: int, record: ClientRecord, upload: Upload | None) -> None:
        # no fsync: a killed process loses nothing the OS already holds; only a power cut could, and the
        # client then simply runs again (its record is missing, never half-written). No CRC either: torch.load
        # never checks it, and the record lives only until the round is aggregated
        atomic_save(
            {"record": record.state_dict(), "upload": upload.state_dict() if upload is not None else None},
            self._client_path(client),
            durable=False,
            checksum=False,
        )

    def held_records(self) -> dict[int, tuple[ClientRecord, Upload | None]]:
        """The client records held in memory (another rank's part of the round, for rank 0: :meth:`receive`)."""
        return dict(self._held)

    def forget_held(self) -> None:
        """Drop the held records once rank 0 has them (they are its to keep or write from now on)."""
        self._held.clear()
        self._held_bytes = 0

    def receive(self, records: Mapping[int, tuple[ClientRecord, Upload | None]]) -> None:
        """Take another rank's held records as if this store had saved them (held while it may hold, else written)."""
        for client, (record, upload) in sorted(records.items()):
            if self.fold is not None:  # folded where they were made
                self._held[client] = (record, upload)
            else:
                self.save_client(client, record, upload)

    def has_client(self, client: int) -> bool:
        return client in self._held or self._client_path(client).is_file()

    def load_client(self, client: int) -> tuple[ClientRecord, Upload | None]:
        if client in self._held:
            return self._held[client]
        saved = safe_load(self._client_path(client))
        upload = Upload.from_state_dict(saved["upload"]) if saved["upload"] is not None else None
        return ClientRecord.from_state_dict(saved["record"]), upload

    def uploads(self, clients: list[int]) -> Mapping[int, Upload]:
        """The clients' uploads in client order (a fold's store: what is left of them, with the round's whole fold)."""
        if self.fold is not None:
            if self.fold.total is None:
                raise RuntimeError("the round's fold has not been carried to this rank (summed_uploads.carry_fold)")
            return FoldedUploads({c: self._held[c][1] for c in clients}, self.fold.total)
        return StoredUploads(self, clients)

    def clear(self) -> None:
        self._plan, self._held, self._held_bytes = None, {}, 0
        shutil.rmtree(self.folder, ignore_errors=True)
