"""One definition of "the same content" for Kubernetes bodies. Pure.

A body's digest is the SHA-256 of its canonical JSON (keys sorted, no whitespace) without the fields the API
server sets (status, uid, resourceVersion, generation, timestamps, managedFields, ownerReferences,
finalizers). It serves two facts: the allow-list records the digest of what a platform user reviewed in
a runtime, its spec and behaviour-changing metadata (a runtime that no longer has it has changed since
review), and every object dispatch creates carries the digest of the body it sent (only such an object
is ever adopted; jobs.objects).
`changed_paths` names where two bodies differ, as field paths like the rule checker's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

# metadata fields the API server (or a controller) sets: never part of what dispatch or a reviewer wrote.
SERVER_SET_METADATA: Final = frozenset(
    {
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
        "ownerReferences",
        "finalizers",
    }
)


# How many field paths a message names before it says "and N more".
SHOWN_PATHS: Final = 8


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(value: Any) -> str:
    """sha256 hex of the canonical JSON of a plain value."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def without_server_fields(body: Mapping[str, Any], *, drop_annotations: Iterable[str] = ()) -> dict[str, Any]:
    """A copy of `body` without status and the server-set metadata (and without the named annotations);
    an emptied annotations or labels map is left out, as the API server leaves it out."""
    out: dict[str, Any] = {k: v for k, v in body.items() if k != "status"}
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k not in SERVER_SET_METADATA}
    dropped = set(drop_annotations)
    if dropped and isinstance(meta.get("annotations"), Mapping):
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k not in dropped}
    for key in ("annotations", "labels"):
        if key in meta and not meta[key]:
            del meta[key]
    out["metadata"] = meta
    return out


def spec_digest(runtime: Mapping[str, Any]) -> str:
    """The digest of a runtime's spec alone (what reviews recorded before they covered the metadata)."""
    return digest(runtime.get("spec") or {})


# Annotations that say how an object was written, not what it does: never part of a review. kubectl's copy of
# the last applied body mirrors the spec (which is reviewed itself) and changes with every apply.
BOOKKEEPING_ANNOTATIONS: Final = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})


def reviewed_metadata(runtime: Mapping[str, Any]) -> dict[str, Any]:
    """The runtime's labels and annotations a review covers: all of them but bookkeeping. Labels are copied
    onto every job's runtime copy (and so onto its objects: queues, priorities, frameworks), and annotations
    change behaviour too (dispatch's `<label domain>/exec-containers` chooses where a session's commands
    run), so an edit of either after the review is a change since review."""
    meta = runtime.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    labels = meta.get("labels")
    annotations = meta.get("annotations")
    return {
        "labels": dict(labels) if isinstance(labels, Mapping) else {},
        "annotations": {
            k: v
            for k, v in (annotations.items() if isinstance(annotations, Mapping) else ())
            if k not in BOOKKEEPING_ANNOTATIONS
        },
    }


def reviewed_content(runtime: Mapping[str, Any]) -> dict[str, Any]:
    """What a platform user reviews when allow-listing a runtime: its spec and the metadata that changes
    behaviour. Field paths into it read as paths into the runtime (spec..., metadata.annotations...)."""
    return {"spec": runtime.get("spec") or {}, "metadata": reviewed_metadata(runtime)}


def review_digest(runtime: Mapping[str, Any]) -> str:
    """The digest the allow-list records for a review (reviewed_content): a runtime that no longer has it has
    changed since its review."""
    return digest(reviewed_content(runtime))


def changed_paths(old: Any, new: Any, path: str = "") -> list[str]:
    """Every field path where `new` differs from `old` (added, removed or changed), in document order."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        found: list[str] = []
        for key in [*old.keys(), *(k for k in new if k not in old)]:
            child = f"{path}.{key}" if path else str(key)
            if key not in new or key not in old:
                found.append(child)
            else:
                found.extend(changed_paths(old[key], new[key], child))
        return found
    if isinstance(old, list) and isinstance(new, list):
        found = []
        for index in range(max(len(old), len(new))):
            child = f"{path}[{index}]"
            if index >= len(old) or index >= len(new):
                found.append(child)
            else:
                found.extend(changed_paths(old[index], new[index], child))
        return found
    return [] if old == new else [path or "(the whole body)"]


def describe_paths(paths: list[str]) -> str:
    shown = ", ".join(paths[:SHOWN_PATHS])
    more = len(paths) - SHOWN_PATHS
    return f"{shown} and {more} more" if more > 0 else shown
