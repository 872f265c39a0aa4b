"""The command line's Kueue flags and the plan's queue line (pure: no server)."""

from __future__ import annotations

import io

from dispatch_client.cli import _show_plan, build_parser, job_spec
from dispatch_client.models import Plan


def test_queue_and_priority_flags_go_into_the_job_body() -> None:
    args = build_parser().parse_args(
        ["plan", "--runtime", "dispatch-kind", "--namespace", "team-a", "--image", "i:1",
         "--queue-name", "team-a-queue", "--priority-class", "high"]
    )  # fmt: skip
    spec = job_spec(args)
    assert (spec["queue_name"], spec["priority_class"]) == ("team-a-queue", "high")


def test_the_plan_says_where_the_job_queues_and_whether_it_fits() -> None:
    queue = {
        "local_queue": "team-a-queue",
        "cluster_queue": "gpus",
        "fits_now": False,
        "fit_message": "waits for quota in ClusterQueue gpus: nvidia.com/gpu: 2 requested, 0 of 2 free",
    }
    out = io.StringIO()
    _show_plan(out, Plan.from_api({"refused": False, "names": {}, "queue": queue}))
    assert out.getvalue().splitlines()[-1] == (
        "Kueue: LocalQueue team-a-queue on ClusterQueue gpus: does not fit now (waits for quota in "
        "ClusterQueue gpus: nvidia.com/gpu: 2 requested, 0 of 2 free)"
    )
