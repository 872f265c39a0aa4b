#!/usr/bin/env python3
"""An identity observer outside dispatch: it watches every pod through the API server with its own client and
says whether any rank ran twice under one execution identity (DESIGN.md "execution identity";
reference/status-facts.md §10, identity-violation). It imports nothing of dispatch and reads no dispatch
table, so a broken dispatch build cannot talk it out of a finding.

Identity of a pod, read from what the pod itself runs under (never from dispatch's bookkeeping):

  (namespace, job, attempt A, JobSet restart-attempt J, replicated job, job index, completion index)

- job and A: the env values DISPATCH_JOB / DISPATCH_ATTEMPT. dispatch publishes them (jobs/plan.py
  build_training_runtime) into container `node` of the trainer pod (site publish.via `env`) or into one init
  container (publish.via `initContainer`). The observer takes the `node` container's values, else the first
  init container's, else any other container's; containers that disagree are an anomaly.
- J: the pod label jobset.sigs.k8s.io/restart-attempt. The rank: jobset.sigs.k8s.io/replicatedjob-name,
  jobset.sigs.k8s.io/job-index and batch.kubernetes.io/job-completion-index (label, else annotation).
- The JobSet's and the Job's UIDs are left out on purpose: a JobSet the Trainer recreates (status-facts §12)
  or Jobs Kueue resumes run the same ranks under the same (A, J), which is exactly a rerun.
- The namespace is part of it: a stranger's pod in another namespace that carries the same env is counted
  under its own namespace and is never taken for a dispatch rerun. Pass ``namespaces`` to judge only
  dispatch's namespaces (everything else is counted as outside).

Not a rank (counted, never judged): a pod with no DISPATCH_JOB; an interactive session's pod (jobs/sessions.py
builds a session's objects like a job's, DISPATCH_JOB=<session id>, DISPATCH_ATTEMPT=1, and its pods carry no
session label, so a session is told by its id: "s" + 10 base32 characters where a job id has "j", as
jobs/models.py `_new_session_id` makes it; also by a label `<domain>/session` equal to DISPATCH_JOB, should
pods ever carry one); a pod with DISPATCH_JOB that no Job controls (a bare pod someone made; every dispatch
rank comes from JobSet -> Job).

A pod ran when it was seen in phase Running, or any of its containers (init and sidecar included) has a
running or terminated state with startedAt: code ran in it under the identity. A pod created and deleted while
Pending never ran.

Verdict (pure: records in, verdict out): for every identity at most one pod ever ran ("ran-twice"), and no
non-sidecar container of a rank pod restarted in place: restartCount > 0 or a lastState.terminated
("restarted-in-place"). Nothing is waived: a job whose plan carried an identity warning is judged like every
other (a harness that expects no warning counts the warning itself). Pods of a dispatch job that name no
completion index, carry no DISPATCH_ATTEMPT, or carry two different identities are anomalies. ``ok`` is true
only with no violation and no anomaly.

What else the records show (scripts/identity_verdict.py): `attempt_overlaps` (a pod of attempt A+1 ran before
a pod of A had ended, compared by the resourceVersions of the writes that showed the one running and the other
ended: exact within one API server), `ranks_seen` (the observer's coverage: which ranks of a wanted (job,
attempt) it saw run) and, with ``trainjobs=True``, `trainjob_duplicates` (TrainJobs are watched too, every UID
recorded: more than one UID for one (job, attempt), or one name made again, is a duplicate).

Several clusters (MultiKueue: pods run on the workers): pass several kubeconfigs; every record names its
cluster (the kubeconfig's current context), and a rank that ran on two clusters is one identity run twice.

What cannot fool it: the same UID in many events or in a re-list is one record; a re-list after 410 Gone
keeps every record it had (pods gone meanwhile are marked ``vanished_at``); DELETED events keep the pod's last
state. What it can miss: a pod that lived entirely before start() or entirely inside a 410 gap (between the
expired watch and the re-list); each gap is reported under ``watch.gaps``, and every error of a list or a
watch under ``watch.errors`` (a harness counts both). Give it a kubeconfig that reaches an API server the
faults leave alone (chaos starts a second kube-apiserver on the same etcd for it), not chaos's proxy.

    scripts/identity_observer.py --kubeconfig var/cluster/admin.kubeconfig --out report.json [--duration 600]
    scripts/identity_observer.py --kubeconfig a.kubeconfig --kubeconfig b.kubeconfig --out report.json
    scripts/identity_observer.py --from-report report.json --out again.json   # judge the records again
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: `scripts` from the repository

from scripts.identity_verdict import (
    ATTEMPT_OVERLAP,
    COMPLETION_INDEX,
    ENV_ATTEMPT,
    ENV_JOB,
    IDENTITY_CONFLICT,
    JOB_INDEX,
    NO_ATTEMPT,
    NO_COMPLETION_INDEX,
    RAN_TWICE,
    REPLICATED_JOB,
    RESTART_ATTEMPT,
    RESTARTED_IN_PLACE,
    SESSION_ID,
    TRAINER_CONTAINER,
    TRAINJOB_DUPLICATE,
    _l,
    _m,
    attempt_overlaps,
    mark_vanished,
    now,
    observe,
    observe_trainjob,
    ranks_seen,
    resource_version,
    trainjob_duplicates,
    verdict,
)

__all__ = [
    "ATTEMPT_OVERLAP",
    "COMPLETION_INDEX",
    "ENV_ATTEMPT",
    "ENV_JOB",
    "IDENTITY_CONFLICT",
    "JOB_INDEX",
    "NO_ATTEMPT",
    "NO_COMPLETION_INDEX",
    "RAN_TWICE",
    "REPLICATED_JOB",
    "RESTARTED_IN_PLACE",
    "RESTART_ATTEMPT",
    "SESSION_ID",
    "TRAINER_CONTAINER",
    "TRAINJOB_DUPLICATE",
    "Gone",
    "IdentityObserver",
    "attempt_overlaps",
    "main",
    "mark_vanished",
    "now",
    "observe",
    "observe_trainjob",
    "ranks_seen",
    "trainjob_duplicates",
    "verdict",
]

WATCH_SECONDS: Final = 50  # server-side watch timeout; the stream then ends and resumes from the last version
LIST_PAGE: Final = 500
TRAINJOBS: Final = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")


# ---------------------------------------------------------------- the watcher


class Gone(Exception):
    """410 Gone: the resource version is too old; list again."""


class _Watch:
    """One resource of one cluster, recorded by list + watch from the list's resourceVersion in a thread of
    its own; 410 Gone lists again (a gap), any other error is recorded and the watch resumes."""

    def __init__(
        self,
        *,
        cluster: str,
        resource: str,
        call: Callable[..., Any],
        merge: Callable[[Mapping[str, Any] | None, Mapping[str, Any], str, str], dict[str, Any]],
        stopping: threading.Event,
    ) -> None:
        self.cluster, self.resource, self._call, self._merge_one = cluster, resource, call, merge
        self._stopping = stopping
        self.records: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.thread: threading.Thread | None = None
        self._response: Any = None
        self._rv: str | None = None  # where the watch resumes; None: list first
        self.lists = 0
        self.gaps: list[dict[str, str]] = []  # each 410 Gone: from when the watch expired to the re-list
        self.errors: list[str] = []

    def start(self) -> None:
        self.thread = threading.Thread(
            target=self._run, name=f"observer-{self.cluster}-{self.resource}", daemon=True
        )
        self.thread.start()

    def wake(self) -> None:
        """End a blocked read at once (stop): shutting the socket down ends it."""
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.connection.sock.shutdown(socket.SHUT_RDWR)

    def _error(self, what: str) -> None:
        self.errors.append(f"{now()} {self.cluster} {self.resource}: {what}"[:500])

    def _run(self) -> None:
        delay = 0.5
        while not self._stopping.is_set():
            try:
                if self._rv is None:
                    self.list()
                self._watch()
                delay = 0.5
            except Gone:
                self.gaps.append(
                    {"resource": self.resource, "cluster": self.cluster, "watch_expired_at": now()}
                )
                self._rv = None
            except Exception as exc:
                if self._stopping.is_set():
                    return
                self._error(repr(exc))
                self._stopping.wait(delay)
                delay = min(delay * 2, 5.0)

    def _merge(self, obj: Mapping[str, Any], event: str, at: str) -> None:
        uid = _m(obj.get("metadata")).get("uid")
        if not uid:
            return
        with self.lock:
            self.records[uid] = self._merge_one(self.records.get(uid), obj, event, at)

    def list(self) -> None:
        from kubernetes.client.rest import ApiException

        items: list[Mapping[str, Any]] = []
        token: str | None = None
        while True:
            try:
                response = self._call(
                    limit=LIST_PAGE, _continue=token, _preload_content=False, _request_timeout=(5, 60)
                )
            except ApiException as exc:
                if exc.status == 410 and token:  # the continue token expired: start the list over
                    items, token = [], None
                    continue
                raise
            body = json.loads(response.data)
            items += _l(body.get("items"))
            meta = _m(body.get("metadata"))
            token = meta.get("continue") or None
            if token is None:
                break
        rv = meta.get("resourceVersion")  # every page of one list reports the list's resourceVersion
        at = now()
        listed = set()
        for obj in items:
            self._merge(obj, "LISTED", at)
            listed.add(_m(obj.get("metadata")).get("uid"))
        with self.lock:
            for uid, record in self.records.items():
                if uid not in listed:
                    self.records[uid] = mark_vanished(record, at=at, rv=resource_version(rv))
        if self.gaps and "relisted_at" not in self.gaps[-1]:
            self.gaps[-1]["relisted_at"] = at
        self.lists += 1
        if not self._stopping.is_set():
            self._rv = rv
        self.synced.set()

    def _watch(self) -> None:
        from kubernetes.client.rest import ApiException

        try:
            response = self._call(
                watch=True,
                resource_version=self._rv,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_SECONDS,
                _preload_content=False,
                _request_timeout=(5, WATCH_SECONDS + 30),
            )
        except ApiException as exc:
            if exc.status == 410:
                raise Gone() from exc
            raise
        self._response = response
        try:
            for line in _lines(response):
                event = json.loads(line)
                kind, obj = event.get("type"), _m(event.get("object"))
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise RuntimeError(f"watch error: {obj.get('code')} {obj.get('message')}")
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._merge(obj, kind, now())
                rv = _m(obj.get("metadata")).get("resourceVersion")
                if rv:
                    self._rv = rv
        finally:
            self._response = None
            with contextlib.suppress(Exception):
                response.release_conn()


class IdentityObserver:
    """Records every pod (and, with ``trainjobs``, every TrainJob) of one or more clusters, each by list +
    watch in a background thread. start() returns once every first list is recorded, so objects created
    afterwards are all seen."""

    def __init__(
        self,
        kubeconfig: str | Sequence[str],
        *,
        context: str | None = None,
        trainjobs: bool = False,
    ) -> None:
        from kubernetes import client, config

        kubeconfigs = [kubeconfig] if isinstance(kubeconfig, str) else list(kubeconfig)
        self._stopping = threading.Event()
        self._api_clients: list[Any] = []
        self.pods: list[_Watch] = []
        self.trainjobs: list[_Watch] = []
        names = cluster_names(kubeconfigs, context)
        for path, name in zip(kubeconfigs, names, strict=True):
            api_client = config.new_client_from_config(config_file=path, context=context)
            self._api_clients.append(api_client)
            core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
            self.pods.append(
                _Watch(
                    cluster=name,
                    resource="pods",
                    call=core.list_pod_for_all_namespaces,
                    merge=functools.partial(_merge_pod, cluster=name),
                    stopping=self._stopping,
                )
            )
            if trainjobs:
                self.trainjobs.append(
                    _Watch(
                        cluster=name,
                        resource="trainjobs",
                        call=functools.partial(custom.list_cluster_custom_object, *TRAINJOBS),
                        merge=functools.partial(_merge_trainjob, cluster=name),
                        stopping=self._stopping,
                    )
                )
        self.started_at: str | None = None
        self.stopped_at: str | None = None

    @property
    def _watches(self) -> list[_Watch]:
        return [*self.pods, *self.trainjobs]

    # -- lifecycle

    def start(self, timeout: float = 60) -> IdentityObserver:
        self.started_at = now()
        for watch in self._watches:
            watch.start()
        deadline = time.monotonic() + timeout
        for watch in self._watches:
            if not watch.synced.wait(max(0.0, deadline - time.monotonic())):
                self.stop()
                raise RuntimeError(
                    f"identity observer: no {watch.resource} list"
                    f"{f' from {watch.cluster}' if watch.cluster else ''} within {timeout}s: "
                    f"{watch.errors[-3:]}"
                )
        return self

    def stop(self, timeout: float = 30) -> None:
        self._stopping.set()
        for watch in self._watches:
            watch.wake()
        for watch in self._watches:
            if watch.thread is not None:
                watch.thread.join(timeout)
        for watch in self._watches:
            try:  # one last look, so what happened just before stop() is in
                watch.list()
            except Exception as exc:
                watch.errors.append(f"{now()} {watch.cluster} {watch.resource} final list: {exc!r}")
        self.stopped_at = now()
        for api_client in self._api_clients:
            api_client.close()

    def records(self) -> list[dict[str, Any]]:
        """The pods' records."""
        return _records(self.pods)

    def trainjob_records(self) -> list[dict[str, Any]]:
        return _records(self.trainjobs)

    def verdict(self, *, namespaces: Collection[str] | None = None) -> dict[str, Any]:
        return {**verdict(self.records(), namespaces=namespaces), "watch": self.watch_summary()}

    def watch_summary(self) -> dict[str, Any]:
        gaps = [g for w in self._watches for g in w.gaps]
        return {
            "started_at": self.started_at,
            "stopped_at": self.stopped_at,
            "clusters": sorted({w.cluster for w in self._watches}),
            "resources": sorted({w.resource for w in self._watches}),
            "lists": sum(w.lists for w in self.pods),
            "complete": not gaps,  # False: an object may have lived and gone inside a gap unseen
            "gaps": gaps,
            "errors": [e for w in self._watches for e in w.errors],
        }

    def report(self, *, namespaces: Collection[str] | None = None) -> dict[str, Any]:
        records = sorted(self.records(), key=lambda r: (r["first_seen"], str(r["uid"])))
        trainjobs = sorted(self.trainjob_records(), key=lambda r: (r["first_seen"], str(r["uid"])))
        return {
            "verdict": verdict(records, namespaces=namespaces),
            "attempt_overlaps": attempt_overlaps(records, namespaces=namespaces),
            "trainjob_duplicates": trainjob_duplicates(trainjobs, namespaces=namespaces),
            "watch": self.watch_summary(),
            "records": records,
            "trainjob_records": trainjobs,
        }


