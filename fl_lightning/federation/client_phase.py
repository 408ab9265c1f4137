"""A round's client phase: this rank's clients run (:func:`run_clients`; one client's work from its download to its
record: :func:`run_client`), every rank's records gathered to rank 0, which decides whether the round goes on
(:func:`round_failure`), in one collective (:func:`client_phase`)."""

from __future__ import annotations

import time
import traceback
from typing import TYPE_CHECKING

from fl_lightning.errors import ClientFailure, ClientUsageError, RunFailure, TooFewClients, UsageError
from fl_lightning.federation.client_behaviour import DROPPED, LATE_STALE, NO_ERROR
from fl_lightning.federation.local_training import local_work
from fl_lightning.federation.ranks.collectives import to_server
from fl_lightning.federation.ranks.placement import client_seed, seed_torch
from fl_lightning.federation.storage.round_store import ClientRecord, RoundResult
from fl_lightning.federation.transport import check_upload
from fl_lightning.phase_times import timed

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig
    from fl_lightning.federation.algorithm import Algorithm, Environment, RoundPlan
    from fl_lightning.federation.client_behaviour import ClientBehaviour
    from fl_lightning.federation.policies.order import PolicyChain
    from fl_lightning.federation.storage.round_store import RoundStore
    from fl_lightning.federation.transport import Upload

__all__ = ["client_phase", "run_clients", "run_client", "check_failures", "round_failure", "merged"]


def client_phase(
    algorithm: Algorithm,
    env: Environment,
    store: RoundStore,
    round_idx: int,
    my_clients: list[int],
    plan: RoundPlan,
    held: Exception | None = None,
    *,
    resume: bool,
    policies: PolicyChain,
    behaviour: ClientBehaviour | None,
) -> RoundResult:
    """Run this rank's clients of the round, gather every rank's records (their numbers) to rank 0 and
    let it decide whether the round goes on. A rank that fails in its part (a record it cannot save, a
    callback; ``held``: its ``on_round_start`` failure) reaches rank 0 as an outcome in the same gather
    (collectives.to_server): rank 0 raises one error naming it, the others — the failing one included — stop
    quietly. Other ranks return their own records. The records (and uploads) another rank still holds in memory
    travel to rank 0 in the same gather, which keeps them as its own (round_store.py); a rank writes its held
    records instead when the round stops (the caller's ``write_held``)."""
    fabric, rank = env.fabric, env.fabric.global_rank

    clients = {"resume": resume, "policies": policies, "behaviour": behaviour}

    def part() -> tuple[RoundResult, dict]:
        if held is not None:
            raise held
        with timed("clients"):
            mine = run_clients(algorithm, env, store, round_idx, my_clients, plan, **clients)
        return mine, (store.held_records() if rank != 0 else {})

    parts = to_server(
        fabric,
        part,
        what=f"round {round_idx}'s clients",
        timeout_s=env.cfg.federation.collective_timeout_s,
        check=lambda parts: check_failures(env.cfg, round_idx, merged([p[0] for p in parts])),
    )
    if rank == 0:
        for _, handed in parts[1:]:  # other ranks' held uploads, now the server's
            store.receive(handed)
    else:
        store.forget_held()
    return merged([p[0] for p in parts])


def run_clients(
    algorithm: Algorithm,
    env: Environment,
    store: RoundStore,
    round_idx: int,
    my_clients: list[int],
    plan: RoundPlan,
    *,
    resume: bool,
    policies: PolicyChain,
    behaviour: ClientBehaviour | None,
) -> RoundResult:
    """This rank's clients of the round (those without a record yet), each recorded."""
    mine = RoundResult()
    for client_idx in my_clients:
        if resume and store.has_client(client_idx):  # finished before the interruption
            record, upload = store.load_client(client_idx)
            if store.fold is not None:  # written by a run that kept every record: folded now
                store.save_client(client_idx, record, upload)
            mine.records[client_idx] = record
            continue
        record, upload = run_client(algorithm, env, round_idx, client_idx, plan, policies=policies, behaviour=behaviour)
        store.save_client(client_idx, record, upload)
        mine.records[client_idx] = record
        env.fabric.call(
            "on_client_end",
            round_idx=round_idx,
            client=client_idx,
            compute_s=record.compute_s,
            failed=record.failure is not None,
        )
    return mine


def check_failures(cfg: RunConfig, round_idx: int, result: RoundResult) -> None:
    """Stop the run (checkpoint kept) when a client failed under ``on_client_error: raise``, or fewer than
    ``federation.min_clients`` succeeded; decided and raised on the server (in the client phase's verdict:
    the other ranks stop with it)."""
    failure = round_failure(cfg, round_idx, result)
    if failure is not None:
        raise failure


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
        averaged = algorithm.averaged_keys(download.tensors)  # what an attack on weights may change
        upload = policies.on_upload(upload, {k: v for k, v in download.tensors.items() if k in averaged}, round_idx, client_idx)
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
