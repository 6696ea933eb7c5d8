"""A muxed output keeps everything its input had: the container's tags, its chapters (moved and
cut with -ss/-t), its attachments, every stream's tags and dispositions, and existing subtitle
streams, ffai's stream added. What a target container cannot hold is named in one warning line,
and the file is written anyway. Read back with PyAV always, and with ffprobe where FFmpeg's
command-line tools are installed (Debian's ffmpeg; .ci/run installs it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import av
import pytest

from ffai.cli import run
from media_fixtures import make_av_clip

FLAGS = ["--fps", "2", "--window", "2", "--max-new-tokens", "4"]
TAGS = {"title": "A rich clip", "comment": "made by the tests", "ARTIST": "ffai tests"}
CHAPTERS = [(0, 1000, "Opening"), (1000, 2500, "Middle"), (2500, 4000, "Credits")]
FONT = ("font.ttf", "application/x-truetype-font", b"\x00\x01\x00\x00" + bytes(range(256)))
COVER = ("cover.jpg", "image/jpeg", b"\xff\xd8\xff\xe0" + bytes(range(64)))  # FFmpeg reads it as a picture
AUDIO = [({"language": "fra", "title": "Français"}, 0), ({"language": "eng", "title": "Commentary"}, "comment")]
SUBTITLE = ({"language": "eng", "title": "Signs"}, "forced")


def _flag(name) -> int:
    return 0 if name == 0 else int(getattr(av.stream.Disposition, name))


def make_rich_mkv(path: Path, tmp_path: Path) -> Path:
    """A 4 s MKV with a title and other tags, three chapters, a font and a cover, two audio tracks
    (language, title; the second a commentary) and a forced, titled subtitle stream: a clip made
    by make_av_clip, copied packet for packet with all of that added."""
    base = make_av_clip(tmp_path / "base.mkv", 4, "libx264", "aac", subtitles=[(500, 1500, "A sign")])
    with av.open(str(base)) as source, av.open(str(path), "w", format="matroska") as out:
        out.metadata.update(TAGS)
        video = out.add_stream_from_template(source.streams.video[0])
        audio = [out.add_stream_from_template(source.streams.audio[0]) for _ in AUDIO]
        for stream, (tags, flag) in zip(audio, AUDIO):
            stream.metadata.update(tags)
            stream.disposition = _flag(flag)
        subtitle = out.add_stream_from_template(source.streams.subtitles[0])
        subtitle.metadata.update(SUBTITLE[0])
        subtitle.disposition = _flag(SUBTITLE[1])
        out.add_attachment(*FONT)
        out.add_attachment(*COVER)
        ms = Fraction(1, 1000)
        out.set_chapters(
            [
                {"id": i + 1, "start": start, "end": end, "time_base": ms, "metadata": {"title": title}}
                for i, (start, end, title) in enumerate(CHAPTERS)
            ]
        )
        for packet in source.demux():
            if packet.dts is None and packet.pts is None:
                continue
            targets = {"video": [video], "audio": audio, "subtitle": [subtitle]}[packet.stream.type]
            for target in targets:
                copy = av.Packet(bytes(packet))
                copy.pts, copy.dts, copy.duration = packet.pts, packet.dts, packet.duration
                copy.time_base, copy.is_keyframe, copy.stream = packet.time_base, packet.is_keyframe, target
                out.mux(copy)
    return path


@pytest.fixture(scope="module")
def rich(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("rich")
    return make_rich_mkv(folder / "rich.mkv", folder)


def caption(capsys, checkpoint: Path, source: Path, output: Path, *more: str) -> str:
    code = run(["caption", "-i", str(source), "--model", str(checkpoint), *FLAGS, "-o", str(output), *more])
    err = capsys.readouterr().err
    assert code == 0, err
    return err


def warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("ffai: warning:") and "left out" in line]


def read(path: Path) -> dict:
    """What PyAV reads of ``path``: tags, chapters (seconds, title), and per stream its type,
    codec, tags (lengths aside) and disposition; attachments with their bytes."""
    with av.open(str(path)) as c:
        return {
            "tags": {k.lower(): v for k, v in c.metadata.items() if k.lower() != "encoder"},
            "chapters": [
                (float(ch["start"] * ch["time_base"]), float(ch["end"] * ch["time_base"]), ch["metadata"].get("title"))
                for ch in c.chapters()
            ],
            "streams": [
                (
                    s.type,
                    s.codec_context.name if s.codec_context is not None else s.name,
                    {k: v for k, v in s.metadata.items() if k.upper() != "DURATION"},
                    int(s.disposition),
                    bytes(s.data) if s.type == "attachment" else None,
                )
                for s in c.streams
            ],
        }


def ours(streams: list) -> list:
    """``streams`` without ffai's subtitle stream (the one titled with the engine and model)."""
    return [
        s
        for s in streams
        if not (s[0] == "subtitle" and s[2].get("title", s[2].get("name", "")).startswith("smolvlm:"))
    ]


