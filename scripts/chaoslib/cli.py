"""make chaos: jobs submitted and cancelled through the real stack while faults hit it; every job's outcome
checked against what its plan meant, every rank watched by an identity observer outside dispatch, every fault
verified as it happened (issues 10 and 20).

What runs (all real): a PostgreSQL and a Redis this script starts itself, on free ports chosen at run time
(never a server that merely answers on a port: two runs, or `make test` beside `make chaos`, never share
one), dispatch's web server (gunicorn), Celery workers, Celery beat (the supervisor's cycle and the sweeps),
the supervisor's pod watch (`manage.py supervise`, as `make up` runs it), and the local control plane with
KWOK. dispatch reaches the API server only through a TCP proxy this script starts (its kubeconfig names the
proxy); everything this script reads or does to the cluster goes direct, with its own client.

The plan (all from --seed, so a failing run can be replayed; thread and process timing still vary):
each job has a kind and a recovery policy (`retry`: preempted/evicted/node-lost retried; `no-retry`):
  succeeds              KWOK_RUN_DURATION=2s                      -> succeeded
  app-error             KWOK_EXIT_CODE=3 on rank KWOK_FAIL_RANK   -> failed / app-error naming that rank
  runs-until-cancelled  KWOK_STAY_RUNNING=1, cancelled later      -> cancelled, no pod left
  long                  KWOK_RUN_DURATION=40s (20s with --short)  -> succeeded; the target of disruptions
A job hit by a disruption (eviction, lost node, Kueue preemption) is expected to end the way its policy says:
a retry as a new attempt whose predecessor carries the cause (then the kind's outcome), or failed with the
cause. A job whose cancel was accepted (202) is expected `cancelled` with no pod left (pods listed from the
API server). Every mismatch is listed with the job id, what was expected and what was seen.

Faults, at seeded moments, each verified as it happens (a fault that did not happen fails the run):
  kill-worker    SIGKILL of a Celery worker: it exited by SIGKILL, a new one runs under another pid
  redis          Redis stopped: PING refused, then answered by a new pid (its queues are lost)
  postgres       PostgreSQL fast shutdown: connections refused, then accepted by a new postmaster pid
  api-server     the proxy closes: connections to it refused (and /version answered before and after)
  eviction       policy/v1 Eviction of a running rank pod of a `long` job: 201, and the pod goes
  node-loss      a second KWOK node (created at start; the first one stays) is cordoned, the rank pods on it
                 are recorded, the Node is deleted: it is gone, and PodGC removes its pods
  label-domain   PATCH /api/v1/settings {label_domain} as a platform user mid-run: 200 and read back
  foreign-pods   bare pods carrying a running job's labels (job, attempt, completion index, JobSet labels) and
                 its DISPATCH_* env, made by this script (not dispatch) in another namespace and in the job's
                 namespace: created and Running. The job must end as its plan meant.
  kueue-wave     (--kueue, on by default when the plane has Kueue) low-priority jobs on a LocalQueue of a
                 ClusterQueue with room for one, then a high-priority one: a low Workload is Evicted/Preempted

Figures (report.json, every one with its target; any miss exits 1): jobs accepted, outcome mismatches, the
identity observer's verdict (no rank ran twice, no in-place restart, except jobs whose plan answer carried an
identity warning) and whether its watch had gaps, faults not verified, requests without an answer within their
timeout (timeouts, resets: counted, then retried, never hidden), 5xx answers other than a 503 naming the
dependency, duplicate and orphaned TrainJobs, lost and stuck jobs, terminal jobs with pods still running,
Celery workers that exited without being killed (a Redis restart can end one for good),
deadlocks in the PostgreSQL log.

    scripts/chaos.py --jobs 200 --seed 1     # make chaos; var/chaos/<run>/report.json
    scripts/chaos.py --jobs 12 --short       # the short run inside `make test` (tests/scripts/test_chaos.py)
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
from scripts.chaoslib.collect import collect
from scripts.chaoslib.common import REPO, log
from scripts.chaoslib.context import Context, Run
from scripts.chaoslib.faults import run_fault
from scripts.chaoslib.faults_kueue import kueue_setup, kueue_teardown
from scripts.chaoslib.jobs import run_job
from scripts.chaoslib.kube import Kube, add_kwok_node
from scripts.chaoslib.plan import make_plan
from scripts.chaoslib.proxy import Proxy
from scripts.chaoslib.report import conclude, print_summary, write
from scripts.chaoslib.stack import OwnPostgres, OwnRedis, Stack, free_port
from scripts.identity_observer import IdentityObserver

SCRIPT = REPO / "scripts" / "chaos.py"  # the entry point (`make chaos`)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED", "1")))
    parser.add_argument("--short", action="store_true", help="one of each fault, a short submission phase")
    parser.add_argument(
        "--outage-seconds", type=float, default=None, help="API server outage (30; 15 with --short)"
    )
    parser.add_argument(
        "--settle-seconds", type=float, default=None, help="after the faults (420; 150 with --short)"
    )
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--no-pod-watch", action="store_true", help="do not run manage.py supervise")
    parser.add_argument(
        "--kueue",
        choices=["auto", "on", "off"],
        default=os.environ.get("CHAOS_KUEUE", "auto"),
        help="the Kueue preemption wave (auto: on when Kueue runs on the plane: its CRDs and webhooks)",
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
        "--keep", action="store_true", help="leave the namespaces and the node for a post-mortem"
    )
    args = parser.parse_args(argv)
    args.outage_seconds = args.outage_seconds or (15.0 if args.short else 30.0)
    args.settle_seconds = args.settle_seconds or (150.0 if args.short else 420.0)

    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-seed{args.seed}-{os.getpid()}"
    run_dir = REPO / "var" / "chaos" / run_id
    run_dir.mkdir(parents=True)
    report_path = Path(args.report) if args.report else run_dir / "report.json"
    hexid = uuid.uuid4().hex[:6]
    kube = Kube(args.kubeconfig)
    kueue = args.kueue == "on" or (args.kueue == "auto" and kube.kueue_running())
    plan = make_plan(seed=args.seed, jobs=args.jobs, short=args.short, kueue=kueue)
    run = Run(args)
    log(
        f"run {run_id}: seed {args.seed}, {args.jobs} jobs, {len(plan.faults)} faults, "
        f"kueue wave {'on' if kueue else 'off'}; logs in {run_dir}"
    )

    cleanups: list[Callable[[], None]] = []  # undone in reverse order, whatever happens
    signal.signal(signal.SIGTERM, _terminated)
    try:
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
        env = os.environ | {
            "DATABASE_URL": database_url,
            "REDIS_URL": f"redis://127.0.0.1:{redis_server.port}/0",
            "KUBECONFIG": str(proxied),
            "KUBE_TIMEOUT_SECONDS": "5",
            "SUPERVISOR_INTERVAL_SECONDS": "5",
            "DJANGO_SETTINGS_MODULE": "dispatch_site.settings",
            "PYTHONUNBUFFERED": "1",
        }
        stack = Stack(env=env, run_dir=run_dir, web_port=web_port)
        cleanups.append(stack.stop)
        report: dict[str, Any] = {
            "run": run_id,
            "command": [sys.executable, *sys.argv] if argv is None else [sys.executable, str(SCRIPT), *argv],
            "seed": args.seed,
            "short": args.short,
            "jobs_planned": args.jobs,
            "kueue_wave": kueue,
            "ports": {"postgres": pg.port, "redis": redis_server.port, "web": web_port, "proxy": proxy.port},
            "logs": str(run_dir),
        }

        # -- Django in this process: setup now, reconciliation at the end (direct kubeconfig: not the proxy)
        os.environ.update(
            {k: v for k, v in env.items() if k != "KUBECONFIG"} | {"KUBECONFIG": args.kubeconfig}
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

        # -- the identity observer, its own client, direct
        observer = IdentityObserver(args.kubeconfig).start()

        client = Client(f"http://127.0.0.1:{web_port}", run.started)
        stack.start(args.workers, pod_watch=not args.no_pod_watch)
        for _ in range(240):
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{client.base}/healthz", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
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
        write(report, report_path, run_dir)
        print_summary(report, report_path)

        return 0 if report["ok"] else 1
    finally:
        for undo in reversed(cleanups):
            try:
                undo()
            except Exception as exc:
                log(f"clean-up step {getattr(undo, '__name__', undo)!r} failed: {exc!r}")


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(f"chaos: signal {signum}: cleaning up")
