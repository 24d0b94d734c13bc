"""The lockstep command as a user runs it: once, doctor, demo, and a third-party collector plugin."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockstep.agent.cli import collect_once
from lockstep.agent.collector import Collector, MetricSpec
from lockstep.agent.config import Overrides, load_config
from lockstep.agent.daemon import Setup
from lockstep.agent.families import Metric
from lockstep.agent.seams import Seams
from tests.support import FIXTURES, REPO, lockstep, samples

PROC = FIXTURES / "host" / "proc"


@pytest.mark.real
def test_once_prints_exposition_and_exits_0() -> None:
    result = lockstep("once", "--path.procfs", str(PROC))
    assert result.returncode == 0, result.stderr
    s = samples(result.stdout)
    assert s[("lockstep_host_processes_blocked", frozenset())] == 2
    assert s[("lockstep_collector_up", frozenset({("collector", "host")}))] == 1


@pytest.mark.real
def test_once_exits_1_when_a_collector_fails(tmp_path: Path) -> None:
    result = lockstep("once", "--path.procfs", str(tmp_path))
    assert result.returncode == 1
    assert samples(result.stdout)[("lockstep_collector_up", frozenset({("collector", "host")}))] == 0
    assert f"lockstep: collector host: failed: no such file or directory reading {tmp_path}/stat" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.real
def test_a_misspelt_flag_is_named_with_the_commands_usage_and_the_flag_meant() -> None:
    result = lockstep("once", "--no-colector.gpu")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: lockstep once ")
    assert result.stderr.endswith(
        "lockstep once: error: unrecognized arguments: --no-colector.gpu (did you mean --no-collector.gpu?)\n"
    )
    result = lockstep("config", "check", "--strict", "x.yml")
    assert (result.returncode, result.stderr.splitlines()[-1]) == (
        2,
        "lockstep config check: error: unrecognized arguments: --strict",
    )


@pytest.mark.real
def test_dev_run_implies_run_before_a_flag() -> None:
    result = subprocess.run(
        [str(REPO / "dev" / "run"), "--listen", ":12401", "--help"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: lockstep run ")


@pytest.mark.real
def test_once_with_collectors_disabled_runs_nothing() -> None:
    result = lockstep("once", "--collector.disable-defaults")
    assert result.returncode == 0
    assert [name for name, _ in samples(result.stdout)] == ["lockstep_build_info"]


@pytest.mark.real
def test_doctor_explains_in_words(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("")
    (tmp_path / "stat").chmod(0)
    result = lockstep("doctor", "--path.procfs", str(tmp_path))
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["COLLECTOR", "ENABLED", "STATUS", "DETAIL"]
    host = next(line for line in lines if line.startswith("host "))  # other collectors have rows too
    if os.geteuid() == 0:  # root reads mode-0 files: the file is then empty, meminfo missing
        assert host.split()[:4] == ["host", "yes", "cannot", "run"]
        assert host.endswith(f"no such file or directory reading {tmp_path}/meminfo")
    else:
        assert host.endswith(f"permission denied reading {tmp_path}/stat")
    assert result.returncode == 1
    ok = lockstep("doctor", "--path.procfs", str(PROC))
    assert ok.returncode == 0
    assert next(line for line in ok.stdout.splitlines() if line.startswith("host ")).split() == ["host", "yes", "ready"]


PLUGIN = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "lockstep-plugin-example"
        version = "1.0"
        [project.entry-points."lockstep.collectors"]
        example = "lockstep_example:ExampleCollector"
    """,
    "lockstep_example.py": """
        from lockstep.agent.collector import Collector, MetricSpec
        ANSWER = MetricSpec("lockstep_example_answer", "gauge", "The answer.", ("source",))
        class ExampleCollector(Collector):
            name = "example"
            help = "An example third-party collector."
            metrics = (ANSWER,)
            def collect(self):
                family = ANSWER.family()
                family.add_metric(["plugin"], 42)
                yield family
    """,
}


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example plugin, installed by pip as a real distribution into its own directory."""
    source = tmp_path_factory.mktemp("plugin-src")
    for name, text in PLUGIN.items():
        (source / name).write_text(textwrap.dedent(text))
    target = tmp_path_factory.mktemp("plugin-site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    shutil.rmtree(source)
    return target


@pytest.mark.real
def test_third_party_collector_plugin(plugin_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(plugin_path)}
    result = lockstep("once", "--path.procfs", str(PROC), env=env)
    assert result.returncode == 0, result.stderr
    s = samples(result.stdout)
    assert s[("lockstep_example_answer", frozenset({("source", "plugin")}))] == 42
    assert s[("lockstep_collector_up", frozenset({("collector", "example")}))] == 1
    helped = lockstep("once", "--help", env=env).stdout
    assert "--collector.example" in helped and "An example third-party collector." in helped
    disabled = lockstep("once", "--path.procfs", str(PROC), "--no-collector.example", env=env)
    assert "lockstep_example_answer" not in disabled.stdout
    # The simulated node serves the built-in collectors only.
    assert "lockstep_example_answer" not in lockstep("demo", "--once", env=env).stdout


class _Quick(Collector):
    name = "quick"
    default_interval = 0.01  # due again long before the slow one's first round ends
    metrics = (MetricSpec("lockstep_quick_value", "gauge", "A value."),)

    def collect(self) -> Iterator[Metric]:
        family = self.metrics[0].family()
        family.add_metric([], 1.0)
        yield family


class _Slow(_Quick):
    name = "slow"
    default_interval = 60.0
    metrics = (MetricSpec("lockstep_slow_value", "gauge", "A value."),)

    def collect(self) -> Iterator[Metric]:
        time.sleep(0.5)
        yield from super().collect()


def _runs_of_one_round(available: dict[str, type[Collector]]) -> tuple[list[str], dict[str, float]]:
    """collect_once of these collectors alone: its failures and each collector's runs_total."""
    setup = Setup(None, available, Overrides(disable_defaults=True, enable=frozenset(available)), Seams())
    body, failures = collect_once(setup, load_config(None, available, setup.overrides))
    runs = {
        dict(labels)["collector"]: v
        for (name, labels), v in samples(body.decode()).items()
        if name == "lockstep_collector_runs_total"
    }
    return failures, runs


def test_once_is_one_round_of_each_collector_however_slow_the_others() -> None:
    failures, runs = _runs_of_one_round({"quick": _Quick, "slow": _Slow})
    assert failures == []
    assert runs == {"quick": 1.0, "slow": 1.0}


class _AsksAgain(_Quick):
    name = "asks_again"
    default_interval = 60.0
    metrics = (MetricSpec("lockstep_asks_again_value", "gauge", "A value."),)

    def collect(self) -> Iterator[Metric]:
        # As the GPU collector's XID listener does when it drains an XID 79 during the first round.
        self.context.run_now()
        yield from super().collect()


def test_once_is_one_round_even_when_a_collector_asks_for_another() -> None:
    # The slow collector holds the exposition back 0.5 s: long enough for a second round of the
    # one that asked.  demo-gpu-lost's exposition read lockstep_collector_runs_total 2 for the GPU
    # collector, or 1 on a busy machine.
    failures, runs = _runs_of_one_round({"asks_again": _AsksAgain, "slow": _Slow})
    assert failures == []
    assert runs == {"asks_again": 1.0, "slow": 1.0}
