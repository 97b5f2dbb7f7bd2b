"""A TCP relay between a browser and a server whose connections a test can cut: the
network going away for a while (Wi-Fi, a VPN, a laptop lid), as a page meets it. While
cut, every open connection is closed and each new one is closed as soon as it arrives,
so the browser's ``EventSource`` sees its stream end and its retries fail."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class CutProxy:
    """Relays 127.0.0.1:``port`` to ``target``; ``cut()`` and ``restore()`` the network."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.is_cut = threading.Event()
        self.refused = 0  # connections closed on arrival while cut
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.is_cut.is_set():
                self.refused += 1
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(src, dst)

    def _drop(self, *socks: socket.socket) -> None:
        with self._lock:
            for s in socks:
                self._open.discard(s)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def cut(self) -> None:
        """The network goes: open connections end, new ones are closed on arrival."""
        self.is_cut.set()
        with self._lock:
            socks = list(self._open)
        self._drop(*socks)

    def restore(self) -> None:
        self.is_cut.clear()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self.listener.close()


@contextlib.contextmanager
def cut_proxy(target: tuple[str, int]) -> Iterator[CutProxy]:
    proxy = CutProxy(target)
    try:
        yield proxy
    finally:
        proxy.close()
