"""Every documented launcher gives the 1-process result: ``fabric run`` (Fabric's CLI) and ``torchrun``
with 2 CPU processes, against ``python -m fl_lightning.train`` with one; and a launcher whose world
size disagrees with the config stops with one line.

The job is one-shot AFL on the bundled digits with a tiny random timm ViT (cheap to import and run);
bitwise equality holds because every process runs one intra-op thread (OMP_NUM_THREADS=1) and the
server folds the uploads in client order whatever rank computed them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from fl_lightning.federation.storage.checkpoint import safe_load
from tests.conftest import REPO, run_cli
from tests.gloo_ranks import free_port, torchrun_node

pytestmark = pytest.mark.slow

RUN = "afl_digits_a0.5_s0"
JOB = {
    "algorithm": "afl",
    "data": {"name": "digits", "image_size": 32, "batch_size": 64},
    "partition": {"num_clients": 5, "alpha": 0.5},
    "model": {
        "library": "timm",
        "name": "vit_base_patch16_224",
        "pretrained": None,
        "overrides": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2},
    },
    "federation": {"accelerator": "cpu"},
    "logging": {"progress": False},
}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}


def _launcher(name: str) -> tuple[list[str], str]:
    """The launcher's command: its console script when installed, else the module it runs; on a free port
    (the launchers' default ports, 29500 and 29400, collide when two suites or jobs share the machine)."""
    module = {"fabric": "lightning.fabric.cli", "torchrun": "torch.distributed.run"}[name]
    exe = shutil.which(name)
    # `fabric run …` as a console script; the module is the `run` command itself (no subcommand)
    command = ([exe] + (["run"] if name == "fabric" else [])) if exe else [sys.executable, "-m", module]
    port = str(free_port())
    return command + (["--master-port", port] if name == "torchrun" else []), port


def _launch(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=ENV, timeout=timeout)


def _train(config, out, *extra: str) -> list[str]:
    """What a launcher is given to run: ``-m fl_lightning.train`` on ``config`` into ``out``, then ``extra``."""
    return ["-m", "fl_lightning.train", "--config", str(config), "--output_dir", str(out), *extra]


def _torchrun_two_processes(config, out, devices: int) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node 2 -m fl_lightning.train`` on ``config`` into ``out``, the config saying
    ``federation.devices`` ``devices``."""
    return _launch(
        [*_launcher("torchrun")[0], "--nproc-per-node", "2", *_train(config, out, "--federation.devices", str(devices))]
    )


def _comparable(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in ("wall_time_s", "world_size")}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("conf") / "afl_timm_tiny.yaml"
    path.write_text(yaml.safe_dump(JOB), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def one_process(config, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    proc = run_cli("--config", str(config), "--output_dir", str(out), env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / RUN


def _assert_same_result(one, two) -> None:
    s1 = json.loads((one / "summary.json").read_text())
    s2 = json.loads((two / "summary.json").read_text())
    assert (s1["world_size"], s2["world_size"]) == (1, 2)
    assert _comparable(s1) == _comparable(s2)
    t1 = safe_load(one / "checkpoints" / "server.pt")["state"]
    t2 = safe_load(two / "checkpoints" / "server.pt")["state"]
    assert t1.keys() == t2.keys() and t1
    for k in t1:
        assert torch.equal(t1[k], t2[k]), k


def test_fabric_run_two_cpu_processes_equal_one(config, one_process, tmp_path):
    fabric, port = _launcher("fabric")
    proc = _launch(
        [
            *fabric,
            "--accelerator",
            "cpu",
            "--devices",
            "2",
            "--main-port",
            port,
            "fl_lightning/train.py",
            "--config",
            str(config),
            "--output_dir",
            str(tmp_path),
            "--federation.devices",
            "2",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "processes have already been created" not in proc.stderr
    _assert_same_result(one_process, tmp_path / RUN)


def test_torchrun_two_cpu_processes_equal_one(config, one_process, tmp_path):
    proc = _torchrun_two_processes(config, tmp_path, devices=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_same_result(one_process, tmp_path / RUN)


def test_torchrun_world_size_disagreeing_with_the_config_stops_in_one_line(config, tmp_path):
    proc = _torchrun_two_processes(config, tmp_path, devices=1)
    # each rank exits 2 with our one line; torchrun then exits 1 and prints its own failure report. The
    # first rank to exit makes torchrun SIGTERM the other if that one has not exited yet: a race. The
    # other then dies of the signal (-15) or, once our handler is installed, says so and exits 143.
    assert proc.returncode == 1
    codes = set(re.findall(r"exitcode\s*:\s*(-?\d+)", proc.stderr))
    assert "2" in codes and codes <= {"2", "-15", "143"}, proc.stderr[-3000:]
    interrupted = "fl_lightning: interrupted before the run started"
    ours = [line for line in proc.stderr.splitlines() if line.startswith("fl_lightning:") and line != interrupted]
    assert 1 <= len(ours) <= 2 and len(set(ours)) == 1, proc.stderr[-3000:]
    assert "torchrun started 2 process(es)" in ours[0] and "federation.devices" in ours[0]
    assert f'File "{REPO / "fl_lightning"}' not in proc.stderr  # no traceback through our code
    assert not (tmp_path / RUN).exists()  # stopped before anything was written


def _two_nodes(config, out0, out1, timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Two "nodes" on this machine: ``torchrun --nnodes 2`` once per node rank over 127.0.0.1, one process
    each, as a two-node job starts them (each node names its own ``output_dir``)."""
    base, port = _launcher("torchrun")
    base = [a for a in base if a not in ("--master-port", port)]
    procs = [
        subprocess.Popen(
            [
                *torchrun_node(node, port, base),
                *_train(config, out, "--federation.num_nodes", "2", "--federation.devices", "1"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=ENV,
        )
        for node, out in enumerate((out0, out1))
    ]
    done = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return done


def test_two_nodes_sharing_the_run_folder_equal_one_process(config, one_process, tmp_path):
    node0, node1 = _two_nodes(config, tmp_path, tmp_path)
    assert (node0.returncode, node1.returncode) == (0, 0), node0.stderr[-3000:] + node1.stderr[-3000:]
    _assert_same_result(one_process, tmp_path / RUN)


def test_two_nodes_with_node_local_run_folders_stop_at_start_up_in_one_line(config, tmp_path):
    """Each node's ``output_dir`` is its own (a node-local disk): both stop in seconds, before any client runs,
    rank 0 with one line that names the folder and the rank that cannot see it; no traceback anywhere."""
    node0, node1 = _two_nodes(config, tmp_path / "node0", tmp_path / "node1")
    assert node0.returncode != 0 and node1.returncode != 0
    ours = [line for line in node0.stderr.splitlines() if line.startswith("fl_lightning:")]
    assert len(ours) == 1 and "run folder" in ours[0] and str(tmp_path / "node0") in ours[0], node0.stderr[-3000:]
    # torchrun prints its own failure report (with its agent's traceback); none runs through our code
    assert f'File "{REPO / "fl_lightning"}' not in node0.stderr + node1.stderr, node0.stderr[-3000:]
    codes = set(re.findall(r"exitcode\s*:\s*(-?\d+)", node0.stderr + node1.stderr))
    assert "2" in codes, node0.stderr[-3000:]  # our usage-error status
    assert not (tmp_path / "node0" / RUN / "checkpoints" / "server.pt").exists()
