"""The Fabric federation loop: one visible ``for round_idx`` with the phases in order.

    plan → client updates (each rank, its clients) → transport (gather to the server) → aggregate
         → evaluate → callbacks, metrics.csv, checkpoint

Fabric launches the ranks; clients are dealt to ranks balanced by data size; each rank builds the
algorithm's shared model ONCE and swaps only per-client state. Uploads are gathered to rank 0 and
aggregated in client order, so ``devices: 1`` and ``devices: 2`` give identical results. A
checkpoint is written after every finished client and every round; ``resume`` continues from it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from lightning.fabric import Fabric, seed_everything

from fl_lightning.config import RunConfig, dump_config
from fl_lightning.data.partition import client_class_counts, dirichlet_partition, iid_partition, shard_partition
from fl_lightning.data.registry import DatasetSplits, build_dataset
from fl_lightning.data.report import write_partition_report
from fl_lightning.data.transforms import build_transform
from fl_lightning.errors import ConfigError
from fl_lightning.federation.algorithm import ALGORITHMS, Algorithm, Environment, RoundHistory, State
from fl_lightning.federation.checkpoint import atomic_save, safe_load
from fl_lightning.federation.placement import assign_clients, client_seed, sample_clients
from fl_lightning.federation.run_folder import write_metrics_csv, write_summary, write_text_atomic
from fl_lightning.federation.transport import Download, Upload, check_upload

__all__ = ["Simulation", "ClientFailure", "partition_for"]


class ClientFailure(RuntimeError):
    """A client raised (or sent a rejected upload) and ``federation.on_client_error`` is ``raise``."""


def partition_for(cfg: RunConfig, targets: np.ndarray) -> list[np.ndarray]:
    p = cfg.partition
    if p.scheme == "iid" or math.isinf(p.alpha) and p.scheme == "dirichlet":
        return iid_partition(len(targets), p.num_clients, seed=p.seed)
    if p.scheme == "shards":
        return shard_partition(targets, p.num_clients, p.shards_per_client, seed=p.seed)
    return dirichlet_partition(targets, p.num_clients, p.alpha, seed=p.seed, min_samples=p.min_samples,
                               balance=p.balance)


def _strategy(cfg: RunConfig) -> str:
    f = cfg.federation
    if f.strategy != "auto":
        return f.strategy
    return "ddp" if f.devices * f.num_nodes > 1 else "auto"


class Simulation:
    """A federated simulation of ``cfg`` (see :class:`fl_lightning.config.RunConfig`).

    Args:
        cfg: the resolved run configuration.
        callbacks: extra Fabric callbacks (objects with hook methods such as ``on_round_end``).
        resume: continue from ``cfg.run_dir/checkpoints`` instead of starting afresh.

    Example:
        >>> summary = Simulation(cfg=load_config("conf/quickstart.yaml")).run()
    """

    def __init__(self, *, cfg: RunConfig, callbacks: Sequence[object] = (), resume: bool = False,
                 loggers: Sequence[object] | None = None) -> None:
        from fl_lightning.callbacks import default_callbacks, default_loggers

        ALGORITHMS[cfg.algorithm].preflight(cfg)  # fail in seconds, before Fabric prints or launches anything
        self.cfg, self.resume = cfg, resume
        self.run_dir = cfg.run_dir
        self.ckpt_dir = self.run_dir / "checkpoints"
        loggers = list(loggers) if loggers is not None else default_loggers(cfg)
        self.fabric = Fabric(accelerator=cfg.federation.accelerator, devices=cfg.federation.devices,
                             num_nodes=cfg.federation.num_nodes, strategy=_strategy(cfg),
                             precision=cfg.federation.precision,
                             callbacks=[*default_callbacks(cfg, loggers), *callbacks], loggers=loggers)

    # ------------------------------------------------------------------------------------ set-up
    def _setup(self) -> tuple[Algorithm, Environment]:
        cfg, fabric = self.cfg, self.fabric
        algorithm = ALGORITHMS[cfg.algorithm](cfg=cfg)
        algorithm.build(fabric)  # the shared model, once per rank
        spec = algorithm.input_spec()
        transform = {"normalization": spec.normalization, "image_size": spec.image_size, "mean": spec.mean,
                     "std": spec.std}
        splits: DatasetSplits = build_dataset(
            cfg.data.name, root=cfg.data.root, download=cfg.data.download, seed=cfg.seed,
            num_samples=cfg.data.num_samples,
            train_transform=build_transform(**transform, train=algorithm.augment),
            test_transform=build_transform(**transform, train=False))
        partition = partition_for(cfg, splits.train_targets)
        env = Environment(fabric, cfg, splits, partition, self.run_dir)
        algorithm.setup(env)
        return algorithm, env

    def _gather(self, obj: Any) -> list[Any]:
        if self.fabric.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.fabric.world_size
        dist.all_gather_object(out, obj)
        return out

    def _partial_path(self, round_idx: int, rank: int) -> Path:
        return self.ckpt_dir / f"round{round_idx:04d}_rank{rank}.pt"

    def _load_partial(self, round_idx: int) -> dict[str, dict]:
        done: dict[str, dict] = {"uploads": {}, "failures": {}, "compute_s": {}, "bytes_down": {}}
        for path in sorted(self.ckpt_dir.glob(f"round{round_idx:04d}_rank*.pt")):
            part = safe_load(path)
            for key in done:
                done[key].update(part[key])
        return done

    # -------------------------------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        fabric, cfg = self.fabric, self.cfg
        fabric.launch()
        seed_everything(cfg.seed, verbose=False)
        algorithm, env = self._setup()
        rank, world = fabric.global_rank, fabric.world_size
        assignment = assign_clients([len(p) for p in env.partition], world)

        start_round, state, rows = 0, algorithm.initial_state(), []
        history = RoundHistory(metrics=rows)
        totals = {"bytes_up": 0, "bytes_down": 0, "wall_time_s": 0.0}
        failed_clients: dict[str, str] = {}
        per_class: list[float] | None = None
        server_ckpt = self.ckpt_dir / "server.pt"
        if self.resume and server_ckpt.exists():
            saved = safe_load(server_ckpt)
            start_round, state, rows = saved["round"] + 1, saved["state"], saved["rows"]
            history = RoundHistory(saved["client_compute_s"], saved["round_s"], rows)
            totals, failed_clients = saved["totals"], saved["failed_clients"]
            per_class = saved["per_class_accuracy"]
            if start_round > algorithm.num_rounds:
                raise ConfigError("federation.rounds", cfg.federation.rounds,
                                  f"at least the {start_round} rounds this run has already completed")
        if rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.run_dir / "config.yaml", dump_config(cfg))
            counts = client_class_counts(env.splits.train_targets, env.partition, env.num_classes)
            write_partition_report(counts, env.splits.classes, self.run_dir)
        fabric.call("on_run_start", cfg=cfg, env=env, run_dir=self.run_dir)
        run_start = time.monotonic() - totals["wall_time_s"]

        for round_idx in range(start_round, algorithm.num_rounds):
            round_start = time.monotonic()
            clients = sample_clients(cfg.partition.num_clients, cfg.federation.client_fraction,
                                     seed=cfg.federation.sampling_seed, round_idx=round_idx)
            fabric.call("on_round_start", round_idx=round_idx, clients=clients)

            # plan: the server decides once; every rank receives the same downloads
            downloads = algorithm.plan(round_idx, clients, state, history) if rank == 0 else None
            downloads = fabric.broadcast(downloads, src=0) if world > 1 else downloads

            # client updates on this rank, then transport: everything reaches the server, in client order
            results = self._client_phase(algorithm, env, round_idx, [c for c in assignment[rank] if c in clients],
                                         downloads)
            self._raise_on_failure(round_idx, results["failures"])
            uploads = {c: Upload.from_state_dict(results["uploads"][c]) for c in sorted(results["uploads"])}
            failures = dict(sorted(results["failures"].items()))

            # aggregate + evaluate: once, on the server; the new state reaches every rank
            row: dict[str, Any] = {}
            if rank == 0:
                state = algorithm.aggregate(round_idx, state, uploads, failures)
                row = {"round": round_idx, **algorithm.evaluate(state)}
            if world > 1:
                state, row = fabric.broadcast((state, row), src=0)

            bytes_up = sum(u.num_bytes for u in uploads.values())
            bytes_down = sum(results["bytes_down"].values())
            totals["bytes_up"] += bytes_up
            totals["bytes_down"] += bytes_down
            failed_clients.update({str(c): f"round {round_idx}: {m}" for c, m in failures.items()})
            history.client_compute_s.update(results["compute_s"])
            history.round_s.append(time.monotonic() - round_start)
            totals["wall_time_s"] = time.monotonic() - run_start
            row.update({"clients": len(clients), "failed": len(failures), "bytes_up_round": bytes_up,
                        "bytes_down_round": bytes_down, "bytes_up": totals["bytes_up"],
                        "bytes_down": totals["bytes_down"], "round_time_s": history.round_s[-1],
                        "client_compute_s_max": max(results["compute_s"].values(), default=0.0),
                        **algorithm.round_extras(round_idx, state)})
            per_class = row.pop("per_class_accuracy", None)
            rows.append(row)
            fabric.call("on_round_end", round_idx=round_idx, metrics=row, results=results, history=history)
            fabric.log_dict({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=round_idx)
            if rank == 0:
                write_metrics_csv(self.run_dir / "metrics.csv", rows)
                atomic_save({"round": round_idx, "state": {k: v.cpu() for k, v in state.items()}, "rows": rows,
                             "client_compute_s": history.client_compute_s, "round_s": history.round_s,
                             "totals": totals, "failed_clients": failed_clients,
                             "per_class_accuracy": per_class}, server_ckpt)
            fabric.barrier()
            if rank == 0:
                for path in self.ckpt_dir.glob(f"round{round_idx:04d}_rank*.pt"):
                    path.unlink()

        summary = self._summary(algorithm, state, rows, totals, failed_clients, per_class)
        fabric.call("on_run_end", summary=summary, run_dir=self.run_dir)
        for logger in fabric.loggers:  # flush W&B / TensorBoard now, not at interpreter exit
            logger.finalize("success")
        return summary

    def _client_phase(self, algorithm: Algorithm, env: Environment, round_idx: int, my_clients: list[int],
                      downloads: dict[int, Download]) -> dict[str, dict]:
        """Run this rank's clients of the round (skipping those a checkpoint already holds), checkpoint
        after each, and gather every rank's results: {"uploads", "failures", "compute_s", "bytes_down"}."""
        rank = self.fabric.global_rank
        done = self._load_partial(round_idx)  # empty unless resuming mid-round
        mine: dict[str, dict] = {"uploads": {}, "failures": {}, "compute_s": {}, "bytes_down": {}}
        for client_idx in my_clients:
            if client_idx in done["uploads"] or client_idx in done["failures"]:
                continue
            self._run_client(algorithm, env, round_idx, client_idx, downloads[client_idx], mine)
            atomic_save(mine, self._partial_path(round_idx, rank))
        if rank == 0:  # results restored from a checkpoint enter the gather once
            mine = {key: {**done[key], **mine[key]} for key in mine}
        parts = self._gather(mine)
        return {key: {c: v for part in parts for c, v in part[key].items()} for key in mine}

    def _raise_on_failure(self, round_idx: int, failures: dict[int, str]) -> None:
        """``on_client_error: raise`` stops the run on the first failed client (the checkpoint stays)."""
        if failures and self.cfg.federation.on_client_error == "raise":
            c = min(failures)
            raise ClientFailure(f"client {c} failed in round {round_idx}: {failures[c]} "
                                f"(checkpoint kept in {self.ckpt_dir}; set federation.on_client_error: skip "
                                f"to aggregate the others)")

    def _run_client(self, algorithm: Algorithm, env: Environment, round_idx: int, client_idx: int,
                    download: Download, out: dict[str, dict]) -> None:
        fabric, cfg = self.fabric, self.cfg
        fabric.call("on_client_start", round_idx=round_idx, client=client_idx)
        torch.manual_seed(client_seed(cfg.seed, round_idx, client_idx))
        start = time.monotonic()
        out["bytes_down"][client_idx] = download.num_bytes
        try:
            upload = algorithm.client_update(round_idx, env.client(client_idx), download.to(fabric.device))
            check_upload(upload, algorithm.expected_shapes(round_idx, download))
            out["uploads"][client_idx] = upload.state_dict()
        except Exception as err:  # noqa: BLE001 — recorded; the on_client_error policy decides after the gather
            out["failures"][client_idx] = f"{type(err).__name__}: {err}"
        out["compute_s"][client_idx] = time.monotonic() - start
        fabric.call("on_client_end", round_idx=round_idx, client=client_idx,
                    compute_s=out["compute_s"][client_idx], failed=client_idx in out["failures"])

    def _summary(self, algorithm: Algorithm, state: State, rows: list[dict], totals: dict,
                 failed_clients: dict[str, str], per_class: list[float] | None) -> dict[str, Any]:
        cfg, last = self.cfg, rows[-1] if rows else {}
        summary = {
            "algorithm": cfg.algorithm, "dataset": cfg.data.name, "num_clients": cfg.partition.num_clients,
            "alpha": cfg.partition.alpha, "seed": cfg.seed, "rounds": len(rows),
            "accuracy": last.get("accuracy"), "loss": last.get("loss"),
            "bytes_up": totals["bytes_up"], "bytes_down": totals["bytes_down"],
            "bytes_up_per_client": totals["bytes_up"] / max(cfg.partition.num_clients, 1),
            "wall_time_s": totals["wall_time_s"], "world_size": self.fabric.world_size,
            "failed_clients": failed_clients, "per_class_accuracy": per_class,
            **algorithm.summary_extras(state),
        }
        if self.fabric.global_rank == 0:
            write_summary(self.run_dir / "summary.json", summary)
        return summary
