"""Configuration: every problem reported with file:line and field; flags override the file."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockstep.agent import cli, config_example
from lockstep.agent.cli import build_parser, overrides_from
from lockstep.agent.collector import Collector, CollectorContext, Paths
from lockstep.agent.config import (
    Config,
    ConfigError,
    Overrides,
    load_config,
    parse_listen,
)
from lockstep.agent.options import (
    MAX_DURATION,
    MIN_DURATION,
    NoOptions,
    declared_options,
    option,
    parse_duration,
    parse_string,
    parse_string_list,
)
from lockstep.agent.registry import Discovery, Registered, discover
from lockstep.agent.yamlfile import MAX_FILE_BYTES, YamlFileError, load_yaml_text
from lockstep.collectors.host import HostCollector
from tests.support import (
    FIXTURES,
    GENERATED,
    LOCKSTEP,
    REPO,
    collector_up,
    free_port,
    http_get,
    lockstep,
    rss_bytes,
    samples,
    wait_until,
)

AVAILABLE = {"host": HostCollector}
PROC = FIXTURES / "host" / "proc"


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


@pytest.mark.real
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


@pytest.mark.real
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


@pytest.mark.real
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


# --- the config file: bounded, never blocking, never fatal ---

ALIAS_BOMB = (
    "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
    "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
    "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
    "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
    "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n"
    "h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
    "i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]\n"
    "listen: *i\n"
)

# (how the file is made bad, what `config check` and the reload say about it)
BAD_CONFIGS = {
    "control character in a comment": (
        "collectors:\n  host:\n    interval: 1s  # a \x07 bell\n",
        "{f}:3:23: not valid YAML: control character '\\x07' is not allowed",
    ),
    "alias bomb": (ALIAS_BOMB, "{f}: holds more than 10000 values once its aliases are expanded"),
    "5000-deep nesting": (
        "collectors: " + "[" * 5000 + "]" * 5000 + "\n",
        "{f}:1:76: not valid YAML: nested more than 64 levels deep",
    ),
    "infinite interval": (
        "collectors:\n  host:\n    interval: .inf\n",
        "{f}:3: collectors.host.interval: expected a finite duration such as 15s, 500ms or 2m, got inf",
    ),
    "nan deadline": (
        "collectors:\n  host:\n    deadline: .nan\n",
        "{f}:3: collectors.host.deadline: expected a finite duration such as 15s, 500ms or 2m, got nan",
    ),
    "tiny interval": (
        "collectors:\n  host:\n    interval: 0.0000001\n",
        "{f}:3: collectors.host.interval: must be at least 100ms, got 1e-07",
    ),
    "huge interval": (
        "collectors:\n  host:\n    interval: 1.0e+300\n",
        "{f}:3: collectors.host.interval: must be at most 604800s (7 days), got 1e+300",
    ),
    "infinite stat_timeout": (
        "collectors:\n  filesystem:\n    stat_timeout: .inf\n",
        "{f}:3: collectors.filesystem.stat_timeout: expected a finite duration such as 15s, 500ms or 2m, got inf",
    ),
    "infinite inference timeout": (
        "collectors:\n  inference:\n    timeout: .inf\n",
        "{f}:3: collectors.inference.timeout: expected a finite duration such as 15s, 500ms or 2m, got inf",
    ),
    "infinite controller_timeout": (
        "collectors:\n  slurm:\n    controller_timeout: .inf\n",
        "{f}:3: collectors.slurm.controller_timeout: expected a finite duration such as 15s, 500ms or 2m, got inf",
    ),
    "400-digit staleness": (
        f"staleness_intervals: {'9' * 400}\n",
        "{f}:1: staleness_intervals: expected a whole number of at most 1000000, got a 400-digit number",
    ),
    "too large": ("# " + "x" * MAX_FILE_BYTES + "\n", "{f}: cannot read: holds more than 131072 bytes"),
    "not UTF-8": ("listen: ':1'\n# \xff\n", None),
}


def _write_bad(path: Path, content: str) -> None:
    path.write_bytes(content.encode("utf-8") if "\xff" not in content else content.encode("latin-1"))


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_config_check_rejects_with_file_and_line(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "lockstep.yml"
    content, message = BAD_CONFIGS[case]
    _write_bad(path, content)
    assert cli.main(["config", "check", str(path)]) == 2
    expected = message.format(f=path) if message else f"{path}:2: not valid UTF-8 (byte 0xff)"
    assert capsys.readouterr().err == f"lockstep: {expected}\n"


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_config_check_refuses_a_fifo_or_device_at_once(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "lockstep.yml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    started = time.monotonic()
    assert cli.main(["config", "check", str(path)]) == 2
    assert time.monotonic() - started < 2
    what = "a FIFO" if kind == "fifo" else "a device"
    assert capsys.readouterr().err == f"lockstep: {path}: cannot read: is {what}, not a regular file\n"


@pytest.mark.real
def test_no_config_edit_takes_the_running_daemon_down(tmp_path: Path) -> None:
    """Every bad edit through the file watcher (no SIGHUP): each rejected by name, the running
    config kept, memory bounded, and SIGTERM still answered at once."""
    config = tmp_path / "lockstep.yml"
    config.write_text("collectors:\n  host:\n    interval: 200ms\n")
    log = tmp_path / "agent.log"
    cases = ("control character in a comment", "alias bomb", "5000-deep nesting", "infinite interval", "too large")
    runs = ("lockstep_collector_runs_total", frozenset({("collector", "host")}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["run", "--config", str(config), "--path.procfs", str(PROC), "--collector.disable-defaults"]
    with open(log, "w") as stderr:
        agent = subprocess.Popen(
            [*LOCKSTEP, *args, "--collector.host", "--listen", f"127.0.0.1:{port}"], stderr=stderr, cwd=REPO
        )
    try:

        def rejections() -> list[str]:
            entries = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
            prefix = "new configuration rejected, keeping the running one: "
            return [e["msg"].removeprefix(prefix) for e in entries if e["msg"].startswith(prefix)]

        def metrics() -> str:
            return http_get(url + "/metrics")[1]

        wait_until(lambda: _answers(url) and collector_up(metrics(), "host") == 1, timeout=60, what="host up")
        for count, case in enumerate(cases, start=1):
            _write_bad(config, BAD_CONFIGS[case][0])
            wait_until(lambda n=count: len(rejections()) >= n, timeout=60, what=f"the {case} edit rejected")
        config.unlink()
        config.symlink_to("/dev/zero")
        wait_until(lambda: len(rejections()) >= len(cases) + 1, timeout=60, what="/dev/zero rejected")
        config.unlink()
        os.mkfifo(config)
        wait_until(lambda: len(rejections()) >= len(cases) + 2, timeout=60, what="the FIFO rejected")
        agent.send_signal(signal.SIGHUP)
        wait_until(lambda: len(rejections()) >= len(cases) + 3, timeout=60, what="the SIGHUP reload rejected")
        before = samples(metrics())[runs]
        wait_until(lambda: samples(metrics())[runs] >= before + 3, timeout=30, what="host still running")
        assert collector_up(metrics(), "host") == 1
        assert rss_bytes(agent.pid) < 150 * 1024 * 1024
        agent.terminate()
        assert agent.wait(30) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert rejections() == [
        f"{config}:3:23: not valid YAML: control character '\\x07' is not allowed",
        f"{config}: holds more than 10000 values once its aliases are expanded",
        f"{config}:1:76: not valid YAML: nested more than 64 levels deep",
        f"{config}:3: collectors.host.interval: expected a finite duration such as 15s, 500ms or 2m, got inf",
        f"{config}: cannot read: holds more than 131072 bytes",
        f"{config}: cannot read: is a device, not a regular file",
        f"{config}: cannot read: is a FIFO, not a regular file",
        f"{config}: cannot read: is a FIFO, not a regular file",  # the SIGHUP
    ]
    assert "Traceback" not in log.read_text()


def _answers(url: str) -> bool:
    try:
        return http_get(url + "/healthz", timeout=1)[0] == 200
    except OSError:
        return False


@settings(GENERATED, max_examples=30)
@given(st.text(max_size=200))
def test_any_config_text_loads_or_is_rejected_by_name(text: str) -> None:
    try:
        load_yaml_text(text, "gen.yml")
    except YamlFileError as exc:
        assert all(problem.startswith("gen.yml") for problem in exc.problems)


@GENERATED
@given(st.one_of(st.floats(), st.integers(), st.text(max_size=20), st.booleans(), st.none()))
def test_any_duration_is_within_bounds_or_rejected(value: object) -> None:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        assert str(exc)  # a message naming what was expected
    else:
        assert MIN_DURATION <= seconds <= MAX_DURATION
