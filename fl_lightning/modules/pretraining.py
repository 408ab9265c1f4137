"""Server-side pre-training of a timm ViT classifier on FeDiSyn's synthetic images.

FeDiSyn's server, having generated λ·D synthetic images from the clients' noised latent centroids,
pre-trains the vision transformer on them (full fine-tuning, cross-entropy) before LoRA federated
fine-tuning starts. This file holds that step:

* :class:`ViTClassifier` — the LightningModule (timm ViT + cross-entropy, AdamW with a cosine schedule);
* :func:`pretrain_classifier` — a ``lightning.Trainer`` run with early stopping on a held-out synthetic
  split, returning the best checkpoint and the epochs it ran (:class:`PretrainResult`);
* :func:`load_pretrained_vit` — the trained timm model (with its head) back from that checkpoint;
* :func:`split_holdout` — a seeded train / held-out split of a dataset;
* :func:`build_timm_vit` — a timm classifier at random init or from local (e.g. ImageNet) weights, also
  the starting point of the baselines that skip synthetic pre-training (SFLF, CAFF).

Resuming: every epoch ends with the whole training state in ``<out_dir>/epoch_state.ckpt`` (weights, the
optimizer's moments — only trainable parameters have any —, schedule, loop counters, early stopping, the best
checkpoint's record, and the random states: torch / CUDA / numpy / Python and the data order's generator),
taken at the epoch's end and copied to host memory, then written whole and renamed by a background thread while
the next epoch trains (``background_write.py``; the next epoch's end and the fit's end wait for it and raise its
error). An interrupted pre-training called again with the same arguments continues from
it and reaches the weights of an uninterrupted one; the file is deleted when training finishes. The CSV log
(``<out_dir>/pretrain/version_0/metrics.csv``) is continued too: it keeps the rows of the epochs the state had
completed, drops those of the interrupted epoch (which runs again) and appends the new ones, so it reads as the
log of an uninterrupted run.

Over several ranks (``ranks=``, every rank of a shared server phase calling it together) the same Trainer runs
data-parallel on the run's process group: ``pretraining_ranks.py`` says how the batches are split, why the result
is one rank's within round-off (not bit for bit) and how a failure on one rank ends every rank. The epoch state then
also resumes: every rank reads it, and the random states are reseeded per (seed, epoch, rank) at each epoch's start.

Weights are never downloaded: the backbone starts from random initialisation or from a local file.
"""

from __future__ import annotations

import csv
import math
import os
import random
import signal
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import lightning
import numpy as np
import torch
import torch.nn.functional as F
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.callbacks import Callback, Checkpoint, EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from fl_lightning.data.preprocessed import collate
from fl_lightning.durable_write import atomic_path
from fl_lightning.errors import MissingResourceError
from fl_lightning.federation.ranks.collectives import Ranks
from fl_lightning.modules.background_write import BackgroundWriter, host_copy, write_checkpoint
from fl_lightning.modules.pretraining_ranks import (
    GuardedIO,
    JoinedDDP,
    RankBatches,
    RankGuard,
    RankItems,
    RankSeeds,
    collate_rank_items,
    seed_rank_worker,
)

__all__ = [
    "ViTClassifier",
    "PretrainResult",
    "build_timm_vit",
    "pretrain_classifier",
    "load_pretrained_vit",
    "split_holdout",
    "EPOCH_STATE",
]

# The end-of-epoch training state in the pre-training folder (present only while a pre-training is unfinished).
EPOCH_STATE = "epoch_state.ckpt"

# Metric that picks the best checkpoint and drives early stopping (held-out synthetic accuracy).
_MONITOR = "val_acc"


