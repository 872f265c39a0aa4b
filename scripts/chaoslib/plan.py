"""The chaos run's plan (pure): every job's kind, policy and moment, every fault's moment, all from the seed,
so a failing run can be replayed."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

SUCCEEDS: Final = "succeeds"
APP_ERROR: Final = "app-error"
UNTIL_CANCELLED: Final = "runs-until-cancelled"
LONG: Final = "long"
KUEUE_LOW: Final = "kueue-low"
KUEUE_HIGH: Final = "kueue-high"
KIND_WEIGHTS: Final = {SUCCEEDS: 55, APP_ERROR: 10, UNTIL_CANCELLED: 20, LONG: 15}
OUTAGES: Final = ("redis", "postgres", "api-partition", "kill-apiserver")
CONTROLLERS: Final = ("kill-trainer", "kill-jobset")

# The site's default recovery policy, as the run sets it (PATCH /api/v1/settings) before any job: every part
# of dispatch's built-in default it names, so the policy a job runs under is this table merged with the job's
# own (POLICIES), per part and cause, and nothing of dispatch's (expected_policy). It retries what the run's
# faults do once, so a job on the site's policy ends differently from one on `retry` or `no-retry`.
SITE_DEFAULT_POLICY: Final[dict[str, dict[str, int]]] = {
    "retry": {"preempted": 1, "node-lost": 1, "evicted": 1, "no-capacity": 0, "app-error": 0, "oom": 0},
    "backoff_seconds": {"preempted": 2, "node-lost": 2, "evicted": 2},
    "budgets": {"infrastructure": 2, "user": 0},
}

# The jobs' own recovery policies (the submission's `recovery_policy`), by name; `site`: none of its own.
POLICIES: Final[dict[str, dict[str, Any]]] = {
    "retry": {
        "retry": {"preempted": 2, "evicted": 2, "node-lost": 2},
        "backoff_seconds": {"preempted": 1, "evicted": 1, "node-lost": 1},
        "budgets": {"infrastructure": 3},
    },
    "no-retry": {"retry": {"preempted": 0, "evicted": 0, "node-lost": 0}},
    "site": {},
}


def expected_policy(override: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """The policy a job runs under, from the harness's tables alone: the site's default the run set, then the
    job's own, per part and cause (the documented merge; DESIGN.md, recovery policies). Pure."""
    merged = {part: dict(values) for part, values in SITE_DEFAULT_POLICY.items()}
    for part in merged:
        merged[part].update(override.get(part) or {})
    return merged


def policy_differences(expected: Mapping[str, Any], answered: Mapping[str, Any] | None) -> list[str]:
    """Where a policy dispatch answered differs from the expected one, for every part and cause the
    expectation names (parts and causes it does not name are dispatch's built-in default: not judged).
    Pure."""
    if not isinstance(answered, Mapping):
        return [f"no recovery policy in the answer ({answered!r})"]
    found = []
    for part, values in expected.items():
        given = answered.get(part)
        given = given if isinstance(given, Mapping) else {}
        for cause, value in values.items():
            if given.get(cause) != value:
                found.append(f"{part}.{cause}: {given.get(cause)!r}, expected {value!r}")
    return found


@dataclass(frozen=True)
class JobPlan:
    index: int
    kind: str
    at: float  # seconds after the start of the load
    policy: str  # a key of POLICIES
    cancel_after: float | None = None
    fail_rank: int | None = None
    duration: float = 2.0
    serves: str | None = None  # the fault this job is submitted for (its target)


@dataclass(frozen=True)
class FaultPlan:
    at: float
    fault: str
    pick: int  # a seeded number the fault uses to choose among what it finds (worker, rank, ...)
    targets: tuple[int, ...] = ()  # plan indexes of the jobs submitted for it


@dataclass(frozen=True)
class RunPlan:
    jobs: tuple[JobPlan, ...]
    faults: tuple[FaultPlan, ...]
    submit_phase: float
    long_duration: float
    kueue_low_duration: float  # the Kueue wave's low jobs: still running when a late high job arrives


