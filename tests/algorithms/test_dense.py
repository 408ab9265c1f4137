"""DENSE through the engine on a tiny ResNet and the bundled digits: what reaches the server, and the distillation."""

import os
from pathlib import Path

import pytest
import torch

from fl_lightning.algorithms.dense import DENSE
from fl_lightning.algorithms.fedavg_cnn import build_timm_classifier
from fl_lightning.config.loading import load_config
from fl_lightning.federation.simulation import Simulation
from tests.conftest import CONF
from tests.outcomes import expect, outcome_seed

TINY = ["--dense.epochs", "2", "--dense.g_steps", "3", "--dense.synthesis_batch_size", "32", "--train.epochs", "1"]


class _NoTrainingData:
    """Stands in for the training split once the clients are done: any read is a leak to the server."""

    def __getitem__(self, i):
        raise AssertionError("the server read a training image")

    def __len__(self):
        raise AssertionError("the server looked at the training split")


class _PoisonAfterClients:
    def on_run_start(self, env, **_):
        self.env = env

    def on_round_end(self, **_):
        pass

    def on_client_end(self, round_idx, client, **_):
        if client == self.env.cfg.partition.num_clients - 1:  # every client has uploaded (one rank)
            self.env.splits.train = _NoTrainingData()
            self.env.partition = None


def run(algorithm: type, config: str, tmp_path, *extra: str) -> tuple[dict, dict, object]:
    """Run ``config`` with the server's view recorded: the uploads it received (as sent) and the config."""
    seen: dict = {}
    original = algorithm.aggregate

    def recording(self, round_idx, state, uploads, failures, plan):
        seen.update({c: u for c, u in uploads.items()})
        return original(self, round_idx, state, uploads, failures, plan)

    cfg = load_config(CONF / config, ["--output_dir", str(tmp_path), "--logging.progress", "false", *extra])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(algorithm, "aggregate", recording)
        summary = Simulation(cfg=cfg, loggers=[], callbacks=[_PoisonAfterClients()]).run()
    return summary, seen, cfg


def run_server_under_bf16(algorithm: type, config: str, tmp_path, *extra: str) -> tuple[dict, dict]:
    """Run ``config`` under bf16-mixed on the CPU with a ``GradScaler`` standing in for 16-mixed's (a CPU has none),
    no local training (``train.epochs 0``: the clients upload their common initial model), recording the server's
    loops: each forward of the client models and the student (autocast on?, output dtype) and the scalers."""
    import fl_lightning.federation.local_training as local_training
    import fl_lightning.modules.data_free_kd as kd

    log: dict = {"forwards": [], "g_scalers": [], "s_scalers": []}

    def hooked(modules, fn):
        handles = [
            m.register_forward_hook(lambda mod, i, out: log["forwards"].append((torch.is_autocast_enabled("cpu"), out.dtype)))
            for m in modules
        ]
        try:
            return fn()
        finally:
            for h in handles:
                h.remove()

    synthesize, distill_epoch = kd.synthesize, kd.distill_epoch

    def synthesize_spy(generator, ensemble, student, **kw):
        log["g_scalers"].append(kw["scaler"])
        return hooked([*ensemble.members, student], lambda: synthesize(generator, ensemble, student, **kw))

    def distill_spy(student, teacher, pool, **kw):
        log["s_scalers"].append(kw["scaler"])
        return hooked([*teacher.members, student], lambda: distill_epoch(student, teacher, pool, **kw))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local_training, "fresh_grad_scaler", lambda fabric: torch.amp.GradScaler(device="cpu"))
        mp.setattr(kd, "synthesize", synthesize_spy)
        mp.setattr(kd, "distill_epoch", distill_spy)
        summary, _, _ = run(
            algorithm,
            config,
            tmp_path,
            "--federation.precision",
            "bf16-mixed",
            "--federation.accelerator",
            "cpu",
            *extra,
            "--train.epochs",
            "0",
        )
    return summary, log


