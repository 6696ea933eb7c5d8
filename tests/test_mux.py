"""``-o clip.mkv|.mp4|.mov|.webm``: the input's streams copied packet for packet (payloads and
timestamps compared with PyAV) plus one subtitle stream holding the cues of the run's srt track;
cuts, several inputs, --resume, and the refusals (one line, the right exit, nothing written)."""

from __future__ import annotations

import datetime
import html
import io
from pathlib import Path

import av
import pytest
import srt
import webvtt

from ffai.cli import run
from ffai.outputs.mux import _ASS_HEADER, cue_payload
from media_fixtures import make_av_clip
from sample_media import make_rotated_clip, make_vfr_clip

FLAGS = ["--fps", "2", "--window", "2", "--max-new-tokens", "6"]


def caption(capsys, model: Path, source: Path, output: Path, *more: str) -> tuple[int, str]:
    code = run(["caption", "-i", str(source), "--model", str(model), *FLAGS, "-o", str(output), *more])
    return code, capsys.readouterr().err


def packets(path: Path, kind: str) -> list[list[tuple[bytes, int | None]]]:
    """Each ``kind`` stream's packets as (payload, pts in microseconds), in stream order."""
    with av.open(str(path)) as container:
        streams = [s for s in container.streams if s.type == kind]
        found: dict[int, list] = {s.index: [] for s in streams}
        if not streams:  # demux() of no stream reads them all
            return []
        for p in container.demux(streams):
            if p.size:
                found[p.stream.index].append((bytes(p), round(p.pts * p.time_base * 1_000_000)))
        return [found[s.index] for s in streams]


def subtitle_cues(path: Path, index: int = -1) -> tuple[str, list[srt.Subtitle], dict]:
    """The codec id, cues (as srt.Subtitle, parsed back from a document of the packets' text by
    srt or webvtt-py) and metadata of ``path``'s subtitle stream ``index`` (default: the last)."""
    with av.open(str(path)) as container:
        stream = container.streams.subtitles[index]
        codec, metadata = stream.codec_context.codec.id, dict(stream.metadata)
        metadata["default"] = bool(stream.disposition & av.stream.Disposition.default)
        raw = []
        for p in container.demux(stream):
            data = bytes(p)
            if codec == av.Codec("mov_text", "w").id:  # a 16-bit length, then the text; gaps are empty samples
                data = data[2 : 2 + int.from_bytes(data[:2], "big")]
            if not data:
                continue
            assert stream.codec_context.decode2(p) is not None  # FFmpeg's decoder reads it too
            start = round(p.pts * p.time_base * 1000)
            raw.append((start, start + round(p.duration * p.time_base * 1000), data.decode("utf-8")))
    if codec == av.Codec("webvtt", "w").id:
        doc = "WEBVTT\n\n" + "".join(f"{_vtt(s)} --> {_vtt(e)}\n{t}\n\n" for s, e, t in raw)
        cues = [  # WebVTT text is escaped (& < >) as a vtt track's is: unescaped, the cue's text
            srt.Subtitle(
                i + 1, _ms(c.start_time.in_milliseconds()), _ms(c.end_time.in_milliseconds()), html.unescape(c.text)
            )
            for i, c in enumerate(webvtt.from_buffer(io.StringIO(doc)))
        ]
    else:
        doc = "".join(
            f"{i + 1}\n{srt.timedelta_to_srt_timestamp(_ms(s))} --> {srt.timedelta_to_srt_timestamp(_ms(e))}\n{t}\n\n"
            for i, (s, e, t) in enumerate(raw)
        )
        cues = list(srt.parse(doc))
    return codec, cues, metadata


def _ms(ms: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=ms)


def _vtt(ms: int) -> str:
    return srt.timedelta_to_srt_timestamp(_ms(ms)).replace(",", ".")


def track_cues(path: Path, shift_ms: int = 0) -> list[tuple[int, int, str]]:
    return [
        (round(c.start.total_seconds() * 1000) + shift_ms, round(c.end.total_seconds() * 1000) + shift_ms, c.content)
        for c in srt.parse(path.read_text(encoding="utf-8"))
        if c.content
    ]


def as_tuples(cues: list[srt.Subtitle]) -> list[tuple[int, int, str]]:
    return [(round(c.start.total_seconds() * 1000), round(c.end.total_seconds() * 1000), c.content) for c in cues]


