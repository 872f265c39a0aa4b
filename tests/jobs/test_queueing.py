"""jobs.queueing: a job's Kueue queue and priority class, the refusals, what it asks of its ClusterQueue and
whether that fits now. Pure: the Kueue objects are the ones Kueue v0.19.2 wrote on the local control plane
(tests/jobs/supervision/kueue-fixtures/) and the queue setup the plane applies
(scripts/k8s/kueue-queues.yaml)."""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs.plan import KUEUE_MANAGER, START_ONLY_CODES, build_plan
from jobs.queueing import (
    NO_KUEUE,
    PRIORITY_CLASS_NOT_ALLOWED,
    QUEUE_NOT_FOUND,
    QUEUE_OVER_CAPACITY,
    KueueInputs,
    QueueChoice,
    allowed_priority_classes,
    choose_queue,
    default_queue,
    fits_now,
    format_quantity,
    job_requests,
    over_capacity_reasons,
)
from jobs.spec import JobSpec, RuntimeRef
from runtimes.reasons import SiteRules

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "jobs" / "supervision" / "kueue-fixtures"
DISPATCH_KIND = yaml.safe_load((REPO / "scripts" / "k8s" / "dispatch-kind.yaml").read_text())
QUEUE_SETUP = list(yaml.safe_load_all((REPO / "scripts" / "k8s" / "kueue-queues.yaml").read_text()))
GPU_PER_NODE = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}


def recorded(name: str, kind: str) -> dict[str, Any]:
    items = json.loads((RECORDED / f"{name}.json").read_text())["items"]
    (obj,) = [i for i in items if i["kind"] == kind]
    return dict(obj)


def setup_object(kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in QUEUE_SETUP if o["kind"] == kind and o["metadata"]["name"] == name]
    return copy.deepcopy(dict(obj))


def job(**overrides: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "runtime": RuntimeRef(kind="ClusterTrainingRuntime", name="dispatch-kind"),
        "namespace": "team-a",
        "image": "localhost/trainer:v1",
    }
    return JobSpec(**(fields | overrides))


def idle_cluster_queue() -> dict[str, Any]:
    """The shared ClusterQueue `dispatch` (cpu 4, memory 16Gi, nvidia.com/gpu 2), nothing reserved."""
    cq = setup_object("ClusterQueue", "dispatch")
    cq["status"] = {"conditions": [{"type": "Active", "status": "True", "reason": "Ready"}]}
    return cq


def plan_with(spec: JobSpec, kueue: KueueInputs) -> Any:
    return build_plan(
        spec=spec,
        runtime=copy.deepcopy(DISPATCH_KIND),
        rules=SiteRules(),
        allow_listed=True,
        namespace_granted=True,
        job_id="jabcdefgh23",
        attempt=1,
        label_domain="dispatch.dev",
        trainer_version="v2.3.0",
        kueue=kueue,
    )


def inputs(spec: JobSpec, **facts: Any) -> KueueInputs:
    local_queue = {
        "metadata": {"name": "dispatch", "namespace": "team-a"},
        "spec": {"clusterQueue": "dispatch"},
    }
    base: dict[str, Any] = {
        "choice": choose_queue(spec, {}),
        "allowed_classes": ("dispatch-low", "dispatch-high"),
        "local_queue": local_queue,
        "cluster_queue": idle_cluster_queue(),
        "priority_class": setup_object("WorkloadPriorityClass", "dispatch-high")
        if spec.priority_class
        else None,
    }
    return KueueInputs(**(base | facts))


# --- choosing ---------------------------------------------------------------------------------------


def test_the_jobs_queue_wins_over_the_namespace_default_and_star_covers_the_other_namespaces() -> None:
    defaults = {"team-a": "team-a-queue", "*": "shared"}
    assert choose_queue(job(queue_name="mine"), defaults) == QueueChoice("mine", "job", None)
    assert choose_queue(job(), defaults) == QueueChoice("team-a-queue", "namespace-default", None)
    assert choose_queue(job(namespace="team-b"), defaults).queue == "shared"
    assert choose_queue(job(), {}) == QueueChoice(None, None, None)
    assert not choose_queue(job(), {}).uses_kueue
    assert default_queue("team-b", {"team-a": "q"}) is None


