"""The fence: an execution identity that ended stays ended at the cluster's door.

Before dispatch deletes an ended attempt's objects it writes the attempt's TrainJob name into an annotation
of the job's namespace, `fence.dispatch.dev/<trainjob name>: <when>`. The admission guard (deploy/guard/
fence.yaml) reads the namespace object the API server hands every policy and refuses any pod whose
FENCE_LABEL names a fenced TrainJob, whoever creates it, the Job controller included.

Why: deleting a TrainJob is a cascade the garbage collector carries out (TrainJob -> JobSet -> Jobs -> pods),
and the controllers on the way act on their caches. After a kube-apiserver restart a controller's watch can
lag its peers by seconds (client-go backs a broken watch off up to 30 s): the JobSet controller, still holding
the deleted JobSet as running, makes its Jobs again, and the Job controller runs their pods, ranks of an
attempt that already ended, until the garbage collector takes them. Nothing outside a controller can read its
cache; the fence closes the door instead, in the one place every such pod must pass (the API server), on an
object the API server itself reads (no parameter informer: deploy/guard/fence.yaml says why). Stop-before-
delete (jobs.submission.cancel) still comes first.

An entry is a job attempt's TrainJob name (`<job id>-<attempt>`): no later attempt or job reuses it, so
an entry never refuses legitimate work. Entries older than KEEP_SECONDS are dropped on a later write (a
namespace's annotations stay far below their 256 KiB limit); by then no controller's cache is that stale.
One key per entry, written with a JSON merge patch: two writers at once never lose each other's entry.
Sessions are not fenced: a user may open a session again under the name of one just closed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from cluster.calls import call_json, target
from cluster.errors import ClusterError, Rejected

logger = logging.getLogger(__name__)

FENCE_PREFIX: Final = "fence.dispatch.dev/"
# The label the policy reads on a pod: the JobSet controller stamps it, from its JobSet's name, on every pod
# template it makes; the Trainer names the JobSet after its TrainJob.
FENCE_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
KEEP_SECONDS: Final = 7 * 24 * 3600


def _path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}"


def fence_entries(annotations: Mapping[str, str]) -> dict[str, str]:
    """The fenced TrainJob names among a namespace's annotations, and when each was fenced."""
    return {k[len(FENCE_PREFIX) :]: v for k, v in annotations.items() if k.startswith(FENCE_PREFIX)}


def stale_entries(entries: Mapping[str, str], now: datetime) -> list[str]:
    """The entries fenced more than KEEP_SECONDS before `now` (or at a time nobody can read)."""
    horizon = now - timedelta(seconds=KEEP_SECONDS)
    stale = []
    for name, at in entries.items():
        try:
            when = datetime.fromisoformat(at)
        except ValueError:
            stale.append(name)
            continue
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        if when < horizon:
            stale.append(name)
    return sorted(stale)


def _patch(namespace: str, annotations: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = call_json(
        target("Namespace", None, namespace),
        ("patch", "namespaces"),
        "PATCH",
        _path(namespace),
        {"metadata": {"annotations": annotations}},
        content_type="application/merge-patch+json",
    )
    return body


def fence_add(namespace: str, trainjob_name: str) -> None:
    """Fence `trainjob_name` in `namespace` (idempotent; a later call moves its time on) and drop entries past
    KEEP_SECONDS. Raises ClusterError: the caller decides whether to go on without a fence (Rejected: RBAC
    or a policy refused it) or to try again (transient)."""
    now = datetime.now(UTC)
    key = FENCE_PREFIX + trainjob_name
    namespace_object = _patch(namespace, {key: now.isoformat(timespec="seconds")})
    entries = fence_entries((namespace_object.get("metadata") or {}).get("annotations") or {})
    stale = [name for name in stale_entries(entries, now) if name != trainjob_name]
    if stale:
        _patch(namespace, {FENCE_PREFIX + name: None for name in stale})  # null removes a key


def fence_best_effort(namespace: str, trainjob_name: str) -> bool:
    """fence_add for callers that go on without a fence when the cluster refuses one (a platform that has
    not granted deploy/rbac's namespace rule: check_cluster names the guard's gaps). A transient error is
    raised: the caller's retry fences before it deletes. Returns whether it is fenced."""
    try:
        fence_add(namespace, trainjob_name)
    except ClusterError as exc:
        if exc.transient:
            raise
        level = logging.WARNING if isinstance(exc, Rejected) else logging.INFO
        logger.log(level, "could not fence %s/%s before deleting it: %s", namespace, trainjob_name, exc)
        return False
    return True
