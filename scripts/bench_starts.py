"""TrainJobs/s started by the worker pool, side by side with the same objects created straight through the
Python kubernetes client at the same concurrency (issue 21: >= 50/s, dispatch / direct <= 1.5).

dispatch: N jobs are accepted in one transaction (rows in PostgreSQL, N start messages in Redis when it
commits) while a real Celery worker (threads pool, CONCURRENCY threads) waits; the clock starts as that
transaction commits, before its first start message is sent (the worker starts jobs while the later messages
are still being sent), and runs until every execution is `queued` (its TrainJob created and recorded). Each
start does what start always does: claim, read the runtime afresh and judge it, create the runtime copy and
the TrainJob (each create fenced), make the TrainJob the copy's owner, record the start.
direct: CONCURRENCY threads of one process, one kubernetes ApiClient (pool sized to the threads), create the
same objects for N jobs: read the runtime, create the copy, create the TrainJob on it (a denial for a copy
the Trainer's or Kueue's webhook has not seen yet is tried again, as dispatch and any careful client do:
jobs.objects.copy_not_seen), patch the copy's ownerReference; the clock runs from the first request to the
last answer.
Both in their own namespace, emptied (and the cluster left to settle: no pod left) before every round, then
warmed with 2 x CONCURRENCY untimed jobs (connections open, as in steady use);
rounds interleaved (direct, dispatch, direct, dispatch, ...). Each round's pair gives a ratio (dispatch's
time / direct's, measured a minute apart); the median over the rounds is the figure, so a moment when the
machine is busy with something else moves one pair, not the result. The rate is judged on the median of the
rounds too (the best round is shown, never judged).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dispatch_site.config import DEFAULT_WORKER_CONCURRENCY
from scripts.bench_common import BENCH_STARTS_NAMESPACE, Target, celery_worker_command

N = int(os.environ.get("BENCH_STARTS", "200"))
# The worker's threads as make up runs it (dispatch_site.config); the client gets as many.
CONCURRENCY = int(os.environ.get("BENCH_START_CONCURRENCY", str(DEFAULT_WORKER_CONCURRENCY)))
ROUNDS = int(os.environ.get("BENCH_START_ROUNDS", "3"))
PREFETCH = os.environ.get("BENCH_PREFETCH", "")
# Worker processes; the CONCURRENCY threads are shared out among them (each process has one consumer).
PROCESSES = int(os.environ.get("BENCH_WORKER_PROCESSES", "1"))
# Jobs each side starts, untimed, right before its timed N: both measure steady use, every thread's
# connections open (a round's start otherwise paid up to CONCURRENCY database connects and TLS handshakes).
WARMUP = 2 * CONCURRENCY  # the worker's --prefetch-multiplier (default: the settings')
GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
DISPATCH_NAMESPACE = BENCH_STARTS_NAMESPACE
DIRECT_NAMESPACE = "bench-direct"


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes used so far (all their threads, and their reaped children),
    from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime + stime, and cutime + cstime: children it reaped (a PostgreSQL backend that ended, a gunicorn
        # worker that was replaced) leave their CPU there, so a before/after difference keeps it.
        total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / tick
    return total


def _cpu_by_process() -> dict[int, tuple[str, float]]:
    """Every process on the machine: its command name and the CPU seconds it used so far (utime + stime)."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[str, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, tail = stat.read_text().rsplit(")", 1)
        except OSError:
            continue
        fields = tail.split()
        found[int(stat.parent.name)] = (head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) / tick)
    return found


def _command(name: str) -> str:
    """A kernel worker renames itself after the work it runs (kworker/0:1-events, kworker/0:1-writeback):
    they all count as `kworker`."""
    return "kworker" if name.startswith("kworker/") else name


