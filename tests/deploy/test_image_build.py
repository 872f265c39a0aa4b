"""The image's build, checked without building it (`make image` takes 1.5 to 4 minutes and needs buildah and
mmdebstrap; it checks the size itself and fails over IMAGE_MAX_MB, 250 MB by default): the final stage
copies only the venv and the app onto a root filesystem without a package manager or build tools, and
what the build removes from the dependencies is never read at run time (issue 37)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.deploy.test_image_settings import PYTHON, _run

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = (REPO / "Containerfile").read_text()
BUILD = (REPO / "deploy" / "image" / "build").read_text()


def stages() -> list[str]:
    """The Containerfile's stages, each from its FROM line, comments and continuations joined."""
    text = "\n".join(line for line in CONTAINERFILE.splitlines() if not line.lstrip().startswith("#"))
    text = text.replace("\\\n", " ")
    return ["FROM " + part for part in re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]]


def instructions(stage: str) -> list[str]:
    return [line.split()[0] for line in stage.splitlines() if line.strip()]


def build_variable(name: str) -> str:
    match = re.search(rf"^{name}=(\S+)", BUILD, flags=re.MULTILINE)
    assert match, f"{name}= is not set in deploy/image/build"
    return match.group(1)


def test_the_final_stage_copies_only_the_venv_and_the_app_and_runs_nothing() -> None:
    *builders, final = stages()
    assert builders, "the Containerfile has one stage: the build must not leave its tools in the image"
    assert final.splitlines()[0].strip() == "FROM scratch"
    assert "ADD rootfs.tar /" in final
    copies = re.findall(r"^COPY (.*)$", final, flags=re.MULTILINE)
    assert copies == ["--from=build /opt/venv /opt/venv", "--from=build /app /app"]
    # No RUN: nothing is installed, compiled or downloaded in the final layer.
    assert "RUN" not in instructions(final)
    assert re.search(r"^USER 10001:10001$", final, flags=re.MULTILINE)


def test_the_final_root_filesystem_has_no_package_manager_pip_or_build_tools() -> None:
    runtime = set(build_variable("PACKAGES").split(","))
    build = set(build_variable("BUILD_PACKAGES").split(","))
    assert "python3.11" in runtime
    tools = {"apt", "python3-pip", "python3.11-venv", "python3-pip-whl", "binutils", "gcc", "build-essential"}
    assert not runtime & tools, runtime & tools
    assert "binutils" in build  # strip, in the build stage only
    # The essential set (no apt), merged /usr without usrmerge and its perl, no docs, man pages or locales.
    assert re.search(r'debstrap "\$rootfs" essential "\$PACKAGES"', BUILD)
    assert "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr" in BUILD
    for excluded in ("/usr/share/man/*", "/usr/share/doc/*", "/usr/share/locale/*"):
        assert f"path-exclude={excluded}" in BUILD
    assert "dispatch:x:10001:10001:" in BUILD


def test_the_build_fails_over_250_mb() -> None:
    assert "IMAGE_MAX_MB=${IMAGE_MAX_MB:-250}" in BUILD
    assert re.search(r"\(\(mb <= IMAGE_MAX_MB\)\) \|\|\s+die ", BUILD)


def test_message_catalogues_are_removed_only_while_django_never_reads_them() -> None:
    assert "-name LC_MESSAGES" in CONTAINERFILE
    result = _run(
        PYTHON,
        "-c",
        "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'dispatch_site.settings'); "
        "django.setup(); from django.conf import settings; print(settings.USE_I18N)",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False", "USE_I18N is on: keep the LC_MESSAGES catalogues in the image"


def test_the_app_never_imports_kubernetes_aio_which_the_image_removes() -> None:
    assert 'rm -rf "$site/kubernetes/aio"' in CONTAINERFILE
    pattern = re.compile(r"kubernetes\.aio|from kubernetes import .*\baio\b")
    skip = {".venv", "tests", "docs", "node_modules", ".git", "var"}
    offenders = [
        str(path.relative_to(REPO))
        for path in REPO.rglob("*.py")
        if not skip & set(path.relative_to(REPO).parts) and pattern.search(path.read_text(errors="replace"))
    ]
    assert offenders == []


def test_the_image_leaves_out_the_tests_and_the_docs() -> None:
    assert "':(exclude)tests/' ':(exclude)docs/'" in BUILD
