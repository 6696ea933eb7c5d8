"""What a container holds besides its streams' packets, carried from the input into a muxed output
(``ffai.outputs.mux``) as ffmpeg's ``-map 0 -c copy`` carries it, and what the output did not keep.

* The container's metadata (title, comment, creation time, any other tag), not the tags a muxer
  writes about itself (``encoder``, MP4's brands).
* Its chapters with their titles, moved and cut with the copy (``-ss``/``-t``): a chapter keeps
  what of it lies inside the copy.
* Its attachments (Matroska's fonts and cover art, which FFmpeg reads as a one-frame video
  stream), as attachments; only Matroska holds them.

Streams' own metadata and dispositions are the mux's, copied with each stream. What a target
container cannot hold (MP4's attachments, a tag MP4 has no box for, a disposition it cannot
mark) is found by reading the written file back with FFmpeg, so the one warning line names what
was really left out, whatever the muxer's rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

# Tags a muxer writes about itself and the file, not about the content: never carried.
MUXER_TAGS = frozenset({"encoder", "major_brand", "minor_version", "compatible_brands", "duration"})
# A stream's tags that a muxer writes of its own (lengths, handlers, statistics), not compared.
_STREAM_MUXER_TAGS = frozenset({"duration", "handler_name", "vendor_id", "encoder"})
# Matroska's statistics tags (mkvmerge's): about the file as written, so a copy's may differ.
_STATISTICS = ("_statistics_", "number_of_", "bps")
# The stream title's other name in an MP4 (its user data "name" box).
_TITLE_ALIASES = {"title": ("title", "name")}
_MATROSKA = "matroska"
# AVDISCARD_ALL: a track its demuxer keeps for itself (MP4's chapter text track).
_DISCARD_ALL = 48


@dataclass(frozen=True)
class Attachment:
    name: str
    mimetype: str
    data: bytes
    metadata: dict[str, str]


@dataclass
class Extras:
    """What of the container is carried: its tags, its chapters (in the output's timeline) and
    its attachments."""

    metadata: dict[str, str] = field(default_factory=dict)
    chapters: list[dict[str, Any]] = field(default_factory=list)
    attachments: list[Attachment] = field(default_factory=list)


def read_extras(container, path: str, shift: Fraction | None, end: Fraction | None) -> Extras:
    """``container``'s (the file ``path``, open) tags, chapters and attachments. The copy starts at
    ``shift`` seconds of the input (None: nothing is copied, so no chapter is kept) and stops at
    ``end`` (None: its end)."""
    metadata = {k: v for k, v in container.metadata.items() if k.lower() not in MUXER_TAGS}
    chapters = [] if shift is None else cut_chapters(container.chapters(), shift, end)
    attachments = [
        Attachment(s.name, s.mimetype, bytes(s.data), _own_tags(s.metadata))
        for s in container.streams
        if s.type == "attachment"
    ]
    if any(is_picture(s) for s in container.streams):
        attachments += _pictures(path)
    return Extras(metadata, chapters, attachments)


def is_attachment(stream) -> bool:
    """A file the container carries beside its streams: an attachment, or a picture (cover art),
    which FFmpeg reads as a video stream of one frame marked ``attached_pic``."""
    return stream.type == "attachment" or is_picture(stream)


def is_picture(stream) -> bool:
    import av

    return stream.type == "video" and bool(stream.disposition & av.stream.Disposition.attached_pic)


def _pictures(path: str) -> list[Attachment]:
    """The pictures of the file ``path`` (read in a handle of their own: the copy's is reading)."""
    import av

    found = []
    with av.open(path, metadata_errors="ignore") as container:
        for stream in [s for s in container.streams if is_picture(s)]:
            packet = next((p for p in container.demux(stream) if p.size), None)
            if packet is None:
                continue
            png = stream.codec_context is not None and stream.codec_context.name == "png"
            name = stream.metadata.get("filename") or f"cover.{'png' if png else 'jpg'}"
            mimetype = stream.metadata.get("mimetype") or f"image/{'png' if png else 'jpeg'}"
            found.append(Attachment(name, mimetype, bytes(packet), _own_tags(stream.metadata)))
            container.seek(0)
    return found


def _own_tags(tags) -> dict[str, str]:
    return {k: v for k, v in tags.items() if k.lower() not in ("filename", "mimetype")}


def cut_chapters(chapters: list[dict], shift: Fraction, end: Fraction | None) -> list[dict]:
    """The chapters as they fall in a copy of ``[shift, end)``, moved to start at 0: those ending
    before it or starting after it dropped, the others cut to it, in their own time base."""
    kept = []
    for chapter in chapters:
        base = Fraction(chapter["time_base"])
        start, stop = chapter["start"] * base, chapter["end"] * base
        if end is not None:
            stop = min(stop, end)
        start = max(start, shift)
        if stop <= start:
            continue
        kept.append({**chapter, "start": round((start - shift) / base), "end": round((stop - shift) / base)})
    return kept


def write_extras(output, extras: Extras, muxer: str) -> None:
    """Put ``extras`` in ``output`` (a PyAV output container not yet started); attachments only
    into Matroska, whose muxer alone takes them (``left_out`` then names them)."""
    for key, value in extras.metadata.items():
        output.metadata[key] = value
    if extras.chapters:
        output.set_chapters(extras.chapters)
    if muxer != _MATROSKA:
        return
    for attachment in extras.attachments:
        stream = output.add_attachment(attachment.name, attachment.mimetype, attachment.data)
        for key, value in attachment.metadata.items():
            stream.metadata[key] = value


def is_internal(stream) -> bool:
    """A track its demuxer keeps for itself (MP4's chapter text track, carried as chapters)."""
    return int(stream.discard) == _DISCARD_ALL


@dataclass(frozen=True)
class StreamCopy:
    """A copied stream as the input had it: its index there, tags and disposition flags."""

    index: int
    metadata: dict[str, str]
    disposition: int


def left_out(path: str, extras: Extras, streams: list[StreamCopy], ignore_flags: int) -> list[str]:
    """What of ``extras`` and of the copied ``streams``' tags and dispositions the written file
    ``path`` does not hold, read back with FFmpeg, each as a phrase (``the tag ARTIST``).
    ``ignore_flags``: dispositions the mux changes on purpose (the default mark)."""
    import av

    missing = []
    with av.open(path, metadata_errors="ignore") as written:
        missing += [f"the tag {k}" for k in extras.metadata if not _holds(written.metadata, k)]
        chapters = written.chapters()
        if len(chapters) < len(extras.chapters):
            missing.append(f"{len(extras.chapters) - len(chapters)} of {len(extras.chapters)} chapters")
        elif sum(bool(c["metadata"].get("title")) for c in chapters) < sum(
            bool(c["metadata"].get("title")) for c in extras.chapters
        ):
            missing.append("the chapters' titles")
        attached = {
            s.name if s.type == "attachment" else s.metadata.get("filename")
            for s in written.streams
            if is_attachment(s)
        }
        missing += [f"the attachment {a.name}" for a in extras.attachments if a.name not in attached]
        tracks = [s for s in written.streams if not is_attachment(s)]
        per_stream: dict[str, list[int]] = {}  # what is missing -> the streams it is missing from
        for before, after in zip(streams, tracks):
            for key, value in before.metadata.items():
                if not (_stream_muxer_tag(key) or _holds(after.metadata, key) or _unset(key, value)):
                    per_stream.setdefault(f"the tag {key}", []).append(before.index)
            lost = av.stream.Disposition(before.disposition & ~int(after.disposition) & ~ignore_flags)
            for flag in lost:
                per_stream.setdefault(f"the {flag.name.replace('_', ' ')} mark", []).append(before.index)
        for what, indices in per_stream.items():
            numbers = ", ".join(f"#{i}" for i in indices)
            missing.append(f"{what} of stream{'s' if len(indices) > 1 else ''} {numbers}")
    return missing


def _unset(key: str, value: str) -> bool:
    """A tag that says nothing: language ``und`` (undetermined), which Matroska stores as no tag."""
    return key.lower() == "language" and value == "und"


def _holds(tags: dict[str, str], key: str) -> bool:
    names = {k.lower() for k in tags}
    return any(alias in names for alias in _TITLE_ALIASES.get(key.lower(), (key.lower(),)))


def _stream_muxer_tag(key: str) -> bool:
    key = key.lower()
    return key in _STREAM_MUXER_TAGS or key.startswith(_STATISTICS) or key.startswith("duration")
