"""Pure: what a change of the site settings must be checked against, and what it affects. Plain data in,
plain data out; runtimes.services reads the cluster for it, runtimes.selectors counts the jobs.

- The Trainer versions dispatch knows (TRAINER_RELEASES, the one list): the installed Trainer's version
  decides image placement (jobs.plan), so only a released one is accepted.
- The Kueue settings per namespace (the key "*" is every namespace without its own entry): a default
  LocalQueue that does not exist refuses every job of its namespaces without queue_name (`queue-not-found`),
  so each new or changed entry names the (namespace, queue) pairs to read, and each new priority class the
  WorkloadPriorityClass to read. Entries the change leaves as they are are not read again.
- The impact: the namespaces whose jobs see another setting after the change, and how many jobs wait
  (pending or queued) in them. A site-wide setting (the Trainer version, the recovery policy, the publish and
  label settings) affects every namespace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

# Released Kubeflow Trainer v2 versions (github.com/kubeflow/trainer tags, release candidates left out).
# Add a release here once dispatch is tested with it; jobs.plan keys image placement on the version.
TRAINER_RELEASES: Final = ("v2.0.0", "v2.0.1", "v2.1.0", "v2.2.0", "v2.2.1", "v2.3.0")
DEFAULT_TRAINER_VERSION: Final = "v2.3.0"

ALL_NAMESPACES: Final = "*"  # a Kueue setting's key that applies to every namespace without its own entry
KUEUE_SETTINGS: Final = ("kueue_default_queues", "kueue_priority_classes")


def default_queue(namespace: str, default_queues: Mapping[str, str]) -> str | None:
    """The namespace's default LocalQueue (its own entry, else the "*" entry), or None."""
    queue = default_queues.get(namespace) or default_queues.get(ALL_NAMESPACES)
    return str(queue) if queue else None


def allowed_priority_classes(namespace: str, allowed: Mapping[str, Iterable[str]]) -> tuple[str, ...]:
    """The WorkloadPriorityClasses the site allows in the namespace (its own entry, else the "*" entry)."""
    classes = allowed.get(namespace)
    if classes is None:
        classes = allowed.get(ALL_NAMESPACES) or ()
    return tuple(str(c) for c in classes)


# --- what to read ------------------------------------------------------------------------------------


def queue_reads(
    before: Mapping[str, str], after: Mapping[str, str], namespaces: Iterable[str]
) -> dict[str, list[tuple[str, str]]]:
    """Per new or changed entry of kueue_default_queues: the (namespace, LocalQueue) pairs that must exist.
    A "*" entry is read in every known namespace (`namespaces`) without an entry of its own; it has no pair
    when no namespace is known."""
    reads: dict[str, list[tuple[str, str]]] = {}
    for key, queue in sorted(after.items()):
        if before.get(key) == queue:
            continue
        if key == ALL_NAMESPACES:
            targets = sorted({ns for ns in namespaces if ns != ALL_NAMESPACES and ns not in after})
        else:
            targets = [key]
        reads[key] = [(ns, queue) for ns in targets]
    return reads


def class_reads(
    before: Mapping[str, Iterable[str]], after: Mapping[str, Iterable[str]]
) -> dict[str, list[str]]:
    """Per entry of kueue_priority_classes: the classes it allows that it did not allow before."""
    reads: dict[str, list[str]] = {}
    for key, classes in sorted(after.items()):
        had = set(before.get(key) or ())
        new = [str(c) for c in classes if c not in had]
        if new:
            reads[key] = new
    return reads


def missing_queue_message(queue: str, missing: list[str]) -> str:
    where = ", ".join(missing)
    return (
        f"LocalQueue {queue!r} does not exist in namespace {where}: every job there without queue_name would "
        "be refused queue-not-found"
    )


def missing_class_message(missing: list[str]) -> str:
    names = ", ".join(repr(c) for c in missing)
    return f"WorkloadPriorityClass {names} does not exist in the cluster: a job asking for it is refused"


# --- the impact --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Impact:
    """What a change of the site settings affects, before it is saved."""

    changed: tuple[str, ...]  # the settings whose value changes
    namespaces: tuple[str, ...]  # the known namespaces whose jobs see another setting
    waiting_jobs: int  # jobs pending or queued in those namespaces
    site_wide: bool  # a setting every namespace sees changes


def settings_impact(
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    namespaces: Iterable[str],
    waiting: Mapping[str, int],
) -> Impact:
    """`before`/`after`: the settings (SiteSettings.as_dict); `namespaces`: those dispatch knows (granted);
    `waiting`: jobs pending or queued per namespace."""
    changed = tuple(k for k in after if before.get(k) != after[k])
    known = {ns for ns in namespaces if ns != ALL_NAMESPACES} | {ns for ns, n in waiting.items() if n}
    for name in KUEUE_SETTINGS:
        for side in (before, after):
            known |= {str(k) for k in (side.get(name) or {}) if k != ALL_NAMESPACES}
    site_wide = any(k not in KUEUE_SETTINGS for k in changed)
    if site_wide:
        affected = known
    else:
        queues = [side.get("kueue_default_queues") or {} for side in (before, after)]
        classes = [side.get("kueue_priority_classes") or {} for side in (before, after)]
        affected = {
            ns
            for ns in known
            if default_queue(ns, queues[0]) != default_queue(ns, queues[1])
            or set(allowed_priority_classes(ns, classes[0])) != set(allowed_priority_classes(ns, classes[1]))
        }
    return Impact(
        changed=changed,
        namespaces=tuple(sorted(affected)),
        waiting_jobs=sum(waiting.get(ns, 0) for ns in affected),
        site_wide=site_wide,
    )
