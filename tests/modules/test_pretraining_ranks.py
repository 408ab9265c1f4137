"""Server pre-training data-parallel over two gloo CPU processes (``modules/pretraining_ranks.py``).

The split is the one-rank batches' rows dealt over the ranks (same order, same global batch); both ranks end with
the same weights; the held-out accuracy is one rank's within round-off; a failure on one rank ends both.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from datetime import timedelta

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path
from types import SimpleNamespace

import lightning
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, TensorDataset

from fl_lightning.federation.ranks import collectives
from fl_lightning.federation.ranks.collectives import RankFailure, Ranks, RankStopped, everyone
from fl_lightning.modules.pretraining import EPOCH_STATE, per_rank_batch_and_lr
from fl_lightning.modules.pretraining_ranks import RankBatches, shard_rows
from tests.gloo_ranks import report, run_ranks
from tests.modules.rank_watch import watched
from tests.modules.tiny_vit import pretrain_tiny


class Images(Dataset):
    """Separable class-dependent images (a little fresh noise per read, as an augmentation); optionally one bad item."""

    def __init__(self, n: int, seed: int, bad: int | None = None) -> None:
        g = torch.Generator().manual_seed(seed)
        self.y = torch.arange(n) % 3
        self.x = torch.randn(n, 3, 16, 16, generator=g) * 0.5 + (self.y.float() - 1.0).view(-1, 1, 1, 1)
        self.bad = bad

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        if i == self.bad:
            raise OSError(f"image {i} is truncated")
        return self.x[i] + 0.05 * torch.randn(3, 16, 16), self.y[i]


def _val() -> TensorDataset:
    g = torch.Generator().manual_seed(9)
    y = torch.arange(30) % 3
    return TensorDataset(torch.randn(30, 3, 16, 16, generator=g) * 0.5 + (y.float() - 1.0).view(-1, 1, 1, 1), y)


class Weights(lightning.Callback):
    """The module's weights when training ends (on every rank)."""

    state: dict[str, torch.Tensor] | None = None

    def on_train_end(self, trainer, pl_module) -> None:
        self.state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}


class SigtermHandler(lightning.Callback):
    """The SIGTERM handler in force while the fit runs (Lightning's would be its ``_HandlersCompose``)."""

    name: str | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        handler = signal.getsignal(signal.SIGTERM)
        self.name = (
            type(handler).__name__
            if not callable(handler) or hasattr(handler, "signal_handlers")
            else getattr(handler, "__qualname__", type(handler).__name__)
        )


class Interrupted(RuntimeError):
    pass


class StopInEpoch(lightning.Callback):
    """A crash on every rank in the middle of epoch ``epoch`` (after its second optimizer step)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch and batch_idx == 1:
            raise Interrupted(f"stopped in epoch {self.epoch}")


class Epochs(lightning.Callback):
    """The epochs whose training started."""

    def __init__(self) -> None:
        self.started: list[int] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.started.append(trainer.current_epoch)


class FailInBackward(lightning.Callback):
    """Rank ``rank``'s second step raises inside its backward, from the gradient hook of the first block's attention
    weights: DDP has all-reduced the later layers' buckets by then, the other rank waits for the rest."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == self.rank and trainer.current_epoch == 0 and batch_idx == 1:
            weight = pl_module.model.blocks[0].attn.qkv.weight

            def fail(grad):
                raise RuntimeError(f"CUDA out of memory in rank {self.rank}'s backward (injected)")

            weight.register_hook(fail)


_RUN = dict(max_epochs=3, seed=3, patience=5, batch_size=8, lr=1e-3)  # the tests' run; a test may change its batches


def _pretrain(out: Path, ranks=None, bad=None, **run):
    """The tiny ViT pre-trained as :data:`_RUN` on 45 images (``bad``: the index of an unreadable one) over ``ranks``;
    ``run``: more of ``pretrain_classifier``'s arguments (callbacks, check_every, batch size, lr)."""
    return pretrain_tiny(Images(45, 1, bad), _val(), out, ranks=ranks, **{**_RUN, **run})


def _val_acc(out: Path) -> list[float]:
    import csv

    with open(out / "pretrain" / "version_0" / "metrics.csv", newline="") as f:
        return [float(r["val_acc"]) for r in csv.DictReader(f) if r.get("val_acc")]


