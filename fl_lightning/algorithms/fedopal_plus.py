"""FedOPAL+ : FedOPAL that keeps AFL's classifier whenever its prompts do not help on held-out data.

Departures from FedOPAL (``fedopal.py``), each ours, not the paper's:

1. **Prompts first, statistics second** (``restat: global``, the default here; two rounds).
   Faithful FedOPAL solves W* (Eq. (9)) from statistics taken under each client's own drifted
   prompts P_k but infers under P_global = mean_k P_k (Eq. (8), (10)): under label skew the two
   feature maps disagree and accuracy collapses. Here round 0 uploads the prompts *only*
   (M·D numbers, no R_k, C_k), the server averages them, and round 1 streams every client's data
   once under P_global for R_k, C_k — so W* is solved on exactly the features used at inference,
   and the federated W* equals the centralized ridge solution under P_global for any partition
   (the AFL exactness argument). ``restat: local`` keeps one round with FedOPAL's local statistics
   (and its mismatch), with departure 2 still applied (and no validation: ``val_fraction: 0``).

2. **Adaptive μ by label coverage** (``min_classes``). A client holding fewer than ``min_classes``
   distinct labels (in its fit share) trains nothing (μ = ∞: its P_k = P_init), and its prompts are
   left out of the mean of Eq. (8). Cross-entropy on a single class is minimised by the head's bias
   alone, so such a client's prompt gradient carries no class-discriminative signal, only drift.
   If no client trains, P_global = P_init.

3. **Prompt aggregation over contributing clients** (``prompt_aggregation``): the plain mean (the
   paper) or the N_k-weighted mean, over the clients that trained (departure 2).

4. **AFL's head is always a candidate; federated validation picks** (``val_fraction`` > 0, the
   default). Every client holds out ``floor(val_fraction · N_k)`` of its own training samples
   (``data/validation.py``, seeded by (seed, client)); round 0 trains the prompts on the rest only.
   In round 1 each client streams all its data once — one patch embedding, the trunk twice — and
   uploads the statistics of Eq. (7) of two feature maps, the prompt-free h₀ (AFL's) and h_P under
   P_global, each over all its data and over its validation share: 4 × AFL's statistics. The server
   fits every candidate (feature map f ∈ {AFL, prompted}) × (λ ∈ [``lam``, *``lam_grid``]) on the
   statistics *without* the validation shares, scores it by its squared error on them (computable
   from their statistics alone, :func:`~fl_lightning.analytic.validation_loss`), keeps the best —
   AFL's head at ``lam`` on a tie, and when no client holds a validation sample — and refits it on all
   the data. So the AFL candidate is exactly AFL's W (same statistics, same λ, same solve), the
   prompted one is the exact centralized ridge under P_global, and the choice reads the clients'
   training data only, never the test split. With ``val_fraction: 0`` the method is departures 1-3
   alone (always the prompted head, AFL's bytes).

Stages: ``val_fraction`` > 0 = :class:`CoveringPrompts` (round 0, prompts only, trained on the fit
share) → :class:`ValidatedStatistics` (round 1); ``val_fraction: 0``, ``restat: global`` =
:class:`CoveringPrompts` → FedOPAL's :class:`~fl_lightning.algorithms.fedopal.Statistics`;
``restat: local`` = :class:`CoveringPrompts` handed the analytic head (one round: P_k with R_k, C_k
under it). Each stage is handed FedOPAL's :class:`~fl_lightning.algorithms.fedopal.PromptTrainer` and
:class:`~fl_lightning.algorithms.afl.AnalyticHead`; one client of the default is
:meth:`CoveringPrompts.client_update` and ``PromptTrainer.tune`` (round 0), then
:meth:`ValidatedStatistics.client_update` and :func:`dual_statistics` (round 1).

Everything else is FedOPAL's: VPT-shallow prompts (``num_prompts``, ``prompt_seed``), Eq. (6) with
the proximal ``mu`` for the clients that train, the temporary linear head and ``train.*``
(epochs, optimizer, lr, momentum, weight decay, batch size), and AFL's solve (``lam``,
``regularization``, ``remove_regularization``, ``dtype``). The faithful method is one switch away:
``algorithm: fedopal``.

Costs (per client; S = d(d+1)/2 + d·c float64, AFL's upload; P = M·D float32): round 0 uploads P and
trains E epochs (on the fit share); round 1 uploads 4·S (``val_fraction`` > 0) or S, and runs the
trunk twice (once) over the client's data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Subset

from fl_lightning.algorithms.fedopal import (
    AnalyticStage,
    FedOPAL,
    FedOPALConfig,
    PromptTrainer,
    PromptVotes,
    Statistics,
    aggregate_prompts,
)
from fl_lightning.analytic import AnalyticStatistics, StatisticsSum, choose_ridge, regularization, solve_classifier
from fl_lightning.data.validation import validation_split
from fl_lightning.errors import check
from fl_lightning.federation.algorithm import Client, Environment, RoundPlan, State, register
from fl_lightning.federation.policies.privacy_coverage import never_covered
from fl_lightning.federation.stages import Stage
from fl_lightning.federation.transport import Download, Upload

__all__ = [
    "FedOPALPlus",
    "FedOPALPlusConfig",
    "CoveringPrompts",
    "ValidatedStatistics",
    "covering_clients",
    "fit_share",
    "validation_positions",
    "dual_statistics",
    "aggregate_prompts",
    "HEADS",
    "STATISTICS_SETS",
]

HEADS = ("afl", "prompted")  # the candidate feature maps, in the order of choose_ridge (0: AFL's, kept on ties)
STATISTICS_SETS = ("afl", "prompted", "afl_val", "prompted_val")  # what a client uploads in round 1


@dataclass
class FedOPALPlusConfig(FedOPALConfig):
    restat: Literal["local", "global"] = "global"  # global: prompts in round 0, statistics under P_global in round 1
    min_classes: int = 2  # clients with fewer distinct labels keep P_init (μ = ∞) and do not vote in Eq. (8)
    # Each client's held-out share of its own training data for the choice between AFL's head and the
    # prompted one (departure 4); 0: no choice, always the prompted head. 0.2: ~290 of the digits' 1437.
    val_fraction: float = 0.2
    lam_grid: list = field(default_factory=list)  # further λ candidates beside `lam` (chosen on validation too)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.min_classes >= 1, "min_classes", self.min_classes, "an int >= 1 (1: every client trains)")
        check(0.0 <= self.val_fraction < 1.0, "val_fraction", self.val_fraction, "a float in [0, 1)")
        check(
            self.restat == "global" or self.val_fraction == 0,
            "val_fraction",
            self.val_fraction,
            "0 with restat: local (the one-shot variant has no round to validate in; or restat: global)",
        )
        check(
            all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in self.lam_grid),
            "lam_grid",
            self.lam_grid,
            "a list of floats >= 0",
        )
        check(
            not self.lam_grid or self.val_fraction > 0,
            "lam_grid",
            self.lam_grid,
            "empty with val_fraction: 0 (λ is chosen on validation)",
        )
        self.lam_grid = [float(v) for v in self.lam_grid]


def covering_clients(class_counts: Tensor, min_classes: int) -> Tensor:
    """Which clients hold at least ``min_classes`` distinct labels.

    Args:
        class_counts: (K, C) non-negative label counts per client.
        min_classes: m ≥ 1.

    Returns:
        (K,) bool: ``(class_counts > 0).sum(1) >= m``.
    """
    if class_counts.ndim != 2:
        raise ValueError(f"class_counts must be (K, C), got shape {tuple(class_counts.shape)}")
    if min_classes < 1:
        raise ValueError(f"min_classes must be >= 1, got {min_classes}")
    return (class_counts > 0).sum(dim=1) >= min_classes


def validation_positions(client: Client, val_fraction: float, seed: int) -> np.ndarray:
    """Positions (in ``client.dataset``) of the client's validation share, seeded by (seed, client)."""
    return validation_split(client.num_samples, val_fraction, (seed, client.index))[1]


