"""Lines a collector skipped (garbage in a log a workload writes), logged once a round.

A collector counts each skipped line by reason for its invalid-lines counter; the operator's log
gets one warning a round for the lines skipped since the last one, whatever their number, so
a log full of garbage cannot flood the journal."""

from __future__ import annotations

import logging


class SkippedLines:
    """The lines skipped by reason (``counts``, what the counter exports), and what was logged."""

    def __init__(self, reasons: tuple[str, ...]) -> None:
        self.counts = dict.fromkeys(reasons, 0)
        self._logged = dict(self.counts)

    def __getitem__(self, reason: str) -> int:
        return self.counts[reason]

    def __setitem__(self, reason: str, count: int) -> None:
        self.counts[reason] = count

    def log_new(self, log: logging.Logger, what: str, held: str) -> None:
        """Warn of the lines skipped since the last call, if any: '<what> skipped since the last
        round: <reason> <count>, ...; <held>' (held: what the collector holds against its bound)."""
        new = {reason: count - self._logged[reason] for reason, count in self.counts.items()}
        if any(new.values()):
            counts = ", ".join(f"{reason} {count}" for reason, count in new.items() if count)
            log.warning("%s skipped since the last round: %s; %s", what, counts, held)
            self._logged = dict(self.counts)
