"""What the client-drift tests share: heterogeneous least-squares clients with a known optimum, and a kill at a
round's end (after the clients' kept state was written, before that round's server.pt)."""

from __future__ import annotations

import torch


def least_squares(n=5, d=4, m=12, seed=0):
    """Clients i with f_i(w) = ½‖A_i w − b_i‖²/m, each its own A_i and b_i (heterogeneous optima)."""
    g = torch.Generator().manual_seed(seed)
    problems = [(torch.randn(m, d, generator=g, dtype=torch.float64) * (1 + i),
                 torch.randn(m, generator=g, dtype=torch.float64) + 3 * i) for i in range(n)]
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
