"""Micro-benchmark of the pure plan layer: build_plan on the spec's example runtime and on a wide one.

    .venv/bin/python scripts/bench_plan.py [iterations]

The plan is computed on every POST /plan and at every start; this shows it stays far below a request's
budget (no Django, no cluster involved).
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobs.plan import build_plan
from jobs.spec import JobSpec, RuntimeRef
from runtimes.reasons import SiteRules

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "dispatch-kind.yaml"


def wide_runtime(base: dict[str, Any], containers: int) -> dict[str, Any]:
    """The example with many containers and env entries: the cost grows with the runtime's size."""
    runtime = copy.deepcopy(base)
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["env"] = [{"name": f"V{i}", "value": str(i)} for i in range(100)]
    pod["containers"] += [{"name": f"sidecar-{i}", "image": "busybox"} for i in range(containers)]
    return runtime


def bench(name: str, runtime: dict[str, Any], spec: JobSpec, iterations: int) -> None:
    start = time.perf_counter()
    for attempt in range(1, iterations + 1):
        build_plan(
            spec=spec,
            runtime=runtime,
            rules=SiteRules(),
            allow_listed=True,
            namespace_granted=True,
            job_id="jabcdefghij",
            attempt=attempt,
            label_domain="dispatch.example.com",
            trainer_version="v2.3.0",
        ).to_dict()
    elapsed = time.perf_counter() - start
    print(f"{name:<28} {iterations:>7} plans  {elapsed * 1e6 / iterations:8.1f} us/plan")


def main() -> None:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    base: dict[str, Any] = yaml.safe_load(FIXTURE.read_text())
    spec = JobSpec(
        runtime=RuntimeRef(kind="ClusterTrainingRuntime", name="dispatch-kind"),
        namespace="team-a",
        image="registry.example.com/team-a/train:1",
        command=("python", "train.py"),
        env=(("LR", "0.1"),),
        num_nodes=2,
    )
    bench("dispatch-kind", base, spec, iterations)
    bench("wide (50 containers)", wide_runtime(base, 50), spec, max(iterations // 10, 1))


if __name__ == "__main__":
    main()
