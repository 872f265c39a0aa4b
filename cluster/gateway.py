"""The one gateway to Kubernetes: typed reads, creates, deletes, lists and watches against the API server.

Every call passes an explicit timeout; every ApiException and connection error becomes one of the
errors in cluster.errors, naming the object as "Kind namespace/name".

The work is split by responsibility; callers import all of it from here:
- cluster.calls: the call itself (timeout, error mapping, request counting, the API objects);
- cluster.trainer: the Trainer's runtimes and TrainJobs;
- cluster.reads: supervision's paged lists, watches and Node reads, and their traffic;
- cluster.lease: the Trainer's leader Lease and its runtime snapshot, read by name.
"""

from __future__ import annotations

from cluster.calls import (
    call_api,
    calling,
    core,
    counted,
    custom,
    request_labels,
    requests_made,
    server_version,
    target,
    translate,
)
from cluster.lease import Lease, get_config_map, get_lease
from cluster.reads import (
    EVENTS,
    JOBS,
    JOBSETS,
    LIST_PAGE,
    NODES,
    PODS,
    TRAINJOBS,
    WORKLOADS,
    Listed,
    Resource,
    Traffic,
    WatchStream,
    forget_cached_nodes,
    get_node,
    list_objects,
    open_watch,
    raw_list,
    traffic,
)
from cluster.trainer import (
    JOBSET_GROUP,
    JOBSET_VERSION,
    PLURALS,
    TRAINER_GROUP,
    TRAINER_VERSION,
    RuntimeObject,
    create_namespaced,
    delete_namespaced,
    forget_cached_runtimes,
    get_namespaced,
    get_runtime,
    list_namespaced,
    list_runtimes,
    patch_namespaced,
)

__all__ = [
    "EVENTS",
    "JOBS",
    "JOBSETS",
    "JOBSET_GROUP",
    "JOBSET_VERSION",
    "LIST_PAGE",
    "NODES",
    "PLURALS",
    "PODS",
    "TRAINER_GROUP",
    "TRAINER_VERSION",
    "TRAINJOBS",
    "WORKLOADS",
    "Lease",
    "Listed",
    "Resource",
    "RuntimeObject",
    "Traffic",
    "WatchStream",
    "call_api",
    "calling",
    "core",
    "counted",
    "create_namespaced",
    "custom",
    "delete_namespaced",
    "forget_cached_nodes",
    "forget_cached_runtimes",
    "get_config_map",
    "get_lease",
    "get_namespaced",
    "get_node",
    "get_runtime",
    "list_namespaced",
    "list_objects",
    "list_runtimes",
    "open_watch",
    "patch_namespaced",
    "raw_list",
    "request_labels",
    "requests_made",
    "server_version",
    "target",
    "traffic",
    "translate",
]
