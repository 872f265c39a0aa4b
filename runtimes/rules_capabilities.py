"""The runtime rules' capabilities (pure): what a runtime lets a job ask for (procs per node, several nodes,
the rank identity, gang scheduling), as runtimes.rules.check_runtime reports them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtimes.reasons import (
    CAP_GANG_SCHEDULING,
    CAP_MULTI_NODE,
    CAP_PROCS_PER_NODE,
    CAP_RANK_IDENTITY,
    PUBLISH_INIT_CONTAINER,
    Capability,
    SiteRules,
)
from runtimes.rules_read import as_map, show

# Capabilities that do not depend on the runtime's values are built once (the checker is on hot paths).
_PPN_YES = Capability(
    CAP_PROCS_PER_NODE,
    True,
    "the runtime has mlPolicy.torch, so the Trainer applies the job's procs per node",
)


_PPN_NO = Capability(
    CAP_PROCS_PER_NODE, False, "the runtime has no mlPolicy.torch, so the Trainer would ignore procs per node"
)


_MULTI_NO = Capability(CAP_MULTI_NODE, False, "the runtime has no trainer job, so there is nothing to scale")


_IDENTITY_ENV_YES = Capability(
    CAP_RANK_IDENTITY,
    True,
    'DISPATCH_JOB and DISPATCH_ATTEMPT are published as env into container "node" of the trainer job; the '
    "rank is the completion index",
)


_IDENTITY_ENV_NO = Capability(
    CAP_RANK_IDENTITY, False, 'the trainer pod has no container "node" to publish the identity into'
)


_GANG_NO = Capability(
    CAP_GANG_SCHEDULING,
    False,
    "the runtime has no spec.podGroupPolicy, so ranks are scheduled one by one, not as a group",
)


def capabilities_of(
    ml_policy: Mapping[str, Any],
    spec: Mapping[str, Any],
    has_trainer: bool,
    publish_ok: bool,
    rules: SiteRules,
) -> tuple[Capability, ...]:
    procs = _PPN_YES if isinstance(ml_policy.get("torch"), Mapping) else _PPN_NO
    if has_trainer:
        num_nodes = ml_policy.get("numNodes")
        default = num_nodes if type(num_nodes) is int else 1  # the Trainer treats an unset numNodes as 1
        multi = Capability(
            CAP_MULTI_NODE,
            True,
            f"the job's numNodes sets how many pods the trainer job runs (runtime default: {default})",
        )
    else:
        multi = _MULTI_NO
    if rules.publish_via == PUBLISH_INIT_CONTAINER:
        target = show(rules.publish_container)
        identity = Capability(
            CAP_RANK_IDENTITY,
            publish_ok,
            f"DISPATCH_JOB and DISPATCH_ATTEMPT are published into init container {target} of the trainer "
            "job; the rank is the completion index"
            if publish_ok
            else f"the trainer pod has no init container {target} to publish the identity into",
        )
    else:
        identity = _IDENTITY_ENV_YES if publish_ok else _IDENTITY_ENV_NO
    group_policy = as_map(spec.get("podGroupPolicy"))
    plugins = [k for k in ("coscheduling", "volcano") if k in group_policy]
    if plugins:
        gang = Capability(
            CAP_GANG_SCHEDULING,
            True,
            f"spec.podGroupPolicy.{plugins[0]}: the Trainer creates a PodGroup, so all ranks are scheduled "
            "together or not at all",
        )
    else:
        gang = _GANG_NO
    return procs, multi, identity, gang


def missing_capabilities(ref: str) -> tuple[Capability, ...]:
    why = f"{ref} does not exist in the cluster"
    return tuple(
        Capability(name, False, why)
        for name in (CAP_PROCS_PER_NODE, CAP_MULTI_NODE, CAP_RANK_IDENTITY, CAP_GANG_SCHEDULING)
    )
