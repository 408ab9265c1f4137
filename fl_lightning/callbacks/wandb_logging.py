"""W&B as its users expect: one W&B run per run, grouped by comparison and tagged, and what a dashboard
needs beyond scalars.

* One W&B run per run: each run's logger starts its own W&B run and :class:`WandbExtrasCallback` finishes it
  when the run ends (``wandb.finish``), so the next run of a comparison does not write into it.
* ``group`` = the comparison (its ``output_dir``'s name), ``job_type`` = the method; tags: the method, the
  row's label, α and seed. ``--resume`` continues the same W&B run: its id is the run's ``run_id`` in
  ``run.json``, drawn at a fresh start and kept on resume (new after ``--overwrite``).
* ``logging.mode`` is the default; an explicit ``WANDB_MODE`` in the environment wins (W&B's own rule).
* A comparison's table (``wandb.Table``) and ``comparison.png`` go to one W&B run of its own
  (``job_type: comparison``, in the comparison's group), the same one each time the table is rebuilt.
* At the start: the resolved config and the partition heatmap; each round: a per-client table (scalars
  go through ``fabric.log_dict`` to every Lightning logger); at the end: final accuracy, loss, bytes and
  times in the run summary, and the per-class accuracy as a table.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from fl_lightning.callbacks.logger_extras import LoggerExtras

__all__ = ["WandbExtrasCallback", "wandb_init_args", "wandb_run_id", "wandb_mode", "comparison_group", "log_comparison"]

_SUMMARY_KEYS = (
    "accuracy",
    "loss",
    "bytes_up",
    "bytes_down",
    "bytes_up_per_client",
    "wall_time_s",
    "simulated_time_s",
    "rounds",
    "failed_clients",
)


def wandb_mode(cfg: Any) -> str | None:
    """The mode to pass to ``wandb.init``: None (W&B reads it) when ``WANDB_MODE`` is set, else ``logging.mode``."""
    return None if os.environ.get("WANDB_MODE") else cfg.logging.mode


def comparison_group(cfg: Any) -> str | None:
    """The W&B group of a comparison's run (one with a row ``label``): its ``output_dir``'s name."""
    return Path(cfg.output_dir).resolve().name if cfg.label is not None else None


def wandb_run_id(run_dir: Path) -> str | None:
    """The run's id in its ``run.json`` (``run_id``: the same across ``--resume``, new after ``--overwrite``),
    or None (W&B draws one) for a folder without a record."""
    from fl_lightning.federation.storage.run_folder import read_record

    record = read_record(Path(run_dir))
    return (record or {}).get("run_id")


def wandb_init_args(cfg: Any) -> dict[str, Any]:
    """Keyword arguments of ``WandbLogger`` (and so of ``wandb.init``) for the run ``cfg``."""
    alpha = "inf" if math.isinf(cfg.partition.alpha) else f"{cfg.partition.alpha:g}"
    tags = [cfg.algorithm, f"alpha={alpha}", f"seed={cfg.seed}"] + ([f"label={cfg.label}"] if cfg.label else [])
    args: dict[str, Any] = dict(
        project=cfg.logging.project,
        entity=cfg.logging.entity,
        name=cfg.resolved_run_name,
        save_dir=str(cfg.run_dir),
        job_type=cfg.algorithm,
        tags=[t[:64] for t in tags],
        group=comparison_group(cfg),
    )
    run_id = wandb_run_id(cfg.run_dir)
    if run_id is not None:
        args["id"] = run_id
    mode = wandb_mode(cfg)
    if mode is not None:  # never WandbLogger(offline=True): it would set WANDB_MODE for the whole process
        args["mode"] = mode
    return args


class WandbExtrasCallback(LoggerExtras):
    """Args:
    logger: a ``lightning.pytorch.loggers.WandbLogger`` also passed to ``Fabric(loggers=...)``.
    """

    def start(self, env: Any) -> None:
        self.classes = list(env.splits.classes)  # the per-class accuracy's rows at the end

    def log_partition(self, image: np.ndarray) -> None:
        # pixels, not a Figure: wandb.Image(figure) needs matplotlib.pyplot imported (see data/report.py)
        self.logger.log_image("partition", [image])

    def on_round_end(self, *, round_idx: int, results: Any, **_: Any) -> None:
        rows = [
            [round_idx, c, r.compute_s, r.bytes_down, r.bytes_up, r.failure is not None]
            for c, r in sorted(results.records.items())
        ]
        self.logger.log_table("clients", columns=["round", "client", "compute_s", "bytes_down", "bytes_up", "failed"], data=rows)

    def on_run_end(self, *, summary: dict[str, Any], **_: Any) -> None:
        """The final numbers in the W&B run's summary, the per-class accuracy, then ``wandb.finish()``."""
        if getattr(self.logger, "_experiment", None) is None:  # not rank 0, or nothing was logged
            return
        run = self.logger.experiment
        run.summary.update({k: summary[k] for k in _SUMMARY_KEYS if summary.get(k) is not None})
        per_class = summary.get("per_class_accuracy")
        if isinstance(per_class, (list, tuple)) and per_class:
            classes = getattr(self, "classes", None) or [str(i) for i in range(len(per_class))]
            self.logger.log_table(
                "per_class_accuracy",
                columns=["class", "accuracy"],
                data=[[str(c), None if a is None or a != a else float(a)] for c, a in zip(classes, per_class)],
            )
        run.finish()


def log_comparison(cfg: Any, rows: list[dict[str, Any]], image: Path, out_dir: Path) -> None:
    """The comparison's table and plot into its own W&B run (one per comparison: its id comes from the folder)."""
    import wandb

    group = Path(out_dir).resolve().name
    run_id = hashlib.sha256(f"comparison|{Path(out_dir).resolve()}".encode()).hexdigest()[:16]
    kwargs: dict[str, Any] = dict(
        project=cfg.logging.project,
        entity=cfg.logging.entity,
        group=group,
        job_type="comparison",
        name=f"{group}: comparison",
        id=run_id,
        resume="allow",
        dir=str(out_dir),
    )
    mode = wandb_mode(cfg)
    if mode is not None:
        kwargs["mode"] = mode
    run = wandb.init(**kwargs)
    columns = list(rows[0])
    run.log(
        {
            "comparison": wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows]),
            "comparison_plot": wandb.Image(str(image)),
        }
    )
    run.finish()
