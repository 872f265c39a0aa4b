"""The job spec: what a user asks to run, as plain frozen data.

Pure: no Django. The job record stores `JobSpec.to_dict()` as JSON; its shape is exactly the request body
JobSpecSerializer accepts, so a stored spec can be validated again at start. The syntax checks below
(names, labels, quantities, env) are shared by the serializer, so each rule lives in one place."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, localcontext
from typing import Any, Final, Literal

from dispatch_site.causes import RECOVERY_POLICY_PARTS
from dispatch_site.names import DNS1123_SUBDOMAIN_MAX, dns1123_subdomain_problem

RuntimeKind = Literal["ClusterTrainingRuntime", "TrainingRuntime"]


CLUSTER_TRAINING_RUNTIME: Final = "ClusterTrainingRuntime"


TRAINING_RUNTIME: Final = "TrainingRuntime"


RUNTIME_KINDS: Final = (CLUSTER_TRAINING_RUNTIME, TRAINING_RUNTIME)


# Limits from the TrainJob CRD (trainer-facts §2) and Kubernetes object-name rules.
IMAGE_MAX: Final = 500


ARGS_MAX_ITEMS: Final = 128


ENV_MAX_ITEMS: Final = 128


NUM_NODES_MAX: Final = 1000  # a site sanity bound, not a Trainer one


INT32_MAX: Final = 2**31 - 1  # numProcPerNode is an int32


INT64_MAX: Final = 2**63 - 1  # activeDeadlineSeconds is an int64


DISPLAY_NAME_MAX: Final = 200  # the Job model's column


# Env names the Trainer sets in the trainer container (trainer-facts §5). A user value would be silently
# replaced (or would replace the Trainer's), so the job is refused instead. Prefixes cover the families;
# JAX gets exact names because JAX_* also holds ordinary user settings (JAX_PLATFORMS, JAX_ENABLE_X64).
RESERVED_ENV_PREFIXES: Final[Mapping[str, str]] = {
    "PET_": "the Kubeflow Trainer (torch: PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, ...)",
    "OMPI_MCA_": "the Kubeflow Trainer (MPI: OMPI_MCA_orte_default_hostfile, ...)",
    "DMLC_": "the Kubeflow Trainer (XGBoost: DMLC_TRACKER_URI, DMLC_TASK_ID, ...)",
    "DISPATCH_": "dispatch (the execution identity: DISPATCH_JOB, DISPATCH_ATTEMPT, ...)",
}


RESERVED_ENV_NAMES: Final[Mapping[str, str]] = {
    "JAX_NUM_PROCESSES": "the Kubeflow Trainer (JAX)",
    "JAX_PROCESS_ID": "the Kubeflow Trainer (JAX)",
    "JAX_COORDINATOR_ADDRESS": "the Kubeflow Trainer (JAX)",
    # Kubernetes sets it in Indexed Jobs; overriding it would give ranks a false index.
    "JOB_COMPLETION_INDEX": "Kubernetes (the rank of an Indexed Job)",
}


_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# Kubernetes resource.Quantity syntax: <number><suffix>, the suffix binary (Ki..Ei), decimal (n..E) or 1e3.
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>[0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)


# An exponent beyond this is a typo, not a resource amount (and would overflow the arithmetic).
QUANTITY_EXPONENT_MAX: Final = 999_999


_WIDE = Context(prec=40, Emax=MAX_EMAX, Emin=MIN_EMIN)


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


# An image reference: printable ASCII, no spaces (registry/name:tag, name@sha256:...).
IMAGE_PATTERN: Final = "^[!-~]+$"


_IMAGE = re.compile(IMAGE_PATTERN)


def image_problem(value: str) -> str | None:
    if not _IMAGE.fullmatch(value):
        return "must be an image reference (registry/name:tag): printable ASCII without spaces"
    return None


def qualified_name_problem(key: str) -> str | None:
    """A label key or resource name: [prefix/]name, prefix a DNS-1123 subdomain, name <= 63 chars."""
    if key.count("/") > 1:
        return "must be [prefix/]name, with at most one '/'"
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return "the prefix before '/' must not be empty"
    if prefix:
        problem = dns1123_subdomain_problem(prefix)
        if problem:
            return f"prefix {prefix!r} {problem}"
    if not name:
        return "the name must not be empty"
    if len(name) > 63:
        return f"the name part must be at most 63 characters (it has {len(name)})"
    if not _QUALIFIED_NAME.fullmatch(name):
        return "the name part must be alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
    return None


def label_value_problem(value: str) -> str | None:
    if len(value) > 63:
        return f"must be at most 63 characters (it has {len(value)})"
    if value and not _QUALIFIED_NAME.fullmatch(value):
        return "must be empty or alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
    return None


def env_name_problem(name: str) -> str | None:
    if not _C_IDENTIFIER.fullmatch(name):
        return "must be a C identifier: letters, digits and '_', not starting with a digit"
    for prefix, owner in RESERVED_ENV_PREFIXES.items():
        if name.startswith(prefix):
            return f"is reserved: names starting with {prefix} are set by {owner}"
    if name in RESERVED_ENV_NAMES:
        return f"is reserved: it is set by {RESERVED_ENV_NAMES[name]}"
    return None


def parse_quantity(value: str) -> Decimal:
    """A Kubernetes quantity as a number ("500m" -> 0.5, "2Gi" -> 2147483648). ValueError if malformed."""
    match = _QUANTITY.fullmatch(value)
    if not match:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 2, 4Gi, 1e3)")
    number = Decimal(match["sign"] + match["num"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    exponent = int(suffix[1:])  # exponent form: 1e3
    if abs(exponent) > QUANTITY_EXPONENT_MAX:
        raise ValueError(
            f"{value!r}: the exponent must be from -{QUANTITY_EXPONENT_MAX} to {QUANTITY_EXPONENT_MAX}"
        )
    with localcontext(_WIDE):
        return number.scaleb(exponent)


def quantity_problem(value: str) -> str | None:
    try:
        number = parse_quantity(value)
    except ValueError as exc:
        return str(exc)
    if number < 0 or value.startswith("-"):
        return f"{value!r} is negative; resource quantities must be >= 0"
    return None


def _literal(text: str) -> str:
    """`text` as a pattern matching itself (only the characters our fixed names contain are escaped)."""
    return re.sub(r"([.\\+*?^$()\[\]{}|])", r"\\\1", text)


_SEGMENT = "[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"


_NAME_PART = "[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"


# [prefix/]name: the prefix a DNS-1123 subdomain of at most 253 characters, the name at most 63.
QUALIFIED_NAME_PATTERN: Final = (
    f"^(?![^/]{{{DNS1123_SUBDOMAIN_MAX + 1},}}/)(?:{_SEGMENT}(?:\\.{_SEGMENT})*/)?{_NAME_PART}$"
)


LABEL_VALUE_PATTERN: Final = f"^(?:{_NAME_PART})?$"


_RESERVED_ENV_PREFIX = "|".join(_literal(p) for p in RESERVED_ENV_PREFIXES)


_RESERVED_ENV_NAME = "|".join(_literal(n) for n in RESERVED_ENV_NAMES)


_RESERVED_ENV = f"(?:{_RESERVED_ENV_PREFIX})|(?:{_RESERVED_ENV_NAME})$"


ENV_NAME_PATTERN: Final = f"^(?!{_RESERVED_ENV})[A-Za-z_][A-Za-z0-9_]*$"


# A quantity that is not negative (quantity_problem): no '-' sign.
QUANTITY_PATTERN: Final = (
    r"^\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?0*[0-9]{1,6})?$"
)


def reserved_label_keys_pattern(exact: Iterable[str], prefixes: Iterable[str]) -> str:
    """A qualified name that is none of `exact` and starts with none of `prefixes`."""
    reserved = [f"(?:{_literal(k)})$" for k in exact] + [_literal(p) for p in prefixes]
    return f"^(?!{'|'.join(reserved)})" + QUALIFIED_NAME_PATTERN[1:]


@dataclass(frozen=True, kw_only=True)
class RuntimeRef:
    kind: RuntimeKind
    name: str
    namespace: str | None = None  # TrainingRuntime only (the job's namespace); None for a cluster runtime

    @property
    def source(self) -> str:
        """How the runtime is named in annotations and messages: Kind/name or Kind/namespace/name."""
        if self.kind == TRAINING_RUNTIME and self.namespace:
            return f"{self.kind}/{self.namespace}/{self.name}"
        return f"{self.kind}/{self.name}"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self.namespace is not None:
            data["namespace"] = self.namespace
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RuntimeRef:
        kind = data["kind"]
        if kind not in RUNTIME_KINDS:
            raise ValueError(f"runtime kind {kind!r} is not one of {', '.join(RUNTIME_KINDS)}")
        namespace = data.get("namespace")
        return cls(kind=kind, name=str(data["name"]), namespace=None if namespace is None else str(namespace))


def _env_pairs(env: Iterable[tuple[str, str]] | Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    items = env.items() if isinstance(env, Mapping) else env
    return tuple((str(k), str(v)) for k, v in items)


def _resources(value: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    return {str(part): {str(k): str(v) for k, v in dict(amounts).items()} for part, amounts in value.items()}


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A validated job. Collections are copied on construction, so a spec never aliases caller data;
    `env` may be given as a mapping and is kept as ordered (name, value) pairs."""

    runtime: RuntimeRef
    namespace: str
    image: str
    display_name: str | None = None
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    num_nodes: int | None = None
    procs_per_node: int | None = None
    resources_per_node: dict[str, dict[str, str]] = field(default_factory=dict)  # {requests, limits}
    active_deadline_seconds: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    queue_name: str | None = None
    priority_class: str | None = None  # a Kueue WorkloadPriorityClass the site allows in the namespace
    # Overrides of the site's recovery policy: {"retry": {cause: n}, "backoff_seconds": {cause: s},
    # "budgets": {"infrastructure": n, "user": n}} (jobs.recovery).
    recovery_policy: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # Normalise (frozen, hence object.__setattr__): callers may pass lists or a dict for env.
        object.__setattr__(self, "command", tuple(str(c) for c in self.command))
        object.__setattr__(self, "args", tuple(str(a) for a in self.args))
        object.__setattr__(self, "env", _env_pairs(self.env))
        object.__setattr__(self, "resources_per_node", _resources(self.resources_per_node))
        object.__setattr__(self, "labels", {str(k): str(v) for k, v in self.labels.items()})
        if self.recovery_policy is not None:
            policy = {
                part: {str(k): int(v) for k, v in (self.recovery_policy.get(part) or {}).items()}
                for part in RECOVERY_POLICY_PARTS
                if part in self.recovery_policy
            }
            object.__setattr__(self, "recovery_policy", policy)

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def to_dict(self) -> dict[str, Any]:
        """The request-body shape (unset fields left out), as stored on the job record."""
        data: dict[str, Any] = {
            "runtime": self.runtime.to_dict(),
            "namespace": self.namespace,
            "image": self.image,
        }
        optional: dict[str, Any] = {
            "display_name": self.display_name,
            "command": list(self.command) or None,
            "args": list(self.args) or None,
            "env": dict(self.env) or None,
            "num_nodes": self.num_nodes,
            "procs_per_node": self.procs_per_node,
            "resources_per_node": {k: dict(v) for k, v in self.resources_per_node.items()} or None,
            "active_deadline_seconds": self.active_deadline_seconds,
            "labels": dict(self.labels) or None,
            "queue_name": self.queue_name,
            "priority_class": self.priority_class,
            "recovery_policy": (
                None
                if self.recovery_policy is None
                else {k: dict(v) for k, v in self.recovery_policy.items()}
            ),
        }
        data.update((k, v) for k, v in optional.items() if v is not None)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """The inverse of to_dict. Trusts the data (it was validated when stored); KeyError/ValueError on
        a record that is not a spec at all."""

        def opt_int(key: str) -> int | None:
            value = data.get(key)
            return None if value is None else int(value)

        return cls(
            runtime=RuntimeRef.from_dict(data["runtime"]),
            namespace=str(data["namespace"]),
            image=str(data["image"]),
            display_name=data.get("display_name"),
            command=tuple(data.get("command") or ()),
            args=tuple(data.get("args") or ()),
            env=_env_pairs(data.get("env") or {}),
            num_nodes=opt_int("num_nodes"),
            procs_per_node=opt_int("procs_per_node"),
            resources_per_node=dict(data.get("resources_per_node") or {}),
            active_deadline_seconds=opt_int("active_deadline_seconds"),
            labels=dict(data.get("labels") or {}),
            queue_name=data.get("queue_name"),
            priority_class=data.get("priority_class"),
            recovery_policy=data.get("recovery_policy"),
        )
