"""The decoder fault stand-in: a decoder child that crashes or hangs on one named file, as one
would inside FFmpeg or Pillow on a hostile file (tests/test_fuzz_media.py).

A Python process whose PYTHONPATH holds this folder imports this module as it starts (site's
``sitecustomize`` hook). With ``$FFAI_TEST_DECODER_FAULT`` set to ``crash:NAME``, ``hang:NAME``
or ``spin:NAME``, it wraps every op of ``ffai.media.sandbox.OPS`` but the probe as that module is
imported, so that a decoder child reading the file named NAME dies of SIGSEGV, or stops
answering, blocked or looping on a CPU, when first asked for an answer (probing it is left
alone). A Decoder's fork server starts with its caller's environment, so ``environment(fault)``,
given to a subprocess or set in this process before a Decoder starts its server, reaches the
children that fork server forks. Ops run in the caller's process (``Decoder(isolated=False)``,
``conn`` None) are left alone."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ENV = "FFAI_TEST_DECODER_FAULT"
FOLDER = str(Path(__file__).resolve().parent)
SANDBOX = "ffai.media.sandbox"


def environment(fault: str) -> dict[str, str]:
    """The variables that give a process started with them, and the decoder children of the fork
    servers it starts, ``fault``: this folder first on PYTHONPATH, and ``$FFAI_TEST_DECODER_FAULT``."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != FOLDER]
    return {ENV: fault, "PYTHONPATH": os.pathsep.join([FOLDER, *rest])}


def _strike(kind: str, op: Callable[..., Iterator], call: tuple) -> Iterator:
    """The answers of ``op(*call)``, preceded by the fault, which strikes at the first asked for."""
    if kind == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "hang":
        time.sleep(3600)
    while kind == "spin":
        pass
    yield from op(*call)


def _faulty(op: Callable[..., Iterator], kind: str, name: str) -> Callable[..., Iterator]:
    def answers(file, args, conn, fds, settings) -> Iterator:
        call = (file, args, conn, fds, settings)
        if conn is None or Path(str(file)).name != name:  # in the caller's process, or another file
            return op(*call)
        return _strike(kind, op, call)

    return answers


def _install(sandbox) -> None:
    kind, _, name = os.environ[ENV].partition(":")
    for op, answers in list(sandbox.OPS.items()):
        if op != "probe":  # the stand-in strikes while decoding, after probing succeeded
            sandbox.OPS[op] = _faulty(answers, kind, name)


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds ffai.media.sandbox as the path finder does, and wraps its ops once it has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != SANDBOX:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            _install(module)

        spec.loader.exec_module = exec_module
        return spec


if __name__ == "sitecustomize" and os.environ.get(ENV):
    if SANDBOX in sys.modules:
        _install(sys.modules[SANDBOX])
    else:
        sys.meta_path.insert(0, _WrapOnImport())
