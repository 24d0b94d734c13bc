"""The collector protocol: what a collector declares, what it gets, what it returns.

A collector is a class registered under the entry-point group ``lockstep.collectors``
(see ``agent/registry.py``).  The agent builds one instance per configured collector
and calls ``collect()`` from that collector's own worker thread, never from a scrape.

Rules a collector follows:
- ``__init__`` does no hardware or file I/O: the agent constructs collectors for
  ``--help``, ``doctor`` and config validation too.
- ``collect()`` returns fresh metric families on every call (never cached objects),
  built with ``MetricSpec.family()`` so every emitted name is a declared one.
- "This machine has none of what I collect" is ``raise NothingHere("no /sys/class/infiniband")``:
  a quiet outcome, distinct from a failure.  Any other exception is a failure.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar, cast

from lockstep.agent.families import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from lockstep.agent.files import FileTooLarge, NotRegularFile
from lockstep.agent.gpus import GpuInventory
from lockstep.agent.options import NoOptions
from lockstep.agent.seams import Seams

# "unknown" is for values whose kind the agent cannot know, such as a NIC driver's ethtool
# statistics (counters and gauges under names only the driver understands).
MetricType = Literal["gauge", "counter", "histogram", "unknown"]
# The units a metric name may end in (before "_total"): Prometheus base units.  A name that
# ends in one declares it as its unit, and a declared unit is the end of the name.
UNITS = ("bytes_per_second", "bytes", "seconds", "hertz", "watts", "celsius", "joules", "ratio", "volts", "bits")


class NothingHere(Exception):
    """This machine has nothing for the collector to collect (no GPU, no HCA, ...).

    The message says why in words an operator can act on; ``lockstep doctor`` shows it.
    """


@dataclass(frozen=True)
class MetricSpec:
    """One metric, declared once, next to the code that emits it.

    ``name`` is the full exposed name: counters end in ``_total``.  ``unit`` is the base
    unit the name ends in (one of ``UNITS``, checked here); it is the family's unit metadata
    (``# UNIT`` in OpenMetrics) and is listed in docs/metrics.md.  A histogram's
    name is its family name; its samples are ``<name>_bucket``, ``_sum`` and ``_count``.
    """

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""

    def __post_init__(self) -> None:
        if not self.name.startswith("lockstep_"):
            raise ValueError(f"metric {self.name!r}: names start with 'lockstep_'")
        if (self.type == "counter") != self.name.endswith("_total"):
            raise ValueError(f"metric {self.name!r}: counters, and only counters, end in '_total'")
        if self.type == "histogram" and self.name.endswith(("_bucket", "_sum", "_count")):
            raise ValueError(f"metric {self.name!r}: a histogram is named without its sample suffixes")
        stem = self.name.removesuffix("_total")
        named = next((unit for unit in UNITS if stem.endswith(f"_{unit}")), "")
        if self.unit != named:
            raise ValueError(
                f"metric {self.name!r}: its name's unit is {named or 'none'!r} but it declares {self.unit or 'none'!r}"
            )

    def family(self) -> GaugeMetricFamily | CounterMetricFamily | UnknownMetricFamily:
        """A fresh, empty family for this metric, with its declared labels and unit."""
        if self.type == "histogram":
            raise TypeError(f"metric {self.name!r} is a histogram: use histogram_family()")
        if self.type == "counter":
            return CounterMetricFamily(self.name, self.help, labels=self.labels, unit=self.unit)
        if self.type == "unknown":
            return UnknownMetricFamily(self.name, self.help, labels=self.labels, unit=self.unit)
        return GaugeMetricFamily(self.name, self.help, labels=self.labels, unit=self.unit)

    def histogram_family(self) -> HistogramMetricFamily:
        """A fresh, empty histogram family (add_metric(labels, buckets, sum_value))."""
        if self.type != "histogram":
            raise TypeError(f"metric {self.name!r} is a {self.type}: use family()")
        return HistogramMetricFamily(self.name, self.help, labels=self.labels, unit=self.unit)


class Families:
    """One round's metric families, one per declared metric, built from the declarations.

    A collector lists its metrics once (``metrics = (...)``) and fills a fresh ``Families``
    every round instead of building each family by hand::

        families = Families(self.metrics)
        families[SIZE].add_metric([mountpoint, fstype], size)
        yield from families.with_samples()

    Asking for a metric the collector did not declare raises ``KeyError`` naming it, so an
    undeclared name cannot reach the exposition.
    """

    def __init__(self, specs: Iterable[MetricSpec]) -> None:
        self._families: dict[MetricSpec, Metric] = {
            spec: spec.histogram_family() if spec.type == "histogram" else spec.family() for spec in specs
        }

    def __getitem__(self, spec: MetricSpec) -> Any:
        # Any, not Metric: a gauge or counter family's add_metric(labels, value) and a
        # histogram's add_metric(labels, buckets, sum_value) differ, and the spec decides which.
        try:
            return self._families[spec]
        except KeyError:
            raise KeyError(f"metric {spec.name!r} is not among the collector's declared metrics") from None

    def all(self) -> list[Metric]:
        """Every family, in declaration order, those without samples included."""
        return list(self._families.values())

    def with_samples(self) -> list[Metric]:
        """The families that got at least one sample this round, in declaration order."""
        return [family for family in self._families.values() if family.samples]


@dataclass(frozen=True)
class Paths:
    """Where the host's trees are: overridable so the agent can run in a container with
    the host mounted elsewhere, and tests can point it at fixture trees."""

    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    rootfs: Path = Path("/")


class RunRequest:
    """Lets a collector's own threads ask for a collection round now instead of at the next
    interval (e.g. its event thread saw a GPU fall off the bus).  The agent connects it to the
    collector's worker; unconnected (doctor, tests) it does nothing."""

    def __init__(self) -> None:
        self.target: Callable[[], None] | None = None

    def __call__(self) -> None:
        if self.target is not None:
            self.target()


@dataclass(frozen=True)
class CollectorContext:
    """What the agent hands a collector when it builds it."""

    paths: Paths
    # An instance of the collector's options_class (agent/options.py), built by the config
    # loader or by a test; the collector checks its class.
    options: object
    log: logging.Logger
    # Dependencies replaced by the simulated node or a test (agent/seams.py); none in production.
    seams: Seams = field(default_factory=Seams)
    run_now: RunRequest = field(default_factory=RunRequest)
    # This node's GPUs as the GPU collector last published them (agent/gpus.py): one for the
    # whole agent, shared by every collector it builds; a collector built alone gets its own.
    gpu_inventory: GpuInventory = field(default_factory=GpuInventory)

    def __post_init__(self) -> None:
        if not isinstance(self.seams, Seams):  # e.g. the dict of fakes older code passed
            raise TypeError(f"CollectorContext.seams must be a Seams, not {type(self.seams).__name__}")


# The collector's options dataclass (agent/options.py).
OptionsT = TypeVar("OptionsT")


class Collector(Generic[OptionsT]):
    """Base class for collectors.  Subclasses set the class attributes and ``collect``.

    A collector with options names their dataclass twice, once for mypy and once for the
    agent, and mypy checks the two agree::

        class TrainingCollector(Collector[TrainingOptions]):
            options_class = TrainingOptions

    and reads them as ``self.options.idle_timeout``.  A collector without options leaves both
    out: its options are ``NoOptions()``.
    """

    name: ClassVar[str]
    help: ClassVar[str] = ""
    default_enabled: ClassVar[bool] = True
    default_interval: ClassVar[float] = 15.0
    # How long a run may take before the collector is reported stuck; defaults to the interval.
    default_deadline: ClassVar[float | None] = None
    metrics: ClassVar[Sequence[MetricSpec]] = ()
    # What the config loader builds from collectors.<name> and the flags.  cast: a generic
    # class attribute cannot have a concrete default in mypy's eyes; NoOptions is right for
    # every collector that does not set its own.
    options_class: type[OptionsT] = cast(Any, NoOptions)
    # Kernel uevent subsystems (e.g. "infiniband", "net", "pci") whose add/remove/change
    # events should make this collector run at once; see on_hotplug.
    hotplug_subsystems: ClassVar[Sequence[str]] = ()
    # Collectors whose first round this one's first round waits for (up to their deadline),
    # when they are enabled: e.g. ("gpu",) to read the GPU inventory (context.gpu_inventory).
    needs: ClassVar[Sequence[str]] = ()

    def __init__(self, context: CollectorContext) -> None:
        if not isinstance(context.options, self.options_class):
            raise TypeError(
                f"{type(self).__name__} takes {self.options_class.__name__}, "
                f"not {type(context.options).__name__}, as its options"
            )
        self.context = context
        self.options: OptionsT = context.options
        self.paths = context.paths
        self.log = context.log

    def check(self) -> str:
        """Raise NothingHere or an exception if this collector cannot run here.

        ``lockstep doctor`` calls it.  Returns a note for the operator ("" if none), e.g.
        what part of the data this machine cannot give.  The default does one collection
        round and throws the result away, which suits cheap collectors; others override it.
        """
        for _ in self.collect():
            pass
        return ""

    def collect(self) -> Iterable[Metric]:
        raise NotImplementedError

    def on_hotplug(self, action: str, subsystem: str, sys_path: str) -> None:
        """A kernel uevent in one of ``hotplug_subsystems`` arrived (called from the event thread).

        Keep it quick: note what changed (e.g. drop a cached device list); the agent then
        runs ``collect()`` at once in the collector's own worker.
        """

    def close(self) -> None:
        """Release what the collector holds (threads, handles).  Called when it is removed."""


# --- Reads shared by the rounds run together ---
# The collectors due at the same moment run one after another on the scheduler's runner thread
# (agent/scheduler.py), milliseconds apart.  What several of them read of the node (the process
# table: inference, slurm and host each scanned every process) is read once for all of them:
# the runner opens a batch for the rounds due together, and shared_read() keeps each answer for
# the batch.  Outside a batch (a collector's test, `lockstep once` before its rounds are
# batched, a thread of the collector's own) every call reads afresh.
_batch = threading.local()
T = TypeVar("T")


@contextmanager
def shared_reads() -> Iterator[None]:
    """The scope of one batch of rounds on this thread: shared_read() answers once per key."""
    _batch.reads = {}
    try:
        yield
    finally:
        _batch.reads = None


def shared_read(key: tuple[object, ...], read: Callable[[], T]) -> T:
    """read()'s answer, taken once per batch of rounds for this key (every call outside one).
    The answer is shared: callers must not change it."""
    reads: dict[tuple[object, ...], Any] | None = getattr(_batch, "reads", None)
    if reads is None:
        return read()
    if key not in reads:
        reads[key] = read()
    return cast(T, reads[key])


def describe_error(exc: BaseException) -> str:
    """An exception in words an operator can act on: 'permission denied reading /proc/x'."""
    if isinstance(exc, (FileTooLarge, NotRegularFile)):
        return f"{exc.filename} {exc.strerror}"  # "/x/tracker.txt is a FIFO, not a regular file"
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.strerror[0].lower()}{exc.strerror[1:]} reading {exc.filename}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
