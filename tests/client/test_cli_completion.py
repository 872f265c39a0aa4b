"""`dispatch completion bash`: the script shtab writes from the CLI's own parser, sourced by a real bash and
asked what a user's TAB would ask (bash's programmable completion: COMP_WORDS, COMP_CWORD, the function)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DISPATCH = Path(sys.executable).parent / "dispatch"


def _complete(*words: str) -> list[str]:
    """What bash offers after `words` (the last one is the partial word being completed)."""
    array = " ".join(f"'{w}'" for w in words)
    script = (
        f'source <("{DISPATCH}" completion bash)\n'
        f"COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}\n"
        f'COMP_LINE="{" ".join(words)}"; COMP_POINT=${{#COMP_LINE}}\n'
        "_shtab_dispatch\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=True)
    return sorted(w.strip() for w in done.stdout.splitlines() if w.strip())


def test_bash_completes_commands_their_flags_and_session_subcommands() -> None:
    assert _complete("dispatch", "lo") == ["logs"]
    assert "--follow" in _complete("dispatch", "logs", "j1", "--f")
    assert _complete("dispatch", "logs", "j1", "--ra") == ["--rank"]
    assert _complete("dispatch", "session", "e") == ["exec"]
    assert {"plan", "start", "status", "jobs", "logs", "cancel", "runtimes", "session"} <= set(
        _complete("dispatch", "")
    )


def test_an_unknown_shell_is_a_usage_error() -> None:
    done = subprocess.run([str(DISPATCH), "completion", "fish"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "invalid choice: 'fish'" in done.stderr
