"""Interactive sessions through the Python client and the CLI (issue 12's nine checks, again through the
client), against a real dispatch server process, the real worker and the real control plane; KWOK serves
pods/exec.

The commands run on this host (KWOK's local exec), so which pod ran them is proved by the pod the service
reports for each execute, checked against the cluster's pods: for an MPI runtime it is the launcher pod.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from dispatch_client import Client, DispatchError, Forbidden, SessionNotRunning

from dispatch_site import roles
from dispatch_site.services import user_create
from runtimes.models import AllowListEntry
from tests.client.conftest import Dispatch
from tests.support.dispatch import GROUP, VERSION, runtime_body, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

IMAGE = "localhost/dispatch-busybox:kind"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"


def mpi_runtime(namespace: str) -> dict[str, Any]:
    """Shaped like the seed's mpi-interactive: launcher (the trainer ancestor, with the args of an MPI
    program, as real MPI runtimes have) and node replicated jobs running sshd, runLauncherAsNode. Nothing
    here tells the local plane to keep a pod running: the session's keep-alive and its peer marks do."""
    container = {
        "name": "node",
        "image": IMAGE,
        "resources": {
            "requests": {"cpu": "100m", "memory": "32Mi"},
            "limits": {"cpu": "100m", "memory": "32Mi"},
        },
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingRuntime",
        "metadata": {
            "name": "mpi-interactive",
            "namespace": namespace,
            "labels": {"trainer.kubeflow.org/framework": "deepspeed"},
        },
        "spec": {
            "mlPolicy": {
                "numNodes": 2,
                "mpi": {
                    "numProcPerNode": 1,
                    "mpiImplementation": "OpenMPI",
                    "sshAuthMountPath": "/home/mpiuser/.ssh",
                    "runLauncherAsNode": True,
                },
            },
            "template": {
                "spec": {
                    "network": {"publishNotReadyAddresses": True},
                    "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "containers": [
                                                container | {"command": ["/usr/sbin/sshd"], "args": ["-De"]}
                                            ]
                                        }
                                    }
                                }
                            },
                        },
                        {
                            "name": "launcher",
                            "dependsOn": [{"name": "node", "status": "Ready"}],
                            "template": {
                                "metadata": {
                                    "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
                                },
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "containers": [
                                                container
                                                | {"command": ["mpirun"], "args": ["/home/mpiuser/pi"]}
                                            ]
                                        }
                                    }
                                },
                            },
                        },
                    ],
                }
            },
        },
    }


@pytest.fixture
def sessions_user(dispatch_server: Dispatch, namespace: str) -> tuple[str, Client]:
    AllowListEntry.objects.get_or_create(
        kind="ClusterTrainingRuntime",
        namespace="",
        name="dispatch-kind",
        defaults={"for_jobs": True, "for_sessions": True},
    )
    AllowListEntry.objects.filter(kind="ClusterTrainingRuntime", name="dispatch-kind").update(
        for_sessions=True
    )
    _, token = user_create(username=f"su-{uuid.uuid4().hex[:8]}", role=roles.USER, namespaces=[namespace])
    return token, Client(dispatch_server.url, token, namespace=namespace)


def _pods(kube: Any, namespace: str, trainjob: str) -> list[Any]:
    return list(kube.core.list_namespaced_pod(namespace, label_selector=f"{JOBSET_NAME}={trainjob}").items)


def _trainjob_exists(kube: Any, namespace: str, name: str) -> bool:
    found = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")
    return any(item["metadata"]["name"] == name for item in found["items"])


def test_the_nine_checks_through_the_client_on_an_mpi_runtime(
    sessions_user: tuple[str, Client], kube: Any, namespace: str
) -> None:
    _, client = sessions_user
    kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", mpi_runtime(namespace)
    )
    AllowListEntry.objects.create(
        kind="TrainingRuntime", namespace=namespace, name="mpi-interactive", for_jobs=False, for_sessions=True
    )

    # 1. open reaches a Running trainer pod; 2. the trainer pod is the launcher, never a node pod.
    session = client.connect(
        runtime="TrainingRuntime/mpi-interactive", image=IMAGE, num_nodes=3, timeout=180, polling_interval=1
    )
    with session:
        pods = {p.metadata.name: p for p in _pods(kube, namespace, session.name)}
        assert session.pod in pods, (session.pod, sorted(pods))
        launcher = pods[session.pod]
        assert launcher.metadata.labels[REPLICATED_JOB] == "launcher"
        assert launcher.status.phase == "Running"
        assert any(p.metadata.labels[REPLICATED_JOB] == "node" for p in pods.values())
        # The launcher's own args are gone (`sleep infinity /home/mpiuser/pi` would exit 1 at once) and the
        # pods are still running well after the open: every command below comes 10 s later.
        trainer = launcher.spec.containers[0]
        assert (trainer.command, trainer.args) == (["sleep"], ["infinity"])
        time.sleep(10)
        now = {p.metadata.name: p.status.phase for p in _pods(kube, namespace, session.name)}
        assert set(now.values()) == {"Running"} and len(now) == len(pods), now

        # 3. a string runs with sh -c ($(...) substitution)
        result = session.execute("echo sub-$(echo stituted)")
        assert (result.stdout, result.stderr, result.returncode) == ("sub-stituted\n", "", 0)
        assert result.pod == session.pod  # the service says which pod ran it: the launcher
        # 4. a list runs directly: no shell, so $(...) stays literal
        listed = session.execute(["echo", "$(not-run)"])
        assert (listed.stdout, listed.returncode) == ("$(not-run)\n", 0)
        # 5. exit code 3
        assert session.execute(["sh", "-c", "exit 3"]).returncode == 3
        # 6. output on stderr with exit 1
        failed = session.execute("echo oops >&2; exit 1")
        assert (failed.stdout, failed.stderr, failed.returncode) == ("", "oops\n", 1)
        # several commands in one session, all on the launcher
        again = session.execute(["printf", "%s", "again"])
        assert (again.stdout, again.pod) == ("again", session.pod)
    name = session.name

    # 7. close removed the TrainJob and its pods (the context manager closed it, and close waited)
    assert session.closed
    assert not _trainjob_exists(kube, namespace, name)
    assert _pods(kube, namespace, name) == []
    session.close()  # idempotent

    # 8. execute after close is refused
    with pytest.raises(RuntimeError, match="closed"):
        session.execute("true")

    # 9. a second session with the same name opens right after
    with client.connect(
        runtime="TrainingRuntime/mpi-interactive", image=IMAGE, num_nodes=3, timeout=180, name=name
    ) as second:
        assert second.name == name
        assert second.execute("echo second").stdout == "second\n"