def _log_cpu_by_command(phase: str, before: dict[int, tuple[str, float]], seconds: float) -> None:
    """A diagnosis of where a phase's CPU went (BENCH_CPU_BY_COMMAND=1): each process's CPU in the phase,
    summed per command name, the top ten. Taken per process: a sum per name taken before and after counted a
    renamed kernel worker's whole life in the phase (up to 9 ms per TrainJob that never happened)."""
    if os.environ.get("BENCH_CPU_BY_COMMAND") != "1":
        return
    spent: dict[str, float] = {}
    for pid, (name, used) in _cpu_by_process().items():
        earlier = before.get(pid, (name, 0.0))[1]  # a process born in the phase spent all it used
        spent[_command(name)] = spent.get(_command(name), 0.0) + used - earlier
    top = sorted(spent.items(), key=lambda item: -item[1])[:10]
    total = sum(v for v in spent.values() if v > 0)
    _log(
        f"{phase}: {total:.2f} CPU s in {seconds:.2f} s: "
        + ", ".join(f"{name} {1000 * value / N:.1f}" for name, value in top)
        + " (ms per TrainJob)"
    )


def _api_requests(custom: Any) -> dict[str, float]:
    """The API server's own count of the requests it served (apiserver_request_total), per verb, resource and
    code: with BENCH_CPU_BY_COMMAND=1 each phase logs what the cluster was asked, its controllers included."""
    import re

    if os.environ.get("BENCH_CPU_BY_COMMAND") != "1":
        return {}
    api = custom.api_client  # the admin kubeconfig's client certificate, in its pool
    raw = api.rest_client.pool_manager.request("GET", f"{api.configuration.host}/metrics").data.decode()
    counts: dict[str, float] = {}
    pattern = re.compile(r"^apiserver_request_total\{(.*)\} (\S+)$")
    for line in raw.splitlines():
        found = pattern.match(line)
        if not found:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1)))
        sub = f"/{labels['subresource']}" if labels["subresource"] else ""
        key = f"{labels['verb']} {labels['resource']}{sub} {labels['code']}"
        counts[key] = counts.get(key, 0.0) + float(found.group(2))
    return counts


def _log_api_requests(phase: str, custom: Any, before: dict[str, float]) -> None:
    if not before:
        return
    after = _api_requests(custom)
    spent = {key: after[key] - before.get(key, 0.0) for key in after if after[key] - before.get(key, 0.0) > 0}
    top = sorted(spent.items(), key=lambda item: -item[1])[:14]
    _log(f"{phase}: API requests per TrainJob: " + ", ".join(f"{key} {value / N:.2f}" for key, value in top))


def _cluster_pids() -> list[int]:
    """The local control plane's processes (scripts/cluster records them), when it is the local one."""
    pids = Path(__file__).resolve().parent.parent / "var" / "cluster" / "pids"
    return [int(p.read_text().strip()) for p in pids.glob("*.pid")] if pids.is_dir() else []


def _log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _apis(kubeconfig: str) -> tuple[Any, Any]:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = max(CONCURRENCY, 10)
    api = client.ApiClient(configuration)
    return client.CustomObjectsApi(api), client.CoreV1Api(api)


def _empty(custom: Any, core: Any, namespace: str) -> None:
    """Delete every TrainJob and runtime copy in the namespace, and wait until no pod is left."""
    from kubernetes.client import V1DeleteOptions

    for plural in ("trainjobs", "trainingruntimes"):
        custom.delete_collection_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, body=V1DeleteOptions(propagation_policy="Background")
        )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        left = sum(
            len(custom.list_namespaced_custom_object(GROUP, VERSION, namespace, p)["items"])
            for p in ("trainjobs", "trainingruntimes")
        ) + len(core.list_namespaced_pod(namespace).items)
        if left == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"namespace {namespace} did not empty within 300 s")


def _spec(namespace: str) -> Any:
    from jobs.spec import JobSpec

    return JobSpec.from_dict(
        {
            "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
            "namespace": namespace,
            "image": "localhost/trainer:v1",
            "num_nodes": 1,
            "env": {"KWOK_STAY_RUNNING": "1"},
        }
    )


