"""The errors submission's services raise; the API turns each into an answer."""

from __future__ import annotations


class IdempotencyConflict(Exception):
    pass


class JobNotCancellable(Exception):
    pass


class TransientSubmitError(Exception):
    """The cluster could not be reached or answered 5xx/429: the submission task retries with backoff."""


class ClaimLost(Exception):
    """This delivery's claim on the execution is no longer the execution's (fencing): it must not create."""
