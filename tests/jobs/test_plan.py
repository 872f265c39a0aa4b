"""jobs.plan: the objects start would create, image placement and the start-only checks. Pure: no DB."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs.plan import (
    NAME_TOO_LONG,
    NAMESPACE_NOT_GRANTED,
    PROCS_PER_NODE_UNSUPPORTED,
    Plan,
    build_plan,
    mpi_image_on_nodes,
    parse_trainer_version,
    upsert_env,
)
from jobs.queueing import KueueInputs, choose_queue
from jobs.spec import JobSpec, RuntimeRef
from runtimes.reasons import SiteRules

FIXTURES = Path(__file__).parents[1] / "fixtures"
JOB_ID = "jabcdefgh23"
DOMAIN = "dispatch.example.com"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
RANK_REF = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
RESTART_REF = {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"}}
IDENTITY_ENV = [
    {"name": "DISPATCH_JOB", "value": JOB_ID},
    {"name": "DISPATCH_ATTEMPT", "value": "1"},
    {"name": "DISPATCH_RANK", "valueFrom": RANK_REF},
    {"name": "DISPATCH_RESTART_ATTEMPT", "valueFrom": RESTART_REF},
]
POD_LABELS = {f"{DOMAIN}/job": JOB_ID, f"{DOMAIN}/attempt": "1"}


def dispatch_kind() -> dict[str, Any]:
    """The spec's example runtime (spec/runtime-requirements.md), which satisfies every rule."""
    data: dict[str, Any] = yaml.safe_load((FIXTURES / "dispatch-kind.yaml").read_text())
    return data


def trainer_job(runtime: dict[str, Any], index: int = 0) -> dict[str, Any]:
    job: dict[str, Any] = runtime["spec"]["template"]["spec"]["replicatedJobs"][index]
    return job


def pod_spec(runtime: dict[str, Any], index: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = trainer_job(runtime, index)["template"]["spec"]["template"]["spec"]
    return spec


def job_spec(**overrides: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "runtime": RuntimeRef(kind="ClusterTrainingRuntime", name="dispatch-kind"),
        "namespace": "team-a",
        "image": "registry.example.com/team-a/train:1",
    }
    fields.update(overrides)
    return JobSpec(**fields)


def plan_for(
    spec: JobSpec | None = None,
    runtime: dict[str, Any] | None = None,
    *,
    rules: SiteRules | None = None,
    namespace_granted: bool = True,
    trainer_version: str = "v2.3.0",
    no_runtime: bool = False,
) -> Plan:
    return build_plan(
        spec=spec or job_spec(),
        runtime=None if no_runtime else (runtime if runtime is not None else dispatch_kind()),
        rules=rules or SiteRules(),
        allow_listed=None,
        namespace_granted=namespace_granted,
        job_id=JOB_ID,
        attempt=1,
        label_domain=DOMAIN,
        trainer_version=trainer_version,
    )


def mpi_runtime(node_image: str = "ghcr.io/kubeflow/trainer/deepspeed-runtime:2.3") -> dict[str, Any]:
    """The shipped deepspeed layout: launcher (trainer ancestor) + node, container `node` in both."""

    def rjob(name: str, image: str, labels: dict[str, str]) -> dict[str, Any]:
        return {
            "name": name,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {"name": "node", "image": image},
                                {"name": "log", "image": "fluent:1"},
                            ],
                        }
                    }
                },
            },
        }

    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "deepspeed-distributed"},
        "spec": {
            "mlPolicy": {"numNodes": 2, "mpi": {"numProcPerNode": 1, "runLauncherAsNode": True}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        rjob(
                            "launcher",
                            "ghcr.io/kubeflow/trainer/deepspeed-runtime:2.3",
                            {ANCESTOR: "trainer"},
                        ),
                        rjob("node", node_image, {}),
                    ]
                }
            },
        },
    }


# --- the objects -------------------------------------------------------------------------------------------


