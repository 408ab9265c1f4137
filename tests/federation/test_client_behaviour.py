"""federation.clients (fl_lightning/federation/client_behaviour.py): availability and dropout for any method — the
draws at their rates and seeded per (round, client); the round's clients sampled from those online; a dropout's
download counted, its upload never arriving, counted in metrics.csv and never an error under on_client_error:
raise; too few left stops the run in one line; resumed and on 2 processes the same run; refused beside privacy or a
robust aggregator; the defaults draw nothing (speeds and deadlines: test_client_speeds.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_lightning.config import ClientBehaviourConfig
from fl_lightning.config.loading import load_config
from fl_lightning.errors import ConfigError, TooFewClients, UsageError
from fl_lightning.federation.client_behaviour import ClientBehaviour
from fl_lightning.federation.policies.availability import Availability
from fl_lightning.federation.policies.dropout import Dropout
from fl_lightning.federation.ranks.placement import clients_per_round
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from tests.conftest import CONF, StopAfterClients
from tests.run_records import metrics_rows
from tests.tiny_runs import assert_refused_in_one_line, one_and_two_processes, tiny_config


def test_the_draws_have_their_rates_and_depend_only_on_seed_round_and_client():
    b = ClientBehaviour.of(ClientBehaviourConfig(availability=0.3, dropout=0.2, seed=5))
    online = b.online(10_000, round_idx=3)
    assert abs(len(online) - 3_000) < 3 * np.sqrt(10_000 * 0.3 * 0.7)
    drops = sum(b.drops(3, c) for c in range(10_000))
    assert abs(drops - 2_000) < 3 * np.sqrt(10_000 * 0.2 * 0.8)
    assert online == b.online(10_000, 3) and online != b.online(10_000, 4)
    other = ClientBehaviour.of(ClientBehaviourConfig(availability=0.3, dropout=0.2, seed=6))
    assert online != other.online(10_000, 3)
    assert ClientBehaviour.of(ClientBehaviourConfig()) is None  # the defaults: nothing drawn, runs as before


def test_the_rounds_clients_are_sampled_from_those_online():
    b = ClientBehaviour.of(ClientBehaviourConfig(availability=0.5, seed=1))
    for r in range(20):
        online, chosen = b.online(40, r), b.sample(40, 0.25, seed=0, round_idx=r)
        assert set(chosen) <= set(online) and chosen == sorted(chosen)
        assert len(chosen) == min(clients_per_round(40, 0.25), len(online))
    few = ClientBehaviour.of(ClientBehaviourConfig(availability=0.1, seed=1))
    assert few.sample(10, 1.0, seed=0, round_idx=0) == few.online(10, 0)  # fewer online than asked: all of them


def _cfg(tmp_path, *extra):
    return tiny_config(tmp_path, *extra, rounds=4, clients=8)


def test_a_dropout_downloads_uploads_nothing_and_is_no_error(tmp_path):
    cfg = _cfg(
        tmp_path,
        "--federation.clients.dropout",
        "0.4",
        "--federation.clients.availability",
        "0.8",
        "--federation.client_fraction",
        "0.5",
    )
    summary = Simulation(cfg=cfg, loggers=[]).run()  # on_client_error: raise (the default), yet it runs through
    b = ClientBehaviour.of(cfg.federation.clients)
    per_upload = per_download = None
    for r, row in enumerate(metrics_rows(cfg)):
        chosen = b.sample(8, 0.5, seed=0, round_idx=r)
        dropped = [c for c in chosen if b.drops(r, c)]
        assert int(row["clients"]) == len(chosen) and int(row["dropped"]) == int(row["failed"]) == len(dropped)
        kept = len(chosen) - len(dropped)
        per_upload = per_upload or (int(row["bytes_up_round"]) // kept if kept else None)
        per_download = per_download or int(row["bytes_down_round"]) // len(chosen)
        assert int(row["bytes_down_round"]) == per_download * len(chosen)  # a dropout's download counts
        assert per_upload is None or int(row["bytes_up_round"]) == per_upload * kept  # its upload never comes
    assert sum(int(row["dropped"]) for row in metrics_rows(cfg)) > 0
    assert any("dropped out" in reason for reason in summary["failed_clients"].values())


def test_too_few_clients_left_stops_the_run_in_one_line(tmp_path):
    cfg = _cfg(tmp_path, "--federation.clients.dropout", "0.5", "--federation.min_clients", "8")
    with pytest.raises(TooFewClients) as err:
        Simulation(cfg=cfg, loggers=[]).run()
    assert "fewer than federation.min_clients=8" in str(err.value) and "dropped out" in str(err.value)
    assert "\n" not in str(err.value)


def test_with_min_clients_0_a_round_that_no_update_reached_keeps_the_state_and_the_run_goes_on(tmp_path):
    # FedAdam's moments would move the head on an empty round if the server stepped (Δ = 0, m ≠ 0): it must not
    cfg = _cfg(
        tmp_path / "run",
        "--federation.clients.dropout",
        "0.7",
        "--federation.client_fraction",
        "0.25",
        "--federation.min_clients",
        "0",
        "--federation.rounds",
        "6",
        "--federation.server_optimizer.name",
        "fedadam",
    )
    Simulation(cfg=cfg, loggers=[]).run()
    rows = metrics_rows(cfg)
    empty = [r for r, row in enumerate(rows) if row["failed"] == row["clients"]]
    assert len(rows) == 6 and empty and len(empty) < 6, empty  # both kinds of round in this draw
    for r in empty:  # the state stands: the same evaluation as the round before (round 0: the initial head)
        if r > 0:
            assert (rows[r]["accuracy"], rows[r]["loss"]) == (rows[r - 1]["accuracy"], rows[r - 1]["loss"])
    assert any(rows[r]["accuracy"] != rows[r - 1]["accuracy"] for r in range(1, 6) if r not in empty)
    with pytest.raises(UsageError, match="federation.min_clients=0 needs a method whose state is the mean"):
        Simulation(
            cfg=load_config(
                CONF / "fedcgs_digits_tiny.yaml", ["--output_dir", str(tmp_path / "cgs"), "--federation.min_clients", "0"]
            ),
            loggers=[],
        )


def test_a_resumed_run_drops_the_same_clients_and_the_same_late_ones(tmp_path):
    extra = (
        "--federation.clients.dropout",
        "0.3",
        "--federation.clients.availability",
        "0.7",
        "--federation.clients.speed_spread",
        "0.5",
        "--federation.clients.deadline_s",
        "4",
    )
    full = _cfg(tmp_path / "full", *extra)
    Simulation(cfg=full, loggers=[]).run()
    cut = _cfg(tmp_path / "cut", *extra)
    with pytest.raises(KeyboardInterrupt):
        Simulation(cfg=cut, loggers=[], callbacks=[StopAfterClients(9)]).run()
    Simulation(cfg=cut, loggers=[], resume=True).run()

    def counts(cfg):  # the clocks (…_s, straggler_ratio) differ from run to run
        return [
            {k: v for k, v in r.items() if not (k.endswith("_s") or "_s_" in k or k == "straggler_ratio")}
            for r in metrics_rows(cfg)
        ]

    assert counts(full) == counts(cut) and sum(int(r["dropped"]) for r in metrics_rows(full)) > 0
    assert sum(int(r["late"]) for r in metrics_rows(full)) > 0
    a, b = (safe_load(c.run_dir / "checkpoints" / "server.pt")["state"] for c in (full, cut))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--federation.privacy.mechanism", "dp_fedavg", "--federation.privacy.epsilon", "4"], "accountant's sampling"),
        (["--federation.aggregator.name", "median"], "assumes n uploads a round"),
    ],
)
def test_beside_privacy_or_a_robust_aggregator_it_is_refused_in_one_line(tmp_path, extra, words):
    assert_refused_in_one_line(
        lambda: _cfg(tmp_path, "--federation.clients.dropout", "0.1", *extra), words, "federation.clients.dropout=0.1"
    )


@pytest.mark.slow  # processes or several runs: in CI's every-file pass, not the plain suite
@pytest.mark.parametrize("late", ["drop", "stale"])
def test_availability_dropout_stragglers_and_deadline_are_the_same_on_one_and_two_processes(tmp_path, late):
    one, two = one_and_two_processes(
        tmp_path,
        "--federation.clients.availability",
        "0.7",
        "--federation.clients.dropout",
        "0.3",
        "--federation.clients.stragglers",
        "0.5",
        "--train.epochs",
        "3",
        "--federation.clients.speed_spread",
        "0.5",
        "--federation.clients.deadline_s",
        "4",
        "--federation.clients.late",
        late,
        run_name="r",
        rounds=3,
        clients=6,
        samples=400,
    )
    assert all(torch.equal(one["state"][k], two["state"][k]) for k in one["state"])
    assert [r["dropped"] for r in one["rows"]] == [r["dropped"] for r in two["rows"]]
    assert [r["stragglers"] for r in one["rows"]] == [r["stragglers"] for r in two["rows"]]
    assert [r["late"] for r in one["rows"]] == [r["late"] for r in two["rows"]] and sum(r["late"] for r in one["rows"])
    if late == "stale":  # the late updates of rounds 0 and 1 that arrive by round 2, held by either rank
        assert [r["arrived"] for r in one["rows"]] == [r["arrived"] for r in two["rows"]]
        assert sum(r["arrived"] for r in one["rows"])


# ------------------------------------------------------------------------------------------- stragglers
def test_a_straggler_runs_a_uniform_share_of_its_epochs():
    b = ClientBehaviour.of(ClientBehaviourConfig(stragglers=0.3, seed=2))
    assert b is not None and type(b.availability) is Availability and type(b.dropout) is Dropout
    work = [b.local_work(5, c, epochs=4) for c in range(10_000)]
    late = [w for w in work if w is not None]
    assert abs(len(late) - 3_000) < 3 * np.sqrt(10_000 * 0.3 * 0.7)
    counts = np.bincount([round(w * 4) for w in late], minlength=5)
    assert counts[0] == 0 and all(abs(n - len(late) / 4) < 4 * np.sqrt(len(late) / 4) for n in counts[1:])
    assert work == [b.local_work(5, c, epochs=4) for c in range(10_000)]  # (seed, round, client) only
    assert work != [b.local_work(6, c, epochs=4) for c in range(10_000)]


def test_fit_local_runs_the_stragglers_share_of_its_epochs(one_thread):
    from lightning.fabric import Fabric
    from lightning.pytorch import LightningModule
    from torch.utils.data import DataLoader, TensorDataset

    from fl_lightning.federation.local_training import fit_local, local_work

    class Tiny(LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return ((self.w(x) - y) ** 2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    fabric = Fabric(accelerator="cpu", devices=1)
    loader = DataLoader(TensorDataset(torch.randn(12, 2), torch.randn(12, 1)), batch_size=4)  # 3 batches
    assert fit_local(fabric, Tiny(), loader, epochs=5).steps == 15
    with local_work(2 / 5):
        assert fit_local(fabric, Tiny(), loader, epochs=5).steps == 6
        assert fit_local(fabric, Tiny(), loader, epochs=2).steps == 3  # another loop: its share, at least one pass
        assert fit_local(fabric, Tiny(), loader, epochs=0).steps == 0
    assert fit_local(fabric, Tiny(), loader, epochs=5).steps == 15  # only inside the block


@pytest.mark.parametrize("drop", [False, True], ids=["partial work", "dropped at the deadline"])
def test_stragglers_in_the_engine(drop, tmp_path):
    """FedProx's systems heterogeneity: the round's stragglers counted in metrics.csv as drawn; dropped ones are
    failures that are no error (on_client_error: raise), partial ones upload and change the result."""
    extra = ["--federation.clients.stragglers", "0.5", "--train.epochs", "3"]
    cfg = _cfg(tmp_path / "late", *extra, *(["--federation.clients.drop_stragglers", "true"] if drop else []))
    Simulation(cfg=cfg, loggers=[]).run()
    b = ClientBehaviour.of(cfg.federation.clients)
    rows = metrics_rows(cfg)
    for r, row in enumerate(rows):
        late = [c for c in range(8) if b.straggles(r, c)]
        assert int(row["stragglers"]) == len(late)
        assert int(row["failed"]) == int(row["dropped"]) == (len(late) if drop else 0)
    assert sum(int(row["stragglers"]) for row in rows) > 0
    on_time = _cfg(tmp_path / "on_time", "--train.epochs", "3")
    Simulation(cfg=on_time, loggers=[]).run()
    a, c = (safe_load(x.run_dir / "checkpoints" / "server.pt")["state"] for x in (cfg, on_time))
    assert any(not torch.equal(a[k], c[k]) for k in a)
    assert "stragglers" not in metrics_rows(on_time)[0]  # no behaviour asked: the columns of before


def test_dropped_stragglers_beside_privacy_are_refused_partial_ones_are_not(tmp_path):
    dp = ["--federation.privacy.mechanism", "dp_fedavg", "--federation.privacy.epsilon", "4"]
    with pytest.raises(UsageError, match=r"federation.clients.drop_stragglers=True with federation.privacy"):
        Simulation(
            cfg=_cfg(tmp_path, "--federation.clients.stragglers", "0.2", "--federation.clients.drop_stragglers", "true", *dp),
            loggers=[],
        )
    Simulation(cfg=_cfg(tmp_path, "--federation.clients.stragglers", "0.2", *dp), loggers=[])  # accepted
    with pytest.raises(
        ConfigError,
        match=r"drop_stragglers=True is not allowed.*only with federation.clients."
        r"stragglers > 0",
    ):
        _cfg(tmp_path, "--federation.clients.drop_stragglers", "true")


# ------------------------------------------------------------------------------------------- availability traces
_TRACE = np.array([[1, 0, 1, 0, 1, 1, 0, 0], [0, 1, 0, 1, 0, 0, 1, 1], [1, 1, 1, 1, 0, 0, 0, 0]], dtype=bool)


def _write_trace(path, trace=_TRACE):
    path.write_text(
        "# round 0, 1, 2; one column per client\n" + "".join(",".join(str(int(v)) for v in row) + "\n" for row in trace)
    )
    return path


class _RoundClients:
    def __init__(self):
        self.clients = []

    def on_round_start(self, round_idx, clients, **_):
        self.clients.append(list(clients))


def test_a_trace_is_read_as_text_or_npy_and_repeats_over_the_rounds(tmp_path):
    from fl_lightning.federation.availability_trace import read_availability_trace

    np.save(tmp_path / "t.npy", _TRACE.astype(np.int8))
    (tmp_path / "t.txt").write_text("\n".join(" ".join(str(int(v)) for v in row) for row in _TRACE))
    for file in (_write_trace(tmp_path / "t.csv"), tmp_path / "t.npy", tmp_path / "t.txt"):
        assert np.array_equal(read_availability_trace(file, 8), _TRACE)
    b = ClientBehaviour.of(ClientBehaviourConfig(availability_trace=str(tmp_path / "t.csv")), 8)
    assert [b.online(8, r) for r in (0, 1, 2, 3, 5)] == [[0, 2, 4, 5], [1, 3, 6, 7], [0, 1, 2, 3], [0, 2, 4, 5], [0, 1, 2, 3]]
    assert set(b.sample(8, 0.25, seed=0, round_idx=1)) <= {1, 3, 6, 7}


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "there is no file at that path"),
        ("1,0,1\n0,1,1\n", "8 columns (partition.num_clients); it has 3"),
        ("1,0,1,0,1,1,0,0\n1,0,0.5,0,1,1,0,0\n", "row 2, column 3 holds"),
        ("1,0,1,0,1,1,0,0\n1,0\n", "it could not be read"),
        ("# nothing\n", "it has shape"),
    ],
)
def test_a_bad_trace_is_one_line_naming_its_key_before_anything_runs(tmp_path, content, words):
    trace = tmp_path / "trace.csv"
    if content is not None:
        trace.write_text(content)
    with pytest.raises(ConfigError) as err:
        Simulation(cfg=_cfg(tmp_path, "--federation.clients.availability_trace", str(trace)), loggers=[])
    assert err.value.key == "federation.clients.availability_trace" and words in str(err.value)
    assert "\n" not in str(err.value) and not (tmp_path / "fedavg_digits_tiny").exists()
    with pytest.raises(ConfigError, match="availability_trace"):
        ClientBehaviourConfig(availability=0.5, availability_trace=str(trace))  # the trace says who is online


def test_the_rounds_clients_are_those_the_trace_has_online(tmp_path):
    trace = _write_trace(tmp_path / "trace.csv")
    cfg = _cfg(tmp_path, "--federation.clients.availability_trace", str(trace))
    seen = _RoundClients()
    Simulation(cfg=cfg, loggers=[], callbacks=[seen]).run()
    assert seen.clients == [[0, 2, 4, 5], [1, 3, 6, 7], [0, 1, 2, 3], [0, 2, 4, 5]]  # round 3 reads row 0 again
    assert [row["online"] for row in metrics_rows(cfg)] == ["4", "4", "4", "4"]
    assert (cfg.run_dir / "availability_trace.csv").read_text().splitlines()[1] == "0,1,0,1,0,0,1,1"


def test_a_resumed_run_whose_trace_changed_is_refused_in_one_line(tmp_path):
    trace = _write_trace(tmp_path / "trace.csv")
    full = _cfg(tmp_path / "full", "--federation.clients.availability_trace", str(trace))
    Simulation(cfg=full, loggers=[]).run()
    cut = _cfg(tmp_path / "cut", "--federation.clients.availability_trace", str(trace))
    with pytest.raises(KeyboardInterrupt):
        Simulation(cfg=cut, loggers=[], callbacks=[StopAfterClients(6)]).run()
    _write_trace(trace, ~_TRACE)
    with pytest.raises(UsageError) as err:
        Simulation(cfg=cut, loggers=[], resume=True).run()
    assert "is not the trace this run started with" in str(err.value) and "\n" not in str(err.value)
    _write_trace(trace)
    Simulation(cfg=cut, loggers=[], resume=True).run()
    a, b = (safe_load(c.run_dir / "checkpoints" / "server.pt")["state"] for c in (full, cut))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # processes: in CI's every-file pass, not the plain suite
def test_a_trace_is_the_same_on_one_and_two_processes(tmp_path):
    trace = _write_trace(tmp_path / "trace.csv", _TRACE[:, :6])

    one, two = one_and_two_processes(
        tmp_path,
        "--federation.clients.availability_trace",
        str(trace),
        "--federation.client_fraction",
        "0.5",
        run_name="r",
        rounds=3,
        clients=6,
        samples=400,
    )
    assert all(torch.equal(one["state"][k], two["state"][k]) for k in one["state"])
    assert [r["online"] for r in one["rows"]] == [r["online"] for r in two["rows"]] == [4, 2, 4]
