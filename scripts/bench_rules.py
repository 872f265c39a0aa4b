"""Micro-benchmark: what check_runtime costs next to parsing the same runtime's YAML.

    .venv/bin/python scripts/bench_rules.py [repeat]

The checker runs on every plan, every start and every runtime page, always on a runtime just read from the
API server or a file, so parsing is the natural yardstick: the target is check <= 0.5 x parse. Both are timed
side by side in one run, in alternating rounds (`repeat` of them), on (a) the spec's example runtime and (b) a
runtime with 20 replicated jobs (19 of them extra, so 19 reasons are built). Each round gives a ratio (check /
parse, timed back to back); the target is judged on the median of the rounds' ratios, never on the best round.
"""

from __future__ import annotations

import copy
import statistics
import sys
import timeit
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runtimes.rules import check_runtime  # noqa: E402 - needs the repository on sys.path first
from scripts.bench_common import Target  # noqa: E402

EXAMPLE = REPO / "tests" / "fixtures" / "dispatch-kind.yaml"
TARGET_RATIO = 0.5
WIDE_JOBS = 20

# libyaml's loader when PyYAML was built with it: the loader the service's callers would use.
LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
LOADER_NAME = LOADER.__name__


def wide_runtime_yaml(jobs: int = WIDE_JOBS) -> str:
    """The example with `jobs` replicated jobs: the trainer job, then copies without the trainer label."""
    runtime: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    replicated = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    trainer = replicated[0]
    for index in range(1, jobs):
        extra = copy.deepcopy(trainer)
        extra["name"] = f"step-{index}"
        del extra["template"]["metadata"]
        replicated.append(extra)
    runtime["metadata"]["name"] = f"wide-{jobs}-jobs"
    return yaml.safe_dump(runtime, sort_keys=False)


def _rounds(functions: list[Callable[[], object]], repeat: int) -> list[list[float]]:
    """Seconds per call of each function in each round; the functions alternate within a round, so drift
    hits them alike and a round's values compare."""
    timers = [timeit.Timer(fn) for fn in functions]
    numbers = [timer.autorange()[0] for timer in timers]
    rounds = []
    for _ in range(repeat):
        rounds.append([timer.timeit(number) / number for timer, number in zip(timers, numbers, strict=True)])
    return rounds


def run(repeat: int = 7) -> list[dict[str, Any]]:
    """One row per runtime: {name, loader, bytes, reasons, parse_seconds, check_seconds, ratio, target}."""
    cases = [
        ("spec example (dispatch-kind)", EXAMPLE.read_text()),
        (f"{WIDE_JOBS} replicated jobs", wide_runtime_yaml()),
    ]
    rows: list[dict[str, Any]] = []
    for name, text in cases:
        runtime = yaml.load(text, Loader=LOADER)  # a safe loader (CSafeLoader or SafeLoader)
        verdict = check_runtime(runtime)
        rounds = _rounds([partial(yaml.load, text, Loader=LOADER), partial(check_runtime, runtime)], repeat)
        ratios = [check / parse for parse, check in rounds]
        rows.append(
            {
                "name": name,
                "loader": LOADER_NAME,
                "bytes": len(text.encode()),
                "reasons": len(verdict.reasons),
                "parse_seconds": statistics.median(parse for parse, _ in rounds),
                "check_seconds": statistics.median(check for _, check in rounds),
                "ratios": ratios,
                "ratio": statistics.median(ratios),
                "target": TARGET_RATIO,
            }
        )
    return rows


def targets(rows: list[dict[str, Any]]) -> list[Target]:
    return [
        Target(
            f"rule check / YAML parse, {row['name']}",
            f"{row['ratio']:.3f}",
            f"<= {TARGET_RATIO}",
            row["ratio"] <= TARGET_RATIO,
            f"median of {len(row['ratios'])} rounds ({min(row['ratios']):.3f}-{max(row['ratios']):.3f})",
        )
        for row in rows
    ]


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    rows = run(repeat)
    print(
        f"check_runtime vs yaml.load ({LOADER_NAME}), median of {repeat} rounds; "
        f"target ratio <= {TARGET_RATIO}"
    )
    print(f"{'runtime':<30} {'bytes':>6} {'reasons':>7} {'parse us':>9} {'check us':>9} {'ratio':>6}")
    for row in rows:
        verdict = "ok" if row["ratio"] <= TARGET_RATIO else "OVER TARGET"
        print(
            f"{row['name']:<30} {row['bytes']:>6} {row['reasons']:>7} {row['parse_seconds'] * 1e6:>9.1f} "
            f"{row['check_seconds'] * 1e6:>9.1f} {row['ratio']:>6.3f}  {verdict}"
        )


if __name__ == "__main__":
    main()