def test_dispatch_kind_builds_the_runtime_copy_and_the_trainjob_exactly() -> None:
    spec = job_spec(
        display_name="first run",
        command=("python", "train.py"),
        args=("--epochs", "3"),
        env={"LR": "0.1"},
        num_nodes=2,
        resources_per_node={"requests": {"cpu": "1"}, "limits": {"cpu": "1"}},
        active_deadline_seconds=600,
        labels={"team": "a"},
    )
    plan = plan_for(spec)

    assert not plan.refused
    assert plan.reasons == ()
    assert plan.identity_warnings == ()
    assert plan.warnings == ()
    assert plan.names.train_job == f"{JOB_ID}-1"
    assert plan.names.training_runtime == f"{JOB_ID}-1"
    assert plan.names.longest_pod_name == f"{JOB_ID}-1-node-0-1-abcde"

    expected_runtime_spec = dispatch_kind()["spec"]
    expected_runtime_spec["template"]["metadata"] = {"labels": POD_LABELS}
    job_template = trainer_job({"spec": expected_runtime_spec})["template"]
    job_template["metadata"]["labels"] |= POD_LABELS  # the Jobs carry them too, beside the ancestor label
    pod_template = job_template["spec"]["template"]
    pod_template["metadata"] = {"labels": POD_LABELS}
    pod_template["spec"]["containers"][0]["env"] = IDENTITY_ENV
    assert plan.training_runtime == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {
            "name": f"{JOB_ID}-1",
            "namespace": "team-a",
            "labels": {**POD_LABELS, "app.kubernetes.io/managed-by": "dispatch"},
            "annotations": {f"{DOMAIN}/source-runtime": "ClusterTrainingRuntime/dispatch-kind"},
        },
        "spec": expected_runtime_spec,
    }
    assert plan.train_job == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": f"{JOB_ID}-1",
            "namespace": "team-a",
            "labels": {"team": "a", **POD_LABELS, "app.kubernetes.io/managed-by": "dispatch"},
            "annotations": {f"{DOMAIN}/display-name": "first run"},
        },
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "TrainingRuntime",
                "name": f"{JOB_ID}-1",
            },
            "trainer": {
                "image": "registry.example.com/team-a/train:1",
                "command": ["python", "train.py"],
                "args": ["--epochs", "3"],
                "env": [{"name": "LR", "value": "0.1"}],  # user env only: the identity lives in the copy
                "numNodes": 2,
                "resourcesPerNode": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}},
            },
            "activeDeadlineSeconds": 600,
        },
    }


def test_minimal_job_sets_only_the_keys_it_has() -> None:
    plan = plan_for(job_spec())
    assert plan.train_job is not None
    assert "annotations" not in plan.train_job["metadata"]
    assert plan.train_job["spec"] == {
        "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": f"{JOB_ID}-1"},
        "trainer": {"image": "registry.example.com/team-a/train:1"},
    }


def test_queue_name_labels_the_trainjob_and_suspends_it_for_kueue() -> None:
    spec = job_spec(queue_name="team-a-queue")
    queue = {"metadata": {"name": "team-a-queue"}, "spec": {"clusterQueue": "cq"}}
    kueue = KueueInputs(choice=choose_queue(spec, {}), local_queue=queue, cluster_queue={"spec": {}})
    plan = build_plan(
        spec=spec,
        runtime=dispatch_kind(),
        rules=SiteRules(),
        allow_listed=None,
        namespace_granted=True,
        job_id=JOB_ID,
        attempt=1,
        label_domain=DOMAIN,
        trainer_version="v2.3.0",
        kueue=kueue,
    )
    assert plan.train_job is not None
    assert plan.train_job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-queue"
    assert plan.train_job["spec"]["suspend"] is True


def test_training_runtime_source_annotation_names_the_namespace() -> None:
    spec = job_spec(runtime=RuntimeRef(kind="TrainingRuntime", name="mine", namespace="team-a"))
    plan = plan_for(spec)
    assert plan.training_runtime is not None
    annotations = plan.training_runtime["metadata"]["annotations"]
    assert annotations == {f"{DOMAIN}/source-runtime": "TrainingRuntime/team-a/mine"}


