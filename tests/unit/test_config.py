"""Configuration: every problem reported with file:line and field; flags override the file."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from lockstep.agent import config_example
from lockstep.agent.cli import build_parser, overrides_from
from lockstep.agent.collector import Collector, CollectorContext, Paths
from lockstep.agent.config import (
    Config,
    ConfigError,
    Overrides,
    load_config,
    parse_listen,
)
from lockstep.agent.options import NoOptions, declared_options, option, parse_duration, parse_string, parse_string_list
from lockstep.agent.registry import Discovery, Registered, discover
from lockstep.collectors.host import HostCollector
from tests.support import REPO, lockstep

AVAILABLE = {"host": HostCollector}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "lockstep.yml"
    path.write_text(text)
    return path


def test_no_file_means_defaults() -> None:
    config = load_config(None, AVAILABLE)
    assert config.listen == ":12400"
    assert config.enabled_collectors == ["host"]
    assert config.collectors["host"].interval == 15.0
    assert config.collectors["host"].deadline == 15.0
    assert config.staleness_intervals == 3
    assert str(config.paths.procfs) == "/proc"


def test_file_settings_and_flag_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "listen: 127.0.0.1:9999\n"
        "paths:\n  procfs: /host/proc\n"
        "collectors:\n  host:\n    interval: 30s\n    deadline: 2500ms\n",
    )
    config = load_config(path, AVAILABLE)
    assert (config.listen, str(config.paths.procfs)) == ("127.0.0.1:9999", "/host/proc")
    assert (config.collectors["host"].interval, config.collectors["host"].deadline) == (30.0, 2.5)
    overridden = load_config(
        path, AVAILABLE, Overrides(listen=":1234", paths={"procfs": "/other"}, disable=frozenset({"host"}))
    )
    assert (overridden.listen, str(overridden.paths.procfs)) == (":1234", "/other")
    assert overridden.enabled_collectors == []


def test_disable_defaults_then_enable_one(tmp_path: Path) -> None:
    assert load_config(None, AVAILABLE, Overrides(disable_defaults=True)).enabled_collectors == []
    both = Overrides(disable_defaults=True, enable=frozenset({"host"}))
    assert load_config(None, AVAILABLE, both).enabled_collectors == ["host"]
    path = write(tmp_path, "disable_default_collectors: true\ncollectors:\n  host:\n    enabled: true\n")
    assert load_config(path, AVAILABLE).enabled_collectors == ["host"]


def test_all_problems_gathered_with_file_line_and_field(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "listen: nowhere\n"  # 1
        "staleness_intervals: 0\n"  # 2
        "colectors: {}\n"  # 3
        "collectors:\n"  # 4
        "  host:\n"  # 5
        "    interval: fast\n"  # 6
        "    enabled: yes please\n"  # 7
        "  gpu:\n"  # 8
        "    enabled: true\n"  # 9
        "log_level: loud\n",  # 10
    )
    with pytest.raises(ConfigError) as err:
        load_config(path, AVAILABLE)
    assert err.value.problems == [
        f"{path}:3: colectors: unknown key (known: listen, health_listen, web_config_file, log_level, log_format, "
        "paths, staleness_intervals, disable_default_collectors, collectors)",
        f"{path}:1: listen: expected host:port, :port or [ipv6]:port, got 'nowhere'",
        f"{path}:10: log_level: expected one of debug, info, warning, error, got 'loud'",
        f"{path}:2: staleness_intervals: expected a whole number of at least 1, got 0",
        f"{path}:8: collectors.gpu: no such collector (known: host)",
        f"{path}:7: collectors.host.enabled: expected true or false, got 'yes please'",
        f"{path}:6: collectors.host.interval: expected a duration such as 15s, 500ms or 2m, got 'fast'",
    ]


def test_yaml_syntax_error_and_duplicate_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "collectors:\n  host: [\n"), AVAILABLE)
    assert err.value.problems[0].startswith(f"{tmp_path}/lockstep.yml:3:1: not valid YAML: ")
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "listen: :1\nlisten: :2\n"), AVAILABLE)
    assert err.value.problems == [f"{tmp_path}/lockstep.yml:2: key 'listen' repeats the one on line 1"]


def test_unreadable_or_non_mapping_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "missing.yml", AVAILABLE)
    assert err.value.problems == [f"{tmp_path}/missing.yml: cannot read: No such file or directory"]
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "- a\n- b\n"), AVAILABLE)
    assert err.value.problems == [f"{tmp_path}/lockstep.yml:1: the file must be a mapping of settings, got list"]


def test_bad_flag_values_are_named_by_flag() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, AVAILABLE, Overrides(listen="localhost", enable=frozenset({"gpu"})))
    assert err.value.problems == [
        "--listen: expected host:port, :port or [ipv6]:port, got 'localhost'",
        "--collector.gpu: no such collector (known: host)",
    ]


@pytest.mark.parametrize(
    "text,seconds", [("15s", 15.0), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0), (7, 7.0), ("1.5s", 1.5)]
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["0s", "-1s", "soon", True, "5 parsecs"])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_listen_forms() -> None:
    assert parse_listen(":12400") == ("", 12400)
    assert parse_listen("127.0.0.1:80") == ("127.0.0.1", 80)
    assert parse_listen("[::1]:9") == ("::1", 9)
    with pytest.raises(ValueError):
        parse_listen(":70000")


def test_config_check_command(tmp_path: Path) -> None:
    good = write(
        tmp_path, "disable_default_collectors: true\ncollectors:\n  host:\n    enabled: true\n    interval: 10s\n"
    )
    result = lockstep("config", "check", str(good))
    assert (result.returncode, result.stdout) == (0, f"{good}: OK (collectors enabled: host)\n")
    bad = tmp_path / "bad.yml"
    bad.write_text("listen: x\ncollectors:\n  host:\n    deadline: never\n")
    result = lockstep("config", "check", str(bad))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"lockstep: {bad}:1: listen: expected host:port, :port or [ipv6]:port, got 'x'",
        f"lockstep: {bad}:4: collectors.host.deadline: expected a duration such as 15s, 500ms or 2m, got 'never'",
    ]


def test_run_with_bad_config_exits_2_without_traceback(tmp_path: Path) -> None:
    bad = write(tmp_path, "staleness_intervals: many\n")
    result = lockstep("run", "--config", str(bad))
    assert result.returncode == 2
    assert result.stderr == (
        f"lockstep: {bad}:1: staleness_intervals: expected a whole number of at least 1, got 'many'\n"
    )


def test_documented_example_file_is_valid_and_shows_the_defaults() -> None:
    example = REPO / "docs" / "lockstep.example.yml"
    builtin = config_example.builtin_collectors()
    loaded = load_config(example, builtin)
    defaults = load_config(None, builtin)
    assert loaded == Config(**{**vars(defaults), "source": example})
    # Every collector and every option is in it, not only those whose defaults are written.
    text = example.read_text()
    for name, cls in builtin.items():
        assert f"\n  {name}:\n" in text
        for declared in declared_options(cls.options_class):
            assert f" {declared.name}:" in text, f"{name}.{declared.name} missing from {example}"


def test_documented_example_file_is_current() -> None:
    assert config_example.DOC.read_text() == config_example.render(config_example.builtin_collectors()), (
        "docs/lockstep.example.yml is stale: python -m lockstep.agent.config_example --write"
    )


def test_example_writes_each_default_in_the_form_the_loader_reads_back() -> None:
    @dataclass(frozen=True)
    class Shown:
        every: float = option(120.0, parse_duration, "a duration")
        quick: float = option(0.25, parse_duration, "a short one")
        ratio: float = option(0.75, lambda v: float(v), "a plain number")
        names: tuple[str, ...] = option(("a*", "*", "true", "1.5"), parse_string_list, "strings YAML would retype")
        node: str = option("", parse_string, "derived when unset")

    shown = {o.name: config_example.show(o) for o in declared_options(Shown)}
    assert shown == {
        "every": "2m",
        "quick": "250ms",
        "ratio": "0.75",
        "names": '[a*, "*", "true", "1.5"]',
        "node": None,
    }


def test_example_refuses_a_default_it_cannot_write() -> None:
    @dataclass(frozen=True)
    class Unwritable:
        odd: int = option(7, lambda v: v + 1, "a parse that never gives back the default")

    (declared,) = declared_options(Unwritable)
    with pytest.raises(ValueError) as err:
        config_example.show(declared)
    assert str(err.value) == "option odd: no written form parses back to its default 7"


def test_config_example_command_prints_a_file_config_check_accepts(tmp_path: Path) -> None:
    printed = lockstep("config", "example")
    assert (printed.returncode, printed.stderr) == (0, "")
    assert printed.stdout == config_example.DOC.read_text()  # the same collectors are installed here
    path = tmp_path / "lockstep.yml"
    path.write_text(printed.stdout)
    checked = lockstep("config", "check", str(path))
    assert checked.returncode == 0
    every = ", ".join(sorted(config_example.builtin_collectors()))  # each built-in one is on by default
    assert checked.stdout == f"{path}: OK (collectors enabled: {every})\n"
    assert "host, inference" in every


@dataclass(frozen=True)
class TargetsOptions:
    urls: tuple[str, ...] = option((), parse_string_list, "where to scrape", flag="--targets.url", repeatable=True)
    timeout: float = option(2.0, parse_duration, "per-request timeout")


class Targets(Collector[TargetsOptions]):
    """A collector with options, one of them also a repeatable flag."""

    name = "targets"
    options_class = TargetsOptions


def test_collector_options_from_file_and_flags(tmp_path: Path) -> None:
    available = {"host": HostCollector, "targets": Targets}
    path = write(tmp_path, "collectors:\n  targets:\n    urls: [http://a/]\n    timeout: 500ms\n    retries: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, available)
    assert err.value.problems == [
        f"{path}:5: collectors.targets.retries: unknown key (known: enabled, interval, deadline, urls, timeout)"
    ]
    path = write(tmp_path, "collectors:\n  targets:\n    urls: [http://a/]\n    timeout: 500ms\n")
    options = load_config(path, available).collectors["targets"].options
    assert options == TargetsOptions(urls=("http://a/",), timeout=0.5)
    # The flag wins over the file, and is parsed by the same function.
    parser = build_parser(Discovery({n: Registered(c, "lockstep") for n, c in available.items()}, []))
    args = parser.parse_args(["once", "--targets.url", "http://b/", "--targets.url", "http://c/"])
    overridden = load_config(path, available, overrides_from(args, available))
    assert overridden.collectors["targets"].options == TargetsOptions(urls=("http://b/", "http://c/"), timeout=0.5)
    assert "--targets.url URLS" in parser._subparsers._group_actions[0].choices["once"].format_help()  # type: ignore[union-attr]


def test_collector_options_default_to_their_declarations_and_are_checked_by_class() -> None:
    available = {"host": HostCollector, "targets": Targets}
    assert load_config(None, available).collectors["targets"].options == TargetsOptions(urls=(), timeout=2.0)
    assert load_config(None, available).collectors["host"].options == NoOptions()
    with pytest.raises(TypeError, match="timout"):
        TargetsOptions(timout=1.0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="^Targets takes TargetsOptions, not NoOptions, as its options$"):
        Targets(CollectorContext(Paths(), NoOptions(), logging.getLogger("test")))


def test_an_override_naming_no_option_is_a_problem_not_ignored() -> None:
    """The simulated node passes its options as overrides: a misspelt one must not go unnoticed."""
    available = {"host": HostCollector, "targets": Targets}
    with pytest.raises(ConfigError) as err:
        load_config(None, available, Overrides(options={"targets": {"url": ["http://a/"]}}))
    assert err.value.problems == ["collectors.targets.url: no such option given as an override (known: urls, timeout)"]


def test_options_are_declared_by_option_fields_of_a_frozen_dataclass() -> None:
    assert [(o.name, o.default, o.flag, o.repeatable) for o in declared_options(TargetsOptions)] == [
        ("urls", (), "--targets.url", True),
        ("timeout", 2.0, None, False),
    ]
    assert declared_options(NoOptions) == ()

    @dataclass(frozen=True)
    class Plain:
        timeout: float = 2.0

    @dataclass
    class Mutable:
        timeout: float = option(2.0, parse_duration, "per-request timeout")

    with pytest.raises(TypeError, match=r"Plain\.timeout: declare it with option\(default, parse, help\)"):
        declared_options(Plain)
    with pytest.raises(TypeError, match="Mutable: collector options are a frozen dataclass"):
        declared_options(Mutable)


def test_every_builtin_collector_declares_its_options_and_builds_with_their_defaults() -> None:
    builtin = {name: r.cls for name, r in discover().collectors.items() if r.builtin}
    assert {"training", "slurm", "host"} <= set(builtin)
    for name, cls in builtin.items():
        declared_options(cls.options_class)  # a frozen dataclass of option() fields
        defaults = load_config(None, builtin).collectors[name].options
        assert defaults == cls.options_class(), name
        collector = cls(CollectorContext(Paths(), defaults, logging.getLogger("test")))
        assert collector.options is defaults
        collector.close()
