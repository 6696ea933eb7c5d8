"""The CLI surface that needs no model: help, engines, flag validation, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ffai.cli import run


def ffai(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the real ``ffai`` entry point in a subprocess (as a user's shell would)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "ffai", *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, fragment: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ffai: error:"), proc.stderr
    assert fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_and_engines_do_not_import_torch():
    """Every engine's kernels report included: both engines report theirs from the flags alone."""
    code = (
        "import sys, io, json, contextlib\n"
        "from ffai.cli import run\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert run(['--help']) == 0\n"
        "    assert run(['engines']) == 0\n"
        "with contextlib.redirect_stdout(out):\n"
        "    assert run(['engines', '--json']) == 0\n"
        "reported = {e['name'] for e in json.loads(out.getvalue()) if e['kernels']}\n"
        "assert reported >= {'smolvlm', 'qwen3-vl'}, reported\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_help_answers_fast():
    start = time.perf_counter()
    proc = ffai("--help")
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0
    assert "caption" in proc.stdout and "engines" in proc.stdout
    # A whole interpreter start included; the budget is generous for a loaded CI machine.
    assert elapsed < 3.0, elapsed


def test_install_hints_in_help_keep_their_extras():
    # Rich reads "[ray]" as markup and drops it unless escaped.
    proc = ffai("caption", "--help", env={"COLUMNS": "400"})
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'ffai[ray]'" in proc.stdout


def test_engines_table_lists_both_engines_and_their_kernels():
    proc = ffai("engines")
    assert proc.returncode == 0, proc.stderr
    for word in ("smolvlm", "vlm", "smolvlm2-256m-video-instruct", "qwen3-vl-2b-instruct", "int8 "):
        assert word in proc.stdout
    for name in ("smolvlm", "qwen3-vl"):  # each engine's kernels report, under its own heading
        assert f"{name} on this CPU: float32 for exact output" in proc.stdout
    assert "vision attention:" in proc.stdout  # a group only Qwen3-VL's report has


def test_engines_json():
    proc = ffai("engines", "--json")
    assert proc.returncode == 0
    engines = json.loads(proc.stdout)
    smol = next(e for e in engines if e["name"] == "smolvlm")
    assert smol["task"] == "vlm"
    assert smol["status"] in ("experimental", "stable")
    assert smol["default_model"] == "smolvlm2-256m-video-instruct"
    assert set(smol) == {"name", "task", "status", "description", "default_model", "fast_dtypes", "kernels"}
    assert smol["fast_dtypes"][0] == "float32" and set(smol["fast_dtypes"]) <= {"float32", "bfloat16", "int8"}
    # which kernels run each dtype here and why (each engine's report: tests/test_smolvlm_precision.py,
    # tests/test_qwen3vl_precision.py); torch-free (test_help_and_engines_do_not_import_torch)
    qwen = next(e for e in engines if e["name"] == "qwen3-vl")
    assert set(qwen) == set(smol) and qwen["default_model"] == "qwen3-vl-2b-instruct"
    for engine in (smol, qwen):
        assert set(engine["kernels"]["dtypes"]) == {"float32", "int8", "bfloat16"}
        assert engine["kernels"]["throughput_dtype"] in ("float32", "bfloat16", "int8")
        groups = [g for dtype in engine["kernels"]["dtypes"].values() for g in dtype]
        assert groups and all(set(g) == {"layers", "kernel", "why"} and all(g.values()) for g in groups)


def test_version():
    proc = ffai("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("ffai ")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--fps", "0"], "--fps"),
        (["--fps", "-1"], "--fps"),
        (["--window", "0"], "--window"),
        (["-ss", "-1"], "-ss"),
        (["-t", "-2"], "-t"),
        (["-t", "0"], "-t"),
        (["--max-frames", "0"], "--max-frames"),
        (["--temperature", "0.7"], "--seed"),
        (["--top-k", "5", "--temperature", "0.5"], "--seed"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--dtype", "float64"], "--dtype"),
        (["--compile"], "--compile is for the opt-in dtypes"),  # float32 runs its exact eager path
        (["-y", "-n"], "-y"),
        (["--placement", "gpu"], "--placement must be one of auto, inline, workers"),
        (["--max-frames", "-3"], "--max-frames must be at least 1"),
        (["--engine", "nope"], "no engine named 'nope' (available: qwen3-vl, smolvlm)"),
        (["--fps", "abc"], "--fps"),
        (["--bogus"], "--bogus"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, fragment, tmp_path, capsys):
    image = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(image)
    code = run(["caption", "-i", str(image), *args])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ffai: error:"), err
    assert fragment in lines[0], err


def test_missing_input_flag_is_usage_error():
    proc = ffai("caption")
    assert proc.returncode == 2
    assert proc.stderr.startswith("ffai: error:")


def test_unknown_model_names_pull(tmp_path):
    image = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(image)
    env = {"FFAI_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path / "hub")}
    proc = ffai("caption", "-i", str(image), "--model", "smolvlm-256m-instruct", env=env)
    assert_one_line_error(proc, 1, "ffai models pull smolvlm-256m-instruct")
    # Without --model the bundled demo model stands in, saying so and how to get the real one.
    proc = ffai("caption", "-i", str(image), env=env)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    assert (
        proc.stderr.count("\n") == 1
        and "smolvlm-demo" in proc.stderr
        and "ffai models pull smolvlm2-256m-video-instruct" in proc.stderr
    )
    proc = ffai("caption", "-i", str(image), "--model", str(tmp_path), env=env)
    assert_one_line_error(proc, 1, "no config.json")


@pytest.mark.parametrize("where", ["app", "command"])
def test_verbose_is_one_flag_before_or_after_the_command(where, tmp_path, capsys):
    """-v/-q are declared once and taken by the app and by caption alike: ``ffai -v caption ...``
    and ``ffai caption ... -v`` both show the traceback behind the one-line error."""
    from PIL import Image

    image = tmp_path / "a.png"
    Image.new("RGB", (8, 8)).save(image)
    args = ["caption", "-i", str(image), "--model", str(tmp_path)]
    assert run(args) == 1
    assert "Traceback" not in capsys.readouterr().err
    assert run(["-v", *args] if where == "app" else [*args, "-v"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("ffai: error:") and "no config.json" in err
