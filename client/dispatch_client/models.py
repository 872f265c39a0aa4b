"""What the API answers, as small typed records. Each keeps the whole answer in ``data`` for fields the
record does not name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Job states (dispatch's design: a coarse state plus a typed cause).
TERMINAL_JOB_STATES = frozenset({"refused", "succeeded", "failed", "cancelled"})
JOB_STATES = frozenset({"pending", "queued", "running", "unknown"}) | TERMINAL_JOB_STATES
# Session states.
SESSION_STATES = frozenset({"starting", "running", "failed", "closing", "closed"})


@dataclass(frozen=True)
class Reason:
    """One reason a runtime or a job is refused: a stable code, a message naming the field, and whether
    allowRankRestart waives it."""

    code: str
    message: str
    path: str = ""
    waived: bool = False

    @classmethod
    def from_api(cls, data: Any) -> Reason:
        if not isinstance(data, dict):
            return cls(code="", message=str(data))
        return cls(
            code=str(data.get("code", "")),
            message=str(data.get("message", "")),
            path=str(data.get("path") or ""),
            waived=bool(data.get("waived", False)),
        )


def reasons_from(body: Any) -> list[Reason]:
    """The refusal reasons of an answer: a job's or plan's ``reasons``, or a session refusal's."""
    if not isinstance(body, dict):
        return []
    raw = body.get("reasons")
    if not isinstance(raw, list):
        return []
    return [Reason.from_api(r) for r in raw]


def _str(value: Any) -> str:
    return "" if value is None else str(value)


@dataclass(frozen=True)
class RuntimeRef:
    """A runtime as a job names it: ``{kind, name}`` (plus ``namespace`` for a TrainingRuntime)."""

    name: str
    kind: str = "ClusterTrainingRuntime"
    namespace: str | None = None

    @classmethod
    def parse(cls, value: str | Mapping[str, Any] | RuntimeRef | Runtime) -> RuntimeRef:
        """``"name"`` (a ClusterTrainingRuntime), ``"Kind/name"``, ``"TrainingRuntime/ns/name"``, a dict as
        the API takes it, or a ``Runtime`` from ``Client.runtimes()``."""
        if isinstance(value, RuntimeRef):
            return value
        if isinstance(value, Runtime):
            return cls(name=value.name, kind=value.kind, namespace=value.namespace)
        if isinstance(value, Mapping):
            return cls(
                name=str(value["name"]),
                kind=str(value.get("kind", "ClusterTrainingRuntime")),
                namespace=value.get("namespace"),
            )
        parts = str(value).split("/")
        if len(parts) == 1:
            return cls(name=parts[0])
        if len(parts) == 2:
            return cls(kind=parts[0], name=parts[1])
        if len(parts) == 3:
            return cls(kind=parts[0], namespace=parts[1], name=parts[2])
        raise ValueError(f"runtime {value!r}: expected NAME, KIND/NAME or KIND/NAMESPACE/NAME")

    def to_api(self) -> dict[str, str]:
        data = {"kind": self.kind, "name": self.name}
        if self.namespace:
            data["namespace"] = self.namespace
        return data


