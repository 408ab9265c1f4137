"""The federation loop on FedAvg with a tiny backbone: determinism, 1 vs 2 ranks, resume, faults."""

import json
import math

import pytest
import torch

from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.errors import ClientFailure, RemoteTraceback, RunFailure, TooFewClients, UsageError
from fl_lightning.federation.algorithm import register
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.round_store import RoundStore
from fl_lightning.federation.transport import Upload
from tests.conftest import CONF, StopAfterClients
from tests.run_records import kill_after_round_0, server_state
from tests.tiny_runs import cli_run, server_pt, start_train, tiny_config, tiny_overrides


def _cfg(tmp_path, *extra):
    return tiny_config(tmp_path, *extra)


def _comparable(summary):
    return {k: v for k, v in summary.items() if k not in ("wall_time_s", "world_size")}


def test_run_folder_contract_and_determinism(tmp_path):
    a = Simulation(cfg=_cfg(tmp_path / "a"), loggers=[]).run()
    b = Simulation(cfg=_cfg(tmp_path / "b"), loggers=[]).run()
    assert _comparable(a) == _comparable(b)
    for k, v in server_state(_cfg(tmp_path / "a")).items():
        assert torch.equal(v, server_state(_cfg(tmp_path / "b"))[k])
    run = _cfg(tmp_path / "a").run_dir
    for name in ("config.yaml", "summary.json", "metrics.csv", "partition.csv", "partition.png", "checkpoints/server.pt"):
        assert (run / name).exists(), name
    summary = json.loads((run / "summary.json").read_text())
    for key in (
        "algorithm",
        "dataset",
        "num_clients",
        "alpha",
        "seed",
        "rounds",
        "accuracy",
        "bytes_up",
        "bytes_down",
        "wall_time_s",
    ):
        assert key in summary
    assert 0.0 <= summary["accuracy"] <= 1.0 and summary["rounds"] == 2
    # 4 clients x 2 rounds x (head 10x32 + 10 float32, + 1 scalar)
    assert summary["bytes_up"] == 2 * 4 * ((10 * 32 + 10) * 4 + 8)
    assert summary["bytes_down"] == 2 * 4 * (10 * 32 + 10) * 4
    rows = (run / "metrics.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("round,accuracy,loss")
    assert not list((run / "checkpoints").glob("round*"))  # the records of finished rounds are cleaned up


class _HookOrder:
    def __init__(self, run_dir):
        self.run_dir, self.events = run_dir, []

    def on_round_end(self, *, round_idx, **_):
        self.events.append(("round_end", round_idx))

    def on_rounds_end(self, *, completed_rounds, run_dir, **_):
        assert run_dir == self.run_dir and (run_dir / "checkpoints" / "server.pt").is_file()  # durable already
        assert not (run_dir / "summary.json").exists()  # the end-of-run reports come after
        self.events.append(("rounds_end", completed_rounds))

    def on_run_end(self, **_):
        self.events.append(("run_end",))


def test_on_rounds_end_comes_once_the_last_checkpoint_is_durable_and_before_the_reports(tmp_path):
    cfg = _cfg(tmp_path)
    hooks = _HookOrder(cfg.run_dir)
    Simulation(cfg=cfg, loggers=[], callbacks=[hooks]).run()
    assert hooks.events == [("round_end", 0), ("round_end", 1), ("rounds_end", 2), ("run_end",)]


def test_resume_mid_round_equals_uninterrupted(tmp_path):
    full = Simulation(cfg=_cfg(tmp_path / "full"), loggers=[]).run()
    cfg = _cfg(tmp_path / "cut")
    with pytest.raises(KeyboardInterrupt):
        Simulation(cfg=cfg, loggers=[], callbacks=[StopAfterClients(6)]).run()  # round 1, 2 of 4 clients done
    ckpts = sorted(p.name for p in (cfg.run_dir / "checkpoints").iterdir())
    assert "server.pt" in ckpts and "round0001" in ckpts
    records = sorted(p.name for p in (cfg.run_dir / "checkpoints" / "round0001").iterdir())
    assert records == ["client000000.pt", "client000001.pt", "plan.pt"]  # round 1: 2 of 4 clients done
    resumed = Simulation(cfg=cfg, loggers=[], resume=True).run()
    assert _comparable(resumed) == _comparable(full)
    for k, v in server_state(cfg).items():
        assert torch.equal(v, server_state(_cfg(tmp_path / "full"))[k])


@register("test_faulty")
class _Faulty(FedAvg):
    def client_update(self, round_idx, client, download):
        if client.index == 1:
            raise RuntimeError("boom")
        up = super().client_update(round_idx, client, download)
        if client.index == 2:
            up = Upload({k: torch.full_like(v, math.nan) for k, v in up.tensors.items()}, up.meta)
        return up


def test_client_error_raise_names_client_and_keeps_checkpoint(tmp_path):
    cfg = _cfg(tmp_path, "--algorithm", "test_faulty")
    with pytest.raises(ClientFailure, match=r"client 1 failed in round 0: RuntimeError: boom"):
        Simulation(cfg=cfg, loggers=[]).run()
    assert len(list((cfg.run_dir / "checkpoints" / "round0000").glob("client*.pt"))) == 4


def test_a_failed_client_keeps_its_traceback_in_its_record_and_in_the_failure(tmp_path):
    """The one line names the client; the cause is not reduced to it: the record on disk keeps the formatted
    traceback (it ends in the method's own code) and the ClientFailure carries it as its __cause__."""
    cfg = _cfg(tmp_path, "--algorithm", "test_faulty")
    with pytest.raises(ClientFailure) as info:
        Simulation(cfg=cfg, loggers=[]).run()
    err = info.value
    assert (err.client, err.round_idx) == (1, 0) and isinstance(err, RunFailure)
    assert "Traceback (most recent call last)" in err.client_traceback
    assert "in client_update" in err.client_traceback and 'raise RuntimeError("boom")' in err.client_traceback
    assert err.client_traceback.rstrip().endswith("RuntimeError: boom")
    assert isinstance(err.__cause__, RemoteTraceback) and err.__cause__.text == err.client_traceback
    store = RoundStore(cfg.run_dir / "checkpoints", 0)
    record = store.load_client(1)[0]
    assert record.failure == "RuntimeError: boom" and record.traceback == err.client_traceback
    rejected = store.load_client(2)[0]  # a NaN upload: rejected by the server's check, which raised there
    assert "non-finite" in rejected.failure and "check_upload" in rejected.traceback
    assert store.load_client(0)[0].traceback is None


def test_too_few_clients_is_a_run_failure_with_the_tracebacks(tmp_path):
    cfg = _cfg(tmp_path, "--algorithm", "test_faulty", "--federation.on_client_error", "skip", "--federation.min_clients", "3")
    with pytest.raises(
        TooFewClients,
        match=r"round 0: 2 of 4 clients succeeded, fewer than "
        r"federation.min_clients=3",
    ) as info:
        Simulation(cfg=cfg, loggers=[]).run()
    assert sorted(info.value.client_tracebacks) == [1, 2] and info.value.succeeded == 2
    assert 'raise RuntimeError("boom")' in info.value.__cause__.text  # the first failed client's


def test_client_error_skip_records_failures_and_aggregates_rest(tmp_path):
    cfg = _cfg(tmp_path, "--federation.on_client_error", "skip", "--algorithm", "test_faulty")
    summary = Simulation(cfg=cfg, loggers=[]).run()
    assert set(summary["failed_clients"]) == {"1", "2"}
    assert "boom" in summary["failed_clients"]["1"] and "non-finite" in summary["failed_clients"]["2"]
    assert all(torch.isfinite(v).all() for v in server_state(cfg).values())
    assert summary["bytes_up"] == 2 * 2 * ((10 * 32 + 10) * 4 + 8)  # only the 2 healthy clients' uploads


def _two_fedavg_runs(tmp_path, first: list[str], second: list[str]) -> tuple[dict, dict]:
    """The tiny FedAvg config run twice (one CPU thread a process) with ``first`` and ``second`` appended; asserts
    the two runs' server tensors are equal and returns their summaries."""
    name, summaries, states = "fedavg_digits_a0.5_s0", [], []
    for label, extra in (("first", first), ("second", second)):
        run = cli_run(tmp_path / label, *extra, run_name=None, rounds=2, clients=5) / name
        summaries.append(json.loads((run / "summary.json").read_text()))
        states.append(server_pt(run)["state"])
    for k in states[0]:
        assert torch.equal(states[0][k], states[1][k]), k
    return summaries[0], summaries[1]


def test_two_cpu_processes_equal_one(tmp_path):
    """Same config and seed: devices 1 and devices 2 (ddp over gloo) give identical numbers and tensors.

    Bitwise equality needs the same CPU thread count per process (float reductions depend on it):
    Fabric gives each of N ranks cpu_count/N threads unless OMP_NUM_THREADS is set, so we set it."""
    s1, s2 = _two_fedavg_runs(tmp_path, [], ["--federation.devices", "2"])
    assert s2["world_size"] == 2
    assert _comparable(s1) == _comparable(s2)


@pytest.mark.slow  # two CLI runs of 2 + 1 processes
def test_two_cpu_processes_equal_one_with_the_clients_test_sets(tmp_path):
    """partition.client_test_fraction: the federated evaluation of a shared evaluation (each rank its block of the
    clients' test rows, the outcomes gathered) gives rank 0 the numbers of one process, bit for bit."""
    s1, s2 = _two_fedavg_runs(
        tmp_path,
        ["--partition.client_test_fraction", "0.25"],
        ["--partition.client_test_fraction", "0.25", "--federation.devices", "2"],
    )
    assert s2["world_size"] == 2 and 0 <= s1["fed_test_acc"] <= 1
    assert _comparable(s1) == _comparable(s2)


@pytest.mark.slow  # the default path (held records handed over) runs in test_two_cpu_processes_equal_one
def test_two_ranks_hand_their_records_over_the_backend_as_they_write_them(tmp_path):
    """Rank 1's clients of a short round reach rank 0 in the records gather (held, record_after_s default) or
    through the round folder (record_after_s 0: every record written): the same numbers and tensors."""
    s1, s2 = _two_fedavg_runs(
        tmp_path, ["--federation.devices", "2"], ["--federation.devices", "2", "--federation.record_after_s", "0"]
    )
    assert _comparable(s1) == _comparable(s2)


def test_a_partition_written_by_one_run_reproduces_it_in_another(tmp_path):
    """partition.json of run A, read back with partition.scheme: file (and another partition seed, which the
    file overrides), gives bit-identical results."""
    a = Simulation(cfg=_cfg(tmp_path / "a", "--partition.alpha", "0.3"), loggers=[]).run()
    written = _cfg(tmp_path / "a", "--partition.alpha", "0.3").run_dir / "partition.json"
    cfg = _cfg(tmp_path / "b", "--partition.scheme", "file", "--partition.path", str(written), "--partition.seed", "7")
    b = Simulation(cfg=cfg, loggers=[]).run()
    assert _comparable(a) == {**_comparable(b), "alpha": 0.3}
    for k, v in server_state(_cfg(tmp_path / "a", "--partition.alpha", "0.3")).items():
        assert torch.equal(v, server_state(cfg)[k])


def test_a_partition_file_without_num_clients_gives_the_files_clients(tmp_path):
    Simulation(cfg=_cfg(tmp_path / "a"), loggers=[]).run()
    written = _cfg(tmp_path / "a").run_dir / "partition.json"
    file = ("--partition.scheme", "file", "--partition.path", str(written), "--partition.num_clients", "null")
    cfg = _cfg(tmp_path / "b", *file)
    assert cfg.partition.num_clients is None  # resolved from the file by the run, before anything reads it
    summary = Simulation(cfg=cfg, loggers=[]).run()
    assert summary["num_clients"] == 4 and "num_clients: 4" in (cfg.run_dir / "config.yaml").read_text()
    for k, v in server_state(_cfg(tmp_path / "a")).items():
        assert torch.equal(v, server_state(cfg)[k])
    (tmp_path / "bad.json").write_text('{"clients": 3}')
    with pytest.raises(UsageError, match=r"^config error: partition.path: partition file .*bad.json' holds no list"):
        Simulation(cfg=_cfg(tmp_path / "c", *file[:3], str(tmp_path / "bad.json"), *file[4:]), loggers=[])


def test_a_partition_file_for_another_client_count_is_one_line(tmp_path):
    Simulation(cfg=_cfg(tmp_path / "a"), loggers=[]).run()
    written = _cfg(tmp_path / "a").run_dir / "partition.json"
    with pytest.raises(UsageError, match=r"partition.num_clients=5 is not allowed; expected 4, the number of clients"):
        Simulation(
            cfg=_cfg(
                tmp_path / "b", "--partition.scheme", "file", "--partition.path", str(written), "--partition.num_clients", "5"
            ),
            loggers=[],
        ).run()
    bad = tmp_path / "bad.json"
    bad.write_text('{"clients": [[0, 1], [1]]}')
    with pytest.raises(UsageError, match="partition.path: partition file .*bad.json"):
        Simulation(cfg=_cfg(tmp_path / "c", "--partition.scheme", "file", "--partition.path", str(bad)), loggers=[]).run()


def test_sigkill_in_a_short_round_resumes_to_the_uninterrupted_result(tmp_path):
    """The default keeps a short round's records in memory: a SIGKILL mid-round leaves no record and no plan
    of that round on disk, and the resumed run re-runs the round to the uninterrupted result."""
    extra = ("--federation.rounds", "4")
    full = Simulation(cfg=_cfg(tmp_path / "full", *extra), loggers=[]).run()
    cfg = _cfg(tmp_path / "cut", *extra)
    proc = start_train(*tiny_overrides(tmp_path / "cut", *extra))
    kill_after_round_0(proc, cfg)
    assert not (cfg.run_dir / "summary.json").exists()  # killed before the end
    assert not list((cfg.run_dir / "checkpoints").glob("round*/*.pt"))  # the round's records were in memory
    resumed = Simulation(cfg=cfg, loggers=[], resume=True).run()
    assert _comparable(resumed) == _comparable(full)
    for k, v in server_state(cfg).items():
        assert torch.equal(v, server_state(_cfg(tmp_path / "full", *extra))[k])


def test_a_timm_fedavg_run_imports_no_library_it_does_not_use():
    """What `python -m fl_lightning.train` imports for a timm FedAvg run (its config, every discovered method,
    the loop): no diffusers, open_clip, peft or tensorboard, and no scikit-learn (the methods that fit or
    cluster import it where they do). With the CLI's opt-in fast start (FL_LIGHTNING_FAST_START=1) also no
    transformers, scipy or matplotlib: torchmetrics' root package, which would import them, is deferred
    (fl_lightning/experiments/torchmetrics_deferral.py)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    heavy = (
        "'diffusers', 'open_clip', 'peft', 'tensorboard', 'sklearn'",
        "'transformers', 'scipy', 'matplotlib', 'torchmetrics.functional'",
    )
    for fast, names in ((False, heavy[0]), (True, f"{heavy[0]}, {heavy[1]}")):
        code = (
            "import sys; from fl_lightning.experiments.startup import fast_start; "
            f"{'fast_start(); ' if fast else ''}"
            "from fl_lightning.config.loading import load_config; "
            f"load_config({str(CONF / 'fedavg_cnn_digits_tiny.yaml')!r}); "
            "import fl_lightning.federation.simulation, fl_lightning.algorithms.fedavg_cnn, fl_lightning.train; "
            "from fl_lightning.algorithms import available_algorithms; available_algorithms(); "
            f"print(' '.join(sorted(m for m in ({names}) if m in sys.modules)))"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip() == "", (fast, proc.stdout)
