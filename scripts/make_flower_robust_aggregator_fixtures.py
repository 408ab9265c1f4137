"""Golden robust aggregations made by Flower itself: ``tests/federation/fixtures/flower_robust_aggregators.json``.

Run in a virtual environment that holds flwr (not beside this package)::

    python -m venv /tmp/venv-flwr && /tmp/venv-flwr/bin/pip install flwr==1.42.0
    /tmp/venv-flwr/bin/python scripts/make_flower_robust_aggregator_fixtures.py [--check]

``--check`` writes nothing and exits 1 when the stored fixture is not what the installed flwr makes.

For every case it builds one of Flower's robust strategies (``FedMedian``, ``FedTrimmedAvg``, ``Krum``, ``Bulyan``)
with a fixed ``initial_parameters`` (two float32 arrays, shapes (3, 4) and (4,); none of these strategies reads
them) and calls its ``aggregate_fit(server_round, results, [])`` for rounds 1 and 2, with 8 then 11 clients (11 and
11 for Bulyan with num_malicious_clients=2, which needs n >= 4f + 3), each a ``FitRes`` (status OK, ``num_examples``
between 5 and 50, no metrics; Flower never looks at the ClientProxy, so it is ``None``). Honest clients' float32
arrays are drawn with a seeded ``numpy.random.default_rng`` around the global parameters Flower returned the round
before (a step toward a fixed target plus noise); one client in round 1 and two in round 2 are outliers (an honest
draw times -5, or an honest draw plus N(0, 3^2) noise), so the robust rules matter. Each round records the clients'
arrays, ``num_examples`` and which ones are outliers, and Flower's resulting global parameters (float32 values
written exactly via ``float()``, with their dtypes), so the tests can replay every round without Flower.
``error_cases`` record the settings where Flower raises instead. ``notes`` spell out, from Flower's source, what
each strategy computes. The draws, the calls into Flower, the header, the JSON layout and ``--check`` are shared
with ``make_flower_server_optimizer_fixtures.py`` in ``scripts/flower_strategy_fixtures.py``.
Holds no logic of the package.
"""

from __future__ import annotations

import sys
from pathlib import Path

import flower_strategy_fixtures as fixtures
import numpy as np

OUT = fixtures.FIXTURES / "flower_robust_aggregators.json"

SHAPES = [(3, 4), (4,)]
SEED = 20261205

# Client plans: per round, the clients' num_examples in order, and the outliers {client index: kind}.
# "flip": an honest draw times -5; "noise": an honest draw plus N(0, 3^2) noise.
PLANS = {
    "8_then_11": [
        ([5, 12, 30, 8, 50, 21, 15, 41], {2: "flip"}),
        ([17, 5, 44, 9, 26, 33, 12, 50, 7, 38, 20], {0: "noise", 6: "flip"}),
    ],
    "11_then_11": [
        ([23, 5, 11, 47, 30, 8, 19, 50, 14, 36, 27], {4: "noise", 9: "flip"}),
        ([6, 40, 18, 29, 50, 12, 33, 5, 45, 21, 10], {1: "flip", 7: "noise"}),
    ],
}

# (Flower strategy, constructor kwargs besides initial_parameters, client plan); {} means Flower's defaults
CASES = [
    ("FedMedian", {}, "8_then_11"),
    ("FedTrimmedAvg", {}, "8_then_11"),  # Flower's default beta is 0.2
    ("FedTrimmedAvg", {"beta": 0.1}, "8_then_11"),
    ("FedTrimmedAvg", {"beta": 0.25}, "8_then_11"),
    ("Krum", {"num_malicious_clients": 1, "num_clients_to_keep": 0}, "8_then_11"),
    ("Krum", {"num_malicious_clients": 1, "num_clients_to_keep": 3}, "8_then_11"),
    ("Krum", {"num_malicious_clients": 2, "num_clients_to_keep": 0}, "8_then_11"),
    ("Krum", {"num_malicious_clients": 2, "num_clients_to_keep": 3}, "8_then_11"),
    ("Krum", {}, "8_then_11"),  # Flower's defaults: num_malicious_clients=0, num_clients_to_keep=0
    ("Bulyan", {"num_malicious_clients": 1, "to_keep": 0}, "8_then_11"),
    ("Bulyan", {"num_malicious_clients": 2, "to_keep": 0}, "11_then_11"),
]

# Settings where Flower raises in aggregate_fit (round 1 of the plan); the fixture records the exception.
ERROR_CASES = [
    ("Bulyan", {"num_malicious_clients": 1}, "8_then_11"),  # no to_keep: aggregate_krum needs it
    ("Bulyan", {"num_malicious_clients": 1, "to_keep": 1}, "8_then_11"),  # Multi-Krum average of one != the client
    ("Bulyan", {"num_malicious_clients": 1, "to_keep": 3}, "8_then_11"),  # an average is no client's parameters
    ("Bulyan", {"num_malicious_clients": 2, "to_keep": 0}, "8_then_11"),  # 8 < 4 * 2 + 3
]