@dataclass(frozen=True)
class Plan:
    """What start would do: ``refused`` with every reason, warnings, and the objects it would create."""

    refused: bool
    reasons: list[Reason]
    identity_warnings: list[str]
    warnings: list[str]
    objects: dict[str, Any] | None
    data: dict[str, Any] = field(repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Plan:
        return cls(
            refused=bool(data.get("refused")),
            reasons=reasons_from(data),
            identity_warnings=[str(w) for w in data.get("identity_warnings") or []],
            warnings=[str(w) for w in data.get("warnings") or []],
            objects=data.get("objects"),
            data=data,
        )

    @property
    def codes(self) -> list[str]:
        return [r.code for r in self.reasons if not r.waived]


@dataclass(frozen=True)
class Job:
    """A job: its coarse ``state``, the typed ``cause`` of a failure, and its executions (TrainJobs)."""

    id: str
    state: str
    cause: str
    message: str
    namespace: str
    owner: str
    runtime: dict[str, Any]
    reasons: list[Reason]
    executions: list[dict[str, Any]]
    data: dict[str, Any] = field(repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Job:
        return cls(
            id=_str(data.get("id")),
            state=_str(data.get("state")),
            cause=_str(data.get("cause")),
            message=_str(data.get("message")),
            namespace=_str(data.get("namespace")),
            owner=_str(data.get("owner")),
            runtime=dict(data.get("runtime") or {}),
            reasons=reasons_from(data),
            executions=list(data.get("executions") or []),
            data=data,
        )

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_JOB_STATES

    @property
    def trainjob_name(self) -> str | None:
        """The TrainJob of the current (last) execution, if one was made."""
        if not self.executions:
            return None
        name = self.executions[-1].get("trainjob_name")
        return str(name) if name else None

    @property
    def codes(self) -> list[str]:
        return [r.code for r in self.reasons if not r.waived]


@dataclass(frozen=True)
class JobLog:
    """One rank's log as ``GET /api/v1/jobs/{id}/logs`` answers it: the text and the pod it came from.
    ``kept_at`` is set when the pod was gone and the lines dispatch kept at its delete answered."""

    text: str
    pod: str
    attempt: int | None
    rank: int | None
    truncated: bool
    kept_at: str = ""

    @classmethod
    def from_response(cls, text: str, headers: Mapping[str, str]) -> JobLog:
        def number(name: str) -> int | None:
            value = headers.get(name, "")
            return int(value) if value.isdigit() else None

        return cls(
            text=text,
            pod=headers.get("X-Dispatch-Pod", ""),
            attempt=number("X-Dispatch-Attempt"),
            rank=number("X-Dispatch-Rank"),
            truncated=headers.get("X-Dispatch-Truncated") == "true",
            kept_at=headers.get("X-Dispatch-Kept", ""),
        )


@dataclass(frozen=True)
class JobChange:
    """One change of a job, as the change feed (``Client.watch``) reports it: a state change (``from_state`` →
    ``to_state``, with the ``cause``), a retry scheduled, an attempt started, an identity finding. ``cursor``
    is its place in the feed: ``watch(after=change.cursor)`` goes on after it."""

    cursor: str
    type: str
    kind: str
    job: str
    namespace: str
    from_state: str
    to_state: str
    cause: str
    attempt: int | None
    at: str
    message: str
    rank: int | None
    exit_code: int | None
    data: dict[str, Any] = field(repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> JobChange:
        attempt, rank, exit_code = data.get("attempt"), data.get("rank"), data.get("exit_code")
        return cls(
            cursor=_str(data.get("cursor")),
            type=_str(data.get("type")),
            kind=_str(data.get("kind")),
            job=_str(data.get("job")),
            namespace=_str(data.get("namespace")),
            from_state=_str(data.get("from_state")),
            to_state=_str(data.get("to_state")),
            cause=_str(data.get("cause")),
            attempt=attempt if isinstance(attempt, int) else None,
            at=_str(data.get("at")),
            message=_str(data.get("message")),
            rank=rank if isinstance(rank, int) else None,
            exit_code=exit_code if isinstance(exit_code, int) else None,
            data=data,
        )

    @property
    def terminal(self) -> bool:
        return self.to_state in TERMINAL_JOB_STATES


@dataclass(frozen=True)
class Runtime:
    """A runtime the service knows: allow-listed or seen in the cluster, with its last verdict."""

    kind: str
    name: str
    namespace: str | None
    allow_listed: bool
    purposes: list[str]
    refused: bool | None
    reasons: list[Reason]
    data: dict[str, Any] = field(repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Runtime:
        verdict = data.get("verdict") or None
        return cls(
            kind=_str(data.get("kind")),
            name=_str(data.get("name")),
            namespace=data.get("namespace") or None,
            allow_listed=bool(data.get("allow_listed")),
            purposes=[str(p) for p in data.get("purposes") or []],
            refused=None if verdict is None else bool(verdict.get("refused")),
            reasons=reasons_from(verdict) if verdict else [],
            data=data,
        )

    @property
    def ref(self) -> RuntimeRef:
        return RuntimeRef(name=self.name, kind=self.kind, namespace=self.namespace)


class RuntimeList(list[Runtime]):
    """``Client.runtimes()``: the runtimes, and ``cluster_error`` when the cluster could not be read (the
    allow-listed runtimes are then listed with their last recorded verdicts)."""

    def __init__(self, runtimes: list[Runtime], cluster_error: str | None = None) -> None:
        super().__init__(runtimes)
        self.cluster_error = cluster_error


@dataclass(frozen=True)
class SessionInfo:
    """An interactive session as the API reports it."""

    id: str
    state: str
    trainjob_name: str
    namespace: str
    pod: str | None
    container: str | None
    message: str
    data: dict[str, Any] = field(repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> SessionInfo:
        return cls(
            id=_str(data.get("id")),
            state=_str(data.get("state")),
            trainjob_name=_str(data.get("trainjob_name")),
            namespace=_str(data.get("namespace")),
            pod=data.get("pod") or None,
            container=data.get("container") or None,
            message=_str(data.get("message")),
            data=data,
        )


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command: ``returncode`` is None when the API server reported no exit code;
    ``truncated`` is True when the service capped the output."""

    stdout: str
    stderr: str
    returncode: int | None
    truncated: bool = False
    pod: str | None = None
    container: str | None = None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> ExecResult:
        code = data.get("returncode")
        return cls(
            stdout=_str(data.get("stdout")),
            stderr=_str(data.get("stderr")),
            returncode=None if code is None else int(code),
            truncated=bool(data.get("truncated", False)),
            pod=data.get("pod") or None,
            container=data.get("container") or None,
        )
