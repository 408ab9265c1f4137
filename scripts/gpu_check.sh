#!/usr/bin/env bash
# The GPU check (docs/gpu.md, "GPU check"): ViT-B/16 bf16 throughput against the GPU's roof, the loader
# benchmark when present, 1 GPU = 2 GPUs on a tiny FedOPAL and FeDiSyn, and a 16-mixed run that learns.
# Usage: scripts/gpu_check.sh [--cpu] [--out FILE.json]   (--cpu: the same checks, tiny, on the CPU)
# One line per check, a last line counting the failures; exit status 1 if one failed, 2 without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
limit=480  # the GPU check's budget (8 minutes); the CPU smoke run's wall time depends on the machine's load
for arg in "$@"; do [[ "$arg" == "--cpu" ]] && limit=1800; done
exec timeout "$limit" "${PYTHON:-python}" -m benchmarks.gpu_check "$@"