def test_allowed_priority_classes_per_namespace_an_empty_list_allows_none() -> None:
    allowed = {"team-a": ["dispatch-high"], "team-b": [], "*": ["dispatch-low"]}
    assert allowed_priority_classes("team-a", allowed) == ("dispatch-high",)
    assert allowed_priority_classes("team-b", allowed) == ()
    assert allowed_priority_classes("team-c", allowed) == ("dispatch-low",)
    assert allowed_priority_classes("team-c", {}) == ()


# --- what the job asks ------------------------------------------------------------------------------


def test_requests_are_what_kueue_counted_for_the_same_trainjob() -> None:
    """dispatch-kind's 2 nodes x (100m, 32Mi): the Workload Kueue admitted used cpu 200m, memory 64Mi."""
    workload = recorded("admitted-running", "Workload")
    (assignment,) = workload["status"]["admission"]["podSetAssignments"]
    counted = {k: format_quantity(v) for k, v in job_requests(job(), DISPATCH_KIND).items()}
    assert counted == assignment["resourceUsage"] == {"cpu": "200m", "memory": "64Mi"}


def test_resources_per_node_replace_the_node_containers_as_kueue_counts_them() -> None:
    """The recorded Workload of a TrainJob asking resourcesPerNode nvidia.com/gpu 1 has only the GPU in its
    pod set: Kueue v0.19.2 counts no cpu or memory for it."""
    workload = recorded("pending-insufficient-quota", "Workload")
    (podset,) = workload["spec"]["podSets"]
    (container,) = podset["template"]["spec"]["containers"]
    assert container["resources"] == GPU_PER_NODE
    requests = job_requests(job(resources_per_node=GPU_PER_NODE), DISPATCH_KIND)
    assert requests == {"nvidia.com/gpu": Decimal(2)} and podset["count"] == 2


def test_requests_scale_with_num_nodes_limits_stand_in_and_the_largest_init_container_counts() -> None:
    runtime = copy.deepcopy(DISPATCH_KIND)
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    pod["initContainers"] = [
        {"name": "fetch", "resources": {"requests": {"cpu": "2"}}},
        {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"memory": "512Mi"}}},
    ]
    requests = job_requests(job(num_nodes=3), runtime)
    # per pod: cpu max(1, 2) = 2, memory 1Gi + 512Mi sidecar
    assert {k: format_quantity(v) for k, v in requests.items()} == {"cpu": "6", "memory": "4608Mi"}


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("0.2", "200m"),
        ("4", "4"),
        ("67108864", "64Mi"),
        ("17179869184", "16Gi"),
        ("0.0005", "0.0005"),
        # A request the syntax allows but no int can be written as (Python's 4,300-digit limit): the plan
        # answered 500 (the schema fuzz found it).
        ("1e999999", "1e999999"),
        ("1.5e40", "15e39"),
    ],
)
def test_format_quantity(value: str, text: str) -> None:
    assert format_quantity(Decimal(value)) == text


# --- fits now ---------------------------------------------------------------------------------------


def test_a_gpu_job_waits_when_the_recorded_cluster_queues_gpus_are_reserved() -> None:
    """The ClusterQueue recorded while one 2-GPU job ran and two waited: 2 of 2 GPUs reserved."""
    cq = recorded("pending-insufficient-quota", "ClusterQueue")
    name = cq["metadata"]["name"]
    fits, message, quotas = fits_now(cq, job_requests(job(resources_per_node=GPU_PER_NODE), DISPATCH_KIND))
    assert not fits
    assert message == (
        f"waits for quota in ClusterQueue {name}: nvidia.com/gpu: 2 requested, 0 of 2 free in flavor "
        "dispatch-kwok"
    )
    gpu = next(q for q in quotas if q.resource == "nvidia.com/gpu").to_dict()
    assert gpu == {
        "flavor": "dispatch-kwok",
        "resource": "nvidia.com/gpu",
        "quota": "2",
        "reserved": "2",
        "usage": "2",
        "free": "0",
        "requested": "2",
    }
    # A job asking only cpu and memory still fits beside it.
    fits, message, _ = fits_now(cq, job_requests(job(), DISPATCH_KIND))
    assert fits and message == f"fits ClusterQueue {name}'s free quota now (flavor dispatch-kwok)"