def _worker(rank: int, world: int, port: int, out: str, case: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    fabric = SimpleNamespace(global_rank=rank, world_size=world, local_rank=rank, node_rank=0, device=torch.device("cpu"))
    ranks = Ranks(fabric, 60.0)
    result: dict = {}
    if case == "resume":  # uninterrupted, then interrupted in epoch 2 of 3 and called again
        for name, stops in (("full", False), ("cut", True)):
            weights = Weights()
            if stops:
                try:
                    _pretrain(Path(out) / name, ranks, callbacks=[StopInEpoch(1)])
                except Interrupted:
                    result["interrupted"] = (Path(out) / name / EPOCH_STATE).is_file()
            ckpt, _ = _pretrain(Path(out) / name, ranks, callbacks=[weights])
            result[name] = (str(ckpt), weights.state)
        report(out, rank, result)
        return
    if case in ("backward", "unchecked"):  # the engine's set-up: a gloo object group, the exchange, the watch
        fabric.strategy = SimpleNamespace(object_group=dist.new_group(backend="gloo"))
        result["failed_at"] = time.time()
        # backward: rank 1 raises inside DDP's backward; unchecked: a bad image on rank 1 between two checks
        run = dict(callbacks=[FailInBackward(1)]) if case == "backward" else dict(bad=44 if rank == 1 else None, check_every=1000)
        with watched(out, rank, world, result):
            everyone(fabric, lambda: _pretrain(Path(out) / "run", ranks, **run), what="the pre-training", timeout_s=600)
        report(out, rank, result)  # not reached: the watch ends both ranks
        return
    epochs = Epochs()
    try:
        if case in ("fails", "write_fails"):
            collectives._LEADER_EXIT_GRACE_S = 0.0
        if case == "write_fails" and rank == 0:  # epoch 0's epoch state finds the disk full, in the background
            from fl_lightning.modules import pretraining

            def full(checkpoint, path) -> None:
                raise OSError(28, "No space left on device", str(path))

            pretraining.write_checkpoint = full
        weights, handler = Weights(), SigtermHandler()
        per_rank = dict(batch_size=4, batch_per_rank=True) if case == "per_rank" else {}  # 2 ranks × 4 rows
        ckpt, done = _pretrain(
            Path(out) / "run",
            ranks,
            bad=44 if case == "fails" and rank == 1 else None,
            callbacks=[weights, handler, epochs],
            **per_rank,
        )
        result.update(ckpt=str(ckpt), epochs=done, weights=weights.state, sigterm=handler.name)
    except (RankFailure, RankStopped, OSError) as err:
        result["error"] = (type(err).__name__, str(getattr(err, "message", err)))
    result["started"] = epochs.started
    report(out, rank, result)


def _run(tmp_path: Path, case: str, world: int = 2) -> list[dict]:
    return run_ranks(_worker, world, tmp_path, case)


class _Keys(Dataset):
    def __getitem__(self, key):
        return key


@pytest.mark.parametrize("n,batch,world", [(45, 8, 2), (7, 8, 3), (9, 4, 4), (1, 1, 2)])
def test_the_ranks_split_every_one_rank_batch_of_every_epoch(n, batch, world):
    """Shuffled by the same generator, the ranks' rows of each batch are the one-rank loader's batch, every row once,
    epoch after epoch; the weights N/|b| sum to N over the ranks; a rank without a row gets one at weight 0."""
    one = DataLoader(list(range(n)), batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(5))
    gens = [torch.Generator().manual_seed(5) for _ in range(world)]
    loaders = [
        DataLoader(
            _Keys(), batch_sampler=RankBatches(n, batch, r, world, gens[r]), generator=gens[r], collate_fn=lambda items: items
        )
        for r in range(world)
    ]
    for _ in range(3):
        parts = [list(loader) for loader in loaders]
        expected = [b.tolist() for b in one]
        assert all(len(p) == len(expected) == len(loaders[0].batch_sampler) for p in parts)
        for b, rows in enumerate(expected):
            shards = [parts[r][b] for r in range(world)]
            got = sorted(i for shard in shards for i, w, size in shard if w > 0)
            assert got == sorted(rows) and all(size == len(rows) for s in shards for _, _, size in s)
            assert sum(w for s in shards for _, w, _ in s) == pytest.approx(world)
            assert [i for i, w, _ in shards[0] if w > 0] == rows[0::world]
    assert shard_rows([4], 1, 2) == [(4, 0.0, 1)]


def test_per_rank_batches_multiply_the_global_batch_and_scale_the_rate_by_their_rule():
    assert per_rank_batch_and_lr(8, 1e-3, world=4, per_rank=False, rule="sqrt") == (8, 1e-3)  # the global batch
    assert per_rank_batch_and_lr(8, 1e-3, world=1, per_rank=True, rule="linear") == (8, 1e-3)  # one rank: as given
    assert per_rank_batch_and_lr(8, 1e-3, world=4, per_rank=True, rule="sqrt") == (32, 2e-3)
    assert per_rank_batch_and_lr(8, 1e-3, world=4, per_rank=True, rule="linear") == (32, 4e-3)
    assert per_rank_batch_and_lr(8, 1e-3, world=4, per_rank=True, rule="none") == (32, 1e-3)
    with pytest.raises(ValueError, match="lr_scaling='cubic' is not allowed"):
        per_rank_batch_and_lr(8, 1e-3, world=2, per_rank=True, rule="cubic")


@pytest.mark.slow  # ~50 s on 2 busy cores: a one-rank pre-training at batch 8, a two-rank one at 4 rows per rank
def test_per_rank_batches_on_two_ranks_are_one_ranks_training_at_the_doubled_batch_and_scaled_rate(tmp_path):
    """``batch_per_rank``: 2 ranks of 4 rows train as one rank of batch 8 at η·√2 (the same steps, within round-off
    and each rank's augmentation draws, as the global-batch test below measures)."""
    torch.set_num_threads(1)
    one, _ = _pretrain(tmp_path / "one", batch_size=8, lr=1e-3 * 2**0.5)
    zero, other = _run(tmp_path, "per_rank")
    assert "error" not in zero and "error" not in other, (zero, other)
    assert all(torch.equal(zero["weights"][k], other["weights"][k]) for k in zero["weights"])
    accuracies_one, accuracies_two = _val_acc(tmp_path / "one"), _val_acc(tmp_path / "run")
    assert len(accuracies_one) == len(accuracies_two) == 3
    assert max(abs(a - b) for a, b in zip(accuracies_one, accuracies_two)) <= 1 / 30 + 1e-6
    ref = torch.load(one, weights_only=True)["state_dict"]
    two = torch.load(zero["ckpt"], weights_only=True)["state_dict"]
    assert max(float((ref[k] - two[k]).abs().max()) for k in ref if k.startswith("model.")) < 1e-2
    hparams = torch.load(zero["ckpt"], weights_only=True)["hyper_parameters"]
    assert hparams["lr"] == pytest.approx(1e-3 * 2**0.5)  # the rate the ranks trained at


@pytest.mark.slow  # ~50 s on 2 busy cores: one-rank and two-rank pre-trainings of a tiny ViT
def test_two_ranks_pretrain_to_equal_weights_and_one_ranks_accuracy(tmp_path):
    """Both ranks end with the same weights bit for bit (the gradients are all-reduced), rank 0 writes the files and
    the held-out accuracy of each epoch is one rank's within 1/30 (one image): float round-off (other batch companions,
    the gradient's sum in another order) and each rank's own augmentation draws move the weights (measured 6e-3)."""
    torch.set_num_threads(1)
    one, _ = _pretrain(tmp_path / "one")
    zero, other = _run(tmp_path, "shared")
    assert "error" not in zero and "error" not in other, (zero, other)
    assert zero["ckpt"] == other["ckpt"] and zero["epochs"] == other["epochs"] == 3
    assert zero["sigterm"] == other["sigterm"] != "_HandlersCompose", zero["sigterm"]  # not Lightning's handler
    assert Path(zero["ckpt"]).is_file() and not (tmp_path / "run" / EPOCH_STATE).exists()
    assert zero["weights"].keys() == other["weights"].keys()
    assert all(torch.equal(zero["weights"][k], other["weights"][k]) for k in zero["weights"])
    accuracies_one, accuracies_two = _val_acc(tmp_path / "one"), _val_acc(tmp_path / "run")
    print("held-out accuracy per epoch: one rank", accuracies_one, "two ranks", accuracies_two)
    assert len(accuracies_one) == len(accuracies_two) == 3
    assert max(abs(a - b) for a, b in zip(accuracies_one, accuracies_two)) <= 1 / 30 + 1e-6  # float32 accuracies
    ref = torch.load(one, weights_only=True)["state_dict"]
    two = torch.load(zero["ckpt"], weights_only=True)["state_dict"]
    drift = max(float((ref[k] - two[k]).abs().max()) for k in ref if k.startswith("model."))
    print("largest weight difference, best checkpoints of one vs two ranks:", drift)
    assert 0 < drift < 1e-2, drift  # not the same floats, but the same training


@pytest.mark.slow  # ~40 s on 2 busy cores (spawning included): a bad image on rank 1 ends both ranks in the step it is read
def test_a_rank_failing_in_pretraining_ends_every_rank(tmp_path):
    zero, one = _run(tmp_path, "fails")
    assert zero["error"][0] == "RankFailure" and "rank 1" in zero["error"][1] and "truncated" in zero["error"][1]
    assert one["error"][0] == "RankStopped" and "rank 1" in one["error"][1]


@pytest.mark.slow  # ~30 s on 2 busy cores (spawning included): rank 0's epoch state finds the disk full
def test_rank_0_s_failed_epoch_state_write_ends_every_rank_at_the_next_epoch_s_end(tmp_path):
    """Rank 0 writes epoch 0's state in the background while epoch 1 trains; at epoch 1's end it takes the write's
    error to the guard: rank 0 raises it, rank 1 stops, and neither starts epoch 2."""
    zero, one = _run(tmp_path, "write_fails")
    assert zero["error"] == ("OSError", f"[Errno 28] No space left on device: '{tmp_path / 'run' / EPOCH_STATE}'")
    assert one["error"] == ("RankStopped", f"OSError: {zero['error'][1]}")  # rank 0's line
    assert zero["started"] == one["started"] == [0, 1]
    assert not (tmp_path / "run" / EPOCH_STATE).exists()  # never written


@pytest.mark.slow  # ~30 s on 2 busy cores: a two-rank pre-training checked every 1000 steps, a bad image on rank 1
def test_a_rank_failing_between_two_checks_ends_every_rank_within_seconds(tmp_path):
    """With ``check_every`` above the epoch's steps no step is agreed on: rank 1 reads a truncated image and raises at
    once, into the exchange of outcomes; rank 0 goes on into the step's gradient all-reduce and waits there. The
    watch names rank 1 with its error after two beats, as for an error inside DDP's backward."""
    zero, one = _run(tmp_path, "unchecked")
    line, status, at = zero["verdict"]
    assert status == 1 and line.startswith(f"rank 1 on {socket.gethostname()} failed in the pre-training: "), line
    assert "truncated" in line and line.endswith("the same command resumes from the last completed round")
    assert at - zero["failed_at"] < 60  # far below the process group's 120 s
    assert one["verdict"][:2] == (None, 1)


@pytest.mark.slow  # ~35 s on 2 busy cores: three two-rank pre-trainings
def test_an_interrupted_two_rank_pretraining_resumes_to_the_uninterrupted_weights(tmp_path):
    """Every rank reads the epoch state rank 0 wrote; each rank's random streams restart from (seed, epoch, rank):
    the resumed run's weights are the uninterrupted two-rank run's, bit for bit, on both ranks."""
    zero, one = _run(tmp_path, "resume")
    assert zero["interrupted"] and one["interrupted"]
    for result in (zero, one):
        full, cut = result["full"][1], result["cut"][1]
        assert all(torch.equal(full[k], cut[k]) for k in full)
        assert Path(result["full"][0]).name == Path(result["cut"][0]).name
    assert all(torch.equal(zero["cut"][1][k], one["cut"][1][k]) for k in zero["cut"][1])
    assert not (tmp_path / "cut" / EPOCH_STATE).exists()


@pytest.mark.slow  # ~30 s on 2 busy cores: a two-rank pre-training whose rank 1 fails inside DDP's backward
def test_a_rank_failing_inside_ddps_backward_ends_every_rank_within_seconds(tmp_path):
    """Rank 1 raises inside its backward (an out-of-memory there): rank 0 sits in DDP's all-reduce for buckets rank 1
    will never send — on NCCL until the compute timeout, here the process group's 120 s. Rank 1 waits in the
    exchange of outcomes with its error; rank 0's watch names it after two beats (patience 3 s: 1 s) and both end
    with its status, rank 0 printing the line, rank 1 quietly after it."""
    zero, one = _run(tmp_path, "backward")
    line, status, at = zero["verdict"]
    assert status == 1 and line.startswith(
        f"rank 1 on {socket.gethostname()} failed in the pre-training: "
        "RuntimeError: CUDA out of memory in rank 1's backward (injected)"
    )
    assert line.endswith("every rank stops; the same command resumes from the last completed round")
    assert at - zero["failed_at"] < 60  # the pre-training's start included; far below the 120 s timeout
    assert one["verdict"][:2] == (None, 1) and one["verdict"][2] >= at
