"""The server's checkpoint, ``checkpoints/server.pt``, whose large tensors are written once, not every round.

A run's state can hold large tensors that never change after they first appear: FeDiSyn's frozen ViT backbone
(``backbone.*``, 1.2 GB for ViT-L/16) sits in the state beside the LoRA factors and the head that change every
round. Written whole each round, it cost ≈ 60 GB of writes over 50 rounds. :class:`ServerCheckpoint` writes every
tensor of at least ``min_bytes`` (:data:`PART_MIN_BYTES`) into a *part* file ``state-<round>.pt`` beside
``server.pt`` when it is saved for the first time or has changed since — a new object or an in-place edit, the
test the state broadcast uses (:func:`~fl_lightning.federation.run_state.unchanged`) — and ``server.pt`` names,
for each such key, the part holding it (``state_parts``) and the state's key order (``state_keys``). A tensor
saved before and unchanged is not written again: its key keeps naming the earlier part.

Durability (through :class:`~fl_lightning.federation.storage.checkpoint.DurableWriter`, in the background): the new part
is fsync'ed and renamed into place before ``server.pt``; a part no ``server.pt`` names any more is deleted only
once the new ``server.pt`` is in place. A crash at any point leaves the last ``server.pt`` and every part it
names, so a resumed run reads the state it had, bit for bit. Small tensors stay inline in ``server.pt`` (the tiny
configs' checkpoints hold no part), and a checkpoint written before parts existed loads as it always did.

Read a run's state with :func:`load_server_state` (``server.pt`` alone may name parts).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fl_lightning.federation.run_state import RunState, unchanged
from fl_lightning.federation.storage.checkpoint import CorruptCheckpointError, DurableWriter, safe_load

__all__ = ["ServerCheckpoint", "load_server_checkpoint", "load_server_state", "tensor_digest", "PART_MIN_BYTES", "SERVER_FILE"]

SERVER_FILE = "server.pt"
PART_MIN_BYTES = 1 << 20  # 1 MiB: a ViT's weight matrices go to parts, a head, prompts and statistics stay inline
_PART_GLOB = "state-*.pt"
_TEMP_GLOBS = (f".{SERVER_FILE}.*.tmp", ".state-*.pt.*.tmp")  # DurableWriter's temp files (mkstemp: .<name>.<random>.tmp)


def tensor_digest(t: Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes (a CPU tensor; any dtype, 0-dim included)."""
    t = t.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    digest.update(t.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def load_server_checkpoint(folder: str | Path) -> tuple[dict[str, Any], dict[str, str]]:
    """``server.pt`` of ``folder`` with its whole state (the parts it names read in and checked), and ``{key: part}``.

    Raises:
        CorruptCheckpointError: ``server.pt`` or a part it names cannot be read, is missing, lacks a tensor it
            should hold or holds other content than ``server.pt`` recorded (one line naming the file).
    """
    folder = Path(folder)
    saved = safe_load(folder / SERVER_FILE)
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        raise CorruptCheckpointError(
            f"checkpoint '{folder / SERVER_FILE}' is not a server checkpoint of fl_lightning "
            f"(no state); restore the run's own file, or start the run afresh in a new folder"
        )
    parts: dict[str, str] = dict(saved.pop("state_parts", None) or {})
    digests: dict[str, str] = dict(saved.get("state_digests") or {})  # none in checkpoints written before them
    keys = saved.pop("state_keys", None)
    state = dict(saved["state"])
    for name in sorted(set(parts.values())):
        path = folder / name
        if not path.is_file():
            raise CorruptCheckpointError(
                f"checkpoint '{folder / SERVER_FILE}' names '{name}', which is missing; restore that file, or start "
                f"the run afresh in a new folder"
            )
        tensors = safe_load(path)
        named = [k for k, part in parts.items() if part == name]
        _check_part(path, tensors, named, digests)
        state.update({k: tensors[k] for k in named})
    saved["state"] = state if keys is None else {k: state[k] for k in keys}
    return saved, parts


def _check_part(path: Path, tensors: Any, named: list[str], digests: dict[str, str]) -> None:
    """That the part at ``path`` holds each tensor ``server.pt`` names in it, with the content it recorded."""
    redo = f"restore the part that '{SERVER_FILE}' was written with, or start the run afresh in a new folder"
    missing = [k for k in named if not isinstance(tensors, dict) or not isinstance(tensors.get(k), Tensor)]
    if missing:
        raise CorruptCheckpointError(
            f"checkpoint part '{path}' lacks {len(missing)} tensor(s) '{SERVER_FILE}' names "
            f"in it ('{missing[0]}' …): it is not this run's part; {redo}"
        )
    changed = [k for k in named if k in digests and tensor_digest(tensors[k]) != digests[k]]
    if changed:
        raise CorruptCheckpointError(
            f"checkpoint part '{path}' does not hold what '{SERVER_FILE}' recorded for "
            f"'{changed[0]}' ({len(changed)} tensor(s) differ: another round's or another "
            f"run's part, or an edited one); {redo}"
        )


def load_server_state(run_dir: str | Path) -> dict[str, Tensor]:
    """The global state a run last checkpointed (``<run_dir>/checkpoints``), on the CPU, parts included."""
    return load_server_checkpoint(Path(run_dir) / "checkpoints")[0]["state"]


class ServerCheckpoint:
    """``server.pt`` and its parts for one run (module docstring); one per process, on the server.

    Args:
        folder: the run's ``checkpoints`` folder.
        min_bytes: tensors at least this large go to parts, smaller ones stay inline (None: :data:`PART_MIN_BYTES`).
    """

    def __init__(self, folder: str | Path, *, min_bytes: int | None = None) -> None:
        self.folder, self.min_bytes = Path(folder), int(PART_MIN_BYTES if min_bytes is None else min_bytes)
        self.writer = DurableWriter()
        # key → (tensor, its version, the part holding it, its digest)
        self._written: dict[str, tuple[Tensor, int, str, str]] = {}

    def load(self) -> RunState | None:
        """The checkpointed run, or None without ``server.pt``; its part tensors count as written."""
        if not (self.folder / SERVER_FILE).exists():
            return None
        saved, parts = load_server_checkpoint(self.folder)
        try:
            run = RunState.from_state_dict(saved)
        except (KeyError, TypeError, ValueError) as err:
            raise CorruptCheckpointError(
                f"checkpoint '{self.folder / SERVER_FILE}' is not a server checkpoint of fl_lightning (its field "
                f"{str(err).splitlines()[0]} is missing or malformed); restore the run's own file, or start the run "
                f"afresh in a new folder"
            ) from None
        self.adopt(run.state, parts, saved.get("state_digests") or {})
        return run

    def sweep(self) -> list[Path]:
        """Delete the temp files of writes a kill interrupted (no rename ever comes for them); the server, before
        its first save. Returns what it deleted."""
        swept = [p for glob in _TEMP_GLOBS for p in self.folder.glob(glob)]
        for path in swept:
            path.unlink(missing_ok=True)
        return swept

    def adopt(self, state: dict[str, Tensor], parts: dict[str, str], digests: dict[str, str] | None = None) -> None:
        """Record that ``state[k]`` is on disk in ``parts[k]`` (as loaded): saving it unchanged writes nothing.
        ``digests``: their :func:`tensor_digest` as ``server.pt`` recorded them (None or missing: computed here)."""
        digests = digests or {}
        self._written = {
            k: (state[k], state[k]._version, part, digests.get(k) or tensor_digest(state[k]))
            for k, part in parts.items()
            if k in state
        }

    def save(self, run: RunState) -> None:
        """Write ``run``: its new or changed large tensors into this round's part, the rest inline (background)."""
        part = f"state-{run.completed_rounds - 1:04d}.pt"
        inline: dict[str, Tensor] = {}
        new: dict[str, Tensor] = {}
        parts: dict[str, str] = {}
        digests: dict[str, str] = {}
        for k, v in run.state.items():
            if v.numel() * v.element_size() < self.min_bytes:
                inline[k] = v.detach().cpu()
                continue
            seen = self._written.get(k)
            if seen is not None and unchanged(seen[:2], v):
                parts[k], digests[k] = seen[2], seen[3]
            else:
                new[k], parts[k] = v.detach().cpu(), part  # (B, ...) as it is; a GPU tensor is copied here once
                digests[k] = tensor_digest(new[k])
        saved = run.state_dict(tensors=inline)
        saved.update(state_parts=parts, state_digests=digests, state_keys=list(run.state))
        keep = set(parts.values())

        def stale() -> list[Path]:
            return [p for p in self.folder.glob(_PART_GLOB) if p.name not in keep]

        self.writer.save(saved, self.folder / SERVER_FILE, first=[(new, self.folder / part)] if new else (), remove=stale)
        self._written = {k: (run.state[k], run.state[k]._version, parts[k], digests[k]) for k in parts}

    def wait(self) -> None:
        """Block until the last save is durable; raise its error, if any."""
        self.writer.wait()
