"""Golden server-side optimizer steps made by Flower itself: ``tests/federation/fixtures/flower_server_optimizers.json``.

Run in a virtual environment that holds flwr (not beside this package)::

    python -m venv /tmp/venv-flwr && /tmp/venv-flwr/bin/pip install flwr==1.42.0
    /tmp/venv-flwr/bin/python scripts/make_flower_server_optimizer_fixtures.py [--check]

``--check`` writes nothing and exits 1 when the stored fixture is not what the installed flwr makes.

For every case it builds one of Flower's strategies (``FedAvg``, ``FedAvgM``, ``FedAdagrad``, ``FedAdam``,
``FedYogi``) with a fixed ``initial_parameters`` (two float32 arrays, shapes (3, 4) and (4,)) and calls its
``aggregate_fit(server_round, results, [])`` for rounds 1..4, each time with three clients' ``FitRes``
(status OK, ``num_examples`` 5, 10 and 30, no metrics; Flower never looks at the ClientProxy, so it is ``None``).
The clients' float32 arrays are drawn with a seeded ``numpy.random.default_rng`` around the global parameters
Flower returned the round before (a step toward a fixed target plus noise), so the pseudo-gradients look like
training. Each round records the clients' arrays and ``num_examples`` and Flower's resulting global parameters
(float32 or float64 values written exactly via ``float()``, with their dtypes), so the tests can replay every
round without Flower. ``notes`` spell out, from Flower's source, what each strategy computes.
The draws, the calls into Flower, the header, the JSON layout and ``--check`` are shared with
``make_flower_robust_aggregator_fixtures.py`` in ``scripts/flower_strategy_fixtures.py``.
Holds no logic of the package.
"""

from __future__ import annotations

import sys
from pathlib import Path

import flower_strategy_fixtures as fixtures
import numpy as np

OUT = fixtures.FIXTURES / "flower_server_optimizers.json"

SHAPES = [(3, 4), (4,)]
NUM_EXAMPLES = [5, 10, 30]
ROUNDS = 4
SEED = 20261204

# (Flower strategy, constructor kwargs besides initial_parameters); {} means Flower's defaults
CASES = [
    ("FedAvg", {}),
    ("FedAvg", {"inplace": False}),
    ("FedAvgM", {"server_momentum": 0.0, "server_learning_rate": 1.0}),  # Flower's defaults: plain FedAvg
    ("FedAvgM", {"server_momentum": 0.0, "server_learning_rate": 0.5}),
    ("FedAvgM", {"server_momentum": 0.9, "server_learning_rate": 1.0}),
    ("FedAvgM", {"server_momentum": 0.9, "server_learning_rate": 0.5}),
    ("FedAdagrad", {}),
    ("FedAdagrad", {"eta": 0.05, "tau": 0.01}),  # FedAdagrad takes no beta_1 / beta_2
    ("FedAdam", {}),
    ("FedAdam", {"eta": 0.03, "beta_1": 0.8, "beta_2": 0.95, "tau": 0.01}),
    ("FedYogi", {}),
    ("FedYogi", {"eta": 0.05, "beta_1": 0.5, "beta_2": 0.9, "tau": 0.02}),
]