def test_mkv_keeps_tags_chapters_attachments_and_every_stream(capsys, tiny_checkpoint, rich, tmp_path):
    out = tmp_path / "out.mkv"
    assert warnings(caption(capsys, tiny_checkpoint, rich, out)) == []
    before, after = read(rich), read(out)
    assert after["tags"] == before["tags"] == {k.lower(): v for k, v in TAGS.items()}
    assert after["chapters"] == before["chapters"] == [(s / 1000, e / 1000, t) for s, e, t in CHAPTERS]
    assert ours(after["streams"]) == before["streams"]
    assert len(after["streams"]) == len(before["streams"]) + 1
    assert [s[4] for s in after["streams"] if s[0] == "attachment"] == [FONT[2]]
    assert cover(out) == cover(rich) == COVER[2]


def cover(path: Path) -> bytes:
    with av.open(str(path)) as c:
        (picture,) = [s for s in c.streams if s.disposition & av.stream.Disposition.attached_pic]
        assert picture.metadata["filename"] == COVER[0]
        return next(bytes(p) for p in c.demux(picture) if p.size)


def test_cut_chapters_move_with_the_copy(capsys, tiny_checkpoint, rich, tmp_path):
    out = tmp_path / "cut.mkv"
    # Keyframes every second: -ss 1.2 starts the copy at 1.0, -t 2 ends it at 3.2 of the input.
    caption(capsys, tiny_checkpoint, rich, out, "-ss", "1.2", "-t", "2")
    assert read(out)["chapters"] == [(0.0, 1.5, "Middle"), (1.5, 2.2, "Credits")]


def test_mp4_writes_what_it_can_and_names_the_rest_in_one_line(capsys, tiny_checkpoint, rich, tmp_path):
    out = tmp_path / "out.mp4"
    lines = warnings(caption(capsys, tiny_checkpoint, rich, out))
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ffai: warning: {out}: left out what MP4 cannot hold: ")
    assert "the attachment font.ttf, the attachment cover.jpg" in lines[0]
    after = read(out)
    assert {k: after["tags"][k] for k in ("title", "comment", "artist")} == {k.lower(): v for k, v in TAGS.items()}
    assert [c[2] for c in after["chapters"]] == [t for _, _, t in CHAPTERS]
    kinds = [(s[0], s[1]) for s in ours(after["streams"]) if s[0] != "data"]  # data: MP4's chapter track
    assert kinds == [("video", "h264"), ("audio", "aac"), ("audio", "aac"), ("subtitle", "mov_text")]
    # The SubRip stream converted as ffmpeg -c:s mov_text converts it: its cue, its tags, its flag.
    with av.open(str(out)) as c:
        signs = c.streams.subtitles[0]
        assert signs.metadata["language"] == "eng" and signs.disposition & av.stream.Disposition.forced
        texts = [bytes(p)[2:].decode() for p in c.demux(signs) if p.size > 2]
    assert texts == ["A sign"]
    assert "the tag title" not in lines[0]  # titles live on as MP4 names


def test_mov_names_the_marks_it_cannot_hold(capsys, tiny_checkpoint, rich, tmp_path):
    out = tmp_path / "out.mov"
    (line,) = warnings(caption(capsys, tiny_checkpoint, rich, out))
    assert line == (
        f"ffai: warning: {out}: left out what MOV cannot hold: the attachment font.ttf, the attachment cover.jpg, "
        "the comment mark of stream #2, the forced mark of stream #3"
    )


