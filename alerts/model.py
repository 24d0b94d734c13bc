"""The rule model: a recording rule, an alert, and the group Prometheus evaluates them in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str
    # Static labels the rule adds (rules recording the same name tell their series apart by them).
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str  # critical: act now, the job or node is broken; warning: degraded, look today
    for_: str  # how long the condition must hold before the alert fires ("0m": at once)
    expr: str
    summary: str
    description: str
    # Further annotations (name, Go template), after summary and description.
    annotations: tuple[tuple[str, str], ...] = ()

    @property
    def runbook_anchor(self) -> str:
        """The anchor GitHub gives the alert's '## <name>' heading in docs/runbooks.md."""
        return self.name.lower()


@dataclass(frozen=True)
class Group:
    name: str
    rules: tuple[Recording, ...] | tuple[Alert, ...]
