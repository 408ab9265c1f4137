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
