"""A clock a test moves by hand, for whatever reads time through a ``clock`` callable.

Codecs, replay stores and key managers take ``clock`` (Unix seconds); with this one, time
moves only when the test says (``clock.now += seconds``), so what they decide never depends
on how fast the machine is.
"""

from __future__ import annotations


class ManualClock:
    """Returns :attr:`now`, which only the test changes."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