def build_timm_vit(
    *, model_name: str, num_classes: int, overrides: Mapping[str, Any] | None, checkpoint: str | None
) -> nn.Module:
    """A timm model, randomly initialised or with backbone weights from a local file or a cached hub id.

    With a file, timm's own loader (``pretrained_cfg_overlay=dict(file=...)``) adapts the weights and
    re-initialises the classifier when its size differs from ``num_classes`` — pre-training on
    synthetic classes always starts a fresh head.
    """
    import timm

    kwargs = dict(overrides or {})
    if checkpoint is None:
        return timm.create_model(model_name, pretrained=False, num_classes=num_classes, **kwargs)
    from fl_lightning.models.hub import resolve_weights_file

    # a file, or a hub id's snapshot in the HF cache (fetched, with model.download, by the preflight)
    path = Path(resolve_weights_file(checkpoint, download=False, key="pretrain_checkpoint"))
    if not path.is_file():
        raise MissingResourceError(
            f"timm weights for {model_name!r} not found at {path}; put the .pth/.bin/.safetensors file there "
            "or set the model checkpoint to null to start from random initialisation (weights are never downloaded)"
        )
    return timm.create_model(
        model_name,
        pretrained=True,
        pretrained_cfg_overlay=dict(file=str(path)),
        num_classes=num_classes,
        **kwargs,
    )


