"""`scripts/cluster down` then `up` keeps the cluster (etcd's data), as `down` says ("state kept"): a job that
ran before `make down` is there after `make up`. `up --fresh` starts empty. A plane of its own (its own state
directory and ports), so the session's plane is not touched; two starts, about a minute each."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "scripts" / "cluster"
PORT_BASE = "24400"  # etcd 24400, kube-apiserver 24443, ... (scripts/cluster: ports relative to the base)

pytestmark = pytest.mark.cluster


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_CLUSTER_")} | {
        "DISPATCH_CLUSTER_STATE": str(tmp_path / "cluster"),
        "DISPATCH_CLUSTER_PORT_BASE": PORT_BASE,
    }
    env.pop("KUBECONFIG", None)
    yield env
    subprocess.run([str(CLUSTER), "down"], env=env, capture_output=True, timeout=120, check=False)


def _cluster(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([str(CLUSTER), *args], env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:  # the whole of what it printed (an assertion's repr would cut its middle out)
        what = f"scripts/cluster {' '.join(args)} exited {done.returncode}"
        pytest.fail(f"{what}:\n{done.stderr}", pytrace=False)
    return done.stdout + done.stderr


def _kubectl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLUSTER), "kubectl", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_down_then_up_keeps_what_ran_and_fresh_starts_empty(plane: dict[str, str]) -> None:
    _cluster(plane, "up", "--fresh")
    made = _kubectl(plane, "-n", "default", "create", "configmap", "before-down", "--from-literal=k=v")
    assert made.returncode == 0, made.stderr
    _cluster(plane, "down")

    printed = _cluster(plane, "up")
    assert "etcd data kept from the last run" in printed
    kept = _kubectl(plane, "-n", "default", "get", "configmap", "before-down", "-o", "jsonpath={.data.k}")
    assert (kept.returncode, kept.stdout) == (0, "v"), kept.stderr
    # The plane came up on its kept data (its start admits a JobSet and a TrainJob by server dry run).
    runtimes = _kubectl(plane, "get", "clustertrainingruntimes", "-o", "name")
    assert "dispatch-kind" in runtimes.stdout, runtimes.stderr
    _cluster(plane, "down")

    _cluster(plane, "up", "--fresh")
    gone = _kubectl(plane, "-n", "default", "get", "configmap", "before-down")
    assert gone.returncode != 0 and "NotFound" in gone.stderr
