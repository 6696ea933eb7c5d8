"""The wheel `pip install .` builds works outside the checkout: every module of it imports, the
README's main command captions the demo clip into its four scenes with the bundled demo model,
and `ffai bench vlm` writes its random-weight checkpoint from the files the package ships and
runs a case. The editable install every other test runs on would hide a package the wheel lacks.

The wheel is installed with ``pip install --no-deps --target`` and run from a folder with no
checkout beside it, with this environment's site-packages (torch, transformers) after it on the
path; the checkout's own folder is never on it. And once as the README installs it to run ffai
alone: a virtual environment of its own, torch's CPU wheel, then the wheel with the dependencies
it declares, nothing of this environment's (what it uses but does not declare fails there).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel pip builds from the checkout's tracked and untracked-but-not-ignored files."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    tracked = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, tracked):
        path = ROOT / name.decode()
        if path.is_file():
            (source / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name.decode())
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work)]
    subprocess.run([*build, str(source)], check=True, capture_output=True, timeout=600)
    (built,) = work.glob("ffai-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> dict[str, str]:
    """The environment of a process that runs the built wheel, installed away from the checkout."""
    work = tmp_path_factory.mktemp("installed")
    site = work / "site"
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=600)
    packages = sysconfig.get_paths()["purelib"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FFAI_MODEL")}
    home = work / "home"
    return {**env, "PYTHONPATH": os.pathsep.join([str(site), packages]), "FFAI_HOME": str(home), "HOME": str(home)}


def ffai(env, *args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    # -S: site-packages only as PYTHONPATH names it, without the checkout's editable-install hook.
    cmd = [sys.executable, "-S", "-m", "ffai", *args]
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_imports_every_module_from_outside_the_checkout(installed, tmp_path):
    code = (
        "import importlib, pkgutil, ffai\n"
        "assert 'site' in ffai.__file__ and 'src' not in ffai.__file__, ffai.__file__\n"
        "for m in pkgutil.walk_packages(ffai.__path__, 'ffai.'):\n"
        "    if not m.name.startswith('ffai.ray'):\n"
        "        importlib.import_module(m.name)\n"
        "print(ffai.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], env=installed, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(Path(installed["PYTHONPATH"].split(os.pathsep)[0]))


def test_the_readme_command_from_the_wheel(installed, tmp_path):
    shutil.copy(ROOT / "examples" / "demo_clip.mp4", tmp_path / "demo_clip.mp4")
    done = ffai(
        installed, "caption", "-i", "demo_clip.mp4", "--fps", "2", "--window", "6", "-o", "demo.srt", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    track = (tmp_path / "demo.srt").read_text()
    for scene in ("red circle", "yellow star", "white triangle", "pink square"):
        assert scene in track, track
    assert "using the small bundled demo model smolvlm-demo" in done.stderr


@pytest.mark.oracle
def test_the_bench_writes_its_checkpoint_and_runs_from_the_wheel(installed, tmp_path):
    """The tiny kind keeps it quick; the real shapes come from the same shipped files."""
    write = "from ffai.bench import checkpoints; print(checkpoints.checkpoint('tiny'))"
    done = subprocess.run(
        [sys.executable, "-S", "-c", write], env=installed, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip())
    assert folder.is_relative_to(Path(installed["FFAI_HOME"]) / "checkpoints")
    bench = ("bench", "vlm", "--model", str(folder), "--cases", "frame", "--repeats", "1", "--json", "--no-fail")
    done = ffai(installed, *bench, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert '"frame"' in done.stdout and "Traceback" not in done.stderr


def test_the_readme_install_alone_in_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    for what in (["torch==2.13.0"], [str(wheel)]):  # README: the CPU wheel first, then ffai
        done = subprocess.run([*pip, *what], capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stderr
    shutil.copy(ROOT / "examples" / "demo_clip.mp4", tmp_path / "demo_clip.mp4")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FFAI_MODEL", "VIRTUAL_ENV")}
    env.update(FFAI_HOME=str(tmp_path / "home"), HOME=str(tmp_path / "home"))
    args = ["caption", "-i", "demo_clip.mp4", "--fps", "2", "--window", "6", "-o", "demo.srt"]
    done = subprocess.run(
        [str(venv / "bin" / "ffai"), *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    track = (tmp_path / "demo.srt").read_text()
    assert all(scene in track for scene in ("red circle", "yellow star", "white triangle", "pink square")), track
