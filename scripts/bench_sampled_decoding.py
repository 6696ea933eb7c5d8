"""What decoding only the sampled frames saves, side by side in one run: CPU time per sample of
``ffai.media.frame_sampling.sample`` with the frames no sample takes dropped (what ffai does)
and with every frame decoded (what it did), on footage whose decode costs what a camera's does.

    python scripts/bench_sampled_decoding.py [--clip FILE] [--fps 2] [--repeats 3] [--seconds 20]

Without ``--clip`` it writes camera-like 1920x1080 H.264 once into ``.cache/clips/`` (texture
panned across the frame, new grain every frame, a moving object, a cut every 10 s; libx264
veryfast, crf 23, its default B-frames and keyframe interval): flat synthetic clips compress to
almost nothing and decode for free, which hides this cost. The arms alternate ABBA over the
repeats in this process; CPU time is the process's own (``time.process_time``: FFmpeg's slice
threads included), so a busy machine slows the wall clock more than this figure. Printed per
arm: the samples, the frames the decoder gave out, CPU ms per sample (median), and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

CACHE = Path(".cache/clips")


def camera_like(path: Path, seconds: int, fps: int = 30) -> Path:
    """A clip whose every frame carries detail and noise, as real footage does."""
    import av
    import numpy as np

    width, height = 1920, 1080
    rng = np.random.default_rng(0)
    scenes = []
    for s in range(3):  # textures wider than the frame, panned across
        yy, xx = np.mgrid[0:height, 0 : width + 1200]
        texture = 128 + 60 * np.sin(xx / (7 + s)) * np.cos(yy / (11 + s)) + rng.normal(0, 25, (height, width + 1200))
        texture = texture.clip(0, 255).astype(np.uint8)
        scenes.append(np.stack([texture, np.roll(texture, 40 * s, 1), texture[::-1]], -1))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.mp4")
    with av.open(str(partial), "w") as container:
        stream = container.add_stream("libx264", rate=fps, options={"preset": "veryfast", "crf": "23"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(seconds * fps):
            scene = scenes[(i // (fps * 10)) % len(scenes)]
            pan = (i * 3) % (scene.shape[1] - width)
            image = scene[:, pan : pan + width].astype(np.int16)
            image += rng.integers(-12, 13, size=(height, width, 1), dtype=np.int16)
            x = int(200 + 600 * (1 + np.sin(i / 20)))
            image[400:700, x : x + 300] = image[400:700, x : x + 300] // 2 + 100
            frame = av.VideoFrame.from_ndarray(image.clip(0, 255).astype(np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    partial.replace(path)
    return path


def run(clip: Path, fps: float, skip: bool) -> tuple[int, int, float]:
    """(samples, frames decoded, CPU seconds) of one sampling pass over `clip`."""
    from ffai.media import frame_sampling, video

    decoded = [0]
    decode = video.decode

    def counting(*args, **kwargs):
        for item in decode(*args, **kwargs):
            decoded[0] += 1
            yield item

    video.decode = counting
    try:
        began = time.process_time()
        samples = sum(1 for _ in frame_sampling.sample(clip, fps, 0.0, None, None, skip_unsampled=skip))
        return samples, decoded[0], time.process_time() - began
    finally:
        video.decode = decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", type=Path)
    parser.add_argument("--fps", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=20, help="length of the clip written without --clip")
    args = parser.parse_args()
    from ffai.kit.host import cpu_info

    clip = args.clip or CACHE / f"camera-like-1080p-{args.seconds}s.mp4"
    if not clip.exists():
        print(f"writing {clip} ...", file=sys.stderr)
        camera_like(clip, args.seconds)
    cpu = cpu_info()
    print(f"cpu: {cpu.model} | {' '.join(sorted(cpu.flags & {'avx2', 'avx512f', 'avx512_vnni', 'amx_int8'}))}")
    print(f"clip: {clip}  --fps {args.fps}")
    arms = {"sampled only": True, "every frame": False}
    per_sample: dict[str, list[float]] = {arm: [] for arm in arms}
    counts: dict[str, tuple[int, int]] = {}
    names = list(arms)
    for r in range(args.repeats):
        for arm in names if r % 2 == 0 else names[::-1]:
            samples, decoded, cpu_s = run(clip, args.fps, arms[arm])
            per_sample[arm].append(1000 * cpu_s / samples)
            counts[arm] = (samples, decoded)
    print(f"{'arm':<14} {'samples':>7} {'decoded':>7} {'CPU ms a sample':>16}")
    for arm in names:
        samples, decoded = counts[arm]
        print(f"{arm:<14} {samples:>7} {decoded:>7} {statistics.median(per_sample[arm]):>16.1f}")
    ratio = statistics.median(per_sample["sampled only"]) / statistics.median(per_sample["every frame"])
    print(f"sampled only / every frame: {ratio:.2f}")


if __name__ == "__main__":
    main()