def fit_share(client: Client, val_fraction: float, seed: int, env: Environment) -> Client:
    """The client restricted to its fit share, its class counts those of the share (itself when nothing is held out)."""
    if val_fraction == 0:
        return client
    fit, _ = validation_split(client.num_samples, val_fraction, (seed, client.index))
    labels = np.asarray(env.splits.train_targets)[env.partition[client.index]][fit]
    counts = np.bincount(labels, minlength=env.num_classes)
    return Client(client.index, Subset(client.dataset, fit.tolist()), len(fit), counts)


def dual_statistics(trainer: PromptTrainer, client: Client, held_out: np.ndarray, dtype: torch.dtype) -> list[AnalyticStatistics]:
    """Eq. (7) of h₀ (no prompts: AFL's features) and h_P (under the trainer's prompts), over all the client's data
    and over its validation share (positions ``held_out``), in the order of ``STATISTICS_SETS``; one pass, the
    patch embedding computed once. The h₀ statistics are AFL's own (same batches, same operations)."""
    bb, model, device = trainer.backbone, trainer.model, trainer.fabric.device
    d, c = bb.feature_dim, trainer.env.num_classes
    held = torch.zeros(client.num_samples, dtype=torch.bool)
    held[torch.from_numpy(held_out)] = True
    with torch.inference_mode(False):
        stats = [AnalyticStatistics.zeros(d, c, dtype, device) for _ in STATISTICS_SETS]
    start = 0
    with torch.inference_mode():
        for images, labels in trainer.env.loader(client.dataset, shuffle=False):
            images, labels = images.to(device), labels.to(device)
            mask = held[start : start + len(labels)].to(device)
            start += len(labels)
            with trainer.fabric.autocast():
                tokens = bb.embed(images)  # (B, 1 + L, D)
                h0 = bb.pool(bb.encode(tokens))  # (B, d), = bb(images)
                hp = bb.pool(bb.encode(model.insert_prompts(tokens)))  # (B, d), Eq. (5)
            h0, hp = h0.to(dtype), hp.to(dtype)
            stats[0].update(h0, labels)
            stats[1].update(hp, labels)
            if bool(mask.any()):
                stats[2].update(h0[mask], labels[mask])
                stats[3].update(hp[mask], labels[mask])
    return stats


