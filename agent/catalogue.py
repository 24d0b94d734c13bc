"""The metric catalogue: every declared metric, rendered as docs/metrics.md.

Regenerate with ``python -m lockstep.agent.catalogue --write``; a test fails when the checked-in
file differs from what the declarations produce.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lockstep.agent.collector import MetricSpec
from lockstep.agent.exporter import SELF_METRICS
from lockstep.agent.registry import discover

DOC = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


def declared() -> dict[str, list[MetricSpec]]:
    """Declared metrics by source: 'agent' for self-metrics, then each built-in collector."""
    sections: dict[str, list[MetricSpec]] = {"agent": list(SELF_METRICS)}
    for name, registered in sorted(discover().collectors.items()):
        if registered.builtin:
            sections[name] = list(registered.cls.metrics)
    return sections


def render() -> str:
    lines = [
        "# Metric catalogue",
        "",
        "Generated from the metric declarations by `python -m lockstep.agent.catalogue --write`; do not edit by hand.",
        "Every name here is emitted by the agent, and every name the agent emits is here (a test checks both).",
        "",
    ]
    for section, specs in declared().items():
        title = "Agent self-metrics" if section == "agent" else f"Collector `{section}`"
        lines += [f"## {title}", "", "| metric | type | unit | labels | meaning |", "|---|---|---|---|---|"]
        for spec in specs:
            labels = ", ".join(f"`{label}`" for label in spec.labels) or "—"
            meaning = spec.help.replace("|", "\\|")
            lines.append(f"| `{spec.name}` | {spec.type} | {spec.unit or '—'} | {labels} | {meaning} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"write {DOC} instead of printing")
    args = parser.parse_args()
    if args.write:
        DOC.write_text(render())
    else:
        sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
