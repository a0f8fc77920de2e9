"""Ctrl-C and SIGTERM during a run: recorded, never raised in the middle of a write.

A KeyboardInterrupt raised at an arbitrary bytecode can land between a step and the rows of
that step, inside a writer, or in the final close, and leave the files inconsistent. While a
run holds ``DeferredInterrupts`` the signals only set a flag; the drive loop asks for it at
states it has fully served (``Driver(should_stop=...)``) and stops there, so the checkpoint
written then describes exactly what is on disk.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class DeferredInterrupts:
    """Context manager: while it is entered, SIGINT/SIGTERM only set ``signum``; nothing is
    ever raised at an arbitrary bytecode (Taichi 1.7 has bare ``except:`` clauses on its
    kernel definition and compile path that would swallow a KeyboardInterrupt raised there,
    and the run would carry on). Before ``arm()`` (a run being built and compiled, nothing to
    save yet) the builder asks ``raise_if_requested()`` at safe points and stops; after it,
    the drive loop asks ``requested()`` at fully served states. Entered inside another
    DeferredInterrupts, a signal it recorded is handed to the outer one on exit, so it is
    never lost. Main thread only; elsewhere it does nothing, as no signal is delivered there.

    A second signal while a run closes (its last rows, checkpoint, video and run.json being
    written) changes nothing: the close finishes, and the run's own status decides the exit
    code (0 completed, 130 interrupted)."""

    def __init__(self):
        self.signum = None
        self.count = 0
        self.armed = False
        self._previous = {}

    def arm(self) -> None:
        self.armed = True

    def raise_if_requested(self) -> None:
        """KeyboardInterrupt here, at a safe point, if a signal has arrived."""
        if self.signum is not None:
            raise KeyboardInterrupt

    def _handler(self, signum, frame):
        self.count += 1
        if self.signum is None:
            self.signum = signum

    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handler)
            for previous in self._previous.values():   # nested: what the outer one has seen
                other = getattr(previous, "__self__", None)
                if isinstance(other, DeferredInterrupts) and other.signum is not None:
                    self.signum = self.signum or other.signum
        return self

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        outer = {getattr(p, "__self__", None) for p in self._previous.values()}
        self._previous = {}
        for other in outer:   # nested: the outer deferral learns of the signal too
            if isinstance(other, DeferredInterrupts) and self.signum is not None:
                other.count += self.count
                if other.signum is None:
                    other.signum = self.signum
        return False


def restart_syscalls() -> None:
    """Blocking calls interrupted by SIGINT/SIGTERM are restarted, not failed with EINTR
    (inside an extension's start-up that is an ImportError)."""
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.siginterrupt(sig, False)


def _raise_interrupt(signum, frame):   # SIGTERM ends as Ctrl-C does
    raise KeyboardInterrupt


class ProgramSignals:
    """The ``particles`` program's SIGINT and SIGTERM from its first line to its exit.

    Recorded (a ``DeferredInterrupts`` the run's own deferral nests in) while the program
    starts and imports, so no KeyboardInterrupt is raised inside an import (a traceback, or
    Taichi's "initialization failed") and SIGTERM never kills it by its default action; the
    CLI acts on a recorded signal at its safe points (``raise_if_requested``: exit 130). A
    command without safe points of its own runs inside ``raising()``, where both raise
    KeyboardInterrupt. ``finish()``: ignored for the interpreter's teardown. What comes
    before the first line (Python's own start-up, site and its .pth files) is out of reach."""

    def __init__(self):
        self.deferred = DeferredInterrupts().__enter__()
        restart_syscalls()

    def raise_if_requested(self) -> None:
        self.deferred.raise_if_requested()

    @contextmanager
    def raising(self):
        """Within: SIGINT and SIGTERM raise KeyboardInterrupt (one recorded before is raised at
        once); after: recorded again, so the exit path is never interrupted."""
        main = threading.current_thread() is threading.main_thread()
        if main:
            for sig in SIGNALS:
                signal.signal(sig, _raise_interrupt)
        try:
            self.deferred.raise_if_requested()
            yield
        finally:
            if main:
                for sig in SIGNALS:
                    signal.signal(sig, self.deferred._handler)
                restart_syscalls()

    def finish(self) -> None:
        ignore_signals()


_program: ProgramSignals | None = None


def program_signals() -> ProgramSignals:
    """The program's signal handling, started by the first caller (the first line of
    ``python -m particles`` or of the console script) and shared by the later ones."""
    global _program
    if _program is None:
        _program = ProgramSignals()
    return _program


def ignore_signals() -> None:
    """SIGINT and SIGTERM ignored from here on (the program's work is written; Python's
    teardown, and Taichi's, must not turn a late signal into a kill by signal)."""
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


__all__ = ["DeferredInterrupts", "ProgramSignals", "program_signals", "ignore_signals",
           "restart_syscalls"]
