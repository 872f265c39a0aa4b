"""The local control plane's processes as the run kills and restarts them (kube-apiserver, the Trainer, JobSet
and Kueue controllers), and the witness: a second kube-apiserver on the same etcd that the identity observer
and the run's own reads go through, so that killing the first one blinds neither.

A component is the process `scripts/cluster up` started and recorded (<state>/pids/<name>.pid). It is killed
with SIGKILL and started again exactly as it ran: the same argv, environment and working directory, read from
/proc before the kill, in a session of its own, its output appended to its log, its new pid recorded where
`scripts/cluster` looks (so `scripts/cluster status` and `down` keep working on it). The state lock
`scripts/cluster` takes is held meanwhile, so no `scripts/cluster up` or `down` runs in between."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scripts.chaoslib.stack import free_port, running


@dataclass(frozen=True)
class Snapshot:
    """How a process ran: what starting it again needs."""

    pid: int
    argv: list[str]
    env: dict[str, str]
    cwd: str


def snapshot(pid: int) -> Snapshot:
    proc = Path(f"/proc/{pid}")
    argv = [a.decode() for a in proc.joinpath("cmdline").read_bytes().split(b"\0") if a]
    env = dict(
        item.decode().split("=", 1)
        for item in proc.joinpath("environ").read_bytes().split(b"\0")
        if b"=" in item
    )
    return Snapshot(pid=pid, argv=argv, env=env, cwd=str((proc / "cwd").readlink()))


def flag(argv: list[str], name: str) -> str | None:
    """The value of `--name=value` (or `--name value`) in argv."""
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def tcp_refused(host: str, port: int, *, within: float = 0.0) -> bool:
    """A TCP connect to host:port is refused (nothing listens), trying again for up to `within` seconds: a
    killed process's other threads may hold its sockets a moment after /proc shows it a zombie."""
    deadline = time.monotonic() + within
    while True:
        try:
            socket.create_connection((host, port), timeout=2).close()
        except ConnectionRefusedError:
            return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError):
        return False


