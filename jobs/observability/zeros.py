"""Every labelled counter starts at zero for the label values dispatch knows, in every process, so a fresh
/metrics already shows `dispatch_refusals_total{code="runtime-not-allowed"} 0`: a dashboard and an alert on
`rate(...)` see 0, not nothing, before the first sample.

The values come from their one definition each: the refusal codes (runtimes.reasons and jobs.plan), the
retryable causes (dispatch_site.causes), the webhook outcomes (jobs.observability.webhooks). Of the
transitions, only the submission's edges (new -> pending, new -> refused) are a fixed set; the others
appear with their first sample, as do the Kubernetes requests (their status codes are open-ended).
"""

from __future__ import annotations

from typing import Final

from dispatch_site import metrics
from dispatch_site.causes import RETRYABLE_CAUSES
from jobs.models import JobState
from jobs.observability.payloads import NEW, NO_CAUSE
from jobs.observability.webhooks import OUTCOMES
from jobs.plan import START_ONLY_CODES
from runtimes.reasons import REASON_CODES

REFUSAL_CODES: Final = (*REASON_CODES, *START_ONLY_CODES)
SUBMISSION_EDGES: Final = ((NEW, str(JobState.PENDING)), (NEW, str(JobState.REFUSED)))


def zero_known_series() -> None:
    """Create every known series at 0 (idempotent: an existing series keeps its value)."""
    for code in REFUSAL_CODES:
        metrics.REFUSALS.labels(code)
    for cause in RETRYABLE_CAUSES:
        metrics.RECOVERY_ATTEMPTS.labels(cause)
    for expected in ("true", "false"):
        metrics.IDENTITY_FINDINGS.labels(expected)
    for outcome in OUTCOMES:
        metrics.WEBHOOK_DELIVERIES.labels(outcome)
    for source, target in SUBMISSION_EDGES:
        metrics.JOB_TRANSITIONS.labels(source, target, NO_CAUSE)
