"""The gateway on MultiKueue worker clusters (issue 35): a call path inside `on_cluster(name)` uses dispatch's
own kubeconfig for that worker (WORKER_KUBECONFIG_DIR/<name>.kubeconfig), and its errors name the worker.
Without a cluster: the kubeconfigs point at 127.0.0.1 ports nothing listens on, so a call fails at once with
the worker named (the real planes: tests/scripts/test_multikueue_planes.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster import calls
from cluster.client import api_client, kubeconfig_of
from cluster.errors import ClusterUnavailable
from cluster.where import MANAGER, current_cluster, on_cluster
from dispatch_site.config import ConfigError, load_config


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
def planes(tmp_path: Path, settings: Any) -> Path:
    workers = tmp_path / "workers"
    workers.mkdir()
    settings.KUBECONFIG = str(_kubeconfig(tmp_path / "manager.kubeconfig", "https://127.0.0.1:9"))
    settings.WORKER_KUBECONFIG_DIR = str(workers)
    settings.KUBE_TIMEOUT_SECONDS = 2
    _kubeconfig(workers / "worker-a.kubeconfig", "https://127.0.0.1:7")
    return workers


def test_a_call_path_on_a_worker_uses_dispatchs_kubeconfig_for_that_worker(planes: Path) -> None:
    assert current_cluster() == MANAGER
    assert api_client().configuration.host == "https://127.0.0.1:9"
    with on_cluster("worker-a"):
        assert kubeconfig_of(current_cluster()) == str(planes / "worker-a.kubeconfig")
        assert api_client().configuration.host == "https://127.0.0.1:7"
        with on_cluster(MANAGER):  # nested: back on the manager, then on the worker again
            assert api_client().configuration.host == "https://127.0.0.1:9"
        assert api_client().configuration.host == "https://127.0.0.1:7"
    assert api_client().configuration.host == "https://127.0.0.1:9"


def test_an_error_on_a_worker_names_the_worker(planes: Path) -> None:
    with on_cluster("worker-a"), pytest.raises(ClusterUnavailable) as raised:
        calls.server_version()
    assert raised.value.cluster == "worker-a" and str(raised.value).startswith("worker-a: apiserver: ")
    with pytest.raises(ClusterUnavailable) as on_manager:
        calls.server_version()
    assert on_manager.value.cluster == "" and str(on_manager.value).startswith("apiserver: ")


@pytest.mark.parametrize("name", ["worker-b", "../workers/worker-a", "Worker_A"])
def test_a_worker_without_credentials_or_with_a_bad_name_is_unavailable_naming_it(
    planes: Path, name: str
) -> None:
    with on_cluster(name), pytest.raises(ClusterUnavailable) as raised:
        api_client()
    assert str(raised.value).startswith(f"{name}: kubeconfig: ")
    assert name in raised.value.message


def test_a_new_thread_starts_on_the_manager(planes: Path) -> None:
    seen: list[str] = []
    with on_cluster("worker-a"):
        thread = threading.Thread(target=lambda: seen.append(current_cluster()))
        thread.start()
        thread.join()
    assert seen == [MANAGER]


def test_worker_kubeconfigs_are_configured_by_directory(tmp_path: Path) -> None:
    manager = _kubeconfig(tmp_path / "k", "https://127.0.0.1:9")
    base = {"KUBECONFIG": str(manager), "SECRET_KEY": "x" * 50, "DEBUG": "true"}
    assert load_config(base).worker_kubeconfig_dir == ""  # a platform's KUBECONFIG: no workers unless named
    assert load_config(base | {"WORKER_KUBECONFIG_DIR": str(tmp_path)}).worker_kubeconfig_dir == str(tmp_path)
    with pytest.raises(ConfigError, match="WORKER_KUBECONFIG_DIR"):
        load_config(base | {"WORKER_KUBECONFIG_DIR": str(tmp_path / "missing")})
