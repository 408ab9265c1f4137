"""Each mechanism audited as an attacker would: the run's own code released many times on neighbouring inputs, a
distinguishing test with a threshold fixed in advance, and its 95 % lower bound on ε (Clopper–Pearson,
``privacy/audit.py``) must stay under the ε the run reports (the PLD accountant, tight to < 1 %).

DP-SGD is audited through ``fit_local`` itself, by an attacker who sees every step's model (what its accounting
covers). DP-FedAvg as it was — the mean over the uploads that arrived, with noise σS/m — fails this audit (its noise
multiplier was σ/2: ε ≥ 4 proved where 3.1 was reported); so does a client's record count beside noisy
statistics (it separates add/remove neighbours alone)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("dp_accounting")  # the 'privacy' extra
import torch
from lightning import LightningModule

from fl_lightning.config import PrivacyConfig
from fl_lightning.federation.aggregate import WeightedMean
from fl_lightning.federation.policies.privacy import FederationPrivacy
from fl_lightning.federation.transport import Upload
from fl_lightning.privacy.audit import epsilon_lower_bound
from fl_lightning.privacy.statistics import sensitivity

DRAWS = 10_000  # per neighbour (the refutation of the old estimator: 100,000, drawn directly)
DELTA = 1e-3


def _privacy(mechanism: str, sigma: float, clip_norm: float, **extra) -> FederationPrivacy:
    config = PrivacyConfig(mechanism=mechanism, noise_multiplier=sigma, delta=DELTA, clip_norm=clip_norm, accountant="pld")
    return FederationPrivacy(config, seed=0, rounds=1, parts=[(1.0, 1)], noise_multiplier=sigma, **extra)


def _fedavg_release(dp: FederationPrivacy, updates: list[float]) -> float:
    """One round of DP-FedAvg as the engine runs it (RoundServer.aggregate, federation/serve.py) with FedAvg's own
    weighted mean."""
    state = {"w": torch.zeros(1, dtype=torch.float64)}
    uploads = {c: Upload({"w": torch.tensor([u], dtype=torch.float64)}, {"num_samples": 10 + c}) for c, u in enumerate(updates)}
    mean = WeightedMean()
    for upload in dp.server_uploads(uploads, state, round_idx=0).values():
        mean.add(upload.tensors, upload.meta["num_samples"])
    return float(dp.noised_state(mean.result(), round_idx=0)["w"])


def test_dp_fedavg_holds_its_reported_epsilon_under_add_remove_of_a_user():
    """D: the target's update +S beside two at −S; D': the two alone. With the fixed denominator D = 3 the
    outputs are −S/3 and −2S/3 under noise σS/3 (μ = 1/σ); the mean of the arrivals gave −S/3 against −S
    under noise σS/3 and σS/2 — a lower tail that D' fills and D does not."""
    sigma, S = 1.0, 1.0
    dp = _privacy("dp_fedavg", sigma, S, denominator=3)
    reported = dp.epsilon(1)
    with_target = np.array([_fedavg_release(dp, [S, -S, -S]) for _ in range(DRAWS)])
    without = np.array([_fedavg_release(dp, [-S, -S]) for _ in range(DRAWS)])
    proved = epsilon_lower_bound(with_target, without, threshold=-1.2 * S, delta=DELTA)
    assert 0 < proved < reported, (proved, reported)
    # the same audit refutes the variable denominator: the arrivals' mean with noise σS/m
    rng, many = np.random.default_rng(0), 10 * DRAWS
    old_with = -S / 3 + rng.standard_normal(many) * sigma * S / 3
    old_without = -S + rng.standard_normal(many) * sigma * S / 2
    assert epsilon_lower_bound(old_with, old_without, threshold=-1.2 * S, delta=DELTA) > reported


