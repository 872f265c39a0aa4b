"""make chaos (scripts/chaos.py): its judgement (pure: the plan, what each job is expected to end as from the
harness's own tables, what counts as a mismatch or an unexpected plan answer), its broken builds (each still
applies to the code), its API server partition (a real proxy that must refuse), and the short run inside
`make test`: 12 jobs through real processes in the shape `make up` runs them (gunicorn from gunicorn.conf.py,
two threads workers, beat, the pod watch) on a durable PostgreSQL and a Redis the run starts itself on free
ports, while a worker is SIGKILLed holding a start, Redis restarts, PostgreSQL crashes, the API server is cut
off and then killed, the Trainer, JobSet and Kueue controllers are killed, a rank pod is evicted, a KWOK node
is lost, the label domain changes and a stranger makes pods carrying a job's labels. The run's figures must
all be at target, and its report must name the commit, the shape and the durability it ran."""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from scripts import chaos
from scripts.chaos import Hit

REPO = Path(__file__).resolve().parents[2]
RETRY = chaos.POLICIES["retry"]
NO_RETRY = chaos.POLICIES["no-retry"]


# ---------------------------------------------------------------- the plan


def test_the_plan_is_the_seeds_and_every_targeted_fault_has_jobs_of_its_own() -> None:
    one = chaos.make_plan(seed=7, jobs=12, short=True, kueue=False)
    assert one == chaos.make_plan(seed=7, jobs=12, short=True, kueue=False)
    assert one != chaos.make_plan(seed=8, jobs=12, short=True, kueue=False)
    assert len(one.jobs) == 12
    assert {j.kind for j in one.jobs} == {chaos.SUCCEEDS, chaos.APP_ERROR, chaos.UNTIL_CANCELLED, chaos.LONG}
    by_fault = {f.fault: f for f in one.faults}
    assert set(by_fault) == {
        "kill-worker",
        "redis",
        "postgres",
        "api-partition",
        "kill-apiserver",
        "kill-trainer",
        "kill-jobset",
        "eviction",
        "node-loss",
        "label-domain",
        "foreign-pods",
    }
    # The outages never overlap in the short run: each starts at least 16 s after the one before (the
    # partition lasts 12 s there).
    outages = sorted(by_fault[name].at for name in ("redis", "postgres", "api-partition", "kill-apiserver"))
    assert all(b - a >= 16 for a, b in itertools.pairwise(outages)), outages
    for name, count, kind in (
        ("eviction", 1, chaos.LONG),
        ("foreign-pods", 1, chaos.LONG),
        ("node-loss", 3, chaos.UNTIL_CANCELLED),
    ):
        targets = [one.jobs[i] for i in by_fault[name].targets]
        assert len(targets) == count
        assert all(j.kind == kind and j.serves == name and j.at < by_fault[name].at for j in targets)
    # The worker kill has starts to catch whatever the other jobs do: two short jobs submitted as it begins.
    kill_targets = [one.jobs[i] for i in by_fault["kill-worker"].targets]
    assert [j.kind for j in kill_targets] == [chaos.SUCCEEDS, chaos.SUCCEEDS]
    assert all(0 < j.at - by_fault["kill-worker"].at <= 2 for j in kill_targets)
    # The node loss's jobs are cancelled well after the lost node's pods are gone (PodGC: 40-60 s).
    assert all(
        j.at + (j.cancel_after or 0) > by_fault["node-loss"].at + 80
        for j in one.jobs
        if j.serves == "node-loss"
    )
    assert all(j.cancel_after is not None for j in one.jobs if j.kind == chaos.UNTIL_CANCELLED)
    full = chaos.make_plan(seed=1, jobs=200, short=False, kueue=True)
    assert len(full.jobs) == 200
    assert sum(f.fault == "kueue-wave" for f in full.faults) == 1
    assert sum(f.fault == "kill-kueue" for f in full.faults) == 1
    assert sum(f.fault == "eviction" for f in full.faults) == 6
    assert {j.policy for j in full.jobs} == set(chaos.POLICIES)


