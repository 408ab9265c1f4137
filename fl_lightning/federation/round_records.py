"""A finished round's totals, history and metrics row, and the run's summary: the same on every rank (a round's
result holds every rank's client records). The engine adds what the method, the update policies and the clients'
behaviour report (``extras``); metrics.csv, W&B and summary.json read these."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig
    from fl_lightning.federation.run_state import RunState
    from fl_lightning.federation.storage.round_store import RoundResult

__all__ = ["record_round", "run_summary"]


def record_round(
    run: RunState,
    round_idx: int,
    row: dict[str, Any],
    result: RoundResult,
    *,
    round_start: float,
    run_start: float,
) -> None:
    """``run``'s totals and history after ``round_idx``, and ``row`` completed with the round's counts and appended
    to the run's rows (its per-class accuracy kept aside, for the summary); the caller adds its own columns after."""
    bytes_up, bytes_down = result.bytes_up, sum(result.bytes_down.values())
    run.bytes_up += bytes_up
    run.bytes_down += bytes_down
    run.failed_clients.update({str(c): f"round {round_idx}: {m}" for c, m in result.failures.items()})
    run.history.client_compute_s.update(result.compute_s)
    run.history.round_s.append(time.monotonic() - round_start)
    run.wall_time_s = time.monotonic() - run_start
    run.completed_rounds = round_idx + 1
    row.update(
        {
            "clients": len(result.records),
            "failed": len(result.failures),
            "bytes_up_round": bytes_up,
            "bytes_down_round": bytes_down,
            "bytes_up": run.bytes_up,
            "bytes_down": run.bytes_down,
            "round_time_s": run.history.round_s[-1],
            "client_compute_s_max": max(result.compute_s.values(), default=0.0),
        }
    )
    run.per_class_accuracy = row.pop("per_class_accuracy", None)
    run.rows.append(row)


def run_summary(cfg: RunConfig, run: RunState, *, world_size: int, extras: dict[str, Any]) -> dict[str, Any]:
    """summary.json's numbers of ``run`` after its last round, with ``extras`` (the method's and the policies')."""
    last = run.rows[-1] if run.rows else {}
    return {
        "algorithm": cfg.algorithm,
        "dataset": cfg.data.name,
        "num_clients": cfg.partition.num_clients,
        "alpha": cfg.partition.alpha,
        "seed": cfg.seed,
        "rounds": len(run.rows),
        "accuracy": last.get("accuracy"),
        "loss": last.get("loss"),
        "bytes_up": run.bytes_up,
        "bytes_down": run.bytes_down,
        "bytes_up_per_client": run.bytes_up / max(cfg.partition.num_clients, 1),
        "wall_time_s": run.wall_time_s,
        "world_size": world_size,
        "failed_clients": run.failed_clients,
        "per_class_accuracy": run.per_class_accuracy,
        # partition.client_test_fraction: the last federated evaluation on the clients' own test rows
        **{k: v for k, v in last.items() if k.startswith("fed_test_")},
        **extras,
    }
