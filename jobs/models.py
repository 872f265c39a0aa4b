"""Jobs (what a user submitted) and executions (each TrainJob run of a job, attempt 1, 2, ...)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.dispatch import Signal

from dispatch_site.causes import Cause
from dispatch_site.names import DEFAULT_LABEL_DOMAIN


class JobState(models.TextChoices):
    REFUSED = "refused"
    PENDING = "pending"  # accepted, not yet created in the cluster
    QUEUED = "queued"  # created, waiting for admission or scheduling
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"  # the cluster could not be read: last known state and since when


# Sent by jobs.submission.records just before it inserts new rows (sender: the row's model, instance: the
# unsaved row). A receiver returns the unsaved rows that go with it (the outbox's Change for a new job); they
# are inserted in the same statement, and each inserted row then gets its post_save, as save() would send.
rows_inserting = Signal()


TERMINAL_STATES = frozenset({JobState.REFUSED, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE_STATES = frozenset({JobState.PENDING, JobState.QUEUED, JobState.RUNNING, JobState.UNKNOWN})


def _new_job_id() -> str:
    from jobs.naming import new_job_id

    return new_job_id()


class Job(models.Model):
    id = models.CharField(primary_key=True, max_length=16, default=_new_job_id, editable=False)
    # Indexed by the job list's indexes below (their leading column), as are state and created_at: a
    # single-column index of its own (and, on PostgreSQL, its varchar_pattern_ops twin) would only cost every
    # submission its upkeep.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    namespace = models.CharField(max_length=63)
    display_name = models.CharField(max_length=200, blank=True, default="")
    runtime_kind = models.CharField(max_length=32)
    runtime_namespace = models.CharField(max_length=63, blank=True, default="")
    runtime_name = models.CharField(max_length=253)
    spec = models.JSONField()  # jobs.spec.JobSpec.to_dict()
    plan = models.JSONField(null=True)  # the plan computed at submission
    runtime_snapshot = models.JSONField(null=True)  # the runtime as the newest start judged it (for retries)
    reasons = models.JSONField(default=list)  # every refusal reason, when refused
    identity_warnings = models.JSONField(default=list)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    cause = models.CharField(max_length=32, choices=Cause.choices, blank=True, default="")
    message = models.TextField(blank=True, default="")
    evidence = models.JSONField(default=list, blank=True)  # [{object, field, value, at}] that prove the cause
    # Supervision (jobs.supervision): what the newest execution shows, copied up for lists and pages.
    failing_rank = models.IntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    queued_reason = models.JSONField(default=dict, blank=True)  # {reason, message, since}
    identity_findings = models.JSONField(default=list, blank=True)
    # Beside the status, for the page: objects carrying the job's labels outside its TrainJob's owner chain
    # (ignored), reads that failed ({kind, message, object}; jobs.supervision.status.DerivedStatus.warnings).
    supervision_warnings = models.JSONField(default=list, blank=True)
    recovery_policy = models.JSONField(default=dict, blank=True)  # the effective policy (site default + job)
    last_known_state = models.CharField(max_length=16, blank=True, default="")  # while unknown
    unknown_since = models.DateTimeField(null=True, blank=True)
    current_attempt = models.PositiveIntegerField(default=0)
    # The label domain the job's objects carry, fixed at submission: start, a retry, cancel and clean-up use
    # it, so a later change of the site's domain changes nothing already submitted (rows older than this
    # field got the site's domain of the day by migration 0007).
    label_domain = models.CharField(max_length=253, default=DEFAULT_LABEL_DOMAIN)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    request_hash = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="job_unique_idempotency_key_per_owner",
            ),
        ]
        indexes = [
            models.Index(fields=["runtime_kind", "runtime_namespace", "runtime_name"]),
            # The dashboard's job list (jobs.selectors): newest first, keyset-paginated on (created_at, id),
            # one index per filter so the first page reads 51 index entries however many jobs there are.
            models.Index(fields=["-created_at", "-id"], name="job_list_newest"),
            models.Index(fields=["state", "-created_at", "-id"], name="job_list_state"),
            models.Index(fields=["state", "cause", "-created_at", "-id"], name="job_list_state_cause"),
            models.Index(fields=["cause", "-created_at", "-id"], name="job_list_cause"),
            models.Index(fields=["namespace", "-created_at", "-id"], name="job_list_namespace"),
            models.Index(fields=["owner", "-created_at", "-id"], name="job_list_owner"),
            models.Index(fields=["runtime_name", "-created_at", "-id"], name="job_list_runtime"),
            models.Index(
                fields=["-created_at", "-id"],
                name="job_list_identity_warned",
                condition=~Q(identity_warnings=[]),
            ),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def runtime_ref(self) -> str:
        from runtimes.models import runtime_ref

        return runtime_ref(self.runtime_kind, self.runtime_namespace, self.runtime_name)

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class Execution(models.Model):
    """One TrainJob run of a job. The TrainJob name is deterministic from (job, attempt)."""

    # Indexed by the unique (job, attempt); state by Meta.indexes (no varchar_pattern_ops twin: never LIKE).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="executions", db_index=False)
    attempt = models.PositiveIntegerField()
    trainjob_name = models.CharField(max_length=63)
    # The UID of the TrainJob the start created or adopted (recorded with submitted_at): the supervision takes
    # the TrainJob under trainjob_name as the execution's only when its UID is this one, so one re-created
    # under the same name and labels by somebody else is a stranger ("" on rows older than this field).
    trainjob_uid = models.CharField(max_length=64, blank=True, default="")
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    cause = models.CharField(max_length=32, choices=Cause.choices, blank=True, default="")
    message = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    submitted_at = models.DateTimeField(null=True)  # when the TrainJob was created in the cluster
    finished_at = models.DateTimeField(null=True)
    submit_tries = models.PositiveIntegerField(default=0)
    # Supervision: the newest derived status of this attempt (jobs.status.DerivedStatus).
    rank = models.IntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    evidence = models.JSONField(default=list, blank=True)  # [{object, field, value, at}]
    queued_reason = models.JSONField(default=dict, blank=True)
    identity_findings = models.JSONField(default=list, blank=True)
    ranks = models.JSONField(default=list, blank=True)  # per-rank view: rank x restart attempt
    pods_seen = models.JSONField(default=dict, blank=True)  # pod uid -> last condensed state seen (memory)
    supervision_warnings = models.JSONField(default=list, blank=True)
    restart_attempt = models.PositiveIntegerField(default=0)  # newest JobSet restart-attempt seen
    # When the cluster was read for the status written last (not when it was written): an older observation
    # arriving later is refused, so state and pod memory never go back (jobs.supervision.apply).
    observed_at = models.DateTimeField(null=True, blank=True)
    observed_digest = models.CharField(max_length=64, blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)  # first seen running
    # The MultiKueue worker cluster the attempt was admitted to (its Workload's status.clusterName, kept when
    # an eviction clears it); "" for an attempt that runs where dispatch submitted it.
    cluster = models.CharField(max_length=253, blank=True, default="")
    objects_removed_at = models.DateTimeField(null=True, blank=True)  # attempt's objects deleted by dispatch
    # Start's claim (jobs.services.execution_submit): one delivery chain at a time works on a pending
    # execution; it holds the lease through its retry backoff, and a dead holder's lease runs out.
    claim_holder = models.CharField(max_length=255, blank=True, default="")
    claim_until = models.DateTimeField(null=True, blank=True)
    # The fencing token: incremented by every claim; a delivery creates only while its token is still this
    # one (jobs.submission.claim.claim_fence compares it in the statement that renews the lease).
    claim_generation = models.PositiveBigIntegerField(default=0)
    # Cancel or refusal asked for the objects to go; the sweep re-enqueues the delete until
    # objects_removed_at is set.
    delete_requested_at = models.DateTimeField(null=True, blank=True)
    # When the cluster first accepted dispatch's stop of the attempt's TrainJob (its Workload deactivated, or
    # spec.suspend written): the delete's fallback (delete a TrainJob the Trainer never shows stopped) is
    # measured from here, never from delete_requested_at, so a delete delivered late still stops first.
    stop_accepted_at = models.DateTimeField(null=True, blank=True)
    # The failing rank's last log lines, read right before dispatch deleted the failed attempt's TrainJob
    # (jobs.logtail): {rank, pod, container, text, truncated, captured_at}; {} when none was kept.
    log_tail = models.JSONField(default=dict, blank=True)
    # Usage (jobs.usage.measure), written once the attempt ended, when the rollup counts it.
    gpu_seconds = models.FloatField(null=True, blank=True)
    cpu_seconds = models.FloatField(null=True, blank=True)
    queue_wait_seconds = models.FloatField(null=True, blank=True)
    usage_rolled_at = models.DateTimeField(null=True, blank=True)
    details_pruned_at = models.DateTimeField(null=True, blank=True)  # HISTORY_RETENTION_DAYS (jobs.usage)

    class Meta:
        ordering = ["job", "attempt"]
        constraints = [models.UniqueConstraint(fields=["job", "attempt"], name="execution_unique_attempt")]
        indexes = [
            models.Index(fields=["state"], name="execution_state"),
            # The usage rollup's queue: ended attempts not counted yet (a few at any time).
            models.Index(
                fields=["finished_at"],
                condition=Q(usage_rolled_at__isnull=True, finished_at__isnull=False),
                name="execution_usage_due",
            ),
            # The deletes not done yet (the sweep's queue and /metrics' pending deletes): a few at any time.
            models.Index(
                fields=["delete_requested_at"],
                condition=Q(delete_requested_at__isnull=False, objects_removed_at__isnull=True),
                name="execution_delete_pending",
            ),
        ]

    def __str__(self) -> str:
        return self.trainjob_name

    @property
    def gpu_hours(self) -> float | None:
        return None if self.gpu_seconds is None else round(self.gpu_seconds / 3600, 6)


class JobEvent(models.Model):
    """The job's timeline: what dispatch did and saw, in order."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True)
    attempt = models.PositiveIntegerField(null=True)
    kind = models.CharField(max_length=32)
    from_state = models.CharField(max_length=16, blank=True, default="")
    to_state = models.CharField(max_length=16, blank=True, default="")
    cause = models.CharField(max_length=32, blank=True, default="")
    message = models.TextField()
    details = models.JSONField(default=dict, blank=True)

    # Not a column: a writer that has the execution at hand sets (rank, exit_code, created_at) before
    # saving, so the outbox (jobs.observability) need not read the execution again in the same transaction.
    execution_facts: tuple[int | None, int | None, Any] | None = None

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind}"


