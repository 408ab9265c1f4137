"""``pilot_ranks: all``: every pilot of ``synthetic_lambda: auto`` runs over all the run's ranks, one pilot after
another, instead of one pilot per rank.

One pilot per rank leaves ranks idle whenever there are fewer pilots than ranks (4 pilots on 8 GPUs), and the run
waits for the largest pilot (λ = 0.4 makes about half of the pilots' images) on one GPU. Run over all N ranks, each
pilot shares its generation, its store and its pre-training as the run's own round 0 does (docs/ranks.md), so the
pilots take about Σ T_i / N instead of max over ranks of that rank's pilots.

Each rank of the run starts its rank of the pilot, a ``python -m fl_lightning.train`` process, as ``torchrun``
would: the run's layout (``federation.devices`` per node × ``federation.num_nodes``, this rank's local and node
rank, the devices it sees) with a rendezvous of the pilot's own — rank 0's ``MASTER_ADDR`` and a port that rank 0
finds free and sends every rank. The pilot is then an ordinary multi-rank run (its liveness watch ends its ranks
when one of them fails), and every rank of the run waits for its own rank of the pilot.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["PilotLaunch", "free_port"]


@dataclass(frozen=True)
class PilotLaunch:
    """Where this rank's process of a pilot sits in the pilot's world: the run's own layout, a fresh rendezvous.

    Attributes:
        rank, world: this rank and the number of ranks (the run's).
        devices, num_nodes: ranks per node and nodes (``federation.devices`` × ``federation.num_nodes`` = world).
        master_addr, master_port: the pilot's rendezvous (rank 0's host, a port free there).
        run_id: names the rendezvous (``TORCHELASTIC_RUN_ID``), one per pilot.
    """

    rank: int
    world: int
    devices: int
    num_nodes: int
    master_addr: str
    master_port: int
    run_id: str

    def __post_init__(self) -> None:
        if self.devices * self.num_nodes != self.world or not 0 <= self.rank < self.world:
            raise ValueError(
                f"rank {self.rank} of {self.world} does not fit {self.devices} device(s) per node × {self.num_nodes} node(s)"
            )

    @property
    def local_rank(self) -> int:
        return self.rank % self.devices  # Lightning's numbering: global rank = node_rank · devices + local_rank

    @property
    def node_rank(self) -> int:
        return self.rank // self.devices

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` (an environment without any launcher's variables: ``launch.clean_launcher_env``) with the
        variables ``torchrun`` sets for this rank, so the pilot's ``fl_lightning.train`` takes itself for this rank
        of an externally launched job (``launch.external_launcher``: torchrun) and joins the pilot's rendezvous."""
        return {
            **base,
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.devices),
            "GROUP_RANK": str(self.node_rank),
            "NODE_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "TORCHELASTIC_RUN_ID": self.run_id,
        }

    def layout_args(self) -> list[str]:
        """The pilot's ``--federation.devices`` and ``--federation.num_nodes``: the run's."""
        return ["--federation.devices", str(self.devices), "--federation.num_nodes", str(self.num_nodes)]


def free_port(host: str = "") -> int:
    """A TCP port free on this host now (the OS's pick, as ``torchrun --master-port 0`` takes one); the caller binds
    it soon after, as launchers do."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return int(s.getsockname()[1])


def rendezvous_host(environ: Mapping[str, str] | None = None) -> str:
    """Rank 0's address for the pilots' rendezvous: the run's own ``MASTER_ADDR`` (every launcher, and Lightning's
    SLURM environment, sets it before the process group starts), else this host (a one-node run)."""
    env = os.environ if environ is None else environ
    return env.get("MASTER_ADDR") or "127.0.0.1"
