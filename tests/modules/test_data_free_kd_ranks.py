"""The split ensemble (DENSE / Co-Boosting's teachers over the ranks) against one process's, bit for bit."""

import contextlib
import os
import socket
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from fl_lightning.dealing import Deal
from fl_lightning.federation.ranks import collectives
from fl_lightning.modules.data_free_kd import (
    Generator,
    SynthesisSettings,
    WeightedEnsemble,
    distill_epoch,
    random_shift_flip,
    synthesize,
)
from fl_lightning.modules.data_free_kd_ranks import SplitEnsemble
from tests.gloo_ranks import report, run_ranks
from tests.modules.kd_settings import synthesis_settings
from tests.modules.rank_watch import watched

K, CLASSES, SIZE = 3, 5, 8  # K not a multiple of the 2 ranks: rank 0 holds teacher 0, rank 1 teachers 1 and 2


class _TinyCNN(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.body = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1),
            nn.BatchNorm2d(6),
            nn.ReLU(),
            nn.Conv2d(6, 6, 3, padding=1),
            nn.BatchNorm2d(6),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(24, CLASSES),
        )
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            for m in self.modules():  # running statistics that L_BN pulls towards
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.3)
                    m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)

    def forward(self, x):
        return self.body(x)


def _teachers(shard) -> list[nn.Module]:
    return [_TinyCNN(10 + k).eval().requires_grad_(False) for k in shard]


def _settings(**kw) -> SynthesisSettings:
    """A 4-step synthesis of 10 images with DENSE's terms on (L_BN, adversarial, augmented view)."""
    return synthesis_settings(**{"steps": 4, "batch_size": 10, "bn": 0.1, "adv": 1.0, "augment": True, **kw})


def _scenario(make_ensemble, precision: str) -> dict[str, torch.Tensor]:
    """The ensemble's logits and input gradient, a DENSE synthesis and distillation, a Co-Boosting one (weighted
    ensemble, hardness, L_BN / K, clipping, ODS, a re-weighting's logits); every value that could differ."""
    torch.manual_seed(0)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext
    out: dict[str, torch.Tensor] = {}
    normalize = lambda x: (x - 0.5) / 0.25  # noqa: E731
    rng = torch.Generator().manual_seed(1)
    leaf = torch.randn(7, 3, SIZE, SIZE, generator=rng).requires_grad_(True)
    w = torch.tensor([0.5, 0.2, 0.3])
    for name, weights in (("mean", None), ("weighted", w), ("leaf", w)):
        ensemble = make_ensemble(weights)
        student = _TinyCNN(99).eval()
        with autocast():
            if name == "leaf":  # a leaf that only the teachers read (ODS's input): autocast casts it once
                t, s = ensemble(leaf), None
            else:  # not a leaf (G's images), read by the student after the teachers, as in L_G
                x = normalize(leaf)
                t, s = ensemble(x), student(x)
        loss = t.float().logsumexp(1).sum() + (0.0 if s is None else (s.float() * t.float()).mean())
        (grad,) = torch.autograd.grad(loss, leaf)
        out[name + "_logits"], out[name + "_grad"] = t.detach(), grad
        with torch.no_grad(), autocast():
            out[name + "_members"] = ensemble.member_logits(leaf).detach()
    for name, weights, settings, ods in (
        ("dense", None, _settings(), None),
        (
            "coboosting",
            w,
            _settings(bn_per_model=True, hardness=1.0, mask_agreement=False, augment=False, clip_grad=1.0, adv_temperature=3.0),
            8 / 255,
        ),
    ):
        ensemble = make_ensemble(weights)
        student = _TinyCNN(7).eval()
        generator = Generator(nz=8, ngf=4, image_size=SIZE)
        rng = torch.Generator().manual_seed(3)
        images, labels = synthesize(
            generator,
            ensemble,
            student,
            num_classes=CLASSES,
            settings=settings,
            normalize=normalize,
            rng=rng,
            device=torch.device("cpu"),
            autocast=autocast,
        )
        out[name + "_images"], out[name + "_labels"] = images, labels
        out.update({f"{name}_G.{k}": v.detach().clone() for k, v in generator.state_dict().items()})
        optimizer = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9)
        view = lambda b, r: random_shift_flip(b, rng=r, padding=1)  # noqa: E731
        for epoch in range(2):
            out[f"{name}_loss{epoch}"] = torch.tensor(
                distill_epoch(
                    student,
                    ensemble,
                    images,
                    optimizer=optimizer,
                    batch_size=4,
                    temperature=4.0,
                    rng=rng,
                    ods_eta=ods,
                    clip_grad=settings.clip_grad,
                    augment=view,
                    autocast=autocast,
                )
            )
        out.update({f"{name}_S.{k}": v.detach().clone() for k, v in student.state_dict().items()})
    return out