# ---------------------------------------------------------------- expectations


def test_the_harness_reads_a_policy_as_dispatch_documents_it() -> None:
    """chaos states the retry rule and the merge of the site's default with a job's policy itself (so a broken
    dispatch cannot change what is expected); here both are held against jobs.recovery on every small case,
    so the two cannot drift apart unnoticed."""
    from jobs import recovery

    for override in chaos.POLICIES.values():
        resolved = recovery.resolve(chaos.SITE_DEFAULT_POLICY, override)
        assert chaos.policy_differences(chaos.expected_policy(override), resolved) == [], override
    causes = ["preempted", "evicted", "node-lost", "app-error"]
    policies = [
        chaos.expected_policy(RETRY),
        chaos.expected_policy(NO_RETRY),
        chaos.expected_policy(chaos.POLICIES["site"]),
        recovery.resolve(None, {"retry": {"evicted": 2, "node-lost": 2}, "budgets": {"infrastructure": 1}}),
    ]
    for policy in policies:
        for n in range(3):
            for earlier in itertools.product(causes, repeat=n):
                for cause in causes:
                    assert chaos.retried(policy, list(earlier), cause) == (
                        recovery.decide(policy, list(earlier), cause).retry
                    ), (policy, earlier, cause)


def test_a_plan_answer_the_harness_did_not_expect_is_named() -> None:
    from jobs import recovery

    expected = chaos.expected_policy(RETRY)
    assert chaos.plan_problems(expected, 200, {"recovery_policy": expected, "identity_warnings": []}) == []
    # The site's layer left out (the `plan-policy` break): a job with no policy of its own gets dispatch's
    # built-in default instead of the site's.
    site = chaos.expected_policy(chaos.POLICIES["site"])
    without_site = {"recovery_policy": recovery.resolve(None, None), "identity_warnings": []}
    assert chaos.plan_problems(site, 200, without_site) == [
        "recovery policy retry.preempted: 3, expected 1",
        "recovery policy retry.node-lost: 3, expected 1",
        "recovery policy retry.evicted: 3, expected 1",
        "recovery policy backoff_seconds.preempted: None, expected 2",
        "recovery policy backoff_seconds.node-lost: None, expected 2",
        "recovery policy backoff_seconds.evicted: None, expected 2",
        "recovery policy budgets.infrastructure: 3, expected 2",
    ]
    # Parts and causes the harness does not name are dispatch's built-in default: not judged.
    extra = {**expected, "retry": {**expected["retry"], "cluster-lost": 1}}
    assert chaos.plan_problems(expected, 200, {"recovery_policy": extra, "identity_warnings": []}) == []
    warned = chaos.plan_problems(
        expected, 200, {"recovery_policy": expected, "identity_warnings": ["the JobSet may restart"]}
    )
    assert warned == ["identity warning: the JobSet may restart"]
    assert chaos.plan_problems(expected, 503, None) == ["plan answered 503"]
    assert chaos.plan_problems(expected, None, None) == ["plan answered nothing"]


def test_every_broken_build_still_applies_to_the_code_and_names_a_figure(tmp_path: Path) -> None:
    """A break whose code moved would test nothing: each edit's text is in the checkout exactly once, the
    broken copy carries it, and the checkout itself is left alone."""
    figures = {
        "jobs_accepted", "outcome_mismatches", "unexpected_plan_answers", "attempt_overlap",
        "trainjob_duplicates", "observer_coverage_missing", "observer_errors", "stuck_jobs",
    }  # fmt: skip
    assert {b.figure for b in chaos.BREAKS.values()} <= figures
    for b in chaos.BREAKS.values():
        for edit in b.edits:
            original = (REPO / edit.path).read_text()
            assert edit.new not in original, (b.name, edit.path)
            chaos.apply_edit(original, edit)  # raises unless the text is there once
    copy = chaos.broken_copy("overlap", tmp_path / "checkout")
    [edit] = chaos.BREAKS["overlap"].edits
    assert edit.new in (copy / edit.path).read_text() and edit.new not in (REPO / edit.path).read_text()
    assert (copy / "manage.py").read_text() == (REPO / "manage.py").read_text()
    with pytest.raises(ValueError, match="there 0 times"):
        chaos.apply_edit("nothing", edit)