def test_a_job_larger_than_the_quota_never_fits_and_an_uncovered_resource_is_named() -> None:
    cq = idle_cluster_queue()
    fits, message, _ = fits_now(cq, {"nvidia.com/gpu": Decimal(3)})
    assert not fits and "asks more than ClusterQueue dispatch's quota, so it can never be admitted" in message
    fits, message, _ = fits_now(cq, {"example.com/fpga": Decimal(1)})
    assert (fits, message) == (
        False,
        "ClusterQueue dispatch has no quota for example.com/fpga: Kueue cannot admit the job",
    )
    cq["status"]["conditions"][0] |= {"status": "False", "reason": "FlavorNotFound", "message": "no flavor"}
    fits, message, _ = fits_now(cq, {"cpu": Decimal(1)})
    assert not fits and message == "ClusterQueue dispatch is not active: FlavorNotFound: no flavor"


# --- what a ClusterQueue can ever admit ----------------------------------------------------------------

FOUR_GPUS = {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}  # 2 per node, 2 nodes


def test_a_job_asking_more_than_the_cluster_queue_can_ever_admit_is_refused_at_plan() -> None:
    """The ClusterQueue `dispatch` has 2 GPUs and no cohort: 2 per node on 2 nodes can never be admitted. The
    plan said so ("it can never be admitted") but accepted the job, which then waited for ever."""
    spec = job(queue_name="dispatch", resources_per_node=FOUR_GPUS)
    plan = plan_with(spec, inputs(spec))
    assert plan.refused
    assert _codes_and_messages(plan) == [
        (
            QUEUE_OVER_CAPACITY,
            "queue_name",
            "the job requests nvidia.com/gpu 4 in total, more than ClusterQueue dispatch can ever admit "
            "(nominal quota plus borrowing limit): at most 2 in flavor dispatch-kwok",
        )
    ]
    # Waiting for quota that is reserved now is not a refusal: it may come.
    fits = job(queue_name="dispatch", resources_per_node=GPU_PER_NODE)
    busy = recorded("pending-insufficient-quota", "ClusterQueue")
    waiting = plan_with(fits, inputs(fits, cluster_queue=busy))
    assert not waiting.refused and waiting.queue is not None and waiting.queue.fits_now is False


def test_borrowing_counts_only_in_a_cohort_and_up_to_its_limit() -> None:
    cq = idle_cluster_queue()
    gpu = cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]
    gpu["borrowingLimit"] = "2"
    assert over_capacity_reasons(cq, {"nvidia.com/gpu": Decimal(4)}) != []  # no cohort: nothing to borrow
    cq["spec"]["cohortName"] = "team"
    assert over_capacity_reasons(cq, {"nvidia.com/gpu": Decimal(4)}) == []  # 2 + 2
    (reason,) = over_capacity_reasons(cq, {"nvidia.com/gpu": Decimal(5)})
    assert reason.message.endswith("at most 4 in flavor dispatch-kwok")
    del gpu["borrowingLimit"]  # in a cohort without a limit: what it may borrow is not known here
    assert over_capacity_reasons(cq, {"nvidia.com/gpu": Decimal(64)}) == []


