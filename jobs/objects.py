"""The cluster objects dispatch makes for a job or a session: create or adopt (only what dispatch made for
this owner), the TrainJob on its runtime copy (waiting out the Trainer's cache lag), and the copy's
ownerReference."""

from __future__ import annotations

import re
import time
from typing import Any

from cluster import gateway
from cluster.errors import AlreadyExists, Rejected

TRAINJOB = "TrainJob"


TRAINING_RUNTIME = "TrainingRuntime"


def is_ours(obj: dict[str, Any], label_domain: str, job_id: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(f"{label_domain}/job") == job_id)


def create_or_adopt(kind: str, body: dict[str, Any], label_domain: str, job_id: str) -> dict[str, Any]:
    """Create the object; an existing one carrying our job label is ours from an earlier delivery."""
    meta = body["metadata"]
    try:
        return gateway.create_namespaced(kind, body)
    except AlreadyExists:
        existing = gateway.get_namespaced(kind, meta["namespace"], meta["name"])
        if existing is None or not is_ours(existing, label_domain, job_id):
            raise Rejected(
                gateway.target(kind, meta["namespace"], meta["name"]),
                "already exists and was not created by dispatch for this job",
            ) from None
        return existing


# The Trainer's TrainJob webhook reads runtimes through its informer cache, which can lag right after the
# copy was created; it then denies the TrainJob with "<err>: specified trainingRuntime must be created
# before the TrainJob is created", <err> being 'TrainingRuntime.trainer.kubeflow.org "<name>" not found'.
_COPY_NOT_SEEN = ("must be created before the trainjob", "trainingruntime")
# Kueue's TrainJob validating webhook (vtrainjob.kb.io) reads the runtime through its own informer cache and
# denies with "runtime '<name>' not found" while that cache lags (README, Kueue: 1 of 300 measured).
_KUEUE_COPY_NOT_SEEN = re.compile(r"(?:^|: )runtime '[^']+' not found")


# How long the TrainJob create waits, in this delivery, for the Trainer's cache to see the copy before the
# task is retried (the lag is usually milliseconds; a task retry waits seconds).
COPY_SEEN_WAITS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)


def create_trainjob_on_copy(body: dict[str, Any], label_domain: str, owner_id: str) -> dict[str, Any]:
    """Create (or adopt) the TrainJob right after its runtime copy (of a job or a session). The copy exists
    (created or adopted just before): a denial for a runtime the Trainer has not seen yet is tried again a few
    times; after the last wait the denial is raised (`_copy_not_seen_yet` tells it from a real rejection)."""
    for wait in COPY_SEEN_WAITS:
        try:
            return create_or_adopt(TRAINJOB, body, label_domain, owner_id)
        except Rejected as exc:
            if not _copy_not_seen_yet(exc):
                raise
            time.sleep(wait)
    return create_or_adopt(TRAINJOB, body, label_domain, owner_id)


def _copy_not_seen_yet(exc: Rejected) -> bool:
    """Is this the Trainer's (or Kueue's) webhook denial for a runtime copy it has not seen yet (worth a
    retry)?"""
    message = exc.message.lower()
    return (
        _COPY_NOT_SEEN[0] in message
        or (_COPY_NOT_SEEN[1] in message and "not found" in message)
        or _KUEUE_COPY_NOT_SEEN.search(exc.message) is not None
    )


def own_copy(copy: dict[str, Any], trainjob: dict[str, Any]) -> None:
    meta = trainjob["metadata"]
    owner = {
        "apiVersion": trainjob.get("apiVersion", "trainer.kubeflow.org/v1alpha1"),
        "kind": TRAINJOB,
        "name": meta["name"],
        "uid": meta["uid"],
        "blockOwnerDeletion": False,
    }
    existing = (copy.get("metadata") or {}).get("ownerReferences") or []
    if any(ref.get("uid") == meta["uid"] for ref in existing):
        return
    gateway.patch_namespaced(
        TRAINING_RUNTIME,
        copy["metadata"]["namespace"],
        copy["metadata"]["name"],
        {"metadata": {"ownerReferences": [*existing, owner]}},
    )
