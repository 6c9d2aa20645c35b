"""A TCP proxy in front of a real server, which a test can cut and restore: the server's clients
see it go away (every open connection reset, new ones refused) and come back on the same port,
as they would a PostgreSQL restart or failover, without touching the machine's own server."""

from __future__ import annotations

import socket
import threading
from types import TracebackType

from delivery.testing.smtp_server import free_port


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.connections = 0  # accepted since start, for tests that check the proxy was used

    def __enter__(self) -> TcpProxy:
        self.restore()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cut()

    def restore(self) -> None:
        """Accept connections again (on the same port)."""
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(128)
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and reset every open one, both ways."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        if listener is not None:
            # shutdown() wakes the accept() blocked on it in _accept: a socket closed while a
            # thread waits in accept() stays listening in the kernel (it would still accept, and
            # restore() could not bind the port again).
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        for sock in sockets:
            # shutdown() first: it wakes the pump blocked in recv() on this socket, and only
            # then does close() end the connection (a blocked recv keeps the kernel's socket
            # alive, and PostgreSQL's session with it).
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    server.close()
                    return
                self._sockets.update((client, server))
                self.connections += 1
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                self._sockets.discard(source)
                self._sockets.discard(sink)
            source.close()
            sink.close()
