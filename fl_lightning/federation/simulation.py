"""The Fabric federation loop: one visible ``for round_idx`` with the phases in order.

    plan → client updates (each rank, its clients) → transport (records to the server) → aggregate
         → evaluate → callbacks, metrics.csv, checkpoint

Fabric launches the ranks (or an external launcher did: ``fabric run``, torchrun, SLURM); clients
are dealt to ranks balanced by data size; each rank builds the algorithm's shared model ONCE and
swaps only per-client state. Every finished client leaves one record on disk (its upload and a few
numbers, :mod:`~fl_lightning.federation.storage.round_store`); only those small numbers are gathered to
rank 0, which reads the uploads back in client order while it aggregates — so ``devices: 1`` and
``devices: 2`` give identical results, a client costs O(its upload), and a sum-type aggregate holds
one upload at a time. The server's :class:`~fl_lightning.federation.run_state.RunState` is
checkpointed after every round; ``resume`` continues from it and from the records of the round in
progress.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import torch
from lightning.fabric import Fabric, seed_everything

from fl_lightning.config import RunConfig
from fl_lightning.federation.algorithm import ALGORITHMS, Algorithm, Environment
from fl_lightning.federation.client_behaviour import (
    LATE_STALE,
    ClientBehaviour,
    check_client_behaviour,
)
from fl_lightning.federation.client_phase import client_phase
from fl_lightning.federation.num_clients import resolve_num_clients
from fl_lightning.federation.numerics import torch_numerics
from fl_lightning.federation.policies.order import PolicyChain, check_policies
from fl_lightning.federation.policies.stale_updates import carry_late_updates
from fl_lightning.federation.precision import check_precision
from fl_lightning.federation.ranks.collectives import (
    decided,
    everyone,
    exit_status,
    one_line,
    waiting,
)
from fl_lightning.federation.ranks.ddp_strategy import cli_strategy_taken, fabric_strategy
from fl_lightning.federation.ranks.launch import check_launcher
from fl_lightning.federation.ranks.liveness import watching
from fl_lightning.federation.ranks.placement import assign_clients, deal_in_order, sample_clients
from fl_lightning.federation.ranks.summed_uploads import UploadFold, carry_round_fold, summed_uploads_of
from fl_lightning.federation.round_records import record_round, run_summary
from fl_lightning.federation.run_data import check_client_test
from fl_lightning.federation.run_setup import set_up_run
from fl_lightning.federation.run_state import RunState
from fl_lightning.federation.serve import RoundServer, ServedRound
from fl_lightning.federation.storage.round_store import HOLD_BYTES, RoundStore
from fl_lightning.federation.storage.run_folder import write_metrics_csv, write_summary
from fl_lightning.federation.storage.run_start import draw_partition, restore_run, start_run_folder
from fl_lightning.federation.storage.server_checkpoint import ServerCheckpoint
from fl_lightning.federation.storage.shared_folder import check_shared_run_folder

__all__ = ["Simulation"]


class Simulation:
    """A federated simulation of ``cfg`` (see :class:`fl_lightning.config.RunConfig`).

    Args:
        cfg: the resolved run configuration.
        callbacks: extra Fabric callbacks (objects with hook methods such as ``on_round_end``).
        resume: continue from ``cfg.run_dir/checkpoints`` instead of starting afresh.
        loggers: Fabric loggers (default: those the config asks for).

    Example:
        >>> summary = Simulation(cfg=load_config("conf/quickstart.yaml")).run()
    """

    def __init__(
        self, *, cfg: RunConfig, callbacks: Sequence[object] = (), resume: bool = False, loggers: Sequence[object] | None = None
    ) -> None:
        from fl_lightning.callbacks import default_callbacks, default_loggers

        cfg = resolve_num_clients(cfg)  # natural, num_clients null: one client per value, before anything reads it
        check_precision(cfg, ALGORITHMS[cfg.algorithm])  # a *-true precision the method cannot run in
        # privacy, attacks, late updates, robust aggregators, server optimizers: composable in the one order, or one line
        check_policies(cfg, ALGORITHMS[cfg.algorithm])
        check_client_behaviour(cfg)  # availability / dropout: not beside privacy or a robust aggregator
        check_client_test(cfg, ALGORITHMS[cfg.algorithm])  # federated evaluation: the methods that have it
        ALGORITHMS[cfg.algorithm].preflight(cfg)  # fail in seconds, before Fabric prints or launches anything
        self.launcher = check_launcher(cfg.federation.devices, cfg.federation.num_nodes)
        self.cfg, self.resume = cfg, resume
        self.run_dir = cfg.run_dir
        self._policies = PolicyChain({})  # the update policies, built with the data (federation/policies/order.py)
        # None: every client always there; its trace (a file) read here, on every process: one line before launch
        self._behaviour = ClientBehaviour.of(cfg.federation.clients, cfg.partition.num_clients)
        self.ckpt_dir = self.run_dir / "checkpoints"
        loggers = list(loggers) if loggers is not None else default_loggers(cfg)
        strategy = fabric_strategy(cfg)
        with cli_strategy_taken():
            self.fabric = Fabric(
                accelerator=cfg.federation.accelerator,
                devices=cfg.federation.devices,
                num_nodes=cfg.federation.num_nodes,
                strategy=strategy,
                precision=cfg.federation.precision,
                callbacks=[*default_callbacks(cfg, loggers), *callbacks],
                loggers=loggers,
            )
        self._server = RoundServer(self.fabric, cfg)  # rank 0's side of each round, as every rank sees it (serve.py)

    # ------------------------------------------------------------------------------------ set-up
    def _setup(self) -> tuple[Algorithm, Environment]:
        """This rank's method and environment (federation/run_setup.py); the run's update policies kept."""
        algorithm, env, self._policies = set_up_run(self.cfg, self.fabric)
        self._server.policies = self._policies
        return algorithm, env

    # -------------------------------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        fabric, cfg = self.fabric, self.cfg
        if self.launcher != "fabric run":  # Fabric's CLI has created and set up the processes already
            with waiting(
                "the other ranks to start",
                cfg.federation.compute_timeout_s,
                fabric.global_rank,
                key="federation.compute_timeout_s",
            ):
                fabric.launch()
        # rank 0 decided (train.py: --resume, or the same command after an interruption); its token names this
        # start's heartbeats in the job's store, its host and pid let a frozen rank 0 be named and killed
        # (federation/ranks/liveness.py)
        self.resume, token, leader = self._from_server(
            lambda: (self.resume, secrets.token_hex(8), (socket.gethostname(), os.getpid())), "the start"
        )
        with (
            watching(
                None,
                rank=fabric.global_rank,
                world=fabric.world_size,
                patience_s=cfg.federation.liveness_timeout_s,
                token=token,
                exit_status=exit_status,
                one_line=one_line,
                decided=decided,
                leader=leader,
            ),
            torch_numerics(cfg.federation),
        ):
            return self._run()  # under the config's matmul precision and determinism, whoever calls run()

    def _run(self) -> dict[str, Any]:
        """The run on this rank, from the run folder's check to the summary, while its peers' liveness is watched."""
        fabric, cfg = self.fabric, self.cfg
        # every rank sees the folder rank 0 writes (one shared output_dir, not one per node): seconds, before
        # any data or model is built, not after a whole client phase
        check_shared_run_folder(fabric, self.run_dir)
        if self._behaviour is not None and self._behaviour.trace is not None:  # every rank samples from rank 0's
            trace = self._from_server(lambda: self._behaviour.trace, "the availability trace")
            self._behaviour = self._behaviour.with_trace(trace)
        seed_everything(cfg.seed, verbose=False)
        algorithm, env = self._setup()
        if self._behaviour is not None:  # the clients' simulated times: their sizes and the batch size
            self._behaviour = self._behaviour.with_clients(
                [len(p) for p in env.partition], cfg.train.batch_size or cfg.data.batch_size
            )
        rank, world = fabric.global_rank, fabric.world_size
        assignment = assign_clients([len(p) for p in env.partition], world)
        checkpoint = ServerCheckpoint(self.ckpt_dir)  # server.pt and its parts (written on the server only)
        run = restore_run(algorithm, checkpoint, resume=self.resume, rank=fabric.global_rank, rounds=cfg.federation.rounds)
        # the run folder's start, on the server; the other ranks wait for it (and stop if it fails)
        trace = None if self._behaviour is None else self._behaviour.trace
        counts = self._from_server(
            lambda: start_run_folder(cfg, env, run, resume=self.resume, trace=trace), "the run folder's start", send=False
        )
        fabric.call(
            "on_run_start",
            cfg=cfg,
            env=env,
            run_dir=self.run_dir,
            rounds=algorithm.num_rounds,
            completed_rounds=run.completed_rounds,
        )
        run_start = time.monotonic() - run.wall_time_s
        try:
            self._rounds(algorithm, env, run, assignment, checkpoint, run_start)
        finally:
            checkpoint.wait()  # server.pt is on disk before the summary (or before an error propagates)
        # the rounds are done and durable; the end-of-run reports (partition.png, summary.json) follow
        fabric.call("on_rounds_end", completed_rounds=run.completed_rounds, run_dir=self.run_dir)

        if rank == 0:
            draw_partition(self.run_dir, env.splits.classes, counts)  # a one-off report: after the rounds, never inside one
        summary = self._summary(algorithm, run)
        fabric.call("on_run_end", summary=summary, run_dir=self.run_dir)
        for logger in fabric.loggers:  # flush W&B / TensorBoard now, not at interpreter exit
            logger.finalize("success")
        return summary

    def _from_server(self, step: Callable[[], Any], what: str, *, send: bool = True) -> Any:
        """``step()`` on rank 0, its outcome on every rank (:meth:`RoundServer.from_server`)."""
        return self._server.from_server(step, what, send=send)

    def _rounds(
        self,
        algorithm: Algorithm,
        env: Environment,
        run: RunState,
        assignment: list[list[int]],
        checkpoint: ServerCheckpoint,
        run_start: float,
    ) -> None:
        """The federation loop: plan → client updates → transport → aggregate → evaluate → checkpoint.

        On several ranks a round takes five collectives, each carrying outcomes (collectives.py), so a failure on
        any rank anywhere in the round ends every rank: the plan's broadcast (rank 0's ``on_round_start`` and
        plan), the records gather and its verdict's broadcast (each rank's ``on_round_start`` and clients), the
        aggregate's broadcast (the state, the row, every rank's records) and the round's end exchange (each
        rank's totals, ``on_round_end``, loggers; rank 0's files). One process: none, the same calls in order."""
        fabric, cfg = self.fabric, self.cfg
        for round_idx in range(run.completed_rounds, algorithm.num_rounds):
            round_start = time.monotonic()
            clients = self._sampled(run, round_idx)
            store, mine, blocks = self._round_store(algorithm, env, round_idx, clients, assignment)
            start_round = partial(
                fabric.call,
                "on_round_start",
                round_idx=round_idx,
                clients=clients,
                local_clients=len(set(mine).intersection(clients)),
            )

            # on_round_start, then the plan: the server decides once (a resumed round keeps its checkpointed plan);
            # every rank receives it
            plan, held = self._server.plan(algorithm, store, round_idx, clients, run, start_round, resume=self.resume)

            # client updates on this rank (each leaves a record), then transport: the records reach the server,
            # which decides whether the round goes on (a rank that failed, the client-failure policy)
            sampled = set(plan.downloads)
            try:
                clients_of = {"resume": self.resume, "policies": self._policies, "behaviour": self._behaviour}
                mine_now = [c for c in mine if c in sampled]
                result = client_phase(algorithm, env, store, round_idx, mine_now, plan, held, **clients_of)
                if blocks is not None:  # the sums, in client order over the ranks with clients, to rank 0
                    path = [0, *(r for r, b in enumerate(blocks) if r and sampled.intersection(b))]
                    carry_round_fold(fabric, store.fold, path, f"round {round_idx}", cfg.federation.collective_timeout_s)
            except BaseException:  # a failure, Ctrl-C, SIGTERM: keep the finished clients for --resume
                store.write_held()
                raise

            # aggregate + evaluate: once, on the server, reading the uploads in client order; the new state, the
            # row and every rank's client records reach every rank. A method whose aggregate or evaluation every rank
            # can share runs it on every rank (docs/ranks.md); the state and the numbers are still one rank's
            served = ServedRound(algorithm, env, run, store, round_idx, plan, result)
            run.state, row, result = self._server.serve(served)

            # the round's end on every rank (totals, callbacks, loggers; the server's files), then one exchange of
            # the outcomes: a failure there, on any rank, ends every rank
            everyone(
                self.fabric,
                partial(self._end_round, replace(served, result=result), row, checkpoint, round_start, run_start),
                what=f"round {round_idx}'s end",
                timeout_s=cfg.federation.collective_timeout_s,
            )

    def _sampled(self, run: RunState, round_idx: int) -> list[int]:
        """The round's clients: ``federation.client_fraction`` of them, drawn from those online and not busy with a
        late update (federation.clients), seeded by ``federation.sampling_seed`` and the round."""
        cfg, behaviour = self.cfg, self._behaviour
        sample = sample_clients if behaviour is None else partial(behaviour.sample, busy={p.client for p in run.pending})
        return sample(
            cfg.partition.num_clients, cfg.federation.client_fraction, seed=cfg.federation.sampling_seed, round_idx=round_idx
        )

    def _round_store(
        self, algorithm: Algorithm, env: Environment, round_idx: int, clients: list[int], assignment: list[list[int]]
    ) -> tuple[RoundStore, list[int], list[list[int]] | None]:
        """The round's store of records, this rank's clients and, where the uploads are folded, every rank's block.

        Every rank holds its clients' records in memory while the round is short; the others hand theirs to the
        server in the gather of the records (round_store.py), each at most its share of HOLD_BYTES, so the gather
        brings rank 0 (and, on NCCL, its GPU) at most that much at once. Uploads the aggregate only sums are folded
        instead, by ranks that each run a block of the clients in order (summed_uploads.py)."""
        fabric, federation, rank = self.fabric, self.cfg.federation, self.fabric.global_rank
        summed = summed_uploads_of(algorithm, round_idx, self._policies, federation.record_after_s)
        sizes = [len(p) for p in env.partition]
        blocks = None if summed is None else deal_in_order(sorted(clients), sizes, fabric.world_size)
        share = HOLD_BYTES if rank == 0 else HOLD_BYTES // fabric.world_size
        fold = None if summed is None else UploadFold(summed, fabric.device, starts=rank == 0)
        store = RoundStore(self.ckpt_dir, round_idx, hold_s=federation.record_after_s, hold_bytes=share, fold=fold)
        return store, (assignment[rank] if blocks is None else blocks[rank]), blocks

    def _end_round(
        self, r: ServedRound, row: dict[str, Any], checkpoint: ServerCheckpoint, round_start: float, run_start: float
    ) -> None:
        """This rank's end of a round (``r.result``: every rank's records): its totals and history, ``on_round_end``,
        the loggers; on the server, then, the round's files (only when all of that succeeded on it)."""
        fabric, run, store, round_idx, result = self.fabric, r.run, r.store, r.round_idx, r.result
        if self._behaviour is not None and self._behaviour.late == "stale":
            late = [c for c, reason in result.failures.items() if reason == LATE_STALE]
            delays = {c: self._behaviour.stale_delay(round_idx, c, self.cfg.train.epochs) for c in late}
            held = (lambda c: store.load_client(c)[1]) if fabric.global_rank == 0 else (lambda c: None)
            run.pending, row["arrived"] = carry_late_updates(run.pending, round_idx, delays, held)
        self._record_round(r, row, round_start, run_start)
        fabric.call("on_round_end", round_idx=round_idx, metrics=row, results=result, history=run.history)
        fabric.log_dict({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=round_idx)
        if fabric.global_rank == 0:
            self._save_round(run, store, checkpoint)

    def _save_round(self, run: RunState, store: RoundStore, checkpoint: ServerCheckpoint) -> None:
        """The server's files of a finished round: metrics.csv, server.pt; then its records go."""
        write_metrics_csv(self.run_dir / "metrics.csv", run.rows)
        checkpoint.save(run)  # server.pt (and a part of new large tensors): fsync + rename in the background
        store.clear()

    # ------------------------------------------------------------------------------------ phases
    def _record_round(self, r: ServedRound, row: dict[str, Any], round_start: float, run_start: float) -> None:
        """The round's totals, history and metrics row (federation/round_records.py), with what the method, the
        update policies and the clients' behaviour report."""
        run, round_idx, result = r.run, r.round_idx, r.result
        clients, behaviour = sorted(result.records), self._behaviour
        extras = {
            **self._policies.row(round_idx, clients),
            **(behaviour.row(round_idx, clients, result.failures) if behaviour is not None else {}),
        }
        record_round(run, round_idx, row, result, round_start=round_start, run_start=run_start)  # round_extras reads them
        row.update({**r.algorithm.round_extras(round_idx, run.state), **extras})

    def _summary(self, algorithm: Algorithm, run: RunState) -> dict[str, Any]:
        extras = {**algorithm.summary_extras(run.state), **self._policies.summary(len(run.rows))}
        summary = run_summary(self.cfg, run, world_size=self.fabric.world_size, extras=extras)
        if self.fabric.device.type == "cuda":  # this rank's peak since its process started (the GPU check's table)
            summary["peak_gpu_memory_bytes"] = int(torch.cuda.max_memory_allocated(self.fabric.device))
        if self.fabric.global_rank == 0:
            write_summary(self.run_dir / "summary.json", summary)
        return summary