class ViTClassifier(lightning.LightningModule):
    """A timm ViT trained with cross-entropy (FeDiSyn's server pre-training on synthetic images).

    Args:
        model_name: timm architecture, e.g. ``vit_base_patch16_224``.
        num_classes: number of (synthetic) classes.
        overrides: extra ``timm.create_model`` kwargs (``img_size``, ``depth``, ... for tiny models).
        checkpoint: local weights file for the backbone, or ``None`` for random initialisation.
        lr: AdamW peak learning rate.
        weight_decay: AdamW decoupled weight decay.

    Example::

        module = ViTClassifier(model_name="vit_tiny_patch16_224", num_classes=10,
                               overrides=dict(img_size=32, patch_size=8))
    """

    def __init__(
        self,
        *,
        model_name: str,
        num_classes: int,
        overrides: Mapping[str, Any] | None = None,
        checkpoint: str | os.PathLike[str] | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes={num_classes!r} is not allowed; expected an int >= 2")
        if not lr > 0:
            raise ValueError(f"lr={lr!r} is not allowed; expected a float > 0")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay={weight_decay!r} is not allowed; expected a float >= 0")
        checkpoint = None if checkpoint is None else str(checkpoint)
        overrides = dict(overrides or {})
        # Plain types only: the checkpoint must load with torch.load(weights_only=True).
        self.save_hyperparameters(
            dict(
                model_name=model_name,
                num_classes=int(num_classes),
                overrides=overrides,
                checkpoint=checkpoint,
                lr=float(lr),
                weight_decay=float(weight_decay),
            )
        )
        self.model = build_timm_vit(model_name=model_name, num_classes=num_classes, overrides=overrides, checkpoint=checkpoint)
        # imported here: torchmetrics.classification imports every functional metric domain (transformers
        # among them), which a run that never pre-trains should not pay for
        from torchmetrics.classification import MulticlassAccuracy

        # one process (also rank 0 alone inside a multi-rank federation): never wait for other ranks; a data-parallel
        # pre-training sums the counts over its ranks (share_over_ranks)
        self.train_acc = MulticlassAccuracy(num_classes=num_classes, average="micro", sync_on_compute=False)
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro", sync_on_compute=False)
        # data-parallel over the ranks of a shared phase (pretraining_ranks.py): set by pretrain_classifier
        self.guard: RankGuard | None = None
        # the float part of a uint8 batch, run on the device (on_after_batch_transfer): set by pretrain_classifier
        self.batch_transform: Any = None

    def share_over_ranks(self, guard: RankGuard) -> None:
        """Train data-parallel: batches of ``(image, label, weight)`` (``pretraining_ranks.RankBatches``), every
        step checked on every rank by ``guard``, the accuracies' counts summed over the ranks."""
        self.guard = guard
        self.train_acc.sync_on_compute = self.val_acc.sync_on_compute = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)  # (B, num_classes)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """A batch whose images arrive as uint8 (a store's, ``synthesis/store.py``) gets ``batch_transform`` (the
        float part: ``ToDtype``, clamp, ``Normalize``) here, on this module's device."""
        transform = self.batch_transform
        if (
            transform is None
            or not isinstance(batch, (tuple, list))
            or not isinstance(batch[0], torch.Tensor)
            or batch[0].dtype != torch.uint8
        ):
            return batch
        return type(batch)([transform(batch[0]), *batch[1:]])

    def _rank_step(self, batch: Any, batch_idx: int, what: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """This rank's part of a global batch (``pretraining_ranks``): (logits of its rows, labels, the loss
        (N / |b|) Σ CE_i whose mean over the ranks is the global batch's mean, |b|); an error on any rank (the
        batch's loading included) ends every rank here at a checked step, before the backward's all-reduce, and
        through the ranks' liveness watch between checks (:class:`~fl_lightning.modules.pretraining_ranks.RankGuard`)."""
        own: Exception | None = None
        try:
            if not isinstance(batch, (tuple, list)):  # a FailedBatch
                raise batch.error
            x, y, w, sizes = batch
            logits = self(x)
            w = w.to(logits.device, torch.float32)
            loss = (F.cross_entropy(logits, y, reduction="none") * w).sum()
            keep, size = w > 0, int(sizes[0])
        except Exception as err:  # noqa: BLE001 — reported to every rank
            own = err
        assert self.guard is not None
        if self.guard.due(batch_idx):
            self.guard.agree(own, what)
        elif own is not None:
            raise own
        return logits[keep], y[keep], loss, size

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.guard is not None:
            logits, y, loss, size = self._rank_step(batch, batch_idx, "pre-training's step")
            self.train_acc(logits, y)
            # synced: the mean over ranks is the global batch's mean loss (Σ over ranks of rows' weighted CE / N)
            self.log("train_loss", loss, on_step=True, on_epoch=True, batch_size=size, sync_dist=True)
            self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
            return loss
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.train_acc(logits, y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, batch_size=len(y))
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        if self.guard is not None:
            logits, y, loss, size = self._rank_step(batch, batch_idx, "pre-training's validation")
            self.val_acc(logits, y)
            self.log("val_loss", loss, on_epoch=True, batch_size=size, sync_dist=True)
            self.log(_MONITOR, self.val_acc, on_epoch=True)
            return
        x, y = batch
        logits = self(x)
        self.val_acc(logits, y)
        self.log("val_loss", F.cross_entropy(logits, y), on_epoch=True, batch_size=len(y))
        self.log(_MONITOR, self.val_acc, on_epoch=True)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.AdamW(
            [p for p in self.parameters() if p.requires_grad],
            lr=self.hparams["lr"],
            weight_decay=self.hparams["weight_decay"],
        )
        # Cosine decay over the whole run, stepped per batch (the paper's pre-training schedule).
        total_steps = max(1, int(self.trainer.estimated_stepping_batches))
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def split_holdout(dataset: Dataset, fraction: float, seed: int) -> tuple[Subset, Subset]:
    """Seeded random split into (train, held-out) with ``round(fraction * len)`` held-out items.

    Raises:
        ValueError: ``fraction`` not in (0, 1), or it leaves one side empty.
    """
    n = len(dataset)  # type: ignore[arg-type]
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout_fraction={fraction!r} is not allowed; expected a float in (0, 1)")
    n_holdout = int(round(fraction * n))
    if not 0 < n_holdout < n:
        raise ValueError(
            f"holdout_fraction={fraction!r} is not allowed; expected a fraction that leaves both parts non-empty for {n} images"
        )
    order = np.random.default_rng(seed).permutation(n)
    return Subset(dataset, order[n_holdout:].tolist()), Subset(dataset, order[:n_holdout].tolist())


def _rng_states() -> dict[str, Any]:
    """The global random states, in types ``torch.load(weights_only=True)`` reads (every checkpoint of the
    Trainer carries them, the best one that :func:`load_pretrained_vit` reads too)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "numpy": [str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "python": random.getstate(),
    }


def _set_rng_states(states: Mapping[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"]:
        torch.cuda.set_rng_state_all(states["cuda"])
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


class _EpochState(Checkpoint):
    """Writes the Trainer's whole state to ``path`` at the end of every epoch, atomically, with the random states.

    A :class:`Checkpoint`, so the Trainer calls it after the other callbacks: at ``on_train_epoch_end`` early
    stopping and the best-checkpoint callback have recorded this epoch already, and what is saved is the state
    the next epoch starts from. The random states and the data order's ``generator`` go into this callback's own
    state and are put back when a resumed fit restores it (after the model was rebuilt, which draws).

    The write runs in the background (``background_write.py``): the checkpoint is taken at the epoch's end, its
    tensors copied to host memory (pinned, from a GPU), and one thread serializes, fsyncs and renames it while the
    next epoch trains. At most one write is in flight: the next epoch's end, and the fit's end (:meth:`on_train_end`,
    early stopping's included), wait for it first and raise its error there (over ranks, rank 0 passes it to the
    guard, which ends every rank); an interrupted fit waits for it in :meth:`close`. So the file on disk is always
    one epoch's whole state, and the weights do not depend on when it is written.
    """

    def __init__(
        self, path: Path, generator: torch.Generator, guard: RankGuard | None = None, io: GuardedIO | None = None
    ) -> None:
        self.path, self.generator, self.guard, self.io = path, generator, guard, io
        self.writer = BackgroundWriter("epoch-state")

    def on_train_epoch_end(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule) -> None:
        own = self._written()  # the previous epoch's write, and over ranks this epoch's best checkpoint
        if own is None or self.guard is not None:
            # the state Trainer.save_checkpoint writes (its first half, lightning 2.6: the second is the write and a
            # barrier, which the guard's all-reduce replaces), taken on every rank as it does; rank 0 writes it
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            if own is None and trainer.is_global_zero:
                self.writer.submit(write_checkpoint, host_copy(checkpoint), self.path)
        self._agree(own)

    def on_train_end(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule) -> None:
        self._agree(self._written())  # the last epoch's write is on disk before the fit returns

    def close(self) -> BaseException | None:
        """Wait for the write in flight and end the writer's thread (every fit's end, an interrupted one's too);
        the write's error, or None."""
        return self.writer.close()

    def _written(self) -> BaseException | None:
        """The error of the write in flight (waited for), else over ranks a checkpoint write's kept by ``io``."""
        own = self.writer.wait()
        if self.io is not None:
            own = own or self.io.pop_error()
        return own

    def _agree(self, own: BaseException | None) -> None:
        """One process: raise ``own``. Over ranks: every rank learns whether rank 0's writes failed, and stops."""
        if self.guard is None:
            if own is not None:
                raise own
            return
        self.guard.agree(own, "pre-training's epoch state")  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:
        return {"rng": _rng_states(), "data_order": self.generator.get_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # at once: the Trainer restores callbacks before it builds the epoch's data iterator (whose creation
        # draws a base seed from ``generator``), and nothing draws between here and the first batch
        _set_rng_states(state_dict["rng"])
        self.generator.set_state(state_dict["data_order"])


def _row_epoch(row: Mapping[str, str]) -> float:
    try:
        return float(row.get("epoch") or "nan")
    except ValueError:
        return float("nan")


class _ContinuedMetrics(ExperimentWriter):
    """Lightning's CSV writer, continuing the ``metrics.csv`` it finds: the rows of the first ``epochs_done`` epochs
    stay (rewritten whole, then renamed), the later ones go, and new rows are appended under the same header.

    Lightning's own writer deletes the file instead, in ``_check_log_dir_exists`` (lightning 2.6), which this
    replaces; ``epochs_done=0`` (a fresh pre-training) likewise starts an empty log.
    """

    def __init__(self, log_dir: str, *, epochs_done: int) -> None:
        self.epochs_done = int(epochs_done)
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        if not path.is_file():
            return
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header = list(reader.fieldnames or [])
            rows = [row for row in reader if _row_epoch(row) < self.epochs_done]  # a row without an epoch goes
        if not rows:
            path.unlink()
            return
        with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=header)
            writer.writeheader()
            writer.writerows(rows)
        self.metrics_keys = header  # what save() appends lines up with the file's columns


class _PretrainLogger(CSVLogger):
    """The pre-training's CSV log, one per ``save_dir``: a fixed version (Lightning would give a resumed fit
    ``version_1``), continued after the ``epochs_done`` epochs a resumed pre-training had completed."""

    def __init__(self, save_dir: Path, *, epochs_done: int) -> None:
        super().__init__(save_dir=save_dir, name="pretrain", version=0)
        self._epochs_done = int(epochs_done)

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuedMetrics(self.log_dir, epochs_done=self._epochs_done)
        return self._experiment


def _epochs_done(state: Path) -> int:
    """The epochs an epoch state had completed (it is written at an epoch's end; its tensors are not read: mmap)."""
    return int(torch.load(state, map_location="cpu", weights_only=True, mmap=True)["epoch"]) + 1


class _Interruption(Callback):
    """Keeps the exception that ended ``fit``: Lightning turns a KeyboardInterrupt (Ctrl-C, or the CLI's SIGTERM,
    which subclasses it) into ``sys.exit(1)`` and leaves SIGINT ignored; the caller must see the interruption
    itself (exit 130 / 143, the run's checkpoint kept, ``--resume`` printed)."""

    exception: BaseException | None = None

    def on_exception(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule, exception: BaseException) -> None:
        self.exception = exception


def _fit(trainer: lightning.Trainer, module: lightning.LightningModule, interruption: _Interruption, **kwargs: Any) -> None:
    main = threading.current_thread() is threading.main_thread()
    sigint = signal.getsignal(signal.SIGINT) if main else None
    try:
        trainer.fit(module, **kwargs)
    except SystemExit:
        if not isinstance(interruption.exception, KeyboardInterrupt):
            raise
        if sigint is not None:
            signal.signal(signal.SIGINT, sigint)  # Lightning set SIG_IGN for its shutdown
        raise interruption.exception from None


class PretrainResult(NamedTuple):
    """What a pre-training run produced."""

    checkpoint: Path  # the best checkpoint (by held-out accuracy), for :func:`load_pretrained_vit`
    epochs: int  # epochs actually run (early stopping may end before max_epochs)


def pretrain_classifier(
    *,
    model_name: str,
    overrides: Mapping[str, Any] | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    num_classes: int,
    train_dataset: Dataset,
    val_dataset: Dataset,
    out_dir: str | os.PathLike[str],
    max_epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float = 0.05,
    accelerator: str = "auto",
    devices: int = 1,
    precision: str = "32-true",
    seed: int = 0,
    patience: int = 3,
    num_workers: int = 0,
    pin_memory: bool = False,
    callbacks: Sequence[Callback] = (),
    ranks: Ranks | None = None,
    batch_transform: Any = None,
    check_every: int = 1,
    batch_per_rank: bool = False,
    lr_scaling: str = "sqrt",
) -> PretrainResult:
    """Pre-train a timm ViT on synthetic images; return the best checkpoint and the epochs run.

    Writes ``out_dir/checkpoints/best-*.ckpt`` and the CSV log ``out_dir/pretrain/version_0/metrics.csv``.
    Training stops early when held-out accuracy has not improved for ``patience`` epochs.

    Resumable: each epoch ends with the training state in ``out_dir/epoch_state.ckpt`` (:data:`EPOCH_STATE`);
    when that file exists the call continues from it (call it with the same arguments and data), and it is
    deleted once training has finished; the CSV log is continued after the epochs it had completed.

    Args:
        model_name, overrides, checkpoint, num_classes, lr, weight_decay: see :class:`ViTClassifier`.
        train_dataset, val_dataset: ``(image, label)`` datasets; the held-out split is synthetic too
            (see :func:`split_holdout`), the clients' real data is never seen here.
        out_dir: folder for checkpoints and logs.
        max_epochs, batch_size: training length and batch size.
        accelerator, devices, precision: passed to ``lightning.Trainer``.
        seed: seeds model initialisation and data order.
        patience: early-stopping patience in epochs.
        num_workers, pin_memory: the DataLoaders' (``data.num_workers`` / ``data.pin_memory`` resolved for the
            rank's device, ``data/loader.py``). Workers are started at each epoch (not persistent): each epoch's
            workers draw their seeds from the data order's generator, which the epoch state restores, so a resumed
            run reads the same augmentations as an uninterrupted one; with several ranks each rank's workers
            are reseeded with its rank too (:func:`~fl_lightning.modules.pretraining_ranks.seed_rank_worker`).
            The augmentations of 0 workers and of N differ (other random streams), as do two worker counts.
        callbacks: more Lightning callbacks (called before the checkpointing ones).
        ranks: the ranks of a shared server phase, every one calling this together: with more than one, training
            is data-parallel over them on their own devices (``pretraining_ranks.py``; ``accelerator`` and
            ``devices`` are then the ranks'): global batch ``batch_size`` split over the ranks, gradients
            all-reduced, rank 0 writes the files, every rank ends with the same weights and the same result, and a
            failure on any rank ends every rank. None or one rank: one process's training.
        batch_transform: run on the device on a batch whose images arrive as uint8 (a store's float part,
            ``synthesis/store.py``: elementwise, so the values are those of running it in the loader).
        batch_per_rank, lr_scaling: over several ranks, ``batch_size`` rows per rank (global batch N·B) and the peak
            rate scaled by ``lr_scaling`` (:func:`per_rank_batch_and_lr`); false: ``batch_size`` is the global batch.
        check_every: over several ranks, the steps between two checks that every rank's step went well (each an
            all-reduce and a host sync; between them a failing rank is ended by the liveness watch:
            :class:`~fl_lightning.modules.pretraining_ranks.RankGuard`). The weights do not depend on it.

    Returns:
        path of the best checkpoint, to be read with :func:`load_pretrained_vit`.
    """
    _check_lengths(max_epochs=max_epochs, batch_size=batch_size, patience=patience)
    world = 1 if ranks is None else ranks.world
    batch_size, lr = per_rank_batch_and_lr(batch_size, lr, world=world, per_rank=batch_per_rank, rule=lr_scaling)
    out = Path(out_dir)
    lightning.seed_everything(seed, workers=True, verbose=False)
    module = ViTClassifier(
        model_name=model_name,
        num_classes=num_classes,
        overrides=overrides,
        checkpoint=checkpoint,
        lr=lr,
        weight_decay=weight_decay,
    )
    module.batch_transform = batch_transform
    generator = torch.Generator().manual_seed(seed)
    data = _Loading(train_dataset, val_dataset, batch_size, num_workers, pin_memory, generator)
    if ranks is not None and ranks.world > 1:
        setup = _over_ranks(module, ranks, data, seed=seed, callbacks=callbacks, check_every=check_every)
    else:
        setup = _one_process(data, accelerator=accelerator, devices=devices, callbacks=callbacks)
    return _fit_resumable(module, setup, out, generator, precision=precision, max_epochs=max_epochs, patience=patience)


def _fit_resumable(
    module: ViTClassifier, setup: _Setup, out: Path, generator: torch.Generator, *, precision: str, max_epochs: int, patience: int
) -> PretrainResult:
    """:func:`pretrain_classifier`'s fit: from the epoch state when there is one, with early stopping, the best
    checkpoint and the epoch state written each epoch (in the background: :class:`_EpochState`, whose last write
    every end of the fit waits for); the epoch state deleted once training has finished."""
    best = _best_checkpoint(out)
    state = out / EPOCH_STATE
    resuming = state.is_file()
    interruption = _Interruption()
    epoch_state = _EpochState(state, generator, setup.guard, setup.io)
    checkpointing = [EarlyStopping(monitor=_MONITOR, mode="max", patience=patience), best, epoch_state, interruption]
    trainer = _trainer(
        setup,
        out=out,
        precision=precision,
        max_epochs=max_epochs,
        callbacks=checkpointing,
        epochs_done=_epochs_done(state) if resuming else 0,
    )
    try:
        _fit_from(trainer, module, interruption, setup, state=state if resuming else None)
    except BaseException as err:
        late = epoch_state.close()  # the file on disk is an epoch's whole state, the one a resume starts from
        if late is not None and late is not err:
            err.add_note(f"and the epoch state's last write failed: {type(late).__name__}: {late}")
        raise
    late = epoch_state.close()  # nothing in flight: the fit's end waited for the last write
    if late is not None:
        raise late
    if not setup.parallel or trainer.is_global_zero:
        state.unlink(missing_ok=True)
    if not best.best_model_path:
        raise RuntimeError(f"pre-training wrote no checkpoint under {out / 'checkpoints'} (did validation run?)")
    # current_epoch counts the epochs completed (early stopping ends the loop after its epoch finished)
    return PretrainResult(Path(best.best_model_path), max(int(trainer.current_epoch), 1))


def per_rank_batch_and_lr(batch_size: int, lr: float, *, world: int, per_rank: bool, rule: str) -> tuple[int, float]:
    """The global batch and the peak learning rate of a pre-training over ``world`` ranks.

    ``per_rank`` false: ``batch_size`` is the global batch, split over the ranks (the one-rank training, ``lr`` as
    given). True: every rank loads ``batch_size`` rows, the global batch is N·B (N = ``world``: N times fewer steps an
    epoch) and the rate follows ``rule``: ``sqrt`` η·√N, the square-root rule for Adam-type optimizers (Malladi et al.,
    "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms", NeurIPS 2022; pre-training's AdamW), ``linear``
    η·N (Goyal et al., "Accurate, Large Minibatch SGD", 2017: SGD's rule, without its warm-up), ``none`` η.
    """
    if not per_rank or world == 1:
        return batch_size, lr
    factors = {"sqrt": math.sqrt(world), "linear": float(world), "none": 1.0}
    if rule not in factors:
        raise ValueError(f"lr_scaling={rule!r} is not allowed; expected one of {', '.join(factors)}")
    return batch_size * world, lr * factors[rule]


def _check_lengths(*, max_epochs: int, batch_size: int, patience: int) -> None:
    """:func:`pretrain_classifier`'s lengths, each an int >= 1 (checked before anything is built or seeded)."""
    for name, value in (("max_epochs", max_epochs), ("batch_size", batch_size), ("patience", patience)):
        if value < 1:
            raise ValueError(f"{name}={value!r} is not allowed; expected an int >= 1")


class _Setup(NamedTuple):
    """What one process's pre-training and the ranks' data-parallel one differ in: the loaders, where the Trainer
    runs, its callbacks (the caller's, then the ranks' reseeding) and, over ranks, the guard, the IO plugin and the
    Trainer's strategy arguments."""

    train_loader: DataLoader
    val_loader: DataLoader
    accelerator: str
    devices: int
    callbacks: Sequence[Callback]
    guard: RankGuard | None = None  # over ranks: every step and epoch state agreed on by every rank
    io: GuardedIO | None = None  # over ranks: rank 0's best-checkpoint writes, their errors kept for the guard
    strategy: Mapping[str, Any] | None = None  # over ranks: the Trainer's strategy, plugins and sampler switch

    @property
    def parallel(self) -> bool:
        """Data-parallel over several ranks."""
        return self.guard is not None


class _Loading(NamedTuple):
    """What both set-ups build their loaders from: the splits, the (per-rank) batch size, the loader workers, and
    the generator that orders the training batches."""

    train_dataset: Dataset
    val_dataset: Dataset
    batch_size: int
    num_workers: int
    pin_memory: bool
    generator: torch.Generator


def _one_process(data: _Loading, *, accelerator: str, devices: int, callbacks: Sequence[Callback]) -> _Setup:
    """One process's pre-training: shuffled training batches in ``generator``'s order, the held-out ones in order."""
    # collate: default_collate, or a stored batch's float part run on the whole batch (synthesis/store.py)
    workers = dict(num_workers=data.num_workers, pin_memory=data.pin_memory, collate_fn=collate)
    train_loader = DataLoader(data.train_dataset, batch_size=data.batch_size, shuffle=True, generator=data.generator, **workers)
    val_loader = DataLoader(data.val_dataset, batch_size=data.batch_size, shuffle=False, **workers)
    return _Setup(train_loader, val_loader, accelerator, devices, callbacks)


def _over_ranks(
    module: ViTClassifier, ranks: Ranks, data: _Loading, *, seed: int, callbacks: Sequence[Callback], check_every: int = 1
) -> _Setup:
    """The ranks' data-parallel pre-training (``pretraining_ranks.py``): ``module`` shares its steps over ``ranks``,
    each rank loads its shard of every global batch, on its own device, and reseeds per (seed, epoch, rank)."""
    device = torch.device(ranks.fabric.device)
    guard, io = RankGuard(ranks, device, every=check_every), GuardedIO()
    module.share_over_ranks(guard)
    split = dict(rank=ranks.rank, world=ranks.world)
    workers = dict(
        num_workers=data.num_workers,
        pin_memory=data.pin_memory,
        worker_init_fn=partial(seed_rank_worker, ranks.rank) if data.num_workers else None,
    )
    train_loader = DataLoader(
        RankItems(data.train_dataset),
        batch_sampler=RankBatches(len(data.train_dataset), data.batch_size, generator=data.generator, **split),  # type: ignore[arg-type]
        generator=data.generator,
        collate_fn=collate_rank_items,
        **workers,
    )
    val_loader = DataLoader(
        RankItems(data.val_dataset),
        batch_sampler=RankBatches(len(data.val_dataset), data.batch_size, generator=None, **split),  # type: ignore[arg-type]
        collate_fn=collate_rank_items,
        **workers,
    )
    strategy = dict(strategy=JoinedDDP(ranks, device), plugins=[io], use_distributed_sampler=False)
    return _Setup(train_loader, val_loader, device.type, 1, [*callbacks, RankSeeds(seed, ranks.rank)], guard, io, strategy)


def _best_checkpoint(out: Path) -> ModelCheckpoint:
    """The callback that keeps the best epoch's checkpoint (by held-out accuracy) in ``out/checkpoints``."""
    # the best epoch's weights only (load_pretrained_vit reads them): AdamW's two moments would treble a ViT-L's
    # 1.2 GB at every new best; the optimizer a resume needs is in the epoch state
    return ModelCheckpoint(
        dirpath=out / "checkpoints",
        filename="best-{epoch}",
        monitor=_MONITOR,
        mode="max",
        save_top_k=1,
        save_weights_only=True,
    )


def _trainer(
    setup: _Setup, *, out: Path, precision: str, max_epochs: int, callbacks: Sequence[Callback], epochs_done: int
) -> lightning.Trainer:
    """The pre-training's Trainer: ``setup``'s callbacks then ``callbacks`` (the checkpointing ones), the CSV log
    continued after ``epochs_done`` epochs; over ranks without Lightning's SIGTERM handler."""
    trainer = lightning.Trainer(
        accelerator=setup.accelerator,
        devices=setup.devices,
        precision=precision,
        max_epochs=max_epochs,
        callbacks=[*setup.callbacks, *callbacks],
        logger=_PretrainLogger(out, epochs_done=epochs_done),
        default_root_dir=out,
        enable_progress_bar=sys.stderr.isatty(),
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=max(1, min(50, len(setup.train_loader))),
        **(setup.strategy or {}),
    )
    if setup.parallel:
        # no Lightning SIGTERM handler on joined ranks: it broadcasts from inside the handler
        # (signal_connector._sigterm_notifier_fn), which can pair with another rank's pending all-reduce; a SIGTERM
        # reaches the handler the process had (the CLI's: a KeyboardInterrupt, kept as the fit's interruption)
        trainer._signal_connector.register_signal_handlers = lambda: None  # this Trainer only
    return trainer


def _fit_from(
    trainer: lightning.Trainer,
    module: lightning.LightningModule,
    interruption: _Interruption,
    setup: _Setup,
    *,
    state: Path | None,
) -> None:
    """:func:`_fit` on ``setup``'s loaders, continuing from the epoch state ``state`` (None: a fresh pre-training)."""
    with warnings.catch_warnings():
        if state is not None:  # the best checkpoint so far is in there, as it should be
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        _fit(
            trainer,
            module,
            interruption,
            train_dataloaders=setup.train_loader,
            val_dataloaders=setup.val_loader,
            ckpt_path=state,
            weights_only=True,
        )  # plain types only (_rng_states)


def load_pretrained_vit(ckpt_path: str | os.PathLike[str], *, map_location: str | torch.device = "cpu") -> nn.Module:
    """The timm ViT (backbone and trained head) from a :func:`pretrain_classifier` checkpoint.

    The checkpoint is read with ``torch.load(weights_only=True)``; the architecture is rebuilt from
    its hyper-parameters with random initialisation and then overwritten by the saved weights, so
    the original backbone file is not needed any more.

    Raises:
        MissingResourceError: no file at ``ckpt_path``.
    """
    path = Path(ckpt_path).expanduser()
    if not path.is_file():
        raise MissingResourceError(
            f"pre-trained ViT checkpoint not found at {path}; run the FeDiSyn pre-training step first "
            "or point the config at an existing .ckpt file"
        )
    payload = torch.load(path, map_location=map_location, weights_only=True)
    hparams = payload["hyper_parameters"]
    model = build_timm_vit(
        model_name=hparams["model_name"],
        num_classes=hparams["num_classes"],
        overrides=hparams["overrides"],
        checkpoint=None,
    )
    prefix = "model."
    state = {k[len(prefix) :]: v for k, v in payload["state_dict"].items() if k.startswith(prefix)}
    model.load_state_dict(state)
    return model