def _merge_pod(
    record: Mapping[str, Any] | None, obj: Mapping[str, Any], event: str, at: str, *, cluster: str
) -> dict[str, Any]:
    return observe(record, obj, event=event, at=at, cluster=cluster)


def _merge_trainjob(
    record: Mapping[str, Any] | None, obj: Mapping[str, Any], event: str, at: str, *, cluster: str
) -> dict[str, Any]:
    return observe_trainjob(record, obj, event=event, at=at, cluster=cluster)


def _records(watches: Iterable[_Watch]) -> list[dict[str, Any]]:
    found = []
    for watch in watches:
        with watch.lock:
            found += [dict(r) for r in watch.records.values()]
    return found


def cluster_names(kubeconfigs: Sequence[str], context: str | None) -> list[str]:
    """The names the clusters' records carry: "" for one cluster; else each kubeconfig's context (the one
    given, or its current-context), and where two would carry the same one (the local planes' kubeconfigs all
    say `dispatch-local`) the kubeconfig file's name without its suffix (worker-1), or its path. Distinct
    names matter: resourceVersions compare only within one API server, and a TrainJob of one name on two
    clusters (MultiKueue's copy) is not a duplicate."""
    if len(kubeconfigs) == 1:
        return [""]
    names = [context or _current_context(path) for path in kubeconfigs]
    if len(set(names)) == len(names):
        return names
    stems = [Path(path).name.split(".")[0] for path in kubeconfigs]
    return stems if len(set(stems)) == len(stems) else [str(path) for path in kubeconfigs]


