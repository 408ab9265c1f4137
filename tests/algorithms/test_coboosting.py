"""Co-Boosting through the engine: DENSE's server view, plus the re-weighted ensemble and hard samples."""

import pytest

from fl_lightning.algorithms.coboosting import CoBoosting
from tests.algorithms.test_dense import check_uploads_are_models_only, run

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


@pytest.mark.slow  # ~70 s on 2 cores: 30 server epochs of synthesis, re-weighting and distillation
def test_distilled_model_beats_the_average_client(tmp_path):
    """DENSE's check (tests/algorithms/test_dense.py) for Co-Boosting, on the same pathological partition.

    Measured with conf/coboosting_digits_tiny.yaml, one thread as here: student 0.347, mean client 0.198,
    re-weighted ensemble 0.572 (seed 0). With seed 1 (other clients, other synthesis) the student reached only 0.228 against
    0.198: Co-Boosting's margin on this tiny setting is seed-dependent; DENSE's held at every seed tried.
    """
    summary, _, _ = run(CoBoosting, "coboosting_digits_tiny.yaml", tmp_path)
    mean_client = sum(summary["client_accuracy"]) / len(summary["client_accuracy"])
    assert summary["ensemble_accuracy"] > mean_client
    assert summary["accuracy"] > mean_client + 0.05, summary