class SupervisorCycle(models.Model):
    """One row per supervisor (name): when its last cycle ran and what it cost (for the dashboard)."""

    name = models.CharField(primary_key=True, max_length=32)
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    duration_ms = models.PositiveIntegerField(default=0)
    api_requests = models.PositiveIntegerField(default=0)
    executions = models.PositiveIntegerField(default=0)
    transitions = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    cycles = models.PositiveBigIntegerField(default=0)
    # A lease, not a lock held across the cycle: two supervisors (two beats, a slow cycle overlapping the
    # next) never run a cycle at once; the holder renews it while its cycle runs, and a crashed holder's
    # lease simply runs out. The holder is "host:pid:thread": a host name may be 253 characters long.
    lease_holder = models.CharField(max_length=320, blank=True, default="")
    lease_until = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return self.name


class WorkerRead(models.Model):
    """How supervision's last reads of a MultiKueue worker cluster went (issue 35): when every read it needed
    there last answered, when one last failed and why. One row per worker (its MultiKueueCluster name),
    written by the cycles that read it (jobs.supervision.reads.read_workers); the overview's worker health
    and /metrics (dispatch_worker_*) read it."""

    name = models.CharField(primary_key=True, max_length=253)
    ok_at = models.DateTimeField(null=True)
    failed_at = models.DateTimeField(null=True)
    error = models.TextField(blank=True, default="")

    def __str__(self) -> str:
        return self.name

    @property
    def reading(self) -> bool:
        """Whether its last read answered (a read that failed after it did not follow)."""
        return self.ok_at is not None and (self.failed_at is None or self.ok_at >= self.failed_at)


