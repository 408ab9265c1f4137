"""The federation's differential privacy: where the mechanisms of :mod:`fl_lightning.privacy` act in a round.

Built once per run from ``federation.privacy`` (None when it is ``off``, so a run without DP takes none of
these paths). A method runs under a mechanism only when it declares the pair covered
(:mod:`~fl_lightning.federation.policies.privacy_coverage`, checked before the run starts). The simulation calls it at
these points, none of which needs a method's own code, and on any number of ranks the server's steps run
wherever the aggregate runs (``RoundServer.aggregate``, federation/serve.py):

* ``client_upload`` — on the client, after ``client_update`` (local DP of the statistics: each client
  noises its own R_k, C_k before they leave it, and reports no record count);
* ``server_uploads`` — the server's view of the round's uploads, read lazily in client order. Every client
  weighs the same (``num_samples`` reads 1: a data-size weight would be private itself) and no other number
  a client reports reaches the aggregate. DP-FedAvg clips each update, gives the server its own value of
  every non-float buffer (``num_batches_tracked`` counts a client's batches) and refuses any other tensor;
  central DP of the statistics puts the noise of the sum on the first upload read (the sum's distribution is
  the same; a deployment adds it after secure aggregation); an upload holding a tensor the mechanism does not
  cover stops the run (:class:`PrivacyLeak`: the coverage table is wrong, never a silent leak);
* ``noised_state`` — DP-FedAvg's fixed-denominator estimate and its Gaussian noise on the new global state;
* ``dp_sgd`` — the settings a method hands ``fit_local`` for DP-SGD (``Environment.dp_sgd``; FedOPAL's prompts).

The noise comes from OS entropy by default (``secrets``: the seed of each generator is drawn fresh and never
recorded, so no one holding the run's config can regenerate it); ``reproducible_noise: true`` seeds it from
(seed, round, client) for tests and exact resumes, and the summary then says the ε does not hold against
whoever has the seed.

Accounting (``fl_lightning.privacy.accountant``): DP-FedAvg composes ``rounds`` releases, each sampling a
user with probability q = m/K (the simulator's fixed-size sample of m = round(qK) clients is accounted as
Poisson sampling at q, the usual practice; exact at q = 1). The statistics compose one release per round
with every record in it (q = 1) and, with ``dp_sgd``, the local DP-SGD's epochs·⌈1/q⌉ steps, each a lot
Poisson-sampled at the public rate q (``sampling_rate``; null: B·K/N) — the same rate and step count for every
client, fixed from public quantities (N and K, public as δ < 1/N already takes N; no client's n_k), so σ and ε
are every client's. Every part is composed over all the method's rounds (conservative where a round releases
less).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from fl_lightning.errors import ConfigError, UsageError
from fl_lightning.federation.local_training import DPSGD
from fl_lightning.federation.policies.policy import PolicySetup, RoundContext, UpdatePolicy, register_policy
from fl_lightning.federation.policies.privacy_coverage import coverage_refusal
from fl_lightning.federation.ranks.placement import clients_per_round, derive_seed
from fl_lightning.federation.transport import Upload

if TYPE_CHECKING:
    from fl_lightning.config import PrivacyConfig, RunConfig

__all__ = ["FederationPrivacy", "PrivacyLeak"]

_KEY = "federation.privacy"
_NOISE_TAG = 0x5EC  # separates the noise streams from every other seed derived from (seed, round, client)
_STATISTICS = frozenset({"R_upper", "C", "counts"})  # what the statistics mechanisms clip and noise
_Parts = tuple[tuple[float, int], ...]  # a composition: (sampling rate, releases per round) of each part


class PrivacyLeak(RuntimeError):
    """An upload holds a tensor its run's mechanism does not clip and noise (a method declared a pair covered
    that is not): the run stops before the aggregate reads it."""


@register_policy("privacy", "dp_fedavg")
@register_policy("privacy", "statistics_local")
@register_policy("privacy", "statistics_central")
@dataclass
class FederationPrivacy(UpdatePolicy):
    """The run's mechanism, its calibrated noise multiplier σ and its accounting (see the module docstring).

    As an update policy (federation/policies/order.py): the client's upload (local DP), the uploads as the method
    reads them (clipped, checked, weight 1) and the method's aggregate (DP-FedAvg's noise on the mean)."""

    reads_each_upload = True

    config: PrivacyConfig
    seed: int
    rounds: int
    parts: list[tuple[float, int]]  # per round: (sampling rate, releases) of the release every unit is in
    noise_multiplier: float
    # DP-SGD's (Poisson rate q, steps) per round, every client's (empty without dp_sgd)
    sgd: list[tuple[float, int]] = field(default_factory=list)
    denominator: int = 1  # dp_fedavg: D, the expected number of uploads of a round (McMahan et al.'s qW)
    # dp_fedavg: the keys each client of the round being aggregated sent (m_key counts them), and w_t
    held: dict[int, frozenset[str]] = field(default_factory=dict)
    previous: Mapping[str, torch.Tensor] = field(default_factory=dict)
    lot_size: float = 0.0  # dp_sgd: L = q·N/K, the public expected lot DP-SGD divides its noisy sum by

    @classmethod
    def of(cls, cfg: RunConfig, rounds: int, client_sizes: list[int]) -> FederationPrivacy | None:
        """The run's privacy (None when off); a bad setting is a :class:`ConfigError` (one line, exit 2)."""
        p = cfg.federation.privacy
        if p.mechanism == "off":
            return None
        try:
            import dp_accounting  # noqa: F401
        except ImportError:
            raise UsageError(
                f"usage error: {_KEY}.mechanism={p.mechanism} needs dp-accounting (the accountant): "
                f"pip install --no-deps 'dp-accounting>=0.6.0' absl-py mpmath"
            ) from None
        num_records, sgd, denominator = sum(client_sizes), [], 1
        if p.mechanism == "dp_fedavg":
            K = cfg.partition.num_clients
            denominator = clients_per_round(K, cfg.federation.client_fraction)
            parts = [(denominator / K, 1)]
        else:
            if not p.delta < 1 / num_records:
                raise ConfigError(
                    f"{_KEY}.delta",
                    p.delta,
                    f"a float < 1/N = {1 / num_records:g} (record-level DP over N = {num_records} training records)",
                )
            if math.isinf(p.clip_norm):
                raise ConfigError(f"{_KEY}.clip_norm", p.clip_norm, "a finite float > 0 (features are clipped)")
            parts = [(1.0, 1)]
            if p.dp_sgd and cfg.train.epochs > 0:
                q = sgd_sampling_rate(
                    p.sampling_rate, cfg.train.batch_size or cfg.data.batch_size, num_records, cfg.partition.num_clients
                )
                sgd = [(q, cfg.train.epochs * math.ceil(1 / q))]
        sigma = p.noise_multiplier if p.noise_multiplier is not None else _calibrated(p, (*parts, *sgd), rounds)
        if sigma > 0 and math.isinf(p.clip_norm):
            raise ConfigError(
                f"{_KEY}.clip_norm", p.clip_norm, "a finite float > 0 when there is noise (the sensitivity is the clip norm)"
            )
        return cls(
            p,
            cfg.seed,
            rounds,
            parts,
            sigma,
            sgd,
            denominator,
            lot_size=sgd[0][0] * num_records / cfg.partition.num_clients if sgd else 0.0,
        )

    # -- accounting ---------------------------------------------------------------------------------------
    @classmethod
    def build(cls, cfg: RunConfig, setup: PolicySetup) -> FederationPrivacy | None:
        return cls.of(cfg, setup.num_rounds, setup.client_sizes)

    @classmethod
    def refusal(cls, cfg: RunConfig, algorithm: type) -> str | None:
        return coverage_refusal(cfg, algorithm)

    def on_upload(self, upload: Upload, downloaded: Mapping[str, torch.Tensor], round_idx: int, client: int) -> Upload:
        return self.client_upload(upload, round_idx, client)

    def on_uploads(self, uploads: Mapping[int, Upload], ctx: RoundContext) -> Mapping[int, Upload]:
        return self.server_uploads(uploads, ctx.previous, ctx.round_idx)

    def on_aggregate(
        self, aggregate: dict[str, torch.Tensor], ctx: RoundContext, state: Mapping[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return self.noised_state(aggregate, ctx.round_idx), dict(state)

    def epsilon(self, releases: int) -> float:
        """ε spent after ``releases`` rounds by every unit (each client's DP-SGD has the same public q and steps; inf
        without noise)."""
        from fl_lightning.privacy.accountant import epsilon

        if releases <= 0:
            return 0.0
        if self.noise_multiplier == 0.0:
            return math.inf
        return epsilon(
            self.noise_multiplier,
            delta=self.config.delta,
            accountant=self.config.accountant,
            parts=[(q, steps * releases) for q, steps in (*self.parts, *self.sgd)],
        )

    def row(self, round_idx: int, clients: list[int] | None = None) -> dict[str, float]:
        """metrics.csv: ε spent so far (after round ``round_idx``)."""
        return {"epsilon": self.epsilon(round_idx + 1)}

    def summary(self, rounds_done: int) -> dict[str, Any]:
        p, spent = self.config, self.epsilon(rounds_done)
        record = {
            "mechanism": p.mechanism,
            "epsilon": spent,
            "target_epsilon": p.epsilon,
            "delta": p.delta,
            "noise_multiplier": self.noise_multiplier,
            "clip_norm": p.clip_norm,
            "sampling_rate": self.parts[0][0],
            "accountant": p.accountant,
            **_guarantee(p.mechanism),
            "dp_sgd": None
            if not self.sgd
            else {
                "grad_clip_norm": p.grad_clip_norm,
                "sampling_rate": self.sgd[0][0],
                "steps_per_round": self.sgd[0][1],
                "lot_size": self.lot_size,
                "sampling": "Poisson: each record in each step's lot independently with probability "
                "sampling_rate (public, the same for every client); the noisy sum divided by "
                "lot_size",
            },
            "noise_source": "reproducible (seeded from the run's seed)"
            if p.reproducible_noise
            else "os entropy (never recorded)",
        }
        if p.mechanism == "dp_fedavg":
            record["denominator"] = self.denominator
        if p.reproducible_noise:
            record["warning"] = (
                "privacy.reproducible_noise is on: the noise is seeded from config.yaml's seed, so "
                "whoever has the seed can regenerate and subtract it; this ε does not hold against "
                "them (for tests and exact resumes only)"
            )
        return {"privacy": record, "epsilon": spent, "delta": p.delta, "noise_multiplier": self.noise_multiplier}

    # -- the noise ----------------------------------------------------------------------------------------
    def _seed(self, round_idx: int, client: int, tag: int) -> int:
        if self.config.reproducible_noise:
            return derive_seed(self.seed, round_idx, client, tag)
        return secrets.randbits(63)  # OS entropy: drawn fresh, never written anywhere

    def _generator(self, round_idx: int, client: int) -> torch.Generator:
        return torch.Generator().manual_seed(self._seed(round_idx, client, _NOISE_TAG))

    # -- the mechanisms -----------------------------------------------------------------------------------
    def dp_sgd(self, round_idx: int, client: int) -> DPSGD | None:
        """DP-SGD's settings of one client's local training (None unless ``dp_sgd`` is on): every number public
        but the noise's and the lots' seeds."""
        if not self.sgd:
            return None
        q = self.sgd[0][0]
        return DPSGD(
            self.config.grad_clip_norm,
            self.noise_multiplier,
            self._seed(round_idx, client, _NOISE_TAG + 1),
            sampling_rate=q,
            steps_per_epoch=math.ceil(1 / q),
            denominator=self.lot_size,
            sampling_seed=self._seed(round_idx, client, _NOISE_TAG + 2),
        )

    def _statistics_std(self, tensors: Mapping[str, torch.Tensor]) -> float:
        from fl_lightning.privacy.statistics import sensitivity

        return self.noise_multiplier * sensitivity(self.config.clip_norm, with_counts="counts" in tensors)

    def client_upload(self, upload: Upload, round_idx: int, client: int) -> Upload:
        """Local DP: the client's statistics noised before they leave it, and no record count beside them (other
        mechanisms: as is)."""
        from fl_lightning.privacy.statistics import noise_statistics

        if self.config.mechanism != "statistics_local" or "R_upper" not in upload.tensors:
            return upload
        tensors = noise_statistics(
            upload.tensors, std=self._statistics_std(upload.tensors), generator=self._generator(round_idx, client)
        )
        return Upload(tensors, {"num_samples": 1})

    def server_uploads(
        self, uploads: Mapping[int, Upload], state: Mapping[str, torch.Tensor], round_idx: int
    ) -> Mapping[int, Upload]:
        """The uploads as the method's aggregate reads them (checked, clipped, noised; every weight 1)."""
        mechanism = self.config.mechanism
        if mechanism == "dp_fedavg":
            self.held, self.previous = {}, state
            return _PrivateUploads(uploads, lambda c, u: self._clipped(state, c, u))
        first = next(iter(uploads), None)
        central = mechanism == "statistics_central"
        allowed = _STATISTICS | (frozenset(state) if self.config.dp_sgd else frozenset())  # DP-SGD's keys
        return _PrivateUploads(
            uploads,
            lambda c, u: self._statistics_view(_checked(u, allowed, mechanism, c), round_idx, noise=central and c == first),
        )

    def _clipped(self, state: Mapping[str, torch.Tensor], client: int, upload: Upload) -> Upload:
        from fl_lightning.privacy.dp_fedavg import clip_update, shared_keys

        keys = frozenset(shared_keys(state, upload.tensors))
        kept = {k for k, t in upload.tensors.items() if not t.is_floating_point() and k in state}
        _checked(upload, keys | kept, "dp_fedavg", client)
        tensors, _ = clip_update(state, upload.tensors, self.config.clip_norm)
        tensors.update({k: state[k] for k in kept})  # the server's own buffers: a client's count stays with it
        if keys:
            self.held[client] = keys  # a second read counts once
        return Upload(tensors, {"num_samples": 1})

    def _statistics_view(self, upload: Upload, round_idx: int, *, noise: bool) -> Upload:
        from fl_lightning.privacy.statistics import noise_statistics

        tensors = upload.tensors
        if noise and "R_upper" in tensors:
            tensors = noise_statistics(
                tensors, std=self._statistics_std(tensors), generator=self._generator(round_idx, 0xFFFFFFFF)
            )
        return Upload(tensors, {"num_samples": 1})

    def noised_state(self, state: dict[str, torch.Tensor], round_idx: int) -> dict[str, torch.Tensor]:
        """DP-FedAvg: the new state as w_t + (1/D) Σ Δ̃_k + N(0, (σS/D)²) on every key the round's uploads averaged."""
        from fl_lightning.privacy.dp_fedavg import private_mean

        if self.config.mechanism != "dp_fedavg":
            return state
        m: dict[str, int] = {}
        for keys in self.held.values():
            for key in keys:
                m[key] = m.get(key, 0) + 1
        previous, self.held, self.previous = self.previous, {}, {}
        return private_mean(
            previous,
            state,
            m,
            denominator=self.denominator,
            noise_multiplier=self.noise_multiplier,
            clip_norm=self.config.clip_norm,
            generator=self._generator(round_idx, 0xFFFFFFFE),
        )


class _PrivateUploads(Mapping):
    """A read-only view of a round's uploads, each passed through ``view(client, upload)`` when read."""

    def __init__(self, uploads: Mapping[int, Upload], view) -> None:
        self._uploads, self._view = uploads, view

    def __getitem__(self, client: int) -> Upload:
        return self._view(client, self._uploads[client])

    def __iter__(self) -> Iterator[int]:
        return iter(self._uploads)

    def __len__(self) -> int:
        return len(self._uploads)


def _checked(upload: Upload, covered: frozenset[str] | set[str], mechanism: str, client: int) -> Upload:
    """``upload``, unless it holds a tensor that ``mechanism`` does not cover (:class:`PrivacyLeak`)."""
    leaked = sorted(set(upload.tensors) - set(covered))
    if leaked:
        raise PrivacyLeak(
            f"client {client}'s upload holds {', '.join(map(repr, leaked))}, which {_KEY}.mechanism="
            f"{mechanism} neither clips nor noises: the method's privacy coverage is wrong"
        )
    return upload


def _guarantee(mechanism: str) -> dict[str, str]:
    """The unit, the neighbouring relation and the trust model of a mechanism's ε (summary.json)."""
    if mechanism == "dp_fedavg":
        return {
            "unit": "user",
            "relation": "add/remove one client's whole data set",
            "trust": "central: the server sees the clipped updates; the noise protects against everyone who "
            "sees the global model",
        }
    return {
        "unit": "record",
        "relation": "add/remove one training record (image, label)",
        "trust": "local: the server sees only noised statistics"
        if mechanism == "statistics_local"
        else "central: the server sees each client's clipped statistics; the noise on their sum protects against "
        "everyone who sees the result",
    }


def sgd_sampling_rate(rate: float | None, batch_size: int, num_records: int, num_clients: int) -> float:
    """DP-SGD's public Poisson rate q: ``rate`` as set, else min(1, B·K/N) — a lot of B expected from a client of
    the mean size N/K. Only public numbers enter it (no client's n_k)."""
    return rate if rate is not None else min(1.0, batch_size * num_clients / num_records)


def _calibrated(p: PrivacyConfig, composition: _Parts, rounds: int) -> float:
    """The smallest σ whose ε over ``rounds`` rounds of ``composition`` meets the target."""
    from fl_lightning.privacy.accountant import noise_multiplier

    try:
        return noise_multiplier(
            p.epsilon, delta=p.delta, accountant=p.accountant, parts=[(q, steps * rounds) for q, steps in composition]
        )
    except ValueError as err:
        raise ConfigError(f"{_KEY}.epsilon", p.epsilon, f"a target some noise reaches ({err})") from None
