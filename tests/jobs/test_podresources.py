"""jobs.podresources: a plan refuses (`resources-invalid`) a job whose pods the Job API would refuse, naming
every field. The expected messages are Kubernetes 1.36's rules (pkg/apis/core/validation
validateResourceRequirements), not the function's output; the runtime is the local plane's dispatch-kind."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs.plan import START_ONLY_CODES, build_plan
from jobs.podresources import RESOURCES_INVALID, resource_problems, resources_reasons
from jobs.spec import JobSpec, RuntimeRef
from runtimes.fixes import FIXES
from runtimes.reasons import SiteRules

REPO = Path(__file__).resolve().parents[2]
DISPATCH_KIND = yaml.safe_load((REPO / "scripts" / "k8s" / "dispatch-kind.yaml").read_text())
NODE_POD = "spec.template.spec.replicatedJobs[0].template.spec.template.spec"


def job(**overrides: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "runtime": RuntimeRef(kind="ClusterTrainingRuntime", name="dispatch-kind"),
        "namespace": "team-a",
        "image": "localhost/trainer:v1",
    }
    return JobSpec(**(fields | overrides))


def plan(spec: JobSpec, runtime: dict[str, Any] | None = None) -> Any:
    return build_plan(
        spec=spec,
        runtime=runtime or copy.deepcopy(DISPATCH_KIND),
        rules=SiteRules(),
        allow_listed=True,
        namespace_granted=True,
        job_id="jabcdefgh23",
        attempt=1,
        label_domain="dispatch.dev",
        trainer_version="v2.3.0",
    )


def test_a_gpu_requested_without_a_limit_is_refused_at_plan_naming_the_field() -> None:
    """The case found live: `resources_per_node: {"requests": {"nvidia.com/gpu": "1"}}` passed plan and start,
    then the API server refused every Job ("Limit must be set for non overcommitable resources")."""
    refused = plan(job(resources_per_node={"requests": {"nvidia.com/gpu": "1"}}))
    assert refused.refused
    (reason,) = [r for r in refused.reasons if r.code == RESOURCES_INVALID]
    assert reason.path == "resources_per_node.limits"
    assert "nvidia.com/gpu is requested (1) without a limit" in reason.message
    assert "Limit must be set for non overcommitable resources" in reason.message
    assert not reason.waived
    ok = plan(
        job(resources_per_node={"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}})
    )
    assert not ok.refused and RESOURCES_INVALID not in ok.codes
    # Only a limit is fine too: Kubernetes defaults the request to it.
    assert not plan(job(resources_per_node={"limits": {"nvidia.com/gpu": "2"}})).refused


@pytest.mark.parametrize(
    ("resources", "path", "why"),
    [
        (
            {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
            "x.requests[nvidia.com/gpu]",
            "must be requested exactly at its limit",
        ),
        (
            {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}},
            "x.requests[cpu]",
            "cpu is requested 2, more than its limit 1",
        ),
        ({"limits": {"nvidia.com/gpu": "500m"}}, "x.limits[nvidia.com/gpu]", "must be a whole number"),
        ({"requests": {"gpu": "1"}}, "x.requests[gpu]", "is not a standard resource for containers"),
        (
            {"limits": {"example.com/bad_name!": "1"}},
            "x.limits[example.com/bad_name!]",
            "does not follow the extended resource name standard",
        ),
        ({"requests": {"memory": "-1Gi"}}, "x.requests[memory]", "is negative"),
        ({"limits": {"memory": "lots"}}, "x.limits[memory]", "is not a Kubernetes quantity"),
        ({"limits": {"hugepages-2Mi": "4Mi"}}, "x", "hugepages need cpu or memory"),
        (
            {"requests": {"hugepages-2Mi": "2Mi"}, "limits": {"hugepages-2Mi": "4Mi", "memory": "1Gi"}},
            "x.requests[hugepages-2Mi]",
            "must be requested exactly at its limit",
        ),
    ],
)
def test_each_job_api_rule_on_container_resources(resources: dict[str, Any], path: str, why: str) -> None:
    problems = resource_problems(resources, "x")
    assert [p for p, _ in problems] == [path], problems
    assert why in problems[0][1]


def test_what_the_job_api_accepts_is_not_a_problem() -> None:
    for resources in (
        {},
        {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}},
        {"requests": {"cpu": "1"}},  # cpu and memory may be requested without a limit
        {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2", "cpu": "4"}},
        {"limits": {"hugepages-2Mi": "4Mi", "memory": "1Gi"}},
        {"requests": {"ephemeral-storage": "10Gi", "kubernetes.io/anything": "1"}},
    ):
        assert resource_problems(resources, "x") == [], resources


def test_every_container_of_the_runtime_is_judged_and_every_reason_is_named() -> None:
    """A runtime container and an init container with wrong resources, and the job's own resources: one reason
    each, each naming its field; the node container's own resources are replaced by resources_per_node."""
    runtime = copy.deepcopy(DISPATCH_KIND)
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["resources"] = {"requests": {"example.com/fpga": "1"}}  # replaced by the job's
    pod["containers"].append(
        {"name": "sidecar", "image": "busybox", "resources": {"requests": {"example.com/fpga": "1"}}}
    )
    pod["initContainers"] = [{"name": "prep", "image": "busybox", "resources": {"limits": {"gpu": "1"}}}]
    spec = job(resources_per_node={"requests": {"nvidia.com/gpu": "1", "cpu": "2"}, "limits": {"cpu": "1"}})
    reasons = resources_reasons(spec, runtime)
    assert [r.path for r in reasons] == [
        f"{NODE_POD}.initContainers[0].resources.limits[gpu]",
        "resources_per_node.limits",
        "resources_per_node.requests[cpu]",
        f"{NODE_POD}.containers[1].resources.limits",
    ]
    assert all(r.code == RESOURCES_INVALID and not r.waived for r in reasons)
    refused = plan(spec, runtime)
    assert refused.refused and refused.codes.count(RESOURCES_INVALID) == 4
    assert refused.training_runtime is not None  # the plan still shows what would have been created


def test_the_code_is_a_start_only_code_with_a_fix() -> None:
    assert RESOURCES_INVALID in START_ONLY_CODES
    assert FIXES[RESOURCES_INVALID].who == "submitter"
