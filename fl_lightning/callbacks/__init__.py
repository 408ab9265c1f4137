"""Fabric callbacks (plain objects with hook methods, called through ``fabric.call``) and the
loggers a run gets from its config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fl_lightning.callbacks.progress import ProgressCallback
from fl_lightning.callbacks.proximal import ProximalCallback
from fl_lightning.callbacks.timing import RoundTimingCallback

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig

__all__ = ["ProximalCallback", "RoundTimingCallback", "ProgressCallback", "default_callbacks", "default_loggers"]


def default_loggers(cfg: RunConfig) -> list[object]:
    """W&B (online or offline: one W&B run per run, see :mod:`~fl_lightning.callbacks.wandb_logging`) and
    TensorBoard as the config asks; metrics.csv is always written."""
    loggers: list[object] = []
    if cfg.logging.wandb:
        from lightning.pytorch.loggers import WandbLogger

        from fl_lightning.callbacks.wandb_logging import wandb_init_args

        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        loggers.append(WandbLogger(**wandb_init_args(cfg)))
    if cfg.logging.tensorboard:
        from lightning.fabric.loggers import TensorBoardLogger

        loggers.append(TensorBoardLogger(root_dir=str(cfg.run_dir), name="tensorboard"))
    return loggers


def default_callbacks(cfg: RunConfig, loggers: list[object]) -> list[object]:
    callbacks: list[object] = [RoundTimingCallback(), ProgressCallback(enabled=cfg.logging.progress)]
    if cfg.logging.wandb:  # lightning.pytorch's loggers cost seconds to import: only when W&B is on
        from lightning.pytorch.loggers import WandbLogger

        from fl_lightning.callbacks.wandb_logging import WandbExtrasCallback

        callbacks += [WandbExtrasCallback(logger=lg) for lg in loggers if isinstance(lg, WandbLogger)]
    if cfg.logging.tensorboard:
        from lightning.fabric.loggers import TensorBoardLogger

        from fl_lightning.callbacks.tensorboard_logging import TensorBoardExtrasCallback

        callbacks += [TensorBoardExtrasCallback(logger=lg) for lg in loggers if isinstance(lg, TensorBoardLogger)]
    return callbacks
