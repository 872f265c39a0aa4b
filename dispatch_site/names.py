"""Kubernetes name rules (DNS-1123 labels and subdomains) and the labels dispatch writes on what it makes.

One definition for every layer: the job spec, the runtime allow-list, the site settings and the user
commands check names here."""

from __future__ import annotations

import re
from typing import Final

# The label domain dispatch writes its own labels under (`<domain>/job`, `<domain>/attempt`) unless the site
# sets another (runtimes.models.SiteSettings.label_domain; each job and session stores the one it was made
# with).
DEFAULT_LABEL_DOMAIN: Final = "dispatch.dev"
# Every object dispatch makes carries this label; only such objects are ever adopted, hidden or deleted.
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "dispatch"

DNS1123_LABEL_MAX: Final = 63


DNS1123_SUBDOMAIN_MAX: Final = 253


DNS1123_LABEL_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


DNS1123_SUBDOMAIN_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


_DNS1123_LABEL = re.compile(DNS1123_LABEL_PATTERN)


_DNS1123_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN_PATTERN)


def dns1123_label_problem(value: str) -> str | None:
    if len(value) > DNS1123_LABEL_MAX:
        return f"must be at most {DNS1123_LABEL_MAX} characters (it has {len(value)})"
    if not _DNS1123_LABEL.fullmatch(value):
        return "must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending alphanumeric"
    return None


def is_dns1123_label(value: str) -> bool:
    """A namespace or container name."""
    return dns1123_label_problem(value) is None


def is_dns1123_subdomain(value: str) -> bool:
    """A runtime (most object) name."""
    return dns1123_subdomain_problem(value) is None


def dns1123_subdomain_problem(value: str) -> str | None:
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        return f"must be at most {DNS1123_SUBDOMAIN_MAX} characters (it has {len(value)})"
    if not _DNS1123_SUBDOMAIN.fullmatch(value):
        return (
            "must be a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', "
            "starting and ending alphanumeric"
        )
    return None
