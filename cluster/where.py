"""Which cluster the gateway talks to: the manager (dispatch's own KUBECONFIG, named "") or a MultiKueue
worker, by the name of its MultiKueueCluster. A context variable, so that one call path (a supervision pass
over a worker's jobs, a session's exec, a log read) goes to one cluster without passing it through every
function; a new thread starts on the manager unless it runs in a copied context (contextvars.copy_context).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

MANAGER: Final = ""

_CLUSTER: ContextVar[str] = ContextVar("dispatch_cluster", default=MANAGER)


def current_cluster() -> str:
    return _CLUSTER.get()


@contextmanager
def on_cluster(name: str) -> Iterator[None]:
    """Every gateway call inside goes to the worker cluster `name` ("" is the manager)."""
    token = _CLUSTER.set(name)
    try:
        yield
    finally:
        _CLUSTER.reset(token)


def cluster_label(name: str | None = None) -> str:
    """How an error names where it happened: "" on the manager, "worker-1: " on a worker."""
    name = current_cluster() if name is None else name
    return f"{name}: " if name else ""
