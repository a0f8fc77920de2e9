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

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class DeferredInterrupts:
    """Context manager: once ``arm()`` is called, SIGINT/SIGTERM set ``signum`` instead of
    raising; before that (while a run is built and compiled, with nothing to save yet) they
    raise KeyboardInterrupt at once. Main thread only; elsewhere it does nothing, as no
    signal is delivered there."""

    def __init__(self):
        self.signum = None
        self.armed = False
        self._previous = {}

    def arm(self) -> None:
        self.armed = True

    def _handler(self, signum, frame):
        if not self.armed:
            raise KeyboardInterrupt
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
        return self

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
        return False


__all__ = ["DeferredInterrupts"]
