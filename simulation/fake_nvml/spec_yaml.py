"""Reading a fake NVML spec from YAML (or a mapping) and checking it: every problem is reported
at once, each as 'file:line: path.to.key: what is wrong' (FakeSpecError), so a spec given to
``--gpu.fake-nvml`` is fixed in one go.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pynvml

from lockstep.agent.yamlfile import LineDict, YamlFileError, load_yaml_file
from lockstep.collectors.gpu.nvml import CLOCK_EVENT_REASONS
from lockstep.simulation.fake_nvml.capabilities import (
    ARCHITECTURE_UNSUPPORTED,
    BLACKWELL_NVLINK_FIELDS,
    CLOCK_EVENT_DURATION_FIELDS,
    FABRIC_HEALTH_FIELDS,
    FABRIC_STATES,
    GPM_PIPES,
    NVLINK_ERROR_TYPES,
    RECOVERY_ACTIONS,
)
from lockstep.simulation.fake_nvml.spec import (
    FakeSpec,
    FakeSpecError,
    GpuSpec,
    MigDeviceSpec,
    ProcessSpec,
    XidEventSpec,
    with_defaults,
)

_GPU_FIELDS = {f.name: f for f in dataclasses.fields(GpuSpec)}
_TOP_KEYS = ("driver_version", "driver_loaded", "defaults", "gpus", "xid_events")
# More GPUs than any node has: `gpus: 100000000` made the fake run out of memory.
MAX_GPUS = 1024
MAX_SPEC_NUMBER = 2**64 - 1
# domain:bus:device.function, as NVML writes it (8 hex digits of domain; 4 accepted too).
_PCI_BUS_ID = re.compile(r"^(?:[0-9A-Fa-f]{4}|[0-9A-Fa-f]{8}):[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")


class _Parser:
    """Collects the problems of one spec (``source`` names its file) while it is read."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []

    def where(self, mapping: Any, key: Any, path: str) -> str:
        if isinstance(mapping, LineDict):
            return f"{self.source}:{mapping.line_of(key)}: {path}"
        return f"{self.source}: {path}"

    def fail(self, mapping: Any, key: Any, path: str, message: str) -> None:
        self.problems.append(f"{self.where(mapping, key, path)}: {message}")

    def mapping(self, value: Any, parent: Any, key: Any, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(parent, key, path, f"expected a mapping, got {value!r}")
            return {}
        return value

    def number(self, value: Any, parent: Any, key: Any, path: str, whole: bool) -> Any:
        ok = isinstance(value, int) if whole else isinstance(value, (int, float))
        kind = "a whole number" if whole else "a number"
        if isinstance(value, bool) or not ok or value < 0:
            self.fail(parent, key, path, f"expected {kind} of at least 0, got {value!r}")
            return None
        if not value <= MAX_SPEC_NUMBER:  # NaN fails this too; the bound is NVML's unsigned 64 bits
            shown = value if not isinstance(value, int) or value < 10**30 else f"a {len(str(value))}-digit number"
            self.fail(parent, key, path, f"expected {kind} from 0 to 2**64 - 1, got {shown!r}")
            return None
        return value

    def gpu(self, data: Mapping[str, Any], defaults: Mapping[str, Any], path: str) -> GpuSpec:
        values: dict[str, Any] = {}
        merged = {**defaults, **data}
        for key, value in merged.items():
            source = data if key in data else defaults
            where = f"{path}.{key}"
            if key not in _GPU_FIELDS:
                self.fail(source, key, where, f"unknown key (known: {', '.join(_GPU_FIELDS)})")
                continue
            parsed = self.gpu_value(key, value, source, where)
            if parsed is not None or key in ("minor_number", "lost_at"):
                values[key] = parsed
        return GpuSpec(**values)

    def gpu_value(self, key: str, value: Any, source: Any, where: str) -> Any:
        default = _GPU_FIELDS[key].default
        if key in ("minor_number",):
            return None if value is None else self.number(value, source, key, where, whole=True)
        if key == "lost_at":
            return None if value is None else self.number(value, source, key, where, whole=False)
        if key == "architecture":
            if value not in ARCHITECTURE_UNSUPPORTED:
                self.fail(source, key, where, f"expected one of {', '.join(ARCHITECTURE_UNSUPPORTED)}, got {value!r}")
                return None
            return value
        if isinstance(default, bool):
            if not isinstance(value, bool):
                self.fail(source, key, where, f"expected true or false, got {value!r}")
                return None
            return value
        if isinstance(default, str) and key not in ("recovery_action", "fabric_state"):
            if not isinstance(value, str):
                self.fail(source, key, where, f"expected a string, got {value!r}")
                return None
            if key == "pci_bus_id" and not _PCI_BUS_ID.match(value):
                self.fail(source, key, where, f"expected a PCI bus id such as 00000000:18:00.0, got {value!r}")
                return None
            return value
        if isinstance(default, (int, float)):
            return self.number(value, source, key, where, whole=isinstance(default, int))
        if key == "clock_event_reasons":
            reasons = value if isinstance(value, list) else [value]
            bad = [r for r in reasons if r not in CLOCK_EVENT_REASONS]
            if bad:
                self.fail(source, key, where, f"unknown reasons {bad} (known: {', '.join(CLOCK_EVENT_REASONS)})")
                return None
            return tuple(reasons)
        if key in ("recovery_action", "fabric_state"):
            choices = RECOVERY_ACTIONS if key == "recovery_action" else FABRIC_STATES
            if value not in choices:
                self.fail(source, key, where, f"expected one of {', '.join(choices)}, got {value!r}")
                return None
            return value
        if key == "fabric_health":
            conditions = value if isinstance(value, list) else [value]
            bad = [c for c in conditions if c not in FABRIC_HEALTH_FIELDS]
            if bad:
                self.fail(source, key, where, f"unknown conditions {bad} (known: {', '.join(FABRIC_HEALTH_FIELDS)})")
                return None
            return tuple(conditions)
        if key == "pipe_active_percent":
            mapping = self.mapping(value, source, key, where)
            pipes = {}
            for pipe, percent in mapping.items():
                number = self.number(percent, mapping, pipe, f"{where}.{pipe}", whole=False)
                if pipe not in GPM_PIPES:
                    self.fail(mapping, pipe, f"{where}.{pipe}", f"unknown pipe (known: {', '.join(GPM_PIPES)})")
                elif number is not None and number > 100:
                    self.fail(mapping, pipe, f"{where}.{pipe}", f"expected a percentage up to 100, got {number!r}")
                elif number is not None:
                    pipes[pipe] = number
            return pipes
        if key == "clock_event_duty":
            duty = {}
            for reason, numbers in self.mapping(value, source, key, where).items():
                ok = isinstance(numbers, list) and len(numbers) == 3
                if reason not in CLOCK_EVENT_DURATION_FIELDS or not ok:
                    self.fail(source, key, f"{where}.{reason}", "expected a reason with a time: [from, period, on]")
                    return None
                duty[reason] = tuple(self.number(n, source, key, where, whole=False) for n in numbers)
            return duty
        if key in ("clock_event_seconds", "nvlink_errors", "nvlink_counters"):
            known = {
                "clock_event_seconds": tuple(CLOCK_EVENT_DURATION_FIELDS),
                "nvlink_errors": NVLINK_ERROR_TYPES,
                "nvlink_counters": tuple(BLACKWELL_NVLINK_FIELDS),
            }[key]
            mapping = self.mapping(value, source, key, where)
            out = {}
            for name, count in mapping.items():
                if name not in known:
                    self.fail(mapping, name, f"{where}.{name}", f"unknown (known: {', '.join(known)})")
                    continue
                number = self.number(count, mapping, name, f"{where}.{name}", whole=key != "clock_event_seconds")
                if number is not None:
                    out[name] = number
            return out
        if key == "nvlink_down":
            links = value if isinstance(value, list) else [value]
            if not all(isinstance(link, int) and not isinstance(link, bool) and link >= 0 for link in links):
                self.fail(source, key, where, f"expected a list of link numbers, got {value!r}")
                return None
            return tuple(links)
        if key == "unsupported":
            names = value if isinstance(value, list) else [value]
            bad = [n for n in names if not isinstance(n, str) or not hasattr(pynvml, n)]
            if bad:
                self.fail(source, key, where, f"not pynvml functions or NVML_FI_* fields: {bad}")
                return None
            return frozenset(names)
        if key == "mig_devices":
            return self.records(value, source, key, where, MigDeviceSpec, required=("gpu_instance_id",))
        if key == "processes":
            return self.records(value, source, key, where, ProcessSpec, required=("pid",))
        raise AssertionError(key)  # every GpuSpec field is handled above

    def records(self, value: Any, source: Any, key: str, where: str, cls: type, required: tuple[str, ...]) -> Any:
        if not isinstance(value, list):
            self.fail(source, key, where, f"expected a list, got {value!r}")
            return None
        known = {f.name: f for f in dataclasses.fields(cls)}
        out = []
        for i, item in enumerate(value):
            item_path = f"{where}[{i}]"
            item_map = self.mapping(item, source, key, item_path)
            kwargs: dict[str, Any] = {}
            for name, raw in item_map.items():
                if name not in known:
                    self.fail(item_map, name, f"{item_path}.{name}", f"unknown key (known: {', '.join(known)})")
                elif isinstance(known[name].default, str):
                    if isinstance(raw, str):
                        kwargs[name] = raw
                    else:
                        self.fail(item_map, name, f"{item_path}.{name}", f"expected a string, got {raw!r}")
                elif raw is not None:
                    number = self.number(raw, item_map, name, f"{item_path}.{name}", whole=True)
                    if number is not None and name.endswith("_percent") and number > 100:
                        self.fail(
                            item_map, name, f"{item_path}.{name}", f"expected a percentage up to 100, got {number!r}"
                        )
                    elif number is not None:
                        kwargs[name] = number
            missing = [name for name in required if name not in item_map]
            if missing:
                self.fail(source, key, item_path, f"missing {', '.join(missing)}")
                continue
            if any(name not in kwargs for name in required):
                continue  # present but invalid: reported above
            out.append(cls(**kwargs))
        return tuple(out)


def parse_spec(data: Any, source: str = "<spec>") -> FakeSpec:
    """A FakeSpec from a mapping (as loaded from YAML); FakeSpecError naming every problem."""
    p = _Parser(source)
    if not isinstance(data, Mapping):
        raise FakeSpecError([f"{source}: the spec must be a mapping with a 'gpus' key, got {type(data).__name__}"])
    for key in data:
        if key not in _TOP_KEYS:
            p.fail(data, key, str(key), f"unknown key (known: {', '.join(_TOP_KEYS)})")
    defaults = p.mapping(data.get("defaults"), data, "defaults", "defaults")
    raw_gpus = data.get("gpus")
    if isinstance(raw_gpus, int) and not isinstance(raw_gpus, bool) and 0 <= raw_gpus <= MAX_GPUS:
        raw_gpus = [{} for _ in range(raw_gpus)]
    if not isinstance(raw_gpus, list):
        shown = raw_gpus if not isinstance(raw_gpus, int) or raw_gpus < 10**30 else "a larger number"
        p.fail(data, "gpus", "gpus", f"expected a list of GPUs or a number of GPUs up to {MAX_GPUS}, got {shown!r}")
        raw_gpus = []
    elif len(raw_gpus) > MAX_GPUS:
        p.fail(data, "gpus", "gpus", f"at most {MAX_GPUS} GPUs, got {len(raw_gpus)}")
        raw_gpus = []
    gpus = []
    for index, raw in enumerate(raw_gpus):
        gpu_map = p.mapping(raw, data, "gpus", f"gpus[{index}]")
        gpus.append(with_defaults(p.gpu(gpu_map, defaults, f"gpus[{index}]"), index))
    xids = []
    raw_xids = data.get("xid_events") or []
    if not isinstance(raw_xids, list):
        p.fail(data, "xid_events", "xid_events", f"expected a list, got {raw_xids!r}")
        raw_xids = []
    for i, raw in enumerate(raw_xids):
        event = p.records([raw], data, "xid_events", f"xid_events[{i}]", XidEventSpec, required=("gpu", "xid"))
        if event and event[0].gpu >= len(gpus):
            p.fail(data, "xid_events", f"xid_events[{i}].gpu", f"no GPU {event[0].gpu} (the spec has {len(gpus)})")
        elif event:
            xids.append(event[0])
    version = data.get("driver_version", FakeSpec.driver_version)
    if not isinstance(version, str):
        p.fail(data, "driver_version", "driver_version", f"expected a string, got {version!r}")
    loaded = data.get("driver_loaded", True)
    if not isinstance(loaded, bool):
        p.fail(data, "driver_loaded", "driver_loaded", f"expected true or false, got {loaded!r}")
    if p.problems:
        raise FakeSpecError(p.problems)
    return FakeSpec(gpus=tuple(gpus), driver_version=version, xid_events=tuple(xids), driver_loaded=loaded)


def load_spec(path: Path | str) -> FakeSpec:
    """Read and check a YAML spec file; FakeSpecError names file:line and the field."""
    try:
        data = load_yaml_file(Path(path))
    except YamlFileError as exc:
        raise FakeSpecError(exc.problems) from None
    return parse_spec(data, str(path))
