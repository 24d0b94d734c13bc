"""The agent's configuration: one YAML file (optional) plus command-line overrides.

The file format is documented in docs/configuration.md.  Loading gathers every problem
(not just the first), each naming ``file:line: field`` or the command-line flag, and
raises ``ConfigError`` with all of them.  A loaded ``Config`` is immutable: a reload
builds a new one and swaps it in only if it is valid.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lockstep.agent.collector import Collector, Paths
from lockstep.agent.options import (
    declared_options,
    parse_bool,
    parse_choice,
    parse_interval,
    parse_path,
    parse_positive_int,
    parse_string,
)
from lockstep.agent.yamlfile import LineDict, YamlFileError, load_yaml_file

# Outside Prometheus' exporter port range 9100-9999 (fully allocated, so any pick there
# collides with some exporter, e.g. node_exporter 9100, dcgm-exporter 9400) and below the
# Linux ephemeral port range (32768+).
DEFAULT_LISTEN = ":12400"
DEFAULT_STALENESS_INTERVALS = 3
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "json", "console")


class ConfigError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


# --- the agent's own values (collector options' parsers are in agent/options.py) ---


def parse_listen(value: Any) -> tuple[str, int]:
    """'host:port', ':port' (all addresses) or '[ipv6]:port' -> (host, port)."""
    text = str(value)
    match = re.match(r"^(?:\[([0-9a-fA-F:.]+)\]|([^\[\]:]*)):(\d+)$", text)
    if not match:
        raise ValueError(f"expected host:port, :port or [ipv6]:port, got {text!r}")
    host = match.group(1) if match.group(1) is not None else match.group(2)
    port = int(match.group(3))
    if port > 65535:
        raise ValueError(f"port must be 0-65535 (0: any free port), got {port}")
    return host, port


# --- the configuration itself ---


@dataclass(frozen=True)
class CollectorSettings:
    enabled: bool
    interval: float
    deadline: float
    # An instance of the collector's options_class (agent/options.py): the file's values, then the flags'.
    options: object


@dataclass(frozen=True)
class Config:
    listen: str
    web_config_file: Path | None
    log_level: str
    log_format: str
    paths: Paths
    staleness_intervals: int
    collectors: Mapping[str, CollectorSettings]  # every known collector, enabled or not
    source: Path | None = None
    # A second, plain-HTTP listener serving /healthz only, for liveness probes that cannot
    # present a client certificate (docs/security.md); None: none.
    health_listen: str | None = None

    @property
    def enabled_collectors(self) -> list[str]:
        return sorted(name for name, s in self.collectors.items() if s.enabled)


@dataclass(frozen=True)
class Overrides:
    """Settings given on the command line; they win over the file."""

    listen: str | None = None
    health_listen: str | None = None
    web_config_file: str | None = None
    log_level: str | None = None
    paths: Mapping[str, str] = field(default_factory=dict)  # sysfs/procfs/rootfs -> path
    enable: frozenset[str] = frozenset()
    disable: frozenset[str] = frozenset()
    disable_defaults: bool = False
    # Collector options given by their flags: collector -> option name -> the flag's string
    # (or list of strings for a repeatable flag).  The simulated node puts the options its
    # data needs here too (simulation/__init__.py), as YAML-like values.
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


_TOP_LEVEL_KEYS = (
    "listen",
    "health_listen",
    "web_config_file",
    "log_level",
    "log_format",
    "paths",
    "staleness_intervals",
    "disable_default_collectors",
    "collectors",
)
_COLLECTOR_KEYS = ("enabled", "interval", "deadline")


class _Reader:
    """Reads fields from LineDicts, gathering problems instead of stopping at the first."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.problems: list[str] = []

    def where(self, mapping: LineDict | None, key: Any, path: str) -> str:
        if mapping is None:
            return path
        return f"{self.filename}:{mapping.line_of(key)}: {path}"

    def mapping(self, parent: LineDict | None, key: str, path: str) -> LineDict | None:
        if parent is None or key not in parent or parent[key] is None:
            return None
        value = parent[key]
        if not isinstance(value, LineDict):
            self.problems.append(f"{self.where(parent, key, path)}: expected a mapping, got {value!r}")
            return None
        return value

    def unknown_keys(self, mapping: LineDict | None, known: tuple[str, ...], path: str) -> None:
        for key in mapping or {}:
            if key not in known:
                inside = f"{path}." if path else ""
                self.problems.append(
                    f"{self.where(mapping, key, f'{inside}{key}')}: unknown key (known: {', '.join(known)})"
                )

    def value(self, mapping: LineDict | None, key: str, path: str, parse: Callable[[Any], Any], default: Any) -> Any:
        if mapping is None or key not in mapping or mapping[key] is None:
            return default
        try:
            return parse(mapping[key])
        except ValueError as exc:
            self.problems.append(f"{self.where(mapping, key, path)}: {exc}")
            return default


