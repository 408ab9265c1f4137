"""TensorBoard beyond the scalars: the run's config in the HParams tab and the partition heatmap as an image.

Scalars reach TensorBoard as they reach every Lightning logger (``fabric.log_dict``, one step per round). This
callback adds, at the start of the run (rank 0 only), what a TensorBoard user looks for next to them: the
resolved config (flattened to ``section/key`` names, as Lightning's ``TensorBoardLogger.log_hyperparams``
writes them) and ``partition`` (:func:`~fl_lightning.data.report.partition_image`, the pixels of
``partition.png``).
"""

from __future__ import annotations

import numpy as np

from fl_lightning.callbacks.logger_extras import LoggerExtras

__all__ = ["TensorBoardExtrasCallback"]


class TensorBoardExtrasCallback(LoggerExtras):
    """Args:
    logger: a ``lightning.fabric.loggers.TensorBoardLogger`` also passed to ``Fabric(loggers=...)``.
    """

    def log_partition(self, image: np.ndarray) -> None:
        self.logger.experiment.add_image("partition", image, global_step=0, dataformats="HWC")