class PodTombstone(models.Model):
    """A pod of an active execution that a watch saw deleted, with its last state (its DisruptionTarget is
    often the only evidence of a preemption, eviction or lost node). Kept until a cycle that used it commits
    the execution's status (whichever process runs that cycle: the supervisor's watch and the beat's cycle
    share the lease), then deleted in the same transaction."""

    execution = models.ForeignKey(Execution, on_delete=models.CASCADE, related_name="tombstones")
    pod_uid = models.CharField(max_length=64)
    pod = models.JSONField()  # the pod's last state as the watch delivered it (trimmed)
    seen_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["execution", "pod_uid"], name="tombstone_unique_pod"),
        ]

    def __str__(self) -> str:
        return f"{self.execution_id} {self.pod_uid}"


# ---------------------------------------------------------------- interactive sessions


class SessionState(models.TextChoices):
    STARTING = "starting"  # the TrainJob exists; waiting for its trainer pod to run
    RUNNING = "running"  # commands run in the trainer pod
    FAILED = "failed"  # the trainer pod finished, or never ran in time; the TrainJob may still exist
    CLOSING = "closing"  # the TrainJob is deleted; waiting for its pods to go
    CLOSED = "closed"


# A session holds its TrainJob name in its namespace until it is closed (its objects are then gone).
SESSION_NAME_HOLDERS = frozenset(
    {SessionState.STARTING, SessionState.RUNNING, SessionState.FAILED, SessionState.CLOSING}
)


