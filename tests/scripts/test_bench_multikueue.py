"""make bench's MultiKueue section (issue 35, scripts/bench_multikueue.py): its verdict, 2 workers / 1 on the
median of the rounds' ratios, and the recording it feeds the supervisor's informers, which groups as the
real planes' objects do (the manager's TrainJob and Workload, the worker's copy and its chain). Pure."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from jobs.supervision.grouping import StaticIndex, Watched, owned_objects
from jobs.supervision.status import Context, derive
from scripts.bench_multikueue import NAMESPACE, TARGET, record, verdict


def rounds(*pairs: tuple[float, float]) -> list[dict[str, Any]]:
    return [{"round": i, "one_ms": one, "two_ms": two} for i, (one, two) in enumerate(pairs, 1)]


def test_the_target_is_met_on_the_median_of_the_rounds_ratios_never_the_best() -> None:
    met = verdict(rounds((10, 19), (10, 30), (10, 21)))  # 1.9, 3.0, 2.1: median 2.1
    assert (met.value, met.met, met.target) == ("2.10", True, f"<= {TARGET}")
    assert "1.90, 3.00, 2.10" in met.judged_on
    missed = verdict(rounds((10, 15), (10, 23), (10, 25)))  # best 1.5, median 2.3
    assert (missed.value, missed.met) == ("2.30", False)


def test_a_round_that_measured_nothing_is_a_miss() -> None:
    assert not verdict(rounds((10, 15), (0, 12))).met
    assert not verdict([]).met


def test_the_recording_groups_as_a_multikueue_attempt_on_its_worker() -> None:
    recording = record({"worker-1": [("jabc", "tj-1")], "worker-2": [("jdef", "tj-2")]})
    manager = StaticIndex(
        recording[("", NAMESPACE, "TrainJob")] + recording[("", NAMESPACE, "Workload")], ["dispatch.dev"]
    )
    for worker, job_id, uid in (("worker-1", "jabc", "tj-1"), ("worker-2", "jdef", "tj-2")):
        on_worker = StaticIndex(
            [o for (cluster, _, _), objs in recording.items() if cluster == worker for o in objs],
            ["dispatch.dev"],
        )
        item = Watched(
            key=(job_id, 1),
            namespace=NAMESPACE,
            trainjob_name=f"{job_id}-1",
            memory={},
            identity_warned=False,
            trainjob_uid=uid,
            cluster=worker,
        )
        grouped = owned_objects(manager, item, worker=on_worker)
        kinds = sorted(o["kind"] for o in grouped.objects)
        assert kinds == ["Event", "Event", "Job", "JobSet", "Pod", "Pod", "TrainJob", "Workload"], kinds
        assert grouped.strangers == []
        status = derive(grouped.objects, Context(now=datetime.now(UTC), attempt=1))
        assert (status.state, status.cluster) == ("running", worker)