def check_server_ran_under_the_precision(summary: dict, log: dict, epochs: int) -> None:
    assert log["forwards"] and set(log["forwards"]) == {(True, torch.bfloat16)}
    g, s = log["g_scalers"], log["s_scalers"]
    assert len(g) == len(s) == epochs and all(isinstance(x, torch.amp.GradScaler) for x in g + s)
    assert len({id(x) for x in g}) == epochs and not {id(x) for x in g} & {id(x) for x in s}  # a fresh one per G
    assert len({id(x) for x in s}) == 1  # the student's, kept over its epochs
    assert all(0 <= a <= 1 for a in (*summary["client_accuracy"], summary["ensemble_accuracy"], summary["accuracy"]))


def test_the_server_runs_under_the_runs_precision(tmp_path):
    """Synthesis, distillation and the server's evaluation under bf16 autocast; 16-mixed's GradScaler for G and S
    (32-true: bit-identical to the loops without autocast, tests/modules/test_data_free_kd.py)."""
    summary, log = run_server_under_bf16(DENSE, "dense_digits_tiny.yaml", tmp_path, *TINY)
    check_server_ran_under_the_precision(summary, log, epochs=2)


def check_uploads_are_models_only(summary, seen, cfg):
    model = build_timm_classifier(cfg, 10, seed=0)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert sorted(seen) == list(range(cfg.partition.num_clients))
    for upload in seen.values():
        assert {k: tuple(v.shape) for k, v in upload.tensors.items()} == shapes  # the model's tensors, nothing else
        assert set(upload.meta) == {"num_samples", "train_s"}
    model_bytes = sum(v.numel() * v.element_size() for v in model.state_dict().values())
    assert summary["bytes_up"] == cfg.partition.num_clients * (model_bytes + 16)
    assert summary["bytes_down"] == 0  # the initial model is agreed by seed
    assert summary["server_distill_s"] > 0 and summary["client_train_s"] > 0
    assert len(summary["client_accuracy"]) == cfg.partition.num_clients and 0 <= summary["ensemble_accuracy"] <= 1


def test_dense_server_sees_only_models_and_counts(tmp_path):
    summary, seen, cfg = run(DENSE, "dense_digits_tiny.yaml", tmp_path, *TINY)
    check_uploads_are_models_only(summary, seen, cfg)
    assert summary["rounds"] == 1 and summary["ensemble_weights"] == [1.0] * 5


SEEDS = (0, 1, 2)  # each its own partition, clients and synthesis; shifted by FL_TEST_SEED (tests/outcomes.py)


def distilled_vs_clients(algorithm: type, config: str, tmp_path, *extra: str) -> dict[str, float]:
    """The student's, the mean client's and the ensemble's test accuracy, each averaged over SEEDS.

    One run of a 30-epoch adversarial synthesis + distillation is chaotic: its student moves by 5-10 points
    with the seed and with the CPU's kernels. The mean of three shorter runs is the figure that holds."""
    runs = []
    for s in SEEDS:
        seed = str(outcome_seed(s))
        summary, _, _ = run(algorithm, config, tmp_path / seed, "--seed", seed, "--partition.seed", seed, *extra)
        clients = summary["client_accuracy"]
        runs.append((summary["accuracy"], sum(clients) / len(clients), summary["ensemble_accuracy"]))
    student, client, ensemble = (sum(r[i] for r in runs) / len(runs) for i in range(3))
    return {"student": student, "client": client, "ensemble": ensemble}


