"""Small readers of plain Kubernetes objects (dicts as the API server returns them), and the evidence row.
Pure."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any


def as_map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if value else None


def as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_map(obj.get("metadata"))


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_map(meta_of(obj).get("labels"))


def name_of(obj: Mapping[str, Any]) -> str:
    return str(meta_of(obj).get("name", ""))


def object_ref(kind: str, obj: Mapping[str, Any]) -> str:
    meta = meta_of(obj)
    namespace = meta.get("namespace")
    return f"{kind} {namespace}/{meta.get('name', '')}" if namespace else f"{kind} {meta.get('name', '')}"


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in as_list(as_map(obj.get("status")).get("conditions")):
        if as_map(cond).get("type") == kind:
            return as_map(cond)
    return None


def true_condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    cond = condition(obj, kind)
    return cond if cond is not None and cond.get("status") == "True" else None


def attempt_of(obj: Mapping[str, Any], label_domain: str) -> int | None:
    labels = labels_of(obj)
    value = as_int(labels.get(f"{label_domain}/attempt"))
    if value is not None:
        return value
    for key, raw in labels.items():  # another label domain: any "<domain>/attempt" that is not JobSet's
        if str(key).endswith("/attempt") and not str(key).startswith("jobset.sigs.k8s.io"):
            found = as_int(raw)
            if found is not None:
                return found
    return None


def evidence_row(obj: str, fld: str, value: Any, at: Any = None) -> dict[str, Any]:
    when = at if isinstance(at, str) or at is None else iso(at)
    return {"object": obj, "field": fld, "value": value, "at": when}


def pod_ref(pod: Mapping[str, Any]) -> str:
    return f"Pod {pod.get('namespace')}/{pod.get('name')}"
