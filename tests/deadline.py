"""A wall-clock limit for one block of a test: a hang becomes a failure instead of a stuck suite."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in the main thread after `seconds`, even inside a blocking open() or read()."""

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"took longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
