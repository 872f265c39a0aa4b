"""scripts/respawn, under which `make up` runs the Celery worker: a command that exits on its own is started
again; SIGTERM (what `make down` sends) stops the command and the loop, and nothing is started after it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.client.conftest import REPO

RESPAWN = str(REPO / "scripts" / "respawn")


def _wait_for_lines(path: Path, count: int, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lines = path.read_text().split() if path.exists() else []
        if len(lines) >= count:
            return lines
        time.sleep(0.1)
    raise AssertionError(f"{path} has fewer than {count} lines after {seconds} s")


def test_a_command_that_exits_on_its_own_is_started_again(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    loop = subprocess.Popen(
        [RESPAWN, "bash", "-c", f'echo $$ >> "{runs}"; exit 3'], stderr=subprocess.PIPE, text=True
    )
    try:
        pids = _wait_for_lines(runs, 2, 10)
        assert pids[0] != pids[1]  # a new process, not the same one
    finally:
        loop.send_signal(signal.SIGTERM)
        _, stderr = loop.communicate(timeout=10)
    assert loop.returncode == 0
    assert "exited on its own (status 3); starting it again in 2 s" in stderr


def test_sigterm_stops_the_command_and_the_loop(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    loop = subprocess.Popen([RESPAWN, "bash", "-c", f'echo $$ >> "{runs}"; exec sleep 60'])
    try:
        (child,) = _wait_for_lines(runs, 1, 10)
    finally:
        loop.send_signal(signal.SIGTERM)
        loop.wait(timeout=10)
    assert loop.returncode == 0
    time.sleep(0.5)
    try:
        os.kill(int(child), 0)
    except ProcessLookupError:
        pass
    else:
        raise AssertionError(f"the command (pid {child}) outlived scripts/respawn")
    assert len(runs.read_text().split()) == 1  # not started again after the stop
