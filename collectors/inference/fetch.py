"""HTTP GET of an engine's /metrics, bounded in time and size."""

from __future__ import annotations

import base64
import socket
import threading
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

from lockstep import __version__
from lockstep.agent.seams import Seam
from lockstep.collectors.inference.readings import ScrapeError

# A real engine's /metrics is 0.1-2 MB; parsed, a body takes ~20 times its size (a 31 MB body
# took 630 MB of RSS), so it is capped at 4 MiB (16 targets at once: docs/configuration.md).
MAX_BODY_BYTES = 4 * 1024 * 1024

# GET URL with a timeout in seconds -> the body; a replacement raises OSError (or ScrapeError)
# like fetch_http below.  The simulated node answers its engines' /metrics through it.
INFERENCE_HTTP = Seam[Callable[[str, float], str]]("inference_http", "GET url with a timeout -> body")


def fetch_http(url: str, timeout: float) -> str:
    """GET url; the text, or ScrapeError saying why not.

    http.client rather than urllib: no proxy from the environment (the target is on this
    node).  The whole exchange, not each socket operation, is bounded by ``timeout``: a
    timer shuts the socket down at the deadline, which ends any read in progress (a target
    that trickled its headers a byte at a time used to hold a thread for ever, one more each
    round, until the pool was full and shutdown hung).
    """
    import http.client  # (with ssl: loaded on the first fetch, never on a node with no server)

    parts = urlsplit(url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname or "", parts.port, timeout=timeout)
    headers = {"Accept": "text/plain;version=0.0.4", "User-Agent": f"lockstep/{__version__}"}
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(credentials).decode()
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        sock = connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    timer = threading.Timer(timeout, cut)
    timer.daemon = True
    timer.start()
    answered = False  # the status line and headers have arrived
    try:
        connection.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
        response = connection.getresponse()
        answered = True
        if response.status != 200:
            raise ScrapeError(f"HTTP {response.status} {response.reason}".rstrip())
        body = bytearray()
        while chunk := response.read1(65536):
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise ScrapeError(f"answer larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB")
        if expired.is_set():
            raise TimeoutError
        return body.decode("utf-8", "replace")
    except (TimeoutError, OSError, http.client.HTTPException) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError):
            what = "complete answer" if answered else "answer"
            raise ScrapeError(f"no {what} within {timeout:g}s") from None
        if isinstance(exc, ConnectionRefusedError):
            raise ScrapeError("connection refused (nothing listens there)") from None
        raise ScrapeError(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None
    finally:
        timer.cancel()
        connection.close()
