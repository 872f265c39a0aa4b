"""The README's first hour works as written (issue 37).

The fenced blocks the README marks `<!-- first-job -->` are run by this test, in the README's order and
exactly as written, against the stack `make up` starts: `make up` itself runs in a copy of this checkout
(its own `var/`, so its SQLite, first user and pids are its own), on the test plane (KUBECONFIG) and a
Redis database of its own (REDIS_URL), the two settings `make up` takes from its environment. `make down`
stops what it started. The one change: the URL make up printed (a free port, not the default 8000).

A block the README changes is what this test runs: no second copy of the commands lives here, only what
each block must show (the job's end state, the cause the CLI's job asked for).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from django.conf import settings

pytestmark = [pytest.mark.cluster]
REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MARK = "<!-- first-job -->"
FIRST_JOB_REDIS_DB = 13


@dataclass(frozen=True)
class Block:
    language: str
    text: str


def first_job_blocks(markdown: str) -> list[Block]:
    """The fenced blocks that follow a first-job marker, in order."""
    blocks = []
    for match in re.finditer(re.escape(MARK) + r"\n```(\w+)\n(.*?)\n```", markdown, re.S):
        blocks.append(Block(match.group(1), match.group(2)))
    return blocks


def test_the_readme_marks_its_first_job_blocks() -> None:
    blocks = first_job_blocks(README.read_text())
    # setup, curl, Python client, CLI: a marker that no longer precedes a fence would silently drop a block.
    assert [b.language for b in blocks] == ["bash", "bash", "python", "bash"]
    assert README.read_text().count(MARK) == len(blocks)


def test_every_link_of_the_readme_resolves() -> None:
    text = README.read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not re.match(r"\w+://", link)]
    assert local, "the README links to the docs"
    assert [link for link in local if not (REPO / link).exists()] == []
    assert len(README.read_text().splitlines()) <= 250, "the README is the first hour, not the manual"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _copy_checkout(target: Path) -> None:
    """The checkout's files as git sees them (tracked and new, not ignored), with their times kept so
    that make finds the shared venv up to date."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        source = REPO / raw.decode()
        if not source.is_file():
            continue  # deleted in the work tree
        destination = target / raw.decode()
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)
    (target / ".venv").symlink_to(REPO / ".venv")


@dataclass
class Stack:
    checkout: Path
    env: dict[str, str]
    url: str

    def run(self, block: Block, timeout: float = 300) -> str:
        command = (
            ["bash", "-euo", "pipefail", "-c"] if block.language == "bash" else [".venv/bin/python", "-c"]
        )
        done = subprocess.run(
            [*command, block.text],
            cwd=self.checkout,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, (
            f"{block.text}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr[-4000:]}"
        )
        return done.stdout


@pytest.fixture
def make_up(kubeconfig: str, tmp_path: Path) -> Iterator[Stack]:
    checkout = tmp_path / "dispatch"
    _copy_checkout(checkout)
    redis_url = settings.REDIS_URL.rsplit("/", 1)[0] + f"/{FIRST_JOB_REDIS_DB}"
    redis.Redis.from_url(redis_url).flushdb()
    port = _free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        # make up's own defaults (SQLite under its var/, DEBUG as make up sets it), not the test run's
        if not key.startswith(("DATABASE_URL", "DJANGO_", "PYTEST", "DISPATCH_")) and key != "DEBUG"
    }
    env |= {"KUBECONFIG": kubeconfig, "REDIS_URL": redis_url, "PORT": str(port)}
    up = subprocess.run(
        ["make", "up"], cwd=checkout, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    try:
        assert up.returncode == 0, f"make up: {up.stdout[-3000:]}\n{up.stderr[-3000:]}"
        assert f"http://127.0.0.1:{port}/" in up.stdout
        yield Stack(checkout, env, f"http://127.0.0.1:{port}")
    finally:
        down = subprocess.run(
            ["make", "down"], cwd=checkout, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert down.returncode == 0, down.stderr


def test_the_readme_first_job_runs_as_written(make_up: Stack) -> None:
    setup, curl, python, cli = first_job_blocks(README.read_text())
    assert "export DISPATCH_URL=http://127.0.0.1:8000" in setup.text
    # The one change: the URL make up printed for this stack.
    setup = Block(setup.language, setup.text.replace("http://127.0.0.1:8000", make_up.url))
    prelude = setup.text + "\n"

    out = make_up.run(Block("bash", prelude + curl.text))
    assert "refused: False []" in out
    states = [line.split()[-1] for line in out.splitlines() if re.match(r"^j\w+ \w+$", line)]
    assert states and states[-1] == "succeeded", out

    # The Python block runs in the shell the setup block exported its variables into.
    token = make_up.run(Block("bash", prelude + 'echo "$DISPATCH_TOKEN"')).strip()
    assert token
    python_env = make_up.env | {"DISPATCH_URL": make_up.url, "DISPATCH_TOKEN": token}
    out = Stack(make_up.checkout, python_env, make_up.url).run(python)
    assert out.splitlines()[0] == "False []", out
    assert out.splitlines()[-1].split()[1] == "succeeded", out

    out = make_up.run(Block("bash", prelude + cli.text))
    assert "dispatch-kind" in out  # dispatch runtimes
    assert "the job failed, as asked" in out
    assert "app-error" in out, out  # the CLI names the cause of the job it waited for