NOTES = [
    "Read from flwr/server/strategy/{fedmedian,fedtrimmedavg,krum,bulyan,aggregate}.py of the recorded flwr_version. "
    "Every rule works on the clients' parameters themselves (the absolute weights each FitRes carries), not on "
    "updates (weights minus global): the previous global parameters and initial_parameters play no part, and no "
    "strategy keeps state between rounds. n = number of results, k = client index in the order of results (0-based), "
    "x_k = client k's arrays, n_k = its FitRes.num_examples, f = num_malicious_clients. Clients here send float32.",
    "FedMedian: per array (layer), coordinate-wise np.median(stack(x_0..x_{n-1}), axis=0): UNWEIGHTED (num_examples "
    "ignored). Odd n: the middle value of the sorted coordinates. Even n: the mean of the two middle values, computed "
    "by np.mean in the input dtype (float32: (a + b) / 2 rounded to float32). Returns float32 for float32 clients.",
    "FedTrimmedAvg (default beta=0.2; ValueError at construction unless 0 <= beta < 0.5): per array, coordinate-wise "
    "(scipy.stats.trim_mean logic) lowercut = int(beta * n) (float64 product, truncated, i.e. floor), the same number "
    "cut at each end: sort the n values of a coordinate, keep sorted positions lowercut .. n - lowercut - 1 "
    "(n - 2 * lowercut values), and take their UNWEIGHTED mean (np.mean in float32, num_examples ignored). Here: n = 8 "
    "cuts 1 (beta 0.2), 0 (beta 0.1: a plain unweighted mean), 2 (beta 0.25); n = 11 cuts 2, 1, 2. float32 out.",
    "Krum distances: each client's arrays are flattened and concatenated in layer order into one float32 vector v_k; "
    "d[i, j] = ||v_i - v_j||^2, computed as np.linalg.norm(v_i - v_j) in float32 then squared in float32, stored in "
    "a float64 matrix (so distances carry float32 rounding; d[i, i] = 0).",
    "Krum score: m = max(1, n - f - 2) (exactly n - f - 2 as in Blanchard et al., floored at 1); for each i, "
    "np.argsort(d[i]) (ascending, default quicksort, not stable) and the entries at sorted positions 1 .. m are "
    "summed: score_i = sum of the m smallest squared distances from i to the OTHER clients (position 0 is i itself, "
    "distance 0; with an exact duplicate of i the sum is the same). Scores are float64 sums of those entries.",
    "Krum (num_clients_to_keep == 0, Flower's default; default f = 0): returns x_{argmin_i score_i}, the first index "
    "on ties (np.argmin), the client's own arrays unchanged (its dtype, float32 here); num_examples ignored.",
    "Multi-Krum (num_clients_to_keep = q > 0): best = np.argsort(scores)[::-1][n - q:], i.e. the q clients with the "
    "smallest scores (listed from the largest kept score to the smallest), averaged WEIGHTED BY num_examples with "
    "Flower's aggregate(): per array (sum over best, in that order, of x_k * n_k) / (sum over best of n_k), float32 "
    "products, float32 sum, float32 division by the Python int total. (A q > n makes the start index n - q negative, "
    "so only the q - n smallest-score clients are kept, all n once q >= 2n; unused here.)",
    "Bulyan (defaults f = 0, first_aggregation_rule = aggregate_krum, **aggregation_rule_kwargs forwarded to it): "
    "ValueError if n < 4 * f + 3. theta = n - 2 * f, beta = theta - 2 * f. Selection: repeat theta times on the "
    "remaining list R (initially all clients in order): run Krum on R with the same f and the given to_keep "
    "(so m = max(1, |R| - f - 2) shrinks as R shrinks; distances and scores recomputed on R only), find the FIRST "
    "client in R whose arrays are bit-for-bit equal (np.array_equal per array) to Krum's result, append it to the "
    "selected set S and remove it from R. Only to_keep = 0 (plain Krum) works: Bulyan has no to_keep default, so "
    "Bulyan(num_malicious_clients=f) alone raises TypeError (aggregate_krum() missing 'to_keep'), and any to_keep > 0 "
    "makes Krum return a num_examples-weighted average that is (almost always, even for to_keep = 1 since "
    "x * n_k / n_k is not exact in float32) no client's arrays, so ValueError 'The reference weights not found'. "
    "See error_cases.",
    "Bulyan aggregation of S (|S| = theta, in selection order; num_examples ignored throughout, UNWEIGHTED): the "
    "reference is med = coordinate-wise np.median of S (as FedMedian: even theta averages the two middle values in "
    "float32) -- the median of the selected set S, not of all clients; then per array and per coordinate, "
    "dist_k = |med - x_k| (float32), the beta values of S with the smallest dist (np.argpartition(dist, beta - 1, "
    "axis=0)[:beta], order unspecified; ties at the boundary broken arbitrarily, none in these fixtures) are "
    "averaged with np.mean (float32). So: output = coordinate-wise mean of the beta values closest to the median of "
    "the theta Krum-selected models. Here f = 1: n = 8 gives theta 6, beta 4; n = 11 gives theta 9, beta 7; f = 2 "
    "with n = 11 gives theta 7, beta 3. float32 out.",
    "dtypes: every output here is float32 (the clients' dtype): median, trimmed mean and Bulyan's mean stay in the "
    "input dtype, Krum returns a client's arrays, Multi-Krum multiplies and divides float32 arrays by Python ints "
    "(weak scalars under NEP 50). Each round's global_dtypes records what Flower returned. Only float32 rounding order "
    "differs from a float64 re-implementation (about 1 ulp).",
]


