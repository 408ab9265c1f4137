"""scripts/gpu_check.sh and benchmarks/gpu_check.py: the roofs, the FLOP count, and the ``--cpu`` smoke run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from benchmarks import gpu_check
from tests.conftest import CONF

_SCRIPT = CONF.parent / "scripts" / "gpu_check.sh"


@pytest.mark.parametrize(
    ("name", "roof"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA GeForce RTX 4090", 165e12),
        ("Tesla T4", None),
        ("", None),
    ],
)
def test_roofs_by_device_name(name, roof):
    assert gpu_check.roof_flops(name) == roof


def test_vit_b16_forward_flops_match_the_published_17_6_gmacs():
    flops = gpu_check.vit_forward_flops(image_size=224, patch_size=16, width=768, depth=12)
    assert flops == pytest.approx(2 * 17.58e9, rel=0.01)  # timm's vit_base_patch16_224: 17.58 GMACs
    assert gpu_check.vit_forward_flops(image_size=224, patch_size=16, width=768, depth=12, extra_tokens=10) > flops


def test_tiny_throughput_on_the_cpu_trains_the_prompts_only():
    out = gpu_check.throughput(cpu=True, device=torch.device("cpu"), batch=2, steps=1)
    assert set(out) == {"prompt_tuning", "statistics"}
    assert all(v["images_s"] > 0 and v["flops_s"] > 0 for v in out.values())


def test_without_cuda_and_without_cpu_flag_it_stops_with_one_line(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--cpu" in err


@pytest.mark.slow  # about 6 minutes on 2 shared cores: 12 tiny runs in fresh processes, 3 of them on 2 ranks
def test_the_cpu_smoke_run_prints_one_line_per_check_and_a_table_and_passes(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        ["bash", str(_SCRIPT), "--cpu", "--out", str(tmp_path / "gpu_check.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert lines[0] == "gpu_check: device cpu, bf16 roof n/a"
    assert re.fullmatch(r"throughput prompt_tuning: [0-9.]+ images/s, [0-9.]+ TFLOP/s, roof n/a: ok", lines[1])
    assert re.fullmatch(r"throughput statistics: [0-9.]+ images/s, [0-9.]+ TFLOP/s, roof n/a: ok", lines[2])
    assert re.fullmatch(r"loader: \d+ images/s onto cpu .*: ok", lines[3])
    for line, method in zip(lines[4:6], ("fedopal", "fedisyn")):  # the one-GPU launch: 2 "nodes" under torchrun
        assert re.fullmatch(rf"ranks {method}: 1 rank accuracy ([0-9.]+), 2 ranks \1 \(2 processes on the CPU.*: ok", line), line
    for line, name, precision in zip(lines[6:8], ("bf16", "fp16"), ("bf16-mixed", "16-mixed")):
        assert re.fullmatch(rf"{name} fedopal: {precision} accuracy 0\.[3-9][0-9]* .*: ok", line), line
    assert re.fullmatch(r"fp16 fedavg: 16-mixed head accuracy ([0-9.]+), untrained ([0-9.]+) \(bar [0-9.]+\): ok", lines[8]), (
        lines[8]
    )
    assert re.fullmatch(r"dense: 32-true student accuracy [0-9.]+, clients' ensemble [0-9.]+ .*: ok", lines[9]), lines[9]
    assert re.fullmatch(
        r"stopped rank: rank 1 frozen \(SIGSTOP\) on round 0: the job ended [0-9.]+ s after .*exit "
        r"\[1, 1\]; rank 0 said: fl_lightning: rank 1 on .* stopped answering: .*: ok",
        lines[10],
    ), lines[10]
    assert lines[11].split() == ["check", "status", "seconds", "peak", "GPU", "memory"]
    names = [re.sub(r":.*", "", line) for line in lines[1:11]]
    for row, name in zip(lines[12:22], names):
        assert row.startswith(name) and row[len(name) :].split()[0] == "ok" and row.endswith("n/a"), row
    assert lines[22] == "gpu_check: 10 checks, 0 failed" and len(lines) == 23
    assert (tmp_path / "gpu_check.json").is_file()
