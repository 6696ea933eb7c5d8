"""Live sources on loopback for the tests and ``scripts/bench_live.py``: a clip of the demo
model's scenes encoded as MPEG-TS with PyAV, and senders that deliver it at real-time pace
through a pipe, over UDP, or from a small HTTP server on 127.0.0.1 (a finished file, or a
chunked response that grows as it is sent).

Pacing: the stream is cut after each video packet, and the bytes up to the next packet are
released when the wall clock reaches that packet's decode time, as a live encoder would send
them. A sender records when it released its first and last bytes (``Pacer``).
"""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import av

from ffai.bench import demo_scenes

TS_PACKET = 188
UDP_PAYLOAD = 7 * TS_PACKET  # what ffmpeg sends per datagram for MPEG-TS over UDP


def encode_ts(
    scenes: Sequence[demo_scenes.Scene],
    seconds_per_scene: float,
    fps: int = demo_scenes.CLIP_FPS,
    size: tuple[int, int] = demo_scenes.CLIP_SIZE,
    first_pts: int = 0,
) -> bytes:
    """An MPEG-TS clip showing ``scenes`` one after another (H.264 without B-frames where the
    build has libx264, a keyframe every second); its first frame's pts is ``first_pts``
    (in 1/fps units), as a sender that started earlier would stamp it."""
    from ffai.media import video_encoder

    out = io.BytesIO()
    codec = video_encoder()
    options = {"preset": "veryfast", "tune": "zerolatency"} if codec == "libx264" else {}
    with av.open(out, "w", format="mpegts") as container:
        stream = container.add_stream(codec, rate=fps, options=options)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = Fraction(1, fps)
        stream.codec_context.gop_size = fps
        stream.codec_context.thread_count = 1
        index = first_pts
        for scene in scenes:
            for image in demo_scenes.render(scene, round(seconds_per_scene * fps), size):
                frame = av.VideoFrame.from_image(image)
                frame.pts, frame.time_base = index, Fraction(1, fps)
                index += 1
                container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return out.getvalue()


def paced_chunks(data: bytes) -> list[tuple[float, bytes]]:
    """``(seconds from the start, bytes)``: each video packet's bytes, due at its decode time."""
    with av.open(io.BytesIO(data), "r", format="mpegts") as container:
        stream = container.streams.video[0]
        marks = [
            (float(p.dts * stream.time_base), p.pos)
            for p in container.demux(stream)
            if p.dts is not None and p.pos >= 0
        ]
    first = marks[0][0]
    chunks, sent = [], 0
    for (due, _), (_, following) in zip(marks, marks[1:] + [(None, len(data))]):
        following = max(following, sent)
        chunks.append((due - first, data[sent:following]))
        sent = following
    return chunks


@dataclass
class Pacer:
    """Releases chunks at real-time pace (``speed`` times faster), from ``start()``."""

    chunks: list[tuple[float, bytes]]
    speed: float = 1.0
    started: float | None = None  # time.monotonic() of the first release
    finished: float | None = None  # ... of the last
    released: list[float] = field(default_factory=list)  # when each chunk went out

    def run(self, write: Callable[[bytes], object], stop_after: float | None = None) -> None:
        """Write each chunk when due; with ``stop_after`` (seconds of stream), stop there."""
        self.started = time.monotonic()
        for due, data in self.chunks:
            if stop_after is not None and due >= stop_after:
                break
            delay = self.started + due / self.speed - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            write(data)
            self.released.append(time.monotonic())
        self.finished = time.monotonic()


def send_udp(port: int, pacer: Pacer, host: str = "127.0.0.1") -> None:
    """The paced stream as MPEG-TS datagrams to ``host:port`` (7 TS packets each)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        pending = bytearray()

        def write(data: bytes) -> None:
            pending.extend(data)
            while len(pending) >= UDP_PAYLOAD:
                sock.sendto(bytes(pending[:UDP_PAYLOAD]), (host, port))
                del pending[:UDP_PAYLOAD]

        pacer.run(write)
        if pending:
            sock.sendto(bytes(pending), (host, port))


def udp_port_bound(port: int) -> bool:
    """Whether a UDP socket on this machine is bound to ``port`` (Linux: /proc/net/udp)."""
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        if any(int(row.split()[1].rsplit(":", 1)[1], 16) == port for row in rows):
            return True
    return False


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StreamServer:
    """An HTTP server on 127.0.0.1 serving one MPEG-TS clip two ways: ``/clip.ts``, the
    finished file at once (with its length), and ``/live.ts``, a chunked response that grows
    at real-time pace (its ``pacer`` records when)."""

    def __init__(self, data: bytes, speed: float = 1.0) -> None:
        self.data = data
        self.pacer = Pacer(paced_chunks(data), speed)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path == "/clip.ts":
                    self.send_response(200)
                    self.send_header("Content-Type", "video/mp2t")
                    self.send_header("Content-Length", str(len(server.data)))
                    self.end_headers()
                    self.wfile.write(server.data)
                elif self.path == "/live.ts":
                    self.send_response(200)
                    self.send_header("Content-Type", "video/mp2t")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    server.pacer.run(self._chunk)
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                else:
                    self.send_error(404)

            def _chunk(self, data: bytes) -> None:
                if data:
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> StreamServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
