"""Client factory: loads KUBECONFIG (or the in-cluster configuration) once per process, with timeouts."""

from __future__ import annotations

import threading
from functools import lru_cache

from django.conf import settings
from kubernetes import client, config

from cluster.errors import ClusterUnavailable

_lock = threading.Lock()


@lru_cache(maxsize=4)
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


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    with _lock:
        return _api_client_for(settings.KUBECONFIG if kubeconfig is None else kubeconfig)


def request_timeout() -> tuple[float, float]:
    """(connect, read) seconds for every API call."""
    total = float(settings.KUBE_TIMEOUT_SECONDS)
    return (min(3.0, total), total)
