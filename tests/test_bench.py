"""`ffai bench vlm`: the gates' logic on hand-made runs, and the whole bench on the tiny checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ffai.bench import agreement, checkpoints, gates, ledger
from ffai.bench.cli import BenchOptions, parse_cases
from ffai.bench.hooks import hooks_for
from ffai.engines.contract import EngineInfo
from ffai.engines.smolvlm.bench import checkpoints as smolvlm_checkpoints
from ffai.errors import ModelError, UsageError

# Registers the bench under the app if ffai/cli.py does not yet, then runs the CLI.
RUN_CLI = """
import sys
from ffai import cli
from ffai.bench.cli import bench_app
if not any(g.name == "bench" for g in cli.app.registered_groups):
    cli.app.add_typer(bench_app, name="bench")
sys.exit(cli.run(["bench", "vlm", *sys.argv[1:]]))
"""


def text_weights(folder) -> int:
    """How many weights SmolVLM's text tower and LM head hold: the decode floor's numerator."""
    return hooks_for("smolvlm").decode_weights(folder)


def run(arm: str, time_s: float, tokens: dict, rss: int = 100) -> dict:
    return {
        "arm": arm,
        "time_s": time_s,
        "peak_rss": rss,
        "load_s": 1.0,
        "warmup_s": 0.5,
        "torch_threads": {"main": 1},
        "tokens": tokens,
        "transformers_imported": False,
    }


def test_schedule_alternates_the_arms_abba():
    order = [(r, arm) for case, r, arm in gates.schedule(["frame"], 4)]
    assert [arm for _, arm in order] == [
        "ffai",
        "reference",
        "reference",
        "ffai",
        "ffai",
        "reference",
        "reference",
        "ffai",
    ]
    assert [case for case, _, _ in gates.schedule(["frame", "clip"], 1)] == ["frame", "frame", "clip", "clip"]
    # With ffai batching, the clip case faces the batched reference too, in the same ABBA turns.
    batched = [arm for _, _, arm in gates.schedule(["frame", "clip"], 2, frozenset({"clip"}))]
    assert batched[:4] == ["ffai", "reference", "reference", "ffai"]
    assert batched[4:] == ["ffai", "reference", gates.BATCHED, gates.BATCHED, "reference", "ffai"]
    # --busy: ffai beside busy programs, in every case's turns.
    busy = [arm for _, _, arm in gates.schedule(["frame"], 2, busy=True)]
    assert busy == ["ffai", "reference", gates.BUSY, gates.BUSY, "reference", "ffai"]


def test_busy_runs_are_summarised_against_the_quiet_ones():
    def busy(time_s: float, cores: int) -> dict:
        return {**run("ffai", time_s, {"f": [1]}), "busy_loops": 1, "cores": cores}

    quiet = [run("ffai", 1.0, {"f": [1]}), run("ffai", 1.2, {"f": [1]})]
    runs = {"ffai": quiet, "reference": [run("reference", 2.0, {"f": [1]})], gates.BUSY: [busy(2.1, 2), busy(2.5, 2)]}
    record = gates.summarize_case("frame", runs, "float32")
    assert record["busy"]["loops"] == 1 and record["busy"]["median_s"] == pytest.approx(2.3)
    assert record["busy_ratio"] == pytest.approx(2.3 / 1.1, abs=1e-3) and record["busy_target"] == 2.2
    assert record["busy_target_met"] is True
    runs[gates.BUSY] = [busy(2.6, 2)]
    assert gates.summarize_case("frame", runs, "float32")["busy_target_met"] is False
    runs[gates.BUSY] = [busy(2.6, 4)]  # the target is for one busy program on 2 cores
    assert gates.summarize_case("frame", runs, "float32")["busy_target"] is None
    assert "busy" not in gates.summarize_case("frame", {k: v for k, v in runs.items() if k != gates.BUSY}, "float32")


def test_busy_programs_keep_a_core_busy_and_end_with_the_block():
    import os
    import time

    from ffai.bench.cli import busy_programs

    before = os.times()
    with busy_programs(1):
        time.sleep(0.5)
    spent = os.times()
    # The loop ran as a child (its CPU time counted once it was waited for), and is gone.
    assert spent.children_user - before.children_user > 0.1


def test_merge_inputs_left_pads_the_tokens_and_zero_fills_missing_pictures():
    """The batched reference's batch: token rows padded on the left (ids with the pad id, masks
    with 0), pictures stacked with all-zero pictures where a window has fewer."""
    import torch

    from ffai.bench.transformers_arm import merge_inputs

    short = {
        "input_ids": torch.tensor([[5, 6]]),
        "attention_mask": torch.tensor([[1, 1]]),
        "pixel_values": torch.ones(1, 1, 3, 2, 2),
        "pixel_attention_mask": torch.ones(1, 1, 2, 2, dtype=torch.bool),
    }
    long = {
        "input_ids": torch.tensor([[7, 8, 9]]),
        "attention_mask": torch.tensor([[1, 1, 1]]),
        "pixel_values": torch.full((1, 2, 3, 2, 2), 2.0),
        "pixel_attention_mask": torch.ones(1, 2, 2, 2, dtype=torch.bool),
    }
    merged = merge_inputs([short, long], pad_id=0)
    assert merged["input_ids"].tolist() == [[0, 5, 6], [7, 8, 9]]
    assert merged["attention_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert merged["pixel_values"].shape == (2, 2, 3, 2, 2)
    assert merged["pixel_values"][0, 1].abs().sum() == 0 and (merged["pixel_values"][1] == 2).all()
    assert merged["pixel_attention_mask"].dtype == torch.bool
    assert merged["pixel_attention_mask"][0].sum() == 4 and merged["pixel_attention_mask"][1].all()


def test_synthetic_images_are_the_whole_image_formulas_bytes():
    """Made by blocks of rows (so the arms' peak RSS is not the harness's), the bench's images are
    byte for byte what the formula gives computed over the whole image at once."""
    import numpy as np

    from ffai.bench import cases

    for seed, (w, h) in [(1, cases.FRAME_SIZE), (2, (700, 130)), (3, (37, 100))]:
        rng = np.random.RandomState(seed)
        yy, xx = np.mgrid[0:h, 0:w] / max(w, h)
        waves = [np.sin(xx * rng.uniform(2, 9) + c) * np.cos(yy * rng.uniform(2, 9)) for c in range(3)]
        whole = (np.stack(waves, -1) * 80 + 128 + rng.normal(0, 25, (h, w, 3))).clip(0, 255).astype(np.uint8)
        assert np.array_equal(np.asarray(cases.synthetic_image(seed, (w, h))), whole)


def test_compare_tokens_finds_the_first_mismatch():
    same = gates.compare_tokens({"0": [1, 2, 3], "1": [4]}, {"0": [1, 2, 3], "1": [4]})
    assert same == {"equal": True, "first_mismatch": None, "agreement": 1.0, "same": 4, "total": 4, "items": 2}
    diff = gates.compare_tokens({"0": [1, 2], "10": [5, 6], "2": [7, 8]}, {"0": [1, 2], "10": [5, 9], "2": [7, 0]})
    # Items are compared in their natural order: 0, 2, 10.
    assert diff["first_mismatch"] == {"item": "2", "position": 1, "ffai": 8, "reference": 0}
    assert not diff["equal"] and diff["agreement"] == pytest.approx(4 / 6, abs=1e-4)
    assert (diff["same"], diff["total"]) == (4, 6)
    missing = gates.compare_tokens({"0": [1]}, {"0": [1], "1": [2]})
    assert not missing["equal"] and missing["first_mismatch"]["item"] == "1"


def test_gates_pass_fail_and_skip():
    fast = gates.summarize_case(
        "frame",
        {
            "ffai": [run("ffai", 1.0, {"f": [1, 2]}, rss=80)],
            "reference": [run("reference", 2.0, {"f": [1, 2]}, rss=100)],
        },
        "float32",
    )
    assert fast["speedup_median"] == 2.0 and fast["speedup_target_met"] and fast["rss_ratio"] == 0.8
    result = gates.gates([fast], None, "float32")
    assert {k: g["status"] for k, g in result.items()} == {
        "correctness": "PASS",
        "quality": "SKIP",
        "footprint": "PASS",
        "speed": "PASS",
    }
    assert gates.passed(result)

    slow = gates.summarize_case(
        "still",
        {
            "ffai": [run("ffai", 3.0, {"s": [1, 2]}, rss=120)] * 2,
            "reference": [run("reference", 2.0, {"s": [1, 3]}, rss=100)] * 2,
        },
        "float32",
    )
    result = gates.gates([fast, slow], None, "float32")
    assert {k: g["status"] for k, g in result.items()} == {
        "correctness": "FAIL",
        "quality": "SKIP",
        "footprint": "FAIL",
        "speed": "FAIL",
    }
    assert "still: item s differs at token 1" in result["correctness"]["detail"]
    assert not gates.passed(result)

    quality = {"corpus": "demo", "ffai": {"correct": 9, "total": 10}, "reference": {"correct": 8, "total": 10}}
    assert gates.quality_gate(quality)["status"] == "FAIL"
    quality["reference"]["correct"] = 9
    assert gates.quality_gate(quality)["status"] == "PASS"


def test_ffai_importing_transformers_fails_correctness():
    bad = run("ffai", 1.0, {"f": [1]}) | {"transformers_imported": True}
    record = gates.summarize_case("frame", {"ffai": [bad], "reference": [run("reference", 1.0, {"f": [1]})]}, "float32")
    assert gates.correctness_gate([record]) == {
        "status": "FAIL",
        "detail": "ffai's arm imported transformers",
    }


def precision_run(
    tokens: dict,
    float32_tokens: dict | None,
    tiles: float = 0.999,
    logits: float = 0.999,
    decode_ms: float | None = 5.0,
    floor_ms: float = 4.0,
) -> dict:
    """A hand-made ``ffai.bench.agreement.run`` result: every tile and item at the given cosines."""
    exact = float32_tokens is not None
    return {
        "case": "frame",
        "dtype": "int8",
        "threads": 2,
        "tile_cosines": {item: [tiles, min(1.0, tiles + 0.0005)] for item in tokens} if exact else None,
        "logits_cosines": {item: logits for item in tokens} if exact else None,
        "tokens": tokens,
        "float32_tokens": float32_tokens,
        "prefill_s": 0.5,
        "decode_ms_per_token": decode_ms,
        "floor": {"bytes": 163_000_000, "bandwidth_gb_s": 40.75, "ms": floor_ms},
    }


def agreement_record(dtype: str, precision: dict, reference_tokens: dict, flags=frozenset()) -> dict:
    runs = {
        "ffai": [run("ffai", 1.0, precision["tokens"], rss=40)],
        "reference": [run("reference", 3.0, reference_tokens, rss=100)],
    }
    return gates.summarize_case("frame", runs, dtype, precision, frozenset(flags))


def test_agreement_gate_on_cosines_with_float32_tokens_reported():
    exact = list(range(100, 132))  # 32 forced tokens
    ours = exact[:12] + [7] + exact[13:20] + [8] * 12  # leaves float32 at 12, again from 20 on: 19/32 agree
    record = agreement_record("int8", precision_run({"frame": ours}, {"frame": exact}, 0.9951, 0.996), {"frame": exact})
    p = record["precision"]
    assert (p["tiles"], p["tile_cosine_min"], p["logits_cosine_min"], p["cosine_target"]) == (2, 0.9951, 0.996, 0.995)
    assert (p["tokens"]["same"], p["tokens"]["total"], p["first_divergence"]) == (19, 32, {"frame": 12})
    assert p["float32_is_reference"]
    result = gates.gates([record], None, "int8")
    assert tuple(result) == gates.gate_names("int8") == ("agreement", "quality", "footprint", "speed")
    assert result["agreement"] == {
        "status": "PASS",
        "detail": "int8: cosine with float32 ≥ 0.995: tiles min 0.99510, logits min 0.99600; "
        "tokens agreeing with float32 (reported, not gated): frame 19/32, diverging at 12",
    }
    # The same figures miss bfloat16's bound; a tile or logits just under int8's fails int8.
    bf16 = agreement_record(
        "bfloat16", precision_run({"frame": ours}, {"frame": exact}, 0.9994, 0.99999), {"frame": exact}
    )
    assert gates.agreement_gate([bf16], "bfloat16")["status"] == "FAIL"
    assert "below it: frame tile 0.99940" in gates.agreement_gate([bf16], "bfloat16")["detail"]
    for tiles, logits, low in [(0.9949, 0.999, "frame tile 0.99490"), (0.999, 0.99499, "frame logits 0.99499")]:
        bad = agreement_record(
            "int8", precision_run({"frame": exact}, {"frame": exact}, tiles, logits), {"frame": exact}
        )
        gate = gates.agreement_gate([record, bad], "int8")
        assert gate["status"] == "FAIL" and f"below it: {low};" in gate["detail"]
    # Identical tokens: 32/32 and no divergence.
    same = agreement_record("int8", precision_run({"frame": exact}, {"frame": exact}), {"frame": exact})
    assert same["precision"]["first_divergence"] == {"frame": None}
    assert gates.agreement_gate([same], "int8")["detail"].endswith("(reported, not gated): frame 32/32")


def test_agreement_gate_needs_its_float32_baseline_to_be_the_reference():
    exact, other = [1, 2, 3], [1, 2, 4]
    astray = agreement_record("int8", precision_run({"frame": exact}, {"frame": exact}), {"frame": other})
    assert not astray["precision"]["float32_is_reference"]
    assert gates.agreement_gate([astray], "int8") == {
        "status": "FAIL",
        "detail": "frame: ffai's float32 tokens differ from the reference's, so nothing to agree with",
    }
    unmeasured = agreement_record("int8", precision_run({"frame": exact}, None), {"frame": exact})
    assert gates.agreement_gate([unmeasured], "int8")["status"] == "FAIL"
    imported = agreement_record("int8", precision_run({"frame": exact}, {"frame": exact}), {"frame": exact})
    imported["ffai_imports_transformers"] = True
    assert gates.agreement_gate([imported], "int8")["detail"] == "ffai's arm imported transformers"
    assert gates.agreement_gate([], "int8")["status"] == "SKIP"


def test_opt_in_dtype_targets_follow_the_cpu_and_the_memory_floor():
    tokens = {"frame": [1, 2]}
    vnni = agreement_record("int8", precision_run(tokens, tokens, decode_ms=5.0), tokens, {"avx2", "avx512_vnni"})
    avx2 = agreement_record("int8", precision_run(tokens, tokens, decode_ms=4.4), tokens, {"avx2"})
    assert (vnni["speedup_target"], vnni["speedup_target_met"]) == (2.5, True)  # 3.0 s / 1.0 s
    assert avx2["speedup_target"] == 1.8 and vnni["rss_target"] == 0.5 and vnni["rss_target_met"]
    # Decode per token against the floor: 5.0 / 4.0 misses int8's 1.2x, 4.4 / 4.0 meets it.
    assert (vnni["precision"]["floor_ratio"], vnni["precision"]["floor_target_met"]) == (1.25, False)
    assert (avx2["precision"]["floor_ratio"], avx2["precision"]["floor_target_met"]) == (1.1, True)
    native = agreement_record("bfloat16", precision_run(tokens, tokens), tokens, {"avx512_bf16"})
    emulated = agreement_record("bfloat16", precision_run(tokens, tokens), tokens, {"avx2"})
    assert (native["speedup_target"], native["rss_target"], native["precision"]["floor_target"]) == (1.8, 0.6, None)
    assert (emulated["speedup_target"], emulated["speedup_target_met"]) == (None, None)
    # AMX tiles raise the bar: int8 4x, bfloat16 3x (issue 24)
    amx = {"avx2", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16"}
    assert agreement_record("int8", precision_run(tokens, tokens), tokens, amx)["speedup_target"] == 4.0
    assert agreement_record("bfloat16", precision_run(tokens, tokens), tokens, amx)["speedup_target"] == 3.0
    exact = gates.summarize_case(
        "frame",
        {"ffai": [run("ffai", 1.0, tokens)], "reference": [run("reference", 1.0, tokens)]},
        "float32",
        precision_run(tokens, None, decode_ms=None),
        {"avx512_vnni"},
    )
    assert exact["speedup_target"] == gates.SPEED_TARGETS["frame"] and exact["precision"]["floor_ratio"] is None
    assert "tile_cosine_min" not in exact["precision"] and exact["precision"]["floor_ms"] == 4.0


def test_quality_gate_of_an_opt_in_dtype_is_one_point_of_float32():
    def quality(corpus, ours, exact, total=200):
        return {
            "corpus": corpus,
            "ffai": {"correct": ours, "total": total},
            "reference": {"correct": exact, "total": total},
        }

    assert gates.quality_gate(quality("demo", 196, 198), "int8")["status"] == "PASS"  # 98 % vs 99 %
    assert gates.quality_gate(quality("demo", 195, 198), "int8")["status"] == "FAIL"  # 1.5 points
    assert gates.quality_gate(quality("demo", 200, 197), "int8")["status"] == "FAIL"  # not within, either way
    assert gates.quality_gate(quality("demo", 189, 190), "bfloat16")["status"] == "FAIL"  # under 95 %
    assert gates.quality_gate(quality("demo", 189, 190), "float32")["status"] == "FAIL"  # float32: the same count
    assert (
        "(int8 within 1 point of float32 and ≥ 95 %)" in gates.quality_gate(quality("demo", 196, 198), "int8")["detail"]
    )
    # A corpus of one's own has no 95 % floor: random-weight models get little right.
    assert gates.quality_gate(quality("/corpus", 1, 1, total=2), "int8")["status"] == "PASS"


def test_cpu_identity_is_the_model_and_the_flags_that_matter():
    from ffai.kit import host

    core = (
        "processor\t: {n}\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14 96-Core Processor\n"
        "flags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni sha_ni\n\n"
    )
    info = host.parse_cpuinfo(core.format(n=0) + core.format(n=1))
    assert ledger.cpu_identity(info) == {
        "model": "AMD EPYC 9R14 96-Core Processor",
        "flags": ["avx2", "avx512f", "avx512_vnni", "avx512_bf16"],
    }
    here = ledger.cpu_identity()
    assert here == ledger.cpu_identity(host.cpu_info()) and here["model"]
    assert set(here["flags"]) <= set(host.RELEVANT_FLAGS)


def test_precision_figures_on_the_tiny_checkpoint(tiny_checkpoint):
    """The floor counts the text tower as loaded; cosines are plain cosines whatever the dtype."""
    import torch

    from ffai.engines.contract import RuntimeOptions
    from ffai.run.inline import InlineEngine

    net = InlineEngine.load("smolvlm", tiny_checkpoint, RuntimeOptions(device="cpu"))["text"].net
    assert text_weights(tiny_checkpoint) == sum(p.numel() for p in net.text.parameters())
    assert [agreement.weight_bytes(d) for d in ("float32", "bfloat16", "int8")] == [4, 2, 1]
    floor = agreement.decode_floor(text_weights(tiny_checkpoint), "int8", 2e9)
    assert floor == {"bytes": text_weights(tiny_checkpoint), "bandwidth_gb_s": 2.0, "ms": floor["ms"]}
    assert floor["ms"] == pytest.approx(1e3 * floor["bytes"] / 2e9, abs=1e-3)
    a = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    assert agreement.cosine(a, 2 * a) == pytest.approx(1.0, abs=1e-15)
    assert agreement.cosine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == 0.0
    assert agreement.cosine(torch.tensor([1.0, 1.0]).bfloat16(), torch.tensor([1.0, 0.0])) == pytest.approx(2**-0.5)
    tiles = agreement.tile_cosines(torch.stack([a, a]), torch.stack([a, -a]))
    assert tiles == [pytest.approx(1.0), pytest.approx(-1.0)]
    with pytest.raises(ValueError, match="shapes"):
        agreement.tile_cosines(a[None], a[None, :1])
    assert agreement.bandwidth(8_000_000, repeats=2) > 1e8  # bytes/s: any machine streams 100 MB/s


def test_the_tables_say_agree_n_of_32_and_name_the_cpu():
    from rich.console import Console

    from ffai.bench.cli import render

    exact = list(range(32))
    ours = exact[:30] + [0, 0]
    record = agreement_record(
        "int8", precision_run({"frame": ours}, {"frame": exact}), {"frame": exact}, {"avx512_vnni"}
    )
    report = {
        "model": "m",
        "dtype": "int8",
        "repeats": 1,
        "cores": 2,
        "cpu": {"model": "AMD EPYC 9R14", "flags": ["avx2", "avx512_vnni"]},
        "load_average": {"start": 1.52, "end": None},
        "cases": [record],
        "gates": gates.gates([record], None, "int8"),
    }
    console = Console(record=True, width=200)
    render(report, console)
    text = console.export_text()
    assert "AMD EPYC 9R14 (avx2 avx512_vnni), load average 1.5 → ?" in text
    assert text.count("agree 30/32") == 2  # the cases table and the precision table
    assert "1.25x ✗" in text and "decode ≤1.2x the floor" in text  # 5.0 ms/token against a 4.0 ms floor
    assert "same" not in text.split("gates")[0]


def test_place_atomically_leaves_nothing_half_written(tmp_path):
    final = tmp_path / "ckpt"

    def fail(tmp):
        (tmp / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        checkpoints.place_atomically(final, fail)
    assert list(tmp_path.iterdir()) == []  # neither the target nor the temporary folder

    def write(tmp):
        (tmp / "config.json").write_text("{}")

    assert checkpoints.place_atomically(final, write) == final
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"] and (final / "config.json").read_text() == "{}"
    assert oct(final.stat().st_mode & 0o777) == oct(0o755)


def test_place_atomically_lets_a_parallel_writer_win(tmp_path):
    final = tmp_path / "ckpt"

    def write_while_another_finishes(tmp):
        (tmp / "config.json").write_text("mine")
        final.mkdir()  # the other writer renames its folder into place first
        (final / "config.json").write_text("theirs")

    assert checkpoints.place_atomically(final, write_while_another_finishes) == final
    assert (final / "config.json").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_checkpoint_key_follows_the_writer_kind_seed_and_dtype(tmp_path, monkeypatch):
    key = checkpoints.checkpoint_key("tiny")
    assert key == checkpoints.checkpoint_key("tiny", "smolvlm") and len(key) == 12
    assert checkpoints.checkpoint_key("real") != key
    assert checkpoints.cache_folder("tiny") == checkpoints.CACHE / f"smolvlm-tiny-{key}"
    with pytest.raises(ValueError, match="unknown checkpoint kind 'huge' for engine 'smolvlm'"):
        checkpoints.checkpoint_key("huge")
    # SmolVLM's fingerprint (what its writer's output depends on) follows the seed and the dtype.
    prints = {
        smolvlm_checkpoints.WRITER.fingerprint(*args) for args in [("tiny",), ("tiny", 1), ("tiny", 0, "bfloat16")]
    }
    assert len(prints) == 3 and smolvlm_checkpoints.WRITER.fingerprint("tiny") in prints
    # The writer's own code is hashed: an edit to the module, even a comment, is a new folder.
    edited = tmp_path / "checkpoints.py"
    edited.write_text(open(smolvlm_checkpoints.__file__, encoding="utf-8").read() + "# edited\n", encoding="utf-8")
    monkeypatch.setattr(smolvlm_checkpoints, "__file__", str(edited))
    assert checkpoints.checkpoint_key("tiny") != key


def test_compile_reaches_ffais_arm_and_its_precision_run(tiny_checkpoint, tmp_path, monkeypatch):
    """``--compile`` is an opt-in dtype's: float32 refuses it; it reaches the arm's and the
    precision run's command lines, and the untimed first load loads and returns, untimed."""
    from ffai.bench import arms

    with pytest.raises(UsageError, match="--compile"):
        BenchOptions(compile=True)
    assert BenchOptions(dtype="int8", compile=True).compile
    cmd = arms.command("ffai", arms.LOAD, tiny_checkpoint, dtype="int8", cores=1, compile=True)
    assert cmd[3:5] == ["ffai", arms.LOAD] and cmd[-1] == "--compile"
    assert "--compile" not in arms.command("ffai", "frame", tiny_checkpoint, dtype="int8", cores=1)
    assert agreement.command("frame", tiny_checkpoint, dtype="int8", cores=1, compile=True)[-1] == "--compile"
    monkeypatch.setenv("FFAI_HOME", str(tmp_path))
    result = arms.run("ffai", arms.LOAD, tiny_checkpoint, dtype="int8", cores=1, compile=True)
    assert result["load_s"] > 0 and "time_s" not in result and result["dtype"] == "int8"