NOTES = [
    "Read from flwr/server/strategy/{fedavg,aggregate,fedavgm,fedopt,fedadagrad,fedadam,fedyogi}.py of the "
    "recorded flwr_version. All operations are elementwise and per array (layer); t = server_round, starting at 1 "
    "as in Flower; w_0 = initial_parameters; w_t = the parameters aggregate_fit returns in round t.",
    "Weighted mean (every strategy): avg_t = sum_k n_k * x_k / N with n_k = FitRes.num_examples, N = sum_k n_k "
    "(weighted by num_examples, never uniform). FedAvg with inplace=True (its default, also used by FedAdagrad, "
    "FedAdam, FedYogi) computes it as sum over clients in order of x_k * (n_k / N), each product formed from a "
    "float64 factor and rounded to the client dtype (float32), the sum in float32; FedAvg(inplace=False) and FedAvgM "
    "compute (sum_k x_k * n_k) / N in float32. Same math, float32 rounding differs by about 1 ulp.",
    "FedAvg: w_t = avg_t. No server state; the previous global parameters play no part.",
    "FedAvgM (defaults server_learning_rate=1.0, server_momentum=0.0): if server_momentum == 0 and "
    "server_learning_rate == 1, w_t = avg_t exactly as FedAvg (no state, initial_parameters not needed). Otherwise "
    "(initial_parameters required, else AssertionError in aggregate_fit): pseudo-gradient g_t = w_{t-1} - avg_t "
    "(old minus new, a descent direction); if server_momentum > 0: m_1 = g_1, m_t = server_momentum * m_{t-1} + g_t "
    "for t > 1 (heavy ball, no (1 - momentum) dampening, no Nesterov) and d_t = m_t; else d_t = g_t (a negative "
    "momentum is silently treated as 0); w_t = w_{t-1} - server_learning_rate * d_t. Stays float32.",
    "FedOpt family (FedAdagrad, FedAdam, FedYogi; initial_parameters is a required keyword): pseudo-gradient "
    "delta_t = avg_t - w_{t-1} (new minus old, the opposite sign of FedAvgM's g_t); m_0 = v_0 = 0 (zeros shaped like "
    "delta, made in round 1); every round, in this order: avg_t, delta_t, m_t = beta_1 * m_{t-1} + (1 - beta_1) * "
    "delta_t, v_t (per strategy), w_t = w_{t-1} + step (per strategy), then w_t is kept as the next w_{t-1}. "
    "tau is added outside the square root: sqrt(v_t) + tau. eta_l (client learning rate) is stored but unused.",
    "FedAdagrad (defaults eta=0.1, tau=1e-9, eta_l=0.1): beta_1 = beta_2 = 0 fixed (not constructor arguments), "
    "so m_t = delta_t; v_t = v_{t-1} + delta_t^2; w_t = w_{t-1} + eta * m_t / (sqrt(v_t) + tau). Stays float32.",
    "FedAdam (defaults eta=0.1, beta_1=0.9, beta_2=0.99, tau=1e-9, eta_l=0.1): v_t = beta_2 * v_{t-1} + "
    "(1 - beta_2) * delta_t^2; bias correction is applied to the step size only, with exponent t + 1 (not t): "
    "eta_t = eta * sqrt(1 - beta_2^(t+1)) / (1 - beta_1^(t+1)); w_t = w_{t-1} + eta_t * m_t / (sqrt(v_t) + tau) "
    "(m_t, v_t and tau themselves are not bias-corrected).",
    "FedYogi (defaults eta=0.01, beta_1=0.9, beta_2=0.99, tau=1e-3, eta_l=0.0316): v_t = v_{t-1} - (1 - beta_2) * "
    "delta_t^2 * sign(v_{t-1} - delta_t^2) with sign(0) = 0 (so v_1 = (1 - beta_2) * delta_1^2); no bias correction: "
    "w_t = w_{t-1} + eta * m_t / (sqrt(v_t) + tau). Stays float32.",
    "dtypes: with numpy >= 2 (NEP 50 promotion) FedAdam's eta_t is a numpy float64 scalar, so FedAdam returns float64 "
    "parameters from round 1 on, and from round 2 its delta, m, v and w are float64 too (m, v of round 1 are float32); "
    "FedAvg, FedAvgM, FedAdagrad and FedYogi keep the clients' float32 (their hyper-parameters are Python floats). "
    "Each round's global_dtypes records what Flower returned. Clients here always send float32.",
]


def clients(rng: np.random.Generator, global_params: list[np.ndarray], goal: list[np.ndarray]) -> list[list]:
    """Each client's float32 arrays: from the global parameters, a quarter of the way to its own target, plus noise."""
    return [[fixtures.honest_step(rng, g, tgt).astype(np.float32) for g, tgt in zip(global_params, goal)] for _ in NUM_EXAMPLES]


def hyperparameters(strategy) -> dict:
    """The settings the strategy holds after construction (Flower's defaults filled in)."""
    held = fixtures.settings_held(
        strategy, ["server_learning_rate", "server_momentum", "eta", "eta_l", "beta_1", "beta_2", "tau"]
    )
    if type(strategy).__name__ != "FedAvgM":  # FedAvgM holds inplace but averages with aggregate() regardless
        held["inplace"] = strategy.inplace
    return held


def run_case(name: str, kwargs: dict) -> dict:
    init, goal = fixtures.initial(SEED, SHAPES), fixtures.target(SEED + 1, SHAPES)
    strategy = fixtures.make_strategy(name, kwargs, init)
    rng = np.random.default_rng(SEED + 2)  # the same noise stream in every case
    current = init
    rounds = []
    for t in range(1, ROUNDS + 1):
        sent = clients(rng, current, goal)
        current = fixtures.aggregate(strategy, t, sent, NUM_EXAMPLES)
        rounds.append({"server_round": t, **fixtures.replay(sent, NUM_EXAMPLES, current)})
    return {
        "strategy": name,
        "kwargs": kwargs,
        "hyperparameters": hyperparameters(strategy),
        "initial_parameters": fixtures.as_lists(init),
        "rounds": rounds,
    }


def main(argv: list[str]) -> int:
    flwr = fixtures.load_flwr()
    fixture = {
        **fixtures.header(Path(__file__).name, flwr.__version__),
        "notes": NOTES,
        "cases": [run_case(name, kwargs) for name, kwargs in CASES],
    }
    return fixtures.write_or_check(OUT, fixtures.dumps(fixture), argv, f"{len(CASES)} cases", f"flwr {flwr.__version__}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
