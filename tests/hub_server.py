"""A loopback stand-in for the Hugging Face hub's ``/<repo>/resolve/<revision>/<path>`` route.

It serves bytes from memory, answers ``Range: bytes=N-`` with 206 like the hub's CDN, records
every request it sees, and can misbehave on purpose: cut a body short once, ignore Range,
redirect to a "CDN" (on the same or another host name), or answer with an error status.
"""

from __future__ import annotations

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


@dataclass
class HubServer:
    files: dict[str, bytes] = field(default_factory=dict)  # "org/name/resolve/rev/path" -> body
    commit: str | None = None  # sent as X-Repo-Commit by the resolve route
    redirect: str | None = None  # None, "same" (127.0.0.1) or "cross" (localhost): 302 to /cdn/...
    ignore_range: bool = False
    cut_after: dict[str, int] = field(default_factory=dict)  # file path -> bytes sent, once
    status: dict[str, int] = field(default_factory=dict)  # file path -> forced HTTP status
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

    def ranges(self) -> list[str]:
        return [s.headers["Range"] for s in self.requests if "Range" in s.headers]


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: one request per connection, so cutting a body short is just returning early.
        def do_GET(self) -> None:
            hub.requests.append(Seen(self.path, dict(self.headers.items())))
            route = unquote(urlsplit(self.path).path).lstrip("/")
            if route.startswith("cdn/"):
                self._send_file(route[len("cdn/") :])
            elif hub.redirect:
                host = "127.0.0.1" if hub.redirect == "same" else "localhost"
                self.send_response(302)
                self.send_header("Location", f"http://{host}:{hub.port}/cdn/{route}")
                self._commit_header()
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self._send_file(route, commit=True)

        def _send_file(self, key: str, commit: bool = False) -> None:
            body = hub.files.get(key)
            name = key.split("/resolve/", 1)[-1].split("/", 1)[-1]
            code = hub.status.get(name, 200 if body is not None else 404)
            if code != 200:
                self.send_error(code)
                return
            start = self._range_start()
            if start is not None and start >= len(body):
                self.send_error(416)
                return
            self.send_response(200 if start is None else 206)
            if start is not None:
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            if commit:
                self._commit_header()
            payload = body[start or 0 :]
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload[: hub.cut_after.pop(name, len(payload))])

        def _range_start(self) -> int | None:
            match = _RANGE.fullmatch(self.headers.get("Range", ""))
            return None if match is None or hub.ignore_range else int(match[1])

        def _commit_header(self) -> None:
            if hub.commit:
                self.send_header("X-Repo-Commit", hub.commit)

        def log_message(self, format: str, *args) -> None:  # keep pytest output clean
            pass

    return Handler