def test_every_replicated_jobs_pod_template_carries_the_job_labels() -> None:
    runtime = mpi_runtime()
    trainer_job(runtime, 1)["template"]["spec"]["template"]["metadata"] = {"labels": {"app": "x"}}
    plan = plan_for(runtime=runtime)
    assert plan.training_runtime is not None
    assert plan.training_runtime["spec"]["template"]["metadata"]["labels"] == POD_LABELS
    pods = [j["template"]["spec"]["template"]["metadata"]["labels"] for j in trainer_job_list(plan)]
    assert pods == [POD_LABELS, {"app": "x", **POD_LABELS}]
    # The Job templates keep their own labels (the ancestor label) and gain ours.
    assert trainer_job_list(plan)[0]["template"]["metadata"]["labels"] == {ANCESTOR: "trainer", **POD_LABELS}
    assert trainer_job_list(plan)[1]["template"]["metadata"]["labels"] == POD_LABELS


def test_the_copy_keeps_the_source_runtimes_labels_and_ours_win() -> None:
    runtime = dispatch_kind()
    runtime["metadata"]["labels"] = {
        "trainer.kubeflow.org/framework": "torch",
        f"{DOMAIN}/job": "someone-else",
    }
    plan = plan_for(runtime=runtime)
    assert plan.training_runtime is not None
    assert plan.training_runtime["metadata"]["labels"] == {
        "trainer.kubeflow.org/framework": "torch",
        **POD_LABELS,
        "app.kubernetes.io/managed-by": "dispatch",
    }


def trainer_job_list(plan: Plan) -> list[dict[str, Any]]:
    assert plan.training_runtime is not None
    jobs: list[dict[str, Any]] = plan.training_runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return jobs


def test_identity_is_published_into_the_init_container_under_publish_via_init_container() -> None:
    runtime = dispatch_kind()
    pod_spec(runtime)["initContainers"] = [
        {"name": "other", "image": "busybox"},
        {"name": "publish", "image": "busybox", "env": [{"name": "KEEP", "value": "1"}]},
    ]
    rules = SiteRules(publish_via="initContainer", publish_container="publish")
    plan = plan_for(runtime=runtime, rules=rules)

    assert not plan.refused
    published = trainer_job_list(plan)[0]["template"]["spec"]["template"]["spec"]
    assert published["initContainers"][0] == {"name": "other", "image": "busybox"}
    assert published["initContainers"][1]["env"] == [{"name": "KEEP", "value": "1"}, *IDENTITY_ENV]
    assert "env" not in published["containers"][0]  # not into node as well


