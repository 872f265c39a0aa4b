"""The official Kubeflow SDK (kubeflow 0.5.0, TrainerClient) reads the TrainJobs dispatch starts.

Users and on-call look at dispatch's jobs with the SDK. It needs the runtime a TrainJob names (dispatch's
TrainingRuntime copy) to carry trainer.kubeflow.org/framework, and warns when the kubeflow-trainer-public
ConfigMap a Trainer install ships is missing. The SDK pins kubernetes<36 and dispatch pins 37, so it runs from
its own venv (.venv/kubeflow-sdk, made by `make test`) as a user's notebook would, with the local control
plane's kubeconfig (127.0.0.1 only).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from runtimes.models import AllowListEntry
from tests.support.dispatch import GROUP, VERSION, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]

REPO = Path(__file__).resolve().parents[2]
SDK_PYTHON = REPO / ".venv" / "kubeflow-sdk" / "bin" / "python"

# What a user would type, printing what they would look at as JSON; SDK warnings are captured too.
SDK_SCRIPT = """
import json, logging, sys
from kubeflow.trainer import KubernetesBackendConfig, TrainerClient

records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger().addHandler(Keep(level=logging.WARNING))

kubeconfig, namespace, name = sys.argv[1:4]
client = TrainerClient(KubernetesBackendConfig(config_file=kubeconfig, namespace=namespace))
listed = client.list_jobs()
job = client.get_job(name)
logs = list(client.get_job_logs(name))
print(json.dumps({
    "listed": sorted(j.name for j in listed),
    "job": {
        "name": job.name,
        "runtime": job.runtime.name,
        "framework": job.runtime.trainer.framework,
        "num_nodes": job.num_nodes,
        "steps": sorted([s.name, s.status, s.pod_name] for s in job.steps),
    },
    "logs": logs,
    "warnings": records,
}))
"""


def _start(token: str, namespace: str, capture: Any, num_nodes: int) -> str:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": num_nodes,
        "env": {"KWOK_STAY_RUNNING": "1"},
    }
    with capture(execute=True):
        response = api.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 202, response.json()
    return f"{response.json()['id']}-1"


def test_the_kubeflow_sdk_lists_gets_and_reads_logs_of_dispatch_jobs(
    kube: Any,
    kubeconfig: str,
    namespace: str,
    tmp_path: Path,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    assert SDK_PYTHON.exists(), (
        f"{SDK_PYTHON} is missing: `make test` (or `make .venv/kubeflow-sdk/.installed`)"
    )
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
    first = _start(submitter[1], namespace, django_capture_on_commit_callbacks, num_nodes=2)
    second = _start(submitter[1], namespace, django_capture_on_commit_callbacks, num_nodes=1)

    def running_pods(trainjob: str, count: int) -> list[Any] | None:
        pods = kube.core.list_namespaced_pod(
            namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={trainjob}"
        ).items
        running = [p for p in pods if p.status.phase == "Running"]
        return running if len(running) == count else None

    pods = wait_for(lambda: running_pods(first, 2), timeout=90, what=f"2 running pods of {first}")
    wait_for(lambda: running_pods(second, 1), timeout=90, what=f"1 running pod of {second}")
    copy = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", first)
    assert copy["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"

    assert kube.api_client.configuration.host.startswith("https://127.0.0.1:")  # the SDK gets the same file

    result = subprocess.run(
        [str(SDK_PYTHON), "-c", SDK_SCRIPT, kubeconfig, namespace, first],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},  # nothing but the kubeconfig it is given
    )
    assert result.returncode == 0, result.stderr[-4000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])

    assert seen["listed"] == sorted([first, second])
    job = seen["job"]
    assert job["name"] == first
    assert job["runtime"] == first  # the TrainingRuntime copy named for the TrainJob
    assert job["framework"] == "torch"
    assert job["num_nodes"] == 2
    pod_names = sorted(p.metadata.name for p in pods)
    assert job["steps"] == [["node-0", "Running", pod_names[0]], ["node-1", "Running", pod_names[1]]]
    # node-0's log, served by KWOK (the same simulated log for every container: scripts/cluster).
    assert seen["logs"] == ["kwok: simulated container log (dispatch local cluster)"]
    assert not [w for w in seen["warnings"] if "kubeflow-trainer-public" in w], seen["warnings"]
