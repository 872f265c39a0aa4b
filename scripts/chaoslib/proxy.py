"""The TCP proxy dispatch reaches the API server through: the API server outage is this proxy refusing."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class Proxy:
    """TCP proxy 127.0.0.1:port -> the API server. pause(): the listener and every connection close, so
    dispatch's calls are refused as if the API server were down; resume() listens again on the same port."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.accept_thread: threading.Thread | None = None

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self.accept_thread = threading.Thread(
            target=self._accept, args=(listener,), name=f"proxy-accept-{self.port}", daemon=True
        )
        self.accept_thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._conns |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
                with self._lock:
                    self._conns.discard(s)

    def pause(self) -> None:
        if self._listener is not None:
            # shutdown() first: close() alone leaves the socket listening while the accept thread is blocked
            # in accept() on it (Linux), and the "outage" would accept and proxy every new connection.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def resume(self) -> None:
        for _ in range(50):  # the port may be briefly held by a connection in TIME_WAIT
            try:
                self.start()
                return
            except OSError:
                time.sleep(0.2)
        self.start()

    def refuses(self) -> tuple[bool, str]:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
        except ConnectionRefusedError as exc:
            return True, repr(exc)
        except OSError as exc:
            return False, repr(exc)
        return False, "a connection was accepted"
