"""The runtime rules' reading of a runtime (pure): lookups that treat a value of the wrong type as absent, a
value as a message shows it, and where the trainer job and its pod spec are (runtimes.rules)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from runtimes.reasons import TRAINER_ANCESTOR_LABEL, TRAINER_ANCESTOR_STEP

EMPTY: Mapping[str, Any] = MappingProxyType({})


def as_map(value: object) -> Mapping[str, Any]:
    """The value as a mapping, or an empty one: lets lookups chain over malformed input."""
    return value if isinstance(value, Mapping) else EMPTY


def as_list(value: object) -> list[Any] | tuple[Any, ...]:
    return value if isinstance(value, list | tuple) else ()


def show(value: object) -> str:
    """A field's value for a message: JSON-like for scalars, the type for anything bigger."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def is_int(value: object, expected: int) -> bool:
    # bool is an int in Python; `backoffLimit: false` is not a stated 0.
    return type(value) is int and value == expected


def runtime_ref(runtime: Mapping[str, Any] | None) -> str:
    """Kind/name (Kind/namespace/name for a namespaced runtime) for messages."""
    if not isinstance(runtime, Mapping):
        return "the runtime"
    meta = as_map(runtime.get("metadata"))
    kind = runtime.get("kind") or "runtime"
    name = meta.get("name") or "<unnamed>"
    namespace = meta.get("namespace")
    return f"{kind}/{namespace}/{name}" if namespace else f"{kind}/{name}"


def _replicated_jobs(runtime: Mapping[str, Any]) -> list[Any] | tuple[Any, ...]:
    return as_list(
        as_map(as_map(as_map(runtime.get("spec")).get("template")).get("spec")).get("replicatedJobs")
    )


def is_trainer(job: object) -> bool:
    labels = as_map(as_map(as_map(as_map(job).get("template")).get("metadata")).get("labels"))
    return labels.get(TRAINER_ANCESTOR_LABEL) == TRAINER_ANCESTOR_STEP


def find_trainer_index(jobs: list[Any] | tuple[Any, ...]) -> int | None:
    return next((i for i, job in enumerate(jobs) if isinstance(job, Mapping) and is_trainer(job)), None)


def find_trainer_job(runtime: Mapping[str, Any]) -> tuple[int, Mapping[str, Any]] | None:
    """The index and replicatedJob of the trainer job: the first whose template carries the trainer
    ancestor label (the label sits on the Job template, not the pod template)."""
    if not isinstance(runtime, Mapping):
        return None
    jobs = _replicated_jobs(runtime)
    index = find_trainer_index(jobs)
    return None if index is None else (index, jobs[index])


def trainer_pod_spec(runtime: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The trainer job's pod spec (replicatedJobs[i].template.spec.template.spec), if there is one."""
    found = find_trainer_job(runtime)
    if found is None:
        return None
    pod_spec = as_map(as_map(as_map(found[1].get("template")).get("spec")).get("template")).get("spec")
    return pod_spec if isinstance(pod_spec, Mapping) else None


def has_named(items: object, name: str) -> bool:
    return any(isinstance(c, Mapping) and c.get("name") == name for c in as_list(items))


def found_names(items: object) -> str:
    """The names of the containers found, for a message."""
    names = [show(c.get("name")) for c in as_list(items) if isinstance(c, Mapping)]
    return "found " + ", ".join(names) if names else "found none"
