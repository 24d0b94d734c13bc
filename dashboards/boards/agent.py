"""The agent health dashboard: versions, collectors' state, run time, errors and cost, and the scrape."""

from __future__ import annotations

from dashboards.board import Board
from dashboards.panels import NONE_BAD, RATE, SEL, Cell, stat, table, timeseries
from lockstep import thresholds as T

# The agents' scrape job, on the selected nodes.
SCRAPE = f'job="{T.AGENT_JOB}", {SEL}'


def health() -> list[Cell]:
    """Agents down, collectors failing, versions and collector state."""
    return [
        stat(
            "Agents down",
            f"count(up{{{SCRAPE}}} == 0) or vector(0)",
            "none",
            "LockstepAgentDown after 5 minutes.",
            NONE_BAD,
        ),
        stat(
            "Collectors failing",
            f"count(lockstep_collector_up{{{SEL}}} == 0) or vector(0)",
            "none",
            "LockstepCollectorFailing after 10 minutes.",
            NONE_BAD,
        ),
        table(
            "Agent versions",
            [(f"lockstep_build_info{{{SEL}}}", "")],
            "none",
            hide=("Time", "__name__", "job", "Value"),
            width=16,
            height=4,
        ),
        table(
            "Collector state",
            [(f"lockstep_collector_state{{{SEL}}} == 1", "")],
            "none",
            "One row per collector and node: ok, nothing_here (nothing to collect on this machine), failed, "
            "stuck (past its deadline), never_ran.",
            hide=("Time", "__name__", "job", "Value"),
            width=24,
        ),
    ]


def collectors() -> list[Cell]:
    """The collectors' run time, freshness, errors and CPU."""
    return [
        timeseries(
            "Collector run time",
            [(f"lockstep_collector_duration_seconds{{{SEL}}}", "{{instance}} {{collector}}")],
            "s",
        ),
        timeseries(
            "Time since the last successful run",
            [
                (
                    f"time() - lockstep_collector_last_success_timestamp_seconds{{{SEL}}}",
                    "{{instance}} {{collector}}",
                )
            ],
            "s",
        ),
        timeseries(
            "Collector errors per minute",
            [(f"rate(lockstep_collector_errors_total{{{SEL}}}[{RATE}]) * 60", "{{instance}} {{collector}}")],
            "cpm",
        ),
        timeseries(
            "Collector CPU (cores)",
            [(f"rate(lockstep_collector_cpu_seconds_total{{{SEL}}}[{RATE}])", "{{instance}} {{collector}}")],
            "short",
        ),
    ]


def scrape() -> list[Cell]:
    """The scrape of the agents' endpoints."""
    return [
        timeseries(
            "Scrape duration",
            [(f"scrape_duration_seconds{{{SCRAPE}}}", "{{instance}}")],
            "s",
        ),
        timeseries(
            "Samples per scrape",
            [(f"scrape_samples_scraped{{{SCRAPE}}}", "{{instance}}")],
            "short",
        ),
    ]


def board() -> Board:
    return Board(
        "lockstep-agent",
        "Lockstep / Agent health",
        "The agents themselves: versions, collectors' state, run time, errors and cost, and the scrape.",
        [*health(), *collectors(), *scrape()],
    )
