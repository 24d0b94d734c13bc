"""The ``lockstep`` command: run, once, doctor, demo, report, health-check, config check, config example.

Exit status: 0 fine; 1 a collector failed (``once``) or the agent could not start;
2 bad usage or bad configuration (every problem printed, no traceback).  ``health-check`` has
its own: 0 healthy, 1 unhealthy, 2 unknown (lockstep/health/command.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lockstep import __version__
from lockstep.agent import config_example
from lockstep.agent.collector import Collector, CollectorContext, NothingHere, describe_error
from lockstep.agent.config import DEFAULT_LISTEN, Config, ConfigError, Overrides, load_config, parse_listen
from lockstep.agent.daemon import Agent, Setup, serve
from lockstep.agent.gpus import GpuInventory
from lockstep.agent.logs import collector_logger, setup_logging
from lockstep.agent.options import declared_options
from lockstep.agent.registry import Discovery, discover
from lockstep.agent.scheduler import HEALTHY_STATES
from lockstep.agent.seams import Seams
from lockstep.agent.webconfig import WebConfig, WebConfigError, load_web_config
from lockstep.health import command as health_command
from lockstep.report import command as report_command


def build_parser(discovery: Discovery) -> argparse.ArgumentParser:
    names = sorted(discovery.collectors)
    shared = CommandParser(add_help=False)
    shared.add_argument("--config", type=Path, metavar="FILE", help="YAML config file (see docs/configuration.md)")
    shared.add_argument("--listen", metavar="ADDR", help=f"address to serve on (default {DEFAULT_LISTEN})")
    shared.add_argument(
        "--health-listen",
        dest="health_listen",
        metavar="ADDR",
        help="also serve /healthz alone, in plain HTTP, on this address (e.g. 127.0.0.1:12401): "
        "for liveness probes when client certificates are required",
    )
    shared.add_argument("--web.config.file", dest="web_config_file", metavar="FILE", help="TLS/basic-auth config")
    shared.add_argument("--log.level", dest="log_level", choices=("debug", "info", "warning", "error"))
    for root in ("sysfs", "procfs", "rootfs"):
        shared.add_argument(f"--path.{root}", dest=f"path_{root}", metavar="DIR", help=f"where the host's {root} is")
    shared.add_argument(
        "--collector.disable-defaults",
        dest="disable_defaults",
        action="store_true",
        help="start with every collector off; enable some with --collector.NAME",
    )
    for name in names:
        cls = discovery.collectors[name].cls
        default = "on" if cls.default_enabled else "off"
        shared.add_argument(
            f"--collector.{name}", dest=f"enable_{name}", action="store_true", help=f"{cls.help} (default {default})"
        )
        shared.add_argument(
            f"--no-collector.{name}", dest=f"disable_{name}", action="store_true", help=argparse.SUPPRESS
        )
        for option in declared_options(cls.options_class):
            if option.flag:
                repeat = ", repeatable" if option.repeatable else ""
                shared.add_argument(
                    option.flag,
                    dest=f"option_{name}_{option.name}",
                    action="append" if option.repeatable else "store",
                    metavar=option.name.upper(),
                    help=f"{option.help} (collectors.{name}.{option.name}{repeat})",
                )

    parser = argparse.ArgumentParser(
        prog="lockstep",
        description="Per-node observability agent for AI/GPU clusters.",
        epilog="Collectors can be switched off with --no-collector.NAME.",
    )
    parser.add_argument("--version", action="version", version=f"lockstep {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)
    # run, once and doctor may read GPUs from a fake NVML (demo has its own simulated GPUs).
    fake_gpus = CommandParser(add_help=False)
    fake_gpus.add_argument(
        "--gpu.fake-nvml",
        dest="fake_nvml",
        type=Path,
        metavar="SPEC",
        help="use a fake NVML described by this YAML spec instead of the real library (demos, tests; docs/gpu.md)",
    )
    commands.add_parser("run", parents=[shared, fake_gpus], help="run the agent (the daemon)")
    commands.add_parser(
        "once",
        parents=[shared, fake_gpus],
        help="one collection round, exposition to stdout; exit 1 if a collector failed",
    )
    commands.add_parser(
        "doctor", parents=[shared, fake_gpus], help="which collectors can run on this machine, and why not"
    )
    demo = commands.add_parser(
        "demo",
        parents=[shared],
        help="the agent on a simulated GPU node",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.describe = demo_description
    demo.add_argument("--scenario", default="healthy", type=scenario_name, metavar="SCENARIO")
    demo.add_argument("--once", action="store_true", help="print one exposition and exit")
    demo.add_argument(
        "--speed",
        type=_speed,
        default=1.0,
        help="simulated seconds per real second (default 1; e.g. 60 shows an hour of the scenario in a minute)",
    )
    report = commands.add_parser("report", help="what happened to a job, from Prometheus (docs/report.md)")
    report_command.add_arguments(report)
    health = commands.add_parser(
        "health-check",
        parents=[shared, fake_gpus],
        help="is this node fit to run jobs: exit 0 healthy, 1 unhealthy, 2 unknown (docs/health-check.md)",
    )
    health_command.add_arguments(health)
    config = commands.add_parser("config", help="configuration tools")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    check = config_commands.add_parser("check", help="validate a config file without starting anything")
    check.add_argument("file", type=Path)
    config_commands.add_parser(
        "example", help="print a config file with every key at its default, for the collectors installed"
    )
    return parser


class CommandParser(argparse.ArgumentParser):
    """A command's parser whose description may be written only when its help is shown.

    ``demo --help`` lists the scenarios, which needs the simulated node; the daemon (``run``,
    ``once``) must not import it, so nothing about the scenarios is read while the parser is built.
    """

    describe: Callable[[], str] | None = None

    def parse_known_args(  # type: ignore[override]  # typeshed overloads on the namespace type
        self, args: Any = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # argparse hands a command's unknown arguments up to the top-level parser, which then
        # prints the top-level usage ("lockstep [-h] COMMAND"): say it here, with this command's
        # usage and the flag that was probably meant.
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}{self._did_you_mean(unknown)}")
        return parsed, unknown

    def _did_you_mean(self, unknown: list[str]) -> str:
        flags = [f for f in self._option_string_actions if f.startswith("--")]
        for argument in unknown:
            if argument.startswith("-"):
                close = difflib.get_close_matches(argument.split("=", 1)[0], flags, n=1, cutoff=0.8)
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""

    def format_help(self) -> str:
        if self.describe is not None:
            self.description = self.describe()
        return super().format_help()


def demo_description() -> str:
    from lockstep.simulation import demo  # the demo's entry: see simulation/demo.py

    return demo.scenario_help()


def scenario_name(value: str) -> str:
    """--scenario's type: a known scenario of the simulated node (checked only for ``demo``)."""
    from lockstep.simulation import demo  # the demo's entry: see simulation/demo.py

    return demo.scenario_name(value)


