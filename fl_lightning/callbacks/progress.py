"""Progress a user can plan by: rounds done of how many, the clients of the round, and an ETA.

On a terminal: rich bars (rounds with their total and time remaining; the round's clients on rank 0).
Anywhere else (SLURM, nohup, CI: stdout is not a terminal): one plain line per finished round
(``run: round r/R, accuracy, round time, ETA``) and one per finished run, flushed at once, so that a log
file shows where a long run is. ``logging.progress: false`` silences both. The runs of a comparison
get their own line in ``fl_lightning/train.py`` (run k/N and the comparison's ETA).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["ProgressCallback", "eta_s", "format_duration"]


def eta_s(elapsed_s: float, done: int, total: int) -> float | None:
    """Seconds left when ``done`` of ``total`` equal steps took ``elapsed_s``: the mean step time × the steps
    left; None before the first step (nothing to go by)."""
    if done <= 0:
        return None
    return max(total - done, 0) * elapsed_s / done


def format_duration(seconds: float | None) -> str:
    """``"?"``, ``"42 s"``, ``"3 min 05 s"``, ``"2 h 07 min"``."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class ProgressCallback:
    """Args:
    enabled: ``logging.progress``.
    stream: where the plain lines go (default stdout); bars are drawn only when it is a terminal.
    """

    def __init__(self, *, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout
        self._active = False
        self._progress: Any = None
        self._rounds = self._clients = None

    def on_run_start(self, *, cfg: Any, env: Any, rounds: int | None = None, completed_rounds: int = 0, **_: Any) -> None:
        self._active = self.enabled and env.fabric.global_rank == 0
        if not self._active:
            return
        self.name, self.total, self.first = cfg.resolved_run_name, rounds, completed_rounds
        self.start = time.monotonic()
        self.round_start = self.start
        if not self.stream.isatty():
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            transient=False,
        )
        self._progress.start()
        self._rounds = self._progress.add_task(f"{self.name} rounds", total=rounds, completed=completed_rounds)

    def on_round_start(self, *, round_idx: int, clients: list[int], local_clients: int | None = None, **_: Any) -> None:
        if not self._active:
            return
        self.round_start = time.monotonic()
        if self._progress is not None:
            if self._clients is not None:
                self._progress.remove_task(self._clients)
            self._clients = self._progress.add_task(f"round {round_idx + 1} clients (rank 0)", total=local_clients)

    def on_client_end(self, **_: Any) -> None:
        if self._progress is not None and self._clients is not None:
            self._progress.advance(self._clients)

    def on_round_end(self, *, round_idx: int, metrics: dict[str, Any], **_: Any) -> None:
        if not self._active:
            return
        now = time.monotonic()
        acc = metrics.get("accuracy")
        if self._progress is not None:
            self._progress.advance(self._rounds)
            if acc is not None:
                self._progress.update(self._rounds, description=f"{self.name} rounds (acc {acc:.4f})")
            return
        total = self.total if self.total is not None else round_idx + 1
        eta = eta_s(now - self.start, round_idx + 1 - self.first, total - self.first)
        accuracy = "-" if acc is None else f"{acc:.4f}"
        print(
            f"{self.name}: round {round_idx + 1}/{total}, accuracy {accuracy}, round {now - self.round_start:.1f} s, "
            f"ETA {format_duration(eta)}",
            file=self.stream,
            flush=True,
        )

    def on_run_end(self, *, summary: dict[str, Any] | None = None, **_: Any) -> None:
        if not self._active:
            return
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            return
        acc = (summary or {}).get("accuracy")
        print(
            f"{self.name}: finished, accuracy {'-' if acc is None else f'{acc:.4f}'}, {time.monotonic() - self.start:.1f} s",
            file=self.stream,
            flush=True,
        )
