"""Reads a contact sheet (``-f html``) back with the standard library's HTML parser, independent
of ``ffai.outputs.sheet``'s own markup code: the cards, the header's facts, the video and the policy."""

from __future__ import annotations

import base64
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path


@dataclass
class Card:
    start_ms: int
    end_ms: int
    text: str = ""
    heading: str = ""
    images: list[dict] = field(default_factory=list)  # each <img>'s attributes

    def jpegs(self) -> list[bytes]:
        prefix = "data:image/jpeg;base64,"
        assert all(i["src"].startswith(prefix) for i in self.images), [i["src"][:40] for i in self.images]
        return [base64.b64decode(i["src"][len(prefix) :]) for i in self.images]


@dataclass
class Page:
    cards: list[Card] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)
    video: str | None = None
    policy: str | None = None
    scripts: list[str] = field(default_factory=list)
    title: str = ""


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self._into: str | None = None  # where character data goes now
        self._term = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        page = self.page
        if tag == "article" and "cue" in a.get("class", "").split():
            page.cards.append(Card(round(float(a["data-start"]) * 1000), round(float(a["data-end"]) * 1000)))
        elif tag == "p" and a.get("class") == "text" and page.cards:
            self._into = "text"
        elif tag == "h2" and page.cards:
            self._into = "heading"
        elif tag == "img" and page.cards:
            page.cards[-1].images.append(a)
        elif tag == "video":
            page.video = a.get("src")
        elif tag == "meta" and a.get("http-equiv", "").lower() == "content-security-policy":
            page.policy = a.get("content")
        elif tag == "script":
            self._into = "script"
            page.scripts.append("")
        elif tag in ("dt", "dd", "title"):
            self._into = tag

    def handle_endtag(self, tag: str) -> None:
        if tag in ("p", "h2", "script", "dt", "dd", "title"):
            self._into = None

    def handle_data(self, data: str) -> None:
        page = self.page
        if self._into == "text":
            page.cards[-1].text += data
        elif self._into == "heading":
            page.cards[-1].heading += data
        elif self._into == "script":
            page.scripts[-1] += data
        elif self._into == "dt":
            self._term = data
        elif self._into == "dd":
            page.facts[self._term] = page.facts.get(self._term, "") + data
        elif self._into == "title":
            page.title += data


def read(text: str) -> Page:
    reader = _Reader()
    reader.feed(text)
    reader.close()
    return reader.page


def cards(text: str) -> list[Card]:
    return read(text).cards


def interrupt_a_page(clip: Path, checkpoint: Path, out: Path, cues: int) -> str:
    """Caption ``clip`` to the page ``out`` in a real ``ffai caption`` and send it SIGINT, as a
    terminal's Ctrl-C, once the page on disk holds ``cues`` cards; returns its stderr after
    checking it exited 130."""
    command = [
        sys.executable,
        "-m",
        "ffai",
        "caption",
        "-i",
        clip,
        "--model",
        checkpoint,
        "--fps",
        "2",
        "--window",
        "1",
        "--max-new-tokens",
        "4",
        "--placement",
        "inline",
        "-o",
        out,
    ]
    # A background child inherits SIGINT ignored; a foreground one at a terminal has the default.
    proc = subprocess.Popen(
        list(map(str, command)),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_text(encoding="utf-8").count('<article class="cue"') >= cues:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    return err
