"""Client factory: loads KUBECONFIG (or the in-cluster configuration) once per process, with timeouts; on a
MultiKueue worker (cluster.where.on_cluster), that worker's kubeconfig from WORKER_KUBECONFIG_DIR."""

from __future__ import annotations

import threading
from functools import lru_cache
from pathlib import Path

from django.conf import settings
from kubernetes import client, config

from cluster.errors import ClusterUnavailable
from cluster.where import MANAGER, current_cluster
from dispatch_site.names import is_dns1123_subdomain

_lock = threading.Lock()


@lru_cache(maxsize=32)
def _api_client_for(kubeconfig: str) -> client.ApiClient:
    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError) as exc:
        where = kubeconfig or "in-cluster configuration"
        raise ClusterUnavailable(where, f"cannot load Kubernetes configuration: {exc}") from None
    configuration.retries = 0  # the caller decides about retries
    # One pool for the process, sized to the worker's concurrency: every thread keeps its connection.
    configuration.connection_pool_maxsize = int(settings.KUBE_CONNECTION_POOL_SIZE)
    return client.ApiClient(configuration)


def kubeconfig_of(cluster: str) -> str:
    """The kubeconfig dispatch uses for `cluster`: its own KUBECONFIG for the manager; for a worker,
    <WORKER_KUBECONFIG_DIR>/<name>.kubeconfig, dispatch's own credentials there (never the MultiKueue
    Secret). ClusterUnavailable naming the worker and the file when there is none."""
    if cluster == MANAGER:
        return str(settings.KUBECONFIG)
    if not is_dns1123_subdomain(cluster):
        raise ClusterUnavailable(
            "kubeconfig", f"{cluster!r} is not a MultiKueueCluster name (DNS-1123 subdomain)"
        )
    directory = str(getattr(settings, "WORKER_KUBECONFIG_DIR", "") or "")
    path = Path(directory) / f"{cluster}.kubeconfig" if directory else None
    if path is None or not path.is_file():
        where = f"{path}" if path else "WORKER_KUBECONFIG_DIR (unset)"
        raise ClusterUnavailable(
            "kubeconfig", f"dispatch has no credentials for worker cluster {cluster}: expected {where}"
        )
    return str(path)


def worker_names() -> list[str]:
    """The MultiKueue workers dispatch has credentials for: <WORKER_KUBECONFIG_DIR>/<name>.kubeconfig."""
    directory = str(getattr(settings, "WORKER_KUBECONFIG_DIR", "") or "")
    if not directory or not Path(directory).is_dir():
        return []
    return sorted(
        p.name.removesuffix(".kubeconfig")
        for p in Path(directory).glob("*.kubeconfig")
        if p.is_file() and is_dns1123_subdomain(p.name.removesuffix(".kubeconfig"))
    )


def has_credentials(cluster: str) -> bool:
    """Whether dispatch has a kubeconfig of its own for `cluster` (kubeconfig_of finds one)."""
    try:
        kubeconfig_of(cluster)
    except ClusterUnavailable:
        return False
    return True


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """The client for `kubeconfig`, else for the cluster the call path is on (cluster.where)."""
    path = kubeconfig_of(current_cluster()) if kubeconfig is None else kubeconfig
    with _lock:
        return _api_client_for(path)


def request_timeout() -> tuple[float, float]:
    """(connect, read) seconds for every API call."""
    total = float(settings.KUBE_TIMEOUT_SECONDS)
    return (min(3.0, total), total)