def test_only_the_owner_executes_and_a_session_closed_elsewhere_is_a_409(
    sessions_user: tuple[str, Client], dispatch_server: Dispatch, namespace: str
) -> None:
    _, client = sessions_user
    session = client.connect(
        runtime="dispatch-kind", image=IMAGE, num_nodes=1, timeout=120, polling_interval=1
    )
    try:
        _, other_token = user_create(
            username=f"so-{uuid.uuid4().hex[:8]}", role=roles.USER, namespaces=[namespace]
        )
        _, platform_token = user_create(
            username=f"sp-{uuid.uuid4().hex[:8]}", role=roles.PLATFORM, namespaces=["*"]
        )
        with pytest.raises(Forbidden):
            Client(dispatch_server.url, platform_token).execute(session.id, "true")  # platform may read only
        assert Client(dispatch_server.url, platform_token).get_session(session.id).state == "running"
        with pytest.raises(DispatchError) as other:  # another user: 403, or 404 when it may not even see it
            Client(dispatch_server.url, other_token).execute(session.id, "true")
        assert other.value.status in (403, 404)

        client.close_session(session.id)  # closed through the API, not through this Session object
        with pytest.raises(SessionNotRunning) as refused:
            session.execute("true")
        assert refused.value.status == 409
        assert refused.value.state in ("closing", "closed")
        assert isinstance(refused.value, RuntimeError)
    finally:
        session.close()


def test_an_open_that_times_out_says_the_trainjob_exists_and_how_to_delete_it(
    sessions_user: tuple[str, Client], kube: Any, namespace: str
) -> None:
    _, client = sessions_user
    body = runtime_body("TrainingRuntime", "too-big", namespace)
    container = body["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    container["resources"] = {
        "requests": {"cpu": "500"},
        "limits": {"cpu": "500"},
    }  # beyond the node: Pending
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", body)
    AllowListEntry.objects.create(
        kind="TrainingRuntime", namespace=namespace, name="too-big", for_sessions=True
    )

    with pytest.raises(TimeoutError) as timed_out:
        client.connect(
            runtime="TrainingRuntime/too-big", image=IMAGE, num_nodes=1, timeout=8, polling_interval=1
        )
    message = str(timed_out.value)
    sessions = client.sessions()
    assert len(sessions) == 1
    opened = sessions[0]
    assert f"TrainJob {namespace}/{opened.trainjob_name} was created" in message
    assert f"dispatch session close {opened.id}" in message
    assert _trainjob_exists(kube, namespace, opened.trainjob_name)  # not deleted behind the user's back
    client.close_session(opened.id)
    wait_for(lambda: not _trainjob_exists(kube, namespace, opened.trainjob_name), timeout=60, what="close")


def test_session_open_exec_close_from_the_command_line(
    sessions_user: tuple[str, Client], dispatch_server: Dispatch, kube: Any, namespace: str
) -> None:
    token, client = sessions_user
    dispatch = Path(sys.executable).parent / "dispatch"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")} | {
        "DISPATCH_URL": dispatch_server.url,
        "DISPATCH_TOKEN": token,
        "DISPATCH_NAMESPACE": namespace,
    }

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(dispatch), *args], env=env, capture_output=True, text=True, timeout=240, check=False
        )

    opened = run("session", "open", "--runtime", "dispatch-kind", "--image", IMAGE, "--num-nodes", "1")
    assert opened.returncode == 0, opened.stderr
    first = opened.stdout.splitlines()[0]
    assert first.endswith(": running"), opened.stdout
    session_id = first.split()[1].rstrip(":")
    trainjob = client.get_session(session_id).trainjob_name

    ran = run("session", "exec", session_id, "--", "echo out; echo err >&2; exit 5")
    assert (ran.returncode, ran.stdout, ran.stderr) == (5, "out\n", "err\n")
    listed = run("session", "exec", session_id, "--", "printf", "%s-%s", "a", "b")
    assert (listed.returncode, listed.stdout) == (0, "a-b")

    closed = run("session", "close", session_id)
    assert closed.returncode == 0, closed.stderr
    assert closed.stdout.strip() == f"session {session_id}: closed"
    assert not _trainjob_exists(kube, namespace, trainjob)
    refused = run("session", "exec", session_id, "--", "true")
    assert refused.returncode == 1
    assert "409" in refused.stderr