def test_the_report_names_the_commit_and_whether_the_checkout_differs_from_it(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "first")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True)
    clean = chaos.commit_of(tmp_path)
    assert (clean["sha"], clean["dirty"], clean["subject"]) == (head.stdout.strip(), False, "first")
    (tmp_path / "untracked.txt").write_text("not part of the build\n")
    assert chaos.commit_of(tmp_path)["dirty"] is False
    (tmp_path / "a.txt").write_text("two\n")
    dirty = chaos.commit_of(tmp_path)
    assert dirty["dirty"] is True and dirty["changed"] == [" M a.txt"]


def _expect(kind: str, *, hits: Sequence[Hit] = (), policy: dict[str, Any] = RETRY, cancel: str | None = None,
            fail_rank: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
    return chaos.expected_outcomes(kind=kind, fail_rank=fail_rank, policy=policy, hits=hits, cancel=cancel)


def test_what_each_plan_means() -> None:
    assert _expect(chaos.SUCCEEDS)[0] | {"why": ""} == {
        "state": "succeeded",
        "cause": "",
        "why": "",
        "attempts": 1,
        "attempt_causes": {},
    }
    failed = _expect(chaos.APP_ERROR, fail_rank=1)[0]
    assert (failed["state"], failed["cause"], failed["rank"], failed["exit_code"]) == (
        "failed",
        "app-error",
        1,
        3,
    )
    assert [e["state"] for e in _expect(chaos.UNTIL_CANCELLED, cancel="accepted")] == ["cancelled"]
    assert _expect(chaos.UNTIL_CANCELLED, cancel="accepted")[0]["pods"] == "none"
    # A cancel whose answer never came: either outcome is right.
    assert [e["state"] for e in _expect(chaos.SUCCEEDS, cancel="unknown")] == ["succeeded", "cancelled"]
    # 409: the job had ended; its own outcome stands.
    assert [e["state"] for e in _expect(chaos.SUCCEEDS, cancel="refused")] == ["succeeded"]


def test_a_disruption_ends_the_way_the_policy_says() -> None:
    evicted = Hit("eviction", "evicted", 1, 10.0)
    retried = _expect(chaos.LONG, hits=[evicted])[0]
    assert (retried["state"], retried["attempts"], retried["attempt_causes"]) == (
        "succeeded",
        2,
        {1: "evicted"},
    )
    ended = _expect(chaos.LONG, hits=[evicted], policy=NO_RETRY)[0]
    assert (ended["state"], ended["cause"], ended["attempts"]) == ("failed", "evicted", 1)
    # Two disruptions on attempts 1 and 2, then the budget: 3 infrastructure retries, 2 per cause.
    twice = _expect(chaos.LONG, hits=[evicted, Hit("node-loss", "node-lost", 2, 30.0)])[0]
    assert (twice["state"], twice["attempts"]) == ("succeeded", 3)
    budget = {"retry": {"evicted": 2, "node-lost": 2}, "budgets": {"infrastructure": 1}}
    spent = _expect(chaos.LONG, hits=[evicted, Hit("node-loss", "node-lost", 2, 30.0)], policy=budget)[0]
    assert (spent["state"], spent["cause"], spent["attempts"]) == ("failed", "node-lost", 2)
    # The first disruption of an attempt is its cause; a second one on the same attempt changes nothing.
    first = _expect(chaos.LONG, hits=[Hit("node-loss", "node-lost", 1, 40.0), evicted], policy=NO_RETRY)[0]
    assert first["cause"] == "evicted"
    # A hit on attempt 2 when nothing of this run ended attempt 1: one attempt is expected, so the job's two
    # attempts will show as a mismatch.
    assert _expect(chaos.LONG, hits=[Hit("eviction", "evicted", 2, 9.0)])[0]["attempts"] == 1
    # A preempted low-priority Kueue job: retried as a new attempt.
    preempted = _expect(chaos.KUEUE_LOW, hits=[Hit("kueue-wave", "preempted", 1, 5.0)])[0]
    assert (preempted["state"], preempted["attempts"]) == ("succeeded", 2)


def test_a_kueue_job_may_be_evicted_once_for_pods_not_ready_while_the_api_server_was_down() -> None:
    """With kill-apiserver in the run, a Kueue job whose pods were not Ready within the plane's
    waitForPodsReady timeout is evicted (PodsReadyTimeout) and retried: seen in a short run, a high-priority
    job ended attempt 1 evicted after an 18 s restart. Only that eviction, named, and only with the outage."""

    def seen(message: str) -> dict[str, Any]:
        job = _seen("succeeded", "", ("failed", "evicted"), ("succeeded", ""))
        job["executions"][0]["message"] = message
        return job

    timeout = seen("Kueue evicted the Workload (PodsReadyTimeout): dispatch ended the attempt")
    outage = chaos.expected_outcomes(
        kind=chaos.KUEUE_HIGH, fail_rank=None, policy=RETRY, hits=[], cancel=None, plane_outage=True
    )
    assert chaos.judge_job(outage, timeout, []) == []
    assert chaos.judge_job(_expect(chaos.KUEUE_HIGH), timeout, []) != []  # no outage: one attempt
    preempted = seen("Kueue preempted the Workload (InClusterQueue)")
    assert chaos.judge_job(outage, preempted, []) != []  # another eviction is still a mismatch
    assert len(chaos.expected_outcomes(
        kind=chaos.KUEUE_HIGH, fail_rank=None, policy=NO_RETRY, hits=[], cancel=None, plane_outage=True
    )) == 1  # a policy that does not retry evictions: the job should have failed evicted instead  # fmt: skip
    assert len(chaos.expected_outcomes(
        kind=chaos.SUCCEEDS, fail_rank=None, policy=RETRY, hits=[], cancel=None, plane_outage=True
    )) == 1  # not under Kueue: no PodsReady timeout  # fmt: skip


def test_a_hit_on_an_attempt_whose_start_a_killed_worker_held_counts_once_the_start_could_be_recovered() -> (
    None
):
    """Seed 1 at 81ecc66, job jjympmofjes (runs until cancelled, the site's policy): a worker was killed at
    about 21 s holding its start, right after the TrainJob was created; its rank on the lost node was gone
    at 86.9 s; the cancel was accepted at 150.6 s, when the dead claim had run out 10 s before and the stale
    sweep had not yet enqueued the start again. dispatch never knew attempt 1 existed: cancelled/cancelled,
    one attempt. The harness had expected node-lost on attempt 1 (the hit was more than SEEN_WITHIN before
    the cancel); dispatch may take START_RECOVERY_SECONDS after the kill to know the attempt, and only then
    SEEN_WITHIN to see the hit."""
    node_lost = Hit("node-loss", "node-lost", 1, 86.9)
    site = chaos.expected_policy(chaos.POLICIES["site"])
    seen = _seen("cancelled", "cancelled", ("cancelled", "cancelled"))

    def expect(unseen: dict[int, float] | None, cancel_at: float = 150.6) -> list[dict[str, Any]]:
        return chaos.expected_outcomes(
            kind=chaos.UNTIL_CANCELLED,
            fail_rank=None,
            policy=site,
            hits=[node_lost],
            cancel="accepted",
            cancel_at=cancel_at,
            unseen_until=unseen,
        )

    # Without the held start (the harness at 81ecc66): the run's mismatch.
    assert chaos.judge_job(expect(None), seen, []) == [
        "attempt 1 ended cancelled/cancelled, expected cause 'node-lost'"
    ]
    held = {1: 21.0 + chaos.START_RECOVERY_SECONDS}
    assert chaos.judge_job(expect(held), seen, []) == []
    # A cancel long after the start could have been recovered: the node loss must show on attempt 1.
    late = expect(held, cancel_at=21.0 + chaos.START_RECOVERY_SECONDS + chaos.SEEN_WITHIN + 1)
    assert late[0]["attempt_causes"] == {1: "node-lost"}
    assert chaos.judge_job(late, seen, []) != []
    # Only the attempt whose start was held: a hit on another attempt counts as before.
    assert expect({2: 400.0})[0]["attempt_causes"] == {1: "node-lost"}


def _workload(job: str, attempt: int, reason: str, *, status: str = "True") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"trainjob-{job}-{attempt}-abcde",
            "uid": f"uid-{job}-{attempt}",
            "ownerReferences": [{"kind": "TrainJob", "name": f"{job}-{attempt}"}],
        },
        "status": {
            "conditions": [{"type": "Evicted", "status": status, "reason": reason, "message": reason}]
        },
    }


