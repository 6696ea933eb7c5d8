"""The Ray backend on a simulated two-node cluster (``ray.cluster_utils.Cluster``, one machine):
a node removed mid-run loses its actor, its decode tasks and the windows it held; the run
completes with the same tracks, byte for byte, as a local run."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from ffai.ray.backend import RayBackend
from ffai.ray.pool import START_TIMEOUT_S
from ffai.run.options import CaptionOptions
from ray_faults import FaultAfterFirstCue, caption_corpus, read_tracks

pytestmark = pytest.mark.ray

OPTIONS = CaptionOptions(fps=1, window=3)
DEMO_CLIP = Path(__file__).resolve().parents[1] / "examples" / "demo_clip.mp4"
NODE = {"num_cpus": 1, "object_store_memory": 128 * 2**20}


def wait_for_actors(backend: RayBackend, timeout: float = START_TIMEOUT_S) -> int:
    """Wait up to ``timeout`` seconds for every actor of ``backend`` to load; how many are up. A
    run starts with the first actor and the others join as they load; this test wants the whole
    pool from the first window. Before a run, the refs the pool waits on are its actors loading."""
    pool = backend.pool
    loading = pool.refs()
    if loading:
        ready, _ = ray.wait(loading, num_returns=len(loading), timeout=timeout)
        for ref in ready:
            pool.done(ref)
    return len(backend.actor_pids())


def test_node_removed_mid_run(tmp_path):
    inputs = []
    for name in "abcdef":
        inputs.append(str(shutil.copy(DEMO_CLIP, tmp_path / f"{name}.mp4")))
    (tmp_path / "local").mkdir()
    assert caption_corpus(inputs, tmp_path / "local", OPTIONS) == (0, [])

    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    worker = cluster.add_node(**NODE)
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.ERROR)
        cluster.wait_for_nodes()
        with RayBackend(OPTIONS) as backend:
            assert backend.plan.actors == 2  # one per node
            assert wait_for_actors(backend) == 2  # the worker node's actor too, before any window
            # The node goes once both actors hold windows, so the worker's has work to lose.
            both_working = lambda: backend.actors_working() == 2  # noqa: E731
            faulty = FaultAfterFirstCue(backend, lambda: cluster.remove_node(worker), both_working)
            (tmp_path / "ray").mkdir()
            assert caption_corpus(inputs, tmp_path / "ray", OPTIONS, faulty) == (0, [])
            assert faulty.fired
            # What the node held was redone elsewhere: its actor's windows, or its decodes.
            assert backend.windows_resent + backend.inputs_redecoded > 0
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert read_tracks(tmp_path / "ray") == read_tracks(tmp_path / "local")