def _direct(custom: Any, namespace: str, count: int = 0) -> float:
    """`count` (N) jobs' objects through the kubernetes client: the seconds it took."""
    count = count or N
    from kubernetes.client.rest import ApiException

    from jobs.naming import new_job_id
    from jobs.objects import COPY_SEEN_WAITS, copy_not_seen, stamped
    from jobs.plan import build_train_job, build_training_runtime
    from runtimes.reasons import SiteRules

    spec = _spec(namespace)

    def one(_: int) -> None:
        job_id = new_job_id()
        runtime = custom.get_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", "dispatch-kind")
        copy = build_training_runtime(
            spec=spec,
            runtime=runtime,
            rules=SiteRules(),
            job_id=job_id,
            attempt=1,
            label_domain="dispatch.dev",
        )
        trainjob, _warnings = build_train_job(
            spec=spec, job_id=job_id, attempt=1, label_domain="dispatch.dev"
        )
        made = custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingruntimes", stamped(copy, "dispatch.dev")
        )
        # The Trainer's (or Kueue's) cache lag, waited out as dispatch waits it (the same waits, then a few
        # seconds more: a baseline that gives up where dispatch's task would retry measures nothing).
        for wait in (*COPY_SEEN_WAITS, 2.0, 4.0, 0):
            try:
                created = custom.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, "trainjobs", stamped(trainjob, "dispatch.dev")
                )
                break
            except ApiException as exc:  # that denial only
                if exc.status not in (400, 403, 422) or not copy_not_seen(_denial(exc)) or not wait:
                    raise
                time.sleep(wait)
        owner = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainJob",
            "name": created["metadata"]["name"],
            "uid": created["metadata"]["uid"],
            "blockOwnerDeletion": False,
        }
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "trainingruntimes",
            made["metadata"]["name"],
            {"metadata": {"ownerReferences": [owner]}},
        )

    started = time.monotonic()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(one, range(count)))
    return time.monotonic() - started


def _worker(env: dict[str, str], log: Path, index: int = 0) -> subprocess.Popen[bytes]:
    threads = CONCURRENCY // PROCESSES
    command = celery_worker_command(threads, f"bench{index}@%h", PREFETCH)
    out = log.open("ab")
    repo = Path(__file__).resolve().parent.parent
    # _wait_worker_ready pings it: Celery's remote control, off by default (dispatch_site.settings).
    worker_env = os.environ | env | {"WORKER_CONCURRENCY": str(threads), "WORKER_REMOTE_CONTROL": "1"}
    return subprocess.Popen(command, cwd=repo, env=worker_env, stdout=out, stderr=subprocess.STDOUT)