def _speed(value: str) -> float:
    try:
        speed = float(value)
    except ValueError:
        speed = 0.0
    if not 0 < speed <= 1000:
        raise argparse.ArgumentTypeError(
            f"expected a number of simulated seconds per second, 0 < speed <= 1000, got {value!r}"
        )
    return speed


def overrides_from(
    args: argparse.Namespace,
    available: Mapping[str, type[Collector]],
    paths: Mapping[str, str] | None = None,
) -> Overrides:
    given_paths = {root: getattr(args, f"path_{root}") for root in ("sysfs", "procfs", "rootfs")}
    given_paths = {k: v for k, v in given_paths.items() if v}
    given_paths.update(paths or {})
    names = sorted(available)
    options: dict[str, dict[str, Any]] = {}
    for name, cls in available.items():
        for option in declared_options(cls.options_class):
            given = getattr(args, f"option_{name}_{option.name}", None)
            if option.flag and given is not None:
                options.setdefault(name, {})[option.name] = given
    return Overrides(
        listen=args.listen,
        health_listen=args.health_listen,
        web_config_file=args.web_config_file,
        log_level=args.log_level,
        paths=given_paths,
        enable=frozenset(n for n in names if getattr(args, f"enable_{n}", False)),
        disable=frozenset(n for n in names if getattr(args, f"disable_{n}", False)),
        disable_defaults=args.disable_defaults,
        options=options,
    )


