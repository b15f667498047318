"""Every figure the READMEs quote comes from a results file, or says which commit it is from.

    python benchmarks/figures.py                 # check README.md and benchmarks/README.md
    python benchmarks/figures.py docs/usage.md   # check other documents

Reads JSON and git only (CI runs it, through tests/test_figures.py). The rules:

- A *generated section* (``<!-- NAME:start -->`` ... ``<!-- NAME:end -->``) must be exactly what
  its script renders from its results file today: every benchmark script that writes one names
  it in its ``SECTIONS`` (name -> a function returning the markdown).
- Any other *figure* (a decimal number, or a whole number with a unit: ``562 s``, ``43 min``,
  ``2.58 GB``, ``78%``) outside code, and outside an assignment such as ``λ = 0.5``, must be a
  value of the results named by the nearest ``<!-- source: PATH[#KEY.KEY] ... -->`` above it
  in its section (rounded as the text rounds it; ``%`` also as a fraction), or stand in a
  paragraph or table row that names the commit it comes from (``at abc1234``, ``commit
  abc1234``).
- *Figures from the current code*: a source or section whose results record a commit C after
  which ``src/`` changed must name C in its text, so that no figure measured on older code
  reads as current.
- ``<!-- not-figures: 3.11 0.5 -->`` lists numbers of a document that are not measurements.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "benchmarks/README.md")

_GENERATED = re.compile(r"<!-- ([\w-]+):start -->\n(.*?)<!-- \1:end -->", re.S)
_SOURCE = re.compile(r"<!-- source: (.*?) -->")
_NOT = re.compile(r"<!-- not-figures: (.*?) -->")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_HEADING = re.compile(r"^#{1,6} ", re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\]\([^)]*\)")
_MARK = re.compile(r"\b(?:at|commit|commits|measured at)\s+([0-9a-f]{7,40})\b")
_HASH = re.compile(r"\b[0-9a-f]{7,40}\b")
# a decimal, or a whole number with a unit; not part of a version (3.11.7), a name or a path
_FIGURE = re.compile(r"(?<![\w.=≤≥<>/])(?<![A-Za-z]-)"
                     r"(\d[\d,]*\.\d+|\d[\d,]*(?=\s?(?:s|min|minutes|GB|MB|GiB|%)\b|%))"
                     r"(?![\w.]*\d)(\s?%)?")


@dataclass(frozen=True)
class Problem:
    document: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.document}:{self.line}: {self.text}"


@cache
def _json(path: str) -> Any:
    return json.loads((ROOT / path).read_text())


def _narrow(data: Any, keys: str) -> Any:
    for key in filter(None, keys.split(".")):
        data = data[int(key)] if isinstance(data, list) else data[key]
    return data


def _leaves(data: Any) -> Iterator[Any]:
    if isinstance(data, dict):
        for v in data.values():
            yield from _leaves(v)
    elif isinstance(data, list):
        for v in data:
            yield from _leaves(v)
    else:
        yield data


def values(data: Any) -> set[float]:
    """Every number in ``data``: numeric leaves, and numbers written inside strings."""
    out: set[float] = set()
    for leaf in _leaves(data):
        if isinstance(leaf, bool) or leaf is None:
            continue
        if isinstance(leaf, int | float):
            out.add(float(leaf))
        elif isinstance(leaf, str):
            out.update(float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*\.?\d*", leaf))
    return out


def commits(data: Any) -> set[str]:
    """The commits a results file records (every ``commit`` field, at any depth)."""
    if isinstance(data, dict):
        found = {data["commit"]} if isinstance(data.get("commit"), str) else set()
        for k, v in data.items():
            if k != "commit":
                found |= commits(v)
        return found
    if isinstance(data, list):
        return set().union(*map(commits, data)) if data else set()
    return set()


@cache
def src_changed_since(commit: str) -> bool:
    """Whether ``src/`` differs between ``commit`` and HEAD (True when git cannot tell)."""
    run = subprocess.run(["git", "diff", "--quiet", commit, "HEAD", "--", "src"], cwd=ROOT,
                         capture_output=True)
    return run.returncode != 0


def has_git() -> bool:
    run = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True)
    return run.returncode == 0


def matches(figure: str, percent: bool, known: set[float]) -> bool:
    value = float(figure.replace(",", ""))
    decimals = len(figure.split(".")[1]) if "." in figure else 0
    scales = (1.0, 100.0) if percent else (1.0,)
    tol = 0.5 * 10 ** -decimals + 1e-9
    return any(abs(abs(x) * s - value) <= tol for x in known for s in scales)


def sections() -> dict[str, Callable[[], str]]:
    """Every generated section's renderer, from the benchmark scripts' ``SECTIONS``."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    found: dict[str, Callable[[], str]] = {}
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        if "SECTIONS" not in script.read_text() or script.name == Path(__file__).name:
            continue
        spec = importlib.util.spec_from_file_location(f"_figures_{script.stem}", script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # (dataclasses look their module up there)
        spec.loader.exec_module(module)
        found |= getattr(module, "SECTIONS", {})
    return found


def _blocks(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of paragraphs and table rows: a mark covers its own block."""
    out, pos = [], 0
    for chunk in re.split(r"(\n\s*\n|\n(?=\|))", text):
        out.append((pos, pos + len(chunk)))
        pos += len(chunk)
    return out


def check_document(name: str, renderers: dict[str, Callable[[], str]] | None = None,
                   git: bool | None = None, text: str | None = None) -> list[Problem]:
    """Every problem with the figures of document ``name`` (its ``text`` if given; sources
    are paths from the repository's root, or absolute). Empty: all found or marked."""
    text = (ROOT / name).read_text() if text is None else text
    git = has_git() if git is None else git
    renderers = sections() if renderers is None else renderers
    line_of = lambda pos: text.count("\n", 0, pos) + 1  # noqa: E731
    problems: list[Problem] = []
    not_figures = {x for m in _NOT.finditer(text) for x in m.group(1).split()}

    def stale(found: set[str], scope: str, pos: int, what: str) -> None:
        named = set(_HASH.findall(scope))
        for c in sorted(found):
            if git and src_changed_since(c) and not any(n.startswith(c) or c.startswith(n)
                                                          for n in named):
                problems.append(Problem(name, line_of(pos), f"{what} records commit {c}, and "
                                        "src/ changed since: say which commit it is from"))

    # generated sections: rendered again from their results, then blanked for the prose pass
    masked = text
    for m in _GENERATED.finditer(text):
        section, body = m.group(1), m.group(2)
        render = renderers.get(section)
        if render is None:
            problems.append(Problem(name, line_of(m.start()), f"section {section}: no benchmark "
                                    "script names it in SECTIONS"))
        else:
            try:
                rendered = render()
            except (OSError, KeyError, TypeError, ValueError) as e:
                rendered = None
                problems.append(Problem(name, line_of(m.start()), f"section {section}: its "
                                        f"results do not render ({type(e).__name__}: {e})"))
            if rendered is not None and rendered.strip() != body.strip():
                problems.append(Problem(name, line_of(m.start()), f"section {section} is not "
                                        "what its results render today: rerun its script"))
        masked = masked[:m.start(2)] + re.sub(r"[^\n]", " ", body) + masked[m.end(2):]
    # prose: split into sections at headings; a source comment covers the rest of its section
    masked = re.sub(r"^( {4}|\t).*$", lambda m: " " * len(m.group(0)), masked, flags=re.M)
    masked = re.sub(r"```.*?```", lambda m: re.sub(r"[^\n]", " ", m.group(0)), masked,
                    flags=re.S)
    heads = [m.start() for m in _HEADING.finditer(masked)] + [len(masked)]
    starts = [0, *heads[:-1]]
    for start, end in zip(starts, heads, strict=True):
        part = masked[start:end]
        sources: list[tuple[int, set[float]]] = []
        for m in _SOURCE.finditer(part):
            known: set[float] = set()
            found: set[str] = set()
            for ref in m.group(1).split():
                path, _, keys = ref.partition("#")
                try:
                    data = _narrow(_json(path), keys)
                except (OSError, KeyError, TypeError, json.JSONDecodeError) as e:
                    problems.append(Problem(name, line_of(start + m.start()),
                                            f"source {ref}: {type(e).__name__} {e}"))
                    continue
                known |= values(data)
                found |= commits(data)
            stale(found, part[m.start():], start + m.start(), f"source {m.group(1)}")
            sources.append((m.start(), known))
        for g in _GENERATED.finditer(text[start:end]):
            render = renderers.get(g.group(1))
            try:
                found = set().union(*(commits(_json(s))
                                      for s in getattr(render, "source_names", ())))
            except (OSError, json.JSONDecodeError):
                continue
            stale(found, text[start:end], start + g.start(), f"section {g.group(1)}")
        plain = _LINK.sub("]", _CODE.sub(lambda m: " " * len(m.group(0)), _COMMENT.sub(
            lambda m: " " * len(m.group(0)), part)))
        blocks = _blocks(plain)
        for m in _FIGURE.finditer(plain):
            figure = m.group(1)
            if figure in not_figures or plain[:m.start()].rstrip()[-1:] in ("=", "≤", "≥", "<",
                                                                            ">", "~", "≈"):
                continue  # (a setting or a bound, not a measurement)
            block = next(plain[a:b] for a, b in blocks if a <= m.start() < b)
            if _MARK.search(block):
                continue
            known = next((k for at, k in reversed(sources) if at <= m.start()), None)
            if known is not None and matches(figure, bool(m.group(2)), known):
                continue
            why = "not in its source" if known is not None else "no source above it"
            problems.append(Problem(name, line_of(start + m.start()),
                                    f"{figure}{(m.group(2) or '').strip()}: {why}, and its "
                                    "paragraph names no commit"))
    return problems


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(DOCUMENTS)
    renderers = sections()
    problems = [p for n in names for p in check_document(n, renderers)]
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s) in {', '.join(names)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
