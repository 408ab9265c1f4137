"""The README is a front door: short, its two set-up commands in the form CI reads, no lab notebook (dates of
runs, machines, sessions), and every command it shows is one the CLI accepts."""

import re

from tests.conftest import REPO

README = (REPO / "README.md").read_text()
_DIARY = re.compile(
    r"\b(today|yesterday|this session|this work|session|lent|final code|final runs|the hour|"
    r"earlier|last night|this morning|we tried|TODO)\b",
    re.IGNORECASE,
)


def test_the_readme_is_at_most_200_lines():
    assert len(README.splitlines()) <= 200


def test_the_readme_reads_as_no_diary():
    assert not [m.group(0) for m in _DIARY.finditer(README)]


def test_the_set_up_commands_are_the_lines_ci_runs():
    lines = README.splitlines()
    assert re.fullmatch(r"pip install .* -e \. && python -m fl_lightning\.train --config conf/quickstart\.yaml", lines[3])
    assert re.fullmatch(r"pip install .*&& python -m pytest", lines[4])  # .ci/run greps this form


def test_every_config_the_readme_names_exists():
    named = set(re.findall(r"conf/[\w.-]+\.yaml", README))
    assert named and not [n for n in named if not (REPO / n).is_file()]


def _documentation_list() -> list[tuple[list[str], str]]:
    """(the docs an entry of the README's Documentation list links, what the entry says they hold)."""
    section = README[README.index("## Documentation") :]
    entries = []
    for item in re.split(r"\n\* ", section)[1:]:
        item = item.split("\n\n")[0]
        pages = re.findall(r"\]\((docs/[\w.-]+\.md)\)", item)
        entries.append((pages, item.split(" — ", 1)[1] if " — " in item else ""))
    return entries


def test_the_documentation_list_holds_what_it_promises():
    """A front-door check: each key, command or file the README says a page covers (its `code` terms) is on that
    page, and the paper pages it says carry results do carry the registry's tables."""
    entries = _documentation_list()
    assert len(entries) >= 12
    promised = [(page, term) for pages, text in entries for term in re.findall(r"`([^`]+)`", text) for page in pages]
    assert len(promised) >= 15
    missing = [f"{page}: {term}" for page, term in promised if term not in (REPO / page).read_text()]
    assert not missing, missing
    for page in ("docs/fedopal.md", "docs/fedisyn.md"):
        assert "<!-- results: " in (REPO / page).read_text(), page