def make_plan(*, seed: int, jobs: int, short: bool, kueue: bool) -> RunPlan:
    """Everything the run decides up front, from the seed. Pure.

    Each worker kill gets two short jobs submitted as it begins looking for a start to catch (a run whose
    other jobs had all started by then gave it none: seed 7's CI run, 90 s of asking). Each eviction and the
    foreign pods get a `long` job of their own, submitted a few seconds before the fault, and the node loss
    three (which of their pods the scheduler put on the lost node is seen at the
    time); the other jobs are drawn by KIND_WEIGHTS."""
    rng = random.Random(seed)
    submit_phase = 30.0 if short else max(120.0, jobs * 0.6)
    long_duration = 20.0 if short else 40.0
    # The wave's low jobs run one after the other (one fills its ClusterQueue). A high job whose start was
    # lost with a killed worker waits for the stale sweep (up to 2 min): the two low jobs together must
    # outlast that (seed 3 saw both end before it came: nothing was preempted), and the preempted one's next
    # attempt must still end within the settle time (420 s; at 240 s each the run settled in 386 s).
    kueue_low_duration = 20.0 if short else 100.0
    window = submit_phase + 20
    kills = 1 if short else 8
    evictions = 1 if short else 6
    # The short run keeps its outages after the targeted faults' jobs started: a start message lost with Redis
    # waits for the stale sweep (up to 2 min), longer than `make test` should; at least 16 s apart, so each
    # outage (the partition: 12 s; the API server takes 5-15 s to start again) ends before the next. The
    # full run mixes them.
    outages = (20.0, 20.0 + 18.0 * len(OUTAGES)) if short else (3.0, window)
    targeted = (8.0, 18.0) if short else (8.0, submit_phase)
    faults = [FaultPlan(rng.uniform(3, window), "kill-worker", rng.randrange(1 << 30)) for _ in range(kills)]
    # The outages, each in a part of its window of its own: Redis and PostgreSQL restarted, the API server cut
    # off from dispatch (the proxy), the API server itself killed and restarted.
    slot = (outages[1] - outages[0]) / len(OUTAGES)
    for n, what in enumerate(rng.sample(list(OUTAGES), len(OUTAGES))):
        lo = outages[0] + n * slot
        faults.append(FaultPlan(rng.uniform(lo, lo + max(2.0, slot - 16)), what, 0))
    # The controllers under dispatch, each killed mid-run (while jobs are submitted) and started again.
    for what in (*CONTROLLERS, *(("kill-kueue",) if kueue else ())):
        faults.append(FaultPlan(rng.uniform(5, window * 0.8), what, 0))
    faults += [
        FaultPlan(rng.uniform(*targeted), "eviction", rng.randrange(1 << 30)) for _ in range(evictions)
    ]
    faults.append(FaultPlan(rng.uniform(*targeted), "foreign-pods", rng.randrange(1 << 30)))
    faults.append(
        FaultPlan(rng.uniform(max(9.0, targeted[0]), targeted[1]), "node-loss", rng.randrange(1 << 30))
    )
    # The domain change ends every job still running on a build that supervises by the site's domain: in the
    # short run it comes last, so the faults before it are judged on their own.
    domain_at = (outages[1] + 2, outages[1] + 6) if short else (window * 0.3, window * 0.7)
    faults.append(FaultPlan(rng.uniform(*domain_at), "label-domain", 0))
    if kueue:
        faults.append(FaultPlan(rng.uniform(3, window * 0.4), "kueue-wave", rng.randrange(1 << 30)))
    faults = sorted((FaultPlan(round(f.at, 2), f.fault, f.pick) for f in faults), key=lambda f: f.at)

    # The jobs the targeted faults need, then the rest. The node loss gets jobs that run until cancelled, the
    # cancel well after the lost node's pods are gone: KWOK goes on playing the pods of a deleted Node until
    # PodGC removes them (40-60 s), so a pod with an end of its own may simply finish there.
    dedicated: list[tuple[str, float, int]] = []  # (kind, submit at, index of the fault it serves)
    for number, f in enumerate(faults):
        if f.fault == "kill-worker":  # starts for it to catch: two jobs submitted as it begins asking
            dedicated += [(SUCCEEDS, f.at + lead, number) for lead in (0.5, 2.0)]
        elif f.fault in ("eviction", "foreign-pods"):
            dedicated.append((LONG, max(0.0, f.at - 4), number))
        elif f.fault == "node-loss":
            dedicated += [(UNTIL_CANCELLED, max(0.0, f.at - lead), number) for lead in (9, 7, 5)]
    dedicated = dedicated[:jobs]
    kinds = list(KIND_WEIGHTS)
    rest = rng.choices(kinds, weights=[KIND_WEIGHTS[k] for k in kinds], k=jobs - len(dedicated))
    if short:  # every kind at least once, whatever the seed
        for i, kind in enumerate(kinds[: len(rest)]):
            rest[i] = kind
    planned: list[tuple[str, float, int | None]] = [(kind, at, n) for kind, at, n in dedicated]
    planned += [(kind, rng.uniform(0, submit_phase), None) for kind in rest]
    rng.shuffle(planned)
    plan = []
    for i, (kind, at, serves) in enumerate(planned):
        policy = rng.choice(sorted(POLICIES))
        cancel_after: float | None = None
        if kind == UNTIL_CANCELLED and serves is not None:  # the node loss's: cancelled after its effect
            cancel_after = faults[serves].at - at + (90.0 if short else 120.0)
        elif kind == UNTIL_CANCELLED:
            cancel_after = rng.uniform(5.0, 25.0)
        elif kind in (SUCCEEDS, APP_ERROR) and rng.random() < 0.1:
            cancel_after = rng.uniform(0.0, 10.0)
        plan.append(
            JobPlan(
                index=i,
                kind=kind,
                at=round(at, 2),
                policy=policy,
                cancel_after=None if cancel_after is None else round(cancel_after, 2),
                fail_rank=rng.randrange(2) if kind == APP_ERROR else None,
                duration=long_duration if kind == LONG else 2.0,
                serves=None if serves is None else faults[serves].fault,
            )
        )
    targets = {
        n: [j.index for j, (_, _, s) in zip(plan, planned, strict=True) if s == n] for n in range(len(faults))
    }
    return RunPlan(
        jobs=tuple(plan),
        faults=tuple(FaultPlan(f.at, f.fault, f.pick, tuple(targets[n])) for n, f in enumerate(faults)),
        submit_phase=submit_phase,
        long_duration=long_duration,
        kueue_low_duration=kueue_low_duration,
    )


def job_body(item: JobPlan, namespace: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    env: dict[str, str] = {"KWOK_RUN_DURATION": f"{item.duration:g}s"}
    if item.kind == APP_ERROR:
        env |= {"KWOK_EXIT_CODE": "3", "KWOK_FAIL_RANK": str(item.fail_rank)}
    if item.kind == UNTIL_CANCELLED:
        env = {"KWOK_STAY_RUNNING": "1"}
    return {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 2,
        "display_name": f"chaos {item.kind} #{item.index}",
        "env": env,
        **({"recovery_policy": POLICIES[item.policy]} if POLICIES[item.policy] else {}),
        **(extra or {}),
    }
