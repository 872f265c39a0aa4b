"""The pure rules of jobs/stopping.py: when a Lease shows its holder running, and what runtime copy the
Trainer's snapshot restores."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import yaml

from jobs.stopping import LEASE_MARGIN_SECONDS, lease_renewed, runtime_from_snapshot

NOW = datetime(2026, 8, 1, 12, 0, tzinfo=UTC)


def test_a_lease_counts_as_renewed_within_its_duration_plus_the_margin_only() -> None:
    def renewed(age: float, *, holder: str | None = "trainer-1", duration: int | None = 15) -> bool:
        return lease_renewed(
            renew_time=NOW - timedelta(seconds=age), duration_seconds=duration, holder=holder, now=NOW
        )

    assert renewed(2)
    assert renewed(15 + LEASE_MARGIN_SECONDS)
    assert not renewed(15 + LEASE_MARGIN_SECONDS + 1)
    assert not renewed(2, holder=None)  # released
    assert not renewed(2, duration=None)
    assert not lease_renewed(renew_time=None, duration_seconds=15, holder="trainer-1", now=NOW)


def _trainjob() -> dict[str, object]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "j1-1", "namespace": "team", "uid": "uid-1"},
        "spec": {
            "runtimeRef": {"name": "j1-1", "kind": "TrainingRuntime", "apiGroup": "trainer.kubeflow.org"}
        },
    }


def _snapshot(owner_uid: str = "uid-1", name: str = "j1-1") -> dict[str, object]:
    runtime = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": "old-copy",
            "resourceVersion": "7",
            "labels": {"app.kubernetes.io/managed-by": "dispatch"},
            "annotations": {"dispatch.dev/body-hash": "abc"},
        },
        "spec": {"template": {"spec": {"replicatedJobs": []}}},
    }
    return {
        "metadata": {"ownerReferences": [{"kind": "TrainJob", "uid": owner_uid, "controller": True}]},
        "data": {"runtime": yaml.safe_dump(runtime)},
    }


def test_the_copy_restored_from_the_snapshot_is_the_runtime_owned_by_its_trainjob() -> None:
    body = runtime_from_snapshot(_snapshot(), _trainjob())
    assert body is not None
    assert body["metadata"]["name"] == "j1-1" and body["metadata"]["namespace"] == "team"
    assert body["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "dispatch"}
    assert body["metadata"]["annotations"] == {"dispatch.dev/body-hash": "abc"}
    assert [r["uid"] for r in body["metadata"]["ownerReferences"]] == ["uid-1"]
    assert "uid" not in body["metadata"] and "resourceVersion" not in body["metadata"]
    assert body["spec"] == {"template": {"spec": {"replicatedJobs": []}}}


def test_a_snapshot_of_another_trainjob_or_runtime_restores_nothing() -> None:
    assert runtime_from_snapshot(_snapshot(owner_uid="uid-2"), _trainjob()) is None
    assert runtime_from_snapshot(_snapshot(name="other"), _trainjob()) is None
    assert runtime_from_snapshot({"metadata": {}, "data": {"runtime": ": not yaml ["}}, _trainjob()) is None
