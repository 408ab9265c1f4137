"""The liveness watch the modules' two-rank tests run a failing phase under: a 3 s patience, the engine's own
verdict functions, the verdict into the rank's result (:func:`tests.gloo_ranks.verdict_to`)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from fl_lightning.federation.ranks import collectives
from fl_lightning.federation.ranks.liveness import watching
from tests.gloo_ranks import verdict_to


def watched(out: str | Path, rank: int, world: int, result: dict) -> AbstractContextManager[Any]:
    """``watching`` this rank of ``world`` as the engine does, its verdict reported into ``result`` under ``out``."""
    return watching(
        None,
        rank=rank,
        world=world,
        patience_s=3.0,
        token="t",
        exit_status=collectives.exit_status,
        one_line=collectives.one_line,
        decided=collectives.decided,
        on_lost=verdict_to(out, rank, result),
    )
