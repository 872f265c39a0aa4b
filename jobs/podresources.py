"""The Job API's rules on a pod template's container resources, judged at plan (`resources-invalid`): a job
whose Jobs the API server would refuse is refused before anything is created, with every reason. Before, such
a job was accepted, its JobSet recorded `JobCreationFailed` for each Job, and the job read `queued` for ever
(GPU jobs are the common case: `nvidia.com/gpu` requested without a limit).

The rules are Kubernetes 1.36's (pkg/apis/core/validation: validateResourceRequirements,
validateContainerResourceName, ValidateResourceQuantityValue; pkg/apis/core/helper: IsOvercommitAllowed,
IsExtendedResourceName), per container of every replicated job's pod template, init containers included:

- a resource name without a domain is a standard container resource (cpu, memory, ephemeral-storage,
  hugepages-<size>); one with a domain outside kubernetes.io follows the extended resource name standard;
- a quantity is well formed and not negative, and whole for an extended resource;
- a request is at most its limit, and equal to it for a resource that cannot be overcommitted (an extended
  resource, hugepages); such a resource requested without a limit is refused ("Limit must be set");
- hugepages need cpu or memory in the same container.

The trainer job's `node` container runs with the job's `resources_per_node` when it gives one (the Trainer
replaces that container's resources with it, as jobs.queueing counts it). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from jobs.spec import JobSpec, parse_quantity
from runtimes.reasons import JOBS_PATH, NODE_CONTAINER, TRAINER_ANCESTOR_LABEL, TRAINER_ANCESTOR_STEP, Reason

RESOURCES_INVALID: Final = "resources-invalid"

STANDARD_CONTAINER_RESOURCES: Final = frozenset({"cpu", "memory", "ephemeral-storage"})
HUGEPAGES_PREFIX: Final = "hugepages-"
NATIVE_DOMAIN: Final = "kubernetes.io/"
# A qualified name (k8s.io/apimachinery validation.IsQualifiedName): an optional DNS-1123 subdomain prefix and
# a name of at most 63 characters, alphanumeric at both ends.
_QUALIFIED_NAME: Final = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _m(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _native(name: str) -> bool:
    return "/" not in name or NATIVE_DOMAIN in name


def _hugepages(name: str) -> bool:
    return name.startswith(HUGEPAGES_PREFIX)


def overcommit_allowed(name: str) -> bool:
    """cpu, memory and the other native resources may be requested below their limit; extended resources
    and hugepages may not."""
    return _native(name) and not _hugepages(name)


def _qualified(name: str) -> bool:
    prefix, slash, rest = name.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.fullmatch(prefix)):
        return False
    return bool(_QUALIFIED_NAME.fullmatch(rest))


def extended(name: str) -> bool:
    """An extended resource name (helper.IsExtendedResourceName): outside kubernetes.io, and "requests.<name>"
    is a qualified name."""
    return not _native(name) and not name.startswith("requests.") and _qualified(f"requests.{name}")


def _name_problem(name: str) -> str | None:
    if "/" not in name:
        if name in STANDARD_CONTAINER_RESOURCES or _hugepages(name):
            return None
        return "is not a standard resource for containers (cpu, memory, ephemeral-storage, hugepages-<size>)"
    if not _native(name) and not extended(name):
        return "does not follow the extended resource name standard (<domain>/<name>)"
    return None


def _amount(value: object) -> tuple[Decimal | None, str | None]:
    text = str(value)
    try:
        number = parse_quantity(text)
    except ValueError as exc:
        return None, str(exc)
    if number < 0:
        return None, f"{text} is negative: a resource quantity must be at least 0"
    return number, None


def resource_problems(resources: Mapping[str, Any], path: str) -> list[tuple[str, str]]:
    """What the Job API would refuse in one container's resources: (field path, why), in field order."""
    problems: list[tuple[str, str]] = []
    limits_raw, requests_raw = _m(resources.get("limits")), _m(resources.get("requests"))
    limits: dict[str, Decimal] = {}
    for part, raw, into in (("limits", limits_raw, limits), ("requests", requests_raw, None)):
        for name, value in raw.items():
            name = str(name)
            where = f"{path}.{part}[{name}]"
            why = _name_problem(name)
            if why:
                problems.append((where, f"{name} {why}"))
                continue
            amount, bad = _amount(value)
            if bad or amount is None:
                problems.append((where, str(bad)))
                continue
            if extended(name) and amount != amount.to_integral_value():
                problems.append((where, f"{name} {value} must be a whole number (an extended resource)"))
                continue
            if into is not None:
                into[name] = amount
    for name, value in requests_raw.items():
        name = str(name)
        amount, bad = _amount(value)
        if bad or amount is None or _name_problem(name):
            continue  # said above
        where = f"{path}.requests[{name}]"
        if name in limits:
            if not overcommit_allowed(name) and amount != limits[name]:
                problems.append(
                    (
                        where,
                        f"{name} is requested {value} but limited {limits_raw[name]}: a resource that "
                        "cannot be overcommitted must be requested exactly at its limit",
                    )
                )
            elif amount > limits[name]:
                problems.append(
                    (where, f"{name} is requested {value}, more than its limit {limits_raw[name]}")
                )
        elif not overcommit_allowed(name):
            problems.append(
                (
                    f"{path}.limits",
                    f"{name} is requested ({value}) without a limit: the Job API refuses it "
                    f'("Limit must be set for non overcommitable resources"); set limits[{name}]: {value}',
                )
            )
    names = {str(n) for n in [*limits_raw, *requests_raw]}
    if any(_hugepages(n) for n in names) and not names & {"cpu", "memory"}:
        problems.append((path, "hugepages need cpu or memory in the same container's requests or limits"))
    return problems


