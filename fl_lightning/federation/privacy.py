"""The federation's differential privacy: where the mechanisms of :mod:`fl_lightning.privacy` act in a round.

Built once per run from ``federation.privacy`` (None when it is ``off``, so a run without DP takes none of
these paths). The simulation calls it at three points, none of which needs a method's own code:

* ``client_upload`` — on the client, after ``client_update`` (local DP of the statistics: each client
  noises its own R_k, C_k before they leave it);
* ``server_uploads`` — the server's view of the round's uploads, read lazily in client order: DP-FedAvg
  clips each update and weighs every client equally (``num_samples`` reads 1: a data-size weight would be
  private itself and scale one user's influence); central DP of the statistics puts the noise of the sum
  on the first upload read (the sum's distribution is the same; a deployment adds it after secure
  aggregation);
* ``noised_state`` — DP-FedAvg's Gaussian noise on the averaged keys of the new global state;
* ``dp_sgd`` — the settings a method hands ``fit_local`` for DP-SGD (``Environment.dp_sgd``; FedOPAL's prompts).

The noise is drawn from generators seeded by (seed, round, client): a resumed round draws the same noise, as
the rest of the simulator does. A deployment draws it from a cryptographically secure source.

Accounting (``fl_lightning.privacy.accountant``): DP-FedAvg composes ``rounds`` releases, each sampling a
user with probability ``client_fraction`` (the simulator's fixed-size sample of m = round(qK) is accounted
as Poisson sampling at q = m/K, the usual practice; exact at q = 1); the statistics compose one release per
round with every record in it (q = 1), and with ``dp_sgd`` the smallest client's DP-SGD steps, all with one σ.
Every part is composed over all the method's rounds (conservative where a round releases less).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from fl_lightning.errors import ConfigError, UsageError
from fl_lightning.federation.local_training import DPSGD
from fl_lightning.federation.placement import clients_per_round, derive_seed
from fl_lightning.federation.transport import Upload

if TYPE_CHECKING:
    from fl_lightning.config import PrivacyConfig, RunConfig

__all__ = ["FederationPrivacy"]

_KEY = "federation.privacy"
_NOISE_TAG = 0x5EC  # separates the noise streams from every other seed derived from (seed, round, client)


@dataclass
class FederationPrivacy:
    """The run's mechanism, its calibrated noise multiplier σ and its accounting (see the module docstring)."""

    config: PrivacyConfig
    seed: int
    rounds: int
    parts: list[tuple[float, int]]  # per round: (sampling rate, releases) of each mechanism, sharing σ
    noise_multiplier: float
    sgd: tuple[float, int] | None = None  # DP-SGD's (rate, steps) per round for the smallest client
    # dp_fedavg: the keys each client of the round being aggregated sent (m_key counts them)
    held: dict[int, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: RunConfig, rounds: int, client_sizes: list[int]) -> FederationPrivacy | None:
        """The run's privacy (None when off); a bad setting is a :class:`ConfigError` (one line, exit 2)."""
        p = cfg.federation.privacy
        if p.mechanism == "off":
            return None
        try:
            import dp_accounting  # noqa: F401
        except ImportError:
            raise UsageError(f"usage error: {_KEY}.mechanism={p.mechanism} needs dp-accounting (the accountant): "
                             f"pip install --no-deps 'dp-accounting>=0.6.0' absl-py mpmath") from None
        num_records, sgd = sum(client_sizes), None
        if p.mechanism == "dp_fedavg":
            K = cfg.partition.num_clients
            parts = [(clients_per_round(K, cfg.federation.client_fraction) / K, 1)]
        else:
            if not p.delta < 1 / num_records:
                raise ConfigError(f"{_KEY}.delta", p.delta, f"a float < 1/N = {1 / num_records:g} (record-level DP "
                                                           f"over N = {num_records} training records)")
            if math.isinf(p.clip_norm):
                raise ConfigError(f"{_KEY}.clip_norm", p.clip_norm, "a finite float > 0 (features are clipped)")
            parts = [(1.0, 1)]
            if p.dp_sgd and cfg.train.epochs > 0:
                sgd = _sgd_part(cfg, min(n for n in client_sizes if n > 0))
                parts.append(sgd)
        sigma = p.noise_multiplier if p.noise_multiplier is not None else _calibrated(p, parts, rounds)
        if sigma > 0 and math.isinf(p.clip_norm):
            raise ConfigError(f"{_KEY}.clip_norm", p.clip_norm, "a finite float > 0 when there is noise "
                                                               "(the sensitivity is the clip norm)")
        return cls(p, cfg.seed, rounds, parts, sigma, sgd)

    # -- accounting ---------------------------------------------------------------------------------------
    def epsilon(self, releases: int) -> float:
        """ε spent after ``releases`` rounds (inf without noise)."""
        from fl_lightning.privacy.accountant import epsilon

        if releases <= 0:
            return 0.0
        if self.noise_multiplier == 0.0:
            return math.inf
        return epsilon(self.noise_multiplier, delta=self.config.delta, accountant=self.config.accountant,
                       parts=[(q, steps * releases) for q, steps in self.parts])

    def row(self, round_idx: int) -> dict[str, float]:
        """metrics.csv: ε spent so far (after round ``round_idx``)."""
        return {"epsilon": self.epsilon(round_idx + 1)}

    def summary(self, rounds_done: int) -> dict[str, Any]:
        p = self.config
        return {"privacy": {"mechanism": p.mechanism, "epsilon": self.epsilon(rounds_done),
                            "target_epsilon": p.epsilon, "delta": p.delta, "noise_multiplier": self.noise_multiplier,
                            "clip_norm": p.clip_norm, "sampling_rate": self.parts[0][0], "accountant": p.accountant,
                            "dp_sgd": None if self.sgd is None else {"grad_clip_norm": p.grad_clip_norm,
                                                                     "sampling_rate": self.sgd[0],
                                                                     "steps_per_round": self.sgd[1]},
                            "unit": "user" if p.mechanism == "dp_fedavg" else "record"},
                "epsilon": self.epsilon(rounds_done), "delta": p.delta, "noise_multiplier": self.noise_multiplier}

    # -- the mechanisms -----------------------------------------------------------------------------------
    def dp_sgd(self, round_idx: int, client: int) -> DPSGD | None:
        """DP-SGD's settings of one client's local training (None unless ``dp_sgd`` is on)."""
        if self.sgd is None:
            return None
        return DPSGD(self.config.grad_clip_norm, self.noise_multiplier,
                     derive_seed(self.seed, round_idx, client, _NOISE_TAG + 1))

    def _generator(self, round_idx: int, client: int) -> torch.Generator:
        return torch.Generator().manual_seed(derive_seed(self.seed, round_idx, client, _NOISE_TAG))

    def _statistics_std(self, tensors: Mapping[str, torch.Tensor]) -> float:
        from fl_lightning.privacy.statistics import sensitivity

        return self.noise_multiplier * sensitivity(self.config.clip_norm, with_counts="counts" in tensors)

    def client_upload(self, upload: Upload, round_idx: int, client: int) -> Upload:
        """Local DP: the client's statistics noised before they leave it (other mechanisms: as is)."""
        from fl_lightning.privacy.statistics import noise_statistics

        if self.config.mechanism != "statistics_local" or "R_upper" not in upload.tensors:
            return upload
        tensors = noise_statistics(upload.tensors, std=self._statistics_std(upload.tensors),
                                   generator=self._generator(round_idx, client))
        return Upload(tensors, dict(upload.meta))

    def server_uploads(self, uploads: Mapping[int, Upload], state: Mapping[str, torch.Tensor],
                       round_idx: int) -> Mapping[int, Upload]:
        """The uploads as the method's aggregate reads them (clipped / noised); local DP: as they are."""
        if self.config.mechanism == "dp_fedavg":
            self.held = {}
            return _PrivateUploads(uploads, lambda c, u: self._clipped(state, c, u))
        if self.config.mechanism == "statistics_central":
            first = next(iter(uploads), None)
            return _PrivateUploads(uploads, lambda c, u: self._sum_noise(round_idx, u) if c == first else u)
        return uploads

    def _clipped(self, state: Mapping[str, torch.Tensor], client: int, upload: Upload) -> Upload:
        from fl_lightning.privacy.dp_fedavg import clip_update, shared_keys

        keys = frozenset(shared_keys(state, upload.tensors))
        if not keys:  # nothing averaged (e.g. FeDiSyn's synthesis round): the upload as it is
            return upload
        tensors, _ = clip_update(state, upload.tensors, self.config.clip_norm)
        self.held[client] = keys  # a second read counts once
        return Upload(tensors, {**upload.meta, "num_samples": 1})

    def _sum_noise(self, round_idx: int, upload: Upload) -> Upload:
        from fl_lightning.privacy.statistics import noise_statistics

        if "R_upper" not in upload.tensors:
            return upload
        tensors = noise_statistics(upload.tensors, std=self._statistics_std(upload.tensors),
                                   generator=self._generator(round_idx, 0xFFFFFFFF))
        return Upload(tensors, dict(upload.meta))

    def noised_state(self, state: dict[str, torch.Tensor], round_idx: int) -> dict[str, torch.Tensor]:
        """DP-FedAvg: the new state with N(0, (σS/m_key)²) on every key the round's uploads averaged."""
        from fl_lightning.privacy.dp_fedavg import add_mean_noise

        if self.config.mechanism != "dp_fedavg":
            return state
        m: dict[str, int] = {}
        for keys in self.held.values():
            for key in keys:
                m[key] = m.get(key, 0) + 1
        self.held = {}
        return add_mean_noise(state, m, noise_multiplier=self.noise_multiplier, clip_norm=self.config.clip_norm,
                              generator=self._generator(round_idx, 0xFFFFFFFE))


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


def _sgd_part(cfg: RunConfig, n_min: int) -> tuple[float, int]:
    """DP-SGD's (q, steps) per round for the smallest client — the worst case: the largest sampling rate
    B/n (the loader's shuffled batches accounted as Poisson sampling at that rate, the usual practice)."""
    B = cfg.train.batch_size or cfg.data.batch_size
    return min(1.0, B / n_min), cfg.train.epochs * math.ceil(n_min / B)


def _calibrated(p: PrivacyConfig, parts: list[tuple[float, int]], rounds: int) -> float:
    from fl_lightning.privacy.accountant import noise_multiplier

    try:
        return noise_multiplier(p.epsilon, delta=p.delta, accountant=p.accountant,
                                parts=[(q, steps * rounds) for q, steps in parts])
    except ValueError as err:
        raise ConfigError(f"{_KEY}.epsilon", p.epsilon, f"a target some noise reaches ({err})") from None
