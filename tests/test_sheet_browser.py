"""Contact sheets opened in a real headless Chromium (Debian's ``chromium``, driven by the
playwright package; no browser is downloaded): a caption run's page for a generated clip, a
still's, a page with hostile text, and one cut short by Ctrl-C.

Without chromium on PATH they skip, naming its install command (tests/conftest.py gates every
``browser`` test); under ``CI=true`` they are required and fail instead. CI installs it."""

from __future__ import annotations

import io
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from PIL import Image

import sheet_reader
from ffai.cli import run
from ffai.outputs import sheet, thumbnails
from ffai.outputs.cues import Cue, TrackHeader
from ffai.outputs.tracks import open_track
from sample_media import make_clip

pytestmark = pytest.mark.browser

HOSTILE = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script></p></article><b>bold?</b>'


@pytest.fixture(scope="module")
def browser(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield browser
        browser.close()


@dataclass
class Opened:
    page: object
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions
    requests: list[str] = field(default_factory=list)  # URLs the page loaded
    blocked: list[str] = field(default_factory=list)  # "URL reason" of requests that failed
    dialogs: list[str] = field(default_factory=list)

    def wait_for(self, expression: str, timeout: float = 10.0) -> None:
        """Poll ``expression`` from outside the page: playwright's own wait_for_function evaluates
        a string in the page, which the page's policy (rightly) forbids."""
        deadline = time.monotonic() + timeout
        while not self.page.evaluate(expression):
            assert time.monotonic() < deadline, f"still false after {timeout} s: {expression}"
            time.sleep(0.02)


def open_page(browser, path: Path, **context) -> Opened:
    page = browser.new_context(**context).new_page()
    opened = Opened(page)
    page.on("console", lambda m: opened.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: opened.errors.append(str(e)))
    page.on("requestfinished", lambda r: opened.requests.append(r.url))
    page.on("requestfailed", lambda r: opened.blocked.append(f"{r.url} {r.failure}"))
    page.on("dialog", lambda d: (opened.dialogs.append(d.message), d.dismiss()))
    page.goto(path.as_uri(), wait_until="load")
    opened.wait_for("Array.from(document.images).every(i => i.complete)")
    return opened


def cards(opened: Opened) -> list[dict]:
    return opened.page.evaluate(
        """Array.from(document.querySelectorAll("article.cue")).map(c => ({
            start: parseFloat(c.dataset.start), end: parseFloat(c.dataset.end),
            times: Array.from(c.querySelectorAll("time")).map(t => t.textContent),
            text: c.querySelector("p.text").textContent,
            widths: Array.from(c.querySelectorAll("img")).map(i => i.naturalWidth),
            visible: c.offsetParent !== null}))"""
    )


def not_blank(png: bytes) -> bool:
    image = Image.open(io.BytesIO(png)).convert("RGB")
    return len(image.getcolors(maxcolors=1 << 20) or ()) > 16


@pytest.fixture(scope="module")
def clip_page(tmp_path_factory, tiny_checkpoint):
    """A generated clip captioned to json and to html, the page beside the clip."""
    folder = tmp_path_factory.mktemp("sheet")
    clip = make_clip(folder / "clip.mp4", 6, fps=25, size=(160, 120))
    flags = ["-i", str(clip), "--model", str(tiny_checkpoint), "--fps", "2", "--window", "4", "--max-new-tokens", "6"]
    assert run(["caption", *flags, "-o", str(folder / "clip.json")]) == 0
    assert run(["caption", *flags, "-o", str(folder / "clip.html")]) == 0
    cues = json.loads((folder / "clip.json").read_text(encoding="utf-8"))["cues"]
    return folder / "clip.html", cues


def test_clip_page_loads_with_no_error_and_no_network(browser, clip_page):
    path, cues = clip_page
    opened = open_page(browser, path)
    opened.wait_for("document.querySelector('video').readyState >= 1")  # the video is there
    assert opened.errors == [] and opened.blocked == []
    assert set(opened.requests) == {path.as_uri(), path.with_suffix(".mp4").as_uri()}
    shown = cards(opened)
    assert [(c["start"], c["end"], c["text"]) for c in shown] == [(c["start"], c["end"], c["text"]) for c in cues]
    assert [c["times"] for c in shown] == [
        [sheet.format_timestamp(round(c["start"] * 1000)), sheet.format_timestamp(round(c["end"] * 1000))] for c in cues
    ]
    assert [c["widths"] for c in shown] == [[160] * min(4, len(c["frame_times"])) for c in cues]
    assert not_blank(opened.page.screenshot(full_page=True))


def test_clicking_a_card_seeks_the_video_to_its_cue(browser, clip_page):
    path, cues = clip_page
    opened = open_page(browser, path)
    page = opened.page
    opened.wait_for("document.querySelector('video').readyState >= 1")
    for i in (2, 1):
        page.locator("article.cue").nth(i).click()
        opened.wait_for("!document.querySelector('video').seeking")
        assert page.evaluate("document.querySelector('video').currentTime") == pytest.approx(cues[i]["start"], abs=1e-3)
    assert opened.errors == []


def test_the_filter_hides_cards_whose_caption_lacks_the_text(browser, clip_page):
    path, cues = clip_page
    opened = open_page(browser, path)
    words = [w for c in cues for w in c["text"].split() if len(w) > 1]
    assert words, cues
    query = max(words, key=lambda w: sum(w.lower() in c["text"].lower() for c in cues) < len(cues))
    opened.page.fill("#filter", query.upper())  # case does not matter
    assert [c["visible"] for c in cards(opened)] == [query.lower() in c["text"].lower() for c in cues]
    hits = sum(query.lower() in c["text"].lower() for c in cues)
    assert opened.page.text_content("#shown") == f"{hits} of {len(cues)} cues"
    opened.page.fill("#filter", "")
    assert all(c["visible"] for c in cards(opened))


def test_printing_hides_the_player_and_dark_mode_is_dark(browser, clip_page):
    path, _ = clip_page
    opened = open_page(browser, path, color_scheme="dark")
    page = opened.page
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert sum(map(int, background[background.index("(") + 1 : -1].split(",")[:3])) < 3 * 64, background
    page.emulate_media(media="print")
    assert not page.locator("#player").is_visible() and not page.locator("#filter").is_visible()
    assert page.locator("article.cue").first.is_visible()
    assert len(page.pdf()) > 1000


def test_a_page_without_its_video_still_reads(browser, clip_page, tmp_path):
    path, cues = clip_page
    alone = tmp_path / "alone.html"
    shutil.copy(path, alone)
    opened = open_page(browser, alone)
    opened.wait_for("document.getElementById('player').hidden")
    assert [c["text"] for c in cards(opened)] == [c["text"] for c in cues]
    assert all(w > 0 for c in cards(opened) for w in c["widths"])
    assert all("clip.mp4" in e or "ERR_FILE_NOT_FOUND" in e for e in opened.errors), opened.errors


def test_a_still_page_shows_its_picture(browser, tmp_path, tiny_checkpoint):
    still = tmp_path / "still.png"
    Image.new("RGB", (300, 200), (240, 200, 20)).save(still)
    out = tmp_path / "still.html"
    assert (
        run(["caption", "-i", str(still), "--model", str(tiny_checkpoint), "--max-new-tokens", "5", "-o", str(out)])
        == 0
    )
    opened = open_page(browser, out)
    (card,) = cards(opened)
    assert card["widths"] == [300] and card["times"] == []
    assert opened.page.locator("video").count() == 0
    assert opened.errors == [] and opened.requests == [out.as_uri()]


def write_hostile_page(path: Path) -> str:
    header = TrackHeader(HOSTILE + ".mp4", 2.0, 64, 48, "smolvlm", HOSTILE, 1.0, 2, HOSTILE, 8, None)
    shot = thumbnails.thumbnail(Image.new("RGB", (64, 48), (0, 90, 200)), 0)
    with open_track(str(path), "html", header, overwrite=False) as writer:
        writer.write(Cue(1, 0, 2000, (0, 1000), HOSTILE, thumbnails=(shot,)))
    return path.read_text(encoding="utf-8")


def test_hostile_text_renders_as_text_and_runs_nothing(browser, tmp_path):
    write_hostile_page(tmp_path / "hostile.html")
    opened = open_page(browser, tmp_path / "hostile.html")
    page = opened.page
    assert [c["text"] for c in cards(opened)] == [HOSTILE]
    assert page.evaluate("window.pwned") is None and opened.dialogs == []
    assert page.evaluate("document.scripts.length") == 1 and page.locator("b").count() == 0
    assert page.evaluate("Array.from(document.images).every(i => i.src.startsWith('data:image/jpeg'))")
    assert opened.errors == [] and opened.blocked == []
    assert opened.requests == [(tmp_path / "hostile.html").as_uri()]


def test_the_policy_stops_markup_that_escaping_would_have_missed(browser, tmp_path):
    """Were a caption ever written unescaped, the page's policy still runs none of it."""
    text = write_hostile_page(tmp_path / "hostile.html")
    raw = text.replace('<main id="cues">', f'<main id="cues">{HOSTILE}<img src="https://example.com/x.png">', 1)
    (tmp_path / "raw.html").write_text(raw, encoding="utf-8")
    opened = open_page(browser, tmp_path / "raw.html")
    assert opened.page.evaluate("window.pwned") is None
    assert opened.requests == [(tmp_path / "raw.html").as_uri()]  # neither image was loaded
    assert sorted(opened.blocked) == [
        "file://" + str(tmp_path / "x") + " csp",
        "https://example.com/x.png csp",
    ]
    assert any("Content Security Policy" in e for e in opened.errors)
    assert opened.page.evaluate("document.querySelectorAll('article.cue').length") == 1  # the page's own script ran


def test_a_page_cut_short_by_ctrl_c_loads_with_its_finished_cues(browser, tmp_path, tiny_checkpoint):
    clip = make_clip(tmp_path / "long.mp4", 30, fps=10, size=(64, 48))
    out = tmp_path / "long.html"
    sheet_reader.interrupt_a_page(clip, tiny_checkpoint, out, cues=2)
    opened = open_page(browser, out)
    shown = cards(opened)
    assert 2 <= len(shown) < 60
    assert [c["start"] for c in shown] == [i / 2 for i in range(len(shown))]
    assert all(c["widths"] == [64] for c in shown)
    assert opened.errors == [] and not_blank(opened.page.screenshot())
