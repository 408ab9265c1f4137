"""The run folder at a run's start and end (rank 0): the records of an abandoned start removed, config.yaml, the
partition's files and the availability trace's copy written (or checked on resume), the server's state restored,
and partition.png drawn once the rounds are done. Called by the engine (federation/simulation.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fl_lightning.config.loading import dump_config
from fl_lightning.data.partition import client_class_counts, write_partition_json
from fl_lightning.data.report import write_partition_figure, write_partition_report
from fl_lightning.durable_write import leftover_temps, write_text_atomic
from fl_lightning.errors import ConfigError
from fl_lightning.federation.availability_trace import TRACE_COPY, check_recorded_trace, trace_text
from fl_lightning.federation.run_data import drawn_twin
from fl_lightning.federation.run_state import RunState
from fl_lightning.federation.storage.client_state import CLIENT_STATE_DIR
from fl_lightning.federation.storage.round_store import RoundStore

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig
    from fl_lightning.federation.algorithm import Algorithm, Environment
    from fl_lightning.federation.storage.server_checkpoint import ServerCheckpoint

__all__ = ["start_run_folder", "record_trace", "restore_run", "drop_stale_rounds", "draw_partition"]


def start_run_folder(cfg: RunConfig, env: Environment, run: RunState, *, resume: bool, trace: np.ndarray | None) -> np.ndarray:
    """config.yaml, partition.csv and partition.json of the run (rank 0; a resumed one keeps the records of the round
    to run next), the availability trace's copy; the clients' class counts."""
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    drop_stale_rounds(run_dir / "checkpoints", run.completed_rounds if resume else -1)
    for tmp in leftover_temps(run_dir):  # a write a kill interrupted (config.yaml, metrics.csv, …)
        tmp.unlink(missing_ok=True)
    write_text_atomic(run_dir / "config.yaml", dump_config(cfg))
    record_trace(run_dir, trace, cfg.federation.clients.availability_trace, resume=resume)
    counts = client_class_counts(env.splits.train_targets, env.partition, env.num_classes)
    write_partition_report(counts, env.splits.classes, run_dir, figure=False)  # figure: after the rounds
    p = cfg.partition
    meta = {
        "dataset": cfg.data.name,
        "scheme": p.scheme,
        "alpha": p.alpha,
        "seed": p.seed,
        "num_samples_subset": cfg.data.num_samples,
        "data_seed": cfg.data_seed,
    }
    extra = {
        "path": cfg.data.path,
        "by": p.by,
        "convention": None if p.convention == "fl_lightning" else p.convention,
        "flower_shuffle_seed": p.flower_shuffle_seed,
    }
    meta.update({k: v for k, v in extra.items() if v is not None})  # only what is set: older files unchanged
    if env.client_test is not None:  # the file holds the whole partition; the local split is made again from it
        meta.update(
            {
                "client_test_fraction": p.client_test_fraction,
                **({} if p.client_test_seed is None else {"client_test_seed": p.client_test_seed}),
            }
        )
    whole = env.partition if env.client_test is None else [np.union1d(a, b) for a, b in zip(env.partition, env.client_test)]
    write_partition_json(
        whole,
        run_dir / "partition.json",
        meta=meta,  # reusable: scheme file
        num_samples=len(env.splits.train_targets),
    )  # Flower's shards may leave rows out
    return counts


def record_trace(run_dir: Path, trace: np.ndarray | None, path: str | None, *, resume: bool) -> None:
    """The availability trace's copy in the run folder: written at the start, checked on resume (rank 0)."""
    if trace is None:
        return
    copy = run_dir / TRACE_COPY
    if resume and copy.is_file():
        check_recorded_trace(copy, trace, path)
    else:
        write_text_atomic(copy, trace_text(trace))


def restore_run(algorithm: Algorithm, checkpoint: ServerCheckpoint, *, resume: bool, rank: int, rounds: int) -> RunState:
    """The run so far: fresh, or the checkpointed RunState when resuming (restored on every rank; ``rounds``: the
    config's ``federation.rounds``, for the line that refuses fewer than the run has done)."""
    if resume and rank == 0:
        checkpoint.sweep()  # temp files of a write a kill interrupted: no rename ever comes for them
    run = checkpoint.load() if resume else None
    if run is None:
        return RunState(state=algorithm.initial_state())
    if run.completed_rounds > algorithm.num_rounds:
        raise ConfigError(
            "federation.rounds",
            rounds,
            f"at least the {run.completed_rounds} rounds this run has already completed",
        )
    algorithm.load_state(run.state)
    return run


def drop_stale_rounds(ckpt_dir: Path, next_round: int) -> None:
    """Records of any round other than the one to run next are from an abandoned start: remove them (and, on a
    fresh start, ``next_round`` −1, the clients' kept state: federation/storage/client_state.py)."""
    for folder in ckpt_dir.glob("round*"):
        if folder.is_dir() and folder.name != f"round{next_round:04d}":
            RoundStore(ckpt_dir, int(folder.name[5:])).clear()
    if next_round < 0:  # a fresh start: no client keeps state from an earlier run in this folder
        shutil.rmtree(ckpt_dir / CLIENT_STATE_DIR, ignore_errors=True)


def draw_partition(run_dir: Path, classes: list[str], counts: np.ndarray) -> None:
    """partition.png, unless drawn already. matplotlib is the slowest part of the partition report (~0.8 s
    on a CPU), so the figure is drawn once the rounds are done: it delays neither the first client nor a
    round (partition.csv and partition.json, written at the start, hold the same numbers)."""
    if (run_dir / "partition.png").exists():
        return
    twin = drawn_twin(run_dir)
    if twin is not None:  # a comparison's runs on one partition share one drawing (the same figure)
        shutil.copyfile(twin, run_dir / "partition.png")
    else:
        write_partition_figure(counts, classes, run_dir)