CLIPS = {
    "h264-aac.mp4": lambda p: make_av_clip(p, 3, "libx264", "aac"),
    "vp9-opus.mkv": lambda p: make_av_clip(p, 3, "libvpx-vp9", "libopus"),
    "hevc10-aac.mov": lambda p: make_av_clip(p, 3, "libx265", "aac", pix_fmt="yuv420p10le"),
    "rotated.mp4": lambda p: make_rotated_clip(p, 90, seconds=3),
    "vfr.mp4": lambda p: make_vfr_clip(p),
}


@pytest.mark.parametrize("name", list(CLIPS))
def test_round_trip_copies_every_packet_and_holds_the_srt_cues(name, capsys, tiny_checkpoint, tmp_path):
    source = CLIPS[name](tmp_path / name)
    ext = source.suffix
    out, track = tmp_path / f"out{ext}", tmp_path / "out.srt"
    code, err = caption(capsys, tiny_checkpoint, source, out)
    assert code == 0, err
    assert caption(capsys, tiny_checkpoint, source, track)[0] == 0
    for kind in ("video", "audio"):
        assert packets(out, kind) == packets(source, kind), kind  # payloads and pts, byte for byte
    codec, cues, metadata = subtitle_cues(out)
    assert codec == av.Codec({".mp4": "mov_text", ".mov": "mov_text", ".mkv": "subrip"}[ext], "w").id
    assert as_tuples(cues) == track_cues(track) and cues
    assert metadata["default"]
    assert metadata.get("title", metadata.get("name")) == f"smolvlm: {tiny_checkpoint}"
    assert metadata.get("language", "und") == "und"
    with av.open(str(source)) as a, av.open(str(out)) as b:
        assert [s.metadata.get("language") for s in a.streams.audio] == [
            s.metadata.get("language") for s in b.streams.audio
        ]
        assert [s.codec_context.name for s in a.streams.video] == [s.codec_context.name for s in b.streams.video]
    if name == "rotated.mp4":  # the display matrix travels with the copy
        from ffai.media import Decoder

        with Decoder(isolated=False) as decoder:
            assert decoder.probe(str(out)).width == decoder.probe(str(source)).width == 48


def test_payloads_are_what_ffmpegs_encoders_write_for_plain_text():
    text = "a red circle\non a <blue> & green background --> here"
    for codec in ("subrip", "mov_text", "webvtt"):
        with av.open(io.BytesIO(), "w", format="matroska" if codec != "mov_text" else "mp4") as container:
            stream = container.add_stream(codec)
            stream.codec_context.subtitle_header = _ASS_HEADER
            ass = "0,0,Default,,0,0,0,," + text.replace("\n", "\\N")
            cue = av.subtitles.subtitle.SubtitleSet.create(ass.encode(), 0, 1000, pts=0)
            encoded = bytes(stream.codec_context.encode_subtitle(cue))
        ours = cue_payload(text, codec)
        if codec == "webvtt":  # FFmpeg's webvtt encoder leaves & and < as they are; a vtt track escapes them
            assert ours.decode() == text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            assert encoded.decode() == text
        else:
            assert ours == encoded, codec


def test_webm_language_and_cut_land_on_a_keyframe(capsys, tiny_checkpoint, tmp_path):
    source = make_av_clip(tmp_path / "in.webm", 4, "libvpx-vp9", "libopus")
    out, track = tmp_path / "cut.webm", tmp_path / "cut.srt"
    cut = ["-ss", "1.5", "-t", "2"]
    code, err = caption(capsys, tiny_checkpoint, source, out, *cut, "--language", "eng")
    assert code == 0, err
    assert caption(capsys, tiny_checkpoint, source, track, *cut)[0] == 0
    codec, cues, metadata = subtitle_cues(out)
    assert codec == av.Codec("webvtt", "w").id and metadata["language"] == "eng"
    # keyframes every second: the copy starts at 1.0 s, which is 0 in the output
    assert as_tuples(cues) == track_cues(track, shift_ms=-1000)
    video = packets(source, "video")[0]
    kept = packets(out, "video")[0]
    first = next(i for i, (_, pts) in enumerate(video) if pts == 1_000_000)
    last = next(i for i, (_, pts) in enumerate(video) if pts >= 3_500_000)  # VP9 here: decoded as shown
    assert kept == [(data, pts - 1_000_000) for data, pts in video[first:last]]
    audio = packets(source, "audio")[0]
    assert packets(out, "audio")[0] == [(d, pts - 1_000_000) for d, pts in audio if 1_000_000 <= pts < 3_500_000]


