"""Rank 0's side of a round as every rank sees it: the steps rank 0 takes alone and hands to every rank
(:meth:`RoundServer.from_server`, the state sent as what changed: :meth:`RoundServer.state_from_server`), and the
round's aggregate and evaluation — through the update policies in their one order — on rank 0 or, where the method
shares them, on every rank together (docs/ranks.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from fl_lightning.federation.policies.order import PolicyChain
from fl_lightning.federation.policies.policy import RoundContext
from fl_lightning.federation.ranks.collectives import everyone, from_server
from fl_lightning.federation.ranks.state_broadcast import SentState, received_large, send_large
from fl_lightning.phase_times import timed

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from fl_lightning.config import RunConfig
    from fl_lightning.federation.algorithm import Algorithm, Environment, RoundPlan
    from fl_lightning.federation.run_state import RunState
    from fl_lightning.federation.storage.round_store import RoundResult, RoundStore

__all__ = ["RoundServer", "ServedRound"]


@dataclass(frozen=True)
class ServedRound:
    """What serving one round reads: the method and this rank's environment, the run, the round's store of uploads,
    its index and plan, and the client phase's records (rank 0's, every rank's, in a shared aggregate)."""

    algorithm: Algorithm
    env: Environment
    run: RunState
    store: RoundStore
    round_idx: int
    plan: RoundPlan
    result: RoundResult


