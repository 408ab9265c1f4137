"""Model-poisoning clients (``federation.attack``): a seeded fraction of the clients send a poisoned upload instead
of what they trained, for the robust aggregators (``federation.aggregator``) to be measured against.

With x_t the global weights a client downloaded and u its trained upload (Δ = u − x_t), an attacker sends, on every
floating-point tensor of the global state it uploads:

* ``sign_flip``  x_t − s·Δ (the update reversed, s = ``scale``, default 1; Damaskinos et al. 2018, Allen-Zhu et
  al. 2021's "sign flipping");
* ``scale``      x_t + s·Δ (the update boosted, s = ``scale``, default 10; Bagdasaryan et al. 2020's model
  replacement scaling);
* ``gaussian``   x_t + N(0, σ² I) (σ = ``std``, default 1; Fang et al. 2020's Gaussian attack, centred on the
  global weights so that the norm of the "update" is σ√d);
* ``label_flip`` what it trained on its own data with every label l read as C − 1 − l (Fang et al. 2020 and
  Cao et al. 2021's label flipping, C classes): a data poisoning, so its upload is sent as trained.

The attackers are ⌊fraction·K + ½⌋ clients drawn once for the run from ``seed`` (the same clients every round, as
the papers have them); the noise of ``gaussian`` comes from (seed, round, client). A model-poisoning attacker's data
and training are its own; only its upload changes, before anything else (privacy) sees it. A label-flipping one
trains on its own images with the labels changed (:meth:`ClientAttack.label_maps`, read through
:class:`~fl_lightning.data.relabelled.Relabelled` or the feature table's labels) and trains as an honest client
does: with its method, its epochs, its DP-SGD.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fl_lightning.federation.policies.policy import UpdatePolicy, register_policy
from fl_lightning.federation.ranks.placement import derive_seed
from fl_lightning.federation.transport import Upload

if TYPE_CHECKING:
    from fl_lightning.config import AttackConfig, RunConfig

__all__ = ["ATTACK_DEFAULT_SCALE", "ClientAttack", "choose_attackers", "flipped_labels", "poison"]

ATTACK_DEFAULT_SCALE = {"sign_flip": 1.0, "scale": 10.0}
_NOISE_TAG = 0xA77AC  # separates the attack's noise from every other seed derived from (seed, round, client)


def choose_attackers(num_clients: int, fraction: float, seed: int) -> frozenset[int]:
    """The ⌊fraction·K + ½⌋ attacking clients, drawn without replacement from ``seed``."""
    count = int(np.floor(fraction * num_clients + 0.5))
    return frozenset(int(c) for c in np.random.default_rng(seed).choice(num_clients, size=count, replace=False))


def flipped_labels(num_classes: int) -> np.ndarray:
    """The label-flipping map l → C − 1 − l over C = ``num_classes`` classes, as a (C,) int64 array."""
    return np.arange(num_classes - 1, -1, -1, dtype=np.int64)


def poison(
    kind: str,
    upload: Mapping[str, Tensor],
    downloaded: Mapping[str, Tensor],
    *,
    scale: float,
    std: float,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """``upload`` as the attacker ``kind`` sends it (module docstring); tensors without a floating-point
    counterpart in ``downloaded`` are sent as they are."""
    out = dict(upload)
    for key, u in upload.items():
        x = downloaded.get(key)
        if x is None or not (u.is_floating_point() and x.is_floating_point()) or x.shape != u.shape:
            continue
        x = x.to(u.device, u.dtype)
        if kind == "sign_flip":
            out[key] = x - scale * (u - x)
        elif kind == "scale":
            out[key] = x + scale * (u - x)
        elif kind == "gaussian":
            noise = torch.randn(u.shape, generator=generator, dtype=torch.float32)
            out[key] = x + (std * noise).to(u.device, u.dtype)
        else:
            raise ValueError(f"unknown attack {kind!r}")
    return out


@register_policy("attack", "sign_flip")
@register_policy("attack", "scale")
@register_policy("attack", "gaussian")
@register_policy("attack", "label_flip")
@dataclass(frozen=True)
class ClientAttack(UpdatePolicy):
    """The run's attack: its kind, strength and attacking clients (an update policy on the client's way up, the
    first: federation/policies/order.py)."""

    kind: str
    attackers: frozenset[int]
    scale: float
    std: float
    seed: int

    @classmethod
    def of(cls, config: AttackConfig, num_clients: int) -> ClientAttack | None:
        """``federation.attack`` over K = ``num_clients`` clients (None for ``kind: none``)."""
        if config.kind == "none":
            return None
        scale = config.scale if config.scale is not None else ATTACK_DEFAULT_SCALE.get(config.kind, 1.0)
        return cls(config.kind, choose_attackers(num_clients, config.fraction, config.seed), scale, config.std, config.seed)

    @classmethod
    def build(cls, cfg: RunConfig, setup: object) -> ClientAttack | None:
        return cls.of(cfg.federation.attack, cfg.partition.num_clients)

    def on_upload(self, upload: Upload, downloaded: Mapping[str, Tensor], round_idx: int, client: int) -> Upload:
        return self.apply(upload, downloaded, round_idx, client)

    def label_maps(self, num_classes: int) -> dict[int, np.ndarray]:
        """The clients that train on changed labels, each with its (C,) map (none but under ``label_flip``)."""
        if self.kind != "label_flip":
            return {}
        return {client: flipped_labels(num_classes) for client in sorted(self.attackers)}

    def apply(self, upload: Upload, downloaded: Mapping[str, Tensor], round_idx: int, client: int) -> Upload:
        """The upload ``client`` sends: poisoned when it is a model-poisoning attacker, else ``upload`` itself (a
        label flipper's poison is in what it trained on)."""
        if client not in self.attackers or self.kind == "label_flip":
            return upload
        generator = torch.Generator().manual_seed(derive_seed(self.seed, round_idx, client, _NOISE_TAG))
        return Upload(
            poison(self.kind, upload.tensors, downloaded, scale=self.scale, std=self.std, generator=generator), upload.meta
        )

    def row(self, round_idx: int, clients: list[int]) -> dict[str, int]:
        """metrics.csv: how many of the round's clients attacked."""
        return {"attackers": sum(c in self.attackers for c in clients)}

    def summary(self, rounds_done: int) -> dict[str, Any]:
        """summary.json: which clients attack (drawn once for the run)."""
        return {"attacker_clients": sorted(self.attackers)}
