"""What the two Flower strategy fixture makers share: ``make_flower_server_optimizer_fixtures.py`` and
``make_flower_robust_aggregator_fixtures.py`` import it (run as ``python scripts/<name>.py``, ``scripts/`` is on
``sys.path``).

It holds the seeded draws of the initial parameters, the target and an honest client's step, the calls into Flower
(strategy construction, ``FitRes`` results, one ``aggregate_fit`` round), how arrays and a round are recorded, the
fixture's header (``made_by``, ``flwr_version``, ``versions``, ``how``), the JSON layout and the ``--check`` / write
step (which ``make_flower_fixtures.py``, Flower's partitions, uses too). Each maker keeps its own cases, notes,
client plans and case-running loop. flwr is imported only inside the
functions that call it, so the module loads without it. Holds no logic of the package.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from flwr.common import FitRes
    from flwr.server.strategy import Strategy

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "federation" / "fixtures"

HOW = (
    "strategy = <strategy>(initial_parameters=ndarrays_to_parameters(initial_parameters), **kwargs); "
    "for each round: parameters, _ = strategy.aggregate_fit(server_round, [(None, FitRes(Status(OK), "
    "ndarrays_to_parameters(float32 client arrays), num_examples, {})) for each client in order], []); "
    "global_parameters = parameters_to_ndarrays(parameters)"
)


def load_flwr() -> ModuleType:
    """Import flwr and quiet its log below errors (each round says "No fit_metrics_aggregation_fn provided")."""
    import flwr

    logging.getLogger("flwr").setLevel(logging.ERROR)
    return flwr


def initial(seed: int, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """The fixed ``initial_parameters``: float32 arrays of N(0, 0.5^2) draws from ``default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 0.5, s).astype(np.float32) for s in shapes]


def target(seed: int, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """The fixed target the clients step toward: float64 arrays of N(0, 1) draws from ``default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 1.0, s) for s in shapes]


def honest_step(rng: np.random.Generator, global_array: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """One honest client's array, float64 and not yet rounded: from the global array (taken as float32) a quarter of
    the way to its own target (``goal`` plus N(0, 0.2^2)), plus N(0, 0.05^2) noise; two draws from ``rng``."""
    g = np.asarray(global_array, np.float32)
    own = goal + rng.normal(0.0, 0.2, g.shape)
    return g + 0.25 * (own - g) + rng.normal(0.0, 0.05, g.shape)


def as_lists(arrays: list[np.ndarray]) -> list:
    """Nested lists of Python floats: float() of each value, a float32 widened to float64 without change."""
    return [np.asarray(a).astype(np.float64).tolist() for a in arrays]


def settings_held(strategy: Strategy, names: list[str]) -> dict[str, Any]:
    """The strategy's attributes among ``names`` after construction (Flower's defaults filled in), in that order."""
    return {n: getattr(strategy, n) for n in names if hasattr(strategy, n)}


def make_strategy(name: str, kwargs: dict, init: list[np.ndarray]) -> Strategy:
    """Flower's strategy ``name`` built with ``initial_parameters=init`` and ``kwargs``."""
    from flwr.common import ndarrays_to_parameters
    from flwr.server import strategy as strategies

    return getattr(strategies, name)(initial_parameters=ndarrays_to_parameters(init), **kwargs)


def fit_results(sent: list[list[np.ndarray]], num_examples: list[int]) -> list[tuple[None, FitRes]]:
    """The clients' results as ``aggregate_fit`` takes them: status OK, no metrics, no ClientProxy (Flower never
    looks at it)."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    return [
        (None, FitRes(status=Status(code=Code.OK, message=""), parameters=ndarrays_to_parameters(a), num_examples=n, metrics={}))
        for a, n in zip(sent, num_examples)
    ]


def aggregate(strategy: Strategy, server_round: int, sent: list[list[np.ndarray]], num_examples: list[int]) -> list[np.ndarray]:
    """The global parameters Flower's ``aggregate_fit`` returns for one round of these clients."""
    from flwr.common import parameters_to_ndarrays

    parameters, _ = strategy.aggregate_fit(server_round, fit_results(sent, num_examples), [])
    return parameters_to_ndarrays(parameters)


def replay(sent: list[list[np.ndarray]], num_examples: list[int], current: list[np.ndarray]) -> dict[str, list]:
    """What a round records so the tests can replay it: the clients' arrays and num_examples, Flower's result and
    its dtypes."""
    return {
        "clients": [{"num_examples": n, "parameters": as_lists(a)} for a, n in zip(sent, num_examples)],
        "global_parameters": as_lists(current),
        "global_dtypes": [str(a.dtype) for a in current],
    }


def header(script: str, flwr_version: str) -> dict[str, Any]:
    """The fixture's leading keys: which script made it, the versions it ran under, and how Flower was called."""
    return {
        "made_by": f"python scripts/{script} (in a venv with flwr)",
        "flwr_version": flwr_version,
        "versions": {"flwr": flwr_version, "numpy": np.__version__, "python": sys.version.split()[0]},
        "how": HOW,
    }


def dumps(fixture: dict) -> str:
    """Indented JSON with every innermost list of numbers on one line."""
    text = json.dumps(fixture, indent=1)
    return re.sub(r"\[[-+0-9.eE,\s]*\]", lambda m: re.sub(r"\s+", "", m.group(0)).replace(",", ", "), text) + "\n"


def write_or_check(out: Path, text: str, argv: list[str], what: str, maker: str) -> int:
    """With ``--check`` in ``argv``: write nothing, say whether ``out`` holds ``text``, 0 if so, else 1. Otherwise
    write ``text`` to ``out`` and say so, with ``what`` (e.g. "12 cases"). ``maker`` names who made it ("flwr 1.42.0")."""
    if "--check" in argv:
        same = out.exists() and out.read_text() == text
        print(f"{out}: {'is' if same else 'is NOT'} what {maker} makes")
        return 0 if same else 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out} ({out.stat().st_size} bytes, {what})")
    return 0
