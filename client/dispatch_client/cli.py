"""The ``dispatch`` command line, on the same Client.

    dispatch plan -f job.yaml                   # or flags: --runtime --namespace --image --num-nodes ...
    dispatch start -f job.yaml [--wait]
    dispatch status JOB_ID [--wait [--state running] [--timeout 600]]
    dispatch jobs [--state queued] [--watch]
    dispatch cancel JOB_ID
    dispatch runtimes
    dispatch session open --runtime NAME --image IMAGE [--num-nodes N] [--namespace NS]
    dispatch session exec SESSION_ID -- hostname -f      # one argument runs with sh -c, several directly
    dispatch session close SESSION_ID

Exit codes: 0 done; 1 the API answered with an error (its message and reason codes on stderr), or a waited-for
job ended failed; 2 bad usage or an unreadable job file; 3 refused (plan, start, or a waited-for job refused:
every reason is printed); 4 timed out;
``session exec`` exits with the command's own exit code (255 when the API server reported none).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from dispatch_client.client import NAMESPACE_ENV, TOKEN_ENV, URL_ENV, Client
from dispatch_client.errors import BadRequest, DispatchError, JobEnded, Refused
from dispatch_client.models import Job, JobChange, Plan, Reason, SessionInfo

EXIT_OK, EXIT_API, EXIT_USAGE, EXIT_REFUSED, EXIT_TIMEOUT = 0, 1, 2, 3, 4
EXIT_NO_RETURNCODE = 255


class UsageError(Exception):
    pass


def _pairs(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def load_job_file(path: str) -> dict[str, Any]:
    """A job body from a JSON or YAML file (``-`` reads standard input)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    data: Any
    if path.endswith(".json") or text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}: not valid JSON: {exc}") from exc
    else:
        try:
            import yaml
        except ImportError as exc:  # the client depends on requests only; YAML is the [yaml] extra
            raise UsageError(
                f"{path}: reading YAML needs PyYAML (pip install 'dispatch-client[yaml]'), or use JSON"
            ) from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UsageError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping (the job's fields), got {type(data).__name__}")
    return data


def job_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The job body: the file's fields, then the flags given on top of them."""
    spec: dict[str, Any] = load_job_file(args.file) if args.file else {}
    flags: dict[str, Any] = {
        "runtime": args.runtime,
        "namespace": args.namespace,
        "image": args.image,
        "num_nodes": args.num_nodes,
        "procs_per_node": args.procs_per_node,
        "display_name": args.display_name,
        "queue_name": args.queue_name,
        "priority_class": args.priority_class,
        "active_deadline_seconds": args.active_deadline_seconds,
        "command": shlex.split(args.command) if args.command is not None else None,
        "args": shlex.split(args.args) if args.args is not None else None,
    }
    spec.update({k: v for k, v in flags.items() if v is not None})
    if args.env:
        spec["env"] = {**spec.get("env", {}), **_pairs(args.env, "--env")}
    if args.label:
        spec["labels"] = {**spec.get("labels", {}), **_pairs(args.label, "--label")}
    if not spec:
        raise UsageError("no job: give -f FILE and/or --runtime, --namespace, --image ...")
    return spec


# ---------------------------------------------------------------------------- output
def _emit_json(out: TextIO, data: Any) -> None:
    json.dump(data, out, indent=2, sort_keys=True, default=str)
    out.write("\n")


def _reasons(out: TextIO, reasons: Sequence[Reason]) -> None:
    for r in reasons:
        waived = " (waived by allowRankRestart)" if r.waived else ""
        out.write(f"  - {r.code}: {r.message}{waived}\n")


def _job_line(job: Job) -> str:
    runtime = job.runtime.get("name", "")
    cause = f" cause={job.cause}" if job.cause else ""
    return f"{job.id}  {job.state:<9}{cause}  {job.namespace}  {runtime}  {job.trainjob_name or '-'}"


def _show_job(out: TextIO, job: Job) -> None:
    out.write(f"job {job.id}: {job.state}\n")
    if job.cause:
        out.write(f"cause: {job.cause}\n")
    if job.message:
        out.write(f"message: {job.message}\n")
    out.write(f"namespace: {job.namespace}\nruntime: {job.runtime.get('kind')}/{job.runtime.get('name')}\n")
    if job.trainjob_name:
        out.write(f"trainjob: {job.trainjob_name}\n")
    if job.reasons:
        out.write("reasons:\n")
        _reasons(out, job.reasons)


def _show_plan(out: TextIO, plan: Plan) -> None:
    out.write("refused\n" if plan.refused else "accepted\n")
    if plan.reasons:
        out.write("reasons:\n")
        _reasons(out, plan.reasons)
    for w in plan.identity_warnings:
        out.write(f"identity warning: {w}\n")
    for w in plan.warnings:
        out.write(f"warning: {w}\n")
    names = plan.data.get("names") or {}
    if names.get("train_job"):
        copy = names.get("training_runtime")
        out.write(f"would create TrainJob {names['train_job']} on TrainingRuntime {copy}\n")
    queue = plan.data.get("queue") or {}
    if queue.get("local_queue"):
        where = f" on ClusterQueue {queue['cluster_queue']}" if queue.get("cluster_queue") else ""
        fit = queue.get("fits_now")
        fits = "fits now" if fit is True else "does not fit now" if fit is False else "fit unknown"
        out.write(
            f"Kueue: LocalQueue {queue['local_queue']}{where}: {fits} ({queue.get('fit_message', '')})\n"
        )


def _show_session(out: TextIO, info: SessionInfo) -> None:
    out.write(f"session {info.id}: {info.state}\n")
    out.write(f"trainjob: {info.namespace}/{info.trainjob_name}\n")
    if info.pod:
        out.write(f"pod: {info.pod}  container: {info.container or '-'}\n")
    if info.message:
        out.write(f"message: {info.message}\n")


# ---------------------------------------------------------------------------- commands
def cmd_plan(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    plan = client.plan(job_spec(args))
    _emit_json(out, plan.data) if args.json else _show_plan(out, plan)
    return EXIT_REFUSED if plan.refused else EXIT_OK


def ended_code(state: str, wanted: Sequence[str] | None) -> int:
    """The exit code of a wait that ended with the job in `state`: refused 3 and failed 1 (as plan does),
    unless the caller waited for exactly that state; anything else 0."""
    if wanted and state in wanted:
        return EXIT_OK
    if state == "refused":
        return EXIT_REFUSED
    if state == "failed":
        return EXIT_API
    return EXIT_OK


def _wait_and_show(client: Client, job_id: str, args: argparse.Namespace, out: TextIO) -> int:
    try:
        job = client.wait(job_id, args.state or None, timeout=args.timeout, polling_interval=args.interval)
    except JobEnded as exc:
        _emit_json(out, exc.job.data) if args.json else _show_job(out, exc.job)
        sys.stderr.write(f"dispatch: {exc}\n")
        return EXIT_REFUSED if exc.job.state == "refused" else EXIT_API
    except TimeoutError as exc:
        sys.stderr.write(f"dispatch: {exc}\n")
        return EXIT_TIMEOUT
    _emit_json(out, job.data) if args.json else _show_job(out, job)
    code = ended_code(job.state, args.state)
    if code != EXIT_OK:
        why = f" ({job.cause}: {job.message})" if job.cause or job.message else ""
        sys.stderr.write(f"dispatch: job {job.id} ended {job.state}{why}\n")
    return code


def cmd_start(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    job = client.start(job_spec(args), idempotency_key=args.idempotency_key)
    if args.wait:
        sys.stderr.write(f"job {job.id} accepted, waiting ...\n")
        return _wait_and_show(client, job.id, args, out)
    _emit_json(out, job.data) if args.json else _show_job(out, job)
    return EXIT_OK


def cmd_status(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    if args.wait or args.state:
        return _wait_and_show(client, args.job_id, args, out)
    job = client.get(args.job_id)
    _emit_json(out, job.data) if args.json else _show_job(out, job)
    return EXIT_OK


def cmd_completion(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """The completion script for `args.shell`, written by shtab from this very parser (so it never lags)."""
    import shtab

    out.write(shtab.complete(build_parser(), shell=args.shell))
    return EXIT_OK


def cmd_logs(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """A rank's log on stdout; where it came from on stderr, so the log pipes clean."""
    which = {"attempt": args.attempt, "rank": args.rank, "container": args.container, "tail": args.tail}
    if args.follow:
        for chunk in client.follow_logs(args.job_id, **which):
            out.write(chunk)
            out.flush()
        return EXIT_OK
    log = client.logs(args.job_id, restart_attempt=args.restart_attempt, **which)
    if args.json:
        _emit_json(out, {**asdict(log)})
        return EXIT_OK
    origin = f"# job {args.job_id} attempt {log.attempt} rank {log.rank}, pod {log.pod}"
    if log.kept_at:
        origin += f" (gone; the lines dispatch kept at {log.kept_at})"
    if log.truncated:
        origin += " (truncated: the service's 1 MiB cap; --tail fewer lines)"
    sys.stderr.write(origin + "\n")
    out.write(log.text if not log.text or log.text.endswith("\n") else log.text + "\n")
    return EXIT_OK


USAGE_FIGURES = ("gpu_hours", "gpu_hours_lost", "cpu_hours", "jobs", "attempts", "queue_wait_p50_seconds")


def cmd_usage(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Usage per group as a table (or the API's JSON, or its CSV for a spreadsheet)."""
    filters = {k: getattr(args, k) for k in ("since", "until", "step", "namespace", "owner", "queue")}
    if args.csv:
        out.write(client.usage_csv(group_by=args.group_by, **filters))
        return EXIT_OK
    rows = client.usage(group_by=args.group_by, **filters)
    if args.json:
        _emit_json(out, rows)
        return EXIT_OK
    keys = [args.group_by, *(["period"] if args.step else []), *USAGE_FIGURES]
    table = [keys] + [["-" if r.get(k) is None else str(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(keys))]
    for line in table:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() + "\n")
    if not rows:
        out.write("(no ended attempts you may see in these days)\n")
    return EXIT_OK


def _change_line(change: JobChange) -> str:
    moved = f"{change.from_state or 'new'} -> {change.to_state}" if change.to_state else change.kind
    cause = f" cause={change.cause}" if change.cause else ""
    attempt = f" attempt={change.attempt}" if change.attempt else ""
    rank = f" rank={change.rank}" if change.rank is not None else ""
    exit_code = f" exit={change.exit_code}" if change.exit_code is not None else ""
    message = f"  {change.message}" if change.message else ""
    return f"{change.at}  {change.job}  {moved}{cause}{attempt}{rank}{exit_code}{message}"


def cmd_jobs(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    changes: Iterator[JobChange] | None = None
    if args.watch:
        # Where the feed stands now, before the list is read: nothing between the two is missed.
        changes = client.watch(
            after=client.feed_cursor(), polling_interval=args.interval, timeout=args.watch_timeout
        )
    jobs = client.jobs(
        state=args.state, runtime=args.runtime, namespace=args.namespace, owner=args.owner, limit=args.limit
    )
    if args.json and changes is None:
        _emit_json(out, [j.data for j in jobs])
    else:
        for job in jobs:
            out.write(_job_line(job) + "\n")
    if changes is None:
        return EXIT_OK
    out.flush()
    try:
        for change in changes:
            if args.namespace and change.namespace != args.namespace:
                continue
            out.write((json.dumps(change.data, sort_keys=True) if args.json else _change_line(change)) + "\n")
            out.flush()
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def cmd_cancel(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    job = client.cancel(args.job_id)
    _emit_json(out, job.data) if args.json else _show_job(out, job)
    return EXIT_OK


def cmd_runtimes(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    runtimes = client.runtimes()
    if runtimes.cluster_error:
        sys.stderr.write(f"dispatch: the cluster could not be read: {runtimes.cluster_error}\n")
    if args.json:
        _emit_json(out, [r.data for r in runtimes])
        return EXIT_OK
    for r in runtimes:
        verdict = "unchecked" if r.refused is None else ("refused" if r.refused else "ok")
        ref = f"{r.kind}/{r.namespace + '/' if r.namespace else ''}{r.name}"
        purposes = ",".join(r.purposes) or "-"
        codes = f"  {' '.join(c.code for c in r.reasons if not c.waived)}" if r.refused else ""
        out.write(f"{ref}  allow-listed={'yes' if r.allow_listed else 'no'} ({purposes})  {verdict}{codes}\n")
    return EXIT_OK


def cmd_session_open(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    command: str | list[str] | None = None
    if args.command is not None:
        command = args.command
    try:
        session = client.connect(
            runtime=args.runtime,
            image=args.image,
            num_nodes=args.num_nodes,
            command=command,
            timeout=args.timeout,
            polling_interval=args.interval,
            namespace=args.namespace,
            env=_pairs(args.env, "--env"),
            name=args.name,
        )
    except TimeoutError as exc:
        sys.stderr.write(f"dispatch: {exc}\n")
        return EXIT_TIMEOUT
    except RuntimeError as exc:
        sys.stderr.write(f"dispatch: {exc}\n")
        return EXIT_API
    _emit_json(out, session.info.data) if args.json else _show_session(out, session.info)
    return EXIT_OK


def cmd_session_exec(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    argv: list[str] = list(args.cmd)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("session exec: no command (dispatch session exec ID -- COMMAND ...)")
    command: str | list[str] = argv[0] if len(argv) == 1 else argv
    result = client.execute(args.session_id, command, container=args.container, timeout_seconds=args.timeout)
    if args.json:
        _emit_json(
            out,
            {
                "stdout": result.stdout,
                "stderr": result.stderr,
                "returncode": result.returncode,
                "truncated": result.truncated,
                "pod": result.pod,
                "container": result.container,
            },
        )
    else:
        out.write(result.stdout)
        sys.stderr.write(result.stderr)
        if result.truncated:
            sys.stderr.write("dispatch: output truncated by the service\n")
    return EXIT_NO_RETURNCODE if result.returncode is None else result.returncode


def cmd_session_close(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    from dispatch_client.client import Session

    try:
        info = client.get_session(args.session_id)
    except DispatchError as exc:
        if exc.status == 404:
            out.write(f"session {args.session_id}: already gone\n")
            return EXIT_OK
        raise
    session = Session(client, info)
    session.close(timeout=args.timeout)
    if args.json:
        _emit_json(out, session.info.data)
    else:
        out.write(f"session {info.id}: {session.info.state}\n")
    return EXIT_OK


def cmd_session_status(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    info = client.get_session(args.session_id)
    _emit_json(out, info.data) if args.json else _show_session(out, info)
    return EXIT_OK


def cmd_session_list(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    rows = client.sessions()
    if args.json:
        _emit_json(out, [s.data for s in rows])
    else:
        for s in rows:
            out.write(f"{s.id}  {s.state:<8}  {s.namespace}/{s.trainjob_name}  {s.pod or '-'}\n")
    return EXIT_OK


# ---------------------------------------------------------------------------- parser
def _job_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--file", help="the job as JSON or YAML (- for standard input); flags override it")
    p.add_argument("--runtime", help="NAME (a ClusterTrainingRuntime), KIND/NAME or TrainingRuntime/NS/NAME")
    p.add_argument("--namespace", help=f"the job's namespace (default ${NAMESPACE_ENV})")
    p.add_argument("--image")
    p.add_argument("--num-nodes", type=int)
    p.add_argument("--procs-per-node", type=int)
    p.add_argument("--display-name")
    p.add_argument(
        "--queue-name", help="the Kueue LocalQueue (default: the namespace's, if the site sets one)"
    )
    p.add_argument("--priority-class", help="a Kueue WorkloadPriorityClass the site allows in the namespace")
    p.add_argument("--active-deadline-seconds", type=int)
    p.add_argument("--command", help="the trainer command, split like a shell would")
    p.add_argument("--args", help="the trainer arguments, split like a shell would")
    p.add_argument("--env", action="append", metavar="KEY=VALUE")
    p.add_argument("--label", action="append", metavar="KEY=VALUE")


def _wait_flags(p: argparse.ArgumentParser, *, with_switch: bool) -> None:
    if with_switch:
        p.add_argument("--wait", action="store_true", help="poll until --state, or any terminal state")
    p.add_argument("--state", action="append", help="the state(s) to wait for (repeatable)")
    p.add_argument("--timeout", type=float, default=600, help="seconds (default 600)")
    p.add_argument("--interval", type=float, default=2, help="polling interval in seconds (default 2)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dispatch",
        description="Plan, start and supervise TrainJobs through dispatch, and run commands in sessions.",
        epilog="Exit codes: 0 done, 1 API error or the job ended failed, 2 usage, 3 refused, 4 timed out; "
        "session exec exits with the command's code.",
    )
    parser.add_argument(
        "--url", help=f"the dispatch service (default ${URL_ENV}, else http://127.0.0.1:8000)"
    )
    parser.add_argument("--token", help=f"API token (default ${TOKEN_ENV})")
    parser.add_argument("--json", action="store_true", help="print the API's JSON answer")
    sub = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")

    p = sub.add_parser("plan", help="what start would do (creates nothing); exit 3 when refused")
    _job_flags(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("start", help="submit a job")
    _job_flags(p)
    p.add_argument("--idempotency-key", help="a retry with the same key returns the same job")
    _wait_flags(p, with_switch=True)
    p.set_defaults(func=cmd_start)

    p = sub.add_parser("status", help="one job; --wait polls until a state")
    p.add_argument("job_id")
    _wait_flags(p, with_switch=True)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("jobs", help="jobs you may see, newest first; --watch then follows every change")
    for flag in ("--state", "--runtime", "--namespace", "--owner"):
        p.add_argument(flag)
    p.add_argument("--limit", type=int)
    p.add_argument("--watch", action="store_true", help="then print each change as it happens (the feed)")
    p.add_argument("--interval", type=float, default=2, help="--watch: polling interval in seconds")
    p.add_argument("--watch-timeout", type=float, help="--watch: stop after this many seconds")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser(
        "usage", help="GPU-hours, lost GPU-hours, jobs and queue waits per group (ended attempts)"
    )
    p.add_argument(
        "--group-by", default="namespace", choices=("namespace", "owner", "queue", "runtime", "cause")
    )
    p.add_argument("--since", help="first day, YYYY-MM-DD (UTC); default 29 days before --until")
    p.add_argument("--until", help="last day, YYYY-MM-DD (UTC), included; default today")
    p.add_argument("--step", choices=("day", "week"), help="a row per group and day or week")
    for flag in ("--namespace", "--owner", "--queue"):
        p.add_argument(flag)
    p.add_argument("--csv", action="store_true", help="the rows as CSV, for a spreadsheet")
    p.set_defaults(func=cmd_usage)

    p = sub.add_parser("logs", help="a rank's log: the failing rank's (else rank 0) of the current attempt")
    p.add_argument("job_id")
    p.add_argument("--attempt", type=int, help="the attempt (default: the current one)")
    p.add_argument("--rank", type=int, help="the rank (default: the failing rank, else 0)")
    p.add_argument("--container", help="the container (default: node, the trainer)")
    p.add_argument("--tail", type=int, help="the last lines (default 1000, at most 10000)")
    p.add_argument("--restart-attempt", type=int, help="a JobSet restart's pods (default: the newest)")
    p.add_argument("-f", "--follow", action="store_true", help="stream while the pod runs (up to 5 minutes)")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser(
        "completion",
        help='print the shell completion script: eval "$(dispatch completion bash)" (bash, zsh or tcsh)',
    )
    p.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    p.set_defaults(func=cmd_completion)

    p = sub.add_parser("cancel", help="cancel a job (deletes its TrainJob)")
    p.add_argument("job_id")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("runtimes", help="runtimes with their verdicts and allow-list purposes")
    p.set_defaults(func=cmd_runtimes)

    session = sub.add_parser("session", help="interactive sessions: open, exec, close, status, list")
    ssub = session.add_subparsers(dest="session_command", required=True, metavar="SUBCOMMAND")
    p = ssub.add_parser("open", help="create a session and wait until its trainer pod runs")
    p.add_argument("--runtime", required=True)
    p.add_argument("--image", required=True)
    p.add_argument("--num-nodes", type=int)
    p.add_argument("--namespace", help=f"default ${NAMESPACE_ENV}")
    p.add_argument("--name", help="the TrainJob's name (default: the session id)")
    p.add_argument("--command", help="keep-alive command instead of sleep infinity (runs with sh -c)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for the pod (default 600)")
    p.add_argument("--interval", type=float, default=2)
    p.set_defaults(func=cmd_session_open)

    p = ssub.add_parser("exec", help="run a command: one argument with sh -c, several directly")
    p.add_argument("session_id")
    p.add_argument("--container")
    p.add_argument("--timeout", type=int, help="seconds the command may run")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    p.set_defaults(func=cmd_session_exec)

    p = ssub.add_parser("close", help="delete the session's TrainJob and wait until its pods are gone")
    p.add_argument("session_id")
    p.add_argument("--timeout", type=float, default=180)
    p.set_defaults(func=cmd_session_close)

    p = ssub.add_parser("status", help="one session")
    p.add_argument("session_id")
    p.set_defaults(func=cmd_session_status)

    p = ssub.add_parser("list", help="your sessions")
    p.set_defaults(func=cmd_session_list)
    return parser


def _report(err: DispatchError) -> int:
    sys.stderr.write(f"dispatch: {err}\n")
    if isinstance(err, BadRequest):
        for field, problems in err.field_errors.items():
            sys.stderr.write(f"  {field}: {json.dumps(problems)}\n")
    if err.reasons:
        sys.stderr.write("reasons:\n")
        _reasons(sys.stderr, err.reasons)
    if isinstance(err, Refused) and err.job_id:
        sys.stderr.write(f"the refusal is recorded as job {err.job_id}\n")
    return EXIT_REFUSED if isinstance(err, Refused) else EXIT_API


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    client = Client(args.url, args.token)
    try:
        code: int = args.func(client, args, sys.stdout)
    except UsageError as exc:
        sys.stderr.write(f"dispatch: {exc}\n")
        return EXIT_USAGE
    except ValueError as exc:
        sys.stderr.write(f"dispatch: {exc}\n")
        return EXIT_USAGE
    except DispatchError as exc:
        return _report(exc)
    finally:
        client.close()
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
