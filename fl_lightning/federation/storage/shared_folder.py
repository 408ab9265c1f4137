"""Every rank must see the one run folder: :func:`check_shared_run_folder` checks it at start-up, in seconds (rank 0
writes a token into the folder, every rank looks for it, one exchange tells every rank who cannot see it)."""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import torch.distributed as dist

from fl_lightning.durable_write import write_text_atomic
from fl_lightning.errors import RunFolderError, UsageError
from fl_lightning.federation.ranks.ddp_strategy import object_group

__all__ = ["SHARED_CHECK", "check_shared_run_folder"]

SHARED_CHECK = ".shared_check"  # the token check_shared_run_folder writes (and removes again)
_SHARED_CHECK_WAIT_S = 5.0  # NFS caches a directory's entries for a few seconds (acdirmin): retry that long


def check_shared_run_folder(fabric: Any, run_dir: Path, *, wait_s: float = _SHARED_CHECK_WAIT_S) -> None:
    """Check that every rank sees the run folder rank 0 writes to (one shared folder, not one per node).

    Rank 0 writes a token with a random nonce into ``run_dir`` (atomically) and broadcasts the nonce; each rank
    reads the token from its ``run_dir``, retrying for up to ``wait_s`` (NFS caches directory entries for a few
    seconds); all ranks gather who saw it. Every rank returns, or every rank raises the same error: no rank is
    left waiting. Rank 0 removes the token again. A single process returns at once.

    Args:
        fabric: the launched :class:`lightning.fabric.Fabric` (every rank calls this).
        run_dir: the run folder, as this rank names it.
        wait_s: how long a rank looks for the token before it counts as not seeing the folder.

    Raises:
        RunFolderError: on every rank, one line naming the ranks (and hosts) that cannot see the folder.
    """
    if fabric.world_size == 1:
        return
    run_dir, rank = Path(run_dir), fabric.global_rank
    token = run_dir / SHARED_CHECK
    sent: dict[str, Any] = {"nonce": None, "error": None, "path": str(run_dir), "host": socket.gethostname()}
    if rank == 0:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            nonce = uuid.uuid4().hex
            write_text_atomic(token, nonce + "\n")
            sent["nonce"] = nonce
        except (OSError, UsageError) as err:  # rank 0 cannot write: every rank stops with its reason
            sent["error"] = f"run folder error: '{run_dir}' cannot be written on rank 0 (host {sent['host']}): {err}"
    sent = fabric.broadcast(sent, src=0)
    if sent["error"] is not None:
        raise RunFolderError(sent["error"])
    seen, why = _look_for_token(token, sent["nonce"], wait_s)
    mine = {"rank": rank, "host": socket.gethostname(), "path": str(run_dir), "seen": seen, "why": why}
    everyone: list[Any] = [None] * fabric.world_size
    dist.all_gather_object(everyone, mine, group=object_group(fabric))
    if rank == 0:
        token.unlink(missing_ok=True)
    blind = [e for e in everyone if not e["seen"]]
    if blind:
        raise RunFolderError(_blind_ranks_message(blind, sent))


def _look_for_token(token: Path, nonce: str, wait_s: float) -> tuple[bool, str]:
    """Whether ``token`` holds ``nonce`` within ``wait_s``; else why not, in words."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.listdir(token.parent)  # reads the directory afresh: NFS then notices the new entry sooner
            if token.read_text().strip() == nonce:
                return True, ""
            why = "it holds another run's token"
        except FileNotFoundError:
            why = "no such folder" if not token.parent.is_dir() else "the token is not there"
        except OSError as err:
            why = f"{type(err).__name__}: {err.strerror or err}"
        if time.monotonic() >= deadline:
            return False, why
        time.sleep(0.1)


def _blind_ranks_message(blind: list[dict[str, Any]], sent: dict[str, Any], limit: int = 4) -> str:
    by_host: dict[str, list[dict[str, Any]]] = {}
    for e in blind:
        by_host.setdefault(e["host"], []).append(e)
    parts = []
    for host, entries in list(by_host.items())[:limit]:
        ranks = ", ".join(str(e["rank"]) for e in entries)
        first = entries[0]
        named = "" if first["path"] == sent["path"] else f"; it looks in '{first['path']}'"
        parts.append(f"rank{'s' if len(entries) > 1 else ''} {ranks} on host {host} ({first['why']}{named})")
    more = f" and {len(by_host) - limit} more host(s)" if len(by_host) > limit else ""
    return (
        f"run folder error: {'; '.join(parts)}{more} cannot see the run folder '{sent['path']}' that rank 0 "
        f"(host {sent['host']}) writes to: every rank must share one run folder; put output_dir on a "
        f"filesystem every node shares (not a node-local disk such as /tmp or $TMPDIR)"
    )