class Plane:
    """The local plane's state directory (the admin kubeconfig's) and its recorded processes."""

    def __init__(self, kubeconfig: str) -> None:
        self.state = Path(kubeconfig).resolve().parent
        self.pids = self.state / "pids"
        self.logs = self.state / "logs"

    def is_local(self) -> bool:
        return (self.pids / "kube-apiserver.pid").is_file()

    def pid(self, component: str) -> int | None:
        try:
            pid = int((self.pids / f"{component}.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if running(pid) else None

    def etcd_durability(self) -> str:
        """Whether the plane's etcd syncs its writes to disk, from its command line."""
        pid = self.pid("etcd")
        if pid is None:
            return "unknown (etcd is not the plane's recorded process)"
        if "--unsafe-no-fsync" in snapshot(pid).argv:
            return "fsync off (--unsafe-no-fsync: a crash of the machine may lose the last writes)"
        return "fsync on"

    @contextlib.contextmanager
    def locked(self, timeout: float = 120) -> Iterator[None]:
        """The lock `scripts/cluster` holds while it starts or stops anything (flock on <state>/.lock)."""
        with (self.state / ".lock").open("a") as lock:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{self.state}/.lock held for {timeout:.0f} s") from None
                    time.sleep(0.2)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def kill(self, component: str) -> Snapshot:
        """SIGKILL the component; returns how it ran. Waits until the process is gone."""
        pid = self.pid(component)
        if pid is None:
            raise RuntimeError(f"{component} is not running (no live pid in {self.pids})")
        ran = snapshot(pid)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while running(pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{component} (pid {pid}) still runs 30 s after SIGKILL")
            time.sleep(0.05)
        return ran

    def start(self, component: str, ran: Snapshot) -> int:
        """Start the component again as it ran, detached as `scripts/cluster` starts it (its own session,
        parented to init), and record its pid. The new pid."""
        log = self.logs / f"{component}.log"
        with log.open("ab") as out:
            out.write(f"\n--- chaos: restarted after SIGKILL of pid {ran.pid} ---\n".encode())
        started = subprocess.run(
            ["sh", "-c", 'setsid "$@" </dev/null >>"$LOG" 2>&1 & echo $!', "sh", *ran.argv],
            env={**ran.env, "LOG": str(log)},
            cwd=ran.cwd,
            capture_output=True,
            text=True,
            check=True,
        )
        pid = int(started.stdout.strip())
        (self.pids / f"{component}.pid").write_text(f"{pid}\n")
        return pid

    def health_url(self, ran: Snapshot) -> str | None:
        """A controller's readiness endpoint, from its --config (health.healthProbeBindAddress)."""
        config = flag(ran.argv, "config")
        if not config:
            return None
        address = ((yaml.safe_load(Path(config).read_text()) or {}).get("health") or {}).get(
            "healthProbeBindAddress"
        )
        return f"http://{address}/readyz" if address else None

    def webhook_port(self, ran: Snapshot) -> int | None:
        config = flag(ran.argv, "config")
        if not config:
            return None
        port = ((yaml.safe_load(Path(config).read_text()) or {}).get("webhook") or {}).get("port")
        return int(port) if port else None


class Witness:
    """A second kube-apiserver on the plane's etcd, with the first one's flags but its own port: what the run
    reads and the identity observer watches through, so a fault to the first API server is seen from outside
    it. Started and stopped by the run (it is not one of the plane's recorded processes)."""

    def __init__(self, plane: Plane, kubeconfig: str, run_dir: Path) -> None:
        self.plane, self.source, self.run_dir = plane, kubeconfig, run_dir
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.kubeconfig = str(run_dir / "witness.kubeconfig")

    def start(self, timeout: float = 180) -> str:
        pid = self.plane.pid("kube-apiserver")
        if pid is None:
            raise RuntimeError("kube-apiserver is not running: no witness can be started beside it")
        ran = snapshot(pid)
        self.port = free_port()
        argv = [a for a in ran.argv if not a.startswith("--secure-port")]
        argv.append(f"--secure-port={self.port}")
        # An API server names its identity lease (kube-system/apiserver-<hash>) after the machine's hostname:
        # two on one machine would fight over one lease. The witness runs under a hostname of its own (a UTS
        # namespace: only its own view of the hostname changes).
        hostname = f"chaos-witness-{self.port}"
        if shutil.which("unshare") and os.geteuid() == 0:
            argv = ["unshare", "--uts", "sh", "-c", f'hostname {hostname} && exec "$@"', "sh", *argv]
        out = (self.run_dir / "witness-apiserver.log").open("ab")
        self.process = subprocess.Popen(
            argv, env=ran.env, cwd=ran.cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        config = yaml.safe_load(Path(self.source).read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        Path(self.kubeconfig).write_text(yaml.safe_dump(config))
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"the witness API server exited ({self.process.returncode}); see its log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the witness API server was not ready within {timeout:.0f} s")
            time.sleep(0.5)
        return self.kubeconfig

    def ready(self) -> bool:
        return readyz(self.kubeconfig)

    def kill(self) -> None:
        """A fault switch's (`--break observer-blind`): the witness dies and stays down."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def readyz(kubeconfig: str) -> bool:
    """GET /readyz on the kubeconfig's API server answered 200 (its own client: TLS and credentials)."""
    from kubernetes import config

    try:
        api_client = config.new_client_from_config(config_file=kubeconfig)
    except Exception:
        return False
    try:
        host = api_client.configuration.host
        answer: Any = api_client.rest_client.pool_manager.request(
            "GET", f"{host}/readyz", timeout=3.0, retries=False
        )
        return bool(answer.status == 200)
    except Exception:
        return False
    finally:
        api_client.close()
