"""Animated images are video (issue #15): GIF, APNG and animated WebP made here with Pillow,
24 frames with known durations, probe as video and caption into timed tracks whose frame
times follow the durations; a one-frame GIF stays a still; transparency reaches the model as
it does in a still."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import accumulate
from pathlib import Path

import pytest
from PIL import Image

from ffai import media
from ffai.engines.contract import DecodingOptions
from ffai.engines.smolvlm.preprocess import to_rgb
from ffai.run.captioner import Captioner
from ffai.run.options import CaptionOptions

DEMO = Path(__file__).resolve().parents[1] / "ffai" / "models" / "bundled" / "smolvlm-demo"
DURATIONS_MS = [40, 60, 100, 80, 120, 40] * 4  # 24 frames, 1.76 s
FORMATS = {"gif": {}, "apng": {}, "webp": {"lossless": True}}
SUFFIX = {"gif": ".gif", "apng": ".png", "webp": ".webp"}

# Read in this process: what a decoder child gives is compared with it.
here = media.Decoder(isolated=False)


@pytest.fixture(scope="module")
def decoder():
    with media.Decoder() as decoder:
        yield decoder


def colour(i: int) -> tuple[int, int, int]:
    """A colour per frame, far enough from the others to name its frame after compression."""
    return (i * 10 % 256, 255 - i * 10, (i * 40) % 256)


def write_animation(path: Path, kind: str, durations=DURATIONS_MS, size=(48, 32), alpha=None) -> Path:
    mode = "RGB" if alpha is None else "RGBA"
    frames = [Image.new(mode, size, colour(i) + (() if alpha is None else (255,))) for i in range(len(durations))]
    if alpha is not None:
        for frame in frames:  # the left half see-through (alpha 0 or partial), the right opaque
            frame.paste(colour(99) + (alpha,), (0, 0, size[0] // 2, size[1]))
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=durations, loop=0, **FORMATS[kind])
    return path


def frame_times(durations) -> list[float]:
    return [ms / 1000 for ms in accumulate([0, *durations[:-1]])]


def expected_samples(durations, fps: float) -> list[int]:
    """Frame indices sampled: for each deadline n/fps within the animation, the first frame
    shown at or after it, each frame once."""
    times = frame_times(durations)
    picked: list[int] = []
    n = 0
    while n / fps < sum(durations) / 1000:
        later = [i for i, t in enumerate(times) if t >= n / fps - 1e-6]
        if later and later[0] not in picked:
            picked.append(later[0])
        n += 1
    return picked


def frame_index(image: Image.Image) -> int:
    """Which frame a sample shows, by its colour (right half: opaque in every test file)."""
    pixel = image.getpixel((image.width * 3 // 4, image.height // 2))
    return min(range(99), key=lambda i: sum((a - b) ** 2 for a, b in zip(pixel, colour(i))))


@pytest.fixture(params=list(FORMATS))
def animation(request, tmp_path) -> tuple[str, Path]:
    kind = request.param
    return kind, write_animation(tmp_path / f"anim{SUFFIX[kind]}", kind)


def test_probe_says_video_with_the_durations_sum_in_and_out_of_process(animation, decoder):
    kind, path = animation
    with Image.open(path) as image:  # what Pillow wrote is the animation meant
        assert image.n_frames == 24
    info = here.probe(path)
    assert (info.kind, info.width, info.height, info.duration) == ("video", 48, 32, 1.76)
    assert decoder.probe(path) == info


@pytest.mark.parametrize("fps", [10, 3])
def test_samples_follow_the_frame_durations(animation, fps, decoder):
    kind, path = animation
    frames = list(decoder.sample_frames(path, fps))
    picked = expected_samples(DURATIONS_MS, fps)
    assert [f.time for f in frames] == pytest.approx([frame_times(DURATIONS_MS)[i] for i in picked], abs=1e-9)
    assert [frame_index(f.image) for f in frames] == picked
    assert {f.image.mode for f in frames} == {"RGB"}
    # -ss and --max-frames work on the animation's own timeline, as on a clip's.
    later = list(here.sample_frames(path, fps, start=1.0, max_frames=2))
    assert [f.time for f in later] == [f.time for f in frames if f.time >= 1.0 - 1e-9][:2]


def test_a_frame_claiming_no_time_is_shown_for_100_ms(tmp_path):
    path = write_animation(tmp_path / "zero.gif", "gif", durations=[0, 0, 50])
    assert [f.time for f in here.sample_frames(path, 100)] == [0.0, 0.1, 0.2]
    assert here.probe(path).duration == 0.25


@pytest.mark.parametrize("kind", list(FORMATS))
def test_one_frame_stays_a_still(kind, tmp_path, decoder):
    path = write_animation(tmp_path / f"one{SUFFIX[kind]}", kind, durations=[500])
    assert decoder.probe(path).kind == "image"
    assert [f.time for f in here.sample_frames(path, 5)] == [0.0]


@pytest.mark.parametrize("kind, alpha", [("gif", 0), ("apng", 0), ("apng", 100), ("webp", 60)])
def test_transparency_is_composited_as_a_still_is(kind, alpha, tmp_path):
    """A frame's see-through part reaches the model as the engine makes a still of the same
    picture: onto white (SmolVLM's reference), not the colour hidden under it."""
    path = write_animation(tmp_path / f"alpha{SUFFIX[kind]}", kind, durations=[100] * 3, alpha=alpha)
    frames = list(here.sample_frames(path, 10))
    assert len(frames) == 3
    with Image.open(path) as image:
        for index, frame in enumerate(frames):
            image.seek(index)
            as_still = to_rgb(image.copy())
            assert frame.image.mode == "RGB" and frame.image.tobytes() == as_still.tobytes()
    left = frames[1].image.getpixel((2, 2))
    if alpha == 0:
        assert left == (255, 255, 255)
    else:  # partly see-through: between the colour under it and white
        assert left != colour(99) and all(c <= got <= 255 for c, got in zip(colour(99), left))


def test_frames_at_finds_an_animations_frames(tmp_path, decoder):
    path = write_animation(tmp_path / "anim.gif", "gif")
    times = frame_times(DURATIONS_MS)
    got = list(decoder.frames_at(path, [times[3], times[3] + 0.001, times[10]]))
    assert [frame_index(f.image) for f in got] == [3, 4, 10]


@pytest.fixture(scope="module")
def captioner():
    options = CaptionOptions(model=str(DEMO), fps=4, window=3, decoding=DecodingOptions(max_new_tokens=12))
    with Captioner(options, video=True) as running:
        yield running


def test_animations_caption_into_timed_tracks(captioner, tmp_path):
    picked = expected_samples(DURATIONS_MS, 4)
    times_ms = [round(frame_times(DURATIONS_MS)[i] * 1000) for i in picked]
    for kind in FORMATS:
        path = write_animation(tmp_path / f"anim{SUFFIX[kind]}", kind)
        cues = list(captioner.captions(captioner.decoder.probe(path)))
        assert [t for cue in cues for t in cue.frame_times_ms] == times_ms, kind
        assert [len(cue.frame_times_ms) for cue in cues] == [3] * (len(picked) // 3) + [len(picked) % 3] * (
            len(picked) % 3 > 0
        )
        starts = [cue.start_ms for cue in cues]
        assert starts == times_ms[::3] and [cue.end_ms for cue in cues] == starts[1:] + [1760]
        assert all(cue.text for cue in cues)


def test_the_cli_captions_a_gif_as_video_and_a_one_frame_gif_as_a_still(tmp_path):
    gif = write_animation(tmp_path / "anim.gif", "gif")
    one = write_animation(tmp_path / "one.gif", "gif", durations=[500])
    out = tmp_path / "{stem}.json"
    done = subprocess.run(
        [sys.executable, "-m", "ffai", "caption", "-i", str(gif), "-i", str(one), "--model", str(DEMO)]
        + ["--fps", "2", "--window", "2", "--max-new-tokens", "12", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    track = json.loads((tmp_path / "anim.json").read_text())
    assert (track["source"]["duration"], track["params"]["fps"], track["params"]["window"]) == (1.76, 2, 2)
    assert [c["frame_times"] for c in track["cues"]] == [[0.0, 0.54], [1.08, 1.52]]
    still = json.loads((tmp_path / "one.json").read_text())
    assert (still["source"]["duration"], still["params"]["fps"]) == (None, None)
    assert [(c["start"], c["end"], c["frame_times"]) for c in still["cues"]] == [(0.0, 0.0, [0.0])]