def _spy(pid: int, round_number: int) -> subprocess.Popen[bytes] | None:
    """BENCH_SPY=<py-spy binary>: a wall-clock profile of the worker (idle threads included) during the
    dispatch phase, to var/bench-spy-<round>.txt (a diagnosis aid; not part of the report)."""
    binary = os.environ.get("BENCH_SPY", "")
    if not binary:
        return None
    out = Path(__file__).resolve().parent.parent / "var" / f"bench-spy-{round_number}.txt"
    seconds = os.environ.get("BENCH_SPY_SECONDS", "4")
    # BENCH_SPY_GIL=1: only the thread holding the GIL (where the worker's Python CPU goes)
    which = ["--gil"] if os.environ.get("BENCH_SPY_GIL") == "1" else ["--idle"]
    command = [binary, "record", "-p", str(pid), "-d", seconds, "-r", "200", *which, "--format", "raw"]
    return subprocess.Popen([*command, "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_worker_ready() -> None:
    from dispatch_site.celery import app

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if len(app.control.ping(timeout=0.5) or []) >= PROCESSES:
            return
    raise RuntimeError("the worker did not answer a ping within 60 s")


def _dispatch(namespace: str, count: int = 0) -> tuple[float, int]:
    """`count` (N) jobs accepted at once, started by the waiting worker: the seconds from the commit until
    all are queued, and how many."""
    count = count or N
    from django.contrib.auth.models import User
    from django.db import connection, transaction
    from django.db.models import Max, Min

    from jobs.models import Execution, JobState
    from jobs.submission import submit

    owner = User.objects.get(username="bench")
    spec = _spec(namespace)
    with transaction.atomic():
        ids = [submit.job_submit(owner=owner, spec=spec).job.id for _ in range(count)]
        # The clock starts here, as the transaction commits: its on-commit sends the first start message
        # right away and the other N-1 after it, while the worker already starts the first jobs.
        started = time.monotonic()
    # The observer stays light: one statement every 20 ms over the batch's execution ids (consecutive, as
    # they were inserted in one transaction), sent as written. It first ran two ORM counts over the 200 job
    # ids each time, whose CPU (this process's and PostgreSQL's, about 6 ms per TrainJob) the machine's two
    # cores took from the worker and the control plane it measures; the direct side has no observer.
    first, last = Execution.objects.filter(job_id__in=ids).aggregate(Min("pk"), Max("pk")).values()
    table = connection.ops.quote_name(Execution._meta.db_table)
    sql = (
        f"SELECT count(*) FILTER (WHERE state = %s), count(*) FILTER (WHERE state NOT IN (%s, %s)) "
        f"FROM {table} WHERE id BETWEEN %s AND %s"
    )
    deadline = started + 600
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(sql, [JobState.QUEUED, JobState.PENDING, JobState.QUEUED, first, last])
            done, failed = cursor.fetchone()
            if done == count:
                return time.monotonic() - started, len(ids)
            if failed:
                raise RuntimeError(f"{failed} executions neither pending nor queued")
            time.sleep(0.02)
    raise RuntimeError("the worker did not start every job within 600 s")


def _forget(namespace: str) -> None:
    """The bench's jobs in `namespace` leave the database once their objects left the cluster: left queued,
    the next section's supervisor would find their TrainJobs gone and cancel them all while it is measured."""
    from jobs.models import Job

    Job.objects.filter(owner__username="bench", namespace=namespace).delete()


def run(kubeconfig: str, env: dict[str, str], var: Path) -> dict[str, Any]:
    from scripts.bench_sessions import _ensure_namespace

    custom, core = _apis(kubeconfig)
    for namespace in (DISPATCH_NAMESPACE, DIRECT_NAMESPACE):
        _ensure_namespace(core, namespace)
    log = var / "bench-worker.log"
    workers = [_worker(env, log, index) for index in range(PROCESSES)]
    pids = [w.pid for w in workers]
    rows: list[dict[str, Any]] = []
    try:
        _wait_worker_ready()
        cluster = _cluster_pids()
        for round_number in range(1, ROUNDS + 1):
            _empty(custom, core, DIRECT_NAMESPACE)
            _direct(
                custom, DIRECT_NAMESPACE, WARMUP
            )  # warm: every thread's connection open, as in steady use
            before = (_cpu_seconds([os.getpid()]), _cpu_seconds(cluster))
            by_command, requests = _cpu_by_process(), _api_requests(custom)
            direct = _direct(custom, DIRECT_NAMESPACE)
            _log_cpu_by_command(f"round {round_number} direct", by_command, direct)
            _log_api_requests(f"round {round_number} direct", custom, requests)
            direct_cpu = (_cpu_seconds([os.getpid()]) - before[0], _cpu_seconds(cluster) - before[1])
            _log(f"round {round_number}: direct {N / direct:.1f} TrainJobs/s")
            _empty(custom, core, DIRECT_NAMESPACE)
            _empty(custom, core, DISPATCH_NAMESPACE)
            _dispatch(DISPATCH_NAMESPACE, WARMUP)  # warm: every thread's database and API connections open
            before = (_cpu_seconds(pids), _cpu_seconds(cluster))
            spy = _spy(pids[0], round_number)
            by_command, requests = _cpu_by_process(), _api_requests(custom)
            seconds, _count = _dispatch(DISPATCH_NAMESPACE)
            _log_cpu_by_command(f"round {round_number} dispatch", by_command, seconds)
            _log_api_requests(f"round {round_number} dispatch", custom, requests)
            if spy is not None:
                spy.wait()
            dispatch_cpu = (_cpu_seconds(pids) - before[0], _cpu_seconds(cluster) - before[1])
            _log(f"round {round_number}: dispatch {N / seconds:.1f} TrainJobs/s")
            _empty(custom, core, DISPATCH_NAMESPACE)
            _forget(DISPATCH_NAMESPACE)
            rows.append(
                {
                    "round": round_number,
                    "direct_rps": N / direct,
                    "dispatch_rps": N / seconds,
                    # CPU ms per TrainJob: the client's process (the bench, or the worker) and the cluster's.
                    "direct_client_ms": 1000 * direct_cpu[0] / N,
                    "direct_cluster_ms": 1000 * direct_cpu[1] / N,
                    "dispatch_client_ms": 1000 * dispatch_cpu[0] / N,
                    "dispatch_cluster_ms": 1000 * dispatch_cpu[1] / N,
                }
            )
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        # Emptied, not deleted: a namespace still terminating would refuse the next run's.
        for namespace in (DISPATCH_NAMESPACE, DIRECT_NAMESPACE):
            _empty(custom, core, namespace)
        _forget(DISPATCH_NAMESPACE)
    import statistics

    for row in rows:
        row["ratio"] = row["direct_rps"] / row["dispatch_rps"]
    return {
        "rows": rows,
        "direct": max(r["direct_rps"] for r in rows),
        "best_dispatch": max(r["dispatch_rps"] for r in rows),
        "median_dispatch": statistics.median(r["dispatch_rps"] for r in rows),
        "ratio": statistics.median(r["ratio"] for r in rows),
    }


RATE_TARGET = 50.0
RATIO_TARGET = 1.5


def targets(result: dict[str, Any]) -> list[Target]:
    rates = ", ".join(f"{r['dispatch_rps']:.1f}" for r in result["rows"])
    ratios = ", ".join(f"{r['ratio']:.2f}" for r in result["rows"])
    rounds = len(result["rows"])
    return [
        Target(
            f"TrainJobs/s started by a threads worker ({CONCURRENCY} threads), clock from the first message",
            f"{result['median_dispatch']:.1f}",
            f">= {RATE_TARGET:.0f}",
            result["median_dispatch"] >= RATE_TARGET,
            f"median of {rounds} rounds ({rates}; best {result['best_dispatch']:.1f}, not judged)",
        ),
        Target(
            "starts: dispatch's time / the kubernetes client's for the same objects",
            f"{result['ratio']:.2f}",
            f"<= {RATIO_TARGET}",
            result["ratio"] <= RATIO_TARGET,
            f"median of {rounds} rounds' pairs ({ratios})",
        ),
    ]


def _denial(exc: Any) -> str:
    """The message of an API server's denial (its Status body), else the body as it came."""
    import json

    try:
        return str(json.loads(exc.body).get("message") or exc.body)
    except (TypeError, ValueError, AttributeError):
        return str(exc.body or exc.reason or "")


def report_lines(result: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"## Starts: TrainJobs/s, dispatch's worker and the kubernetes client (N={N}, "
        f"{CONCURRENCY} threads each)",
        "",
        "The same objects for each job: read the runtime, create the copy, create the TrainJob, own the "
        "copy. dispatch also claims, judges the runtime, fences each create and records the start "
        "(PostgreSQL).",
        "",
        "CPU ms per TrainJob: of the client (the bench process, or dispatch's worker) and of the local "
        "control plane's processes (API server, etcd, controllers, Trainer, JobSet, KWOK).",
        "",
        "| round | direct TrainJobs/s | dispatch TrainJobs/s | dispatch / direct time | CPU ms direct: "
        "client / cluster | CPU ms dispatch: worker / cluster |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['round']} | {r['direct_rps']:.1f} | {r['dispatch_rps']:.1f} | {r['ratio']:.2f} | "
        f"{r['direct_client_ms']:.1f} / {r['direct_cluster_ms']:.1f} | {r['dispatch_client_ms']:.1f} / "
        f"{r['dispatch_cluster_ms']:.1f} |"
        for r in result["rows"]
    ]
    lines += ["", "| measure | value | target | met | judged on |", "|---|---|---|---|---|"]
    lines += [
        f"| {t.measure} | {t.value} | {t.target} | {'yes' if t.met else 'NO'} | {t.judged_on} |"
        for t in targets(result)
    ]
    return lines


if __name__ == "__main__":  # this section alone: scripts/bench_starts.py (make bench runs it with the rest)
    import json

    from scripts.bench_common import cluster_kubeconfig, server_env, setup_django

    _kubeconfig = cluster_kubeconfig()
    _env = server_env(
        os.environ.get("DATABASE_URL", "postgres://dispatch:dispatch@127.0.0.1:25432/dispatch"), _kubeconfig
    )
    setup_django(_env)
    _var = Path(__file__).resolve().parent.parent / "var"
    _result = run(_kubeconfig, _env, _var)
    print("\n".join(report_lines(_result)))
    print(json.dumps({k: v for k, v in _result.items() if k != "rows"}))
