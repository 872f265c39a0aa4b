"""jobs.naming: job ids, deterministic object names and the longest JobSet pod name. Pure: no DB."""

from __future__ import annotations

import re
from typing import Any

import pytest

from jobs.naming import (
    POD_NAME_LIMIT,
    is_job_id,
    longest_pod_name,
    new_job_id,
    pod_counts,
    runtime_copy_name,
    trainjob_name,
)

ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


def test_new_job_id_is_j_plus_ten_base32_chars_and_random() -> None:
    ids = {new_job_id() for _ in range(200)}
    assert len(ids) == 200
    for job_id in ids:
        assert re.fullmatch(r"j[a-z2-7]{10}", job_id)
        assert is_job_id(job_id)


def test_every_character_of_a_job_id_takes_all_32_values() -> None:
    # 50 random bits, five to a character: a character fed fewer bits (or the same bits twice) would take
    # fewer values, and ids would collide sooner than 2**50 promises.
    ids = [new_job_id() for _ in range(3000)]
    for position in range(1, 11):
        assert len({job_id[position] for job_id in ids}) == 32, position
    pairs = {(job_id[1], job_id[10]) for job_id in ids}
    assert len(pairs) > 900  # of 1024: the first and last characters are independent


@pytest.mark.parametrize(
    "value", ["", "j", "jabcdefghi", "jabcdefghij2", "Jabcdefghij", "jabcdefgh1j", "xabcdefghij"]
)
def test_is_job_id_rejects(value: str) -> None:
    assert not is_job_id(value)


def test_trainjob_and_copy_names_are_deterministic() -> None:
    assert trainjob_name("jabcdefghij", 1) == "jabcdefghij-1"
    assert trainjob_name("jabcdefghij", 12) == "jabcdefghij-12"
    assert runtime_copy_name("jabcdefghij-3") == "jabcdefghij-3"
    # A valid RFC 1035 label, as the TrainJob CRD requires.
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", trainjob_name(new_job_id(), 7))
    with pytest.raises(ValueError):
        trainjob_name("jabcdefghij", 0)


def rjob(
    name: str, *, ancestor: str | None = None, replicas: Any = None, parallelism: Any = None
) -> dict[str, Any]:
    job: dict[str, Any] = {"name": name, "template": {"spec": {"template": {"spec": {}}}}}
    if ancestor:
        job["template"]["metadata"] = {"labels": {ANCESTOR: ancestor}}
    if replicas is not None:
        job["replicas"] = replicas
    if parallelism is not None:
        job["template"]["spec"]["parallelism"] = parallelism
    return job


def runtime(*jobs: dict[str, Any], ml_policy: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"template": {"spec": {"replicatedJobs": list(jobs)}}}
    if ml_policy is not None:
        spec["mlPolicy"] = ml_policy
    return {"spec": spec}


@pytest.mark.parametrize(
    ("rt", "num_nodes", "expected"),
    [
        # The trainer job runs the job's numNodes, else mlPolicy.numNodes, else 1.
        (runtime(rjob("node", ancestor="trainer"), ml_policy={"numNodes": 2}), None, [("node", 1, 2)]),
        (runtime(rjob("node", ancestor="trainer"), ml_policy={"numNodes": 2}), 16, [("node", 1, 16)]),
        (runtime(rjob("node", ancestor="trainer"), ml_policy={}), None, [("node", 1, 1)]),
        # No mlPolicy: the template's parallelism stands unless the job sets numNodes.
        (runtime(rjob("node", ancestor="trainer", parallelism=3)), None, [("node", 1, 3)]),
        (runtime(rjob("node", ancestor="trainer", parallelism=3)), 5, [("node", 1, 5)]),
        # Ancestor jobs are forced to one replica; others keep replicas and parallelism.
        (
            runtime(
                rjob("dataset-initializer", ancestor="dataset-initializer", replicas=4),
                rjob("node", ancestor="trainer", replicas=3),
                rjob("workers", replicas=3, parallelism=4),
                rjob("bad", replicas=True, parallelism="x"),  # malformed counts fall back to the defaults
                ml_policy={"numNodes": 2},
            ),
            None,
            [("dataset-initializer", 1, 1), ("node", 1, 2), ("workers", 3, 4), ("bad", 1, 1)],
        ),
        # MPI: rJob node runs numNodes pods, one fewer when the launcher runs as a node.
        (
            runtime(rjob("launcher", ancestor="trainer"), rjob("node"), ml_policy={"numNodes": 4, "mpi": {}}),
            None,
            [("launcher", 1, 4), ("node", 1, 4)],
        ),
        (
            runtime(
                rjob("launcher", ancestor="trainer"),
                rjob("node"),
                ml_policy={"numNodes": 4, "mpi": {"runLauncherAsNode": True}},
            ),
            8,
            [("launcher", 1, 8), ("node", 1, 7)],
        ),
        (runtime(ml_policy={"numNodes": 2}), None, []),
        ({"spec": {"template": {"spec": {"replicatedJobs": "nope"}}}}, None, []),
    ],
)
def test_pod_counts(rt: dict[str, Any], num_nodes: int | None, expected: list[tuple[str, int, int]]) -> None:
    assert pod_counts(rt, num_nodes) == expected


def test_longest_pod_name_is_taken_over_every_replicated_job() -> None:
    rt = runtime(
        rjob("node", ancestor="trainer"),
        rjob("w", replicas=100, parallelism=10000),
        ml_policy={"numNodes": 10},
    )
    # node: "<tj>-node-0-9-abcde" (28); w: "<tj>-w-99-9999-abcde" (29)
    assert longest_pod_name("jabcdefghij-1", rt, None) == "jabcdefghij-1-w-99-9999-abcde"
    assert longest_pod_name("jabcdefghij-1", rt, 100000) == "jabcdefghij-1-node-0-99999-abcde"


def test_longest_pod_name_of_a_runtime_without_jobs_is_none() -> None:
    assert longest_pod_name("jabcdefghij-1", {}, 3) is None


def test_a_ten_node_trainer_job_named_node_fits_with_room_to_spare() -> None:
    rt = runtime(rjob("node", ancestor="trainer"), ml_policy={"numNodes": 10})
    name = longest_pod_name(trainjob_name(new_job_id(), 999), rt, None)
    assert name is not None and len(name) <= POD_NAME_LIMIT