def test_every_resource_that_can_never_fit_is_a_reason_and_so_is_one_flavor_for_all() -> None:
    cq = idle_cluster_queue()
    reasons = over_capacity_reasons(
        cq, {"cpu": Decimal(8), "nvidia.com/gpu": Decimal(4), "example.com/fpga": Decimal(1)}
    )
    assert [r.message.split(" in total")[0] for r in reasons] == [
        "the job requests example.com/fpga 1",
        "the job requests cpu 8",
        "the job requests nvidia.com/gpu 4",
    ]
    assert "has no quota for example.com/fpga" in reasons[0].message
    # Two flavors, each big enough for one resource but neither for both: Kueue puts a group in one flavor.
    group = cq["spec"]["resourceGroups"][0]
    group["flavors"] = [
        {
            "name": "a",
            "resources": [{"name": "cpu", "nominalQuota": "8"}, {"name": "memory", "nominalQuota": "1Gi"}],
        },
        {
            "name": "b",
            "resources": [{"name": "cpu", "nominalQuota": "1"}, {"name": "memory", "nominalQuota": "8Gi"}],
        },
    ]
    group["coveredResources"] = ["cpu", "memory"]
    (reason,) = over_capacity_reasons(cq, {"cpu": Decimal(4), "memory": Decimal(4 * 2**30)})
    assert "which no single flavor of ClusterQueue dispatch can ever hold together" in reason.message
    assert "flavor a: cpu at most 8, memory at most 1Gi; flavor b: cpu at most 1, memory at most 8Gi" in (
        reason.message
    )


# --- the plan ---------------------------------------------------------------------------------------


def test_a_queued_plan_labels_the_trainjob_suspends_it_and_writes_no_runtime_patch() -> None:
    spec = job(queue_name="dispatch", priority_class="dispatch-high")
    plan = plan_with(spec, inputs(spec))
    assert not plan.refused, plan.reasons
    assert plan.train_job is not None
    labels = plan.train_job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "dispatch"
    assert labels["kueue.x-k8s.io/priority-class"] == "dispatch-high"
    assert plan.train_job["spec"]["suspend"] is True
    # Kueue's mutating webhook owns the runtimePatch under its manager; dispatch sends none at all.
    assert "runtimePatches" not in plan.train_job["spec"]
    assert KUEUE_MANAGER not in json.dumps(plan.to_dict()["objects"])
    queue = plan.to_dict()["queue"]
    assert queue == {
        "local_queue": "dispatch",
        "source": "job",
        "cluster_queue": "dispatch",
        "priority_class": "dispatch-high",
        "priority": 1000,
        "requests": {"cpu": "200m", "memory": "64Mi"},
        "quota": [
            {"flavor": "dispatch-kwok", "resource": "cpu", "quota": "4", "reserved": "0", "usage": "0",
             "free": "4", "requested": "200m"},
            {"flavor": "dispatch-kwok", "resource": "memory", "quota": "16Gi", "reserved": "0",
             "usage": "0", "free": "16Gi", "requested": "64Mi"},
            {"flavor": "dispatch-kwok", "resource": "nvidia.com/gpu", "quota": "2", "reserved": "0",
             "usage": "0", "free": "2", "requested": None},
        ],
        "fits_now": True,
        "fit_message": "fits ClusterQueue dispatch's free quota now (flavor dispatch-kwok)",
        "pending_workloads": None,
        "workers": [],  # a queue on this cluster: no MultiKueue workers
    }  # fmt: skip


def test_a_job_without_queue_or_priority_has_no_queue_and_no_kueue_labels() -> None:
    plan = plan_with(job(), NO_KUEUE)
    assert plan.queue is None and plan.to_dict()["queue"] is None
    assert plan.train_job is not None
    assert not [k for k in plan.train_job["metadata"]["labels"] if k.startswith("kueue.x-k8s.io/")]
    assert "suspend" not in plan.train_job["spec"]


def test_a_job_asking_for_a_queue_cannot_be_planned_without_what_was_read_of_kueue() -> None:
    with pytest.raises(ValueError, match="what was read of Kueue"):
        build_plan(
            spec=job(queue_name="dispatch"),
            runtime=DISPATCH_KIND,
            rules=SiteRules(),
            allow_listed=True,
            namespace_granted=True,
            job_id="jabcdefgh23",
            attempt=1,
            label_domain="dispatch.dev",
            trainer_version="v2.3.0",
        )


