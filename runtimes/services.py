"""Writes: the allow-list, the site settings, and the verdict history (with the periodic re-check)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from cluster import gateway, kueue
from cluster.errors import ClusterError
from cluster.gateway import RuntimeObject
from dispatch_site.audit import audit_record
from dispatch_site.roles import AnyUser
from runtimes import settings_checks
from runtimes.digest import review_digest, reviewed_metadata
from runtimes.models import AllowListEntry, ReviewState, RuntimeVerdict, SiteSettings, runtime_ref
from runtimes.reasons import SiteRules
from runtimes.rules import check_runtime
from runtimes.selectors import (
    forget_cached_reads,
    get_runtime,
    known_namespaces,
    latest_verdicts,
    site_rules,
)

logger = logging.getLogger(__name__)


class AlreadyListed(Exception):
    pass


def runtime_verdict_record(
    *,
    kind: str,
    namespace: str,
    name: str,
    runtime: RuntimeObject | None,
    verdict: dict[str, Any],
    previous: RuntimeVerdict | None,
) -> RuntimeVerdict | None:
    """Record a verdict when it, or the runtime it judged, changed since the previous record."""
    resource_version = runtime.resource_version if runtime else ""
    if previous is not None and previous.verdict == verdict and previous.resource_version == resource_version:
        return None
    return RuntimeVerdict.objects.create(
        kind=kind,
        namespace=namespace,
        name=name,
        refused=bool(verdict["refused"]),
        verdict=verdict,
        resource_version=resource_version,
        generation=runtime.generation if runtime else None,
        runtime=runtime.body if runtime else None,
    )


def _check_and_record(
    entry: AllowListEntry, runtime: RuntimeObject | None, previous: RuntimeVerdict | None, rules: SiteRules
) -> RuntimeVerdict | None:
    verdict = check_runtime(
        runtime.body if runtime else None,
        rules=rules,
        allow_listed=True,
        ref=entry.ref,
        review=entry.as_review(),
    )
    return runtime_verdict_record(
        kind=entry.kind,
        namespace=entry.namespace,
        name=entry.name,
        runtime=runtime,
        verdict=verdict.to_dict(),
        previous=previous,
    )


@dataclass(frozen=True)
class RecheckResult:
    checked: int
    changed: list[str]


def runtimes_recheck() -> RecheckResult:
    """Check every allow-listed runtime against the cluster (one list call per kind); record what changed."""
    live = {(o.kind, o.namespace, o.name): o for o in gateway.list_runtimes()}
    previous = latest_verdicts()
    changed = []
    entries = list(AllowListEntry.objects.all())
    rules = site_rules()  # once for the whole pass, not once per runtime
    for entry in entries:
        key = (entry.kind, entry.namespace, entry.name)
        if _check_and_record(entry, live.get(key), previous.get(key), rules) is not None:
            changed.append(entry.ref)
    if changed:
        logger.info("runtime verdicts changed: %s", ", ".join(changed))
    return RecheckResult(checked=len(entries), changed=changed)


@dataclass(frozen=True)
class Approval:
    entry: AllowListEntry
    created: bool  # False: the entry existed and was re-approved


def allow_list_add(
    *,
    actor: AnyUser | None,
    kind: str,
    namespace: str,
    name: str,
    for_jobs: bool = True,
    for_sessions: bool = False,
    note: str = "",
) -> AllowListEntry:
    """Add a new runtime to the allow-list (AlreadyListed when it is on it already): allow_list_approve."""
    return allow_list_approve(
        actor=actor,
        kind=kind,
        namespace=namespace,
        name=name,
        for_jobs=for_jobs,
        for_sessions=for_sessions,
        note=note,
        reapprove=False,
    ).entry


def allow_list_approve(
    *,
    actor: AnyUser | None,
    kind: str,
    namespace: str,
    name: str,
    for_jobs: bool = True,
    for_sessions: bool = False,
    note: str = "",
    reapprove: bool = True,
) -> Approval:
    """Put a runtime on the allow-list, or re-approve the entry already there (its purposes and note as given
    now): read the runtime and record what the platform user reviewed, its spec and behaviour-changing labels
    and annotations (their digest: a later change is runtime-changed-since-review), and its verdict. A
    runtime that cannot be read now is recorded as not reviewed (review "missing": refused until re-approved
    once it can be read)."""
    if kind == "ClusterTrainingRuntime":
        namespace = ""
    try:
        runtime = get_runtime(kind, namespace, name)  # never one of dispatch's own copies
    except ClusterError as exc:
        logger.warning(
            "could not read %s to record what was reviewed: %s", runtime_ref(kind, namespace, name), exc
        )
        runtime = None
        readable = False
    else:
        readable = runtime is not None
    reviewed: dict[str, Any] = {
        "review": ReviewState.CONTENT if readable else ReviewState.MISSING,
        "reviewed_hash": review_digest(runtime.body) if runtime is not None else "",
        "reviewed_spec": (runtime.body.get("spec") or {}) if runtime is not None else None,
        "reviewed_metadata": reviewed_metadata(runtime.body) if runtime is not None else None,
        "reviewed_at": timezone.now(),
        "reviewed_by": actor.get_username() if isinstance(actor, User) else "",
    }
    fields = {"for_jobs": for_jobs, "for_sessions": for_sessions, "note": note, **reviewed}
    try:
        with transaction.atomic():
            existing = (
                AllowListEntry.objects.select_for_update()
                .filter(kind=kind, namespace=namespace, name=name)
                .first()
            )
            if existing is not None and not reapprove:
                raise AlreadyListed(f"{runtime_ref(kind, namespace, name)} is already on the allow-list")
            if existing is not None:
                before = {
                    "purposes": existing.purposes,
                    "hash": existing.reviewed_hash,
                    "review": existing.review,
                }
                AllowListEntry.objects.filter(pk=existing.pk).update(**fields)
                existing.refresh_from_db()
                entry, created = existing, False
            else:
                entry = AllowListEntry.objects.create(
                    kind=kind,
                    namespace=namespace,
                    name=name,
                    added_by=actor if isinstance(actor, User) else None,
                    **fields,
                )
                before, created = {}, True
    except IntegrityError:
        raise AlreadyListed(f"{runtime_ref(kind, namespace, name)} is already on the allow-list") from None
    forget_cached_reads()
    details: dict[str, Any] = {
        "purposes": entry.purposes,
        "note": note,
        "review": entry.review,
        "spec_hash": entry.reviewed_hash,
    }
    if not created:
        details["before"] = before
    audit_record(
        actor=actor,
        action="runtime.allow" if created else "runtime.reapprove",
        object_type="runtime",
        object_id=entry.ref,
        details=details,
    )
    if readable:
        previous = RuntimeVerdict.objects.filter(kind=kind, namespace=namespace, name=name).first()
        _check_and_record(entry, runtime, previous, site_rules())
    return Approval(entry=entry, created=created)


def allow_list_remove(*, actor: AnyUser, entry: AllowListEntry) -> None:
    ref, purposes = entry.ref, entry.purposes
    entry.delete()
    forget_cached_reads()
    audit_record(
        actor=actor,
        action="runtime.disallow",
        object_type="runtime",
        object_id=ref,
        details={"purposes": purposes},
    )


SETTINGS_FIELDS = (
    "allow_rank_restart",
    "publish_via",
    "publish_container",
    "label_domain",
    "trainer_version",
    "recovery_policy",
    "kueue_default_queues",
    "kueue_priority_classes",
    "max_open_sessions_per_user",
)


@dataclass(frozen=True)
class SettingsCheck:
    """What the cluster says of a change of the site settings: field errors ({field: {key: [message]}}, the
    key a namespace or "*") refuse it; warnings (what could not be read) are shown and audited with it."""

    errors: dict[str, dict[str, list[str]]]
    warnings: list[str]


def site_settings_check(*, site: SiteSettings, changes: Mapping[str, Any]) -> SettingsCheck:
    """Read the LocalQueues and WorkloadPriorityClasses that the new or changed Kueue entries name (the "*"
    queue in every known namespace without its own entry: granted by name, or with jobs waiting). A missing
    one is an error; Kueue not installed too (every job of those namespaces would be refused
    queue-not-found). When the cluster cannot be read, the rest is not read and a warning says what was not
    checked."""
    errors: dict[str, dict[str, list[str]]] = {}
    warnings: list[str] = []
    unreadable: list[str] = []
    failure: list[str] = []

    def read(fn: Callable[[], Any], what: str) -> tuple[bool, Any]:
        if unreadable:  # the cluster did not answer: read nothing more
            unreadable.append(what)
            return False, None
        try:
            return True, fn()
        except kueue.KueueNotInstalled:
            raise
        except ClusterError as exc:
            failure.append(str(exc))
            unreadable.append(what)
            return False, None

    queues = changes.get("kueue_default_queues")
    classes = changes.get("kueue_priority_classes")
    try:
        if queues is not None:
            field = "kueue_default_queues"
            reads = settings_checks.queue_reads(site.kueue_default_queues or {}, queues, known_namespaces())
            for key, pairs in reads.items():
                if not pairs:
                    warnings.append(
                        f"{field} {key!r}: no namespace is granted by name or has waiting jobs, so "
                        f"LocalQueue {queues[key]!r} was not checked in any namespace"
                    )
                missing = []
                for namespace, queue in pairs:
                    ok, found = read(
                        partial(kueue.get_local_queue, namespace, queue),
                        f"LocalQueue {namespace}/{queue}",
                    )
                    if ok and found is None:
                        missing.append(namespace)
                if missing:
                    errors.setdefault(field, {})[key] = [
                        settings_checks.missing_queue_message(queues[key], missing)
                    ]
        if classes is not None:
            field = "kueue_priority_classes"
            exists: dict[str, bool] = {}
            for key, names in settings_checks.class_reads(site.kueue_priority_classes or {}, classes).items():
                for name in names:
                    if name not in exists:
                        ok, found = read(
                            partial(kueue.get_priority_class, name), f"WorkloadPriorityClass {name}"
                        )
                        exists[name] = not ok or found is not None
                missing = [n for n in names if not exists[n]]
                if missing:
                    errors.setdefault(field, {})[key] = [settings_checks.missing_class_message(missing)]
    except kueue.KueueNotInstalled:
        message = f"{kueue.not_installed_message()}: every job using this setting would be refused"
        for field, value in (("kueue_default_queues", queues), ("kueue_priority_classes", classes)):
            if value:
                errors[field] = {str(k): [message] for k in value}
    if unreadable:
        warnings.append(
            f"the cluster could not be read ({failure[0]}), so these were not checked: "
            f"{', '.join(unreadable)}"
        )
    return SettingsCheck(errors=errors, warnings=warnings)


@transaction.atomic
def site_settings_update(*, actor: AnyUser, warnings: Sequence[str] = (), **changes: Any) -> SiteSettings:
    unknown = set(changes) - set(SETTINGS_FIELDS)
    if unknown:
        raise ValueError(f"unknown site settings: {', '.join(sorted(unknown))}")
    site = SiteSettings.objects.select_for_update().get_or_create(pk=1)[0]
    before = site.as_dict()
    for name, value in changes.items():
        setattr(site, name, value)
    site.updated_by = actor if isinstance(actor, User) else None
    site.save()
    forget_cached_reads()
    diff: dict[str, Any] = {
        k: {"from": before[k], "to": v} for k, v in site.as_dict().items() if before[k] != v
    }
    if diff and warnings:
        diff["warnings"] = list(warnings)  # saved without the cluster's word on it
    if diff:
        audit_record(
            actor=actor, action="settings.update", object_type="settings", object_id="site", details=diff
        )
    return site
