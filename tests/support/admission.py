"""A ValidatingAdmissionPolicy that denies, bound to one namespace: a real refusal by the API server, as a
platform's policy or a webhook would give (the tests' way to make the cluster refuse a write on demand)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

from kubernetes import client


@contextlib.contextmanager
def denying(
    kube: Any,
    namespace: str,
    *,
    group: str,
    resources: list[str],
    operations: list[str],
    expression: str,
    message: str,
) -> Iterator[str]:
    """While inside: `operations` on `resources` of `group` in `namespace` are refused with `message` unless
    the CEL `expression` holds ("false": always). The policy's name is yielded."""
    admission: Any = client.AdmissionregistrationV1Api(kube.api_client)
    policy = f"t-deny-{uuid.uuid4().hex[:6]}"
    admission.create_validating_admission_policy(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [group],
                            "apiVersions": ["*"],
                            "operations": operations,
                            "resources": resources,
                        }
                    ]
                },
                "validations": [{"expression": expression, "message": message}],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {
                "policyName": policy,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )
    try:
        yield policy
    finally:
        admission.delete_validating_admission_policy_binding(policy)
        admission.delete_validating_admission_policy(policy)
