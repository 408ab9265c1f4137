"""What the client-drift tests share: heterogeneous least-squares clients with a known optimum, a kill at a
round's end (after the clients' kept state was written, before that round's server.pt), and a method's tiny run
(its config, and the run on one and on two processes)."""

from __future__ import annotations

import torch

from tests import tiny_runs
from tests.tiny_runs import tiny_config


def least_squares(n=5, d=4, m=12, seed=0):
    """Clients i with f_i(w) = ½‖A_i w − b_i‖²/m, each its own A_i and b_i (heterogeneous optima)."""
    g = torch.Generator().manual_seed(seed)
    problems = [
        (torch.randn(m, d, generator=g, dtype=torch.float64) * (1 + i), torch.randn(m, generator=g, dtype=torch.float64) + 3 * i)
        for i in range(n)
    ]
    a = sum(A.T @ A for A, _ in problems) / m
    b = sum(A.T @ y for A, y in problems) / m
    return problems, torch.linalg.solve(a, b)  # the minimiser of Σ f_i


class StopAtRoundEnd:
    """A kill after round ``n``'s aggregate wrote the clients' state, before its server.pt."""

    def __init__(self, n: int) -> None:
        self.n = n

    def on_round_end(self, *, round_idx: int, **_: object) -> None:
        if round_idx == self.n:
            raise KeyboardInterrupt


def drift_config(tmp_path, algorithm: str, *extra: str, rounds: int = 3):
    """``algorithm`` on the tiny FedAvg digits head: ``rounds`` rounds over 4 clients, plain SGD (no momentum) at
    lr 0.5, then ``extra``."""
    return tiny_config(tmp_path, "--algorithm", algorithm, "--train.momentum", "0", "--train.lr", "0.5", *extra, rounds=rounds)


def one_and_two_processes(tmp_path, algorithm: str, *extra: str) -> tuple[dict, dict]:
    """The final server state of ``algorithm``'s tiny digits run with half the clients a round, on 1 and 2 processes."""
    one, two = tiny_runs.one_and_two_processes(
        tmp_path,
        "--algorithm",
        algorithm,
        "--federation.client_fraction",
        "0.5",
        *extra,
        run_name="r",
        rounds=3,
        clients=4,
        samples=400,
    )
    return one["state"], two["state"]


def assert_same_on_one_and_two_processes(tmp_path, algorithm: str, *extra: str) -> None:
    """:func:`one_and_two_processes` ends with the same server tensors, bit for bit."""
    one, two = one_and_two_processes(tmp_path, algorithm, *extra)
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