@pytest.mark.slow  # ~45 s on 2 cores: 3 runs of 10 server epochs of synthesis + distillation
@pytest.mark.outcome
def test_distilled_model_beats_the_average_client(tmp_path):
    """Pathological non-IID (2 classes per client): each client alone is near 20 %; the ensemble's
    knowledge, distilled without data, is worth more than an average client.

    conf/dense_digits_tiny.yaml at 10 server epochs (of its 30), averaged over 3 seeds. Measured with
    ``python scripts/outcome_matrix.py`` (FL_TEST_SEED 0-2 x AVX-512/AVX2/no-vector kernels, 1 thread; see
    tests/outcomes.py): student − mean client 0.057-0.120 (mean 0.089), ensemble − mean client 0.36-0.45.
    Bounds: > 0 and > 0.2. A single run is not a test here: at seed 2 one 10-epoch student reached only
    0.219 against 0.197, and a 30-epoch one moves by 5-10 points with the seed and the kernels.

    Those ranges were measured with the student started from the clients' initial model; now it
    is drawn fresh (as the official code) and re-weighting runs before the new batch joins the pool: the
    bounds were re-checked at FL_TEST_SEED 0 on one machine only (passed).
    """
    acc = distilled_vs_clients(DENSE, "dense_digits_tiny.yaml", tmp_path, "--dense.epochs", "10")
    expect("ensemble - mean client (3-seed mean)", acc["ensemble"] - acc["client"], ">", 0.2)
    expect("student - mean client (3-seed mean)", acc["student"] - acc["client"], ">", 0.0)


@pytest.mark.parametrize("init", ["fresh", "clients"])
def test_student_starts_fresh_as_the_official_code(tmp_path, init):
    """Both official codes distil into a newly drawn model (DENSE's get_model, Co-Boosting's registry.get_model),
    not into the clients' common initial one; ``student_init: clients`` keeps our former choice."""
    cfg = load_config(CONF / "dense_digits_tiny.yaml", ["--output_dir", str(tmp_path), "--dense.student_init", init])
    student = DENSE(cfg=cfg).initial_student(10).state_dict()
    clients = build_timm_classifier(cfg, 10, seed=cfg.seed).state_dict()
    assert student.keys() == clients.keys()
    weights = [k for k, v in clients.items() if v.dim() >= 2]  # every convolution and the classifier (BN starts at 1, 0)
    same = [torch.equal(student[k], clients[k]) for k in weights]
    assert all(same) if init == "clients" else not any(same)


@pytest.mark.parametrize("pool_augment", [True, False])
def test_pool_is_read_through_crop_and_flip(tmp_path, pool_augment):
    """dense.pool_augment: distillation reads each pool batch as a crop of the image padded with black (in the
    normalised space: normalize(0)) by S/8, or its mirror; off: as stored."""
    cfg = load_config(
        CONF / "dense_digits_tiny.yaml",
        ["--output_dir", str(tmp_path), "--data.image_size", "16", "--dense.pool_augment", str(pool_augment).lower()],
    )
    black = torch.tensor([-1.0, -2.0, -3.0]).view(1, 3, 1, 1)
    view = DENSE(cfg=cfg).pool_view(16, lambda x: x - torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1), torch.device("cpu"))
    pool = torch.rand(6, 3, 16, 16)
    out = view(pool, torch.Generator().manual_seed(0))
    if not pool_augment:
        assert torch.equal(out, pool)
        return
    padded = black.expand(6, 3, 20, 20).clone()
    padded[:, :, 2:18, 2:18] = pool
    for i in range(6):
        crops = [padded[i, :, a : a + 16, b : b + 16] for a in range(5) for b in range(5)]
        assert any(torch.equal(out[i], c) or torch.equal(out[i], c.flip(-1)) for c in crops)
    assert not torch.equal(out, pool)


def comparable(summary: dict) -> dict:
    """summary.json less what depends on the clock or the process count."""
    return {k: v for k, v in summary.items() if k not in ("wall_time_s", "world_size", "server_distill_s", "client_train_s")}


def tiny_kd_args(config: str, method: str) -> list[str]:
    """The CLI arguments of a tiny run of the data-free KD ``method`` on ``config``: 3 clients of one local epoch,
    3 server epochs of 5 generator steps, no progress bar."""
    clients = ["--partition.num_clients", "3", "--train.epochs", "1", "--logging.progress", "false"]
    return ["--config", str(CONF / config), *clients, f"--{method}.epochs", "3", f"--{method}.g_steps", "5"]