def test_identity_env_replaces_same_name_entries_in_place() -> None:
    runtime = dispatch_kind()
    pod_spec(runtime)["containers"][0]["env"] = [
        {"name": "DISPATCH_ATTEMPT", "value": "99"},
        {"name": "KEEP", "value": "1"},
        {"name": "DISPATCH_ATTEMPT", "value": "98"},
    ]
    plan = plan_for(runtime=runtime)
    env = trainer_job_list(plan)[0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [
        {"name": "DISPATCH_ATTEMPT", "value": "1"},
        {"name": "KEEP", "value": "1"},
        {"name": "DISPATCH_JOB", "value": JOB_ID},
        {"name": "DISPATCH_RANK", "valueFrom": RANK_REF},
        {"name": "DISPATCH_RESTART_ATTEMPT", "valueFrom": RESTART_REF},
    ]


@pytest.mark.parametrize(
    ("current", "expected_names"),
    [
        (None, ["A", "B"]),
        ([], ["A", "B"]),
        ([{"name": "X"}], ["X", "A", "B"]),
        ([{"name": "B"}, {"name": "X"}], ["B", "X", "A"]),
        ("not-a-list", ["A", "B"]),
    ],
)
def test_upsert_env(current: object, expected_names: list[str]) -> None:
    result = upsert_env(current, [{"name": "A", "value": "a"}, {"name": "B", "value": "b"}])
    assert [e["name"] for e in result] == expected_names


def test_input_runtime_is_not_mutated_nor_aliased() -> None:
    runtime = mpi_runtime()
    pod_spec(runtime)["containers"][0]["env"] = [{"name": "KEEP", "value": "1"}]
    before = copy.deepcopy(runtime)
    plan = plan_for(runtime=runtime)
    assert runtime == before

    # Editing the plan's objects (or its dict form) must not reach back into the runtime.
    trainer_job_list(plan)[0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"].clear()
    plan.to_dict()["objects"]["training_runtime"]["spec"]["mlPolicy"]["numNodes"] = 99
    assert runtime == before


# --- start-only reasons ------------------------------------------------------------------------------------


def test_namespace_not_granted_refuses_and_keeps_the_objects() -> None:
    plan = plan_for(namespace_granted=False)
    assert plan.refused
    assert plan.codes == (NAMESPACE_NOT_GRANTED,)
    reason = plan.reasons[0]
    assert "team-a" in reason.message and reason.path == "namespace" and not reason.waived
    assert plan.train_job is not None and plan.training_runtime is not None  # shown even when refused


@pytest.mark.parametrize(
    ("ml_policy", "refused"),
    [
        ({"numNodes": 2}, True),  # plain runtime: the Trainer would ignore numProcPerNode
        (None, True),
        ({"numNodes": 2, "torch": {}}, False),
    ],
)
def test_procs_per_node_needs_ml_policy_torch(ml_policy: dict[str, Any] | None, refused: bool) -> None:
    runtime = dispatch_kind()
    if ml_policy is None:
        del runtime["spec"]["mlPolicy"]
    else:
        runtime["spec"]["mlPolicy"] = ml_policy
    plan = plan_for(job_spec(procs_per_node=4), runtime)
    assert plan.refused is refused
    assert (PROCS_PER_NODE_UNSUPPORTED in plan.codes) is refused
    assert plan_for(job_spec(), runtime).codes == ()  # not asked for: nothing to refuse


def test_procs_per_node_on_mpi_names_the_policy() -> None:
    plan = plan_for(job_spec(procs_per_node=4), mpi_runtime())
    reason = next(r for r in plan.reasons if r.code == PROCS_PER_NODE_UNSUPPORTED)
    assert "mlPolicy.mpi" in reason.message and reason.path == "procs_per_node"


# Name length: j + 10 chars + "-1" is 13; "<tj>-<rjob>-0-<maxPod>-abcde" is 23 + len(rjob) + digits(maxPod).
@pytest.mark.parametrize(
    ("rjob_name", "num_nodes", "too_long"),
    [
        ("node", 1000, False),  # 30 characters
        ("n" * 39, 10, False),  # 63: exactly at the limit
        ("n" * 40, 10, True),  # 64
        ("n" * 38, 10, False),  # 62
        ("n" * 38, 1000, True),  # the node count alone pushes it over: 64
    ],
)
def test_name_too_long(rjob_name: str, num_nodes: int, too_long: bool) -> None:
    runtime = dispatch_kind()
    trainer_job(runtime)["name"] = rjob_name
    plan = plan_for(job_spec(num_nodes=num_nodes), runtime)
    longest = f"{JOB_ID}-1-{rjob_name}-0-{num_nodes - 1}-abcde"
    assert plan.names.longest_pod_name == longest
    assert (NAME_TOO_LONG in plan.codes) is too_long
    assert plan.refused is too_long
    if too_long:
        reason = next(r for r in plan.reasons if r.code == NAME_TOO_LONG)
        assert longest in reason.message
        assert f"{len(longest)} characters" in reason.message


def test_start_reasons_follow_the_rule_reasons_and_all_are_reported() -> None:
    runtime = dispatch_kind()
    del trainer_job(runtime)["template"]["spec"]["backoffLimit"]
    trainer_job(runtime)["name"] = "n" * 50
    plan = plan_for(job_spec(procs_per_node=2), runtime, namespace_granted=False)
    assert plan.codes == ("backoff-limit", NAMESPACE_NOT_GRANTED, PROCS_PER_NODE_UNSUPPORTED, NAME_TOO_LONG)


# --- the rule checker's verdict, carried through -----------------------------------------------------------


def test_rule_reasons_are_carried_through_and_refuse() -> None:
    runtime = dispatch_kind()
    del pod_spec(runtime)["restartPolicy"]
    plan = plan_for(runtime=runtime)
    assert plan.refused
    assert plan.codes == ("restart-policy",)
    assert plan.reasons[0].path.endswith("restartPolicy")
    assert plan.training_runtime is not None  # still shown


def test_waived_reasons_become_identity_warnings_not_refusals() -> None:
    runtime = dispatch_kind()
    trainer_job(runtime)["template"]["spec"]["backoffLimitPerIndex"] = 1
    plan = plan_for(runtime=runtime, rules=SiteRules(allow_rank_restart=True))
    assert not plan.refused
    assert plan.codes == ("backoff-limit-per-index",)
    assert plan.reasons[0].waived
    assert len(plan.identity_warnings) == 1
    assert plan.identity_warnings[0].startswith("allowRankRestart:")
    assert "backoffLimitPerIndex" in plan.identity_warnings[0]

    strict = plan_for(runtime=runtime)
    assert strict.refused and strict.identity_warnings == ()


def test_missing_runtime_gives_a_plan_without_objects() -> None:
    plan = plan_for(job_spec(procs_per_node=2), no_runtime=True)
    assert plan.refused
    assert plan.codes == ("runtime-not-found",)  # procs per node cannot be judged without a runtime
    assert "ClusterTrainingRuntime/dispatch-kind" in plan.reasons[0].message
    assert plan.training_runtime is None and plan.train_job is None
    assert plan.images == ()
    data = plan.to_dict()
    assert data["objects"] is None
    assert data["names"] == {
        "train_job": f"{JOB_ID}-1",
        "training_runtime": f"{JOB_ID}-1",
        "longest_pod_name": None,
    }


def test_to_dict_is_json_and_has_the_documented_keys() -> None:
    data = plan_for(job_spec(procs_per_node=2)).to_dict()
    assert json.loads(json.dumps(data)) == data
    assert set(data) == {
        "refused",
        "reasons",
        "capabilities",
        "identity_warnings",
        "warnings",
        "objects",
        "images",
        "names",
        "queue",
    }
    assert set(data["objects"]) == {"training_runtime", "train_job"}
    assert data["reasons"][0] == {
        "code": PROCS_PER_NODE_UNSUPPORTED,
        "message": data["reasons"][0]["message"],
        "path": "procs_per_node",
        "waived": False,
    }
    assert {c["name"] for c in data["capabilities"]} >= {"ProcsPerNode"}
    assert data["images"] == [
        {
            "replicated_job": "node",
            "container": "node",
            "image": "registry.example.com/team-a/train:1",
            "source": "job",
        }
    ]


def test_user_label_colliding_with_dispatchs_is_overridden_with_a_warning() -> None:
    plan = plan_for(job_spec(labels={"app.kubernetes.io/managed-by": "me", f"{DOMAIN}/job": "other"}))
    assert plan.train_job is not None
    labels = plan.train_job["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "dispatch" and labels[f"{DOMAIN}/job"] == JOB_ID
    assert len(plan.warnings) == 2


# --- images ------------------------------------------------------------------------------------------------


def images(plan: Plan) -> list[tuple[str, str, str | None, str]]:
    return [(i.replicated_job, i.container, i.image, i.source) for i in plan.images]


JOB_IMAGE = "registry.example.com/team-a/train:1"
DS = "ghcr.io/kubeflow/trainer/deepspeed-runtime:2.3"


@pytest.mark.parametrize("ml_policy", [{"numNodes": 2}, {"numNodes": 2, "torch": {}}, None])
@pytest.mark.parametrize("version", ["v2.3.0", "v2.4.0"])
def test_plain_and_torch_runtimes_run_the_job_image_only_in_the_trainer_node_container(
    ml_policy: dict[str, Any] | None, version: str
) -> None:
    runtime = dispatch_kind()
    if ml_policy is None:
        del runtime["spec"]["mlPolicy"]
    else:
        runtime["spec"]["mlPolicy"] = ml_policy
    pod_spec(runtime)["containers"].append({"name": "sidecar", "image": "envoy:1"})
    plan = plan_for(runtime=runtime, trainer_version=version)
    assert images(plan) == [("node", "node", JOB_IMAGE, "job"), ("node", "sidecar", "envoy:1", "runtime")]
    assert plan.warnings == ()


@pytest.mark.parametrize("version", ["v2.3.0", "2.3.5", "v2.2.1"])
def test_mpi_before_2_4_sets_the_job_image_on_the_launcher_only_and_warns(version: str) -> None:
    plan = plan_for(runtime=mpi_runtime(), trainer_version=version)
    assert images(plan) == [
        ("launcher", "node", JOB_IMAGE, "job"),
        ("launcher", "log", "fluent:1", "runtime"),
        ("node", "node", DS, "runtime"),
        ("node", "log", "fluent:1", "runtime"),
    ]
    assert len(plan.warnings) == 1
    warning = plan.warnings[0]
    assert "mismatched MPI versions" in warning
    assert JOB_IMAGE in warning and DS in warning and version in warning


def test_mpi_before_2_4_does_not_warn_when_the_images_agree() -> None:
    plan = plan_for(job_spec(image=DS), mpi_runtime(), trainer_version="v2.3.0")
    assert [i.source for i in plan.images if i.container == "node"] == ["job", "runtime"]
    assert plan.warnings == ()


@pytest.mark.parametrize("version", ["v2.4.0", "2.4.0", "v2.4.0-rc.1", "v3.0.0"])
def test_mpi_from_2_4_sets_the_job_image_on_launcher_and_nodes_without_warning(version: str) -> None:
    plan = plan_for(runtime=mpi_runtime(), trainer_version=version)
    assert images(plan) == [
        ("launcher", "node", JOB_IMAGE, "job"),
        ("launcher", "log", "fluent:1", "runtime"),
        ("node", "node", JOB_IMAGE, "job"),
        ("node", "log", "fluent:1", "runtime"),
    ]
    assert plan.warnings == ()
    # An MPI runtime is refused by the rules, yet the plan still shows what would run.
    assert plan.refused and "mlpolicy-unsupported" in plan.codes


@pytest.mark.parametrize(
    ("version", "parsed", "new"),
    [
        ("v2.3.0", (2, 3, 0), False),
        ("2.3.9", (2, 3, 9), False),
        ("v2.4.0", (2, 4, 0), True),
        ("2.4.0", (2, 4, 0), True),
        ("v2.4.0-rc.1", (2, 4, 0), True),
        ("v2.4", (2, 4, 0), True),
        (" v10.0.1+build.5 ", (10, 0, 1), True),
    ],
)
def test_parse_trainer_version(version: str, parsed: tuple[int, int, int], new: bool) -> None:
    assert parse_trainer_version(version) == parsed
    assert mpi_image_on_nodes(version) is new


@pytest.mark.parametrize("version", ["", "master", "latest", "v2", "8c0f5059bd51", "v2.x.0"])
def test_a_bad_trainer_version_is_a_configuration_error(version: str) -> None:
    with pytest.raises(ValueError, match="Trainer version"):
        parse_trainer_version(version)
    with pytest.raises(ValueError, match="Trainer version"):
        plan_for(trainer_version=version)
