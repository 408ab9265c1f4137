"""Co-Boosting through the engine: DENSE's server view, plus the re-weighted ensemble and hard samples."""

import pytest
import torch

from fl_lightning.algorithms.coboosting import CoBoosting
from tests.algorithms.test_dense import (
    check_server_ran_under_the_precision,
    check_uploads_are_models_only,
    distilled_vs_clients,
    one_vs_two_processes,
    run,
    run_server_under_bf16,
)
from tests.outcomes import expect

TINY = ["--coboosting.epochs", "3", "--coboosting.g_steps", "3", "--coboosting.synthesis_batch_size", "32", "--train.epochs", "1"]


def test_coboosting_server_sees_only_models_and_reweights_the_ensemble(tmp_path):
    summary, seen, cfg = run(CoBoosting, "coboosting_digits_tiny.yaml", tmp_path, *TINY, "--coboosting.mu", "0.05")
    check_uploads_are_models_only(summary, seen, cfg)
    w = summary["ensemble_weights"]
    # signed steps of 0.05·δ^e from 1/K, one per batch of the pool before the epoch's batch joins it:
    # epoch 1 (32 images, 1 batch of 64), epoch 2 (64 images, 1 batch); epoch 0 keeps w_0
    assert len(w) == 5 and all(0.0 <= v <= 1.0 for v in w)
    assert w != [0.2] * 5
    assert all(abs(v - 0.2) <= 0.05 * (0.99 + 0.99**2) + 1e-6 for v in w)


def test_no_reweighting_keeps_the_plain_mean(tmp_path):
    summary, _, _ = run(CoBoosting, "coboosting_digits_tiny.yaml", tmp_path, *TINY, "--coboosting.mu", "0")
    assert summary["ensemble_weights"] == pytest.approx([0.2] * 5)


def test_the_server_and_the_reweighting_run_under_the_runs_precision(tmp_path):
    """DENSE's loops under bf16 autocast with 16-mixed's GradScaler, and the re-weighting's ensemble forwards too
    (their logits read in float32: w's signed step)."""
    seen = []
    original = CoBoosting.reweight

    def recording(self, epoch, ensemble, pool, labels, view):
        member_logits = ensemble.member_logits

        def spy(x):
            out = member_logits(x)
            seen.append((torch.is_autocast_enabled("cpu"), out.dtype))
            return out

        ensemble.member_logits = spy
        original(self, epoch, ensemble, pool, labels, view)
        del ensemble.member_logits

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CoBoosting, "reweight", recording)
        summary, log = run_server_under_bf16(
            CoBoosting, "coboosting_digits_tiny.yaml", tmp_path, *TINY, "--coboosting.mu", "0.05"
        )
    check_server_ran_under_the_precision(summary, log, epochs=3)
    assert seen and set(seen) == {(True, torch.bfloat16)}
    assert all(0.0 <= w <= 1.0 for w in summary["ensemble_weights"])


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

    Those ranges were measured with the student started from the clients' initial model; now it
    is drawn fresh (as the official code) and re-weighting runs before the new batch joins the pool: the
    bounds were re-checked at FL_TEST_SEED 0 on one machine only (passed).
    """
    acc = distilled_vs_clients(CoBoosting, "coboosting_digits_tiny.yaml", tmp_path, "--coboosting.epochs", "10")
    expect("ensemble - mean client (3-seed mean)", acc["ensemble"] - acc["client"], ">", 0.2)
    expect("student accuracy (3-seed mean)", acc["student"], ">", 0.14)


def test_reweighting_runs_before_the_new_batch_joins_on_the_augmented_pool(tmp_path):
    """As the official CoBoostingSynthesizer.synthesize: from the second epoch, after the synthesis and before
    data_pool.add, on the pool read through the distillation's crop + flip transform."""
    seen = []
    original = CoBoosting.reweight

    def recording(self, epoch, ensemble, pool, labels, view):
        inputs = []
        member_logits = ensemble.member_logits

        def spy(x):
            inputs.append(x)
            return member_logits(x)

        ensemble.member_logits = spy
        original(self, epoch, ensemble, pool, labels, view)
        del ensemble.member_logits
        seen.append((epoch, pool.shape[0], inputs, pool))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CoBoosting, "reweight", recording)
        run(
            CoBoosting,
            "coboosting_digits_tiny.yaml",
            tmp_path,
            *TINY,
            "--coboosting.mu",
            "0.05",
            "--coboosting.pool_augment",
            "true",
            "--coboosting.batch_size",
            "16",
        )
    assert [(e, n) for e, n, _, _ in seen] == [(1, 32), (2, 64)]  # epochs 1, 2: the pool before their batch
    for _, n, inputs, pool in seen:
        assert sum(x.shape[0] for x in inputs) == n  # every pool image, once per wa_step
        rows = {tuple(p.flatten().tolist()) for p in pool}
        assert not all(tuple(x.flatten().tolist()) in rows for batch in inputs for x in batch)  # augmented views


@pytest.mark.slow  # ~40 s on 2 cores: two runs, one of them on 2 processes
def test_two_processes_distil_as_one(tmp_path):
    """The re-weighted ensemble, ODS and L_BN / K split over 2 ranks: one process's numbers bit for bit."""
    one_vs_two_processes("coboosting_digits_tiny.yaml", "coboosting", tmp_path)


def test_a_synthesis_without_a_finite_loss_adds_no_batch(tmp_path):
    """Co-Boosting's synthesis all NaN in its second epoch (e.g. bf16 logits of untrained clients): no batch joins
    the pool and no re-weighting runs that epoch, the run goes on (formerly torch.cat of None crashed it)."""
    import fl_lightning.modules.data_free_kd as kd

    original, calls, pools = kd.synthesize, [], []

    def nan_second(*args, **kw):
        images, labels = original(*args, **kw)
        calls.append(1)
        return (None if len(calls) == 2 else images), labels

    def recording(self, epoch, ensemble, pool, labels, view):
        pools.append((epoch, pool.shape[0]))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kd, "synthesize", nan_second)
        mp.setattr(CoBoosting, "reweight", recording)
        summary, _, _ = run(CoBoosting, "coboosting_digits_tiny.yaml", tmp_path, *TINY)
    assert summary["skipped_syntheses"] == 1 and 0 <= summary["accuracy"] <= 1
    assert pools == [(2, 32)]  # epoch 0 alone in the pool when epoch 2 re-weights; epoch 1 added nothing
