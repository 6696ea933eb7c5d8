"""The Ray backend on a local Ray (one per module: its start-up is paid once): the same tracks
as a local run, byte for byte, also when an actor is SIGKILLed mid-run."""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
from pathlib import Path

import pytest
import ray

from ffai.bench import checkpoints, demo_scenes
from ffai.engines.contract import RuntimeOptions
from ffai.errors import FfaiError
from ffai.ray.backend import RayBackend, RayResources
from ffai.run.options import CaptionOptions
from live_stream import StreamServer, encode_ts
from ray_faults import FaultAfterFirstCue, caption_corpus, read_tracks
from sample_media import make_clip

pytestmark = pytest.mark.ray

# Three windows decoded together in each actor (and in the local run they are compared with).
OPTIONS = CaptionOptions(fps=1, window=3, runtime=RuntimeOptions(batch=3))
DEMO_CLIP = Path(__file__).resolve().parents[1] / "examples" / "demo_clip.mp4"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[str]:
    """Demo-clip copies (real captions from the demo model), a clip of another codec and size,
    a still, and a file that is no media."""
    folder = tmp_path_factory.mktemp("corpus")
    inputs = []
    for name in ("a", "b", "c", "d"):
        shutil.copy(DEMO_CLIP, folder / f"{name}.mp4")
        inputs.append(folder / f"{name}.mp4")
    inputs.append(make_clip(folder / "e.mkv", 4, fps=25, size=(96, 64), codec="mpeg4"))
    from PIL import Image

    Image.new("RGB", (120, 80), (30, 60, 220)).save(folder / "f.png")
    inputs.append(folder / "f.png")
    (folder / "g.mp4").write_bytes(b"not a video")
    inputs.append(folder / "g.mp4")
    return [str(p) for p in inputs]


@pytest.fixture(scope="module")
def local_run(corpus, tmp_path_factory) -> tuple[dict[str, bytes], list[str]]:
    out = tmp_path_factory.mktemp("local")
    failed, errors = caption_corpus(corpus, out, OPTIONS)
    assert failed == 1
    return read_tracks(out), errors


@pytest.fixture(scope="module")
def backend():
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=256 * 2**20,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    try:
        # 1.5 of the 2 CPUs (2 torch threads): room is left for the sheet test's own actor.
        with RayBackend(OPTIONS, resources=RayResources(actors=1, cpus_per_actor=1.5)) as backend:
            yield backend
    finally:
        ray.shutdown()


def test_same_tracks_as_a_local_run(corpus, local_run, backend, tmp_path):
    failed, errors = caption_corpus(corpus, tmp_path, OPTIONS, backend)
    tracks, local_errors = local_run
    assert failed == 1
    assert errors == local_errors
    assert read_tracks(tmp_path) == tracks
    assert len(tracks) == 6  # every input but the bad one
    assert backend.pool.per_actor == 4  # each actor is sent its batch and one more


def test_actor_sigkilled_mid_run_is_replaced_and_its_windows_redone(corpus, local_run, backend, tmp_path):
    (victim,) = backend.actor_pids()
    resent = backend.windows_resent
    faulty = FaultAfterFirstCue(backend, lambda: os.kill(victim, signal.SIGKILL))
    failed, _ = caption_corpus(corpus, tmp_path, OPTIONS, faulty)
    assert faulty.fired
    assert failed == 1
    assert read_tracks(tmp_path) == local_run[0]
    assert backend.windows_resent > resent  # the dead actor's windows went to its replacement
    assert backend.actor_pids() != [victim]


def test_contact_sheet_same_as_local(corpus, backend, tmp_path, monkeypatch):  # backend: Ray is up
    """The html sheet's thumbnails are made where the frames are decoded: on the cluster."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # the sheet's creation time, fixed
    inputs = [corpus[0], corpus[5]]  # a clip and the still
    sheets = {}
    # A backend of the run's own options: the driver asks for thumbnails for html.
    ray_backend = functools.partial(RayBackend, resources=RayResources(actors=1, cpus_per_actor=0.5))
    for arm, make_backend in (("local", None), ("ray", ray_backend)):
        out = tmp_path / arm
        out.mkdir()
        failed, _ = caption_corpus(inputs, out, OPTIONS, make_backend, pattern="{stem}.html")
        assert failed == 0
        sheets[arm] = read_tracks(out)
    assert sheets["ray"] == sheets["local"]
    assert all(b"data:image/" in page for page in sheets["ray"].values())


def test_a_model_the_actors_cannot_load_is_one_line(tiny_checkpoint, backend, tmp_path):  # backend: Ray is up
    """The cheap checks pass (config, tokenizer, window); loading fails in the actor, on the
    cluster, and comes back as the loader's own one-line error naming the file."""
    model = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    options = CaptionOptions(model=str(model), fps=1, window=3)
    with pytest.raises(FfaiError, match="model.safetensors") as caught:
        with RayBackend(options, resources=RayResources(actors=1, cpus_per_actor=0.5)):
            pass
    assert "\n" not in str(caught.value)


def test_a_url_is_decoded_on_the_cluster_and_a_pipe_is_refused(backend, tmp_path):  # backend: Ray is up
    """A URL is read where it is decoded, so it goes to the cluster and gives the same track as a
    run on this machine; a pipe exists on this machine only, and fails alone in one line."""
    scenes = demo_scenes.CLIP_SCENES[:2]
    with StreamServer(encode_ts(scenes, 3.0)) as server:  # one window of OPTIONS a scene
        url = f"{server.url}/clip.ts"
        tracks = {}
        for arm, on in (("local", None), ("ray", backend)):
            (tmp_path / arm).mkdir()
            assert caption_corpus([url], tmp_path / arm, OPTIONS, on) == (0, [])
            tracks[arm] = read_tracks(tmp_path / arm)
    assert tracks["ray"] == tracks["local"] and list(tracks["ray"]) == ["clip.json"]
    cues = json.loads(tracks["ray"]["clip.json"])["cues"]
    assert [c["text"] for c in cues] == [demo_scenes.caption(scene) for scene in scenes]
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(FfaiError) as caught:  # the run's only input: its error is the run's
        caption_corpus([str(fifo)], tmp_path / "ray", OPTIONS, backend)
    assert str(caught.value) == f"{fifo}: stdin and pipes are read on this machine, not on Ray"


def test_qwen3vl_on_ray_writes_the_local_track(backend, tmp_path):  # backend: Ray is up
    """The second engine on the cluster: its actor loads the tiny Qwen3-VL checkpoint and gives
    the track a run here gives, byte for byte."""
    from ffai.engines.contract import DecodingOptions

    decoding = DecodingOptions(max_new_tokens=6)
    options = CaptionOptions(
        model=str(checkpoints.checkpoint("tiny", "qwen3-vl")), fps=2, window=2, duration=2.0, decoding=decoding
    )
    ray_backend = functools.partial(RayBackend, resources=RayResources(actors=1, cpus_per_actor=0.5))
    tracks = {}
    for arm, make_backend in (("local", None), ("ray", ray_backend)):
        (tmp_path / arm).mkdir()
        assert caption_corpus([str(DEMO_CLIP)], tmp_path / arm, options, make_backend) == (0, [])
        tracks[arm] = read_tracks(tmp_path / arm)
    assert tracks["ray"] == tracks["local"] and len(json.loads(tracks["ray"]["demo_clip.json"])["cues"]) == 2
