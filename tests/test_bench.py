"""`ffai bench vlm`: the gates' logic on hand-made runs, and the whole bench on the tiny checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ffai.bench import checkpoints, gates, ledger
from ffai.bench.cli import BenchOptions, parse_cases
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


def test_compare_tokens_finds_the_first_mismatch():
    same = gates.compare_tokens({"0": [1, 2, 3], "1": [4]}, {"0": [1, 2, 3], "1": [4]})
    assert same == {"equal": True, "first_mismatch": None, "agreement": 1.0, "items": 2}
    diff = gates.compare_tokens({"0": [1, 2], "10": [5, 6], "2": [7, 8]}, {"0": [1, 2], "10": [5, 9], "2": [7, 0]})
    # Items are compared in their natural order: 0, 2, 10.
    assert diff["first_mismatch"] == {"item": "2", "position": 1, "ffai": 8, "reference": 0}
    assert not diff["equal"] and diff["agreement"] == pytest.approx(4 / 6, abs=1e-4)
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

    # bfloat16: agreement reported, correctness not gated.
    assert gates.gates([slow], None, "bfloat16")["correctness"]["status"] == "SKIP"
    quality = {"corpus": "demo", "ffai": {"correct": 9, "total": 10}, "reference": {"correct": 8, "total": 10}}
    assert gates.quality_gate(quality)["status"] == "FAIL"
    quality["reference"]["correct"] = 9
    assert gates.quality_gate(quality)["status"] == "PASS"


def test_ffai_importing_transformers_fails_correctness():
    bad = run("ffai", 1.0, {"f": [1]}) | {"transformers_imported": True}
    record = gates.summarize_case("frame", {"ffai": [bad], "reference": [run("reference", 1.0, {"f": [1]})]}, "float32")
    assert gates.correctness_gate([record], "float32") == {
        "status": "FAIL",
        "detail": "ffai's arm imported transformers",
    }


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
    assert key == checkpoints.checkpoint_key("tiny") and len(key) == 12
    others = {checkpoints.checkpoint_key(*args) for args in [("real",), ("tiny", 1), ("tiny", 0, "bfloat16")]}
    assert key not in others and len(others) == 3
    assert checkpoints.cache_folder("tiny") == checkpoints.CACHE / f"tiny-{key}"
    # The writer's own code is hashed: an edit to the module, even a comment, is a new folder.
    edited = tmp_path / "checkpoints.py"
    edited.write_text(open(checkpoints.__file__, encoding="utf-8").read() + "# edited\n", encoding="utf-8")
    monkeypatch.setattr(checkpoints, "__file__", str(edited))
    assert checkpoints.checkpoint_key("tiny") != key


def test_missing_reference_files_are_one_line_errors(tmp_path, monkeypatch):
    absent = tmp_path / "smolvlm-256m-instruct"
    monkeypatch.setattr(checkpoints, "REFERENCE_DIR", absent)
    with pytest.raises(ModelError) as error:
        checkpoints.checkpoint("tiny")
    assert str(error.value).startswith(f"{absent} is missing") and "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []

    # The bench without --model needs them for its default checkpoint.
    code = (
        f"from ffai.bench import checkpoints\ncheckpoints.REFERENCE_DIR = checkpoints.Path({str(absent)!r})\n" + RUN_CLI
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
        f"real config and tokenizer files there, which ship with a source checkout only; pass --model PATH to a "
        f"SmolVLM checkpoint"
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
    for record in (frame, clip):
        assert record["tokens"]["equal"] and not record["ffai_imports_transformers"]
        for arm in ("ffai", "reference"):
            assert record[arm]["peak_rss"] > 50 * 2**20 and record[arm]["median_s"] > 0
        assert record["ffai"]["torch_threads"] == {"engine": 1}  # one core: all stages in one process
        assert record["reference"]["torch_threads"] == {"main": 1}
    assert "gates" in proc.stderr and "correctness" in proc.stderr  # the rich tables
    lines = ledger_file.read_text().splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert set(ledger.REQUIRED_KEYS) <= set(line)
    assert line["gates"] == report["gates"] and set(line["cases"]) == {"frame", "clip"}
    assert line["versions"]["torch"] and line["cores"] == 1


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