def test_an_engine_without_bench_hooks_is_one_line_error():
    class Bare:
        info = EngineInfo("bare", "vlm", "experimental", "no hooks", "bare-model")

    with pytest.raises(UsageError, match="^engine 'bare' provides no bench hooks$"):
        hooks_for(Bare())
    with pytest.raises(UsageError, match="no engine named 'nope'"):
        hooks_for("nope")


def test_missing_reference_files_are_one_line_errors(tmp_path, monkeypatch):
    absent = tmp_path / "smolvlm-256m-instruct"
    monkeypatch.setattr(smolvlm_checkpoints, "REFERENCE_DIR", absent)
    with pytest.raises(ModelError) as error:
        checkpoints.checkpoint("tiny")
    assert str(error.value).startswith(f"{absent} is missing") and "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []

    # The bench without --model needs them for its default checkpoint.
    code = (
        f"from ffai.engines.smolvlm.bench import checkpoints\ncheckpoints.REFERENCE_DIR = checkpoints.Path({str(absent)!r})\n"
        + RUN_CLI
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "--cases", "frame", "--ledger", str(tmp_path / "l.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"ffai: error: no --model given, and {absent} is missing: the random test checkpoints are built from the "
        f"real config and tokenizer files there, which ship inside the package; pass --model PATH to a "
        f"smolvlm checkpoint"
    ]
    assert not (tmp_path / "l.jsonl").exists()


def test_default_ledger_is_read_from_the_environment_when_used(tmp_path, monkeypatch):
    monkeypatch.setenv("FFAI_HOME", str(tmp_path / "home"))
    assert ledger.default_ledger() == tmp_path / "home" / "bench" / "ledger.jsonl"
    ledger.append(None, {"run": 1})
    ledger.append(None, {"run": 2})
    lines = (tmp_path / "home" / "bench" / "ledger.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [{"run": 1}, {"run": 2}]


def test_options_are_checked_before_anything_runs(tmp_path):
    assert parse_cases("frame, clip,") == ("frame", "clip")
    for kwargs, message in [
        ({"repeats": 0}, "--repeats"),
        ({"cases": ("frame", "movie")}, "unknown case 'movie'"),
        ({"cases": ("frame", "frame")}, "twice"),
        ({"dtype": "float16"}, "--dtype"),
        ({"quality_corpus": tmp_path}, "questions.jsonl"),
    ]:
        with pytest.raises(UsageError, match=message):
            BenchOptions(**kwargs)


def test_missing_transformers_is_one_line_error(tmp_path):
    code = "import sys; sys.modules['transformers'] = None\n" + RUN_CLI
    proc = subprocess.run(
        [sys.executable, "-c", code, "--cases", "frame", "--ledger", str(tmp_path / "l.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "ffai: error: the reference arm needs transformers: pip install 'ffai[reference]'"
    ]
    assert not (tmp_path / "l.jsonl").exists()


@pytest.mark.slow
def test_bench_on_the_tiny_checkpoint(tiny_checkpoint, tmp_path):
    """Both arms for real (fresh processes, pipeline workers, transformers) on frame and clip."""
    ledger_file = tmp_path / "ledger.jsonl"
    args = [
        "--model",
        str(tiny_checkpoint),
        "--cases",
        "frame,clip",
        "--repeats",
        "1",
        "--cores",
        "1",
        "--busy",
        "1",
        "--json",
        "--no-fail",
        "--ledger",
        str(ledger_file),
    ]
    proc = subprocess.run([sys.executable, "-c", RUN_CLI, *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report["gates"]) == set(gates.GATES)
    assert report["gates"]["correctness"]["status"] == "PASS", report["gates"]["correctness"]
    assert report["gates"]["quality"]["status"] == "SKIP"
    assert {g["status"] for g in report["gates"].values()} <= {"PASS", "FAIL", "SKIP"}
    frame, clip = report["cases"]
    assert (frame["case"], clip["case"]) == ("frame", "clip")
    assert frame["tokens"]["items"] == 1 and clip["tokens"]["items"] == 6  # 12 s at --fps 1 --window 2
    # --batch auto batches on the CPU, so the clip also faces the reference batched with padding.
    assert report["batch"] == 4 and "reference_batched" not in frame
    assert clip["reference_batched"]["batch"] == 4 and clip["reference_batched"]["median_s"] > 0
    assert clip["batched_reference_tokens"]["equal"]  # the tiny model's padded rows round alike
    speeds = clip["throughput"]["ffai"]
    assert speeds["realtime"] == pytest.approx(12.0 / clip["ffai"]["median_s"], 1e-2)
    assert speeds["items_per_s"] == pytest.approx(6 / clip["ffai"]["median_s"], 1e-2)
    assert frame["throughput"]["ffai"]["realtime"] is None
    assert "vs batched ref" in proc.stderr and "RTF" in proc.stderr
    # --busy 1: ffai once more per case beside a busy program (no target but on 2 cores).
    assert report["busy"] == 1 and "busy / quiet" in proc.stderr
    for record in (frame, clip):
        assert record["busy"]["loops"] == 1 and record["busy"]["cores"] == 1 and record["busy"]["median_s"] > 0
        assert record["busy_ratio"] > 0 and record["busy_target"] is None
    for record in (frame, clip):
        assert record["tokens"]["equal"] and not record["ffai_imports_transformers"]
        for arm in ("ffai", "reference"):
            assert record[arm]["peak_rss"] > 50 * 2**20 and record[arm]["median_s"] > 0
        assert record["ffai"]["torch_threads"] == {"engine": 1}  # one core: all stages in one process
        assert record["reference"]["torch_threads"] == {"main": 1}
        # float32: the precision run times decode against the floor and measures no agreement.
        precision = record["precision"]
        assert precision["threads"] == 1 and precision["floor_bytes"] == text_weights(tiny_checkpoint) * 4
        assert 0 < precision["decode_ms_per_token"] and precision["floor_ms"] > 0 and precision["bandwidth_gb_s"] > 0.1
        assert precision["floor_ratio"] == pytest.approx(precision["decode_ms_per_token"] / precision["floor_ms"], 1e-2)
        assert "tile_cosine_min" not in precision and "tokens" not in precision
    assert "gates" in proc.stderr and "correctness" in proc.stderr  # the rich tables
    assert report["cpu"] == ledger.cpu_identity() and ledger.cpu_identity()["model"] in proc.stderr
    lines = ledger_file.read_text().splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert set(ledger.REQUIRED_KEYS) <= set(line)
    assert line["gates"] == report["gates"] and set(line["cases"]) == {"frame", "clip"}
    assert line["versions"]["torch"] and line["cores"] == 1
    assert line["cpu"] == report["cpu"] and line["cases"]["frame"]["precision"] == frame["precision"]
    assert line["load_average"] == report["load_average"] and report["load_average"]["start"] >= 0
    assert line["busy"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("dtype, width, case", [("bfloat16", 2, "frame"), ("int8", 1, "clip")])
def test_bench_in_an_opt_in_dtype_gates_agreement_with_float32(tiny_checkpoint, tmp_path, dtype, width, case):
    """--dtype bfloat16 / int8 for real: the agreement gate instead of correctness, its figures.
    One case a dtype, the two cases between them: each case is five fresh processes, and the
    dtypes' agreement on stills and on windows is gated in-process by test_smolvlm_precision."""
    ledger_file = tmp_path / "ledger.jsonl"
    args = ["--model", str(tiny_checkpoint), "--cases", case, "--repeats", "1", "--cores", "1"]
    args += ["--dtype", dtype, "--json", "--no-fail", "--ledger", str(ledger_file)]
    proc = subprocess.run([sys.executable, "-c", RUN_CLI, *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert tuple(report["gates"]) == gates.gate_names(dtype)
    # On the tiny model (two layers, 64 px tiles) both dtypes clear their bounds with room.
    assert report["gates"]["agreement"]["status"] == "PASS", report["gates"]["agreement"]
    bound = gates.COSINE_MIN[dtype]
    (record,) = report["cases"]
    items, tiles = {"frame": (1, 1), "clip": (6, 12)}[case]  # clip: 6 windows of 2 frames
    p = record["precision"]
    assert record["case"] == case
    assert p["float32_is_reference"] and p["cosine_target"] == bound and p["tiles"] == tiles
    assert bound <= p["tile_cosine_min"] <= 1 and bound <= p["logits_cosine_min"] <= 1
    assert p["tile_cosine_min"] == min(c for cs in p["tile_cosines"].values() for c in cs)
    assert (p["tokens"]["items"], p["tokens"]["total"], len(p["first_divergence"])) == (items, 32 * items, items)
    assert all(pos is None or 0 <= pos < 32 for pos in p["first_divergence"].values())
    assert p["floor_bytes"] == text_weights(tiny_checkpoint) * width and p["decode_ms_per_token"] > 0
    assert record["rss_target"] == gates.RSS_TARGETS[dtype] and record["ffai"]["peak_rss"] > 0
    assert f"agree {p['tokens']['same']}/{p['tokens']['total']}" in proc.stderr
    assert report["cpu"] == ledger.cpu_identity()
    line = json.loads(ledger_file.read_text())
    assert line["dtype"] == dtype and line["cpu"] == report["cpu"] and line["gates"] == report["gates"]
    assert line["cases"][case]["precision"]["tokens"] == p["tokens"]


@pytest.mark.slow
def test_quality_corpus_is_answered_alike_by_both_arms(tiny_checkpoint, tmp_path):
    """A two-question corpus through both arms: the same answers, scored by exact match."""
    from ffai.bench import arms, cases

    for i in range(2):
        cases.synthetic_image(40 + i, (96, 64)).save(tmp_path / f"{i}.png")
    rows = [
        {"image": "0.png", "question": "What is this?", "answer": "nothing"},
        {"image": "1.png", "question": "What colour?", "answer": "blue"},
    ]
    (tmp_path / "questions.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    results = {arm: arms.run(arm, arms.QUALITY, tiny_checkpoint, cores=1, corpus=tmp_path) for arm in arms.ARMS}
    assert results["ffai"]["answers"] == results["reference"]["answers"]
    assert set(results["ffai"]["answers"]) == {"1", "2"}
    for result in results.values():
        expected = sum(result["answers"][str(n)] == row["answer"] for n, row in enumerate(rows, 1))
        assert (result["correct"], result["total"]) == (expected, 2)
