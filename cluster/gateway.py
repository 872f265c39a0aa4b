"""Typed reads, creates, deletes, exec and list/watch against the Kubernetes API."""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from cluster.client import api_client, request_timeout
from cluster.errors import ClusterUnavailable


def server_version() -> str:
    try:
        info = client.VersionApi(api_client()).get_code(_request_timeout=request_timeout())
    except ApiException as exc:
        raise ClusterUnavailable("apiserver", f"{exc.status} {exc.reason}", status=exc.status) from None
    except (HTTPError, OSError) as exc:
        raise ClusterUnavailable("apiserver", f"unreachable: {exc}") from None
    return str(info.git_version)