def test_existing_subtitles_are_kept_and_ours_comes_after(capsys, tiny_checkpoint, tmp_path):
    source = make_av_clip(tmp_path / "subs.mkv", 2, "libx264", "aac", subtitles=[(500, 1500, "their cue")])
    out = tmp_path / "out.mkv"
    code, err = caption(capsys, tiny_checkpoint, source, out)
    assert code == 0, err
    assert packets(out, "subtitle")[0] == packets(source, "subtitle")[0]
    _, theirs, metadata = subtitle_cues(out, 0)
    assert [c.content for c in theirs] == ["their cue"] and metadata["language"] == "eng"
    assert not metadata["default"] and subtitle_cues(out)[2]["default"]


def test_several_inputs_by_pattern_and_resume(capsys, tiny_checkpoint, tmp_path):
    (tmp_path / "in").mkdir()
    for name in ("a", "b"):
        make_av_clip(tmp_path / "in" / f"{name}.mp4", 1, "libx264", None)
    pattern = str(tmp_path / "out" / "{stem}.mkv")
    (tmp_path / "out").mkdir()
    args = ["caption", "-i", str(tmp_path / "in"), "--model", str(tiny_checkpoint), *FLAGS, "-o", pattern]
    assert run(args) == 0, capsys.readouterr().err
    made = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("*.mkv")}
    assert sorted(made) == ["a.mkv", "b.mkv"]
    assert run([*args, "--resume"]) == 0
    assert "0 done, 2 skipped" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("*.mkv")} == made


def one_error(code: int, err: str, expected: int, fragment: str) -> None:
    err = err.strip()
    assert code == expected, err
    assert len(err.splitlines()) == 1 and err.startswith("ffai: error:") and fragment in err, err


