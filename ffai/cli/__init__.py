"""The ``ffai`` command line: parse, validate cheaply, call one library function per command.

Every FfaiError becomes one line on stderr (``ffai: error: …``) and its exit code; usage
errors exit 2; Ctrl-C exits 130. Tracebacks only with ``-v``.

The modules: ``root`` (the app, its global options, ``run`` and ``main``: how a failure ends),
``console`` (where the messages go, and -v/-q), ``options`` (the options several commands take),
and one module per command: ``engines``, ``models``, ``caption``, ``sheet``.
"""

from ffai.cli.root import app, main, run

__all__ = ["app", "main", "run"]