def resources_reasons(spec: JobSpec, runtime: Mapping[str, Any]) -> list[Reason]:
    """Every container resource of the runtime's pod templates the Job API would refuse, the job's
    resources_per_node standing for the trainer job's `node` container: one reason each, naming the field."""
    reasons: list[Reason] = []
    jobs = _list(_m(_m(_m(runtime.get("spec")).get("template")).get("spec")).get("replicatedJobs"))
    override = spec.resources_per_node or None
    for index, job in enumerate(jobs):
        template = _m(_m(job).get("template"))
        trainer = _m(_m(template.get("metadata")).get("labels")).get(TRAINER_ANCESTOR_LABEL)
        pod_spec = _m(_m(_m(template.get("spec")).get("template")).get("spec"))
        pod_path = f"{JOBS_PATH}[{index}].template.spec.template.spec"
        for key in ("initContainers", "containers"):
            for position, container in enumerate(_list(pod_spec.get(key))):
                container = _m(container)
                if (
                    override is not None
                    and key == "containers"
                    and trainer == TRAINER_ANCESTOR_STEP
                    and (container.get("name") == NODE_CONTAINER)
                ):
                    resources: Mapping[str, Any] = override
                    path = "resources_per_node"
                else:
                    resources = _m(container.get("resources"))
                    path = f"{pod_path}.{key}[{position}].resources"
                for where, why in resource_problems(resources, path):
                    reasons.append(
                        Reason(
                            RESOURCES_INVALID,
                            f"{where}: {why}; the API server would refuse every Job of the JobSet",
                            where,
                        )
                    )
    return reasons


# ---------------------------------------------------------------- what a running pod holds (usage)

# The accelerator resources counted as GPUs (the device plugins' names): NVIDIA's, AMD's and Intel's.
GPU_RESOURCES: Final = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe")


def _quantity(value: object) -> Decimal:
    try:
        return parse_quantity(str(value)) if value is not None else Decimal(0)
    except ValueError:
        return Decimal(0)


def pod_compute(spec: Mapping[str, Any]) -> dict[str, float]:
    """What a pod holds while it runs, from its spec (DESIGN.md "Usage"): `gpus`, the sum over its containers
    of each GPU resource's limit (else its request: for an extended resource the two are equal), and `cpus`,
    the sum of the containers' cpu requests (else limits: the API server defaults a missing request to the
    limit). Sidecars (restartable init containers) run beside the containers and count; other init
    containers run before them and do not. Pure."""
    containers = _list(spec.get("containers")) + [
        c for c in _list(spec.get("initContainers")) if _m(c).get("restartPolicy") == "Always"
    ]
    gpus, cpus = Decimal(0), Decimal(0)
    for container in containers:
        resources = _m(_m(container).get("resources"))
        limits, requests = _m(resources.get("limits")), _m(resources.get("requests"))
        for name in GPU_RESOURCES:
            gpus += _quantity(limits.get(name, requests.get(name)))
        cpus += _quantity(requests.get("cpu", limits.get("cpu")))
    return {"gpus": float(gpus), "cpus": float(cpus)}


def compute_resources(resources: Mapping[str, Any]) -> dict[str, Any]:
    """A container's resources cut to what pod_compute reads (the supervisor's cache keeps only this)."""
    kept = {"cpu", *GPU_RESOURCES}
    return {
        side: {k: v for k, v in _m(resources.get(side)).items() if k in kept}
        for side in ("limits", "requests")
        if _m(resources.get(side))
    }
