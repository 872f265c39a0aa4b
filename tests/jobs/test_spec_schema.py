"""The schema's patterns state exactly the rules the server applies (jobs.spec), on generated strings.

Each pattern is what a client (or a schema-driven fuzzer) validates against before sending; each check
function is what the API applies. A string one accepts and the other refuses is a request the schema calls
valid and the server answers 400 (or the reverse). Strings come from the pattern itself (every one must pass
the server's check) and from an alphabet of the characters that matter (both must agree), plus edge cases.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch_site.names import DEFAULT_LABEL_DOMAIN
from jobs.serializers import (
    ENV_NAME_SCHEMA,
    LABEL_KEY_SCHEMA,
    LABEL_VALUE_SCHEMA,
    reserved_label_problem,
)
from jobs.sessions.api import SESSION_NAME_PATTERN
from jobs.sessions.api import _name_problem as session_name_problem
from jobs.spec import (
    IMAGE_PATTERN,
    QUALIFIED_NAME_PATTERN,
    QUANTITY_PATTERN,
    env_name_problem,
    image_problem,
    label_value_problem,
    qualified_name_problem,
    quantity_problem,
)


def _label_key_problem(key: str) -> str | None:
    problem = qualified_name_problem(key)
    if problem:
        return problem
    return reserved_label_problem(key, DEFAULT_LABEL_DOMAIN)


def _label_value_problem(value: str) -> str | None:
    if len(value) > LABEL_VALUE_SCHEMA["maxLength"]:
        return "too long"
    return label_value_problem(value)


# (name, pattern, the server's check, an alphabet that reaches every branch, edge cases)
RULES: list[tuple[str, str, Callable[[str], str | None], str, list[str]]] = [
    (
        "env name",
        ENV_NAME_SCHEMA["pattern"],
        env_name_problem,
        "AZaz09_PETDISPATCHJOB-. \n",
        [
            "A",
            "_",
            "1A",
            "PET_",
            "PET_X",
            "PETX",
            "DISPATCH_JOB",
            "JAX_PROCESS_ID",
            "JAX_PLATFORMS",
            "JOB_COMPLETION_INDEX",
            "JOB_COMPLETION_INDEXX",
            "A\n",
            "",
            "A-B",
        ],
    ),
    (
        "label key",
        LABEL_KEY_SCHEMA["pattern"],
        _label_key_problem,
        "az09AZ-_./",
        [
            "a",
            "a/b",
            "/a",
            "a/",
            "a//b",
            "a.b/c",
            "A/b",
            "a-/b",
            "-a",
            "a_",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/managed-byx",
            "kueue.x-k8s.io/queue-name",
            "kueue.x-k8s.io/priority-class",
            "kueue.x-k8s.iox/a",
            "jobset.sigs.k8s.io/jobset-name",
            "trainer.kubeflow.org/trainjob-ancestor-step",
            "batch.kubernetes.io/job-completion-index",
            "x.batch.kubernetes.io/a",
            "dispatch.dev/job",
            "dispatch.devx/job",
            "x" * 63,
            "x" * 64,
            f"{'a' * 253}/b",
            f"{'a' * 254}/b",
            "a\n",
        ],
    ),
    (
        "session name",
        SESSION_NAME_PATTERN,
        session_name_problem,
        "aj2b7-09z",
        [
            "a",
            "jabcdefghij",
            "jabcdefghij-2",
            "jabcdefghij-2-x",
            "jabcdefghij-x",
            "jabcdefghi-2",
            "jabcdefghij1-2",
            "jabcdefghij-",
            "xjabcdefghij-2",
            "a" * 63,
            "a" * 64,
            "1a",
            "a-",
        ],
    ),
    (
        "resource name",
        QUALIFIED_NAME_PATTERN,
        qualified_name_problem,
        "az09AZ-_./",
        ["cpu", "nvidia.com/gpu", "example.com/x/y", f"{'a.' * 126}a/b", f"{'a.' * 127}a/b"],
    ),
    (
        "label value",
        LABEL_VALUE_SCHEMA["pattern"],
        _label_value_problem,
        "az09AZ-_.",
        ["", "a", "-a", "a-", "a" * 63, "a" * 64, "a\n"],
    ),
    (
        "quantity",
        QUANTITY_PATTERN,
        quantity_problem,
        "0123456789.+-eEKiMGnumk ",
        [
            "1",
            "500m",
            "2Gi",
            "1e3",
            "+1",
            "-1",
            "-0",
            ".5",
            "5.",
            ".",
            "1Ki",
            "1K",
            "1e",
            "5\n",
            "",
            "1e999999",
            "1e-999999",
            "1e1000000",
            "1e0000999999",
            "9" * 40 + "e999999",
        ],
    ),
]
RULES.append(
    (
        "image",
        IMAGE_PATTERN,
        image_problem,
        "az:/@.-_ \t\n\x00\x1d\x7f\u00e9\u3000",
        ["localhost/trainer:v1", "a@sha256:0f", "", " ", "a b", "a\n", "\x1d", "caf\u00e9", "~!"],
    )
)
IDS = [rule[0] for rule in RULES]


def _schema_accepts(pattern: str, value: str) -> bool:
    # JSON Schema's `pattern` is a search with ECMA-262 semantics, where `$` does not match before a final
    # newline; Python's `$` does, so the whole string must match (fullmatch) to read it the ECMA way.
    return re.fullmatch(pattern.removeprefix("^").removesuffix("$"), value) is not None and (
        re.search(pattern, value) is not None
    )


@pytest.mark.parametrize(("name", "pattern", "problem", "alphabet", "edges"), RULES, ids=IDS)
def test_the_edge_cases_agree(
    name: str, pattern: str, problem: Callable[[str], str | None], alphabet: str, edges: list[str]
) -> None:
    for value in edges:
        assert _schema_accepts(pattern, value) == (problem(value) is None), (name, value, problem(value))


@pytest.mark.parametrize(("name", "pattern", "problem", "alphabet", "edges"), RULES, ids=IDS)
def test_every_string_the_pattern_generates_is_accepted(
    name: str, pattern: str, problem: Callable[[str], str | None], alphabet: str, edges: list[str]
) -> None:
    @settings(max_examples=300, derandomize=True, deadline=None)
    @given(st.from_regex(pattern, fullmatch=True))
    def check(value: str) -> None:
        assert problem(value) is None, (name, value, problem(value))

    check()


@pytest.mark.parametrize(("name", "pattern", "problem", "alphabet", "edges"), RULES, ids=IDS)
def test_the_pattern_and_the_check_agree_on_any_string(
    name: str, pattern: str, problem: Callable[[str], str | None], alphabet: str, edges: list[str]
) -> None:
    @settings(max_examples=500, derandomize=True, deadline=None)
    @given(st.text(alphabet=alphabet, max_size=80))
    def check(value: str) -> None:
        assert _schema_accepts(pattern, value) == (problem(value) is None), (name, value, problem(value))

    check()
