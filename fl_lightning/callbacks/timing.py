"""Round timing: per-client compute time and round time into the metrics and the server's history.

The loop measures each client's compute time with ``time.monotonic()`` around ``client_update`` (it
must travel to the server with the upload) and stores it in ``RoundHistory.client_compute_s``, which
``Algorithm.plan`` receives for the next round (FeDiSyn's scheduler uses it). This callback adds the
spread of those times to each round's metrics, where stragglers show.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fl_lightning.federation.storage.round_store import RoundResult

__all__ = ["RoundTimingCallback"]


class RoundTimingCallback:
    def on_round_end(self, *, metrics: dict[str, Any], results: RoundResult, **_: Any) -> None:
        times = list(results.compute_s.values())
        if not times:
            return
        metrics["client_compute_s_mean"] = statistics.fmean(times)
        metrics["client_compute_s_min"] = min(times)
        metrics["straggler_ratio"] = max(times) / max(min(times), 1e-12)  # slowest / fastest client
