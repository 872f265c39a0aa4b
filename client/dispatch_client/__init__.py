"""Python client for the dispatch REST API: plan, start, wait and cancel Kubeflow TrainJobs, and open
interactive sessions in them (``Client.connect``)."""

from dispatch_client.client import Client, Session
from dispatch_client.errors import (
    BadRequest,
    Conflict,
    ConnectionFailed,
    DispatchError,
    ExecTimedOut,
    Forbidden,
    JobEnded,
    NotFound,
    Reason,
    Refused,
    ServerError,
    ServiceUnavailable,
    SessionNotRunning,
    Unauthorized,
)
from dispatch_client.models import (
    ExecResult,
    Job,
    JobChange,
    Plan,
    Runtime,
    RuntimeList,
    RuntimeRef,
    SessionInfo,
)

__all__ = [
    "BadRequest",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "DispatchError",
    "ExecResult",
    "ExecTimedOut",
    "Forbidden",
    "Job",
    "JobChange",
    "JobEnded",
    "NotFound",
    "Plan",
    "Reason",
    "Refused",
    "Runtime",
    "RuntimeList",
    "RuntimeRef",
    "ServerError",
    "ServiceUnavailable",
    "Session",
    "SessionInfo",
    "SessionNotRunning",
    "Unauthorized",
]
