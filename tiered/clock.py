"""Injectable time: every time-dependent decision takes a Clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def monotonic(self) -> float: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms
        self._mono = 0.0

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now_ms += int(seconds * 1000)
        self._mono += seconds

    def set_ms(self, now_ms: int) -> None:
        if now_ms < self._now_ms:
            raise ValueError("a ManualClock never goes back")
        self._mono += (now_ms - self._now_ms) / 1000
        self._now_ms = now_ms