def seams_with_fake_nvml(spec: Path) -> Seams:
    """The seams of ``run|once|doctor --gpu.fake-nvml SPEC``: the GPU collector reads the fake
    NVML the spec describes; ConfigError (file:line of each problem) if the spec is wrong.

    The fake comes through the demo's entry (simulation/demo.py), imported here only when the
    flag is given, so ``run`` and ``once`` without it load no simulation module.
    """
    from lockstep.simulation import demo  # the demo's entry: see simulation/demo.py

    try:
        return demo.seams_with_fake_nvml(spec)
    except ValueError as exc:
        raise ConfigError([f"--gpu.fake-nvml: {exc}"]) from None


def report_problems(problems: Sequence[str]) -> int:
    for problem in problems:
        print(f"lockstep: {problem}", file=sys.stderr)
    return 2


ONCE_INTERVAL_SECONDS = 24 * 3600.0  # "never again" for a one-shot round


def collect_once(setup: Setup, config: Config) -> tuple[bytes, list[str]]:
    """One round of every enabled collector, each bounded by its deadline.

    Returns the exposition and a line per collector that failed or got stuck.
    """
    # One round each, however long the slowest first round takes: a collector with a short
    # interval would otherwise run again before the exposition is rendered (on a busy machine
    # lockstep_collector_runs_total read 2 instead of 1).
    single_round = {
        name: dataclasses.replace(settings, interval=ONCE_INTERVAL_SECONDS)
        for name, settings in config.collectors.items()
    }
    # No uevent listener and no round a collector asks for (Agent's single_round): one round has
    # nothing to re-run for.
    agent = Agent(setup, dataclasses.replace(config, collectors=single_round), WebConfig(), single_round=True)
    started = time.monotonic()
    for _name, worker in agent.workers.items():
        worker.first_run_done.wait(max(0.0, started + worker.deadline + 0.1 - time.monotonic()))
    body, _ = agent.exporter.render()
    failures = [
        f"collector {v.name}: {v.state.value}: {v.reason}" for v in agent.views() if v.state not in HEALTHY_STATES
    ]
    agent.stop()
    return body, failures


def probe(cls: type[Collector], context: CollectorContext) -> tuple[str, str]:
    """(status, detail) of one collector's check() on this machine."""
    try:
        return "ready", cls(context).check()
    except NothingHere as exc:
        return "nothing here", str(exc)
    except Exception as exc:
        return "cannot run", describe_error(exc)


def doctor(setup: Setup, config: Config, discovery: Discovery) -> int:
    """Print, for each collector, whether it can run here and why not."""
    rows = []
    worst = 0
    # One inventory for every probe: those checked after the GPU collector (by name: inference,
    # kubernetes, slurm) see the GPUs it found.
    gpu_inventory = GpuInventory()
    for name, cls in sorted(setup.available.items()):
        settings = config.collectors[name]
        context = CollectorContext(
            config.paths, settings.options, collector_logger(name), setup.seams, gpu_inventory=gpu_inventory
        )
        result: list[tuple[str, str]] = []
        thread = threading.Thread(target=lambda c=cls, x=context, out=result: out.append(probe(c, x)), daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # at the task limit: say so for this collector, go on
            result.append(("cannot run", f"cannot start a thread to check it ({exc})"))
        else:
            thread.join(settings.deadline)  # a probe stuck in the kernel must not hang the doctor
        status, detail = (
            result[0] if result else ("cannot run", f"no answer within its {settings.deadline:g}s deadline")
        )
        if status == "cannot run" and settings.enabled:
            worst = 1
        rows.append((name, "yes" if settings.enabled else "no", status, detail))
    for problem in discovery.problems:
        rows.append(("(plugin)", "-", "cannot load", problem))
        worst = 1
    headers = ("COLLECTOR", "ENABLED", "STATUS", "DETAIL")
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(3)]
    for row in [headers, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3].rstrip())
    return worst


@dataclasses.dataclass
class Prepared:
    """What a command runs on: the setup, its loaded config and, for ``demo``, the simulated node
    (which must outlive the run: its temporary directory goes with it)."""

    setup: Setup
    config: Config
    demo: Any = None  # simulation.demo.Demo, typed loosely: the daemon imports no simulation module


