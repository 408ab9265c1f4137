"""Rich progress bars over rounds and clients; silent when stdout is not a terminal."""

from __future__ import annotations

import sys
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["ProgressCallback"]


class ProgressCallback:
    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled and sys.stdout.isatty()
        self._progress: Progress | None = None
        self._rounds = self._clients = None

    def on_run_start(self, *, cfg: Any, env: Any, **_: Any) -> None:
        if not self.enabled or env.fabric.global_rank != 0:
            return
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), transient=False)
        self._progress.start()
        self._rounds = self._progress.add_task("rounds", total=None)

    def on_round_start(self, *, round_idx: int, clients: list[int], **_: Any) -> None:
        if self._progress is None:
            return
        if self._clients is not None:
            self._progress.remove_task(self._clients)
        self._clients = self._progress.add_task(f"round {round_idx} clients (rank 0)", total=None)

    def on_client_end(self, **_: Any) -> None:
        if self._progress is not None:
            self._progress.advance(self._clients)

    def on_round_end(self, *, metrics: dict[str, Any], **_: Any) -> None:
        if self._progress is not None:
            self._progress.advance(self._rounds)
            acc = metrics.get("accuracy")
            if acc is not None:
                self._progress.update(self._rounds, description=f"rounds (acc {acc:.4f})")

    def on_run_end(self, **_: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
