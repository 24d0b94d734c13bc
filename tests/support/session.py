"""What a session of the suite shares with its tests and with another session beside it
(tests/conftest.py): a shared run made ahead in a thread (MadeAhead), the order of a run that
holds the machine tier (machine_tier_first), and the machine tier's lock (MachineTier)."""

from __future__ import annotations

import fcntl
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, Generic, Protocol, TypeVar

T = TypeVar("T")


class MadeAhead(Generic[T]):
    """A shared run made in a thread of its own from the moment it is started, for the tests that
    read it later: a context manager entered in the thread, its value handed over (or the error
    it raised, re-raised in the test that asks), and left when closed."""

    def __init__(self, name: str, make: Callable[[], AbstractContextManager[T]]) -> None:
        self._made = threading.Event()
        self._release = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(make,), name=name, daemon=True)
        self._thread.start()

    def _run(self, make: Callable[[], AbstractContextManager[T]]) -> None:
        try:
            with make() as value:
                self._value = value
                self._made.set()
                self._release.wait()
        except BaseException as error:  # handed to the test that asks for the run
            self._error = error
        finally:
            self._made.set()

    def result(self) -> T:
        self._made.wait()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value

    def close(self) -> None:
        """Leave the run's context (its processes stopped, its files removed) and wait for it; a
        run still being made is waited for first."""
        self._release.set()
        self._thread.join()


class Item(Protocol):
    """What machine_tier_first reads of a pytest item."""

    @property
    def fixturenames(self) -> list[str]: ...

    def get_closest_marker(self, name: str) -> object | None: ...


def machine_tier_first(items: list[Item], shared_run: str) -> bool:
    """Order a run's items (in place): the machine tier first, the readers of shared_run next,
    then the rest, each group in its order.  Only where the run holds both (and True then): the
    shared run is worth making ahead only where the machine tier runs beside it."""

    def reads(item: Item) -> bool:
        return shared_run in getattr(item, "fixturenames", ())

    def is_machine(item: Item) -> bool:
        return item.get_closest_marker("machine") is not None

    if not any(map(reads, items)) or not any(map(is_machine, items)):
        return False
    items.sort(key=lambda item: 0 if is_machine(item) else 1 if reads(item) else 2)
    return True


class MachineTier:
    """A lock on the machine tier: held by a run from the setup of its first machine test to the
    teardown of the last one in a row (a module's fixtures with it), and taken by every run to
    note the machine as found and as left.  ./dev/test runs the machine tier beside the other
    tests' run: this way that run never counts the machine tier's users, mounts or cgroups,
    made and removed while it ran, as its own.  One lock for the machine, as the state it
    guards is the machine's."""

    PATH = Path(tempfile.gettempdir()) / "lockstep-tests-machine-tier.lock"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._held: IO[bytes] | None = None

    def hold(self) -> None:
        if self._held is None:
            self._held = open(self.path, "ab")  # noqa: SIM115 (held across hook calls)
            fcntl.flock(self._held, fcntl.LOCK_EX)

    def release(self) -> None:
        if self._held is not None:
            self._held.close()  # (closing releases the lock)
            self._held = None

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """The machine as no machine test of any run is changing it (this run's own included)."""
        held = self._held is not None
        self.hold()
        try:
            yield
        finally:
            if not held:
                self.release()
