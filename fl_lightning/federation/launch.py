"""Who started the processes: this program (Fabric's launcher) or an external one.

``python -m fl_lightning.train`` launches its ranks through Fabric. The same command also runs
under an external launcher — Fabric's own CLI (``fabric run``), ``torchrun`` or SLURM's ``srun`` —
which has created the processes already; then we must not launch again, and the launcher's world
size must be the one the config asks for (``federation.devices × federation.num_nodes``).
"""

from __future__ import annotations

import os

from fl_lightning.errors import UsageError

__all__ = ["external_launcher", "check_launcher"]


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
        raise UsageError(f"usage error: {name} started {world} process(es) but the config asks for "
                         f"federation.devices × federation.num_nodes = {devices} × {num_nodes} = "
                         f"{devices * num_nodes}; make them agree (e.g. --federation.devices {world // num_nodes})")
    return name
