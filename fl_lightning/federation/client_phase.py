"""A round's client side on one rank, as pure steps the engine's client phase calls: one client's work from its
download to its record (:func:`run_client`), the rank parts' records as one (:func:`merged`) and the server's verdict
on them (:func:`round_failure`)."""

from __future__ import annotations

import time
import traceback
from typing import TYPE_CHECKING

from fl_lightning.errors import ClientFailure, ClientUsageError, RunFailure, TooFewClients, UsageError
from fl_lightning.federation.client_behaviour import DROPPED, LATE_STALE, NO_ERROR
from fl_lightning.federation.local_training import local_work
from fl_lightning.federation.ranks.placement import client_seed, seed_torch
from fl_lightning.federation.storage.round_store import ClientRecord, RoundResult
from fl_lightning.federation.transport import check_upload

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig
    from fl_lightning.federation.algorithm import Algorithm, Environment, RoundPlan
    from fl_lightning.federation.client_behaviour import ClientBehaviour
    from fl_lightning.federation.policies.order import PolicyChain
    from fl_lightning.federation.transport import Upload

__all__ = ["run_client", "round_failure", "merged"]


def run_client(
    algorithm: Algorithm,
    env: Environment,
    round_idx: int,
    client_idx: int,
    plan: RoundPlan,
    *,
    policies: PolicyChain,
    behaviour: ClientBehaviour | None,
) -> tuple[ClientRecord, Upload | None]:
    """One client's round on this rank: its download, its local work (a dropout's or a late one's none; a straggler's
    share), its upload through the update policies on its way up, and its record; a failure is recorded, never
    raised (the server decides after the records gather: :func:`round_failure`)."""
    fabric, cfg = env.fabric, env.cfg
    download = plan.downloads[client_idx]
    fabric.call("on_client_start", round_idx=round_idx, client=client_idx)
    work = None
    if behaviour is not None and behaviour.drops(round_idx, client_idx):  # gone after its download
        return ClientRecord(compute_s=0.0, bytes_down=download.num_bytes, failure=DROPPED), None
    if behaviour is not None:  # a straggler: a share of its local work; past the deadline: dropped, as a dropout
        work = behaviour.local_work(round_idx, client_idx, cfg.train.epochs)
        missed = behaviour.missed_deadline(round_idx, client_idx, cfg.train.epochs)
        if missed is not None:
            return ClientRecord(compute_s=0.0, bytes_down=download.num_bytes, failure=missed), None
    seed_torch(client_seed(cfg.seed, round_idx, client_idx), fabric.device)
    start = time.monotonic()
    upload, failure, trace, user_error = None, None, None, False
    try:
        with local_work(work):
            upload = algorithm.client_update(round_idx, env.client(client_idx), download.to(fabric.device))
        # an attacker's poisoned upload, then local DP: the upload as it leaves the client (policies/order.py)
        upload = policies.on_upload(upload, download.tensors, round_idx, client_idx)
        check_upload(upload, algorithm.expected_shapes(round_idx, download))
        if behaviour is not None and behaviour.stale_delay(round_idx, client_idx, cfg.train.epochs) is not None:
            failure = LATE_STALE  # late: its upload kept, for the round it arrives in (federation/policies/stale_updates.py)
    except Exception as err:  # noqa: BLE001 — recorded; the on_client_error policy decides after the gather
        upload, failure, user_error = None, f"{type(err).__name__}: {err}", isinstance(err, UsageError)
        trace = "".join(traceback.format_exception(err))  # the cause, for --debug (the object stays here)
    record = ClientRecord(
        compute_s=time.monotonic() - start,
        bytes_down=download.num_bytes,
        bytes_up=upload.num_bytes if upload is not None else 0,
        failure=failure,
        user_error=user_error,
        traceback=trace,
    )
    return record, upload


def round_failure(cfg: RunConfig, round_idx: int, result: RoundResult) -> UsageError | RunFailure | None:
    """The error that ends the run after this round's client phase (a client's usage error, a failure under
    ``on_client_error: raise``, fewer than ``federation.min_clients`` successes), or None when the round goes on."""
    failures, records, f = result.failures, result.records, cfg.federation
    where = f"checkpoint kept in {cfg.run_dir / 'checkpoints'}"
    user = [c for c, r in sorted(records.items()) if r.user_error]
    if user:  # e.g. a corrupt image: the user's to fix, whatever the failure policy (its message names the file)
        c = user[0]
        return ClientUsageError(
            f"client {c} in round {round_idx}: {records[c].failure} ({where})", c, round_idx, records[c].traceback
        )
    errors = {c: m for c, m in failures.items() if m not in NO_ERROR}  # a dropout or late straggler is no error
    if errors and f.on_client_error == "raise":
        c = min(errors)
        return ClientFailure(
            f"client {c} failed in round {round_idx}: {failures[c]} ({where}; set "
            f"federation.on_client_error: skip to aggregate the others)",
            c,
            round_idx,
            records[c].traceback,
        )
    ok = len(result.succeeded)
    if ok < f.min_clients:
        shown = "; ".join(f"client {c}: {m}" for c, m in list(failures.items())[:3])
        more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
        return TooFewClients(
            f"round {round_idx}: {ok} of {len(records)} clients succeeded, fewer than "
            f"federation.min_clients={f.min_clients}; {shown}{more} ({where})",
            round_idx,
            ok,
            {c: records[c].traceback for c in failures if records[c].traceback},
        )
    return None


def merged(parts: list[RoundResult]) -> RoundResult:
    """The records of every rank's part as one result (one part: that part itself)."""
    if len(parts) == 1:
        return parts[0]
    return RoundResult({c: r for part in parts for c, r in part.records.items()})
