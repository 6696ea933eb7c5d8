"""The contact sheet (``-f html``, ``ffai sheet``) without a browser: thumbnails and their
bounds, the page's escaping and policy, the page written by a caption run, one cut short by
Ctrl-C, and ``ffai sheet`` from a JSON track. tests/test_sheet_browser.py opens pages in
Chromium."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

import sheet_reader
from ffai import media
from ffai.cli import run
from ffai.outputs import sheet, thumbnails
from ffai.outputs.cues import Cue, TrackHeader
from ffai.outputs.tracks import open_track, read_json_track
from sample_media import make_clip

HOSTILE = '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script> & </p></article>'


def caption(*args: object) -> None:
    code = run(["caption", *map(str, args)])
    assert code == 0


def one_error_line(err: str, fragment: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ffai: error:"), err
    assert fragment in lines[0], err


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return make_clip(tmp_path_factory.mktemp("media") / "clip.mp4", 6, fps=25, size=(96, 64))


@pytest.fixture(scope="module")
def tracks(clip, tiny_checkpoint, tmp_path_factory):
    """The clip captioned once to json and once to html, beside it (same folder: the page's video
    is a plain relative name)."""
    common = ("-i", clip, "--model", tiny_checkpoint, "--fps", 2, "--window", 5, "--max-new-tokens", 6)
    caption(*common, "-o", clip.with_suffix(".json"))
    caption(*common, "-o", clip.with_suffix(".html"))
    return clip.with_suffix(".json"), clip.with_suffix(".html")


# --- thumbnails -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "count, picked",
    [(1, (0,)), (3, (0, 1, 2)), (4, (0, 1, 2, 3)), (5, (0, 1, 3, 4)), (8, (0, 2, 5, 7)), (16, (0, 5, 10, 15))],
)
def test_thumbnails_are_spread_over_the_window(count, picked):
    assert thumbnails.thumbnail_indices(count) == picked


def _noise(size: tuple[int, int], seed: int = 0) -> Image.Image:
    """The worst case for JPEG: no two neighbouring pixels alike."""
    return Image.frombytes("RGB", size, random.Random(seed).randbytes(size[0] * size[1] * 3))


@pytest.mark.parametrize("size", [(1280, 720), (720, 1280), (200, 113), (3000, 40), (64, 48)])
def test_a_thumbnail_fits_its_square_and_its_byte_budget(size):
    thumb = thumbnails.thumbnail(_noise(size), 1234)
    picture = Image.open(io.BytesIO(thumb.jpeg))
    assert picture.format == "JPEG" and picture.size == (thumb.width, thumb.height)
    assert max(picture.size) <= thumbnails.THUMB_SIDE and len(thumb.jpeg) <= thumbnails.THUMB_MAX_BYTES
    assert thumb.time_ms == 1234
    if max(size) <= thumbnails.THUMB_SIDE and size != (200, 113):  # small frames are never enlarged
        assert picture.size == size
    if size == (1280, 720):  # a landscape frame keeps its shape, THUMB_SIDE wide
        assert picture.size == (200, 113)


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "I;16", "F", "CMYK", "L", "1"])
def test_a_thumbnail_of_a_still_in_any_mode(mode):
    image = Image.new("RGBA", (300, 200), (255, 0, 0, 0)).convert(mode) if mode in ("RGBA", "LA") else None
    if image is None:
        image = Image.new("RGB", (300, 200), (10, 120, 240)).convert(mode)
    thumb = thumbnails.still_thumbnail(image)
    picture = Image.open(io.BytesIO(thumb.jpeg)).convert("RGB")
    assert picture.size == (300, 200)  # under STILL_SIDE: kept
    if mode in ("RGBA", "LA"):  # transparent: shown over white, as the engine composites it
        assert min(picture.getpixel((150, 100))) > 240


def test_page_size_for_ten_minutes_at_fps_2_window_8_stays_a_few_mb():
    """150 cues of 8 frames, 4 thumbnails each of noise at thumbnail size (no downscaling to
    smooth it: every thumbnail at its byte budget), and long captions: the module's bound,
    whatever the clip shows."""
    frames = [media.Frame(t / 2, _noise((200, 113), seed=t)) for t in range(8)]
    thumbs = thumbnails.window_thumbnails(frames)
    assert len(thumbs) == 4 and all(len(t.jpeg) > 0.8 * thumbnails.THUMB_MAX_BYTES for t in thumbs)
    cues = [
        Cue(i + 1, i * 4000, (i + 1) * 4000, tuple(range(i * 4000, i * 4000 + 4000, 500)), "w" * 200, thumbnails=thumbs)
        for i in range(150)
    ]
    header = TrackHeader("clip.mp4", 600.0, 640, 360, "smolvlm", "m", 2.0, 8, None, 64, None)
    page = sheet.page(header, cues, video="clip.mp4").encode("utf-8")
    per_cue = (len(page) - len(sheet.page(header, [], video="clip.mp4").encode("utf-8"))) / 150
    assert per_cue <= 4 * 4 / 3 * thumbnails.THUMB_MAX_BYTES + 1000
    assert len(page) < 4_500_000, f"{len(page)} bytes, {per_cue:.0f} per cue"


# --- the page ---------------------------------------------------------------------------


def hostile_page(tmp_path: Path) -> tuple[Path, list[Cue]]:
    header = TrackHeader(
        source_path=str(tmp_path / f"{HOSTILE}.mp4"),
        duration=4.0,
        width=64,
        height=48,
        engine="smolvlm",
        model=HOSTILE,
        fps=1.0,
        window=2,
        prompt=HOSTILE,
        max_new_tokens=8,
        seed=None,
        temperature=0.0,
        created="2026-01-01T00:00:00+00:00",
    )
    image = Image.new("RGB", (64, 48), (200, 40, 40))
    shots = (thumbnails.thumbnail(image, 0), thumbnails.thumbnail(image, 1000))
    cues = [
        Cue(1, 0, 2000, (0, 1000), HOSTILE, thumbnails=shots),
        Cue(2, 2000, 4000, (2000, 3000), "a harmless caption\r\nover two lines", thumbnails=shots),
    ]
    out = tmp_path / "hostile.html"
    with open_track(str(out), "html", header, overwrite=False) as writer:
        for cue in cues:
            writer.write(cue)
    return out, cues


def test_everything_from_outside_is_escaped(tmp_path):
    out, cues = hostile_page(tmp_path)
    text = out.read_text(encoding="utf-8")
    page = sheet_reader.read(text)
    assert [c.text for c in page.cards] == [HOSTILE, "a harmless caption\nover two lines"]
    assert page.facts["prompt"] == HOSTILE and page.facts["model"] == HOSTILE
    assert page.title == os.path.basename(f"{HOSTILE}.mp4") + " — ffai contact sheet"
    assert page.facts["source"] == str(out.parent / f"{HOSTILE}.mp4")
    # The only elements are the page's own: one script, no <img> but the thumbnails' data URIs.
    assert len(page.scripts) == 1 and text.count("<script") == 1
    assert all(i["src"].startswith("data:image/jpeg;base64,") for c in page.cards for i in c.images)
    for attributes in re.findall(r"<img ([^>]*)>", text):
        assert set(re.findall(r'(?:^|\s)([a-z-]+)="', attributes)) == {"src", "width", "height", "alt"}, attributes


def test_the_policy_allows_only_the_pages_own_script_and_style(tmp_path):
    out, _ = hostile_page(tmp_path)
    text = out.read_text(encoding="utf-8")
    page = sheet_reader.read(text)
    directives = dict(d.strip().split(" ", 1) for d in page.policy.split(";"))
    (style,) = re.findall(r"<style>(.*?)</style>", text, re.S)

    def sha(t: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(t.encode()).digest()).decode() + "'"

    assert directives == {
        "default-src": "'none'",
        "img-src": "data:",
        "media-src": "'self'",
        "style-src": sha(style),
        "script-src": sha(page.scripts[0]),
        "base-uri": "'none'",
        "form-action": "'none'",
    }
    assert " style=" not in text  # a style attribute would need 'unsafe-inline'


def test_video_source_is_relative_to_the_page(tmp_path, clip):
    folder = tmp_path / "sheets" / "a b"
    folder.mkdir(parents=True)
    spaced = tmp_path / "a clip #1.mp4"
    spaced.write_bytes(clip.read_bytes())
    src = sheet.video_source(str(spaced), str(folder / "page.html"))
    assert src == "../../a%20clip%20%231.mp4"  # relative, and a URL: '#' would start a fragment
    assert sheet.video_source(str(tmp_path / "gone.mp4"), str(folder / "page.html")) is None
    assert sheet.video_source("udp://127.0.0.1:1234", None) is None


# --- written by a caption run -----------------------------------------------------------


def test_caption_to_html_shows_every_cue_with_its_frames(tracks, clip):
    json_track, html_track = tracks
    header, cues = read_json_track(json_track)
    page = sheet_reader.read(html_track.read_text(encoding="utf-8"))
    assert [(c.start_ms, c.end_ms, c.text) for c in page.cards] == [(c.start_ms, c.end_ms, c.text) for c in cues]
    assert [c.start_ms for c in cues] == [0, 2520, 5000]  # fps 2, window 5, on this clip's frame times
    assert [len(c.images) for c in page.cards] == [4, 4, 2]
    for card, cue in zip(page.cards, cues):
        expected_alts = [cue.frame_times_ms[i] for i in thumbnails.thumbnail_indices(len(cue.frame_times_ms))]
        assert [i["alt"] for i in card.images] == [f"frame at {sheet.format_timestamp(ms)}" for ms in expected_alts]
        for jpeg, img in zip(card.jpegs(), card.images):
            assert Image.open(io.BytesIO(jpeg)).size == (int(img["width"]), int(img["height"])) == (96, 64)
    assert page.video == clip.name
    assert page.facts["resolution"] == "96×64" and page.facts["decoding"] == "greedy, at most 6 new tokens"
    assert [p.name for p in clip.parent.iterdir() if p.name.endswith(".part")] == []


def test_html_to_stdout_is_the_page(capsys, clip, tiny_checkpoint):
    code = run(
        [
            "caption",
            "-i",
            str(clip),
            "--model",
            str(tiny_checkpoint),
            "--fps",
            "1",
            "--window",
            "3",
            "--max-new-tokens",
            "3",
            "-f",
            "html",
            "-o",
            "-",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    page = sheet_reader.read(out)
    assert [c.start_ms for c in page.cards] == [0, 3000] and all(len(c.images) == 3 for c in page.cards)


def test_a_still_gives_one_card_with_its_picture(tmp_path, tiny_checkpoint, capsys):
    still = tmp_path / "still.png"
    Image.new("RGBA", (640, 480), (20, 200, 60, 255)).save(still)
    for track in ("s.html", "s.json"):
        args = ["caption", "-i", str(still), "--model", str(tiny_checkpoint), "--max-new-tokens", "4"]
        assert run([*args, "-o", str(tmp_path / track)]) == 0
    page = sheet_reader.read((tmp_path / "s.html").read_text(encoding="utf-8"))
    (card,) = page.cards
    assert card.text == read_json_track(tmp_path / "s.json")[1][0].text
    (jpeg,) = card.jpegs()
    assert Image.open(io.BytesIO(jpeg)).size == (480, 360)  # a still's picture fits STILL_SIDE
    assert page.video is None and "sampling" not in page.facts
    # ffai sheet makes the same card from the json track
    capsys.readouterr()
    assert run(["sheet", str(tmp_path / "s.json"), "-o", str(tmp_path / "again.html")]) == 0
    again = sheet_reader.read((tmp_path / "again.html").read_text(encoding="utf-8"))
    assert again.cards[0].jpegs() == [jpeg] and again.cards[0].text == card.text


def test_ctrl_c_leaves_a_page_with_every_finished_cue(tiny_checkpoint, tmp_path):
    """A real run interrupted as at a terminal: exit 130, and the page on disk is whole."""
    clip = make_clip(tmp_path / "long.mp4", 60, fps=5, size=(64, 48))
    out = tmp_path / "long.html"
    sheet_reader.interrupt_a_page(clip, tiny_checkpoint, out, cues=3)
    page = sheet_reader.read(out.read_text(encoding="utf-8"))
    assert 3 <= len(page.cards) < 120
    assert [round(c.start_ms / 500) for c in page.cards] == list(range(len(page.cards)))  # none missing
    assert all(len(c.images) == 1 for c in page.cards)
    assert out.read_text(encoding="utf-8").rstrip().endswith("</html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.html", "long.mp4"]


# --- ffai sheet ---------------------------------------------------------------------------


def test_sheet_from_a_json_track_is_the_caption_runs_page(tracks, tmp_path, capsys):
    json_track, html_track = tracks
    out = tmp_path / "sheet.html"
    assert run(["sheet", str(json_track), "-o", str(out)]) == 0, capsys.readouterr().err
    made, again = (sheet_reader.read(p.read_text(encoding="utf-8")) for p in (html_track, out))
    assert [(c.start_ms, c.end_ms, c.text, c.heading) for c in again.cards] == [
        (c.start_ms, c.end_ms, c.text, c.heading) for c in made.cards
    ]
    assert [c.jpegs() for c in again.cards] == [c.jpegs() for c in made.cards]  # the same frames
    assert again.video == os.path.relpath(json_track.with_suffix(".mp4"), tmp_path)
    assert {k: v for k, v in again.facts.items() if k not in ("made", "decoding", "source")} == {
        k: v for k, v in made.facts.items() if k not in ("made", "decoding", "source")
    }


def test_sheet_loads_no_model(tracks, tmp_path):
    json_track, _ = tracks
    script = (
        "import sys; from ffai.cli import run; "
        f"code = run(['sheet', {str(json_track)!r}, '-o', {str(tmp_path / 's.html')!r}]); "
        "print(code, 'torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["0", "False"], proc.stderr


def test_sheet_finds_a_moved_source_with_i(tracks, tmp_path, capsys):
    json_track, _ = tracks
    doc = json.loads(json_track.read_text(encoding="utf-8"))
    doc["source"]["path"] = str(tmp_path / "was-here.mp4")
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(doc), encoding="utf-8")
    assert run(["sheet", str(moved), "-o", str(tmp_path / "a.html")]) == 1
    one_error_line(capsys.readouterr().err, "was-here.mp4 is missing (use -i to name where it is now)")
    assert not (tmp_path / "a.html").exists()
    assert run(["sheet", str(moved), "-i", doc_source(json_track), "-o", str(tmp_path / "a.html")]) == 0
    assert len(sheet_reader.cards((tmp_path / "a.html").read_text(encoding="utf-8"))) == 3


def doc_source(json_track: Path) -> str:
    return json.loads(json_track.read_text(encoding="utf-8"))["source"]["path"]


def test_sheet_refuses_a_changed_source(tracks, tmp_path, capsys):
    json_track, _ = tracks
    other = make_clip(tmp_path / "other.mp4", 4, fps=25, size=(96, 64))
    assert run(["sheet", str(json_track), "-i", str(other), "-o", str(tmp_path / "a.html")]) == 1
    one_error_line(capsys.readouterr().err, "has changed since")
    bigger = make_clip(tmp_path / "bigger.mp4", 6, fps=25, size=(128, 64))
    assert run(["sheet", str(json_track), "-i", str(bigger), "-o", str(tmp_path / "a.html")]) == 1
    one_error_line(capsys.readouterr().err, "128×64, the track says 96×64")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bigger.mp4", "other.mp4"]


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("not json", "not a JSON track"),
        ('{"version": 2}', "version 2 is not supported"),
        ('{"version": 1, "source": {}}', "not a JSON track written by ffai"),
        ("[1, 2]", "not a JSON track written by ffai"),
    ],
)
def test_sheet_refuses_what_is_not_a_json_track(tmp_path, capsys, content, fragment):
    track = tmp_path / "t.json"
    track.write_text(content, encoding="utf-8")
    assert run(["sheet", str(track), "-o", str(tmp_path / "a.html")]) == 2
    one_error_line(capsys.readouterr().err, fragment)


def test_sheet_keeps_an_existing_output_without_y(tracks, tmp_path, capsys):
    json_track, _ = tracks
    out = tmp_path / "a.html"
    out.write_text("precious")
    assert run(["sheet", str(json_track), "-o", str(out)]) == 1
    one_error_line(capsys.readouterr().err, "already exists (use -y to overwrite)")
    assert out.read_text() == "precious"
    assert run(["sheet", str(json_track), "-o", str(out), "-y"]) == 0
    assert len(sheet_reader.cards(out.read_text(encoding="utf-8"))) == 3


def test_frames_at_gives_the_sampled_frames(clip):
    sampled = list(media.Decoder(isolated=False).sample_frames(clip, 2))
    picks = [sampled[i] for i in (0, 3, 4, 11)]
    # stored as a JSON track stores them: whole milliseconds
    found = list(media.Decoder().frames_at(clip, [round(f.time * 1000) / 1000 for f in picks], tolerance=0.0005))
    assert [f.time for f in found] == [f.time for f in picks]
    assert [f.image.tobytes() for f in found] == [f.image.tobytes() for f in picks]
    assert [f.time for f in media.Decoder(isolated=False).frames_at(clip, [5.9, 7.0])] == [5.92]  # the clip ends first
