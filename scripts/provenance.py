"""What a figure was measured on: the commit (and whether the checkout differed from it). Every chaos and
bench report carries it, and the committed figure files (docs/figures/, scripts/figures) keep it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


def commit_of(repo: Path) -> dict[str, Any]:
    """HEAD of the checkout at `repo`, and whether tracked files differ from it (dirty: the figures then
    measure something no commit holds; `changed` lists what)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
        return done.stdout.rstrip("\n")  # not strip(): `git status --porcelain` starts lines with a space

    changed = git("status", "--porcelain", "--untracked-files=no").splitlines()
    return {
        "sha": git("rev-parse", "HEAD"),
        "dirty": bool(changed),
        "changed": changed[:20],
        "subject": git("log", "-1", "--format=%s"),
        "committed_at": git("log", "-1", "--format=%cI"),
    }