def _current_context(kubeconfig: str) -> str:
    import yaml

    with open(kubeconfig) as f:
        return str((yaml.safe_load(f) or {}).get("current-context") or kubeconfig)


def _lines(response: Any) -> Iterator[bytes]:
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from (line for line in complete if line.strip())
    if pending.strip():
        yield pending


# ---------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--kubeconfig",
        action="append",
        help="a kubeconfig that reaches an API server directly (repeatable: one per cluster)",
    )
    parser.add_argument("--context")
    parser.add_argument("--out", required=True, help="where the JSON report goes")
    parser.add_argument("--duration", type=float, help="seconds to watch (default: until SIGTERM or SIGINT)")
    parser.add_argument("--namespace", action="append", help="judge only these namespaces (repeatable)")
    parser.add_argument("--trainjobs", action="store_true", help="watch TrainJobs too (duplicates by UID)")
    parser.add_argument("--from-report", help="judge the records of an earlier report instead of watching")
    args = parser.parse_args(argv)
    namespaces = set(args.namespace) if args.namespace else None

    if args.from_report:
        with open(args.from_report) as f:
            earlier = json.load(f)
        trainjobs = earlier.get("trainjob_records") or []
        report = {
            "verdict": verdict(earlier["records"], namespaces=namespaces),
            "attempt_overlaps": attempt_overlaps(earlier["records"], namespaces=namespaces),
            "trainjob_duplicates": trainjob_duplicates(trainjobs, namespaces=namespaces),
            "watch": earlier.get("watch"),
            "records": earlier["records"],
            "trainjob_records": trainjobs,
        }
    else:
        if not args.kubeconfig:
            parser.error("--kubeconfig is needed unless --from-report is given")
        done = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        observer = IdentityObserver(args.kubeconfig, context=args.context, trainjobs=args.trainjobs).start()
        what = "pods and TrainJobs" if args.trainjobs else "pods"
        print(f"[identity-observer] watching {what}; report to {args.out}", file=sys.stderr, flush=True)
        done.wait(args.duration)
        observer.stop()
        report = observer.report(namespaces=namespaces)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    ok = report["verdict"]["ok"] and not report["attempt_overlaps"] and not report["trainjob_duplicates"]
    summary = {
        "ok": ok,
        **report["verdict"]["counts"],
        "attempt_overlaps": len(report["attempt_overlaps"]),
        "trainjob_duplicates": len(report["trainjob_duplicates"]),
    }
    print(json.dumps(summary), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
