"""The WebM that ``-o clip.webm`` writes, played in a real headless Chromium (Debian's
``chromium``, driven by playwright; gated like every ``browser`` test in tests/conftest.py).

Chromium reads no text track inside a media file (its in-band text tracks are gone), so the page
gives it the WebVTT that the WebM's own subtitle stream holds, read back with PyAV as a player
that reads in-band tracks gets it, as the video's ``<track>``. The test plays the WebM, seeks to
the second cue and checks that Chromium shows that cue, at its times. The screenshot it takes
becomes ``docs/img/webm-captions.png`` (which the README shows) with ``FFAI_UPDATE_GOLDEN=1``,
as tests/test_tracks.py's golden files do: a plain run leaves the tracked image alone."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import av
import pytest
from PIL import Image

from ffai.cli import run
from media_fixtures import reencode_vp9

pytestmark = pytest.mark.browser

SCREENSHOT = Path(__file__).parent.parent / "docs" / "img" / "webm-captions.png"
UPDATE = os.environ.get("FFAI_UPDATE_GOLDEN") == "1"


def webvtt_of(path: Path) -> tuple[str, list[tuple[float, float, str]]]:
    """The WebVTT document of ``path``'s subtitle stream (packet times, packet text) and its cues."""
    with av.open(str(path)) as container:
        stream = container.streams.subtitles[0]
        assert stream.codec_context.name == "webvtt"
        cues = [
            (float(p.pts * p.time_base), float((p.pts + p.duration) * p.time_base), bytes(p).decode("utf-8"))
            for p in container.demux(stream)
            if p.size
        ]

    def stamp(t: float) -> str:
        ms = round(t * 1000)
        return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"

    return "WEBVTT\n\n" + "".join(f"{stamp(s)} --> {stamp(e)}\n{t}\n\n" for s, e, t in cues), cues


def wait_for(page, expression: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"still false after {timeout} s: {expression}"
        time.sleep(0.05)


def test_webm_plays_in_chromium_with_its_cue_shown_at_its_time(chromium, tmp_path):
    from playwright.sync_api import sync_playwright

    clip = reencode_vp9(Path(__file__).parent.parent / "examples" / "demo_clip.mp4", tmp_path / "demo.webm", 384)
    out = tmp_path / "demo.captioned.webm"
    flags = ["--model", "smolvlm-demo", "--fps", "2", "--window", "6"]
    assert run(["caption", "-i", str(clip), *flags, "-o", str(out)]) == 0
    vtt, cues = webvtt_of(out)
    assert [(s, e) for s, e, _ in cues] == [(0.0, 3.0), (3.0, 6.0), (6.0, 9.0), (9.0, 12.0)]
    # A file:// page may not fetch a track from another file (each is its own origin): the
    # track comes from a blob of the page's own.
    (tmp_path / "page.html").write_text(
        "<!doctype html><style>body{margin:0;background:#000}video{display:block}"
        "video::cue{font:22px sans-serif}</style>"
        f'<video src="{out.name}" muted width="384" height="288">'
        '<track kind="captions" srclang="en" label="ffai" default></video><script>'
        f"document.querySelector('track').src = URL.createObjectURL(new Blob([{json.dumps(vtt)}], "
        "{type: 'text/vtt'}));</script>",
        encoding="utf-8",
    )
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 384, "height": 288})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto((tmp_path / "page.html").as_uri(), wait_until="load")
            video = "document.querySelector('video')"
            wait_for(page, f"{video}.readyState >= 2 && {video}.textTracks[0].cues.length === 4")
            assert page.evaluate(f"[{video}.videoWidth, {video}.videoHeight, {video}.error]") == [384, 288, None]
            page.evaluate(f"{video}.play()")  # it plays: the clock moves through the WebM
            wait_for(page, f"{video}.currentTime > 0.5")
            page.evaluate(f"{video}.pause(); {video}.currentTime = 4.5")
            wait_for(page, f"!{video}.seeking && {video}.textTracks[0].activeCues.length === 1")
            active = page.evaluate(
                f"(() => {{ const c = {video}.textTracks[0].activeCues[0]; "
                "return [c.startTime, c.endTime, c.text, c.track.mode]; })()"
            )
            assert active == [3.0, 6.0, cues[1][2], "showing"]
            png = page.screenshot()
        finally:
            browser.close()
    assert errors == []
    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert image.size == (384, 288) and len(image.getcolors(maxcolors=1 << 20) or ()) > 8
    if UPDATE:  # Chromium's bytes differ from run to run: written only when asked
        SCREENSHOT.parent.mkdir(exist_ok=True)
        SCREENSHOT.write_bytes(png)