def _one(precision: str) -> dict[str, torch.Tensor]:
    return _scenario(lambda weights: WeightedEnsemble(_teachers(range(K)), weights), precision)


def _split(precision: str) -> dict[str, torch.Tensor]:
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    return _scenario(
        lambda weights: SplitEnsemble(_teachers(Deal(rank, world).blocks(K)), weights, num_members=K, num_classes=CLASSES),
        precision,
    )


def _assert_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), (key, (a[key].float() - b[key].float()).abs().max())


@pytest.mark.parametrize("precision", ["32", "bf16"])
def test_one_process_split_ensemble_is_the_plain_one(precision, one_thread):
    """On one process the split ensemble computes as WeightedEnsemble: the same logits, input gradient (the
    per-teacher gradients added in one rank's order), synthesis and distillation, bit for bit."""
    _assert_equal(_split(precision), _one(precision))


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = {p: _split(p) for p in ("32", "bf16")}
    except Exception as err:  # noqa: BLE001 — reported by the test
        result = {"error": repr(err)}
    report(out, rank, result)


def test_two_processes_split_ensemble_is_one_process(tmp_path, one_thread):
    """K = 3 teachers on 2 gloo processes (1 + 2): the logits, the input gradients, a DENSE and a Co-Boosting
    synthesis (G's weights and kept batch) and two distillation epochs each are one process's, bit for bit, on
    both ranks; float32 and bf16 autocast (one intra-op thread here as in the workers, whatever OMP_NUM_THREADS)."""
    ranks = run_ranks(_worker, 2, tmp_path)
    for result in ranks:
        assert "error" not in result, result.get("error")
        for precision in ("32", "bf16"):
            _assert_equal(result[precision], _one(precision))


def _failing_worker(rank: int, world: int, port: int, out: str) -> None:
    """The engine's set-up (a gloo object group, the exchange of outcomes around the phase, the liveness watch);
    rank 1 fails between two of the split ensemble's calls, rank 0 goes on into the next one's gather."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    fabric = SimpleNamespace(
        global_rank=rank, world_size=world, strategy=SimpleNamespace(object_group=dist.new_group(backend="gloo"))
    )
    result: dict = {}

    def distillation() -> None:
        ensemble = SplitEnsemble(_teachers(Deal(rank, world).blocks(K)), num_members=K, num_classes=CLASSES)
        x = torch.randn(4, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
        ensemble(x)  # every rank: one gather
        result["failed_at"] = time.time()
        if rank == 1:
            raise RuntimeError("CUDA out of memory in the student's step (injected)")
        ensemble(x)  # rank 0: a gather rank 1 never joins

    with watched(out, rank, world, result):
        collectives.everyone(fabric, distillation, what="the server's distillation", timeout_s=600)
    report(out, rank, result)  # not reached: the watch ends both ranks


@pytest.mark.slow  # ~15 s: two spawned ranks
def test_a_rank_failing_between_the_split_ensembles_gathers_ends_every_rank_within_seconds(tmp_path):
    """Rank 0 waits in the split ensemble's next gather (a compute collective: on NCCL until the compute timeout,
    here the group's 120 s); rank 1 waits with its error in the exchange of outcomes. Rank 0's watch names rank 1
    after two beats (patience 3 s); both end with its status, rank 1 quietly after rank 0."""
    zero, one = run_ranks(_failing_worker, 2, tmp_path)
    line, status, at = zero["verdict"]
    assert line == (
        f"rank 1 on {socket.gethostname()} failed in the server's distillation: RuntimeError: CUDA out of "
        "memory in the student's step (injected); every rank stops; the same command resumes from the "
        "last completed round"
    )
    assert status == 1 and at - one["failed_at"] < 20  # not the 120 s of the collective
    assert one["verdict"][:2] == (None, 1) and one["verdict"][2] >= at


def test_synthesize_keeps_no_batch_when_every_loss_is_nan():
    """All of L_G non-finite (e.g. bf16 logits of untrained clients): no batch to keep, None (the caller skips)."""

    class _NaN(nn.Module):
        def forward(self, x):
            return _TinyCNN(0)(x) * float("nan")

    ensemble = WeightedEnsemble([_NaN().eval()])
    images, labels = synthesize(
        Generator(nz=8, ngf=4, image_size=SIZE),
        ensemble,
        _TinyCNN(1).eval(),
        num_classes=CLASSES,
        settings=_settings(bn=0.0),
        normalize=lambda x: x,
        rng=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
    )
    assert images is None and labels.shape == (10,)
