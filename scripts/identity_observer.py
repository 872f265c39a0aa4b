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
("restarted-in-place"). Findings of jobs whose plan carried the identity warning (``allowed_jobs``: the caller
takes them from the plan API's answers) are listed under ``allowed``, not as violations. Pods of a dispatch
job that name no completion index, carry no DISPATCH_ATTEMPT, or carry two different identities are
anomalies. ``ok`` is true only with no violation and no anomaly.

What cannot fool it: the same UID in many events or in a re-list is one record; a re-list after 410 Gone
keeps every record it had (pods gone meanwhile are marked ``vanished_at``); DELETED events keep the pod's last
state. What it can miss: a pod that lived entirely before start() or entirely inside a 410 gap (between the
expired watch and the re-list); each gap is reported under ``watch.gaps``. Give it a kubeconfig that reaches
the API server directly (not chaos's proxy, which is meant to fail).

    scripts/identity_observer.py --kubeconfig var/cluster/admin.kubeconfig --out report.json [--duration 600]
    scripts/identity_observer.py --from-report report.json --allow-job jabc --out again.json   # re-judge
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import sys
import threading
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: `scripts` from the repository

from scripts.identity_verdict import (
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
    _l,
    _m,
    mark_vanished,
    now,
    observe,
    verdict,
)

__all__ = [
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
    "Gone",
    "IdentityObserver",
    "main",
    "mark_vanished",
    "now",
    "observe",
    "verdict",
]

WATCH_SECONDS: Final = 50  # server-side watch timeout; the stream then ends and resumes from the last version
LIST_PAGE: Final = 500


# ---------------------------------------------------------------- the watcher


class Gone(Exception):
    """410 Gone: the resource version is too old; list again."""


class IdentityObserver:
    """Records every pod of the cluster, by list + watch from the list's resourceVersion, in a background
    thread. start() returns once the first list is recorded, so pods created afterwards are all seen."""

    def __init__(self, kubeconfig: str, *, context: str | None = None) -> None:
        from kubernetes import client, config

        self._api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
        self._core: Any = client.CoreV1Api(self._api_client)
        self._records: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None
        self._rv: str | None = None  # where the watch resumes; None: list first
        self.started_at: str | None = None
        self.stopped_at: str | None = None
        self.lists = 0
        self.gaps: list[dict[str, str]] = []  # each 410 Gone: from when the watch expired to the re-list
        self.errors: list[str] = []

    # -- lifecycle

    def start(self, timeout: float = 60) -> IdentityObserver:
        self.started_at = now()
        self._thread = threading.Thread(target=self._run, name="identity-observer", daemon=True)
        self._thread.start()
        if not self._synced.wait(timeout):
            self.stop()
            raise RuntimeError(f"identity observer: no pod list within {timeout}s: {self.errors[-3:]}")
        return self

    def stop(self, timeout: float = 30) -> None:
        self._stopping.set()
        response = self._response
        if response is not None:  # wake the blocked read: shutting the socket down ends it at once
            with contextlib.suppress(Exception):
                response.connection.sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout)
        try:  # one last look, so what happened just before stop() is in
            self._list()
        except Exception as exc:
            self.errors.append(f"{now()} final list: {exc!r}")
        self.stopped_at = now()
        self._api_client.close()

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._records.values()]

    def verdict(
        self, *, allowed_jobs: Collection[str] = (), namespaces: Collection[str] | None = None
    ) -> dict[str, Any]:
        return {
            **verdict(self.records(), allowed_jobs=allowed_jobs, namespaces=namespaces),
            "watch": self.watch_summary(),
        }

    def watch_summary(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at,
            "stopped_at": self.stopped_at,
            "lists": self.lists,
            "complete": not self.gaps,  # False: a pod may have lived and gone inside a gap unseen
            "gaps": list(self.gaps),
            "errors": list(self.errors),
        }

    def report(
        self, *, allowed_jobs: Collection[str] = (), namespaces: Collection[str] | None = None
    ) -> dict[str, Any]:
        records = sorted(self.records(), key=lambda r: (r["first_seen"], str(r["uid"])))
        return {
            "verdict": verdict(records, allowed_jobs=allowed_jobs, namespaces=namespaces),
            "watch": self.watch_summary(),
            "records": records,
        }

    # -- the loop

    def _run(self) -> None:
        delay = 0.5
        while not self._stopping.is_set():
            try:
                if self._rv is None:
                    self._list()
                self._watch()
                delay = 0.5
            except Gone:
                self.gaps.append({"watch_expired_at": now()})
                self._rv = None
            except Exception as exc:
                if self._stopping.is_set():
                    return
                self.errors.append(f"{now()} {exc!r}"[:500])
                self._stopping.wait(delay)
                delay = min(delay * 2, 5.0)

    def _merge(self, pod: Mapping[str, Any], event: str, at: str) -> None:
        uid = _m(pod.get("metadata")).get("uid")
        if not uid:
            return
        with self._lock:
            self._records[uid] = observe(self._records.get(uid), pod, event=event, at=at)

    def _list(self) -> None:
        from kubernetes.client.rest import ApiException

        pods: list[Mapping[str, Any]] = []
        token: str | None = None
        while True:
            try:
                response = self._core.list_pod_for_all_namespaces(
                    limit=LIST_PAGE, _continue=token, _preload_content=False, _request_timeout=(5, 60)
                )
            except ApiException as exc:
                if exc.status == 410 and token:  # the continue token expired: start the list over
                    pods, token = [], None
                    continue
                raise
            body = json.loads(response.data)
            pods += _l(body.get("items"))
            meta = _m(body.get("metadata"))
            token = meta.get("continue") or None
            if token is None:
                break
        rv = meta.get("resourceVersion")  # every page of one list reports the list's resourceVersion
        at = now()
        listed = set()
        for pod in pods:
            self._merge(pod, "LISTED", at)
            listed.add(_m(pod.get("metadata")).get("uid"))
        with self._lock:
            for uid, record in self._records.items():
                if uid not in listed:
                    self._records[uid] = mark_vanished(record, at=at)
        if self.gaps and "relisted_at" not in self.gaps[-1]:
            self.gaps[-1]["relisted_at"] = at
        self.lists += 1
        if not self._stopping.is_set():
            self._rv = rv
        self._synced.set()

    def _watch(self) -> None:
        from kubernetes.client.rest import ApiException

        try:
            response = self._core.list_pod_for_all_namespaces(
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


def _lines(response: Any) -> Iterator[bytes]:
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from (line for line in complete if line.strip())
    if pending.strip():
        yield pending


# ---------------------------------------------------------------- CLI


def _allowed(args: argparse.Namespace) -> set[str]:
    jobs = set(args.allow_job or ())
    if args.allowed_jobs_file:
        with open(args.allowed_jobs_file) as f:
            jobs |= {line.strip() for line in f if line.strip()}
    return jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig", help="a kubeconfig that reaches the API server directly")
    parser.add_argument("--context")
    parser.add_argument("--out", required=True, help="where the JSON report goes")
    parser.add_argument("--duration", type=float, help="seconds to watch (default: until SIGTERM or SIGINT)")
    parser.add_argument("--namespace", action="append", help="judge only these namespaces (repeatable)")
    parser.add_argument("--allow-job", action="append", help="a job whose plan carried the identity warning")
    parser.add_argument(
        "--allowed-jobs-file", help="more such job ids, one a line; read when the report is written"
    )
    parser.add_argument("--from-report", help="judge the records of an earlier report instead of watching")
    args = parser.parse_args(argv)
    namespaces = set(args.namespace) if args.namespace else None

    if args.from_report:
        with open(args.from_report) as f:
            earlier = json.load(f)
        report = {
            "verdict": verdict(earlier["records"], allowed_jobs=_allowed(args), namespaces=namespaces),
            "watch": earlier.get("watch"),
            "records": earlier["records"],
        }
    else:
        if not args.kubeconfig:
            parser.error("--kubeconfig is needed unless --from-report is given")
        done = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        observer = IdentityObserver(args.kubeconfig, context=args.context).start()
        print(f"[identity-observer] watching pods; report to {args.out}", file=sys.stderr, flush=True)
        done.wait(args.duration)
        observer.stop()
        report = observer.report(allowed_jobs=_allowed(args), namespaces=namespaces)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    print(json.dumps({"ok": report["verdict"]["ok"], **report["verdict"]["counts"]}), flush=True)
    return 0 if report["verdict"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
