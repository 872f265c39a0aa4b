"""JobSpecSerializer (the job request body) and jobs.spec. No DB: the serializer touches no model."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest
from rest_framework.exceptions import ValidationError

from jobs.serializers import JobSpecSerializer, job_spec_parse
from jobs.spec import JobSpec, RuntimeRef, env_name_problem, parse_quantity

VALID: dict[str, Any] = {
    "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
    "namespace": "team-a",
    "display_name": "first run",
    "image": "registry.example.com/team-a/train:1",
    "command": ["python", "train.py"],
    "args": ["--lr", ""],
    "env": {"LR": "0.1", "EMPTY": ""},
    "num_nodes": 2,
    "procs_per_node": 4,
    "resources_per_node": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": 1}},
    "active_deadline_seconds": 3600,
    "labels": {"team": "a", "example.com/cost-center": ""},
    "queue_name": "team-a-queue",
    "recovery_policy": {"retry": {"preempted": 3, "app-error": 0}},
}


def body(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(VALID)
    for key, value in changes.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def errors_of(data: Any, context: dict[str, Any] | None = None) -> Any:
    serializer = JobSpecSerializer(data=data, context=context or {})
    assert not serializer.is_valid()
    # The API's parse (one serializer per thread, reused from one body to the next) answers the same.
    with pytest.raises(ValidationError) as raised:
        job_spec_parse(data=data, label_domain=(context or {}).get("label_domain"))
    assert raised.value.detail == serializer.errors
    return serializer.errors


def test_a_valid_body_becomes_a_job_spec() -> None:
    serializer = JobSpecSerializer(data=body())
    assert serializer.is_valid(), serializer.errors
    assert serializer.to_spec() == JobSpec(
        runtime=RuntimeRef(kind="ClusterTrainingRuntime", name="dispatch-kind"),
        namespace="team-a",
        display_name="first run",
        image="registry.example.com/team-a/train:1",
        command=("python", "train.py"),
        args=("--lr", ""),
        env=(("LR", "0.1"), ("EMPTY", "")),
        num_nodes=2,
        procs_per_node=4,
        resources_per_node={"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": "1"}},
        active_deadline_seconds=3600,
        labels={"team": "a", "example.com/cost-center": ""},
        queue_name="team-a-queue",
        recovery_policy={"retry": {"preempted": 3, "app-error": 0}},
    )


def test_a_minimal_body_is_valid_and_a_training_runtime_defaults_to_the_job_namespace() -> None:
    data = {"runtime": {"kind": "TrainingRuntime", "name": "mine"}, "namespace": "team-a", "image": "busybox"}
    serializer = JobSpecSerializer(data=data)
    assert serializer.is_valid(), serializer.errors
    spec = serializer.to_spec()
    assert spec.runtime == RuntimeRef(kind="TrainingRuntime", name="mine", namespace="team-a")
    assert spec.env == () and spec.labels == {} and spec.recovery_policy is None and spec.num_nodes is None


def test_a_stored_spec_round_trips_through_json_and_the_serializer() -> None:
    serializer = JobSpecSerializer(data=body())
    assert serializer.is_valid()
    spec = serializer.to_spec()
    stored = spec.to_dict()
    assert JobSpec.from_dict(stored) == spec
    again = JobSpecSerializer(data=stored)  # start validates the stored spec again
    assert again.is_valid(), again.errors
    assert again.to_spec() == spec


def msg(errors: Any, *path: str) -> str:
    node = errors
    for key in path:
        node = node[key]
    return " ".join(str(m) for m in node)


@pytest.mark.parametrize(
    ("changes", "path", "fragment"),
    [
        # unknown fields, at the top and nested
        ({"num_node": 2}, ("num_node",), "unknown field"),
        (
            {"runtime": {"kind": "ClusterTrainingRuntime", "name": "x", "group": "y"}},
            ("runtime", "group"),
            "unknown",
        ),
        ({"resources_per_node": {"claims": []}}, ("resources_per_node", "claims"), "unknown field"),
        ({"recovery_policy": {"retries": {}}}, ("recovery_policy", "retries"), "unknown field"),
        # required fields
        ({"image": ...}, ("image",), "required"),
        ({"runtime": ...}, ("runtime",), "required"),
        ({"image": ""}, ("image",), "blank"),
        ({"image": "a" * 501}, ("image",), "500"),
        ({"image": "busy box"}, ("image",), "without spaces"),
        ({"image": "caf\u00e9:1"}, ("image",), "printable ASCII"),
        # names
        ({"namespace": "Team_A"}, ("namespace",), "DNS-1123 label"),
        ({"namespace": "a" * 64}, ("namespace",), "63"),
        (
            {"runtime": {"kind": "ClusterTrainingRuntime", "name": "Bad Name"}},
            ("runtime", "name"),
            "subdomain",
        ),
        ({"runtime": {"kind": "Runtime", "name": "x"}}, ("runtime", "kind"), "not a valid choice"),
        (
            {"runtime": {"kind": "TrainingRuntime", "name": "x", "namespace": "team-b"}},
            ("runtime", "namespace"),
            "own namespace",
        ),
        (
            {"runtime": {"kind": "ClusterTrainingRuntime", "name": "x", "namespace": "team-a"}},
            ("runtime", "namespace"),
            "cluster-scoped",
        ),
        ({"queue_name": "Queue"}, ("queue_name",), "subdomain"),
        # counts
        ({"num_nodes": 0}, ("num_nodes",), "greater than or equal to 1"),
        ({"num_nodes": -1}, ("num_nodes",), "greater than or equal to 1"),
        ({"num_nodes": 1001}, ("num_nodes",), "less than or equal to 1000"),
        ({"num_nodes": "2"}, ("num_nodes",), "valid integer"),
        ({"num_nodes": 2.5}, ("num_nodes",), "valid integer"),
        ({"num_nodes": True}, ("num_nodes",), "valid integer"),
        ({"procs_per_node": 0}, ("procs_per_node",), "greater than or equal to 1"),
        ({"active_deadline_seconds": 0}, ("active_deadline_seconds",), "greater than or equal to 1"),
        ({"num_nodes": None}, ("num_nodes",), "null"),
        # env
        ({"env": {"PET_NNODES": "2"}}, ("env", "PET_NNODES"), "PET_"),
        ({"env": {"OMPI_MCA_x": "1"}}, ("env", "OMPI_MCA_x"), "OMPI_MCA_"),
        ({"env": {"DMLC_TASK_ID": "1"}}, ("env", "DMLC_TASK_ID"), "DMLC_"),
        ({"env": {"DISPATCH_JOB": "x"}}, ("env", "DISPATCH_JOB"), "DISPATCH_"),
        ({"env": {"JAX_PROCESS_ID": "0"}}, ("env", "JAX_PROCESS_ID"), "JAX"),
        ({"env": {"1X": "1"}}, ("env", "1X"), "C identifier"),
        ({"env": {"MY-VAR": "1"}}, ("env", "MY-VAR"), "C identifier"),
        ({"env": {f"V{i}": "1" for i in range(129)}}, ("env",), "128"),
        ({"env": ["A=1"]}, ("env",), "dictionary"),
        # labels
        ({"labels": {"bad key!": "x"}}, ("labels", "bad key!"), "label key"),
        ({"labels": {"/x": "x"}}, ("labels", "/x"), "prefix"),
        ({"labels": {"Bad_Domain/x": "x"}}, ("labels", "Bad_Domain/x"), "prefix"),
        ({"labels": {"k": "-bad"}}, ("labels", "k"), "label value"),
        ({"labels": {"k": "v" * 64}}, ("labels", "k"), "63"),
        (
            {"labels": {"app.kubernetes.io/managed-by": "me"}},
            ("labels", "app.kubernetes.io/managed-by"),
            "reserved",
        ),
        (
            {"labels": {"kueue.x-k8s.io/queue-name": "q"}},
            ("labels", "kueue.x-k8s.io/queue-name"),
            "queue_name",
        ),
        # resources
        (
            {"resources_per_node": {"requests": {"cpu": "lots"}}},
            ("resources_per_node", "requests", "cpu"),
            "quantity",
        ),
        (
            {"resources_per_node": {"limits": {"memory": "-1Gi"}}},
            ("resources_per_node", "limits", "memory"),
            "negative",
        ),
        (  # once a 500: the exponent overflowed the arithmetic
            {"resources_per_node": {"limits": {"memory": "1e99999999"}}},
            ("resources_per_node", "limits", "memory"),
            "exponent must be from",
        ),
        (  # a trailing newline is not part of a name (Python's `$` matched before it)
            {"env": {"LR\n": "1"}},
            ("env", "LR\n"),
            "C identifier",
        ),
        (
            {"resources_per_node": {"limits": {"cpu": 1.5}}},
            ("resources_per_node", "limits", "cpu"),
            "quantity",
        ),
        (
            {"resources_per_node": {"limits": {"a/b/c": "1"}}},
            ("resources_per_node", "limits", "a/b/c"),
            "one '/'",
        ),
        (
            {"resources_per_node": {"limits": {"Bad!": "1"}}},
            ("resources_per_node", "limits", "Bad!"),
            "resource name",
        ),
        (
            {"resources_per_node": {"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}},
            ("resources_per_node", "requests", "cpu"),
            "exceeds the limit",
        ),
        # recovery policy
        (
            {"recovery_policy": {"retry": {"gremlins": 1}}},
            ("recovery_policy", "retry", "gremlins"),
            "retryable",
        ),
        (
            {"recovery_policy": {"retry": {"cancelled": 1}}},
            ("recovery_policy", "retry", "cancelled"),
            "cannot be",
        ),
        (
            {"recovery_policy": {"retry": {"oom": 11}}},
            ("recovery_policy", "retry", "oom"),
            "less than or equal to 10",
        ),
        (
            {"recovery_policy": {"retry": {"oom": -1}}},
            ("recovery_policy", "retry", "oom"),
            "greater than or equal",
        ),
        # lists
        ({"command": "python train.py"}, ("command",), "list"),
        ({"args": ["x"] * 129}, ("args",), "128"),
    ],
)
def test_field_errors(changes: dict[str, Any], path: tuple[str, ...], fragment: str) -> None:
    errors = errors_of(body(**changes))
    assert fragment in msg(errors, *path), errors


def test_a_number_without_a_fraction_is_an_integer_as_json_schema_says() -> None:
    serializer = JobSpecSerializer(
        data=body(num_nodes=2.0, resources_per_node={"limits": {"nvidia.com/gpu": 1.0}})
    )
    assert serializer.is_valid(), serializer.errors
    spec = serializer.to_spec()
    assert (spec.num_nodes, spec.resources_per_node["limits"]) == (2, {"nvidia.com/gpu": "1"})


def test_every_error_is_reported_at_once() -> None:
    errors = errors_of(body(bogus=1, num_nodes=0, env={"PET_NNODES": "1"}, namespace="NS"))
    assert set(errors) == {"bogus", "num_nodes", "env", "namespace"}


def test_the_site_label_domain_is_reserved_when_given() -> None:
    data = body(labels={"dispatch.example.com/job": "x"})
    errors = errors_of(data, {"label_domain": "dispatch.example.com"})
    assert "dispatch.example.com/" in msg(errors, "labels", "dispatch.example.com/job")
    assert JobSpecSerializer(data=data).is_valid()  # no domain in the context: an ordinary label


def test_the_reused_parse_answers_each_body_alone() -> None:
    """job_spec_parse reuses one serializer per thread: a body's errors, its label domain or its values never
    carry over to the next body."""
    labelled = body(labels={"dispatch.example.com/job": "x"})
    expected = JobSpecSerializer(data=body())
    assert expected.is_valid()
    for _ in range(2):
        with pytest.raises(ValidationError) as raised:
            job_spec_parse(data=body(num_nodes=0, bogus=1), label_domain=None)
        assert set(raised.value.detail) == {"num_nodes", "bogus"}
        assert job_spec_parse(data=body(), label_domain=None) == expected.to_spec()
        with pytest.raises(ValidationError) as raised:
            job_spec_parse(data=labelled, label_domain="dispatch.example.com")
        assert set(raised.value.detail) == {"labels"}
        spec = job_spec_parse(data=labelled, label_domain="other.example.com")
        assert spec.labels == {"dispatch.example.com/job": "x"}
        minimal = job_spec_parse(data=body(labels=..., env=..., num_nodes=...), label_domain=None)
        assert (minimal.labels, minimal.env, minimal.num_nodes) == ({}, (), None)


@pytest.mark.parametrize("data", [None, [], "x", 1])
def test_a_body_that_is_not_an_object_is_refused(data: Any) -> None:
    errors = errors_of(data)
    assert "non_field_errors" in errors


@pytest.mark.parametrize(
    ("name", "reserved"),
    [
        ("PET_NNODES", "PET_"),
        ("PET_ANYTHING", "PET_"),
        ("OMPI_MCA_orte_default_hostfile", "OMPI_MCA_"),
        ("DMLC_TRACKER_URI", "DMLC_"),
        ("DISPATCH_ATTEMPT", "DISPATCH_"),
        ("JAX_COORDINATOR_ADDRESS", "JAX"),
        ("JOB_COMPLETION_INDEX", "Kubernetes"),
        ("JAX_PLATFORMS", None),  # ordinary JAX setting: allowed
        ("pet_nnodes", None),  # env names are case-sensitive
        ("OMPI_COMM_WORLD_RANK", None),
        ("_X1", None),
    ],
)
def test_env_name_problem(name: str, reserved: str | None) -> None:
    problem = env_name_problem(name)
    if reserved is None:
        assert problem is None
    else:
        assert problem is not None and reserved in problem


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        ("1.5", Decimal("1.5")),
        (".5", Decimal("0.5")),
        ("4Gi", Decimal(4 * 2**30)),
        ("1Ki", Decimal(1024)),
        ("1k", Decimal(1000)),
        ("1E", Decimal(10**18)),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("100n", Decimal("0.0000001")),
        ("+1", Decimal(1)),
        ("-1", Decimal(-1)),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "m", "1.2.3", "1Gb", "1 Gi", "1e", "1e1.5", "0x10", "1KI"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(text)


def test_job_spec_copies_and_normalises_its_inputs() -> None:
    env = {"A": "1"}
    labels = {"team": "a"}
    spec = JobSpec(
        runtime=RuntimeRef(kind="ClusterTrainingRuntime", name="r"),
        namespace="ns",
        image="img",
        command=["python"],  # type: ignore[arg-type]
        env=env,  # type: ignore[arg-type]
        labels=labels,
    )
    env["B"] = "2"
    labels["x"] = "y"
    assert spec.env == (("A", "1"),) and spec.command == ("python",) and spec.labels == {"team": "a"}
    assert spec.to_dict() == {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "r"},
        "namespace": "ns",
        "image": "img",
        "command": ["python"],
        "env": {"A": "1"},
        "labels": {"team": "a"},
    }


def test_runtime_ref_from_dict_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="kind"):
        RuntimeRef.from_dict({"kind": "Pod", "name": "x"})
    assert RuntimeRef.from_dict({"kind": "TrainingRuntime", "name": "x", "namespace": "a"}).source == (
        "TrainingRuntime/a/x"
    )
