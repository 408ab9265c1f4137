"""The update policies (fl_lightning/federation/policies): the one order the engine applies them in, as
docs/policies.md writes it; the combinations refused in one line; the methods' own averages_weights declarations;
each policy's state in server.pt; and the final states of a fixed set of tiny runs over every policy and their
combinations, recorded before the engine was restructured (scripts/policy_golden.py; bit for bit on the machine
that recorded them, to a tolerance here, where the CPU's kernels may differ)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fl_lightning.algorithms import available_algorithms
from fl_lightning.config.loading import load_config
from fl_lightning.errors import UsageError
from fl_lightning.federation.algorithm import averages_weights
from fl_lightning.federation.policies.order import CLIENT_ORDER, SERVER_ORDER, UPLOADS_ORDER, PolicyChain, check_policies
from fl_lightning.federation.policies.policy import KINDS, RoundContext, UpdatePolicy
from fl_lightning.federation.run_state import RunState
from fl_lightning.federation.transport import Upload
from tests.conftest import CONF, REPO


class _Recorder(UpdatePolicy):
    """A policy that writes down each hook it is called in, and passes everything on."""

    def __init__(self, kind: str, log: list[tuple[str, str]]) -> None:
        self.kind_name, self.log = kind, log

    def on_upload(self, upload, downloaded, round_idx, client):
        self.log.append(("upload", self.kind_name))
        return upload

    def on_uploads(self, uploads, ctx):
        self.log.append(("uploads", self.kind_name))
        return uploads

    def on_aggregate(self, aggregate, ctx, state):
        self.log.append(("aggregate", self.kind_name))
        return aggregate, {"n": torch.tensor(len(state))} if self.kind_name == "server_optimizer" else dict(state)


def _documented_order() -> list[str]:
    """The numbered steps of docs/policies.md's "The order" section: each step's kind, in order."""
    text = (REPO / "docs" / "policies.md").read_text()
    section = text.split("## The order", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\d+\. `(\w+)`", section, flags=re.M)


def test_the_chain_applies_every_kind_in_the_written_order():
    log: list[tuple[str, str]] = []
    chain = PolicyChain({kind: _Recorder(kind, log) for kind in reversed(list(KINDS))})  # given in any order
    ctx = RoundContext(0, {}, {})
    chain.on_upload(Upload({}, {}), {}, 0, 0)
    chain.on_uploads({}, ctx)
    _, states = chain.on_aggregate({}, ctx, {})
    assert log == [
        *(("upload", k) for k in CLIENT_ORDER),
        *(("uploads", k) for k in UPLOADS_ORDER),
        *(("aggregate", k) for k in SERVER_ORDER),
    ]
    assert list(states) == ["server_optimizer"]  # a policy with an empty state keeps none
    assert _documented_order() == [*CLIENT_ORDER, *UPLOADS_ORDER, "aggregate", *SERVER_ORDER]


def _cfg(tmp_path, *extra: str):
    return load_config(CONF / "fedavg_digits_tiny.yaml", ["--output_dir", str(tmp_path), *extra])


DP = ("--federation.privacy.mechanism", "dp_fedavg", "--federation.privacy.epsilon", "10", "--federation.privacy.delta", "0.1")


@pytest.mark.parametrize(
    "extra, words",
    [
        (("--algorithm", "afl", "--federation.server_optimizer.name", "fedadam"), "needs a method whose state is the mean"),
        (("--algorithm", "fedcgs", "--federation.aggregator.name", "median"), "does not declare averages_weights"),
        (("--algorithm", "afl", "--federation.attack.kind", "sign_flip"), "federation.attack.kind=sign_flip needs"),
        (("--algorithm", "afl", "--federation.min_clients", "0"), "federation.min_clients=0 needs"),
        (("--federation.aggregator.name", "median", *DP), "mean's sensitivity"),
        (("--federation.server_optimizer.name", "fedadamm"), "did you mean 'fedadam'"),
        (("--federation.aggregator.name", "krumm"), "did you mean 'krum'"),
        (("--federation.server_optimizer.name", "fedavgm", "--federation.server_optimizer.tau", "0.1"), "fedavgm has no tau"),
        (("--federation.aggregator.name", "bulyan", "--federation.aggregator.num_malicious", "1"), "n >= 4f + 3 = 7"),
    ],
)
def test_what_cannot_be_composed_is_refused_in_one_line(tmp_path, extra, words):
    cfg = _cfg(tmp_path, *extra)
    with pytest.raises(UsageError) as err:
        check_policies(cfg, available_algorithms()[cfg.algorithm])
    assert words in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_the_refusal_names_the_averaging_methods_from_the_registry(tmp_path):
    cfg = _cfg(tmp_path, "--algorithm", "afl", "--federation.server_optimizer.name", "fedyogi")
    with pytest.raises(UsageError) as err:
        check_policies(cfg, available_algorithms()["afl"])
    named = re.search(r"\(([^)]*)\); afl", str(err.value)).group(1).split(", ")
    assert {"fedavg", "fedprox", "fedavg_cnn", "fedavg_prompts"} <= set(named)
    assert all(averages_weights(available_algorithms()[n]) for n in named)


def test_a_method_declares_averages_weights_itself_and_a_subclass_does_not_inherit_it():
    package = {n: a for n, a in available_algorithms().items() if a.__module__.startswith("fl_lightning.")}
    assert {n for n, a in package.items() if averages_weights(a)} == {"fedavg", "fedprox", "fedavg_cnn", "fedavg_prompts"}
    page = " ".join((REPO / "docs" / "policies.md").read_text().split())
    listed = re.search(r"The package's averaging methods are (.*?)\.", page).group(1).replace(" and ", ", ")
    assert set(re.findall(r"`(\w+)`", listed)) == {n for n, a in package.items() if averages_weights(a)}
    dense = package["dense"]
    assert issubclass(dense, package["fedavg_cnn"]) and dense.averages_weights is True and not averages_weights(dense)


def test_each_policys_state_is_saved_under_its_kind_and_read_back():
    held = {"server_optimizer": {"m/w": torch.arange(3.0)}, "aggregator": {"seen": torch.ones(2)}}
    saved = RunState(state={"w": torch.zeros(3)}, completed_rounds=2, policies=held).state_dict()
    assert torch.equal(saved["server_optimizer"]["m/w"], torch.arange(3.0))  # where server.pt always kept the moments
    back = RunState.from_state_dict(saved)
    assert back.policies.keys() == held.keys()
    assert all(torch.equal(back.policies[k][n], held[k][n]) for k in held for n in held[k])
    assert not {*KINDS} & set(RunState(state={"w": torch.zeros(3)}).state_dict())  # no state: no key


@pytest.mark.slow
def test_the_final_states_recorded_before_the_restructuring_hold(tmp_path):
    """scripts/policy_golden.py's eight runs against tests/federation/fixtures/policy_golden.pt (recorded at
    3859559, before the policies; equal by torch.equal on that machine)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("policy_golden", REPO / "scripts" / "policy_golden.py")
    golden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(golden)
    recorded = torch.load(Path(__file__).parent / "fixtures" / "policy_golden.pt", weights_only=True)
    assert set(recorded) == set(golden.RUNS)
    for i, name in enumerate(golden.RUNS):
        now = golden.final_state(name, tmp_path / str(i))
        assert now.keys() == recorded[name].keys(), name
        for part in now:
            assert now[part].keys() == recorded[name][part].keys(), (name, part)
            for key, value in now[part].items():
                torch.testing.assert_close(value, recorded[name][part][key], rtol=1e-4, atol=1e-5, msg=f"{name}: {part}/{key}")
