"""Reads: site rules, the allow-list, latest verdicts, and the runtimes overview the API and pages show."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from django.db.models import Max

from cluster import gateway
from cluster.errors import ClusterError
from cluster.gateway import RuntimeObject
from dispatch_site import roles, sql
from dispatch_site.names import MANAGED_BY, MANAGED_BY_LABEL
from dispatch_site.readcache import ReadCache
from dispatch_site.roles import AnyUser
from runtimes.models import AllowListEntry, RuntimeKind, RuntimeVerdict, SiteSettings, runtime_ref
from runtimes.reasons import RUNTIME_CHANGED_SINCE_REVIEW, SiteRules, Verdict
from runtimes.rules import check_runtime
from runtimes.settings_checks import Impact, settings_impact

RuntimeKey = tuple[str, str, str]  # (kind, namespace or "", name)


# Reads that may be a moment old for plan and for accepting a submission (many requests ask about the same
# runtime); starting an execution always reads afresh. A write in this process clears them at once.
_site_cache: ReadCache[SiteSettings] = ReadCache()
_allow_cache: ReadCache[AllowListEntry | None] = ReadCache()


def forget_cached_reads() -> None:
    _site_cache.clear()
    _allow_cache.clear()


def site_settings(*, max_age: float = 0.0) -> SiteSettings:
    return _site_cache.get("site", max_age, SiteSettings.load)


# The site settings keyed by namespace: which namespaces exist and what their queues are called belong to the
# teams granted them.
PER_NAMESPACE_SETTINGS = ("kueue_default_queues", "kueue_priority_classes")


def site_settings_seen_by(user: AnyUser, site: SiteSettings | None = None) -> SiteSettings:
    """The site settings as `user` may read them: the platform role reads them all; anybody else reads, of
    the per-namespace settings, the "*" entry and the entries of the namespaces granted to them (another
    team's namespace names and queue names are that team's). An unsaved copy: never written back."""
    site = site or SiteSettings.load()
    if roles.is_platform(user):
        return site
    readable = roles.namespace_reader(user)
    seen = copy.copy(site)
    for name in PER_NAMESPACE_SETTINGS:
        entries = getattr(site, name) or {}
        shown = {ns: v for ns, v in entries.items() if ns == roles.ALL_NAMESPACES or readable(ns)}
        setattr(seen, name, shown)
    return seen


def granted_namespaces() -> set[str]:
    """The namespaces granted by name to a user or a group (a "*" grant names none)."""
    from dispatch_site.models import NamespaceGrant

    named = NamespaceGrant.objects.exclude(namespace=roles.ALL_NAMESPACES)
    return set(named.values_list("namespace", flat=True).distinct())


# Jobs waiting (pending or queued) per namespace: jobs/ registers the counter at start (jobs.apps), since the
# jobs are above this layer. Without it (runtimes alone) no job waits.
_waiting_jobs: list[Callable[[], dict[str, int]]] = []


def register_waiting_jobs_counter(counter: Callable[[], dict[str, int]]) -> None:
    _waiting_jobs[:] = [counter]


def waiting_jobs() -> dict[str, int]:
    return _waiting_jobs[0]() if _waiting_jobs else {}


def known_namespaces() -> set[str]:
    """The namespaces dispatch knows of: granted by name, or with jobs waiting."""
    return granted_namespaces() | {ns for ns, n in waiting_jobs().items() if n}


def settings_change_impact(*, site: SiteSettings, changes: dict[str, Any]) -> Impact:
    """What saving `changes` would affect: the known namespaces (granted, or with waiting jobs) whose jobs
    see another setting, and how many jobs wait in them."""
    before = site.as_dict()
    after = before | {k: v for k, v in changes.items() if k in before}
    return settings_impact(before, after, granted_namespaces(), waiting_jobs())


def site_rules(site: SiteSettings | None = None) -> SiteRules:
    site = site or SiteSettings.load()
    return SiteRules(
        allow_rank_restart=site.allow_rank_restart,
        publish_via=site.publish_via,
        publish_container=site.publish_container,
    )


def allow_list_entries() -> dict[RuntimeKey, AllowListEntry]:
    return {(e.kind, e.namespace, e.name): e for e in AllowListEntry.objects.all()}


def allow_list_entry(kind: str, namespace: str, name: str, *, max_age: float = 0.0) -> AllowListEntry | None:
    key = (kind, namespace, name)
    return _allow_cache.get(key, max_age, lambda: _read_allow_list_entry(*key))


@cache
def _allow_list_entry_sql() -> str:
    return (
        f"SELECT {sql.columns(AllowListEntry, 'a').select} FROM {sql.table(AllowListEntry)} a "
        "WHERE a.kind = %s AND a.namespace = %s AND a.name = %s"
    )


def _read_allow_list_entry(kind: str, namespace: str, name: str) -> AllowListEntry | None:
    """One written-out statement (dispatch_site.sql): every start reads the entry afresh."""
    row = sql.fetch_one(_allow_list_entry_sql(), [kind, namespace, name])
    if row is None:
        return None
    entry = sql.columns(AllowListEntry, "a").instance(row)
    assert isinstance(entry, AllowListEntry)
    return entry


def latest_verdicts() -> dict[RuntimeKey, RuntimeVerdict]:
    """The newest recorded verdict of every runtime, in two queries however many there are."""
    newest = (
        RuntimeVerdict.objects.values("kind", "namespace", "name").annotate(last=Max("id")).values("last")
    )
    return {(v.kind, v.namespace, v.name): v for v in RuntimeVerdict.objects.filter(id__in=newest)}


def verdict_history(kind: str, namespace: str, name: str, limit: int = 50) -> list[RuntimeVerdict]:
    return list(RuntimeVerdict.objects.filter(kind=kind, namespace=namespace, name=name)[:limit])


@dataclass
class RuntimeRow:
    kind: str
    namespace: str
    name: str
    allow_listed: bool
    entry: AllowListEntry | None
    verdict: dict[str, Any]
    source: str  # "live": checked now against the cluster; "recorded": the last re-check (cluster unreadable)
    resource_version: str = ""
    checked_at: Any = None
    body: dict[str, Any] | None = None

    @property
    def ref(self) -> str:
        return runtime_ref(self.kind, self.namespace, self.name)

    @property
    def changed_since_review(self) -> bool:
        codes = [r.get("code") for r in (self.verdict or {}).get("reasons") or []]
        return RUNTIME_CHANGED_SINCE_REVIEW in codes

    @property
    def key(self) -> RuntimeKey:
        return (self.kind, self.namespace, self.name)


@dataclass
class RuntimesOverview:
    rows: list[RuntimeRow] = field(default_factory=list)
    cluster_error: str = ""


def _live_row(
    obj: RuntimeObject | None, key: RuntimeKey, entry: AllowListEntry | None, rules: SiteRules
) -> RuntimeRow:
    kind, namespace, name = key
    verdict: Verdict = check_runtime(
        obj.body if obj else None,
        rules=rules,
        allow_listed=entry is not None,
        ref=runtime_ref(*key),
        review=entry.as_review() if entry is not None else None,
    )
    return RuntimeRow(
        kind=kind,
        namespace=namespace,
        name=name,
        allow_listed=entry is not None,
        entry=entry,
        verdict=verdict.to_dict(),
        source="live",
        resource_version=obj.resource_version if obj else "",
        body=obj.body if obj else None,
    )


def _recorded_row(
    key: RuntimeKey, entry: AllowListEntry | None, recorded: RuntimeVerdict | None
) -> RuntimeRow:
    """A row from the last recorded verdict, for when the cluster cannot be read."""
    return RuntimeRow(
        *key,
        allow_listed=entry is not None,
        entry=entry,
        verdict=recorded.verdict if recorded else {},
        source="recorded",
        resource_version=recorded.resource_version if recorded else "",
        checked_at=recorded.checked_at if recorded else None,
        body=recorded.runtime if recorded and not is_dispatch_copy(recorded.runtime) else None,
    )


def is_dispatch_copy(body: dict[str, Any] | None) -> bool:
    """dispatch's own per-job TrainingRuntime copy: its name and labels carry a job id, so it is never shown
    or used as a runtime (start makes it; only the job that owns it refers to it)."""
    labels = ((body or {}).get("metadata") or {}).get("labels") or {}
    return bool(labels.get(MANAGED_BY_LABEL) == MANAGED_BY)


def _shown(obj: RuntimeObject | None) -> RuntimeObject | None:
    return None if obj is None or is_dispatch_copy(obj.body) else obj


def get_runtime(kind: str, namespace: str, name: str, *, max_age: float = 0.0) -> RuntimeObject | None:
    """The runtime a job names, or None when it does not exist or is one of dispatch's own copies."""
    return _shown(gateway.get_runtime(kind, namespace, name, max_age=max_age))


