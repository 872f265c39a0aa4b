"""Typed errors from the gateway. Transient ones may be retried with backoff; the rest are final."""

from __future__ import annotations

from cluster.where import cluster_label, current_cluster


class ClusterError(Exception):
    """Base class; `target` names the object as kind namespace/name (or kind/name when cluster-scoped), and
    the message starts with the worker cluster's name when it happened on one (cluster.where)."""

    transient = False

    def __init__(self, target: str, message: str, *, status: int | None = None) -> None:
        self.target = target
        self.message = message
        self.status = status
        self.cluster = current_cluster()  # the MultiKueue worker it happened on; "" for the manager
        super().__init__(f"{cluster_label(self.cluster)}{target}: {message}")


class ClusterUnavailable(ClusterError):
    """The API server could not be reached or answered 5xx/429: try again later."""

    transient = True


class NotFound(ClusterError):
    pass


class AlreadyExists(ClusterError):
    pass


class Rejected(ClusterError):
    """The API server or an admission webhook refused the request (4xx): retrying will not help."""


class Expired(Rejected):
    """410 Gone: a watch or list asked for a resourceVersion the API server no longer keeps; list afresh."""


class Conflict(ClusterError):
    """A write raced with another writer (409 on update): re-read and try again."""

    transient = True
