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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
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
