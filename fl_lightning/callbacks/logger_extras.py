"""What the TensorBoard and W&B extras callbacks share: they hold the logger, and at the start of the run (rank 0
only) log the resolved config as hyper-parameters and the partition heatmap
(:func:`~fl_lightning.data.report.partition_image`, the pixels of ``partition.png``) in the logger's own way."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["LoggerExtras"]


class LoggerExtras:
    """Args:
    logger: the Lightning logger also passed to ``Fabric(loggers=...)``.
    """

    def __init__(self, *, logger: Any) -> None:
        self.logger = logger

    def on_run_start(self, *, cfg: Any, env: Any, **_: Any) -> None:
        if env.fabric.global_rank != 0:
            return
        from fl_lightning.config.loading import config_to_dict
        from fl_lightning.data.partition import client_class_counts
        from fl_lightning.data.report import partition_image

        self.start(env)
        self.logger.log_hyperparams(config_to_dict(cfg))
        counts = client_class_counts(env.splits.train_targets, env.partition, env.num_classes)
        self.log_partition(partition_image(counts, env.splits.classes))

    def start(self, env: Any) -> None:
        """What the subclass keeps of the run before anything is logged (nothing here)."""

    def log_partition(self, image: np.ndarray) -> None:
        """Log the partition heatmap, (H, W, 3) uint8 pixels."""
        raise NotImplementedError
