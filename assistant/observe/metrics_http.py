"""The ``/metrics`` HTTP server: a fixed pool of workers, so no flood of connections costs a turn.

prometheus-client's ``start_http_server`` starts a thread per connection with no limit: 3,000
half-open connections gave 3,000 threads and starved the voice loop. This server is the same WSGI
app (``make_wsgi_app``) behind a bounded design: one thread accepts, a few workers answer, at most
``PENDING`` accepted connections wait for a worker, and every connection has a socket timeout. A
connection that arrives while all of that is taken is closed at once (Prometheus retries at its
next interval), so threads and memory stay fixed whatever arrives, and scrapes answer again as
soon as a flood stops.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import make_wsgi_app
from prometheus_client.registry import CollectorRegistry

logger = logging.getLogger(__name__)

WORKERS = 3  # answer scrapes; one Prometheus scrapes one at a time, a second tool may too
PENDING = 16  # accepted connections waiting for a worker; more are closed at once
BACKLOG = 16  # the kernel's queue of connections not yet accepted (listen()'s backlog)
TIMEOUT_S = 2.0  # a connection silent this long (half-open, slow) gives its worker back


class _QuietHandler(WSGIRequestHandler):
    """One request per connection, with a socket timeout, and no access log on stderr."""

    timeout = TIMEOUT_S  # StreamRequestHandler.setup() applies it to the socket

    def log_message(self, format: str, *args: object) -> None:
        """Scrapes are not logged: stderr belongs to the UI."""


class BoundedMetricsServer(WSGIServer):
    """A WSGI server with ``WORKERS`` threads, ``PENDING`` queued connections and timeouts.

    Call :meth:`serve_forever` in a thread (:func:`start_metrics_server` does), then
    :meth:`shutdown` and :meth:`server_close`, which also stops and joins the workers.
    """

    request_queue_size = BACKLOG
    daemon_threads = True

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        """Bind ``host:port`` (IPv4 or IPv6, as the host says) and start the workers.

        Raises:
            OSError: The address cannot be bound (in use, not ours, not allowed).
        """
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        self.address_family = info[0][0]
        self._pending: queue.Queue[tuple[socket.socket, object] | None] = queue.Queue(PENDING)
        self._workers: list[threading.Thread] = []  # a failed bind calls server_close() inside
        super().__init__((host, port), _QuietHandler)
        self.set_app(make_wsgi_app(registry))
        self._workers = [
            threading.Thread(target=self._work, name=f"metrics-worker-{i}", daemon=True)
            for i in range(WORKERS)
        ]
        for worker in self._workers:
            worker.start()

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        """Queue an accepted connection for a worker, or close it when the queue is full."""
        try:
            self._pending.put_nowait((request, client_address))
        except queue.Full:
            self.shutdown_request(request)

    def _work(self) -> None:
        """Answer queued connections until :meth:`server_close` sends each worker ``None``."""
        while (item := self._pending.get()) is not None:
            request, client_address = item
            try:
                self.finish_request(request, client_address)  # type: ignore[arg-type]
            except Exception:  # a timeout or reset ends that connection only
                logger.debug("metrics connection from %s ended early", client_address, exc_info=True)
            finally:
                self.shutdown_request(request)

    def handle_error(self, request: object, client_address: object) -> None:
        """A failed connection is logged at debug level, never printed over the UI."""
        logger.debug("metrics connection from %s failed", client_address, exc_info=True)

    def server_close(self) -> None:
        """Close the listening socket, drop waiting connections, stop and join the workers."""
        super().server_close()
        while True:
            try:
                item = self._pending.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self.shutdown_request(item[0])
        for _ in self._workers:
            self._pending.put(None)
        for worker in self._workers:
            worker.join(TIMEOUT_S * 2)


def start_metrics_server(host: str, port: int, registry: CollectorRegistry) -> BoundedMetricsServer:
    """Serve ``registry`` on ``host:port`` from a daemon accept thread and ``WORKERS`` workers.

    Raises:
        OSError: The address cannot be bound.
    """
    server = BoundedMetricsServer(host, port, registry)
    threading.Thread(target=server.serve_forever, name="metrics-accept", daemon=True).start()
    return server