def test_the_kueue_wave_expects_every_eviction_kueue_made_of_its_jobs() -> None:
    """Seed 1 at 81ecc66: on the loaded plane (its pods took a median 25 s, up to 31 s, to appear for the
    TrainJobs made beside the high job's second attempt) the high job's pods were not Ready within the plane's
    15 s waitForPodsReady timeout twice: Kueue evicted it (PodsReadyTimeout) twice, and each new attempt
    preempted the low job again, which then failed after its 2 preemption retries. The wave watched its
    Workloads only until the first preemption and expected one. Now it watches them until the run is judged,
    and every eviction Kueue made (Preempted, PodsReadyTimeout), seen from outside dispatch, is a hit."""
    from scripts.chaoslib.faults_kueue import _merge_workload, wave_hits

    low, high, other = "ji2c4fx2znq", "jwmcy234zow", "jother"
    clock = iter(range(100, 200, 10))
    events = [
        _workload(low, 1, "Preempted"),
        _workload(high, 1, "PodsReadyTimeout"),
        _workload(low, 2, "Preempted"),
        _workload(high, 2, "PodsReadyTimeout"),
        _workload(low, 3, "Preempted"),
        _workload(other, 1, "PodsReadyTimeout"),  # not the wave's
        _workload(high, 3, "InactiveWorkload"),  # dispatch's own deactivation: not Kueue's eviction
    ]
    records: dict[str, dict[str, Any]] = {}
    for wl in events:
        uid = wl["metadata"]["uid"]
        records[uid] = _merge_workload(
            records.get(uid), wl, "MODIFIED", "now", clock=lambda: float(next(clock))
        )
        # A later version of the same Workload (its Evicted condition as dispatch's deactivation leaves it)
        # keeps the first eviction.
        again = {"metadata": wl["metadata"], "status": _workload(low, 1, "InactiveWorkload")["status"]}
        records[uid] = _merge_workload(records[uid], again, "MODIFIED", "later", clock=lambda: 999.0)
    hits = wave_hits(records.values(), {low, high}, at=500.0)
    by_job: dict[str, list[Hit]] = {}
    for job_id, hit in hits:
        by_job.setdefault(job_id, []).append(hit)
    assert [(h.cause, h.attempt, h.message) for h in by_job[high]] == [
        ("evicted", 1, "PodsReadyTimeout"),
        ("evicted", 2, "PodsReadyTimeout"),
    ]
    assert [(h.cause, h.attempt) for h in by_job[low]] == [
        ("preempted", 1),
        ("preempted", 2),
        ("preempted", 3),
    ]
    assert set(by_job) == {low, high}

    def expect(kind: str, job_hits: list[Hit]) -> list[dict[str, Any]]:
        return chaos.expected_outcomes(
            kind=kind, fail_rank=None, policy=RETRY, hits=job_hits, cancel=None, plane_outage=True
        )

    timeout = "Kueue evicted the Workload (PodsReadyTimeout): dispatch ended the attempt"
    high_seen = _seen("succeeded", "", ("failed", "evicted"), ("failed", "evicted"), ("succeeded", ""))
    for execution in high_seen["executions"][:2]:
        execution["message"] = timeout
    low_seen = _seen(
        "failed", "preempted", ("failed", "preempted"), ("failed", "preempted"), ("failed", "preempted")
    )
    # What the run saw matches what Kueue did.
    assert chaos.judge_job(expect(chaos.KUEUE_HIGH, by_job[high]), high_seen, []) == []
    assert chaos.judge_job(expect(chaos.KUEUE_LOW, by_job[low]), low_seen, []) == []
    # The expectation at 81ecc66 (the first preemption only): the run's two mismatches.
    assert chaos.judge_job(expect(chaos.KUEUE_HIGH, []), high_seen, []) == [
        "3 attempt(s) (1: failed/evicted, 2: failed/evicted, 3: succeeded/-), expected 1"
    ]
    assert chaos.judge_job(expect(chaos.KUEUE_LOW, by_job[low][:1]), low_seen, []) != []
    # An eviction must name its reason on its attempt, and one more than Kueue made is still a mismatch.
    high_seen["executions"][1]["message"] = "Kueue preempted the Workload (InClusterQueue)"
    assert chaos.judge_job(expect(chaos.KUEUE_HIGH, by_job[high]), high_seen, []) == [
        "attempt 2's message does not name PodsReadyTimeout"
    ]
    once = expect(chaos.KUEUE_HIGH, by_job[high][:1])
    high_seen["executions"][1]["message"] = timeout
    assert chaos.judge_job(once, high_seen, []) == []  # the outage's one unobserved eviction, as before
    assert chaos.judge_job(expect(chaos.KUEUE_HIGH, []), high_seen, []) != []


