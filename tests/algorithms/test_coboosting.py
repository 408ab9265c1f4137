"""Co-Boosting through the engine: DENSE's server view, plus the re-weighted ensemble and hard samples."""

import pytest

from fl_lightning.algorithms.coboosting import CoBoosting
from tests.algorithms.test_dense import check_uploads_are_models_only, distilled_vs_clients, run
from tests.outcomes import expect

TINY = ["--coboosting.epochs", "3", "--coboosting.g_steps", "3", "--coboosting.synthesis_batch_size", "32",
        "--train.epochs", "1"]


def test_coboosting_server_sees_only_models_and_reweights_the_ensemble(tmp_path):
    summary, seen, cfg = run(CoBoosting, "coboosting_digits_tiny.yaml", tmp_path, *TINY, "--coboosting.mu", "0.05")
    check_uploads_are_models_only(summary, seen, cfg)
    w = summary["ensemble_weights"]
    # signed steps of 0.05·δ^e from 1/K, one per pool batch: epoch 1 (64 images, 1 batch of 64), epoch 2
    # (96 images, 2 batches); epoch 0 keeps w_0
    assert len(w) == 5 and all(0.0 <= v <= 1.0 for v in w)
    assert w != [0.2] * 5
    assert all(abs(v - 0.2) <= 0.05 * (0.99 + 2 * 0.99 ** 2) + 1e-6 for v in w)


def test_no_reweighting_keeps_the_plain_mean(tmp_path):
    summary, _, _ = run(CoBoosting, "coboosting_digits_tiny.yaml", tmp_path, *TINY, "--coboosting.mu", "0")
    assert summary["ensemble_weights"] == pytest.approx([0.2] * 5)


@pytest.mark.slow  # ~45 s on 2 cores: 3 runs of 10 server epochs
@pytest.mark.outcome
def test_distilled_model_learns_from_the_ensemble(tmp_path):
    """DENSE's check (tests/algorithms/test_dense.py) for Co-Boosting, on the same pathological partition,
    averaged over the same 3 seeds.

    What holds, measured with ``python scripts/outcome_matrix.py`` (FL_TEST_SEED 0-2 x AVX-512/AVX2/no-vector
    kernels, 1 thread): student 0.182-0.231 (3-seed mean; mean client ~0.20, chance 0.10), ensemble − mean
    client 0.35-0.45. Bounds: student > 0.14, ensemble − mean client > 0.2.
    Co-Boosting's student does NOT reliably beat the average client on this tiny setting (one 30-epoch
    run: 0.347 at seed 0, 0.231 at seed 1, 0.211 at seed 0 on AVX2 kernels, against 0.198), so this test
    asserts what does hold — the re-weighted ensemble is far better than a client, and the student has
    learnt from it well above chance (0.1) — and a student that learns nothing still fails.
    """
    acc = distilled_vs_clients(CoBoosting, "coboosting_digits_tiny.yaml", tmp_path, "--coboosting.epochs", "10")
    expect("ensemble - mean client (3-seed mean)", acc["ensemble"] - acc["client"], ">", 0.2)
    expect("student accuracy (3-seed mean)", acc["student"], ">", 0.14)
