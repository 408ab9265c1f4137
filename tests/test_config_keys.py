"""docs/config_keys.md is what scripts/config_keys.py prints today, and it lists every key the loader knows."""

from __future__ import annotations

import importlib.util
import re

from fl_lightning.algorithms import available_algorithms
from fl_lightning.config.loading import schema_keys
from fl_lightning.federation.algorithm import ALGORITHMS, Algorithm
from tests.conftest import REPO

PAGE = REPO / "docs" / "config_keys.md"


def _script():
    spec = importlib.util.spec_from_file_location("config_keys", REPO / "scripts" / "config_keys.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_page_is_the_scripts_output(monkeypatch):
    """Whatever else is registered: a method from outside the package (a test's, a plug-in's) is not on the page."""
    monkeypatch.setitem(ALGORITHMS, "toy_config_keys", type("Toy", (Algorithm,), {"__module__": __name__}))
    assert "toy_config_keys" in available_algorithms()
    assert PAGE.read_text() == _script().render(), (
        "docs/config_keys.md is stale: python scripts/config_keys.py > docs/config_keys.md"
    )


def test_the_page_lists_every_key_of_every_method_once():
    """Checked against the loader's own list of keys (schema_keys), not the script's walk."""
    page = PAGE.read_text()
    shipped = sorted(n for n, cls in available_algorithms().items() if cls.__module__.startswith("fl_lightning."))
    listed = re.findall(r"^\| `([^`]+)` \|", page, flags=re.M)
    assert sorted(listed) == sorted({key for name in shipped for key in schema_keys(name)})
    assert len(listed) == len(set(listed))
    assert re.findall(r"^## `(\w+)`$", page, flags=re.M) == shipped and len(shipped) >= 15


def test_an_inherited_key_names_the_config_it_comes_from():
    """FedOPAL's config extends AFL's: λ is declared in AFLConfig, μ in FedOPALConfig; FedOPAL+ redeclares restat."""
    rows = {
        m[0]: m[1:] for m in re.findall(r"^\| `([^`]+)` \| `([^`]+)` \| `([^`]+)` \| `(\w+)` \|", PAGE.read_text(), flags=re.M)
    }
    assert rows["fedopal.lam"] == ("float", "1e-06", "AFLConfig")
    assert rows["fedopal.mu"][2] == "FedOPALConfig"
    assert rows["fedopal.restat"][1:] == ("local", "FedOPALConfig")
    assert rows["fedopal_plus.restat"][1:] == ("global", "FedOPALPlusConfig")


def test_every_row_says_what_its_key_is_in_a_sentence_of_its_own():
    """No empty description, and none that continues a neighbour's comment ("... centred 300 m"): a row is read alone."""
    rows = re.findall(r"^\| `([^`]+)` \|.*\| ([^|]*) \|$", PAGE.read_text().replace("\\|", "¦"), flags=re.M)
    assert len(rows) > 300
    empty = [key for key, text in rows if not text.strip()]
    fragment = [key for key, text in rows if re.match(r"\s*(\.\.\.|…|\)|and |or )", text)]
    assert not empty and not fragment, (empty, fragment)
