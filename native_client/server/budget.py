"""A per-connection budget: so much of something a second (messages, frames, seconds of audio), with a
burst allowed (a token bucket)."""

from __future__ import annotations

import time


class TokenBucket:
    """``rate`` units a second, up to ``burst`` at once (default: a second's worth)."""

    def __init__(self, rate: float, burst: float | None = None):
        self.rate = rate
        self.burst = rate if burst is None else burst
        self.tokens = self.burst
        self.last = time.monotonic()

    def take(self, amount: float = 1.0) -> bool:
        """Spend ``amount`` of the budget; False (nothing spent) when there is not that much left."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens < amount:
            return False
        self.tokens -= amount
        return True
