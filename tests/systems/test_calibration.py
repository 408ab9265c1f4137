"""The calibration's consistency checks as tests of the pure system model (no training).

The paper's Food-101 figures (§6): every method's model time to 80 % must be at most the paper's, and the
fitted PL0 must be the largest loss for which that holds (so it is a fit, not a free choice).
"""

from __future__ import annotations

import pytest

from fl_lightning.systems.calibration import FOOD101, fit_reference_loss, latent_upload_bytes, paper_consistency
from fl_lightning.systems.channel import REFERENCE_LOSS_DB
from fl_lightning.systems.server import RTX_4090, generation_steps


@pytest.fixture(scope="module")
def consistency():
    return paper_consistency(reference_loss_db=REFERENCE_LOSS_DB)


def test_every_method_is_no_slower_than_the_paper_reports(consistency) -> None:
    checks = consistency["checks"]
    assert set(checks) == {"fedisyn", "caff", "sflf", "fgl", "gptfl"}
    for method, c in checks.items():
        assert c.paper_time_s == dict(FOOD101.time_to_target_s)[method]
        assert 0 < c.model_time_s <= c.paper_time_s, method
        assert c.rounds >= 1
    assert consistency["worst"] == max(max(c.ratio for c in checks.values()), consistency["lambda_ratio"]) <= 1.0


def test_the_model_keeps_the_papers_order_of_methods(consistency) -> None:
    t = {m: c.model_time_s for m, c in consistency["checks"].items()}
    assert t["fedisyn"] < t["sflf"] < t["fgl"] and t["caff"] < t["gptfl"]


def test_fedisyn_time_holds_the_papers_generation_and_an_implied_lambda_star_in_range(consistency) -> None:
    c = consistency["checks"]["fedisyn"]
    assert c.server_s == pytest.approx(FOOD101.fedisyn_generation_s + consistency["pretraining_s"])
    assert c.synthesis_upload_s > 0  # the latents are on the clock
    assert 0 < consistency["lambda_star"] <= 1.0  # the paper's λ range; its Caltech-101 optimum is ≈ 0.5


def test_reference_loss_is_the_fit() -> None:
    assert fit_reference_loss() == REFERENCE_LOSS_DB
    assert paper_consistency(reference_loss_db=REFERENCE_LOSS_DB + 0.5)["worst"] > 1.0


def test_latent_bytes_and_generation_steps_by_hand() -> None:
    assert latent_upload_bytes(4, (4, 64, 64)) == 5 * 4 * 64 * 64 * 4 + 32  # + label, count, timestep, Z'
    assert generation_steps(999, 50) == 50 and generation_steps(0, 50) == 1 and generation_steps(599, 50) == 30
    assert RTX_4090.unet_step_s * 50 + RTX_4090.decode_s == pytest.approx(1.69)
