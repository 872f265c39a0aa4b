"""`manage.py check_runtime FILE...`: judge runtime manifests against the runtime rules, offline.

Reads YAML (multi-document) or JSON files, including `kubectl get ... -o yaml|json` List output, and checks
every ClusterTrainingRuntime and TrainingRuntime in file and document order; other kinds are skipped. The
allow-list does not apply to files. Exit 0 whatever the verdicts; exit 2 when a file cannot be read or
parsed, or the options contradict each other. Needs no database and no cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runtimes.reasons import PUBLISH_ENV, PUBLISH_INIT_CONTAINER, PUBLISH_VIAS, RUNTIME_KINDS, SiteRules
from runtimes.rules import check_runtime, runtime_ref

# libyaml's loader parses several times faster than the pure-Python one; both are safe loaders.
_YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
USAGE_ERROR = 2


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _yaml_error(path: str, exc: yaml.YAMLError) -> str:
    """One line: where the parser stopped and, when it knows, where the broken construct started."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return f"{path}: invalid YAML: {_one_line(str(exc))}"
    mark = exc.problem_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    message = f"{path}: invalid YAML at {where}: {_one_line(exc.problem or '')}"
    if exc.context and exc.context_mark is not None and exc.context_mark.line != mark.line:
        message += f" ({_one_line(exc.context)} started at line {exc.context_mark.line + 1})"
    return message


def _objects(document: object) -> Iterator[Mapping[str, Any]]:
    """The objects in one document: the document itself, the items of a List, or the entries of a list."""
    if isinstance(document, list):
        for item in document:
            yield from _objects(item)
    elif isinstance(document, Mapping):
        items = document.get("items")
        if str(document.get("kind", "")).endswith("List") and isinstance(items, list):
            yield from _objects(items)
        else:
            yield document


def load_objects(path: str) -> list[Mapping[str, Any]]:
    """Every object in a YAML or JSON file, in order. Raises CommandError (exit 2) naming the file."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file", returncode=USAGE_ERROR) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else _one_line(str(exc))
        raise CommandError(f"{path}: cannot read: {reason}", returncode=USAGE_ERROR) from None
    if path.endswith(".json"):
        try:
            documents: list[object] = [json.loads(text)]
        except json.JSONDecodeError as exc:
            message = f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
            raise CommandError(message, returncode=USAGE_ERROR) from None
    else:
        try:
            documents = list(yaml.load_all(text, Loader=_YAML_LOADER))
        except yaml.YAMLError as exc:
            raise CommandError(_yaml_error(path, exc), returncode=USAGE_ERROR) from None
    return [obj for document in documents for obj in _objects(document)]


def runtime_result(runtime: Mapping[str, Any], rules: SiteRules) -> dict[str, Any]:
    """One runtime's entry in the JSON output: who it is, then its verdict."""
    metadata = runtime.get("metadata")
    meta: Mapping[str, Any] = metadata if isinstance(metadata, Mapping) else {}
    verdict = check_runtime(runtime, rules=rules, allow_listed=None)  # the allow-list does not apply to files
    return {
        "name": meta.get("name"),
        "kind": runtime.get("kind"),
        "namespace": meta.get("namespace"),
        **verdict.to_dict(),
    }


class Command(BaseCommand):
    help = (
        "Check ClusterTrainingRuntime/TrainingRuntime manifests (YAML or JSON files) against dispatch's "
        "runtime rules and print every reason a runtime would be refused. Exit 0 whatever the verdicts, 2 on "
        "a file that cannot be read or parsed."
    )
    # Runs offline: no system checks, no database, no cluster.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "files", nargs="+", metavar="FILE", help="YAML or JSON files (multi-document YAML)"
        )
        parser.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
        parser.add_argument(
            "--allow-rank-restart",
            action="store_true",
            help="the site's allowRankRestart: waive Ignore rules and backoffLimitPerIndex (with a warning)",
        )
        parser.add_argument(
            "--publish-via", choices=PUBLISH_VIAS, default=PUBLISH_ENV, help="the site's publish.via"
        )
        parser.add_argument(
            "--publish-container",
            default="",
            metavar="NAME",
            help="the init container the identity is published into (with --publish-via initContainer)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["publish_via"] == PUBLISH_INIT_CONTAINER and not options["publish_container"]:
            message = "--publish-via initContainer needs --publish-container NAME (the init container's name)"
            raise CommandError(message, returncode=USAGE_ERROR)
        rules = SiteRules(
            allow_rank_restart=options["allow_rank_restart"],
            publish_via=options["publish_via"],
            publish_container=options["publish_container"],
        )

        # Read every file before printing anything, so a bad file never leaves half an output behind.
        objects = [obj for path in options["files"] for obj in load_objects(path)]
        runtimes = [obj for obj in objects if obj.get("kind") in RUNTIME_KINDS]
        results = [runtime_result(runtime, rules) for runtime in runtimes]

        if options["json"]:
            # default=str: a YAML date or number as a name must not crash the report.
            self.stdout.write(json.dumps(results, indent=2, default=str))
        else:
            self._write_table([runtime_ref(runtime) for runtime in runtimes], results)

    def _write_table(self, labels: list[str], results: list[dict[str, Any]]) -> None:
        if not results:
            self.stdout.write("no ClusterTrainingRuntime or TrainingRuntime found")
            return
        width = max(len(label) for label in labels)
        refused = 0
        for label, result in zip(labels, results, strict=True):
            refused += result["refused"]
            verdict = self.style.ERROR("REFUSED") if result["refused"] else self.style.SUCCESS("ACCEPTED")
            self.stdout.write(f"{label.ljust(width)}  {verdict}")
            for reason in result["reasons"]:
                waived = " (waived)" if reason["waived"] else ""
                self.stdout.write(f"    {reason['code']}{waived}: {reason['message']}")
            if result["identity_warning"]:
                self.stdout.write(self.style.WARNING(f"    warning: {result['identity_warning']}"))
        self.stdout.write(f"{len(results)} runtime(s): {len(results) - refused} accepted, {refused} refused")
