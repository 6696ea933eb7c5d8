"""A loopback stand-in for the Hugging Face hub's ``/<repo>/resolve/<revision>/<path>`` route.

It serves bytes from memory, answers ``Range: bytes=N-`` with 206 like the hub's CDN, answers
HEAD, records every request it sees, and announces each file's hash as the hub does: an LFS file
(``*.safetensors``, ``*.bin``, ``*.onnx``, or those named in ``lfs``) by ``X-Linked-Etag: "<sha256>"``
and ``X-Linked-Size``, another by ``ETag: "<git blob sha1>"``, on the resolve route's answer (for
an LFS file, the 302 when redirecting; the hub serves other files itself); the "CDN" sends an ETag of its own (an md5, as S3 does), which is not the
hub's. It can misbehave on purpose: cut a body short once, ignore Range, redirect to a "CDN" (on
the same or another host name), answer for a renamed repository with a relative redirect,
answer with an error status, or announce another hash or none.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"bytes=(\d+)-")


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    method: str = "GET"


@dataclass
class HubServer:
    files: dict[str, bytes] = field(default_factory=dict)  # "org/name/resolve/rev/path" -> body
    commit: str | None = None  # sent as X-Repo-Commit by the resolve route
    # None, "same" (127.0.0.1) or "cross" (localhost): LFS files get a 302 to /cdn/..., as on the hub
    redirect: str | None = None
    ignore_range: bool = False
    cut_after: dict[str, int] = field(default_factory=dict)  # file path -> bytes sent, once
    status: dict[str, int] = field(default_factory=dict)  # file path -> forced HTTP status
    lfs: set[str] = field(default_factory=set)  # file paths stored in LFS besides the weight suffixes
    announce: dict[str, str | None] = field(default_factory=dict)  # file path -> ETag sent instead (None: none)
    renamed: dict[str, str] = field(default_factory=dict)  # old repo -> repo: a relative 307, as the hub does
    requests: list[Seen] = field(default_factory=list)

    def add(self, repo: str, revision: str, path: str, body: bytes) -> None:
        self.files[f"{repo}/resolve/{revision}/{path}"] = body

    def start(self) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def is_lfs(self, path: str) -> bool:
        return path in self.lfs or path.endswith((".safetensors", ".bin", ".onnx"))

    def heads(self) -> list[str]:
        return [s.path for s in self.requests if s.method == "HEAD"]

    def ranges(self) -> list[str]:
        return [s.headers["Range"] for s in self.requests if "Range" in s.headers]


def git_blob_sha1(body: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: one request per connection, so cutting a body short is just returning early.
        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, body: bool) -> None:
            hub.requests.append(Seen(self.path, dict(self.headers.items()), self.command))
            route = unquote(urlsplit(self.path).path).lstrip("/")
            old = next((r for r in hub.renamed if route.startswith(r + "/")), None)
            if old is not None:
                self.send_response(307)
                self.send_header("Location", "/" + hub.renamed[old] + urlsplit(self.path).path[len(old) + 1 :])
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif route.startswith("cdn/"):
                self._send_file(route[len("cdn/") :], body)
            elif hub.redirect and hub.is_lfs(_name(route)):
                key = route
                if hub.files.get(key) is None or hub.status.get(_name(key), 200) != 200:
                    self._send_file(key, body)  # the hub answers an error itself, as the real one does
                    return
                host = "127.0.0.1" if hub.redirect == "same" else "localhost"
                self.send_response(302)
                self.send_header("Location", f"http://{host}:{hub.port}/cdn/{route}")
                self._commit_header()
                self._hash_headers(key)
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self._send_file(route, body, hub_answer=True)

        def _send_file(self, key: str, body: bool, hub_answer: bool = False) -> None:
            data = hub.files.get(key)
            name = _name(key)
            code = hub.status.get(name, 200 if data is not None else 404)
            if code != 200:
                self.send_error(code)
                return
            start = self._range_start()
            if start is not None and start >= len(data):
                self.send_error(416)
                return
            self.send_response(200 if start is None else 206)
            if start is not None:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            if hub_answer:
                self._commit_header()
                self._hash_headers(key)
            else:
                self.send_header("ETag", f'"{hashlib.md5(data).hexdigest()}"')
            payload = data[start or 0 :]
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if body:
                self.wfile.write(payload[: hub.cut_after.pop(name, len(payload))])

        def _hash_headers(self, key: str) -> None:
            name, data = _name(key), hub.files[key]
            etag = hub.announce.get(name, hashlib.sha256(data).hexdigest() if hub.is_lfs(name) else git_blob_sha1(data))
            if etag is None:
                return
            if hub.is_lfs(name):
                self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("X-Linked-Size", str(len(data)))
            else:
                self.send_header("ETag", f'"{etag}"')

        def _range_start(self) -> int | None:
            match = _RANGE.fullmatch(self.headers.get("Range", ""))
            return None if match is None or hub.ignore_range else int(match[1])

        def _commit_header(self) -> None:
            if hub.commit:
                self.send_header("X-Repo-Commit", hub.commit)

        def log_message(self, format: str, *args) -> None:  # keep pytest output clean
            pass

    return Handler


def _name(key: str) -> str:
    return key.split("/resolve/", 1)[-1].split("/", 1)[-1]
