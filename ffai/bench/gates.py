"""The bench's schedule, its per-case summaries, and the four gates.

Gates (a SKIP never counts as a pass, and never as a failure):

1. correctness: every item's tokens identical between the arms, in every run (float32 only;
   with ``--dtype bfloat16`` the token agreement is reported and the gate is SKIP);
2. quality: the same number of right answers on the quality corpus (SKIP without one);
3. footprint: ffai's peak RSS <= the reference's, per case;
4. speed: ffai's median time <= the reference's, per case.

The targets (speed-ups, RSS ratios) are reported beside the gates; they do not decide the exit code.
"""

from __future__ import annotations

import statistics
from typing import Iterator

ARMS = ("ffai", "reference")
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
GATES = ("correctness", "quality", "footprint", "speed")
SPEED_TARGETS = {"frame": 1.5, "window": 1.4, "still": 1.3, "clip": 1.5}  # reference time / ffai time, at least
RSS_TARGETS = {"float32": 0.9, "bfloat16": 0.5}  # ffai peak RSS / reference peak RSS, at most


def schedule(cases: list[str], repeats: int) -> Iterator[tuple[str, int, str]]:
    """(case, repeat, arm) in run order: per case the arms alternate ABBA over the repeats, so a
    drift in machine load (shared cores, thermal) weighs on both arms alike."""
    for case in cases:
        for r in range(repeats):
            for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
                yield case, r, arm


def _arm_summary(runs: list[dict]) -> dict:
    times = [run["time_s"] for run in runs]
    return {
        "times_s": [round(t, 3) for t in times],
        "min_s": round(min(times), 3),
        "median_s": round(statistics.median(times), 3),
        "peak_rss": max(run["peak_rss"] for run in runs),
        "load_s": round(statistics.median(run["load_s"] for run in runs), 3),
        "warmup_s": round(statistics.median(run["warmup_s"] for run in runs), 3),
        "torch_threads": runs[0]["torch_threads"],
    }


def compare_tokens(ours: dict[str, list[int]], theirs: dict[str, list[int]]) -> dict:
    """Whether every item's tokens agree; where they first differ; the share of equal positions."""
    first, same, total = None, 0, 0
    for item in sorted(set(ours) | set(theirs), key=_natural):
        a, b = ours.get(item, []), theirs.get(item, [])
        total += max(len(a), len(b))
        same += sum(x == y for x, y in zip(a, b))
        if first is None and a != b:
            pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            first = {
                "item": item,
                "position": pos,
                "ffai": a[pos] if pos < len(a) else None,
                "reference": b[pos] if pos < len(b) else None,
            }
    return {
        "equal": first is None and total > 0,
        "first_mismatch": first,
        "agreement": round(same / total, 4) if total else 0.0,
        "items": len(set(ours) | set(theirs)),
    }


def _natural(item: str) -> tuple:
    return (0, int(item)) if item.isdigit() else (1, item)


def summarize_case(case: str, runs: dict[str, list[dict]], dtype: str) -> dict:
    """One case's record: per-arm times and RSS, ratios against the targets, token agreement."""
    ffai, ref = _arm_summary(runs["ffai"]), _arm_summary(runs["reference"])
    # Each ffai run is compared with each reference run, so a run-to-run change shows too.
    tokens = [compare_tokens(a["tokens"], b["tokens"]) for a in runs["ffai"] for b in runs["reference"]]
    worst = min(tokens, key=lambda t: (t["equal"], t["agreement"]))
    speedup = ref["median_s"] / ffai["median_s"] if ffai["median_s"] else float("inf")
    rss_ratio = ffai["peak_rss"] / ref["peak_rss"] if ref["peak_rss"] else float("inf")
    return {
        "case": case,
        "ffai": ffai,
        "reference": ref,
        "speedup_median": round(speedup, 3),
        "speedup_min": round(ref["min_s"] / ffai["min_s"], 3) if ffai["min_s"] else None,
        "speedup_target": SPEED_TARGETS[case],
        "speedup_target_met": speedup >= SPEED_TARGETS[case],
        "rss_ratio": round(rss_ratio, 3),
        "rss_target": RSS_TARGETS[dtype],
        "rss_target_met": rss_ratio <= RSS_TARGETS[dtype],
        "tokens": worst,
        "ffai_imports_transformers": any(run.get("transformers_imported") for run in runs["ffai"]),
    }


def _gate(status: str, detail: str) -> dict:
    return {"status": status, "detail": detail}


def correctness_gate(records: list[dict], dtype: str) -> dict:
    if not records:
        return _gate(SKIP, "no cases run")
    if any(r["ffai_imports_transformers"] for r in records):
        return _gate(FAIL, "ffai's arm imported transformers")
    agreement = min(r["tokens"]["agreement"] for r in records)
    if dtype != "float32":
        return _gate(SKIP, f"{dtype}: token agreement {100 * agreement:.1f} % (reported, not gated)")
    bad = [r for r in records if not r["tokens"]["equal"]]
    if not bad:
        return _gate(PASS, f"tokens identical in {sum(r['tokens']['items'] for r in records)} items")
    m = bad[0]["tokens"]["first_mismatch"]
    return _gate(
        FAIL,
        f"{bad[0]['case']}: item {m['item']} differs at token {m['position']} "
        f"(ffai {m['ffai']}, reference {m['reference']})",
    )


def quality_gate(quality: dict | None) -> dict:
    if quality is None:
        return _gate(SKIP, "no quality corpus (--quality-corpus DIR, or --model smolvlm-demo)")
    ffai, ref = quality["ffai"], quality["reference"]
    detail = f"{quality['corpus']}: ffai {ffai['correct']}/{ffai['total']}, reference {ref['correct']}/{ref['total']}"
    return _gate(PASS if ffai["correct"] == ref["correct"] else FAIL, detail)


def footprint_gate(records: list[dict]) -> dict:
    if not records:
        return _gate(SKIP, "no cases run")
    over = [r["case"] for r in records if r["rss_ratio"] > 1.0]
    ratios = ", ".join(f"{r['case']} {r['rss_ratio']:.2f}x" for r in records)
    return _gate(FAIL if over else PASS, f"peak RSS ffai/reference: {ratios}")


def speed_gate(records: list[dict]) -> dict:
    if not records:
        return _gate(SKIP, "no cases run")
    slow = [r["case"] for r in records if r["speedup_median"] < 1.0]
    ratios = ", ".join(f"{r['case']} {r['speedup_median']:.2f}x" for r in records)
    return _gate(FAIL if slow else PASS, f"median speed-up reference/ffai: {ratios}")


def gates(records: list[dict], quality: dict | None, dtype: str) -> dict[str, dict]:
    return {
        "correctness": correctness_gate(records, dtype),
        "quality": quality_gate(quality),
        "footprint": footprint_gate(records),
        "speed": speed_gate(records),
    }


def passed(gate_results: dict[str, dict]) -> bool:
    """True when no gate failed (SKIPs are neither passes nor failures)."""
    return all(g["status"] != FAIL for g in gate_results.values())
