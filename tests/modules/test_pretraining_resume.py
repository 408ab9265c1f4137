"""Pre-training resumes where it stopped: interrupted during epoch 2 of 2 and called again, it reaches the
weights of an uninterrupted run bit for bit (CPU, one thread), and leaves no epoch state behind.

The training data draws from the global torch RNG per item (a noise augmentation, as the random crops of
the real transform do) and is shuffled by the loader's generator: both are part of the saved state, so an
equal result means the model, optimizer, schedule, loop counters and random streams all came back.
"""

from __future__ import annotations

import csv
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import lightning
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from fl_lightning.modules.pretraining import EPOCH_STATE
from tests.modules.tiny_vit import NAME, TINY, pretrain_tiny


class NoisyImages(Dataset):
    """Class-dependent images plus fresh noise from the global RNG on every read (a random augmentation)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.y = torch.arange(n) % 3
        self.x = torch.randn(n, 3, 16, 16, generator=g) * 0.5 + (self.y.float() - 1.0).view(-1, 1, 1, 1)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i] + 0.1 * torch.randn(3, 16, 16), self.y[i]


class Interrupted(RuntimeError):
    pass


class Terminated(KeyboardInterrupt):
    """As the CLI's SIGTERM (``experiments.runner._Terminated``): a KeyboardInterrupt, which Lightning turns into exit(1)."""


class StopInEpoch(lightning.Callback):
    """A crash in the middle of epoch ``epoch`` (after its second optimizer step)."""

    def __init__(self, epoch: int, error: type[BaseException] = Interrupted) -> None:
        self.epoch, self.error = epoch, error

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch and batch_idx == 1:
            raise self.error(f"stopped in epoch {self.epoch}")


def _pretrain(out: Path, **kw):
    val = TensorDataset(torch.randn(6, 3, 16, 16, generator=torch.Generator().manual_seed(9)), torch.arange(6) % 3)
    return pretrain_tiny(NoisyImages(40, 1), val, out, max_epochs=2, batch_size=8, lr=1e-3, seed=3, patience=5, **kw)


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.parametrize("error", [Interrupted, KeyboardInterrupt, Terminated])
def test_interrupted_pretraining_resumes_to_the_uninterrupted_weights(tmp_path: Path, one_thread, error) -> None:
    import signal

    straight = _pretrain(tmp_path / "straight")
    assert not (tmp_path / "straight" / EPOCH_STATE).exists()  # deleted once training finished

    out = tmp_path / "resumed"
    sigint = signal.getsignal(signal.SIGINT)
    with pytest.raises(error) as raised:  # the interruption itself, not Lightning's exit(1)
        _pretrain(out, callbacks=[StopInEpoch(1, error)])
    assert type(raised.value) is error
    assert signal.getsignal(signal.SIGINT) is sigint  # Ctrl-C works again
    state = torch.load(out / EPOCH_STATE, map_location="cpu", weights_only=True)
    assert state["epoch"] == 0 and not (out / f"{EPOCH_STATE}.tmp").exists()  # epoch 1's end, written whole
    resumed = _pretrain(out)
    assert not (out / EPOCH_STATE).exists()
    assert resumed.epochs == straight.epochs == 2
    assert resumed.checkpoint.name == straight.checkpoint.name
    a, b = _weights(straight.checkpoint), _weights(resumed.checkpoint)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert _metrics(out) == _metrics(tmp_path / "straight")  # one log, continued: the uninterrupted one's rows


