"""Every figure the READMEs quote comes from a results file of this commit's code, or says
which commit it is from (benchmarks/figures.py); and the check itself catches what it must."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def figures():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("figures", ROOT / "benchmarks" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["figures"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("document", ["README.md", "benchmarks/README.md"])
def test_every_quoted_figure_is_found_or_marked(figures, document):
    problems = figures.check_document(document)
    assert not problems, "\n".join(map(str, problems))


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"commit": "0000000", "rows": [{"barrier": 0.6309, "acc": 0.888,
                                                               "note": "took 562 s"}]}))
    return path


def check(figures, text, git=False, renderers=None):
    return [p.text for p in figures.check_document("doc.md", renderers or {}, git, text)]


def test_figures_in_their_source_pass_as_the_text_rounds_them(figures, source):
    text = f"<!-- source: {source} -->\nBarrier 0.631 and 0.63, accuracy 88.8%, in 562 s.\n"
    assert check(figures, text) == []


def test_a_figure_missing_from_its_source_or_unsourced_is_refused(figures, source):
    text = f"<!-- source: {source} -->\nBarrier 0.632.\n\n## Other\n\nSpeed 41.5 s.\n"
    problems = check(figures, text)
    assert len(problems) == 2
    assert "0.632: not in its source" in problems[0]
    assert "41.5: no source above it" in problems[1]


def test_a_paragraph_naming_its_commit_may_quote_what_no_file_holds(figures):
    assert check(figures, "Measured at 1a2b3c4d: 41.5 s.\n\nThen 0.75.\n") == [
        "0.75: no source above it, and its paragraph names no commit"]


def test_code_assignments_and_listed_numbers_are_not_figures(figures):
    text = ("<!-- not-figures: 3.11 -->\nPython 3.11, `--lr 0.01`, λ = 0.5, cut ≤ 0.3,\n\n"
            "    glmc align A B --time-budget 60.5\n")
    assert check(figures, text) == []


def test_a_source_measured_on_older_code_must_name_its_commit(figures, source):
    # 0000000 is no commit of this repository: git cannot tell, so it counts as older code.
    text = f"<!-- source: {source} -->\nBarrier 0.631.\n"
    assert "records commit 0000000" in check(figures, text, git=True)[0]
    assert check(figures, text.replace("Barrier", "At 0000000: barrier"), git=True) == []


def test_a_generated_section_must_be_what_its_results_render(figures):
    text = "<!-- t:start -->\n| a | 0.5 |\n<!-- t:end -->\n"
    assert check(figures, text, renderers={"t": lambda: "| a | 0.5 |"}) == []
    assert "not what its results render" in check(figures, text,
                                                  renderers={"t": lambda: "| a | 0.6 |"})[0]
    assert "no benchmark script names it" in check(figures, text)[0]