@dataclass
class RoundServer:
    """The server of a run on this rank: its Fabric, config and update policies, and what of the state rank 0 last
    broadcast (only what changes goes again)."""

    fabric: Fabric
    cfg: RunConfig
    policies: PolicyChain = field(default_factory=lambda: PolicyChain({}))
    sent: SentState = field(default_factory=SentState)

    def serve(self, r: ServedRound) -> tuple[dict, dict[str, Any], RoundResult]:
        """The round's new state, metrics row and client records on every rank: aggregated and evaluated on rank 0
        and sent, or, where the method shares its aggregate or evaluation, on every rank together."""
        if self.fabric.world_size > 1 and (r.algorithm.shared_evaluation or r.algorithm.shared_aggregate(r.round_idx)):
            return self.shared_serve(r)
        return self.state_from_server(
            partial(self.serve_alone, r), r.run.state, f"round {r.round_idx}'s aggregate and evaluation"
        )

    def plan(
        self,
        algorithm: Algorithm,
        store: RoundStore,
        round_idx: int,
        clients: list[int],
        run: RunState,
        start_round: Callable[[], None],
        *,
        resume: bool,
    ) -> tuple[RoundPlan, Exception | None]:
        """``start_round()`` (the ``on_round_start`` callbacks) on every rank, then the server's plan on every rank.
        On the server ``start_round()`` runs in the plan's step, so its failure is the plan phase's outcome (every
        rank stops); another rank's failure there is held and returned, to be raised in its client phase (it
        reaches the server in the records gather)."""
        held: Exception | None = None
        if self.fabric.global_rank != 0:
            try:
                start_round()
            except Exception as err:  # not an interrupt: a launcher signals every rank itself
                held = err

        def decide() -> RoundPlan:
            start_round()
            plan = store.load_plan() if resume else None
            if plan is None:
                plan = algorithm.plan(round_idx, clients, run.state, run.history)
                store.save_plan(plan)
            return plan

        return self.from_server(decide, f"round {round_idx}'s plan"), held

    def state_from_server(self, step: Callable[[], tuple], previous: dict, what: str) -> tuple:
        """``step()`` — the state first, then anything else — on rank 0, its outcome on every rank, the state sent
        as what changed since rank 0's last broadcast (federation/ranks/state_broadcast.py): the other ranks keep their copy
        of every tensor rank 0 left as it was (the frozen backbone of FeDiSyn's rounds: 1.2 GB for a ViT-L), and the
        large changed ones follow the outcome over the backend (GPT-FL's whole model: NCCL on GPUs)."""
        kept: dict[str, Any] = {}

        def server() -> tuple:
            state, *rest = step()
            kept["state"] = state
            return (self.sent.changes(state), *rest)

        changes, *rest = self.from_server(server, what)
        if self.fabric.world_size == 1:
            return (kept["state"], *rest)
        timeout_s = self.cfg.federation.compute_timeout_s
        if self.fabric.global_rank == 0:
            send_large(self.fabric, changes, kept["state"], what=f"{what}: the state's tensors", timeout_s=timeout_s)
            return (kept["state"], *rest)
        large = received_large(self.fabric, changes, what=f"{what}: the state's tensors", timeout_s=timeout_s)
        return (changes.apply(previous, large), *rest)

    def from_server(self, step: Callable[[], Any], what: str, *, send: bool = True) -> Any:
        """``step()`` on rank 0, its outcome on every rank (collectives.py: a failure there ends every rank)."""
        return from_server(self.fabric, step, what=what, timeout_s=self.cfg.federation.collective_timeout_s, send=send)

    def serve_alone(self, r: ServedRound) -> tuple[dict, dict[str, Any], RoundResult]:
        """The server's aggregate (reading the uploads back in client order) and evaluation: the new state, the
        round's metrics row and the round's client records (the small numbers, for every rank's history)."""
        state = self.aggregate(r)
        return state, self.evaluated(r.algorithm, state, r.round_idx), r.result

    @staticmethod
    def evaluated(algorithm: Algorithm, state: dict, round_idx: int) -> dict[str, Any]:
        """The round's metrics row: the method's evaluation of ``state`` (a timed phase, docs/ranks.md)."""
        with timed("evaluation"):
            return {"round": round_idx, **algorithm.evaluate(state)}

    def aggregate(self, r: ServedRound) -> dict:
        """:meth:`aggregated`, a timed phase (its own seconds: round 0's pilots, generation, store and pre-training
        are phases of their own)."""
        with timed("aggregate"):
            return self.aggregated(r)

    def aggregated(self, r: ServedRound) -> dict:
        """The method's aggregate of the round's uploads, through the run's update policies in their one order
        (federation/policies/order.py: late updates and privacy's clipping before it; privacy's noise, a robust rule
        and the server optimizer after it, their states in ``run.policies``): the one path of every rank count and
        every serve."""
        run, round_idx, result = r.run, r.round_idx, r.result
        uploads = r.store.uploads(result.succeeded)
        arrived = [p for p in run.pending if p.arrival == round_idx]  # late updates due now (late: stale)
        if not result.succeeded and not arrived:  # no update arrived (federation.min_clients: 0): the state stands
            return run.state
        ctx = RoundContext(round_idx, run.state, uploads, arrived, r.algorithm.averaged_keys(run.state))
        state = r.algorithm.aggregate(round_idx, run.state, self.policies.on_uploads(uploads, ctx), result.failures, r.plan)
        state, run.policies = self.policies.on_aggregate(state, ctx, run.policies)
        return state

    def shared_serve(self, r: ServedRound) -> tuple[dict, dict[str, Any], RoundResult]:
        """:meth:`serve_alone` with its aggregate and/or evaluation run on every rank together (``env.shared``).

        A shared aggregate: rank 0 first writes the records it holds (every rank then reads the uploads from the
        round's files), every rank aggregates, and rank 0's state reaches every rank. A shared evaluation: every
        rank evaluates the state, each its shard of the test split (algorithms/common.py), in one exchange of
        outcomes."""
        fabric, timeout_s, round_idx = self.fabric, self.cfg.federation.collective_timeout_s, r.round_idx
        if r.algorithm.shared_aggregate(round_idx):

            def records() -> RoundResult:
                r.store.write_held()
                return r.result  # every rank's records (the other ranks hold their own only)

            r = replace(r, result=self.from_server(records, f"round {round_idx}'s records"))
            state = everyone(
                fabric, partial(self.shared_aggregate, r), what=f"round {round_idx}'s aggregate", timeout_s=timeout_s
            )
            state = self.state_from_server(lambda: (state,), r.run.state, f"round {round_idx}'s state")[0]
            if not r.algorithm.shared_evaluation:
                row = self.from_server(lambda: self.evaluated(r.algorithm, state, round_idx), f"round {round_idx}'s evaluation")
                return state, row, r.result
            result = r.result
        else:  # (named as the one-broadcast phase: rank 1 waits here for the aggregate, then evaluates)
            state, result = self.state_from_server(
                lambda: (self.aggregate(r), r.result), r.run.state, f"round {round_idx}'s aggregate and evaluation"
            )
        row = everyone(
            fabric,
            partial(self.shared_evaluation, r.algorithm, r.env, state, round_idx),
            what=f"round {round_idx}'s evaluation",
            timeout_s=timeout_s,
        )
        return state, row, result

    def shared_aggregate(self, r: ServedRound) -> dict:
        """This rank's part of a shared aggregate (the uploads from the round's files; ``env.shared`` set); rank 0's
        state, privacy included, is the one every rank keeps."""
        r.env.shared = True
        try:
            return self.aggregate(r)
        finally:
            r.env.shared = False

    @staticmethod
    def shared_evaluation(algorithm: Algorithm, env: Environment, state: dict, round_idx: int) -> dict[str, Any]:
        """The round's metrics row, evaluated on every rank together (``env.shared``: each rank its shard of the
        test split, the counts gathered, so every rank holds one rank's numbers)."""
        env.shared = True
        try:
            return RoundServer.evaluated(algorithm, state, round_idx)
        finally:
            env.shared = False
