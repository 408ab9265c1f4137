"""TensorBoard beyond the scalars: the run's config in the HParams tab and the partition heatmap as an image.

Scalars reach TensorBoard as they reach every Lightning logger (``fabric.log_dict``, one step per round). This
callback adds, at the start of the run (rank 0 only), what a TensorBoard user looks for next to them: the
resolved config (flattened to ``section/key`` names, as Lightning's ``TensorBoardLogger.log_hyperparams``
writes them) and ``partition`` (:func:`~fl_lightning.data.report.partition_image`, the pixels of
``partition.png``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["TensorBoardExtrasCallback"]


class TensorBoardExtrasCallback:
    """Args:
    logger: a ``lightning.fabric.loggers.TensorBoardLogger`` also passed to ``Fabric(loggers=...)``.
    """

    def __init__(self, *, logger: Any) -> None:
        self.logger = logger

    def on_run_start(self, *, cfg: Any, env: Any, **_: Any) -> None:
        if env.fabric.global_rank != 0:
            return
        from fl_lightning.config.loading import config_to_dict
        from fl_lightning.data.partition import client_class_counts
        from fl_lightning.data.report import partition_image

        self.logger.log_hyperparams(config_to_dict(cfg))
        counts = client_class_counts(env.splits.train_targets, env.partition, env.num_classes)
        image = partition_image(counts, env.splits.classes)
        self.logger.experiment.add_image("partition", image, global_step=0, dataformats="HWC")