def prepare(args: argparse.Namespace, discovery: Discovery) -> Prepared:
    """The setup and config of ``run``, ``once``, ``doctor`` or ``demo``; ConfigError names every problem."""
    available = {name: r.cls for name, r in discovery.collectors.items()}
    seams = Seams()
    sim_paths: dict[str, str] = {}
    simulated = None
    if args.command == "demo":
        from lockstep.simulation import demo  # the demo's entry: see simulation/demo.py

        # The simulated node has data for the built-in collectors only.
        available = {name: r.cls for name, r in discovery.collectors.items() if r.builtin}
        simulated = demo.start(args.scenario)
        seams, sim_paths = simulated.seams, simulated.paths
    elif args.fake_nvml is not None:
        seams = seams_with_fake_nvml(args.fake_nvml)

    overrides = overrides_from(args, available, sim_paths)
    if simulated is not None:
        # The simulated node points collectors at its data; flags the user gave still win.
        merged = {name: {**values, **overrides.options.get(name, {})} for name, values in simulated.options.items()}
        overrides = dataclasses.replace(overrides, options={**overrides.options, **merged})
    setup = Setup(args.config, available, overrides, seams)
    return Prepared(setup, setup.load(), simulated)


def once(argv: Sequence[str]) -> tuple[bytes, list[str]]:
    """What ``lockstep once ARGS`` or ``lockstep demo --once ARGS`` prints, without printing it or
    setting up logging: the exposition and a line per collector that failed.  The golden tests
    run the CLI's own path this way, in-process."""
    discovery = discover()
    args = build_parser(discovery).parse_args(argv)
    prepared = prepare(args, discovery)
    return collect_once(prepared.setup, prepared.config)


def main(argv: Sequence[str] | None = None) -> int:
    discovery = discover()
    args = build_parser(discovery).parse_args(argv)
    if args.command == "config" and args.config_command == "example":
        sys.stdout.write(config_example.render({name: r.cls for name, r in discovery.collectors.items()}))
        return 0
    if args.command == "config":
        return config_check(args.file, discovery)
    if args.command == "report":
        return report_command.run(args)

    try:
        prepared = prepare(args, discovery)
    except ConfigError as exc:
        if args.command == "health-check":  # its one line on stdout, as unknown (exit 2)
            return health_command.unknown(exc.problems)
        return report_problems(exc.problems)
    setup, config = prepared.setup, prepared.config

    if args.command == "doctor":
        return doctor(setup, config, discovery)
    if args.command == "health-check":
        return health_command.run(args, agent_url(config), lambda: collect_once(setup, config)[0])
    if args.command == "once" or (args.command == "demo" and args.once):
        setup_logging(config.log_level, config.log_format)
        for problem in discovery.problems:
            print(f"lockstep: {problem}", file=sys.stderr)
        body, failures = collect_once(setup, config)
        sys.stdout.buffer.write(body)
        sys.stdout.flush()
        for failure in failures:
            print(f"lockstep: {failure}", file=sys.stderr)
        return 1 if failures else 0
    if prepared.demo is not None:
        node = prepared.demo.node
        clocks: list[Callable[[], None]] = []
        if args.speed == 1.0:
            clocks.append(node.run_clock())
        try:
            # A faster clock starts once the agent serves, so a slow start does not eat simulated time.
            return serve(
                setup, config, ready=None if clocks else lambda _: clocks.append(node.run_clock(speed=args.speed))
            )
        finally:
            for stop_clock in clocks:
                stop_clock()  # before the temporary tree is removed
    return serve(setup, config)


def agent_url(config: Config) -> str:
    """The /metrics of the agent this configuration runs, as this host reaches it: an address
    on every interface is asked on the loopback; https where the web config serves TLS."""
    host, port = parse_listen(config.listen)
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    scheme = "http"
    if config.web_config_file is not None:
        try:
            scheme = "https" if "tls_server_config" in config.web_config_file.read_text() else "http"
        except OSError:
            pass  # the agent could not start with it either: http, and the check says what answered
    return f"{scheme}://{host}:{port}/metrics"


def config_check(path: Path, discovery: Discovery) -> int:
    available = {name: r.cls for name, r in discovery.collectors.items()}
    try:
        config = load_config(path, available)
        if config.web_config_file is not None:
            load_web_config(config.web_config_file)
    except (ConfigError, WebConfigError) as exc:
        return report_problems(exc.problems)
    print(f"{path}: OK (collectors enabled: {', '.join(config.enabled_collectors) or 'none'})")
    return 0


def entry_point() -> None:
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    entry_point()