class CoveringPrompts(AnalyticStage):
    """Departures 2 and 3: only a client holding ``min_classes`` labels (in its fit share) trains, and only its P_k
    votes in Eq. (8); with departure 4 a client sees only its fit share (its validation share is never trained on).

    Handed the analytic head (``restat: local``), the round is FedOPAL's one shot: each client uploads R_k, C_k
    under its P_k beside it and the server solves W* too; handed none (``restat: global``), prompts only."""

    config_class = FedOPALPlusConfig
    config: FedOPALPlusConfig

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        client = fit_share(client, self.config.val_fraction, self.trainer.cfg.seed, self.trainer.env)
        trains = bool(covering_clients(torch.as_tensor(client.class_counts)[None], self.config.min_classes)[0])
        p_k = self.trainer.tune(round_idx, client, download.tensors["prompts"], train=trains)  # Eq. (6), or P_init
        meta = {"num_samples": int(client.num_samples), "trained": int(trains)}
        if self.head is None:
            return Upload({"prompts": p_k}, meta)
        return self.head.upload(self.trainer.statistics(client), {"prompts": p_k}, **meta)

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        prompts = {"prompts": tuple(download.tensors["prompts"].shape)}
        return prompts if self.head is None else {**self.head.shapes(), **prompts}

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        if not uploads:
            raise RuntimeError(f"round {round_idx}: no client uploaded anything")
        votes = PromptVotes(self.config)

        def vote(upload: Upload) -> None:  # a client that kept P_init does not vote
            if int(upload.meta.get("trained", 1)):
                votes(upload)

        solved: State = {}
        if self.head is None:
            for upload in uploads.values():
                vote(upload)
        else:
            total, count = self.head.fold(round_idx, uploads, vote)
            solved = {"W": self.head.solve(total, count)}
        return {**state, "prompts": votes.mean(state["prompts"]), "prompt_voters": torch.tensor(len(votes.prompts)), **solved}


