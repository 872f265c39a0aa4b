"""make chaos: jobs submitted and cancelled through the real stack while faults hit it; every job's outcome
checked against what its plan meant, every rank and TrainJob watched by an identity observer outside dispatch,
every fault verified as it happened (issues 10, 20 and 34).

What runs (all real), in the shape `make up` runs it (the report states it): a PostgreSQL (durable: fsync,
synchronous_commit and full_page_writes on, read back) and a Redis this script starts itself on free ports
(never a server that merely answers on a port), gunicorn from dispatch_site/gunicorn.conf.py (gthread), two
Celery threads workers at their default concurrency (`--pool solo`: solo workers), Celery beat (the
supervisor's cycle and the sweeps), the supervisor's pod watch (`manage.py supervise`), every interval and
timeout at its default; and the local control plane with KWOK. dispatch reaches the API server only through a
TCP proxy this script starts (its kubeconfig names the proxy). The run reads and acts on the cluster, and the
identity observer watches it, through a witness: a second kube-apiserver on the plane's etcd (scripts/
chaoslib/plane.py), so the faults to the first one blind neither.

The plan (all from --seed, so a failing run can be replayed; thread and process timing still vary):
each job has a kind and a recovery policy (`retry`, `no-retry`, or `site`: none of its own). The run sets the
site's default recovery policy itself (plan.SITE_DEFAULT_POLICY), so what each job is expected to do comes
from the harness's tables alone (plan.expected_policy), never from dispatch's answers:
  succeeds              KWOK_RUN_DURATION=2s                      -> succeeded
  app-error             KWOK_EXIT_CODE=3 on rank KWOK_FAIL_RANK   -> failed / app-error naming that rank
  runs-until-cancelled  KWOK_STAY_RUNNING=1, cancelled later      -> cancelled, no pod left
  long                  KWOK_RUN_DURATION=40s (20s with --short)  -> succeeded; the target of disruptions
A job hit by a disruption (eviction, lost node, Kueue preemption) is expected to end the way its policy says:
a retry as a new attempt whose predecessor carries the cause (then the kind's outcome), or failed with the
cause. A job whose cancel was accepted (202) is expected `cancelled` with no pod left (pods listed from the
API server); a disruption that took effect SEEN_WITHIN before the cancel must show on its attempt, and on an
attempt whose start a killed worker held, only SEEN_WITHIN after START_RECOVERY_SECONDS past the kill (the
dead claim's lease, then the stale sweep). The Kueue wave's Workloads are watched until the run is judged:
every eviction Kueue made of them (Preempted, PodsReadyTimeout) is a disruption of that attempt. Every
mismatch is listed with the job id, what was expected and what was seen.

Faults, at seeded moments, each verified as it happens (a fault that did not happen fails the run):
  kill-worker    a Celery worker SIGKILLed while it holds a start: what it runs is read from its own log
                 (workers answer no remote control, as make up runs them), it is stopped (SIGSTOP), and
                 the claims its tasks hold are read from the database; killed with
                 one held, the claim is still the dead worker's after the kill; a new worker runs
  redis          Redis stopped: PING refused, then answered by a new pid (its queues are lost)
  postgres       PostgreSQL crashed: the postmaster and every backend SIGKILLed at once on durable settings;
                 refused, then a new postmaster that ran crash recovery, and every job answered 202 before
                 the crash still there
  api-partition  the proxy closes: dispatch's connections to the API server refused (and /version answered
                 before and after), while the API server and the controllers run on
  kill-apiserver kube-apiserver itself SIGKILLed: its port refused, the witness still serving; started again
                 as it ran, ready under a new pid, and dispatch's proxy answering again
  kill-trainer, kill-jobset, kill-kueue (with the Kueue wave)
                 the controller SIGKILLed mid-run: its readiness and webhook ports refused, then started
                 again as it ran and ready under a new pid
  eviction       policy/v1 Eviction of a running rank pod of a `long` job: 201, and the pod goes
  node-loss      a second KWOK node (created at start; the first one stays) is cordoned, the rank pods on it
                 are recorded, the Node is deleted: it is gone, and PodGC removes its pods
  label-domain   PATCH /api/v1/settings {label_domain} as a platform user mid-run: 200 and read back
  foreign-pods   bare pods carrying a running job's labels (job, attempt, completion index, JobSet labels) and
                 its DISPATCH_* env, made by this script (not dispatch) in another namespace and in the job's
                 namespace: created and Running. The job must end as its plan meant.
  kueue-wave     (--kueue, on by default when the plane has Kueue) low-priority jobs on a LocalQueue of a
                 ClusterQueue with room for one, then a high-priority one: a low Workload is Evicted/Preempted

Figures (report.json, every one with its target; any miss exits 1; each new one seen failing on a broken
build: --break, scripts/chaoslib/breaks.py): jobs accepted, outcome mismatches, unexpected plan answers (a
policy other than the harness's, any identity warning on dispatch-kind, no 200), the identity observer's
verdict (no rank ran twice, none restarted in place; nothing waived), attempts overlapping (a pod of A+1 ran
before a pod of A ended), TrainJob duplicates (more than one UID for one (job, attempt), from TrainJobs
watched for the whole run), the observer's coverage (every rank of every final attempt that ran to its end
seen running), its errors and its watch gaps (it watches OBSERVE_AFTER_SETTLE seconds past the settle),
faults not verified, requests without an answer within their timeout (counted, then retried, never hidden),
5xx answers other than a 503 naming the dependency, orphaned TrainJobs, lost and stuck jobs, terminal jobs
with pods still running, Celery workers that exited without being killed, deadlocks in the PostgreSQL log.

Every report names the commit it ran (git rev-parse HEAD, and whether the checkout had uncommitted changes),
the shape and the durability of what it ran on (PostgreSQL's settings as the server reports them, etcd's from
its command line).

    scripts/chaos.py --jobs 200 --seed 1     # make chaos; var/chaos/<run>/report.json
    scripts/chaos.py --jobs 12 --short       # the short run inside `make test` (tests/scripts/test_chaos.py)
    scripts/chaos.py --jobs 20 --break overlap --faults eviction   # a broken build: exits 1
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import requests
import yaml

from scripts.chaoslib.api import Client
from scripts.chaoslib.breaks import BREAKS, broken_copy
from scripts.chaoslib.collect import OBSERVE_AFTER_SETTLE, collect
from scripts.chaoslib.common import REPO, log
from scripts.chaoslib.context import Context, Run
from scripts.chaoslib.faults import run_fault
from scripts.chaoslib.faults_kueue import kueue_setup, kueue_teardown
from scripts.chaoslib.jobs import run_job
from scripts.chaoslib.kube import Kube, add_kwok_node
from scripts.chaoslib.plan import SITE_DEFAULT_POLICY, make_plan, policy_differences
from scripts.chaoslib.plane import Plane, Witness
from scripts.chaoslib.proxy import Proxy
from scripts.chaoslib.report import conclude, print_summary, write
from scripts.chaoslib.stack import TIMING_SETTINGS, OwnPostgres, OwnRedis, Shape, Stack, free_port
from scripts.identity_observer import IdentityObserver
from scripts.provenance import commit_of

SCRIPT = REPO / "scripts" / "chaos.py"  # the entry point (`make chaos`)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("CHAOS_JOBS", "200")))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED", "1")))
    parser.add_argument("--short", action="store_true", help="one of each fault, a short submission phase")
    parser.add_argument(
        "--outage-seconds", type=float, default=None, help="the API partition (30; 12 with --short)"
    )
    parser.add_argument(
        "--settle-seconds", type=float, default=None, help="after the faults (420; 240 with --short)"
    )
    parser.add_argument(
        "--observe-after",
        type=float,
        default=OBSERVE_AFTER_SETTLE,
        help=f"seconds the observer keeps watching once settled ({OBSERVE_AFTER_SETTLE:.0f})",
    )
    parser.add_argument(
        "--pool",
        choices=["threads", "solo"],
        default="threads",
        help="the workers' pool: threads (make up's, at its default concurrency) or solo",
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2: a kill leaves one)")
    parser.add_argument("--no-pod-watch", action="store_true", help="do not run manage.py supervise")
    parser.add_argument(
        "--kueue",
        choices=["auto", "on", "off"],
        default=os.environ.get("CHAOS_KUEUE", "auto"),
        help="the Kueue preemption wave and kill (auto: on when Kueue runs on the plane)",
    )
    parser.add_argument(
        "--kueue-priority-field",
        default="priority_class",
        help="the job body field naming a WorkloadPriorityClass; `labels` sets the raw label "
        "kueue.x-k8s.io/priority-class through the job's labels instead",
    )
    parser.add_argument("--kubeconfig", default=str(REPO / "var" / "cluster" / "admin.kubeconfig"))
    parser.add_argument("--report", default=None, help="default var/chaos/<run>/report.json")
    parser.add_argument(
        "--faults",
        type=lambda v: set(v.split(",")),
        default=None,
        help="only these faults (comma-separated names); the plan, and so every job, stays the seed's",
    )
    parser.add_argument(
        "--break",
        dest="broken",
        choices=sorted(BREAKS),
        default=os.environ.get("CHAOS_BREAK") or None,
        help="run a deliberately broken build (scripts/chaoslib/breaks.py): the run must exit 1",
    )
    parser.add_argument(
        "--keep", action="store_true", help="leave the namespaces and the node for a post-mortem"
    )
    args = parser.parse_args(argv)
    args.outage_seconds = args.outage_seconds or (12.0 if args.short else 30.0)
    args.settle_seconds = args.settle_seconds or (240.0 if args.short else 420.0)

    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-seed{args.seed}-{os.getpid()}"
    run_dir = REPO / "var" / "chaos" / run_id
    run_dir.mkdir(parents=True)
    report_path = Path(args.report) if args.report else run_dir / "report.json"
    hexid = uuid.uuid4().hex[:6]
    commit = commit_of(REPO)  # before anything runs: what the figures measure
    plane = Plane(args.kubeconfig)
    if not plane.is_local():
        sys.exit(
            f"chaos: {args.kubeconfig} is not the local plane's (scripts/cluster up): the run kills its parts"
        )
    run = Run(args)
    cleanups: list[Callable[[], None]] = []  # undone in reverse order, whatever happens
    signal.signal(signal.SIGTERM, _terminated)
    try:
        # -- the witness API server: what the run and the observer read through
        witness = Witness(plane, args.kubeconfig, run_dir)
        cleanups.append(witness.stop)
        witness.start()
        kube = Kube(witness.kubeconfig)
        kueue = args.kueue == "on" or (args.kueue == "auto" and kube.kueue_running())
        plan = make_plan(seed=args.seed, jobs=args.jobs, short=args.short, kueue=kueue)
        log(
            f"run {run_id}: seed {args.seed}, {args.jobs} jobs, {len(plan.faults)} faults, "
            f"kueue {'on' if kueue else 'off'}, commit {commit['sha'][:12]}"
            f"{' (dirty)' if commit['dirty'] else ''}"
            f"{f', BROKEN BUILD {args.broken}' if args.broken else ''}; logs in {run_dir}"
        )

        # -- our own PostgreSQL and Redis on ports free right now
        scratch = Path(f"/var/tmp/dispatch-chaos-{run_id}")
        scratch.mkdir(parents=True)
        scratch.chmod(0o755)
        cleanups.append(lambda: shutil.rmtree(scratch, ignore_errors=True))
        pg = OwnPostgres(scratch / "pg", free_port())
        pg.init()
        pg_pids = [pg.start()]
        cleanups.append(pg.stop)
        pg.create_database()
        redis_server = OwnRedis(run_dir / "redis", free_port())
        redis_pids = [redis_server.start()]
        cleanups.append(redis_server.stop)
        ok, answered_by = redis_server.ping()
        if not ok or answered_by != str(redis_pids[0]):
            sys.exit(f"chaos: Redis on {redis_server.port} is not the one we started ({answered_by})")
        ok, data_dir = pg.answer()
        if not ok or Path(data_dir).resolve() != pg.data.resolve():
            sys.exit(f"chaos: PostgreSQL on {pg.port} is not the one we started ({data_dir})")

        # -- the checkout dispatch runs from: this one, or a broken copy of it
        checkout = REPO
        if args.broken and BREAKS[args.broken].edits:
            checkout = broken_copy(args.broken, scratch / "checkout")
            log(f"broken build {args.broken}: {BREAKS[args.broken].what} (in {checkout})")

        # -- the proxy and dispatch's kubeconfig through it
        kubeconfig = yaml.safe_load(Path(args.kubeconfig).read_text())
        server = urlparse(kubeconfig["clusters"][0]["cluster"]["server"])
        proxy = Proxy((server.hostname or "127.0.0.1", server.port or 443))
        proxy.start()
        kubeconfig["clusters"][0]["cluster"]["server"] = f"https://{server.hostname}:{proxy.port}"
        proxied = run_dir / "proxied.kubeconfig"
        proxied.write_text(yaml.safe_dump(kubeconfig))
        from kubernetes import client as kclient
        from kubernetes import config as kconfig

        through_proxy = kclient.VersionApi(kconfig.new_client_from_config(config_file=str(proxied)))

        database_url = f"postgres://dispatch:dispatch@127.0.0.1:{pg.port}/dispatch"
        web_port = free_port()
        redis_url = f"redis://127.0.0.1:{redis_server.port}/0"
        # make up's environment: nothing shortened (a variable the caller set that would be is left out).
        env = {k: v for k, v in os.environ.items() if k not in TIMING_SETTINGS} | {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "KUBECONFIG": str(proxied),
            "DJANGO_SETTINGS_MODULE": "dispatch_site.settings",
            "DEBUG": "true",  # as scripts/up sets it
            "PROMETHEUS_MULTIPROC_DIR": str(run_dir / "metrics"),
            "PYTHONUNBUFFERED": "1",
        }
        (run_dir / "metrics").mkdir()
        shape = Shape(pool=args.pool, workers=args.workers)
        stack = Stack(env=env, run_dir=run_dir, web_port=web_port, shape=shape, cwd=checkout)
        cleanups.append(stack.stop)
        report: dict[str, Any] = {
            "run": run_id,
            "command": [sys.executable, *sys.argv] if argv is None else [sys.executable, str(SCRIPT), *argv],
            "commit": commit,
            "broken_build": (
                {"name": args.broken, "figure": BREAKS[args.broken].figure, "what": BREAKS[args.broken].what}
                if args.broken
                else None
            ),
            "seed": args.seed,
            "short": args.short,
            "jobs_planned": args.jobs,
            "kueue_wave": kueue,
            "faults_chosen": sorted(args.faults) if args.faults else None,
            "shape": shape.describe(env),
            "durability": {
                "postgres": pg.durability(),
                "etcd": plane.etcd_durability(),
                "redis": "no persistence (the broker's queues are lost with it; the database is the record)",
            },
            "observe_after_settle_seconds": args.observe_after,
            "ports": {"postgres": pg.port, "redis": redis_server.port, "web": web_port, "proxy": proxy.port},
            "witness_apiserver_port": witness.port,
            "logs": str(run_dir),
        }

        # -- Django in this process: setup now, reconciliation at the end (direct kubeconfig: not the proxy)
        os.environ.update(
            {k: v for k, v in env.items() if k != "KUBECONFIG"} | {"KUBECONFIG": witness.kubeconfig}
        )
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections

        from dispatch_site import roles
        from dispatch_site.services import user_create

        cleanups.append(connections.close_all)  # before PostgreSQL stops
        from runtimes.models import AllowListEntry, SiteSettings

        call_command("migrate", verbosity=0)
        namespace = f"chaos-{args.seed}-{hexid}"
        stranger_ns = f"{namespace}-stranger"
        kube.namespace(namespace)
        kube.namespace(stranger_ns)

        def namespaces_delete() -> None:
            if args.keep:
                log(f"kept namespaces {namespace} and {stranger_ns} (--keep)")
                return
            for ns in (namespace, stranger_ns):
                kube.core.delete_namespace(ns, propagation_policy="Background")

        cleanups.append(namespaces_delete)
        _, token = user_create(username=f"chaos-{hexid}", role=roles.USER, namespaces=[namespace])
        _, platform_token = user_create(
            username=f"chaos-platform-{hexid}", role=roles.PLATFORM, namespaces=[namespace]
        )
        AllowListEntry.objects.get_or_create(
            kind="ClusterTrainingRuntime", namespace="", name="dispatch-kind", defaults={"for_jobs": True}
        )
        AllowListEntry.objects.filter(kind="ClusterTrainingRuntime", name="dispatch-kind").update(
            for_jobs=True
        )
        run.domains.append(SiteSettings.load().label_domain)
        connections.close_all()

        # -- the second KWOK node, the one the run loses
        main_nodes = [n.metadata.name for n in kube.core.list_node().items]
        lost_node = f"chaos-{hexid}-node"

        def node_delete() -> None:
            with contextlib.suppress(kube.client.ApiException):
                kube.core.delete_node(lost_node)

        cleanups.append(node_delete)
        add_kwok_node(kube, lost_node, hexid)

        kueue_names = {
            "flavor": f"chaos-{hexid}",
            "cq": f"chaos-{hexid}",
            "lq": "chaos",
            "low": f"chaos-{hexid}-low",
            "high": f"chaos-{hexid}-high",
        }
        if kueue:
            cleanups.append(lambda: kueue_teardown(kube, kueue_names))
            kueue_setup(kube, namespace, kueue_names)

        # -- the identity observer: its own client, through the witness (the `observer-blind` break: through
        # dispatch's own path, the proxy to the API server the faults hit)
        watched = str(proxied) if args.broken == "observer-blind" else witness.kubeconfig
        observer = IdentityObserver(watched, trainjobs=True).start()
        cleanups.append(observer.stop)

        client = Client(f"http://127.0.0.1:{web_port}", run.started)
        stack.start(pod_watch=not args.no_pod_watch)
        for _ in range(240):
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{client.base}/healthz", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        site_policy_set(client, platform_token)
        run.started = time.monotonic()
        client.started = run.started
        run_deadline = run.started + plan.submit_phase + args.outage_seconds + 600

        ctx = Context(
            args=args,
            run=run,
            plan=plan,
            run_id=run_id,
            hexid=hexid,
            run_dir=run_dir,
            kube=kube,
            plane=plane,
            witness=witness,
            client=client,
            stack=stack,
            pg=pg,
            pg_pids=pg_pids,
            redis_server=redis_server,
            redis_pids=redis_pids,
            proxy=proxy,
            through_proxy=through_proxy,
            observer=observer,
            namespace=namespace,
            stranger_ns=stranger_ns,
            token=token,
            platform_token=platform_token,
            run_deadline=run_deadline,
            lost_node=lost_node,
            main_nodes=main_nodes,
            kueue_names=kueue_names,
        )

        chosen_faults = [f for f in plan.faults if args.faults is None or f.fault in args.faults]
        fault_threads = [
            threading.Thread(target=run_fault, args=(ctx, f), daemon=True) for f in chosen_faults
        ]
        for thread in fault_threads:
            thread.start()
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(functools.partial(run_job, ctx), plan.jobs))
        for thread in fault_threads:
            thread.join()
        faults_over = time.monotonic()
        accepted = {e["id"]: e for e in run.jobs.values() if e.get("id")}
        log(
            f"submissions and faults over after {faults_over - run.started:.0f} s; {len(accepted)} accepted; "
            "settling"
        )

        found = collect(ctx, accepted, faults_over)
        report |= conclude(ctx, chosen_faults, found)
        if args.broken:
            missed = report["figures"][BREAKS[args.broken].figure]
            report["broken_build"]["caught"] = not missed["ok"]
        write(report, report_path, run_dir)
        print_summary(report, report_path)

        return 0 if report["ok"] else 1
    finally:
        for undo in reversed(cleanups):
            try:
                undo()
            except Exception as exc:
                log(f"clean-up step {getattr(undo, '__name__', undo)!r} failed: {exc!r}")


def site_policy_set(client: Client, platform_token: str) -> None:
    """The site's default recovery policy the run's expectations assume, set through the API as a platform
    user and read back (a run that cannot set it measures nothing it could judge)."""
    deadline = time.monotonic() + 120
    answer = client.call(
        "PATCH",
        "/api/v1/settings",
        platform_token,
        deadline,
        json={"recovery_policy": SITE_DEFAULT_POLICY},
    )
    read = client.call("GET", "/api/v1/settings", platform_token, deadline)
    stored = read.json().get("recovery_policy") if read is not None and read.status_code == 200 else None
    differences = policy_differences(SITE_DEFAULT_POLICY, stored)
    if answer is None or answer.status_code != 200 or differences:
        sys.exit(
            "chaos: the site's default recovery policy could not be set: PATCH answered "
            f"{answer.status_code if answer is not None else 'nothing'}; {differences}"
        )
    log("site default recovery policy set and read back")


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(f"chaos: signal {signum}: cleaning up")
