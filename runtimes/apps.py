from __future__ import annotations

from django.apps import AppConfig


class RuntimesConfig(AppConfig):
    name = "runtimes"