def _seen(state: str, cause: str = "", *attempts: tuple[str, str], **more: Any) -> dict[str, Any]:
    executions = [
        {"attempt": n + 1, "state": s, "cause": c} for n, (s, c) in enumerate(attempts or [(state, cause)])
    ]
    return {
        "state": state,
        "cause": cause,
        "message": more.pop("message", ""),
        "executions": executions,
        **more,
    }


def test_a_mismatch_names_what_was_expected_and_what_was_seen() -> None:
    assert chaos.judge_job(_expect(chaos.SUCCEEDS), _seen("succeeded"), []) == []
    # The label-domain symptom of issue 18 (4): a running job reads cancelled.
    problems = chaos.judge_job(
        _expect(chaos.SUCCEEDS),
        _seen("cancelled", "cancelled", message="the TrainJob is gone: it was deleted outside dispatch"),
        [],
    )
    assert problems == [
        "state 'cancelled' (cause 'cancelled': 'the TrainJob is gone: it was deleted outside dispatch'), "
        "expected 'succeeded'"
    ]
    # A stranger's pod (issue 18 (1)): identity-violation where the plan meant success.
    assert chaos.judge_job(_expect(chaos.LONG), _seen("failed", "identity-violation"), [])
    # Evicted and retried as the policy says: the first attempt carries the cause.
    hits = [Hit("eviction", "evicted", 1, 3.0)]
    good = _seen("succeeded", "", ("failed", "evicted"), ("succeeded", ""))
    assert chaos.judge_job(_expect(chaos.LONG, hits=hits), good, []) == []
    wrong_cause = _seen("succeeded", "", ("failed", "unknown-failure"), ("succeeded", ""))
    assert chaos.judge_job(_expect(chaos.LONG, hits=hits), wrong_cause, []) == [
        "attempt 1 ended failed/unknown-failure, expected cause 'evicted'"
    ]
    not_retried = _seen("failed", "unknown-failure")
    # the state, the number of attempts, the first attempt's cause
    assert len(chaos.judge_job(_expect(chaos.LONG, hits=hits), not_retried, [])) == 3
    # App error: the rank and the exit code.
    assert chaos.judge_job(
        _expect(chaos.APP_ERROR, fail_rank=1), _seen("failed", "app-error", failing_rank=0, exit_code=3), []
    ) == ["failing rank 0, expected 1"]
    # Cancelled, but a pod is left.
    assert chaos.judge_job(
        _expect(chaos.UNTIL_CANCELLED, cancel="accepted"), _seen("cancelled", "cancelled"), ["p-0 (Running)"]
    ) == ["1 pod(s) left: p-0 (Running)"]


