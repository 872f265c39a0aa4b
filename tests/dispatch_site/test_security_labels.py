"""Reserved labels (issue 22): a job's `labels` may not carry a key under a prefix a controller under the
TrainJob reads. The attack: a user sets kueue.x-k8s.io/priority-class and Kueue schedules the job ahead of
everybody else's. Before the fix the request passed validation (202/200); now it is a 400 naming the key."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

REQUEST = {
    "runtime": {"kind": "ClusterTrainingRuntime", "name": "torch"},
    "namespace": "team-a",
    "image": "localhost/trainer:v1",
}


@pytest.mark.parametrize(
    "key",
    [
        "kueue.x-k8s.io/priority-class",
        "kueue.x-k8s.io/queue-name",
        "jobset.sigs.k8s.io/jobset-name",
        "trainer.kubeflow.org/trainjob-ancestor-step",
        "batch.kubernetes.io/job-completion-index",
    ],
)
@pytest.mark.parametrize("path", ["/api/v1/jobs", "/api/v1/plan"])
def test_a_label_under_a_controllers_prefix_is_refused_naming_the_key(
    user_api: APIClient, path: str, key: str
) -> None:
    response = user_api.post(path, REQUEST | {"labels": {"team": "a", key: "high"}}, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["labels"]
    assert list(errors) == [key]
    assert key in errors[key][0] and "reserved" in errors[key][0]


def test_labels_outside_the_reserved_prefixes_are_accepted_by_validation(user_api: APIClient) -> None:
    from jobs.serializers import JobSpecSerializer

    serializer = JobSpecSerializer(
        data=REQUEST | {"labels": {"x.kueue.x-k8s.io/a": "b", "kueue.x-k8s.iox/a": "b", "team": "a"}}
    )
    assert serializer.is_valid(), serializer.errors
