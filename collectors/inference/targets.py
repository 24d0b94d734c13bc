"""Configured inference targets: ENGINE=URL parsed into what is fetched and the endpoint label."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from lockstep.agent.options import parse_string_list
from lockstep.collectors.inference.engines import ENGINE_FORMATS


@dataclass(frozen=True)
class Target:
    engine: str
    url: str  # what is fetched (may carry credentials)
    endpoint: str  # the label: scheme://host:port/path, without credentials or query


def parse_target(text: str) -> Target:
    engine, sep, url = text.partition("=")
    engine, url = engine.strip().lower(), url.strip()
    if not sep or engine not in ENGINE_FORMATS:
        raise ValueError(f"expected ENGINE=URL with ENGINE one of {', '.join(ENGINE_FORMATS)}, got {text!r}")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{text!r}: the port is not a number from 0 to 65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r}: expected an http:// or https:// URL with a host")
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = f"{host}:{port}" if port is not None else host
    return Target(
        engine,
        urlunsplit((parts.scheme, parts.netloc, path, parts.query, "")),
        urlunsplit((parts.scheme, netloc, path, "", "")),
    )


def parse_targets(value: Any) -> tuple[Target, ...]:
    targets: dict[str, Target] = {}
    for text in parse_string_list(value):
        target = parse_target(text)
        targets.setdefault(target.endpoint, target)
    return tuple(targets.values())