def test_refusals_are_one_line_and_write_nothing(capsys, tiny_checkpoint, tmp_path):
    still = tmp_path / "still.png"
    from PIL import Image

    Image.new("RGB", (32, 32), "red").save(still)
    gif = tmp_path / "anim.gif"
    Image.new("RGB", (32, 32), "red").save(gif, save_all=True, append_images=[Image.new("RGB", (32, 32))], duration=100)
    for source in (still, gif):
        one_error(*caption(capsys, tiny_checkpoint, source, tmp_path / "x.mkv"), 2, "needs a video input")
    mpeg2 = make_av_clip(tmp_path / "m2.mkv", 1, "mpeg2video", None)
    code, err = caption(capsys, tiny_checkpoint, mpeg2, tmp_path / "x.webm")
    one_error(code, err, 1, "WebM cannot hold the mpeg2video video stream")
    assert "-o .mkv can hold it" in err
    for args, fragment in (
        (["-i", "-", "-o", str(tmp_path / "x.mp4")], "use -o out.mkv"),
        (["-i", str(mpeg2), "-o", "-", "-f", "mkv"], "writes a file"),
        (["-i", str(mpeg2), "-o", str(tmp_path / "x.srt"), "--language", "eng"], "--language"),
        (["-i", str(mpeg2), "-o", str(tmp_path / "x.mkv"), "--language", "english"], "ISO 639-2"),
    ):
        code = run(["caption", "--model", str(tiny_checkpoint), *args])
        one_error(code, capsys.readouterr().err, 2, fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["anim.gif", "m2.mkv", "still.png"]


def test_existing_output_needs_y_and_a_failed_run_leaves_it(capsys, tiny_checkpoint, tmp_path):
    source = make_av_clip(tmp_path / "in.mp4", 1, "libx264", None)
    out = tmp_path / "out.mp4"
    out.write_bytes(b"keep me")
    one_error(*caption(capsys, tiny_checkpoint, source, out, "-n"), 1, "already exists")
    assert out.read_bytes() == b"keep me"
    code, err = caption(capsys, tiny_checkpoint, source, out, "-y")
    assert code == 0, err
    assert subtitle_cues(out)[1] and sorted(p.name for p in tmp_path.iterdir()) == ["in.mp4", "out.mp4"]


def test_ctrl_c_after_a_cue_leaves_a_file_with_it(tiny_checkpoint, tmp_path):
    """The writer stopped after its first cue (as the driver stops it on Ctrl-C) finishes a
    file holding that cue and the streams up to its end."""
    from ffai.outputs.cues import Cue, TrackHeader
    from ffai.outputs.mux import open_output

    source = make_av_clip(tmp_path / "in.mkv", 4, "libx264", "aac")
    header = TrackHeader(str(source), 4.0, 64, 48, "smolvlm", "m", 2.0, 2, None, 6, None)
    out = tmp_path / "out.mkv"
    writer = open_output(str(out), "mkv", header, overwrite=False)
    writer.write(Cue(1, 0, 1000, (0, 500), "first"))
    assert not out.exists()
    writer.abort()
    assert as_tuples(subtitle_cues(out)[1]) == [(0, 1000, "first")]
    kept, whole = packets(out, "video")[0], packets(source, "video")[0]
    assert 10 <= len(kept) < len(whole) and kept == whole[: len(kept)]  # decoded up to the cue's end
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    untouched = open_output(str(tmp_path / "none.mkv"), "mkv", header, overwrite=False)
    untouched.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mkv", "out.mkv"]


@pytest.mark.ray
def test_a_ray_run_writes_the_same_container_through_its_driver(capsys, tmp_path):
    """On a local Ray the cluster captions and the driver copies the streams: the same packets,
    and the cues a local run on one torch thread (as each actor computes) writes."""
    import subprocess
    import sys

    source = make_av_clip(tmp_path / "in.mkv", 2, "libx264", "aac")
    flags = ["-i", str(source), "--model", "smolvlm-demo", *FLAGS]
    out, track = tmp_path / "ray.mkv", tmp_path / "local.srt"
    assert run(["caption", *flags, "--threads", "1", "-o", str(track)]) == 0, capsys.readouterr().err
    command = [sys.executable, "-m", "ffai", "caption", *flags, "--ray", "local", "--ray-actors", "1", "-o", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    for kind in ("video", "audio"):
        assert packets(out, kind) == packets(source, kind)
    assert as_tuples(subtitle_cues(out)[1]) == track_cues(track)


def test_a_live_source_is_not_copied_on_ray(capsys, tmp_path):
    code = run(["caption", "-i", "-", "--ray", "local", "-o", str(tmp_path / "live.mkv")])
    one_error(code, capsys.readouterr().err, 2, "by a local run, not --ray")


def test_mp4_into_mkv_moves_every_stream_and_the_cues_together(capsys, tiny_checkpoint, tmp_path):
    """The README's line: an MP4 whose AAC starts before 0 (its priming samples) into Matroska,
    which starts no stream before 0: every stream and the cues move by the same amount."""
    source = make_av_clip(tmp_path / "clip.mp4", 2, "libx264", "aac")
    out, track = tmp_path / "clip.captioned.mkv", tmp_path / "clip.srt"
    assert caption(capsys, tiny_checkpoint, source, out)[0] == 0
    assert caption(capsys, tiny_checkpoint, source, track)[0] == 0
    audio = packets(source, "audio")[0]
    shift = -audio[0][1]  # microseconds: the first AAC packet at -64 ms lands at 0
    assert shift == 64_000
    for kind in ("video", "audio"):
        assert packets(out, kind)[0] == [(data, pts + shift) for data, pts in packets(source, kind)[0]]
    assert as_tuples(subtitle_cues(out)[1]) == track_cues(track, shift_ms=shift // 1000)


def test_an_h264_cut_with_b_frames_keeps_what_its_frames_need(capsys, tiny_checkpoint, tmp_path):
    """B-frames are decoded after the frame they show before: the copy ends at the first packet
    decoded at or after the end (ffmpeg's -t with -c copy), so every frame kept decodes."""
    source = make_av_clip(tmp_path / "in.mp4", 4, "libx264", None)
    out, track = tmp_path / "cut.mp4", tmp_path / "cut.srt"
    cut = ["-ss", "1.2", "-t", "1"]
    assert caption(capsys, tiny_checkpoint, source, out, *cut)[0] == 0
    assert caption(capsys, tiny_checkpoint, source, track, *cut)[0] == 0

    def decode_order(path: Path) -> list[tuple[bytes, int, int]]:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            us = stream.time_base * 1_000_000
            return [(bytes(p), round(p.pts * us), round(p.dts * us)) for p in container.demux(stream) if p.size]

    whole, kept = decode_order(source), decode_order(out)
    assert any(pts < prev for (_, pts, _), (_, prev, _) in zip(whole[1:], whole)), "the clip has B-frames"
    first = next(i for i, (_, pts, _) in enumerate(whole) if pts == 1_000_000)
    last = next(i for i, (_, _, dts) in enumerate(whole) if dts >= 2_200_000)
    assert [(d, pts - 1_000_000) for d, pts, _ in whole[first:last]] == [(d, pts) for d, pts, _ in kept]
    with av.open(str(out)) as container:
        assert len(list(container.decode(video=0))) == len(kept)  # every frame kept decodes
    assert as_tuples(subtitle_cues(out)[1]) == track_cues(track, shift_ms=-1000)
