"""The decoder child: a file read in a process of its own, forked from a small fork server, so
that a crash inside FFmpeg or Pillow fails that file alone and each file's time and memory are
bounded. ``ffai.media.Decoder`` is its front door."""

from __future__ import annotations

import logging
import multiprocessing.connection
import multiprocessing.reduction
import os
import pickle
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from ffai.errors import FfaiError, MediaError
from ffai.media import frame_sampling, stills, streams
from ffai.media.sources import source_label
from ffai.media.streams import ANALYZE_S

log = logging.getLogger("ffai.media")


# Bounds on a decoder child (Decoder): each answer (a probe, an image, the next sample, the
# end) must come within STEP_TIMEOUT_S, and a whole file within FILE_TIMEOUT_S plus
# REALTIME_FACTOR times the media time sampled so far, so that no file can hang a run, however
# it is damaged, while a long clip keeps the time its length needs. The seconds are the
# child's own: the time it works (its CPU time, at most the clock's) or is blocked, never the
# time it waits for a CPU (``Child._time_left``). A child the machine keeps waiting, while other
# processes have the CPUs, is slow, not hung.
STEP_TIMEOUT_S = 60.0
FILE_TIMEOUT_S = 120.0
REALTIME_FACTOR = 5.0
# A child may map at most this much memory (RLIMIT_AS): FFmpeg and Pillow allocate what a
# header claims (sample tables, frame buffers), and a hostile claim must end in an allocation
# failure, a one-line error, rather than in a machine out of memory. The largest legal frame
# (MAX_SIDE squared: 805 MB as RGB) and a few of its reference frames fit within it.
MEMORY_LIMIT_BYTES = 8 << 30
# A live source that delivers no video for this long (--stall-timeout) has stalled; the default
# covers a sender's start-up and a network's hiccups, and is far below STEP_TIMEOUT_S.
STALL_TIMEOUT_S = 10.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc's unit of CPU time
_RECHECK_S = 1.0  # how often a parent waiting for an answer counts the child's time (Child._time_left)


@dataclass(frozen=True)
class Bounds:
    """How long a decoder child may take (the constants above say why)."""

    step_timeout: float = STEP_TIMEOUT_S
    file_timeout: float = FILE_TIMEOUT_S
    realtime_factor: float = REALTIME_FACTOR
    stall_timeout: float = STALL_TIMEOUT_S  # a live source that delivers no video this long has stalled


class _ChildTraceback(Exception):
    """The formatted traceback of an exception raised in a decoder child (shown with -v)."""


