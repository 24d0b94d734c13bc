"""The whole agent on the simulated node: golden exposition, promtool lint, metric catalogue.

Each scenario runs through the CLI's own ``demo --once`` path in-process (agent/cli.py ``once``),
so the goldens and the declared-vs-emitted check are in the quick tier; one test runs the real
command and checks it prints the same."""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import subprocess

import pytest

from lockstep.agent import catalogue, cli
from lockstep.agent.collector import CollectorContext, Paths
from lockstep.agent.options import NoOptions
from lockstep.agent.seams import Seams
from lockstep.collectors.gpu import GpuCollector
from lockstep.collectors.gpu.metrics import SECOND_ROUND_ONLY
from lockstep.collectors.gpu.provider import NVML
from lockstep.collectors.training.metrics import LOG_WRITERS
from lockstep.simulation import gpu as sim_gpu
from lockstep.simulation import scenarios
from lockstep.simulation.fake_nvml import FakeNvml
from tests.support import GOLDEN, lockstep, names, require_promtool

# Self-metric values that depend on the machine and the moment, not on the scenario.
VOLATILE = re.compile(
    r"^(lockstep_collector_(?:duration_seconds|last_success_timestamp_seconds|cpu_seconds_total)\{[^}]*\}) .*$",
    re.MULTILINE,
)


@functools.cache  # the golden test, promtool's lint and the catalogue check read the same output
def demo_once(scenario: str) -> str:
    body, failures = cli.once(["demo", "--once", "--scenario", scenario])
    assert failures == [], failures
    return body.decode()


def normalise(text: str) -> str:
    text = VOLATILE.sub(r"\1 <varies>", text)
    return re.sub(r'lockstep_build_info\{version="[^"]*"\}', 'lockstep_build_info{version="<version>"}', text)


# Scenarios whose fault begins later are the healthy node at t=0 (tests/alerts/test_pages_e2e.py runs them).
AT_START = sorted(name for name, scenario in scenarios().items() if not scenario.starts_healthy)


@pytest.mark.golden("demo-{scenario}.prom")
@pytest.mark.parametrize("scenario", AT_START)
def test_demo_matches_golden(scenario: str, request: pytest.FixtureRequest) -> None:
    golden = GOLDEN / f"demo-{scenario}.prom"
    output = normalise(demo_once(scenario))
    if request.config.getoption("--update-golden"):
        golden.write_text(output)
    assert golden.exists(), f"{golden} missing: run pytest --update-golden"
    assert output == golden.read_text(), f"demo output differs from {golden} (pytest --update-golden rewrites it)"


@pytest.mark.real
@pytest.mark.parametrize("scenario", AT_START)
def test_promtool_check_metrics_is_silent(scenario: str) -> None:
    promtool = require_promtool()
    result = subprocess.run(
        [promtool, "check", "metrics"], input=demo_once(scenario), capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_catalogue_doc_is_up_to_date() -> None:
    assert catalogue.DOC.read_text() == catalogue.render(), (
        "docs/metrics.md is stale: python -m lockstep.agent.catalogue --write"
    )


def test_emitted_and_declared_metrics_match() -> None:
    """Every emitted metric is declared, and every declared metric is emitted by some scenario."""
    specs = [spec for specs in catalogue.declared().values() for spec in specs]
    declared = {spec.name for spec in specs}
    histograms = {spec.name for spec in specs if spec.type == "histogram"}
    emitted: set[str] = set()
    for scenario in AT_START:
        emitted |= names(demo_once(scenario))
    # A histogram family is emitted as <name>_bucket, _sum and _count samples.
    emitted = {
        re.sub(r"_(bucket|sum|count)$", "", name) if name.startswith(tuple(histograms)) else name for name in emitted
    }
    assert sorted(emitted - declared) == [], "emitted but not declared"
    # GPM's ratio gauges are averages between two rounds: test_gpm_ratios_from_the_second_round has them.
    later = {spec.name for spec in SECOND_ROUND_ONLY}
    # Counted for a rank idle for a minute (a hung job), which a demo's one round never has:
    # tests/collectors/training/test_training.py (test_a_hung_rank_is_kept_while_its_process_holds_its_log) emits it.
    later.add(LOG_WRITERS.name)
    assert sorted(declared - emitted - later) == [], "declared but emitted by no scenario of the simulated node"


def test_gpm_ratios_from_the_second_round() -> None:
    """The simulated node's GPUs, and the same GPUs with a driver that lacks GPM's cumulative
    metrics, in two rounds: the second has every metric that needs two rounds."""
    healthy = sim_gpu.node_spec("healthy")
    ratios_only = dataclasses.replace(
        healthy, gpus=tuple(dataclasses.replace(g, gpm_cumulative=False) for g in healthy.gpus)
    )
    emitted: set[str] = set()
    for spec in (healthy, ratios_only):
        fake = FakeNvml(spec)
        context = CollectorContext(Paths(), NoOptions(), logging.getLogger("test"), Seams(NVML.replaced_by(fake)))
        collector = GpuCollector(context)
        collector.reader.gpm_min_interval = 0.0  # its rounds come milliseconds apart; the fake's clock says 10 s
        try:
            for t in (0.0, 10.0):
                fake.set_time(t)
                families = list(collector.collect())
        finally:
            collector.close()
        emitted |= {family.name + ("_total" if family.type == "counter" else "") for family in families}
    assert sorted({spec.name for spec in SECOND_ROUND_ONLY} - emitted) == []


@pytest.mark.real
def test_the_command_prints_what_the_goldens_hold() -> None:
    """The in-process path the goldens take is the command's: ``lockstep demo --once`` as a process."""
    result = lockstep("demo", "--once", "--scenario", "fabric-faults")
    assert result.returncode == 0, result.stderr
    assert normalise(result.stdout) == (GOLDEN / "demo-fabric-faults.prom").read_text()
