"""``ffai sheet``: the contact sheet of a JSON track made again from its source, without a model.

The track gives the cues and the run's header; the source is decoded once, in time order, for
the frames the thumbnails show (``ffai.outputs.thumbnails``), and the page is written as a caption run
writes it (``ffai.outputs.tracks``' html track, through the same atomic sink).
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import IO, Iterator, Sequence

from ffai.errors import FfaiError
from ffai.outputs.cues import Cue, Thumbnail, TrackHeader, creation_time
from ffai.outputs.thumbnails import still_thumbnail, thumbnail, thumbnail_indices
from ffai.outputs.tracks import check_not_an_input, check_output, open_track, read_json_track

# JSON tracks hold frame times rounded to whole milliseconds: the frame they name is within
# half a millisecond of the stored time.
_STORED_TIME_TOLERANCE = 0.0005


def build(
    track: str | Path,
    output: str | None,
    *,
    overwrite: bool,
    source: str | None = None,
    stream: IO[str] | None = None,
) -> int:
    """Write the contact sheet of the JSON track ``track`` to ``output`` (None or ``-``: stdout)
    from its source video (``source``, else the path the track names), re-decoding only the
    frames its thumbnails show; no model is loaded. Returns the number of cues written.

    A source that is missing, or that differs from the one the track was made from (kind,
    size or duration), is a one-line FfaiError before anything is written."""
    from ffai import media

    check_output(output, overwrite)
    check_not_an_input(output, str(track), {str(track): track})
    header, cues = read_json_track(track)
    path = source if source is not None else header.source_path
    check_not_an_input(output, str(path), {str(path): path})  # the source is an input too
    decoder = media.Decoder()
    if not os.path.exists(path):
        hint = "" if source is not None else " (use -i to name where it is now)"
        raise FfaiError(f"{track}: its source {path} is missing{hint}")
    info = decoder.probe(path)
    _check_same_source(track, path, header, info)
    header = _with_source(header, str(path))
    with open_track(output, "html", header, overwrite=overwrite, stream=stream) as writer:
        if info.kind == "image":
            image = decoder.load_image(path)
            for cue in cues:
                writer.write(_replace_thumbnails(cue, (still_thumbnail(image),)))
        else:
            for cue in _cues_with_thumbnails(decoder, path, cues):
                writer.write(cue)
    return len(cues)


def _check_same_source(track: str | Path, path: str, header: TrackHeader, info) -> None:
    was_still = header.fps is None
    problems = []
    if was_still != (info.kind == "image"):
        problems.append(
            f"it is {'an image' if info.kind == 'image' else 'a video'}, the track is of a "
            f"{'still' if was_still else 'video'}"
        )
    if (header.width, header.height) != (info.width, info.height):
        problems.append(f"{info.width}×{info.height}, the track says {header.width}×{header.height}")
    if not was_still and (
        header.duration is None
        or info.duration is None
        or not math.isclose(header.duration, info.duration, abs_tol=_STORED_TIME_TOLERANCE)
    ):
        problems.append(f"duration {_duration(info.duration)}, the track says {_duration(header.duration)}")
    if problems:
        raise FfaiError(f"{path} has changed since {track} was made: {'; '.join(problems)}")


def _duration(seconds: float | None) -> str:
    return "unknown" if seconds is None else f"{seconds:g} s"


def _with_source(header: TrackHeader, path: str) -> TrackHeader:
    return dataclasses.replace(header, source_path=path, created=creation_time())


def _replace_thumbnails(cue: Cue, thumbnails: tuple[Thumbnail, ...]) -> Cue:
    return dataclasses.replace(cue, thumbnails=thumbnails)


def _cues_with_thumbnails(decoder, path: str, cues: Sequence[Cue]) -> Iterator[Cue]:
    """Each cue with the thumbnails a caption run would have given it, decoding the source once,
    in time order, and converting only the frames the thumbnails show."""
    wanted = [[cue.frame_times_ms[i] for i in thumbnail_indices(len(cue.frame_times_ms))] for cue in cues]
    times = [ms / 1000 for picks in wanted for ms in picks]
    if times != sorted(times):
        raise FfaiError(f"{path}: the track's frame times are not in order")
    frames = iter(decoder.frames_at(path, times, tolerance=_STORED_TIME_TOLERANCE))
    for cue, picks in zip(cues, wanted):
        thumbs = []
        for ms in picks:
            frame = next(frames, None)
            if frame is None:
                raise FfaiError(f"{path}: no frame at {ms / 1000:g} s, where the track has one (has the file changed?)")
            # The stored time, not the decoded one: the same thumbnail as the caption run's.
            thumbs.append(thumbnail(frame.image, ms))
        yield _replace_thumbnails(cue, tuple(thumbs))
