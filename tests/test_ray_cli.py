"""``ffai caption --ray`` at the command line: the flag, the missing extra, the resources it
plans, and a real ``--ray local`` run interrupted by Ctrl-C, resumed, with no Ray process left."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ffai.cli import run
from ffai.cli.root import _bare_ray
from ffai.errors import UsageError
from ffai.ray.backend import RayResources, plan_resources
from ray_faults import read_tracks

DEMO_CLIP = Path(__file__).resolve().parents[1] / "examples" / "demo_clip.mp4"
# The bundled demo model by name: without --model the run takes $FFAI_MODEL, or the real 256M
# model where it was pulled, and takes minutes instead of seconds.
FLAGS = ["--model", "smolvlm-demo", "--fps", "1", "--window", "3"]


def test_bare_ray_means_auto():
    assert _bare_ray(["caption", "-i", "a", "--ray"]) == ["caption", "-i", "a", "--ray", "auto"]
    assert _bare_ray(["caption", "--ray", "-i", "a"]) == ["caption", "--ray", "auto", "-i", "a"]
    assert _bare_ray(["caption", "--ray", "local", "-i", "a"]) == ["caption", "--ray", "local", "-i", "a"]
    assert _bare_ray(["caption", "--ray", "10.0.0.1:6379"]) == ["caption", "--ray", "10.0.0.1:6379"]


def test_without_the_extra_ray_is_one_line_naming_it(tmp_path):
    # sys.modules["ray"] = None makes `import ray` fail as if Ray were not installed.
    code = "import sys; sys.modules['ray'] = None; from ffai.cli import main; main(sys.argv[1:])"
    args = ["caption", "-i", str(DEMO_CLIP), "--ray", "local", "-o", str(tmp_path / "x.srt")]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "ffai: error: --ray needs Ray, which is not installed: pip install 'ffai[ray]'"
    ]
    assert not (tmp_path / "x.srt").exists()


def test_ray_resource_flags_need_ray(capsys):
    assert run(["caption", "-i", str(DEMO_CLIP), "--ray-actors", "2"]) == 2
    assert "need --ray" in capsys.readouterr().err


@pytest.mark.parametrize(
    "nodes, gpus, device, asked, expected",
    [
        ([2.0], 0, "auto", RayResources(), (2, 1.0, 0.0, 1)),  # this machine: one actor per core
        ([8.0, 8.0, 4.0], 0, "auto", RayResources(), (20, 1.0, 0.0, 1)),
        ([0.5], 0, "auto", RayResources(), (1, 0.5, 0.0, 1)),  # a node of less than a CPU still gets one
        ([16.0, 16.0], 4, "auto", RayResources(), (4, 8.0, 1.0, 8)),  # one actor per GPU
        ([16.0, 16.0], 4, "cpu", RayResources(), (32, 1.0, 0.0, 1)),  # --device cpu ignores the GPUs
        ([8.0], 0, "auto", RayResources(actors=3, cpus_per_actor=1.5), (3, 1.5, 0.0, 2)),
        ([8.0, 8.0], 0, "auto", RayResources(cpus_per_actor=4), (4, 4, 0.0, 4)),
    ],
)
def test_plan_resources(nodes, gpus, device, asked, expected):
    plan = plan_resources(nodes, gpus, device, asked)
    assert (plan.actors, plan.cpus, plan.gpus, plan.threads) == expected


def test_plan_refuses_what_no_node_has():
    with pytest.raises(UsageError, match="no node has"):
        plan_resources([2.0], 0, "auto", RayResources(cpus_per_actor=4))
    with pytest.raises(UsageError, match="no GPU"):
        plan_resources([2.0], 0, "cuda", RayResources())
    with pytest.raises(UsageError, match="at least 1"):
        RayResources(actors=0)


def ray_processes_of(driver_pid: int) -> list[str]:
    """Ray processes (GCS, raylet, workers, agents) of the session a driver started: Ray names
    the session folder after the driver's pid, and every such process carries it in its args."""
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    session = re.compile(rf"session_[0-9_-]+_{driver_pid}\b")
    return [line for line in ps.splitlines() if session.search(line)]


def ffai(*args: str, cwd: Path) -> subprocess.Popen:
    # A session of its own, so the test can send Ctrl-C to the whole group as a terminal does.
    return subprocess.Popen(
        [sys.executable, "-m", "ffai", "caption", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def record(path: Path) -> dict[str, str]:
    """The run record's last status of each input."""
    status = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if "input" in entry and "status" in entry:
            status[Path(entry["input"]).name] = entry["status"]
    return status


@pytest.mark.ray
def test_ctrl_c_then_resume_on_a_local_ray(tmp_path):
    # Relative input paths: the decode tasks read them from the driver's working folder.
    # Six clips: the interrupt comes at the first finished one, so some are left for the resume.
    names = [f"clip{i:02}.mp4" for i in range(6)]
    for name in names:
        shutil.copy(DEMO_CLIP, tmp_path / name)
    inputs = [arg for name in names for arg in ("-i", name)]
    for folder in ("local", "ray"):
        (tmp_path / folder).mkdir()
    # The expected tracks on one torch thread, as each engine actor computes them (one actor per
    # CPU, one thread each). With two threads on 2 cores, OpenMP's threads spin-wait on each other
    # at every op once any other process holds a core: beside two busy loops this run took 73-130 s
    # instead of 11-16 s (same tracks), past its timeout, while the 1-thread actors kept their pace.
    local = ffai(*inputs, *FLAGS, "--threads", "1", "-o", "local/{stem}.json", cwd=tmp_path)
    assert local.wait(timeout=120) == 0, local.communicate()
    expected = read_tracks(tmp_path / "local")

    out = tmp_path / "ray"
    pattern = ["-o", "ray/{stem}.json"]
    proc = ffai(*inputs, *FLAGS, *pattern, "--ray", "local", cwd=tmp_path)
    log = out / "ffai-run.jsonl"
    deadline = time.monotonic() + 90
    while not (log.exists() and "done" in record(log).values()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert all(line.startswith("ffai: ") for line in stderr.splitlines()), stderr  # nothing of Ray's
    assert ray_processes_of(proc.pid) == []

    status = record(log)
    done = [name for name in names if status.get(name) == "done"]
    assert 0 < len(done) < len(names), status
    tracks = read_tracks(out)
    for name in done:
        assert tracks[name.replace(".mp4", ".json")] == expected[name.replace(".mp4", ".json")]
    for data in tracks.values():  # the unfinished ones are valid documents
        json.loads(data)

    proc = ffai(*inputs, *FLAGS, *pattern, "--ray", "local", "--resume", cwd=tmp_path)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert all(line.startswith("ffai: ") for line in stderr.splitlines()), stderr
    assert read_tracks(out) == expected
    assert ray_processes_of(proc.pid) == []


def test_unreachable_cluster_is_one_line_at_once(capsys, tmp_path):
    started = time.monotonic()
    code = run(["caption", "-i", str(DEMO_CLIP), "-o", str(tmp_path / "x.srt"), "--ray", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 1, err
    expected = "ffai: error: --ray: cannot reach the Ray cluster at 127.0.0.1:1 (Connection refused)"
    assert err.strip().splitlines()[-1] == expected
    assert time.monotonic() - started < 30  # Ray's own client would retry for minutes
    assert not (tmp_path / "x.srt").exists()