@pytest.mark.parametrize("mechanism", ["statistics_local", "statistics_central"])
def test_the_statistics_hold_their_reported_epsilon_under_add_remove_of_a_record(mechanism):
    """One client's R, C with and without one record h = c·e₁ of class 0 (it moves the wire format by the full
    sensitivity Δ). The attack reads the release along that move, with R's diagonal as R₀₀ − R₁₁, which the PSD
    shift ‖Z‖₂·I (the same on every diagonal entry) leaves alone: μ = sqrt(c⁴/2 + c²)/(σΔ) ≈ 0.87/σ."""
    sigma, c, d, classes = 1.0, 1.0, 2, 2
    dp = _privacy(mechanism, sigma, c)
    rest = torch.tensor([[0.3, -0.5], [-0.2, 0.4]], dtype=torch.float64)
    target = torch.tensor([[c, 0.0]], dtype=torch.float64)
    i, j = torch.triu_indices(d, d)  # (0,0), (0,1), (1,1)
    wire = {}
    for name, h, y in (("with", torch.cat([rest, target]), [1, 0, 0]), ("without", rest, [1, 0])):
        Y = torch.nn.functional.one_hot(torch.tensor(y), classes).double()
        wire[name] = {"R_upper": (h.T @ h)[i, j], "C": h.T @ Y}
    move = {k: wire["with"][k] - wire["without"][k] for k in ("R_upper", "C")}
    assert float(torch.cat([m.flatten() for m in move.values()]).norm()) == pytest.approx(sensitivity(c))
    attack = torch.cat([torch.tensor([c * c / 2, 0.0, -c * c / 2], dtype=torch.float64), move["C"].flatten()])

    def read(tensors: dict) -> float:
        return float(torch.cat([tensors[k].flatten() for k in ("R_upper", "C")]) @ attack)

    def release(tensors: dict) -> float:
        upload = dp.client_upload(Upload(dict(tensors), {"num_samples": 3}), round_idx=0, client=0)
        seen = dp.server_uploads({0: upload}, {}, round_idx=0)[0]
        assert seen.meta == {"num_samples": 1}  # no record count beside the statistics
        return read(seen.tensors)

    scores = {name: np.array([release(wire[name]) for _ in range(DRAWS)]) for name in wire}
    std = sigma * sensitivity(c) * float(attack.norm())
    middle = (read(wire["with"]) + read(wire["without"])) / 2
    reported = dp.epsilon(1)
    proved = epsilon_lower_bound(scores["with"], scores["without"], threshold=middle + 1.5 * std, delta=DELTA)
    assert proved < reported, (proved, reported)
    assert abs(float(scores["without"].mean()) - read(wire["without"])) < 5 * std / DRAWS**0.5  # the noise's mean 0


class _Canary(LightningModule):
    """One weight w; a record x's loss is w·x, so its gradient is x whatever w is (the steps do not interact)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))

    def training_step(self, batch, batch_idx):
        return (self.w * batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1.0)


class _SeenGradients:
    """The attacker of DP-SGD's accounting, who sees every step's model: each step's private gradient."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def on_after_backward(self, module) -> None:
        self.seen.append(float(module.w.grad))


def test_dp_sgd_holds_its_reported_epsilon_under_add_remove_of_a_record():
    """D: one client whose only record is a canary with gradient 10 (clipped to C); D': the client without it.
    ``fit_local``'s DP-SGD runs its Poisson lots at q = 1/2 for ⌈1/q⌉ = 2 steps with L = 1; the attacker sees
    each step's gradient, C·Bernoulli(q) + N(0, σ²C²) against N(0, σ²C²), and says D when the larger exceeds
    1.75 C. Half the noise — the step from a lot divided by twice the sensitivity it was calibrated for — is
    refuted by the same attack."""
    from lightning.fabric import Fabric

    from fl_lightning.federation.local_training import fit_local
    from fl_lightning.privacy.poisson_sampling import PoissonBatches

    sigma, C, q = 1.0, 1.0, 0.5
    config = PrivacyConfig(
        mechanism="statistics_local",
        noise_multiplier=sigma,
        delta=DELTA,
        dp_sgd=True,
        grad_clip_norm=C,
        sampling_rate=q,
        accountant="pld",
    )
    dp = FederationPrivacy(config, seed=0, rounds=1, parts=[], noise_multiplier=sigma, sgd=[(q, 2)], lot_size=1.0)
    fabric, reported = Fabric(accelerator="cpu", devices=1), dp.epsilon(1)

    def release(records: torch.Tensor) -> float:
        settings, seen = dp.dp_sgd(round_idx=0, client=0), _SeenGradients()  # fresh OS-entropy seeds each draw
        lots = PoissonBatches(
            len(records),
            rate=settings.sampling_rate,
            steps_per_epoch=settings.steps_per_epoch,
            generator=torch.Generator().manual_seed(settings.sampling_seed),
            make_loader=lambda chosen: ([records[lot]] for lot in chosen),
        )
        fit_local(fabric, _Canary(), lots, epochs=1, callbacks=[seen], dp_sgd=settings)
        assert len(seen.seen) == 2
        return max(seen.seen)

    canary = torch.full((1, 1), 10.0, dtype=torch.float64)
    with_canary = np.array([release(canary) for _ in range(DRAWS)])
    without = np.array([release(canary[:0]) for _ in range(DRAWS)])
    proved = epsilon_lower_bound(with_canary, without, threshold=1.75 * C, delta=DELTA)
    assert 0 < proved < reported, (proved, reported)
    rng, many = np.random.default_rng(0), 10 * DRAWS
    half = [
        ((rng.random((many, 2)) < q) * C * present + rng.standard_normal((many, 2)) * sigma * C / 2).max(1) for present in (1, 0)
    ]
    assert epsilon_lower_bound(*half, threshold=1.75 * C, delta=DELTA) > reported