def test_an_mp4_timecode_and_creation_time_into_mkv(capsys, tiny_checkpoint, tmp_path):
    """The timecode track lives on as the video's tag (from which an MP4 muxer makes the track
    again); the container's creation time is kept, a stream's (which Matroska has no place for)
    is named."""
    base = make_av_clip(tmp_path / "base.mp4", 1, "libx264", None)
    source = tmp_path / "camera.mp4"
    with av.open(str(base)) as src, av.open(str(source), "w") as out:
        video = out.add_stream_from_template(src.streams.video[0])
        video.metadata["timecode"] = "01:00:00:00"
        out.metadata["creation_time"] = "2024-05-06T07:08:09.000000Z"
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is not None:
                packet.stream = video
                out.mux(packet)
    with av.open(str(source)) as c:
        assert [s.type for s in c.streams] == ["video", "data"]  # the tmcd track
    out = tmp_path / "out.mkv"
    (line,) = warnings(caption(capsys, tiny_checkpoint, source, out))
    assert line == f"ffai: warning: {out}: left out what Matroska cannot hold: the tag creation_time of stream #0"
    after = read(out)
    assert after["tags"]["creation_time"] == "2024-05-06T07:08:09.000000Z"
    assert after["streams"][0][2]["TIMECODE"] == "01:00:00:0"
    again = tmp_path / "again.mp4"
    assert warnings(caption(capsys, tiny_checkpoint, source, again)) == []
    with av.open(str(again)) as c:
        assert [s.type for s in c.streams] == ["video", "subtitle", "data"]


FFPROBE_DROPPED_FORMAT = {"filename", "size", "bit_rate", "duration", "start_time", "nb_streams", "probe_score"}
FFPROBE_DROPPED_STREAM = {"index", "duration", "duration_ts", "start_pts", "start_time", "nb_frames", "bit_rate"}


def ffprobe() -> str:
    """ffprobe's path; without it the comparison skips (naming the install), except under CI=true."""
    path = shutil.which("ffprobe")
    if path is None:
        reason = "no ffprobe on PATH: apt-get install ffmpeg"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return path


def probe(path: Path) -> dict:
    """``ffprobe -show_format -show_streams -show_chapters``, lengths and sizes aside."""
    shown = json.loads(
        subprocess.run(
            [ffprobe(), "-v", "error", "-show_format", "-show_streams", "-show_chapters", "-of", "json", str(path)],
            capture_output=True,
            check=True,
            text=True,
        ).stdout
    )

    def tags(d: dict) -> dict:
        return {k: v for k, v in d.get("tags", {}).items() if k.upper() not in ("ENCODER", "DURATION")}

    form = {k: v for k, v in shown["format"].items() if k not in FFPROBE_DROPPED_FORMAT} | {
        "tags": tags(shown["format"])
    }
    streams = [
        {k: v for k, v in s.items() if k not in FFPROBE_DROPPED_STREAM} | {"tags": tags(s)} for s in shown["streams"]
    ]
    return {"format": form, "streams": streams, "chapters": shown["chapters"]}


def test_ffprobe_reads_the_input_plus_ffais_stream(capsys, tiny_checkpoint, rich, tmp_path):
    out = tmp_path / "out.mkv"
    caption(capsys, tiny_checkpoint, rich, out)
    before, after = probe(rich), probe(out)
    assert after["format"] == before["format"]
    assert after["chapters"] == before["chapters"]
    added = [s for s in after["streams"] if s["tags"].get("title", "").startswith("smolvlm:")]
    assert len(added) == 1 and added[0]["codec_name"] == "subrip"
    assert [s for s in after["streams"] if s not in added] == before["streams"]


def test_ffprobe_reads_the_mp4_as_the_input_but_what_it_named(capsys, tiny_checkpoint, rich, tmp_path):
    out = tmp_path / "out.mp4"
    caption(capsys, tiny_checkpoint, rich, out)
    before, after = probe(rich), probe(out)
    assert {k.lower(): v for k, v in before["format"]["tags"].items()}.items() <= {
        k.lower(): v for k, v in after["format"]["tags"].items()
    }.items()
    assert [(c["start_time"], c["end_time"], c["tags"]) for c in after["chapters"]] == [
        (c["start_time"], c["end_time"], c["tags"]) for c in before["chapters"]
    ]

    def shape(s: dict) -> tuple:
        marks = {k for k, v in s["disposition"].items() if v and k != "default"}
        return s["codec_type"], s["tags"].get("language", "und"), marks

    # The input's tracks in order (its attachments named in the warning), then ffai's stream and
    # MP4's chapter track; the SubRip stream now mov_text.
    tracks = [s for s in before["streams"] if s["codec_type"] != "attachment" and not s["disposition"]["attached_pic"]]
    assert [shape(s) for s in after["streams"][: len(tracks)]] == [shape(s) for s in tracks]
    assert [s["codec_name"] for s in after["streams"][len(tracks) :]] == ["mov_text", "bin_data"]
