"""Test-time compression: the rules rendered with shorter `for:` and range windows, so a test can
watch them fire against a demo within a minute or two.  Production renders with PRODUCTION."""

from __future__ import annotations

import re
from dataclasses import dataclass

_DURATION = re.compile(r"^(\d+)([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RANGE = re.compile(r"\[(\d+[smhd])\]|offset (\d+[smhd])")


def scale_duration(duration: str, factor: float, minimum: int = 1) -> str:
    """A Prometheus duration times factor, in whole seconds (at least minimum unless it was 0)."""
    match = _DURATION.match(duration)
    if not match:
        raise ValueError(f"not a simple Prometheus duration: {duration!r}")
    seconds = int(match.group(1)) * _SECONDS[match.group(2)]
    if seconds == 0:
        return "0s"
    return f"{max(minimum, round(seconds * factor))}s"


@dataclass(frozen=True)
class Compression:
    """Test-only changes for running the rules against a demo for a minute or two
    (tests/test_alerts_e2e.py); production renders without any.

    for_scale: every `for:` times this, at least min_for and at most max_for seconds (a 'for' of
    0 stays 0).  min_for keeps a compressed 'for' a few scrapes long: production's shortest (1m) spans
    four 15-s scrapes, and a 'for' of two scrapes pages on any two late answers of a loaded test
    machine.  range_scale, min_range: every range window ([5m]) and
    offset times range_scale, at least min_range seconds: rate() divides by the whole window, so a
    window longer than the data reads low.  clock_offset: time() reads this many seconds earlier
    (the simulated node's wall clock runs behind the real one)."""

    for_scale: float = 1.0
    max_for: int | None = None  # seconds: no compressed 'for' longer than this
    min_for: int = 1  # seconds: no compressed 'for' shorter than this, unless it was 0
    range_scale: float = 1.0
    min_range: int = 1
    clock_offset: float = 0.0

    def expr(self, expr: str) -> str:
        if self.range_scale != 1.0:

            def scaled(match: re.Match[str]) -> str:
                if match.group(1):
                    return f"[{scale_duration(match.group(1), self.range_scale, self.min_range)}]"
                return f"offset {scale_duration(match.group(2), self.range_scale, self.min_range)}"

            expr = _RANGE.sub(scaled, expr)
        if self.clock_offset:
            expr = expr.replace("time()", f"(time() - {self.clock_offset:.0f})")
        return expr

    def for_(self, duration: str) -> str:
        if self.for_scale == 1.0:
            return duration
        scaled = scale_duration(duration, self.for_scale, self.min_for)
        if self.max_for is not None and int(scaled.removesuffix("s")) > self.max_for:
            return f"{self.max_for}s"
        return scaled


PRODUCTION = Compression()