class _ForkServer:
    """One clean, single-threaded process that has imported this module and forks a decoder
    child per file: a fork is far cheaper than a fresh interpreter (docs/hostile-files.md), and
    forking the caller instead would copy its threads and its model (counted again in every
    child's resident memory). multiprocessing's fork server re-runs the caller's main script in
    every child, hence this one. Children are this server's, so it reaps them and reports how
    each ended."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        code = f"from ffai.media.sandbox import serve_forks; serve_forks({theirs.fileno()})"
        # The folder this ffai was imported from goes first on the server's import path, so it
        # finds the same ffai however this process was started (a checkout without install too);
        # no stdout, which may be the track (-o -), for it or its children.
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", code],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        self.socket = ours
        self.control = multiprocessing.connection.Connection(os.dup(ours.fileno()))
        self.lock = threading.Lock()
        self.owner = os.getpid()

    def fork(self, request: tuple, fds: tuple[int, ...] = ()) -> tuple[int, multiprocessing.connection.Connection]:
        """A new child running `request` (op, file, args) and holding copies of `fds` (our
        standard input, for a source read from it): its pid and our end of its pipe."""
        ours, theirs = socket.socketpair()
        with self.lock, theirs:
            self.control.send(("fork", (request, len(fds))))
            multiprocessing.reduction.sendfds(self.socket, [theirs.fileno(), *fds])
            pid = self.control.recv()
        return pid, multiprocessing.connection.Connection(ours.detach())

    def reap(self, pid: int) -> int:
        """Wait for child `pid` to end; its wait status."""
        with self.lock:
            self.control.send(("reap", pid))
            return self.control.recv()

    def close(self) -> None:
        self.control.close()
        self.socket.close()
        self.process.wait()


class Sandbox:
    """Where a Decoder's children come from: a fork server, started on first use, again after
    it died, and anew in a forked copy of this process (the server it inherited is its
    parent's). ``close`` ends it, and a later child starts a new one; a sandbox never closed
    ends its server when it is collected or the process exits."""

    def __init__(self) -> None:
        self._server: _ForkServer | None = None
        self._stop: weakref.finalize | None = None  # closes _server, once
        self._lock = threading.Lock()

    def server(self) -> _ForkServer:
        """The running fork server, started now when there is none."""
        with self._lock:
            server = self._server
            if server is None or server.owner != os.getpid() or server.process.poll() is not None:
                if self._stop is not None:
                    self._stop()
                server = self._server = _ForkServer()
                self._stop = weakref.finalize(self, server.close)
            return server

    def child(self, bounds: Bounds, op: str, file: Path | str, args: tuple = (), fds: tuple[int, ...] = ()) -> Child:
        """A new decoder child running `op` on `file` (``op_answers``) within `bounds`."""
        return Child(self.server(), bounds, op, file, args, fds)

    def close(self) -> None:
        with self._lock:
            stop, self._stop, self._server = self._stop, None, None
        if stop is not None:
            stop()


def serve_forks(fd: int) -> None:
    """The fork server's loop (run as ``python -c``): fork a child per request, reap on request,
    and end when the parent hangs up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    Image.init()  # Pillow imports its format plugins on first open: once here, not in every child
    sock = socket.socket(fileno=fd)
    control = multiprocessing.connection.Connection(os.dup(fd))
    while True:
        try:
            kind, payload = control.recv()
        except (EOFError, OSError):
            return
        if kind == "reap":
            control.send(os.waitpid(payload, 0)[1])
            continue
        request, extra = payload
        child_fd, *passed = multiprocessing.reduction.recvfds(sock, 1 + extra)
        pid = os.fork()
        if pid == 0:
            sock.close()
            control.close()
            try:
                _child_main(multiprocessing.connection.Connection(child_fd), *request, tuple(passed))
            finally:
                os._exit(0)
        for fd_ in (child_fd, *passed):
            os.close(fd_)
        control.send(pid)


def _stat(path: str) -> list[bytes]:
    """The fields of a /proc stat file after the command name: [0] the state, [11] and [12]
    utime and stime in clock ticks (proc(5) fields 3, 14, 15)."""
    with open(path, "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def cpu_usage(pid: int) -> tuple[float, bool] | None:
    """CPU seconds process `pid` has used (user and system, all its threads) and whether one of
    its threads is ready to run (running, or waiting for a CPU); None where the system does not
    say (no /proc), and then the bounds count plain time."""
    try:
        fields = _stat(f"/proc/{pid}/stat")
        tasks = os.listdir(f"/proc/{pid}/task")
    except (OSError, IndexError):
        return None
    runnable = False
    for task in tasks:
        try:
            runnable = runnable or _stat(f"/proc/{pid}/task/{task}/stat")[0] == b"R"
        except (OSError, IndexError):  # the thread ended as it was read
            continue
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS, runnable


def _one(function: Callable, file: Path | str) -> Iterator:
    """One answer, ``function(file)``, computed when asked for."""
    yield function(file)


# What a decoder computes for each op, called as (file, args, conn, fds, settings): see op_answers.
OPS: dict[str, Callable[..., Iterator]] = {
    "probe": lambda file, *_: _one(frame_sampling.probe, file),
    "load_image": lambda file, *_: _one(stills.load_image, file),
    "sample": lambda file, args, *_: frame_sampling.sample(file, *args),
    "frames_at": lambda file, args, *_: frame_sampling.frames_at(file, *args),
    "live": lambda file, args, conn, fds, settings: streams.live(conn, file, fds[0] if fds else None, settings),
}


def op_answers(op: str, file: Path | str, args: tuple, conn, fds: tuple[int, ...], settings: list) -> Iterator:
    """What a decoder computes for `op` on `file` (checked, or a live source's name), one answer
    a step: a probe, an image, the samples (``OPS``). The same in a child and in a Decoder that
    runs in its caller's process (`conn` None there). A live source's sampling arguments arrive
    in `settings` after its probe."""
    return OPS[op](file, args, conn, fds, settings)


class _LogToParent(logging.Handler):
    def __init__(self, conn) -> None:
        super().__init__(logging.WARNING)
        self.conn = conn

    def emit(self, record: logging.LogRecord) -> None:
        self.conn.send(("log", record.levelno, record.getMessage()))


def _child_main(conn, op: str, file: Path | str, args: tuple, fds: tuple[int, ...] = ()) -> None:
    """A decoder child's life: run `op` and send its answers, one for each "next" asked,
    until it is exhausted, fails, or the parent hangs up. Each answer carries the seconds the
    child worked on it, so time the parent spent elsewhere, and time the machine spent on other
    processes, does not count against the file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # libtiff and FFmpeg print damage reports straight to fd 2; the parent reports in one line.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    log.addHandler(_LogToParent(conn))
    log.propagate = False

    def show(message, category, filename, lineno, file_=None, line=None) -> None:
        log.warning("%s: %s", file, " ".join(str(message).split()))

    warnings.showwarning = show
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = MEMORY_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(hard, MEMORY_LIMIT_BYTES)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    settings: list = []  # a live source's sampling arguments, sent after its probe
    answers = op_answers(op, file, args, conn, fds, settings)
    try:
        while True:
            message = conn.recv()
            if isinstance(message, tuple) and message[0] == "settings":
                settings[:] = message[1]
                continue
            if message != "next":
                return
            started, cpu_started = time.monotonic(), time.process_time()
            try:
                answer = next(answers)
            except StopIteration:
                conn.send(("done", None))
                return
            except BaseException as e:
                conn.send(("raise", _portable(e), traceback.format_exc()))
                return
            # Its own CPU time (all threads), at most the clock's: not the time it waited for a CPU.
            spent = min(time.process_time() - cpu_started, time.monotonic() - started)
            conn.send(("answer", answer, spent))
    except (EOFError, BrokenPipeError):  # the parent is done with this file
        return


def _portable(error: BaseException) -> BaseException:
    """`error`, or a stand-in with its type and text when it would not unpickle in the parent."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


class Child:
    """The parent's end of one decoder child: asks for answers and enforces the time bounds."""

    def __init__(
        self,
        server: _ForkServer,
        bounds: Bounds,
        op: str,
        file: Path | str,
        args: tuple = (),
        fds: tuple[int, ...] = (),
    ) -> None:
        self.server, self.bounds, self.file = server, bounds, source_label(file)
        self.live = op == "live"
        # A live source has no answer to wait for but the next video: silence is a stall. Its
        # first answer, the probe, also waits for the ANALYZE_S of stream FFmpeg reads first.
        self.step_timeout = bounds.stall_timeout + ANALYZE_S if self.live else bounds.step_timeout
        try:
            self.pid, self.conn = self.server.fork((op, file, args), fds)
        except (EOFError, OSError) as e:  # the server is gone: no file can be read
            raise FfaiError(f"cannot start a decoder process for {self.file} (its fork server exited: {e})") from e
        self.busy = 0.0  # seconds the child worked on the answers so far
        self.asked: float | None = None
        self.charged = 0.0  # seconds counted against the answer being waited for (_time_left)
        self.seen_at, self.cpu_seen = 0.0, 0.0  # when the child's CPU time was last read, and what it was
        self.heard = 0.0  # when the child last said video is arriving (live sources)
        self.status: int | None = None

    def ask(self) -> None:
        """Ask for the next answer now, so the child works while the caller does."""
        if self.asked is None:
            self.conn.send("next")
            self.asked = self.seen_at = time.monotonic()
            self.charged, self.cpu_seen = 0.0, (cpu_usage(self.pid) or (0.0, False))[0]

    def configure(self, args: tuple) -> None:
        """Tell a live source's child how to sample (after its probe)."""
        try:
            self.conn.send(("settings", args))
        except OSError:
            raise MediaError(f"{self.file}: the decoder crashed ({self._death()})") from None

    def answer(self, media_time: float = 0.0):
        """The next answer, or None once the child is exhausted. `media_time` is how far into
        the file the answers have come (it extends the file's time budget, which counts the
        child's working time: a caller that is slow to ask again, as a model is, costs nothing)."""
        try:
            self.ask()
        except OSError:  # it died before it was asked
            raise MediaError(f"{self.file}: the decoder crashed ({self._death()})") from None
        budget = self.bounds.file_timeout + self.bounds.realtime_factor * media_time - self.busy
        while True:
            if not self.conn.poll():  # nothing yet: count the time since the last look, then wait
                step, file = self._time_left(budget)
                if min(step, file) <= 0:
                    self.close()
                    raise MediaError(self._timeout_message(step <= file))
                self.conn.poll(min(step, file, _RECHECK_S))
                continue
            try:
                kind, *rest = self.conn.recv()
            except (EOFError, OSError):
                raise MediaError(f"{self.file}: the decoder crashed ({self._death()})") from None
            if kind == "log":
                log.log(rest[0], "%s", rest[1])
                continue
            if kind == "tick":
                self.heard = time.monotonic()
                continue
            self.asked = None
            if self.live:
                self.step_timeout = self.bounds.stall_timeout
            if kind == "answer":
                self.busy += rest[1]
                return rest[0]
            if kind == "done":
                return None
            error, child_traceback = rest
            if isinstance(error, FfaiError):
                raise error
            raise error from _ChildTraceback(child_traceback)

    def _time_left(self, budget: float) -> tuple[float, float]:
        """Seconds left of this answer's step bound and of the file's budget. Since it was asked,
        the child is charged the time it was blocked and the CPU time it worked (all threads, at
        most the clock's), never the time it waited for a CPU; where the system does not say
        (``cpu_usage``), plain time. A live source's step bound is the source's silence, in
        plain time (``--stall-timeout``)."""
        now = time.monotonic()
        usage = cpu_usage(self.pid)
        if usage is None:
            self.charged = now - self.asked
        else:
            cpu, runnable = usage
            elapsed, worked = now - self.seen_at, cpu - self.cpu_seen
            self.charged += min(worked, elapsed) if runnable or worked > 0 else elapsed
            self.seen_at, self.cpu_seen = now, cpu
        if self.live:
            return max(self.asked, self.heard) + self.step_timeout - now, budget - self.charged
        return self.step_timeout - self.charged, budget - self.charged

    def _timeout_message(self, step: bool) -> str:
        if step and self.live:
            return f"{self.file}: the source stalled: no video for {self.bounds.stall_timeout:g} s (--stall-timeout)"
        limit = f"{self.step_timeout:g} s" if step else "the file's time budget"
        return f"{self.file}: decoding stopped: the decoder gave no answer within {limit}"

    def _death(self) -> str:
        self.close()
        if os.WIFSIGNALED(self.status):
            return f"killed by {signal.Signals(os.WTERMSIG(self.status)).name}"
        return f"exit status {os.waitstatus_to_exitcode(self.status)}"

    def close(self) -> None:
        if self.status is not None:
            return
        self.conn.close()
        try:
            os.kill(self.pid, signal.SIGKILL)  # finished or not: nothing of it is needed now
        except ProcessLookupError:
            pass
        try:
            self.status = self.server.reap(self.pid)
        except (EOFError, OSError):  # its server is gone (closed, or died): the kill is all there is to know
            self.status = signal.SIGKILL