def load_config(
    path: Path | None,
    available: Mapping[str, type[Collector]],
    overrides: Overrides = Overrides(),
) -> Config:
    """Build the configuration from the file (if any) and the overrides, or raise ConfigError."""
    problems: list[str] = []
    root: LineDict | None = None
    filename = str(path) if path else "<defaults>"
    if path is not None:
        try:
            data = load_yaml_file(path)
        except YamlFileError as exc:
            raise ConfigError(exc.problems) from None
        if data is None:
            root = None  # an empty file means all defaults
        elif not isinstance(data, LineDict):
            raise ConfigError([f"{filename}:1: the file must be a mapping of settings, got {type(data).__name__}"])
        else:
            root = data

    r = _Reader(filename)
    r.unknown_keys(root, _TOP_LEVEL_KEYS, "")
    listen_text = r.value(root, "listen", "listen", parse_string, DEFAULT_LISTEN)
    if overrides.listen is not None:
        listen_text = overrides.listen
        try:
            parse_listen(listen_text)
        except ValueError as exc:
            problems.append(f"--listen: {exc}")
    else:
        try:
            parse_listen(listen_text)
        except ValueError as exc:
            r.problems.append(f"{r.where(root, 'listen', 'listen')}: {exc}")

    health_listen = r.value(root, "health_listen", "health_listen", parse_string, None)
    if overrides.health_listen is not None:
        health_listen = overrides.health_listen or None  # "" turns the file's listener off
        where = "--health-listen"
    else:
        where = r.where(root, "health_listen", "health_listen")
    if health_listen is not None:
        try:
            parse_listen(health_listen)
        except ValueError as exc:
            (problems if overrides.health_listen is not None else r.problems).append(f"{where}: {exc}")

    web_config = r.value(root, "web_config_file", "web_config_file", parse_path, None)
    if web_config is not None and path is not None and not web_config.is_absolute():
        web_config = path.parent / web_config
    if overrides.web_config_file:
        web_config = Path(overrides.web_config_file)

    log_level = r.value(root, "log_level", "log_level", parse_choice(LOG_LEVELS), "info")
    if overrides.log_level:
        log_level = overrides.log_level
    log_format = r.value(root, "log_format", "log_format", parse_choice(LOG_FORMATS), "auto")

    paths_map = r.mapping(root, "paths", "paths")
    r.unknown_keys(paths_map, ("sysfs", "procfs", "rootfs"), "paths")
    defaults = Paths()
    paths = Paths(
        sysfs=Path(
            overrides.paths.get("sysfs") or r.value(paths_map, "sysfs", "paths.sysfs", parse_path, defaults.sysfs)
        ),
        procfs=Path(
            overrides.paths.get("procfs") or r.value(paths_map, "procfs", "paths.procfs", parse_path, defaults.procfs)
        ),
        rootfs=Path(
            overrides.paths.get("rootfs") or r.value(paths_map, "rootfs", "paths.rootfs", parse_path, defaults.rootfs)
        ),
    )
    staleness = r.value(
        root, "staleness_intervals", "staleness_intervals", parse_positive_int, DEFAULT_STALENESS_INTERVALS
    )
    disable_defaults = overrides.disable_defaults or r.value(
        root, "disable_default_collectors", "disable_default_collectors", parse_bool, False
    )

    collectors_map = r.mapping(root, "collectors", "collectors")
    for name in collectors_map or {}:
        if name not in available:
            known = ", ".join(sorted(available)) or "none installed"
            r.problems.append(
                f"{r.where(collectors_map, name, f'collectors.{name}')}: no such collector (known: {known})"
            )
    for flag_name in sorted(overrides.enable | overrides.disable):
        if flag_name not in available:
            problems.append(f"--collector.{flag_name}: no such collector (known: {', '.join(sorted(available))})")

    settings: dict[str, CollectorSettings] = {}
    for name, cls in sorted(available.items()):
        section = r.mapping(collectors_map, name, f"collectors.{name}")
        prefix = f"collectors.{name}"
        declared = declared_options(cls.options_class)
        option_names = tuple(o.name for o in declared)
        r.unknown_keys(section, _COLLECTOR_KEYS + option_names, prefix)
        enabled = cls.default_enabled and not disable_defaults
        enabled = r.value(section, "enabled", f"{prefix}.enabled", parse_bool, enabled)
        if name in overrides.enable:
            enabled = True
        if name in overrides.disable:
            enabled = False
        interval = r.value(section, "interval", f"{prefix}.interval", parse_interval, cls.default_interval)
        deadline = r.value(section, "deadline", f"{prefix}.deadline", parse_interval, cls.default_deadline or interval)
        values: dict[str, Any] = {}
        flag_values = overrides.options.get(name, {})
        for key in flag_values:
            if key not in option_names:  # a misspelt option in the simulated node's or a test's overrides
                known = ", ".join(option_names) or "none"
                problems.append(f"{prefix}.{key}: no such option given as an override (known: {known})")
        for option in declared:
            values[option.name] = r.value(section, option.name, f"{prefix}.{option.name}", option.parse, option.default)
            if option.name in flag_values:
                try:
                    values[option.name] = option.parse(flag_values[option.name])
                except ValueError as exc:
                    problems.append(f"{option.flag or f'{prefix}.{option.name} (override)'}: {exc}")
        settings[name] = CollectorSettings(enabled, interval, deadline, cls.options_class(**values))

    problems = r.problems + problems
    if problems:
        raise ConfigError(problems)
    return Config(
        listen=listen_text,
        web_config_file=web_config,
        log_level=log_level,
        log_format=log_format,
        paths=paths,
        staleness_intervals=staleness,
        collectors=settings,
        source=path,
        health_listen=health_listen,
    )