def one_vs_two_processes(config: str, method: str, tmp_path) -> None:
    """``config`` on 1 and on 2 gloo processes (3 clients: rank 0 holds one client model, rank 1 two): the same
    summary.json numbers and server.pt tensors bit for bit (the server's distillation split over the ranks)."""
    import json

    from fl_lightning.federation.storage.checkpoint import safe_load
    from tests.conftest import run_cli

    base = [
        *tiny_kd_args(config, method),
        f"--{method}.pool_augment",
        "true",
        f"--{method}.synthesis_augment",
        "true",
    ]
    threads = {"OMP_NUM_THREADS": "1"}
    one = run_cli(*base, "--output_dir", str(tmp_path / "one"), env=threads)
    two = run_cli(*base, "--output_dir", str(tmp_path / "two"), "--federation.devices", "2", env=threads)
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    (run1,), (run2,) = (tmp_path / "one").iterdir(), (tmp_path / "two").iterdir()
    s1, s2 = (json.loads((r / "summary.json").read_text()) for r in (run1, run2))
    assert s2["world_size"] == 2 and len(s1["client_accuracy"]) == 3
    assert comparable(s1) == comparable(s2)
    t1, t2 = (safe_load(r / "checkpoints" / "server.pt")["state"] for r in (run1, run2))
    assert t1.keys() == t2.keys()
    for k in t1:
        if not k.endswith("_s"):  # kd.server_distill_s, kd.client_train_s: times
            assert torch.equal(t1[k], t2[k]), k


@pytest.mark.slow  # ~40 s on 2 cores: two runs, one of them on 2 processes
def test_two_processes_distil_as_one(tmp_path):
    one_vs_two_processes("dense_digits_tiny.yaml", "dense", tmp_path)


@pytest.mark.slow  # ~40 s on 2 cores: two runs, one of them on 2 processes
def test_replicas_that_drift_take_rank0s_decisions(tmp_path):
    """Rank 1 as a GPU rank without deterministic kernels may behave (tests/algorithms/drifting_replicas_job.py): its
    first synthesis keeps no batch where rank 0's keeps one, its later batches and its student drift. The 2-process
    run still ends, with one process's numbers bit for bit: every rank takes rank 0's kept batch and, each server
    epoch, its student (without that, rank 1 skips a distillation epoch whose collectives rank 0 runs)."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO, run_cli

    base = [
        *tiny_kd_args("dense_digits_tiny.yaml", "dense"),
        "--federation.collective_timeout_s",
        "60",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    one = run_cli(*base, "--output_dir", str(tmp_path / "one"), env={"OMP_NUM_THREADS": "1"})
    two = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("drifting_replicas_job.py")),
            *base,
            "--output_dir",
            str(tmp_path / "two"),
            "--federation.devices",
            "2",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    (run1,), (run2,) = (tmp_path / "one").iterdir(), (tmp_path / "two").iterdir()
    s1, s2 = (json.loads((r / "summary.json").read_text()) for r in (run1, run2))
    assert s2["world_size"] == 2 and s1["skipped_syntheses"] == s2["skipped_syntheses"] == 0
    assert comparable(s1) == comparable(s2)


def test_a_synthesis_without_a_finite_loss_adds_no_batch(tmp_path):
    """Every generator loss NaN in one epoch (e.g. bf16 logits of untrained clients): that epoch keeps no batch, the
    run goes on and counts it; when every epoch is so, one clear error instead of an untrained student."""
    import fl_lightning.modules.data_free_kd as kd

    original = kd.synthesize
    calls = []

    def nan_first(*args, **kw):
        images, labels = original(*args, **kw)
        calls.append(images is not None)
        return (None if len(calls) == 1 else images), labels

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kd, "synthesize", nan_first)
        summary, _, _ = run(DENSE, "dense_digits_tiny.yaml", tmp_path / "one", *TINY)
    assert summary["skipped_syntheses"] == 1 and len(calls) == 2 and 0 <= summary["accuracy"] <= 1
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kd, "synthesize", lambda *a, **kw: (None, original(*a, **kw)[1]))
        with pytest.raises(RuntimeError, match="no synthesis of the 2 server epochs had a finite generator loss"):
            run(DENSE, "dense_digits_tiny.yaml", tmp_path / "all", *TINY)
