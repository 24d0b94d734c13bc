"""Collector options: the settings under ``collectors.<name>`` in the config file.

A collector declares its options once, as a frozen dataclass with one field per option,
each made with ``option()``: the field's type and default are the option's, and the parse
function, help text and command-line flag travel in the field's metadata::

    @dataclass(frozen=True)
    class TrainingOptions:
        logs: tuple[str, ...] = option((), parse_string_list, "log globs", flag="--training.logs", repeatable=True)
        idle_timeout: float = option(600.0, parse_duration, "a rank silent this long is dropped")

    class TrainingCollector(Collector[TrainingOptions]):
        options_class = TrainingOptions

The config loader (agent/config.py) builds one instance from the file and the flags, every
value through its parse function, and reports an unknown key with its file:line; the CLI
(agent/cli.py) makes the flags from the same declarations.  The collector reads typed
attributes (``self.options.idle_timeout``), and mypy checks that a default, its parse
function and the field's type agree.  A test builds ``TrainingOptions(idle_timeout=5.0)``,
where a misspelt keyword is a TypeError instead of a silently ignored key.

The parse functions options use (``parse_duration``, ``parse_string_list``, ``parse_choice``,
...) live here too, next to ``option()``: a collector needs them to declare its options, and
importing them from agent/config.py would tie every collector to the daemon's configuration
loader (the layering test, tests/project/test_layering.py, allows collectors this module and
not that one).  The loader imports them from here for the agent's own settings.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# The key of an option's declaration in its dataclass field's metadata.
_OPTION = "lockstep.option"


@dataclass(frozen=True)
class Option:
    """One declared option, as the config loader and the CLI see it.

    ``parse`` turns the YAML value into the Python value or raises ValueError with a message
    naming what was expected.  With ``flag`` (e.g. ``"--inference.target"``) the option can
    also be given on the command line, where it wins over the file; ``parse`` then also
    receives the flag's string, or with ``repeatable`` the list of strings.
    """

    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    flag: str | None = None
    repeatable: bool = False


@dataclass(frozen=True)
class _Declaration:
    """What ``option()`` puts in a field's metadata: the Option but its name and default,
    which are the field's own."""

    parse: Callable[[Any], Any]
    help: str
    flag: str | None
    repeatable: bool


def option(default: T, parse: Callable[[Any], T], help: str, *, flag: str | None = None, repeatable: bool = False) -> T:
    """Declare one field of an options dataclass (see the module doc).

    Typed as returning the default's type, as ``dataclasses.field`` is, so that mypy checks
    ``timeout: float = option(5.0, parse_duration, ...)``.  Defaults are immutable values
    (tuples, not lists): one default is shared by every instance.
    """
    declaration = _Declaration(parse, help, flag, repeatable)
    return dataclasses.field(default=default, metadata={_OPTION: declaration})


@dataclass(frozen=True)
class NoOptions:
    """The options of a collector that has none."""


def declared_options(options_class: type) -> tuple[Option, ...]:
    """The options an options dataclass declares, in field order.

    Raises TypeError if ``options_class`` is not a frozen dataclass whose every field was
    made with ``option()``: a plain field would have no parse function, so the loader could
    not check its value.
    """
    params = getattr(options_class, "__dataclass_params__", None)
    if not dataclasses.is_dataclass(options_class) or params is None or not params.frozen:
        raise TypeError(f"{options_class.__qualname__}: collector options are a frozen dataclass")
    found = []
    for field in dataclasses.fields(options_class):
        declaration = field.metadata.get(_OPTION)
        if not isinstance(declaration, _Declaration):
            raise TypeError(f"{options_class.__qualname__}.{field.name}: declare it with option(default, parse, help)")
        found.append(
            Option(
                field.name,
                declaration.parse,
                field.default,
                declaration.help,
                declaration.flag,
                declaration.repeatable,
            )
        )
    return tuple(found)


# --- value parsers: take a YAML or flag value, return the Python value or raise ValueError ---

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


# Any duration: at least a millisecond, at most a week.  Past these a value is a typo or an
# attack, not a setting: .inf made a worker thread die of OverflowError, and 1e-7 or .nan spun
# a collector at 100% CPU.
MIN_DURATION = 0.001
MAX_DURATION = 7 * 24 * 3600.0
# A collector's interval and deadline: a round more often than 10 times a second is a busy loop.
MIN_INTERVAL = 0.1


def parse_duration(value: Any, minimum: float = MIN_DURATION) -> float:
    """'15s', '500ms', '2m', '1h' or a number of seconds, from ``minimum`` up to a week."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 15s, 500ms or 2m, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"expected a duration such as 15s, 500ms or 2m, got {value!r}")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not math.isfinite(seconds):
        raise ValueError(f"expected a finite duration such as 15s, 500ms or 2m, got {value!r}")
    if seconds <= 0:
        raise ValueError(f"must be more than zero, got {value!r}")
    if seconds < minimum:
        raise ValueError(f"must be at least {_show_seconds(minimum)}, got {value!r}")
    if seconds > MAX_DURATION:
        raise ValueError(f"must be at most {_show_seconds(MAX_DURATION)} (7 days), got {value!r}")
    return seconds


def parse_interval(value: Any) -> float:
    """A collector's interval or deadline: a duration of at least MIN_INTERVAL."""
    return parse_duration(value, MIN_INTERVAL)


def _show_seconds(seconds: float) -> str:
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"expected true or false, got {value!r}")


def parse_positive_int(value: Any, maximum: int = 1_000_000) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected a whole number of at least 1, got {value!r}")
    if value > maximum:
        shown = value if value < 10**30 else f"a {len(str(value))}-digit number"
        raise ValueError(f"expected a whole number of at most {maximum}, got {shown}")
    return value


def parse_string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def parse_string_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"expected a list of strings, got {value!r}")
    return tuple(value)


def parse_choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return parse


def parse_path(value: Any) -> Path:
    return Path(parse_string(value))