class ValidatedStatistics(AnalyticStage):
    """Departure 4, round 1: both feature maps' statistics (all data, validation share) → the chosen head."""

    config_class = FedOPALPlusConfig
    config: FedOPALPlusConfig

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        self.trainer.tune(round_idx, client, download.tensors["prompts"], train=False)  # P_global
        held_out = validation_positions(client, self.config.val_fraction, self.trainer.cfg.seed)
        stats = dual_statistics(self.trainer, client, held_out, self.head.dtype)
        tensors = {f"{name}.{key}": t.cpu() for name, st in zip(STATISTICS_SETS, stats) for key, t in st.to_upload().items()}
        return Upload(tensors, {"num_samples": int(stats[0].N), "num_val": int(stats[2].N)})

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        shapes = self.head.shapes()
        return {f"{name}.{key}": shape for name in STATISTICS_SETS for key, shape in shapes.items()}

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        folds = {name: StatisticsSum() for name in STATISTICS_SETS}
        for upload in uploads.values():  # client order, one upload in memory at a time
            for name, fold in folds.items():
                n = upload.meta["num_val"] if name.endswith("_val") else upload.meta["num_samples"]
                fold.add_upload({key: upload.tensors[f"{name}.{key}"] for key in ("R_upper", "C")}, n)
        if folds["afl"].count == 0:
            raise RuntimeError(f"round {round_idx}: no client uploaded statistics; nothing to solve")
        c = self.config
        lams = [
            regularization(v, num_clients=folds["afl"].count, convention=c.regularization, remove=c.remove_regularization)
            for v in (c.lam, *c.lam_grid)
        ]
        full = [folds[name].total() for name in HEADS]
        val = [folds[f"{name}_val"].total() for name in HEADS]
        if val[0].N == 0:  # nothing held out anywhere: keep AFL's head, the safe default
            head, lam, losses = 0, lams[0], torch.full((len(HEADS), len(lams)), float("nan"), dtype=torch.float64)
        else:
            choice = choose_ridge(full, val, lams)
            head, lam, losses = choice.feature, choice.lam, choice.losses
        W = solve_classifier(full[head].R, full[head].C, lam=lam)  # the winner refitted on all the data
        return {
            **state,
            "W": W,
            "head": torch.tensor(head),
            "lam_chosen": torch.tensor(lam, dtype=torch.float64),
            "val_losses": losses,
            "val_samples": torch.tensor(int(val[0].N)),
        }


@register("fedopal_plus")
class FedOPALPlus(FedOPAL):
    """FedOPAL's prompt trainer and analytic head in the stages of ``val_fraction`` and ``restat`` (module docstring)."""

    config_class = FedOPALPlusConfig

    # federation.privacy: not covered (its dual statistics are not clipped).
    privacy_gap = never_covered(
        "its second stage uploads statistics under the held-out covering split (afl.*, *_val) that no mechanism clips or noises"
    )

    @classmethod
    def stages_for(cls, config: FedOPALPlusConfig) -> tuple[type[Stage], ...]:
        if config.val_fraction > 0:
            return (CoveringPrompts, ValidatedStatistics)
        return {"global": (CoveringPrompts, Statistics), "local": (CoveringPrompts,)}[config.restat]

    def make_stage(self, stage_class: type[Stage], first_round: int) -> Stage:
        """As FedOPAL's; the covering round is handed the analytic head only in the one-shot ``restat: local``."""
        prompts_only = stage_class is CoveringPrompts and self.config.restat == "global"
        return stage_class(first_round, config=self.config, trainer=self.trainer, head=None if prompts_only else self.head)

    def summary_extras(self, state: State) -> dict[str, Any]:
        voters = int(state["prompt_voters"]) if "prompt_voters" in state else None
        out = {
            **super().summary_extras(state),
            "min_classes": self.config.min_classes,
            "prompt_voters": voters,
            "val_fraction": self.config.val_fraction,
        }
        if "head" in state:
            out.update(
                head=HEADS[int(state["head"])],
                lam_chosen=float(state["lam_chosen"]),
                val_samples=int(state["val_samples"]),
                val_losses=state["val_losses"].tolist(),
            )
        return out
