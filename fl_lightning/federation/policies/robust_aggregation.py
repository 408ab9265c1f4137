"""Byzantine-robust aggregators (``federation.aggregator``), computed as Flower's strategies of the same names.

Each rule reads the round's n client weight vectors (every floating-point tensor of the state, flattened and
concatenated in key order: one row per client, client order) — the clients' weights, not their updates — and
returns the new weights:

* ``median``        the coordinate-wise median, unweighted (even n: the mean of the two middle values; Yin et al.
                    2018; Flower's ``FedMedian``);
* ``trimmed_mean``  per coordinate, the c = ⌊β·n⌋ smallest and c largest values dropped and the rest averaged,
                    unweighted (Yin et al. 2018; Flower's ``FedTrimmedAvg``, β = ``trim_fraction``, default 0.2);
* ``krum``          the one client whose score — the sum of its m = max(1, n − f − 2) smallest squared distances
                    to the others — is lowest (the first on a tie; Blanchard et al. 2017; Flower's ``Krum``);
* ``multi_krum``    the q lowest-scored clients averaged, weighted by their example counts (q = ``num_to_keep``,
                    null: n − f);
* ``bulyan``        θ = n − 2f clients picked by Krum one at a time from the shrinking rest, then per coordinate the
                    β = θ − 2f values closest to the picked clients' median averaged, unweighted (El Mhamdi et al.
                    2018; Flower's ``Bulyan``; needs n ≥ 4f + 3).

f is ``num_malicious``. The rules are pure functions on a (n, d) tensor, tested against Flower's outputs; each is a
small subclass of :class:`RobustAggregator` registered by name (its :meth:`~RobustAggregator.combine`), applied by the
engine to the method's aggregate after privacy and before the server optimizer
(:mod:`fl_lightning.federation.policies.order`). A new rule is one such class in one file, anywhere:
docs/adding_a_method.md, "A new robust aggregator".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fl_lightning.federation.policies.policy import RoundContext, UpdatePolicy, named, register_policy
from fl_lightning.federation.ranks.placement import clients_per_round

if TYPE_CHECKING:
    from fl_lightning.federation.transport import Upload

__all__ = [
    "RobustAggregator",
    "Median",
    "TrimmedMean",
    "Krum",
    "MultiKrum",
    "Bulyan",
    "coordinate_median",
    "trimmed_mean",
    "krum_scores",
    "krum_pick",
    "bulyan",
]


def coordinate_median(rows: Tensor) -> Tensor:
    """The coordinate-wise median of ``rows`` (n, d); an even n averages the two middle values (numpy's)."""
    ordered, n = rows.sort(dim=0).values, rows.shape[0]
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def trimmed_mean(rows: Tensor, beta: float) -> Tensor:
    """Per coordinate, the mean of ``rows`` (n, d) without its ⌊β·n⌋ smallest and largest values."""
    n = rows.shape[0]
    cut = int(beta * n)
    if n - 2 * cut < 1:
        raise ValueError(f"trimming {cut} of {n} values at each end leaves none (trim_fraction {beta} < 0.5)")
    return rows.sort(dim=0).values[cut : n - cut].mean(dim=0)


def krum_scores(rows: Tensor, num_malicious: int) -> Tensor:
    """Each row's Krum score: the sum of its m = max(1, n − f − 2) smallest squared distances to the other rows."""
    n = rows.shape[0]
    distances = torch.cdist(rows.double(), rows.double(), compute_mode="donot_use_mm_for_euclid_dist") ** 2
    m = max(1, n - num_malicious - 2)
    distances.fill_diagonal_(-1.0)  # the row itself sorts first and is skipped
    return distances.sort(dim=1).values[:, 1 : m + 1].sum(dim=1)


def krum_pick(rows: Tensor, num_malicious: int, keep: int) -> list[int]:
    """The ``keep`` rows of lowest Krum score (ties: the first), lowest first."""
    scores = krum_scores(rows, num_malicious)
    return sorted(range(rows.shape[0]), key=lambda i: (float(scores[i]), i))[:keep]


def bulyan(rows: Tensor, num_malicious: int) -> Tensor:
    """Bulyan's aggregate of ``rows`` (n, d) with f = ``num_malicious`` (module docstring)."""
    n, f = rows.shape[0], num_malicious
    if n < 4 * f + 3:
        raise ValueError(f"Bulyan needs n >= 4f + 3 clients: {n} uploads for num_malicious f = {f}")
    theta, beta = n - 2 * f, n - 4 * f
    rest, picked = list(range(n)), []
    for _ in range(theta):
        best = rest[krum_pick(rows[rest], f, 1)[0]]
        picked.append(best)
        rest.remove(best)
    chosen = rows[picked]
    closest = (chosen - coordinate_median(chosen)).abs().argsort(dim=0, stable=True)[:beta]
    return chosen.gather(0, closest).mean(dim=0)


@dataclass(frozen=True)
class RobustAggregator(UpdatePolicy):
    """``federation.aggregator``: ``mean`` (the method's own aggregate, as it is), the base of every rule.

    A rule reads the round's n client weight vectors (module docstring) and returns the new weights
    (:meth:`combine`); they replace the method's mean of those tensors, so it composes only with a method whose
    aggregate *is* that weighted mean (``Algorithm.averages_weights``) and with no privacy mechanism (its noise is
    calibrated to the mean's sensitivity): anything else is refused in one line (:meth:`refusal`)."""

    trim_fraction: float = 0.2
    num_malicious: int = 0
    num_to_keep: int | None = None
    # a selecting rule's choice (Krum, Multi-Krum): the rows it kept, then by round the clients, for metrics.csv
    kept: dict[Any, list[int]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, config: Any) -> RobustAggregator:
        """The rule named ``config.name`` with its settings; a name nobody registered is one line."""
        chosen = named("aggregator", config.name, "federation.aggregator.name")
        return chosen(config.trim_fraction, config.num_malicious, config.num_to_keep)

    @classmethod
    def build(cls, cfg: Any, setup: Any) -> RobustAggregator:
        return cls.of(cfg.federation.aggregator)

    @classmethod
    def refusal(cls, cfg: Any, algorithm: type) -> str | None:
        if cls is RobustAggregator:
            return None
        f = cfg.federation
        if f.privacy.mechanism != "off":
            return (
                f"federation.aggregator.name={f.aggregator.name} with federation.privacy.mechanism={f.privacy.mechanism}: "
                f"DP-FedAvg's noise is calibrated to the mean's sensitivity S/D, not to a {f.aggregator.name}'s; use "
                f"aggregator mean under privacy"
            )
        return cls.too_few_clients(f.aggregator.num_malicious, clients_per_round(cfg.partition.num_clients, f.client_fraction))

    @classmethod
    def too_few_clients(cls, num_malicious: int, per_round: int) -> str | None:
        """Why ``per_round`` uploads are too few for the rule with f = ``num_malicious`` (None: enough)."""
        return None

    @property
    def is_mean(self) -> bool:
        return type(self).combine is RobustAggregator.combine

    def combine(self, rows: Tensor, weights: Sequence[float]) -> Tensor:
        """The rule on ``rows`` (n, d) with the clients' example counts ``weights``; the base: their weighted mean."""
        w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
        return ((rows.double() * w[:, None]).sum(dim=0) / w.sum()).to(rows.dtype)

    def on_aggregate(
        self, aggregate: dict[str, Tensor], ctx: RoundContext, state: Mapping[str, Tensor]
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The method's aggregate with the tensors the rule combines replaced by the rule's (``mean``: as it is)."""
        if self.is_mean:
            return aggregate, dict(state)
        averaged = {k: t for k, t in aggregate.items() if ctx.averages(k)}
        new = self.aggregate(averaged, ctx.uploads)
        rows = self.kept.pop("rows", None)
        if rows is not None:  # the uploads' rows in client order
            clients = sorted(ctx.uploads)
            self.kept[ctx.round_idx] = [clients[i] for i in rows]
        return {**aggregate, **new}, dict(state)

    def row(self, round_idx: int, clients: list[int]) -> dict[str, Any]:
        """metrics.csv (rank 0's, where the rule runs): the clients a selecting rule kept, ``;``-separated."""
        kept = self.kept.pop(round_idx, None)
        return {} if kept is None else {"kept_clients": ";".join(str(c) for c in kept)}

    def aggregate(self, state: Mapping[str, Tensor], uploads: Mapping[int, Upload]) -> dict[str, Tensor]:
        """The new values of ``state``'s floating-point tensors that every upload holds, by the rule over the
        uploads in client order (the weights are the clients', not their updates)."""
        clients = sorted(uploads)
        read = [uploads[c] for c in clients]
        keys = [k for k, t in state.items() if t.is_floating_point() and all(k in u.tensors for u in read)]
        if not read or not keys:
            return {}
        dtype = torch.promote_types(state[keys[0]].dtype, torch.float32)
        rows = torch.stack([torch.cat([u.tensors[k].detach().reshape(-1).to(dtype) for k in keys]) for u in read])
        combined = self.combine(rows, [u.meta.get("num_samples", 1) for u in read])
        out, start = {}, 0
        for k in keys:
            size = state[k].numel()
            out[k] = combined[start : start + size].reshape(state[k].shape).to(state[k].device, state[k].dtype)
            start += size
        return out


register_policy("aggregator", "mean")(RobustAggregator)


@register_policy("aggregator", "median")
@dataclass(frozen=True)
class Median(RobustAggregator):
    """The coordinate-wise median, unweighted (Flower's ``FedMedian``)."""

    reads_each_upload = True

    def combine(self, rows: Tensor, weights: Sequence[float]) -> Tensor:
        return coordinate_median(rows)


@register_policy("aggregator", "trimmed_mean")
@dataclass(frozen=True)
class TrimmedMean(RobustAggregator):
    """The β-trimmed mean per coordinate, unweighted (Flower's ``FedTrimmedAvg``, β = ``trim_fraction``)."""

    reads_each_upload = True

    def combine(self, rows: Tensor, weights: Sequence[float]) -> Tensor:
        return trimmed_mean(rows, self.trim_fraction)


@register_policy("aggregator", "multi_krum")
@dataclass(frozen=True)
class MultiKrum(RobustAggregator):
    """The q lowest-scored clients averaged by their example counts (q = ``num_to_keep``, null: n − f)."""

    reads_each_upload = True

    def keep(self, n: int) -> int:
        return self.num_to_keep or n - self.num_malicious

    def combine(self, rows: Tensor, weights: Sequence[float]) -> Tensor:
        picked = krum_pick(rows, self.num_malicious, min(self.keep(rows.shape[0]), rows.shape[0]))
        self.kept["rows"] = picked
        return super().combine(rows[picked], [weights[i] for i in picked])


@register_policy("aggregator", "krum")
@dataclass(frozen=True)
class Krum(MultiKrum):
    """The one client of lowest Krum score (Flower's ``Krum``)."""

    def keep(self, n: int) -> int:
        return 1


@register_policy("aggregator", "bulyan")
@dataclass(frozen=True)
class Bulyan(RobustAggregator):
    """Bulyan (El Mhamdi et al. 2018; Flower's ``Bulyan``): needs n ≥ 4f + 3 uploads a round."""

    reads_each_upload = True

    @classmethod
    def too_few_clients(cls, num_malicious: int, per_round: int) -> str | None:
        if per_round >= 4 * num_malicious + 3:
            return None
        return (
            f"federation.aggregator.name=bulyan with num_malicious f = {num_malicious} needs n >= 4f + 3 = "
            f"{4 * num_malicious + 3} clients a round; this run has {per_round} (partition.num_clients × client_fraction)"
        )

    def combine(self, rows: Tensor, weights: Sequence[float]) -> Tensor:
        return bulyan(rows, self.num_malicious)
