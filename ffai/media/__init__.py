"""Media input: probe a file, load a still image, sample video frames by timestamp.

Images are decoded by Pillow, video by PyAV (FFmpeg). Which one a file is gets decided by its
content, never its extension: Pillow is asked first (it reads only the header), then PyAV.

One module per concern: ``sources`` (the records readers give, how a source is named, the
checks made first), ``stills`` (Pillow, animations included), ``boxes`` (MP4/MOV sample-table
claims against the file's size), ``video`` (PyAV: decode, time, seek), ``sampling`` (the
readers a decoder runs on a file: probe, sample, frames at times), ``streams`` (live sources), ``sandbox`` (the decoder child
and its fork server) and ``decoder`` (``Decoder``).

Conventions:

- Frame times are seconds on the source timeline, measured from the video stream's
  ``start_time`` (0 when the container gives none), so the first frame of a clip is at ~0.0
  even in formats whose timestamps start elsewhere (MPEG-TS rarely starts at 0). Timestamps
  are FFmpeg's best-effort pts (pts, or dts where pts is out of order as in AVI).
- Sampling keeps, for each deadline ``start + n / fps``, the first decoded frame whose time is
  at or after it (correct for variable frame rate); a frame that covers several deadlines is
  kept once. Comparisons allow ``TIME_EPS`` so a frame stamped exactly on a deadline counts.
- Rotation from the stream's display matrix is applied (multiples of 90 degrees, like
  ffmpeg's autorotate); flips in the matrix and non-square sample aspect ratios are not.
- Animated GIF, APNG and WebP files are video, as ffmpeg treats them (a one-frame one is a
  still): Pillow decodes all three (FFmpeg's webp decoder refuses animated WebP), each frame
  timed by the durations of those before it (``stills.frame_ms``), upright, and RGB8 with any
  transparency composited onto white, the pixels the engine makes of the same picture as a
  still (``stills.opaque``). A still that only FFmpeg can read (e.g. EXR) is a one-frame video.
- A still is returned upright (EXIF orientation applied) in the mode Pillow read it (RGBA, LA,
  P with its transparency, 16-bit, float, CMYK ...), with no colour conversion: the engine
  converts it once, as its reference does (SmolVLM composites transparency onto white), so
  the model sees the pixels the reference sees for ``PIL.Image.open`` of the same file. Video
  frames are RGB8 (swscale converts them).
- A packet that fails to decode is skipped and counted, as ffmpeg does; the count is logged
  as a warning at the end. A file cut short therefore yields the frames before the cut.
- A file is named by its path or by a ``file://`` URL (``file:///PATH`` or
  ``file://localhost/PATH``, percent-encoded: ``sources.path_of``); a URL naming another
  machine's file is a MediaError.
- Live sources (``is_live``: standard input ``-``, a named pipe or device, a URL FFmpeg opens
  such as udp://, tcp://, http(s)://) are read as they arrive, without seeking: probing and
  sampling share one open container in one decoder child. Their frame times are stream time
  from the first decoded frame, kept continuous across timestamp jumps (``DISCONTINUITY_S``).
- Hostile files: every failure is a one-line MediaError naming the file. ``Decoder`` is the
  one way in: it reads each file in a child process of its own, so that a crash inside FFmpeg
  or Pillow fails that file alone and time and memory per file are bounded
  (``Decoder(isolated=False)`` reads in the calling process instead). Sample counts an MP4/MOV
  claims are checked against the file's size before FFmpeg allocates for them.

ffai never encodes video for the user; ``video_encoder`` names the encoder its generated clips
(the bench's clip, the demo clip, the test clips) are written with on this PyAV build.
"""

from __future__ import annotations

from ffai.media.decoder import Decoder
from ffai.media.sandbox import (
    FILE_TIMEOUT_S,
    MEMORY_LIMIT_BYTES,
    REALTIME_FACTOR,
    STALL_TIMEOUT_S,
    STEP_TIMEOUT_S,
)
from ffai.media.sources import (
    MAX_SIDE,
    STDIN,
    TIME_EPS,
    Frame,
    MediaInfo,
    check_sampling,
    is_live,
    is_url,
    local_path,
    source_label,
)
from ffai.media.streams import ANALYZE_S, DISCONTINUITY_S
from ffai.media.video import encoder_available, video_encoder

__all__ = [
    "ANALYZE_S",
    "DISCONTINUITY_S",
    "FILE_TIMEOUT_S",
    "MAX_SIDE",
    "MEMORY_LIMIT_BYTES",
    "REALTIME_FACTOR",
    "STALL_TIMEOUT_S",
    "STDIN",
    "STEP_TIMEOUT_S",
    "TIME_EPS",
    "Decoder",
    "Frame",
    "MediaInfo",
    "check_sampling",
    "encoder_available",
    "is_live",
    "is_url",
    "local_path",
    "source_label",
    "video_encoder",
]