def clients(
    rng: np.random.Generator,
    global_params: list[np.ndarray],
    goal: list[np.ndarray],
    num_examples: list[int],
    outliers: dict[int, str],
) -> list[list]:
    """Each client's float32 arrays: a quarter of the way from the global parameters to its own target, plus noise;
    outliers are that draw times -5 ("flip") or plus N(0, 3^2) noise ("noise")."""
    out = []
    for k in range(len(num_examples)):
        arrays = []
        for g, tgt in zip(global_params, goal):
            honest = fixtures.honest_step(rng, g, tgt)
            kind = outliers.get(k)
            if kind == "flip":
                honest = -5.0 * honest
            elif kind == "noise":
                honest = honest + rng.normal(0.0, 3.0, honest.shape)
            arrays.append(honest.astype(np.float32))
        out.append(arrays)
    return out


def hyperparameters(strategy) -> dict:
    """The settings the strategy holds after construction (Flower's defaults filled in)."""
    held = fixtures.settings_held(strategy, ["beta", "num_malicious_clients", "num_clients_to_keep", "aggregation_rule_kwargs"])
    if hasattr(strategy, "first_aggregation_rule"):
        held["first_aggregation_rule"] = strategy.first_aggregation_rule.__name__
    return held


def run_case(name: str, kwargs: dict, plan: str) -> dict:
    init, goal = fixtures.initial(SEED, SHAPES), fixtures.target(SEED + 1, SHAPES)
    strategy = fixtures.make_strategy(name, kwargs, init)
    rng = np.random.default_rng(SEED + 2)  # the same noise stream in every case of a plan
    current = init
    rounds = []
    for t, (num_examples, outliers) in enumerate(PLANS[plan], start=1):
        sent = clients(rng, current, goal, num_examples, outliers)
        current = fixtures.aggregate(strategy, t, sent, num_examples)
        rounds.append(
            {
                "server_round": t,
                "num_clients": len(num_examples),
                "outliers": {str(k): v for k, v in sorted(outliers.items())},
                **fixtures.replay(sent, num_examples, current),
            }
        )
    return {
        "strategy": name,
        "kwargs": kwargs,
        "hyperparameters": hyperparameters(strategy),
        "plan": plan,
        "initial_parameters": fixtures.as_lists(init),
        "rounds": rounds,
    }


def run_error_case(name: str, kwargs: dict, plan: str) -> dict:
    init, goal = fixtures.initial(SEED, SHAPES), fixtures.target(SEED + 1, SHAPES)
    strategy = fixtures.make_strategy(name, kwargs, init)
    num_examples, outliers = PLANS[plan][0]
    sent = clients(np.random.default_rng(SEED + 2), init, goal, num_examples, outliers)
    try:
        strategy.aggregate_fit(1, fixtures.fit_results(sent, num_examples), [])
    except Exception as error:  # noqa: BLE001 - recording whatever Flower raises is the point
        return {
            "strategy": name,
            "kwargs": kwargs,
            "plan": plan,
            "num_clients": len(num_examples),
            "raises": type(error).__name__,
            "message": str(error),
        }
    raise AssertionError(f"{name}({kwargs}) did not raise")


def main(argv: list[str]) -> int:
    flwr = fixtures.load_flwr()
    fixture = {
        **fixtures.header(Path(__file__).name, flwr.__version__),
        "notes": NOTES,
        "cases": [run_case(*case) for case in CASES],
        "error_cases": [run_error_case(*case) for case in ERROR_CASES],
    }
    return fixtures.write_or_check(
        OUT, fixtures.dumps(fixture), argv, f"{len(CASES)} cases, {len(ERROR_CASES)} error cases", f"flwr {flwr.__version__}"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
