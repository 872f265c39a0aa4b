"""One definition of "the same content" for Kubernetes bodies. Pure.

A body's digest is the SHA-256 of its canonical JSON (keys sorted, no whitespace) without the fields the API
server sets (status, uid, resourceVersion, generation, timestamps, managedFields, ownerReferences,
finalizers). It serves two facts: the allow-list records the digest of the runtime spec a platform user
reviewed (a runtime whose spec no longer has it has changed since review), and every object dispatch creates
carries the digest of the body it sent (only such an object is ever adopted; jobs.objects).
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
    """The digest of a runtime's spec: what a platform user reviews when allow-listing it."""
    return digest(runtime.get("spec") or {})


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
