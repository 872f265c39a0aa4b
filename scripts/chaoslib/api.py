"""dispatch's API as the run calls it: every request counted."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Final

import requests

DEPENDENCIES: Final = ("database", "redis", "broker", "cluster")
REQUEST_TIMEOUT: Final = 30.0


class Client:
    """Every request to dispatch is counted: its answer, or that none came within REQUEST_TIMEOUT (a timeout,
    a reset, a refused connection). A caller may retry (the same Idempotency-Key), but nothing is hidden."""

    def __init__(self, base: str, started: float) -> None:
        self.base, self.started = base, started
        self.lock = threading.Lock()
        self.answers: Counter[int] = Counter()
        self.unanswered: list[dict[str, Any]] = []
        self.named_503 = 0
        self.server_errors: list[dict[str, Any]] = []

    def _t(self) -> float:
        return round(time.monotonic() - self.started, 1)

    def once(self, method: str, path: str, token: str, **kwargs: Any) -> requests.Response | None:
        headers = {"Authorization": f"Token {token}", **kwargs.pop("headers", {})}
        try:
            response = requests.request(
                method, self.base + path, headers=headers, timeout=REQUEST_TIMEOUT, **kwargs
            )
        except requests.RequestException as exc:
            text = repr(exc).lower()
            kind = (
                "timeout"
                if isinstance(exc, requests.Timeout)
                else "reset"
                if ("reset" in text or "aborted" in text or "remotedisconnected" in text)
                else "refused"
                if "refused" in text
                else "other"
            )
            with self.lock:
                self.unanswered.append(
                    {"at": self._t(), "method": method, "path": path, "kind": kind, "error": repr(exc)[:300]}
                )
            return None
        with self.lock:
            self.answers[response.status_code] += 1
            if response.status_code >= 500:
                named = response.status_code == 503 and any(d in response.text.lower() for d in DEPENDENCIES)
                if named:
                    self.named_503 += 1
                else:
                    self.server_errors.append(
                        {
                            "at": self._t(),
                            "method": method,
                            "path": path,
                            "status": response.status_code,
                            "body": response.text[:300],
                        }
                    )
        return response

    def call(
        self, method: str, path: str, token: str, deadline: float, **kwargs: Any
    ) -> requests.Response | None:
        """Until an answer other than 502/503/504, or the deadline."""
        while True:
            response = self.once(method, path, token, **dict(kwargs))
            if response is not None and response.status_code not in (502, 503, 504):
                return response
            if time.monotonic() > deadline:
                return response
            time.sleep(1)
