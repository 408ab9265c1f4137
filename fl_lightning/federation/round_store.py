"""A round in progress on disk: the plan, then one record per finished client.

Layout: ``checkpoints/round0003/plan.pt`` (written by the server when it plans) and
``checkpoints/round0003/client000042.pt`` (written by the rank that ran client 42, right after it
finished). Each file is written atomically (temp file + rename), so a run killed at any moment —
during a write included — leaves only whole records behind; a resumed round re-runs exactly the
clients that have none. Writing a client costs O(its upload), never O(clients so far).

The server reads uploads back one at a time, in client order, through :class:`StoredUploads`: a
sum-type aggregate (AFL, FedOPAL's statistics) then holds one upload in memory at a time, and the
order — hence every float — is the same for any number of ranks. Multi-node runs need the run
folder on a file system all nodes share (as resuming does).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_lightning.federation.algorithm import RoundPlan
from fl_lightning.federation.checkpoint import atomic_save, safe_load
from fl_lightning.federation.transport import Upload

__all__ = ["ClientRecord", "RoundResult", "RoundStore", "StoredUploads"]


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
        return {"compute_s": self.compute_s, "bytes_down": self.bytes_down, "bytes_up": self.bytes_up,
                "failure": self.failure, "user_error": self.user_error, "traceback": self.traceback}

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> ClientRecord:
        return cls(float(d["compute_s"]), int(d["bytes_down"]), int(d["bytes_up"]), d["failure"],
                   bool(d.get("user_error", False)), d.get("traceback"))  # records written before tracebacks


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


class RoundStore:
    """The on-disk records of round ``round_idx`` under ``checkpoint_dir``."""

    def __init__(self, checkpoint_dir: Path, round_idx: int) -> None:
        self.folder = Path(checkpoint_dir) / f"round{round_idx:04d}"

    def _client_path(self, client: int) -> Path:
        return self.folder / f"client{client:06d}.pt"

    # -- the plan -------------------------------------------------------------------------------
    def save_plan(self, plan: RoundPlan) -> None:
        atomic_save(plan.state_dict(), self.folder / "plan.pt")

    def load_plan(self) -> RoundPlan | None:
        path = self.folder / "plan.pt"
        return RoundPlan.from_state_dict(safe_load(path)) if path.is_file() else None

    # -- clients --------------------------------------------------------------------------------
    def save_client(self, client: int, record: ClientRecord, upload: Upload | None) -> None:
        # no fsync: a killed process loses nothing the OS already holds; only a power cut could, and the
        # client then simply runs again (its record is missing, never half-written). No CRC either: torch.load
        # never checks it, and the record lives only until the round is aggregated
        atomic_save({"record": record.state_dict(), "upload": upload.state_dict() if upload is not None else None},
                    self._client_path(client), durable=False, checksum=False)

    def has_client(self, client: int) -> bool:
        return self._client_path(client).is_file()

    def load_client(self, client: int) -> tuple[ClientRecord, Upload | None]:
        saved = safe_load(self._client_path(client))
        upload = Upload.from_state_dict(saved["upload"]) if saved["upload"] is not None else None
        return ClientRecord.from_state_dict(saved["record"]), upload

    def uploads(self, clients: list[int]) -> StoredUploads:
        return StoredUploads(self, clients)

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
