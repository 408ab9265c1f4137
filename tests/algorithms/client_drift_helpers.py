"""What the client-drift tests share: heterogeneous least-squares clients with a known optimum, a kill at a
round's end (after the clients' kept state was written, before that round's server.pt), and a method's tiny run
on one and on two processes."""

from __future__ import annotations

import torch

from fl_lightning.federation.storage.checkpoint import safe_load
from tests.conftest import CONF, run_cli


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


def one_and_two_processes(tmp_path, algorithm: str, *extra: str) -> tuple[dict, dict]:
    """The final server state of ``algorithm``'s tiny digits run with half the clients a round, on 1 and 2 processes."""

    def run(label: str, *more: str) -> dict:
        out = tmp_path / label
        done = run_cli(
            "--config",
            str(CONF / "fedavg_digits_tiny.yaml"),
            "--output_dir",
            str(out),
            "--run_name",
            "r",
            "--algorithm",
            algorithm,
            "--logging.progress",
            "false",
            "--federation.rounds",
            "3",
            "--partition.num_clients",
            "4",
            "--data.num_samples",
            "400",
            "--federation.client_fraction",
            "0.5",
            *extra,
            *more,
            env={"OMP_NUM_THREADS": "1"},
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return safe_load(out / "r" / "checkpoints" / "server.pt")["state"]

    return run("one"), run("two", "--federation.devices", "2")
