"""What a W&B dashboard needs beyond scalars: the resolved config, the partition heatmap and a
per-client table each round. Scalars go through ``fabric.log_dict`` to every Lightning logger."""

from __future__ import annotations

from typing import Any

__all__ = ["WandbExtrasCallback"]


class WandbExtrasCallback:
    """Args:
        logger: a ``lightning.pytorch.loggers.WandbLogger`` also passed to ``Fabric(loggers=...)``.
    """

    def __init__(self, *, logger: Any) -> None:
        self.logger = logger

    def on_run_start(self, *, cfg: Any, env: Any, **_: Any) -> None:
        if env.fabric.global_rank != 0:
            return
        from fl_lightning.config import config_to_dict
        from fl_lightning.data.partition import client_class_counts
        from fl_lightning.data.report import partition_figure

        self.logger.log_hyperparams(config_to_dict(cfg))
        counts = client_class_counts(env.splits.train_targets, env.partition, env.num_classes)
        self.logger.log_image("partition", [partition_figure(counts, env.splits.classes)])

    def on_round_end(self, *, round_idx: int, results: Any, **_: Any) -> None:
        rows = [[round_idx, c, r.compute_s, r.bytes_down, r.bytes_up, r.failure is not None]
                for c, r in sorted(results.records.items())]
        self.logger.log_table("clients", columns=["round", "client", "compute_s", "bytes_down", "bytes_up", "failed"],
                              data=rows)