# Sessions that count toward a user's cap (SiteSettings.max_open_sessions_per_user): they hold, or are about
# to hold, a pod. A failed one is closed by its owner (or the sweep) and counts no more.
SESSION_OPEN_STATES = frozenset({SessionState.STARTING, SessionState.RUNNING})


SESSION_ID_PREFIX = "s"


def _new_session_id() -> str:
    """ "s" + the random part of a job id: a valid DNS label, and never taken for a job id."""
    from jobs.naming import JOB_ID_PREFIX, new_job_id

    return SESSION_ID_PREFIX + new_job_id().removeprefix(JOB_ID_PREFIX)


class Session(models.Model):
    """An interactive session: a TrainJob kept alive, and the trainer pod its commands run in."""

    id = models.CharField(primary_key=True, max_length=16, default=_new_session_id, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="sessions")
    namespace = models.CharField(max_length=63)
    name = models.CharField(max_length=63)  # the TrainJob's name (and its runtime copy's)
    runtime_kind = models.CharField(max_length=32)
    runtime_namespace = models.CharField(max_length=63, blank=True, default="")
    runtime_name = models.CharField(max_length=253)
    image = models.CharField(max_length=500)
    num_nodes = models.PositiveIntegerField(null=True, blank=True)
    env = models.JSONField(default=dict, blank=True)
    command = models.JSONField(null=True, blank=True)  # the caller's; None: the keep-alive command
    timeout_seconds = models.PositiveIntegerField()  # how long the trainer pod may take to run
    trainer_replicated_job = models.CharField(max_length=63)  # whose pod is the trainer pod
    state = models.CharField(
        max_length=16, choices=SessionState.choices, default=SessionState.STARTING, db_index=True
    )
    message = models.TextField(blank=True, default="")
    warning = models.TextField(blank=True, default="")
    pod = models.CharField(max_length=253, blank=True, default="")
    pod_uid = models.CharField(max_length=64, blank=True, default="")  # exec goes to this pod only
    container = models.CharField(max_length=63, default="node")
    # Containers of the trainer pod commands may run in: `container` and those the runtime marked exec-able
    # (its `<label domain>/exec-containers` annotation), fixed when the session opened.
    exec_containers = models.JSONField(default=list, blank=True)
    # The label domain the session's objects carry, fixed at open: watch, close and clean-up find them after
    # the platform changed the site's domain ("" on rows older than this field: the site's current domain).
    label_domain = models.CharField(max_length=253, blank=True, default="")
    trainjob_uid = models.CharField(max_length=64, blank=True, default="")
    # The Kueue LocalQueue the session's TrainJob names ("" without Kueue): its queue_name, else the
    # namespace's default queue, fixed at open. Kueue admits it against the queue's quota as it does a job.
    queue = models.CharField(max_length=253, blank=True, default="")
    # MultiKueue (issue 35): the worker clusters the queue dispatches to, fixed at open (the session's runtime
    # copy is put on each, and removed from each at close; [] on a queue of this cluster), and the worker its
    # Workload was admitted to (status.clusterName, kept once known; "" until then, or without MultiKueue):
    # its pods, and its commands, are there.
    workers = models.JSONField(default=list, blank=True)
    cluster = models.CharField(max_length=253, blank=True, default="")
    # When dispatch found that worker lost (Kueue evicted the session's Workload for it: jobs.sessions.lost):
    # the session ended then, and that worker is looked at for its leftovers once it answers again.
    worker_lost_at = models.DateTimeField(null=True, blank=True)
    # When the cluster first accepted the stop of the session's TrainJob, as it closes (jobs.stopping): the
    # TrainJob is deleted once stopped, or STOP_WAIT_SECONDS after this.
    stop_accepted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)  # running since
    closing_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["namespace", "name"],
                condition=~Q(state="closed"),
                name="session_unique_open_name",
            ),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def runtime_ref(self) -> str:
        from runtimes.models import runtime_ref

        return runtime_ref(self.runtime_kind, self.runtime_namespace, self.runtime_name)