# ---------------------------------------------------------------- the outage is real


def _blocked_in_accept(proxy: chaos.Proxy) -> bool:
    """Whether the proxy's accept thread is inside accept() (the kernel's wait channel for it), the state in
    which a listener closed without shutdown() goes on listening. Waits up to 5 s for it."""
    assert proxy.accept_thread is not None
    wchan = Path(f"/proc/self/task/{proxy.accept_thread.native_id}/wchan")
    for _ in range(500):
        if wchan.read_text() == "inet_csk_accept":
            return True
        time.sleep(0.01)
    return False


def test_a_paused_proxy_refuses_connections_and_resumes_on_its_port() -> None:
    """The proxy in front of the API server must really refuse while paused. Closing the listener alone does
    not do it on Linux while the accept thread is blocked on it: the first version of this proxy (the one the
    README's earlier chaos figures came from) kept accepting and forwarding every new connection during its
    "outage"; the run's fault check (verified: refused False) showed it."""
    upstream = socket.create_server(("127.0.0.1", 0))
    held = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(upstream.accept()[0])

    threading.Thread(target=serve, daemon=True).start()
    proxy = chaos.Proxy(upstream.getsockname())
    proxy.start()
    port = proxy.port
    assert proxy.refuses() == (False, "a connection was accepted")
    assert _blocked_in_accept(proxy), "the accept thread never blocked in accept()"
    proxy.pause()
    refused, error = proxy.refuses()
    assert refused, error
    proxy.resume()
    assert proxy.port == port
    assert not proxy.refuses()[0]
    proxy.pause()

    class ClosesOnly(chaos.Proxy):  # the first version's pause()
        def pause(self) -> None:
            if self._listener is not None:
                self._listener.close()
                self._listener = None

    old = ClosesOnly(upstream.getsockname())
    old.start()
    assert _blocked_in_accept(old), "the accept thread never blocked in accept()"
    old.pause()
    assert old.refuses() == (False, "a connection was accepted")  # no outage at all
    upstream.shutdown(socket.SHUT_RDWR)
    upstream.close()
    for conn in held:
        conn.close()


# ---------------------------------------------------------------- the short run


@pytest.mark.cluster
def test_a_short_chaos_run_ends_with_every_figure_at_its_target(
    kubeconfig: str, kueue: None, tmp_path: Path
) -> None:
    """With Kueue running (the module fixture `kueue`), so the run adds its preemption wave."""
    report = tmp_path / "report.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "chaos.py"),
            "--short",
            "--jobs=12",
            "--seed=7",
            f"--kubeconfig={kubeconfig}",
            f"--report={report}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert report.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    figures = json.loads(report.read_text())
    summary = run.stdout[run.stdout.find("chaos run ") :]
    faults = {f["fault"] for f in figures["faults"]}
    assert faults >= {"kill-worker", "redis", "postgres", "api-partition", "kill-apiserver", "eviction",
                      "node-loss", "label-domain", "foreign-pods", "kueue-wave"}, summary  # fmt: skip
    off = {name: f for name, f in figures["figures"].items() if not f["ok"]}
    assert off == {}, summary
    assert figures["identity"]["counts"]["rank_pods_ran"] > 0, figures["identity"]
    assert run.returncode == 0, summary
