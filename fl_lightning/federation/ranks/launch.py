"""Who started the processes: this program (Fabric's launcher) or an external one.

``python -m fl_lightning.train`` launches its ranks through Fabric. The same command also runs
under an external launcher — Fabric's own CLI (``fabric run``), ``torchrun`` or SLURM's ``srun`` —
which has created the processes already; then we must not launch again, and the launcher's world
size must be the one the config asks for (``federation.devices × federation.num_nodes``).

A separate run started from inside a launched rank (FeDiSyn's pilots) must not inherit the launcher's
variables: it would take itself for one of the launched ranks (``clean_launcher_env``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from fl_lightning.errors import UsageError

__all__ = ["external_launcher", "check_launcher", "clean_launcher_env"]


def external_launcher(environ: dict[str, str] | None = None) -> tuple[str, int] | None:
    """(launcher name, world size) when an external launcher started this process, else None."""
    env = os.environ if environ is None else environ
    if env.get("LT_CLI_USED") == "1":  # `fabric run` (it starts the processes through torchrun)
        return "fabric run", int(env.get("WORLD_SIZE", "1"))
    if "TORCHELASTIC_RUN_ID" in env or ("LOCAL_RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env):
        return "torchrun", int(env["WORLD_SIZE"])
    if "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return "SLURM", int(env["SLURM_NTASKS"])
    return None


def check_launcher(devices: int, num_nodes: int, environ: dict[str, str] | None = None) -> str | None:
    """The external launcher's name ("fabric run", "torchrun", "SLURM"), or None when there is none.
    Under "fabric run" Fabric has set the processes up already and must not launch again.

    Raises:
        UsageError: the launcher's world size differs from ``devices × num_nodes``.
    """
    found = external_launcher(environ)
    if found is None:
        return None
    name, world = found
    if world != devices * num_nodes:
        raise UsageError(
            f"usage error: {name} started {world} process(es) but the config asks for "
            f"federation.devices × federation.num_nodes = {devices} × {num_nodes} = "
            f"{devices * num_nodes}; make them agree (e.g. --federation.devices {world // num_nodes})"
        )
    return name


# What a launcher sets for the processes it starts (torch/distributed/elastic/agent/server/local_elastic_agent.py,
# lightning/fabric/cli.py, lightning/fabric/utilities/seed.py, Lightning's SLURM / LSF / MPI environments): rank
# and world layout, rendezvous address, the elastic agent's files, Fabric CLI's settings and the seed Lightning
# hands to the processes it spawns (each run seeds itself from its config).
_LAUNCHER_NAMES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "LT_CLI_USED",
        "LT_ACCELERATOR",
        "LT_STRATEGY",
        "LT_DEVICES",
        "LT_NUM_NODES",
        "LT_PRECISION",
        "PL_GLOBAL_SEED",
        "PL_SEED_WORKERS",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
    }
)
_LAUNCHER_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "JSM_NAMESPACE_", "MV2_COMM_WORLD_")
# SLURM variables of the job rather than of this srun step's tasks: kept (the run lock records the job,
# run_lock.py; a comparison shards by array task). SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_* … go.
_SLURM_JOB_PREFIXES = ("SLURM_JOB_", "SLURM_ARRAY_", "SLURM_SUBMIT_")
_SLURM_JOB_NAMES = frozenset({"SLURM_JOBID", "SLURM_RESTART_COUNT", "SLURM_CLUSTER_NAME", "SLURM_CONF"})


def _is_launcher_variable(name: str) -> bool:
    if name in _LAUNCHER_NAMES:
        return True
    if name.startswith("SLURM_"):
        return not (name in _SLURM_JOB_NAMES or name.startswith(_SLURM_JOB_PREFIXES))
    return name.startswith(_LAUNCHER_PREFIXES)


def clean_launcher_env(environ: Mapping[str, str], *, cuda_device: int | None = None) -> dict[str, str]:
    """A copy of ``environ`` for a separate single-process run started from inside a launched rank.

    Drops what torchrun / ``fabric run`` / SLURM's srun / MPI set for the ranks they started (rank and world
    layout, ``MASTER_ADDR``/``MASTER_PORT``, ``TORCHELASTIC_*``, the task variables of ``SLURM_*``, ``LT_*`` of
    Fabric's CLI, ``PL_GLOBAL_SEED``), so the child neither takes itself for one of those ranks nor joins
    their rendezvous; the SLURM job's own identity (``SLURM_JOB_ID``, ``SLURM_ARRAY_*``, …) and everything
    else (paths, threads, caches, W&B) stay.

    Args:
        environ: the parent's environment (e.g. ``os.environ``); not modified.
        cuda_device: the CUDA device index this rank computes on (torch's numbering, i.e. within the
            parent's ``CUDA_VISIBLE_DEVICES``): the child then sees that one device only, as its ``cuda:0``.
            None leaves ``CUDA_VISIBLE_DEVICES`` as it is.

    Raises:
        ValueError: ``cuda_device`` is negative or not among the parent's visible devices.

    Example::

        env = clean_launcher_env({"RANK": "1", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4,5", "HOME": "/h"},
                                 cuda_device=1)
        # {"CUDA_VISIBLE_DEVICES": "5", "HOME": "/h"}
    """
    env = {k: v for k, v in environ.items() if not _is_launcher_variable(k)}
    if cuda_device is None:
        return env
    if not (isinstance(cuda_device, int) and not isinstance(cuda_device, bool) and cuda_device >= 0):
        raise ValueError(f"cuda_device must be an int >= 0, got {cuda_device!r}")
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:  # every device is visible: torch's index is the driver's
        env["CUDA_VISIBLE_DEVICES"] = str(cuda_device)
        return env
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if cuda_device >= len(entries):
        raise ValueError(
            f"cuda_device {cuda_device} is not among the {len(entries)} device(s) of CUDA_VISIBLE_DEVICES={visible!r}"
        )
    env["CUDA_VISIBLE_DEVICES"] = entries[cuda_device]
    return env