def runtime_readable(user: AnyUser) -> Callable[[RuntimeKey], bool]:
    """ClusterTrainingRuntimes for everyone; TrainingRuntimes from the caller's granted namespaces (the
    platform role: all). Every page and answer that shows a runtime keeps only these."""
    may_read = roles.namespace_reader(user)
    return lambda key: key[0] == RuntimeKind.CLUSTER or may_read(key[1])


_readable = runtime_readable


def cluster_error_for(user: AnyUser, exc: ClusterError) -> str:
    """What a user is told when the cluster cannot be read: the API server's own text for the platform role
    only (it can name other namespaces and the server's address)."""
    if roles.is_platform(user):
        return str(exc)
    return "the Kubernetes API server could not be read (the platform role sees why): recorded verdicts shown"


def runtimes_overview(user: AnyUser) -> RuntimesOverview:
    """The runtimes the user may read: allow-listed entries and the cluster's other runtimes, each with its
    verdict. dispatch's own per-job copies are never among them.

    Reads the cluster with one list call per kind and checks each runtime (a pure, cheap function);
    when the cluster cannot be read, falls back to the verdicts the last re-check recorded.
    """
    readable = _readable(user)
    entries = {key: entry for key, entry in allow_list_entries().items() if readable(key)}
    rules = site_rules()
    try:
        listed = gateway.list_runtimes()
    except ClusterError as exc:
        recorded = latest_verdicts()
        rows = [_recorded_row(key, entry, recorded.get(key)) for key, entry in entries.items()]
        return RuntimesOverview(rows=rows, cluster_error=cluster_error_for(user, exc))
    live = {
        (o.kind, o.namespace, o.name): o
        for o in listed
        if not is_dispatch_copy(o.body) and readable((o.kind, o.namespace, o.name))
    }
    keys = sorted(set(entries) | set(live), key=lambda k: (k not in entries, k))
    return RuntimesOverview(rows=[_live_row(live.get(k), k, entries.get(k), rules) for k in keys])


def runtime_detail(user: AnyUser, kind: str, namespace: str, name: str) -> tuple[RuntimeRow | None, str]:
    """One runtime the user may read, with its live verdict (or the recorded one when the cluster is
    unreadable). None when it does not exist, is a dispatch copy, or lives in a namespace the user may not
    read: the caller answers all three alike (404), so nothing tells them apart."""
    key = (kind, namespace, name)
    if not _readable(user)(key):
        return None, ""
    entry = allow_list_entry(kind, namespace, name)
    try:
        obj = get_runtime(kind, namespace, name)
    except ClusterError as exc:
        recorded = latest_verdicts().get(key)
        if entry is None and recorded is None:
            return None, cluster_error_for(user, exc)
        return _recorded_row(key, entry, recorded), cluster_error_for(user, exc)
    if obj is None and entry is None:
        return None, ""
    return _live_row(obj, key, entry, site_rules()), ""
