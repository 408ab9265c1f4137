"""The engine's cost contract at scale, on one-shot AFL with a tiny timm ViT (in process, CPU):

* a finished client writes O(its upload) bytes, never O(clients so far): bytes written per client,
  measured by the kernel's write counter, do not grow with K, and each record is its upload plus a
  small constant;
* the server holds at most two uploads at once while it aggregates (the one folded and the next read),
  whatever K;
* the result does not depend on K (AFL's sum is exact), so K only changes the cost.
"""

from __future__ import annotations

import weakref

import pytest

from fl_lightning.config.loading import build_config
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from fl_lightning.federation.transport import Upload

D = 32  # feature dimension: an upload is R's upper triangle (float64) and C (d x 10, float64) + N
UPLOAD_BYTES = (D * (D + 1) // 2 + D * 10) * 8 + 8


def _cfg(tmp_path, k: int):
    return build_config(
        {
            "algorithm": "afl",
            "output_dir": str(tmp_path),
            "run_name": f"k{k}",
            "data": {"name": "synthetic", "image_size": 32, "batch_size": 64, "num_samples": 96},
            "partition": {"scheme": "iid", "num_clients": k},
            "model": {
                "library": "timm",
                "name": "vit_base_patch16_224",
                "pretrained": None,
                "overrides": {"img_size": 32, "patch_size": 8, "embed_dim": D, "depth": 1, "num_heads": 2},
            },
            # the record path: every record on disk at once (the default holds a short round's records in memory)
            "federation": {"accelerator": "cpu", "record_after_s": 0},
            "logging": {"progress": False},
        }
    )


def _wchar() -> int:
    with open("/proc/self/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


class _RoundProbe:
    """Bytes this process writes during the round, and the round folder's files before it is cleared."""

    def on_round_start(self, **_):
        self.start = _wchar()

    def on_round_end(self, *, round_idx, **_):
        self.written = _wchar() - self.start
        folder = self.run_dir / "checkpoints" / f"round{round_idx:04d}"
        self.records = {p.name: p.stat().st_size for p in folder.glob("client*.pt")}

    def on_run_start(self, *, run_dir, **_):
        self.run_dir = run_dir


def _run(tmp_path, k: int, callbacks=()):
    cfg = _cfg(tmp_path, k)
    summary = Simulation(cfg=cfg, loggers=[], callbacks=list(callbacks)).run()
    return cfg, summary


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
def test_bytes_written_per_client_do_not_grow_with_k(tmp_path):
    per_client = {}
    for k in (4, 24):
        probe = _RoundProbe()
        _, summary = _run(tmp_path, k, [probe])
        assert summary["bytes_up"] == k * UPLOAD_BYTES
        assert len(probe.records) == k
        # each record is the client's upload plus a small constant (torch.save framing, a few numbers)
        for size in probe.records.values():
            assert UPLOAD_BYTES < size < UPLOAD_BYTES + 4096
        # every byte the process wrote in the round is accounted for by the records (+ the plan, a little)
        assert sum(probe.records.values()) <= probe.written < sum(probe.records.values()) + 64 * 1024
        per_client[k] = probe.written / k
    # O(upload) per client: with O(K) rewrites, 24 clients would write ~6x more per client than 4
    assert per_client[24] <= 1.05 * per_client[4]


def test_server_holds_at_most_two_uploads_while_aggregating(tmp_path, monkeypatch):
    alive: dict[int, weakref.ref] = {}  # Upload is an unhashable dataclass: key the weak references by a counter
    most = {"alive": 0, "loaded": 0}
    original = Upload.from_state_dict.__func__

    def tracked(cls, state):
        upload = original(cls, state)
        key = most["loaded"]
        alive[key] = weakref.ref(upload, lambda _, key=key: alive.pop(key))
        most["loaded"] += 1
        most["alive"] = max(most["alive"], len(alive))
        return upload

    monkeypatch.setattr(Upload, "from_state_dict", classmethod(tracked))
    _run(tmp_path, 16)
    assert most["loaded"] == 16  # every upload was read back from its record, once
    assert most["alive"] <= 2


def test_result_does_not_depend_on_k(tmp_path):
    states, accuracies = [], []
    for k in (1, 3, 12):
        cfg, summary = _run(tmp_path, k)
        states.append(safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]["W"])
        accuracies.append(summary["accuracy"])
    for W in states[1:]:  # the same sum in another grouping: equal up to float64 rounding, amplified by the
        # solve's condition number (a LayerNorm'd CLS feature makes Σ R nearly singular; λ = 1e-6)
        assert float((W - states[0]).norm() / states[0].norm()) < 1e-6
    assert len(set(accuracies)) == 1