class StopAtValidation(lightning.Callback):
    """A crash when epoch ``epoch``'s validation starts: its training rows are in the CSV log already."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            raise Interrupted(f"stopped before the validation of epoch {self.epoch}")


def _metrics(out: Path) -> list[dict[str, str]]:
    """The pre-training's CSV log, which must be the only one (a resumed fit continues it, no ``version_1``)."""
    (log,) = (out / "pretrain").iterdir()
    assert log.name == "version_0" and not list(log.glob("*.tmp"))
    with open(log / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _epochs(rows: list[dict[str, str]], column: str) -> list[int]:
    return [int(row["epoch"]) for row in rows if row[column]]


def test_resumed_pretraining_continues_its_log_without_repeating_an_epoch(tmp_path: Path, one_thread) -> None:
    """Interrupted in epoch 2 of 2 after its training rows were logged: the resumed pre-training drops those (the
    epoch runs again), keeps epoch 1's and appends; the log equals an uninterrupted run's, row for row."""
    straight = _metrics(_pretrain(tmp_path / "straight").checkpoint.parents[1])
    assert _epochs(straight, "val_acc") == _epochs(straight, "train_acc") == [0, 1]  # one row per epoch
    assert _epochs(straight, "train_loss_step") == [0, 1]  # log_every_n_steps = the 5 batches of an epoch

    out = tmp_path / "resumed"
    with pytest.raises(Interrupted):
        _pretrain(out, callbacks=[StopAtValidation(1)])
    interrupted = _metrics(out)
    assert _epochs(interrupted, "train_loss_step") == [0, 1] and _epochs(interrupted, "val_acc") == [0]
    assert interrupted[:-1] == straight[: len(interrupted) - 1]  # all of epoch 1, and epoch 2's first row
    _pretrain(out)
    resumed = _metrics(out)
    assert list(resumed[0]) == list(straight[0])  # the same columns, in order
    assert resumed == straight  # the same epochs, the continued one's values equal


def test_frozen_parameters_have_no_optimizer_state_in_the_epoch_state(tmp_path: Path, one_thread) -> None:
    """Only what the optimizer trains is saved with moments: a frozen patch embedding carries none."""
    from fl_lightning.modules import pretraining

    class FrozenStem(lightning.Callback):
        def setup(self, trainer, pl_module, stage) -> None:
            pl_module.model.patch_embed.requires_grad_(False)

    out = tmp_path / "frozen"
    with pytest.raises(Interrupted):
        _pretrain(out, callbacks=[FrozenStem(), StopInEpoch(1)])
    state = torch.load(out / EPOCH_STATE, map_location="cpu", weights_only=True)
    (opt,) = state["optimizer_states"]
    module = pretraining.ViTClassifier(model_name=NAME, num_classes=3, overrides=TINY)
    trainable = sum(1 for n, p in module.named_parameters() if not n.startswith("model.patch_embed."))
    assert len(opt["state"]) == trainable == len(opt["param_groups"][0]["params"])


def test_loader_workers_resume_to_the_uninterrupted_weights(tmp_path: Path, one_thread) -> None:
    """With DataLoader workers the augmentations come from the workers' seeds, which each epoch draws from the data
    order's generator: a run interrupted in epoch 2 and resumed reaches the uninterrupted run's weights; a run
    without workers reads other random streams (the documented relation)."""
    straight = _pretrain(tmp_path / "straight", num_workers=1)
    with pytest.raises(Interrupted):
        _pretrain(tmp_path / "resumed", num_workers=1, callbacks=[StopInEpoch(1)])
    resumed = _pretrain(tmp_path / "resumed", num_workers=1)
    a, b = _weights(straight.checkpoint), _weights(resumed.checkpoint)
    assert all(torch.equal(a[k], b[k]) for k in a)
    alone = _weights(_pretrain(tmp_path / "alone").checkpoint)
    assert not all(torch.equal(a[k], alone[k]) for k in a)


def test_each_rank_s_workers_have_their_own_random_stream() -> None:
    from fl_lightning.modules.pretraining_ranks import seed_rank_worker

    def draws(rank: int, worker: int) -> torch.Tensor:
        torch.manual_seed(1234 + worker)  # what the DataLoader seeds a worker with: base seed + worker id
        seed_rank_worker(rank, worker)
        return torch.rand(4)

    assert torch.equal(draws(0, 0), draws(0, 0))  # reproducible
    assert not torch.equal(draws(0, 0), draws(1, 0)) and not torch.equal(draws(0, 0), draws(0, 1))