def test_the_namespace_default_queue_labels_the_trainjob() -> None:
    spec = job()
    choice = choose_queue(spec, {"team-a": "dispatch"})
    plan = plan_with(spec, inputs(spec, choice=choice))
    assert plan.train_job is not None
    assert plan.train_job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "dispatch"
    assert plan.to_dict()["queue"]["source"] == "namespace-default"


def _codes_and_messages(plan: Any) -> list[tuple[str, str, str]]:
    return [(r.code, r.path, r.message) for r in plan.reasons]


def test_an_unknown_local_queue_is_refused_queue_not_found() -> None:
    spec = job(queue_name="nope")
    plan = plan_with(spec, inputs(spec, local_queue=None, cluster_queue=None))
    assert plan.refused
    assert _codes_and_messages(plan) == [
        (
            QUEUE_NOT_FOUND,
            "queue_name",
            "LocalQueue nope does not exist in namespace team-a (the job's queue_name)",
        )
    ]
    default = job()
    choice = choose_queue(default, {"*": "gone"})
    plan = plan_with(default, inputs(default, choice=choice, local_queue=None, cluster_queue=None))
    assert _codes_and_messages(plan)[0][2] == (
        "LocalQueue gone does not exist in namespace team-a (the namespace's default queue, a site setting)"
    )


def test_without_kueue_installed_a_queued_job_is_refused_saying_so() -> None:
    spec = job(queue_name="dispatch")
    plan = plan_with(spec, KueueInputs(choice=choose_queue(spec, {}), installed=False))
    assert plan.refused and plan.codes == (QUEUE_NOT_FOUND,)
    assert "Kueue is not installed in the cluster" in plan.reasons[0].message


@pytest.mark.parametrize(
    ("spec", "facts", "message"),
    [
        (
            job(queue_name="dispatch", priority_class="vip"),
            {"allowed_classes": ("dispatch-low",)},
            "priority class vip is not allowed in namespace team-a: the allowed ones are dispatch-low",
        ),
        (
            job(queue_name="dispatch", priority_class="dispatch-high"),
            {"allowed_classes": ()},
            "priority class dispatch-high is not allowed in namespace team-a: none is allowed there; the "
            "platform team allows them in the site settings",
        ),
        (
            job(priority_class="dispatch-high"),
            {"local_queue": None, "cluster_queue": None},
            "priority class dispatch-high needs a Kueue queue: the job names no queue_name and namespace "
            "team-a has no default queue",
        ),
        (
            job(queue_name="dispatch", priority_class="dispatch-high"),
            {"priority_class": None},
            "priority class dispatch-high is allowed in namespace team-a, but no WorkloadPriorityClass "
            "dispatch-high exists in the cluster",
        ),
    ],
)
def test_a_priority_class_the_namespace_may_not_use_is_refused(
    spec: JobSpec, facts: dict[str, Any], message: str
) -> None:
    plan = plan_with(spec, inputs(spec, **facts))
    assert plan.refused
    assert _codes_and_messages(plan) == [(PRIORITY_CLASS_NOT_ALLOWED, "priority_class", message)]


def test_a_missing_cluster_queue_is_a_warning_and_does_not_fit() -> None:
    spec = job(queue_name="dispatch")
    plan = plan_with(spec, inputs(spec, cluster_queue=None))
    assert not plan.refused
    assert plan.queue is not None and plan.queue.fits_now is False
    assert "ClusterQueue dispatch of LocalQueue team-a/dispatch does not exist" in plan.warnings[-1]


def test_the_start_only_codes_include_the_kueue_codes() -> None:
    assert {QUEUE_NOT_FOUND, PRIORITY_CLASS_NOT_ALLOWED, QUEUE_OVER_CAPACITY} <= set(START_ONLY_CODES)
