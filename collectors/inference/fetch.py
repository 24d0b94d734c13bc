"""HTTP GET of an engine's /metrics, bounded in time and size."""

from __future__ import annotations

import base64
import http.client
import time
from urllib.parse import unquote, urlsplit

from lockstep import __version__
from lockstep.collectors.inference.readings import ScrapeError

MAX_BODY_BYTES = 32 * 1024 * 1024


def fetch_http(url: str, timeout: float) -> str:
    """GET url; the text, or ScrapeError saying why not.

    http.client rather than urllib: no proxy from the environment (the target is on this
    node), and the whole answer, not each socket operation, is bounded by ``timeout``.
    """
    parts = urlsplit(url)
    deadline = time.monotonic() + timeout
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname or "", parts.port, timeout=timeout)
    headers = {"Accept": "text/plain;version=0.0.4", "User-Agent": f"lockstep/{__version__}"}
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(credentials).decode()
    try:
        connection.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
        sock = connection.sock  # getresponse may drop the connection's reference to it
        response = connection.getresponse()
        if response.status != 200:
            raise ScrapeError(f"HTTP {response.status} {response.reason}".rstrip())
        body = bytearray()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ScrapeError(f"no complete answer within {timeout:g}s")
            if sock is not None:
                sock.settimeout(remaining)
            chunk = response.read1(65536)
            if not chunk:
                break
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise ScrapeError(f"answer larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB")
        return body.decode("utf-8", "replace")
    except TimeoutError:
        raise ScrapeError(f"no answer within {timeout:g}s") from None
    except ConnectionRefusedError:
        raise ScrapeError("connection refused (nothing listens there)") from None
    except (OSError, http.client.HTTPException) as exc:
        raise ScrapeError(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None
    finally:
        connection.close()
