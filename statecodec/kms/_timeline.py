"""When a key may mint and until when it must verify: publish, promote, retire.

Several instances refresh their rings independently, so a key that one instance mints
with must already be in every other instance's ring, and a key must keep verifying for
as long as any instance may have minted a still-valid token with it. With

    D = R * (1 + jitter) + max_skew + 1 s       (1 s: source timestamps are whole seconds)
    M = staleness_limit + max_ttl + expiry_grace + 1 s
                                                (1 s of margin: a token is accepted until
                                                 exp + expiry_grace; earlier releases
                                                 accepted it through that whole second)

a key created at ``c`` is *published* at once (verifies on every instance by ``c + D``),
*promoted* at ``c + D`` (the newest promoted key is primary and mints), and the key it
replaced verifies until ``c + D + M`` and is then *retired*. ``M`` counts the staleness
limit because an instance cut off from the source keeps minting with its old primary
for that long; its tokens must still verify everywhere else. ``D`` counts ``max_skew``
because an instance whose clock runs ahead promotes that much early; ``M`` does not:
a token's ``exp`` and a key's ``retires_at`` are both read on the verifier's clock, so
however the minter's clock was off, the key outlives the token by the same margin.

The rotation job may remove a key from the source once the next key is ``D + M`` old
(:attr:`Timeline.min_retire_after`); the rotation policy (``._policy``) refuses a
shorter ``retire_after``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict

from .. import _codec
from .._keys import Key, KeyRing

DEFAULT_REFRESH_INTERVAL: Final = 60.0
DEFAULT_JITTER: Final = 0.1
# The codec's own defaults: a timeline agrees with a StateCodec built without options.
DEFAULT_MAX_SKEW: Final = float(_codec.DEFAULT_MAX_SKEW)
DEFAULT_MAX_TTL: Final = float(_codec.DEFAULT_TTL)
DEFAULT_EXPIRY_GRACE: Final = float(_codec.DEFAULT_EXPIRY_GRACE)
DEFAULT_STALENESS_LIMIT: Final = 900.0

#: Source timestamps (transit metadata, ``created_at``) are truncated to whole seconds,
#: so a key may be up to this much younger than its timestamp says.
TIMESTAMP_GRANULARITY: Final = 1.0
#: A token is accepted until ``exp + expiry_grace`` (statecodec/_codec.py); the second on
#: top is margin for a fleet mid-upgrade from releases that accepted it through that whole
#: second, and keeps every retirement those releases computed unchanged.
LAST_SECOND: Final = 1.0

State = Literal["primary", "verify-only", "pending", "retired"]


@dataclass(frozen=True, slots=True)
class KeyState:
    """One key's place in the timeline, for ``statecodec keys list`` and status pages."""

    kid: str
    state: State
    created_at: int
    promotes_at: int
    retires_at: int | None
    #: When a pending key becomes primary and mints (its promotion); ``None`` for the others.
    #: The primary mints now, even before its own promotion when no key is promoted yet.
    primary_from: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kid": self.kid,
            "state": self.state,
            "created_at": self.created_at,
            "promotes_at": self.promotes_at,
            "primary_from": self.primary_from,
            "retires_at": self.retires_at,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """A source ring turned into the ring a codec uses at one instant."""

    ring: KeyRing  # primary chosen by time; older keys carry their retires_at
    states: tuple[KeyState, ...]
    next_promotion: int | None  # when the primary changes next without a refresh


class TimelineSettings(TypedDict, total=False):
    """:class:`Timeline`'s fields as keywords (``KeyManager(source, refresh_interval=30)``).

    Declared once, here, for the keywords that build a :class:`Timeline`; one left out
    takes the :class:`Timeline` default.
    """

    refresh_interval: float
    jitter: float
    max_skew: float
    max_ttl: float
    expiry_grace: float
    staleness_limit: float


@dataclass(frozen=True, slots=True)
class Timeline:
    """The timing every instance sharing a key source must agree on (seconds)."""

    refresh_interval: float = DEFAULT_REFRESH_INTERVAL
    jitter: float = DEFAULT_JITTER
    max_skew: float = DEFAULT_MAX_SKEW
    max_ttl: float = DEFAULT_MAX_TTL
    expiry_grace: float = DEFAULT_EXPIRY_GRACE
    staleness_limit: float = DEFAULT_STALENESS_LIMIT

    def __post_init__(self) -> None:
        if not self.refresh_interval > 0:
            raise ValueError("refresh_interval must be positive")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter is a fraction of refresh_interval in [0, 1)")
        if not (self.max_skew >= 0 and self.expiry_grace >= 0 and self.max_ttl > 0):
            raise ValueError("max_skew and expiry_grace must be >= 0 and max_ttl > 0")
        if self.staleness_limit < self.max_refresh_gap:
            # Otherwise an instance would stop minting between two healthy refreshes.
            raise ValueError(
                f"staleness_limit={self.staleness_limit:g}s is shorter than the longest gap between "
                f"refreshes, refresh_interval * (1 + jitter) = {self.max_refresh_gap:g}s"
            )

    @property
    def max_refresh_gap(self) -> float:
        return self.refresh_interval * (1 + self.jitter)

    @property
    def promotion_delay(self) -> int:
        """D: by then every instance that refreshes on schedule verifies the new key."""
        return math.ceil(self.max_refresh_gap + self.max_skew + TIMESTAMP_GRANULARITY)

    @property
    def retirement_margin(self) -> int:
        """M: how long a replaced key keeps verifying after its successor's promotion."""
        return math.ceil(self.staleness_limit + self.max_ttl + self.expiry_grace + LAST_SECOND)

    @property
    def min_retire_after(self) -> int:
        """The shortest safe ``retire_after`` for the rotation job: ``D + M``."""
        return self.promotion_delay + self.retirement_margin

    def promotes_at(self, key: Key) -> int:
        return key.created_at + self.promotion_delay

    def plan(self, ring: KeyRing, now: float) -> Plan:
        """Choose the primary by time and give each replaced key its ``retires_at``.

        The invariant: while any live key is promoted, the primary is a promoted key, so
        every instance that refreshes on schedule verifies what this one mints. The
        newest promoted key not marked for retirement is primary; if every promoted key
        is marked (an operator retiring a leaked key before its successor is promoted),
        the one that verifies longest keeps minting until the successor is promoted, and
        never past its own ``retires_at``. Only when no live key is promoted yet (a fresh
        deployment, or every key was just replaced in an emergency) does an unpromoted
        key mint: the oldest, which nobody can hold an older ring without. The stored
        ``primary`` only breaks ties between keys created in the same second.
        """
        live = _by_age(ring, now)
        if not live:
            states = tuple(self._state(k, "retired", k.retires_at) for k in ring.keys)
            return Plan(KeyRing(ring.keys), states, None)
        primary = self._primary(live, now)
        cut = live.index(primary)
        retire = {
            k.kid: _earliest(k.retires_at, self.promotes_at(successor) + self.retirement_margin)
            for k, successor in itertools.pairwise(live[: cut + 1])
        }
        keys = [
            Key(k.kid, k.secret, k.created_at, retire[k.kid]) if k.kid in retire else k for k in ring.keys
        ]
        pending = [self.promotes_at(k) for k in live if self.promotes_at(k) > now]
        if primary.retires_at is not None:  # a retiring primary hands over when it retires
            pending.append(primary.retires_at)
        return Plan(
            KeyRing(keys, primary.kid),
            tuple(self._classify(k, primary, now) for k in keys),
            min(pending) if pending else None,
        )

    def _primary(self, live: list[Key], now: float) -> Key:
        promoted = [k for k in live if self.promotes_at(k) <= now]
        # A key marked for retirement mints only when it must: it stops verifying while
        # its fresh tokens may still be valid.
        steady = [k for k in promoted if k.retires_at is None]
        if steady:
            return steady[-1]
        if promoted:
            return max(promoted, key=lambda k: k.retires_at or 0)
        return ([k for k in live if k.retires_at is None] or live)[0]

    def _classify(self, key: Key, primary: Key, now: float) -> KeyState:
        if key.kid == primary.kid:
            return self._state(key, "primary", None)
        if not key.verifies_at(now):
            return self._state(key, "retired", key.retires_at)
        if key.retires_at is not None or self.promotes_at(key) <= now:
            return self._state(key, "verify-only", key.retires_at)
        # Newer keys promote later, and the newest promoted key is primary: this one takes over
        # at its own promotion (unless it is marked for retirement before then).
        return dataclasses.replace(self._state(key, "pending", None), primary_from=self.promotes_at(key))

    def _state(self, key: Key, state: State, retires_at: int | None) -> KeyState:
        return KeyState(key.kid, state, key.created_at, self.promotes_at(key), retires_at)

    def next_primary(self, ring: KeyRing, now: float) -> tuple[str, int] | None:
        """The key that mints next after the primary at ``now``, and from when; ``None`` if none will.

        Follows the plan's own change points (promotions, a retiring primary's hand-over),
        so it agrees with what :meth:`plan` says at that instant.
        """
        plan = self.plan(ring, now)
        current, at = plan.ring.primary_kid, plan.next_promotion
        for _ in range(len(ring.keys) + 1):  # each change point promotes or retires a key
            if at is None:
                return None
            later = self.plan(ring, at)
            if later.ring.primary_kid not in (None, current):
                return later.ring.primary_kid, at
            at = later.next_promotion
        return None

    def describe(self) -> dict[str, float]:
        return {
            "refresh_interval": self.refresh_interval,
            "jitter": self.jitter,
            "max_skew": self.max_skew,
            "max_ttl": self.max_ttl,
            "expiry_grace": self.expiry_grace,
            "staleness_limit": self.staleness_limit,
            "promotion_delay": self.promotion_delay,
            "retirement_margin": self.retirement_margin,
            "min_retire_after": self.min_retire_after,
        }


def key_states(  # noqa: PLR0917 - positional order promised to the CLI
    ring: KeyRing,
    now: float,
    refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
    max_skew: float = DEFAULT_MAX_SKEW,
    max_ttl: float = DEFAULT_MAX_TTL,
    expiry_grace: float = DEFAULT_EXPIRY_GRACE,
    *,
    jitter: float = DEFAULT_JITTER,
    staleness_limit: float = DEFAULT_STALENESS_LIMIT,
) -> list[KeyState]:
    """Each key's state (primary / verify-only / pending / retired) and its timeline at ``now``."""
    timeline = Timeline(refresh_interval, jitter, max_skew, max_ttl, expiry_grace, staleness_limit)
    return list(timeline.plan(ring, now).states)


def _by_age(ring: KeyRing, now: float) -> list[Key]:
    """Live keys, oldest first; within one second the stored primary sorts last (newest)."""
    order = {kid: i for i, kid in enumerate(ring.kids)}
    live: Sequence[Key] = [k for k in ring.keys if k.verifies_at(now)]
    return sorted(live, key=lambda k: (k.created_at, k.kid == ring.primary_kid, order[k.kid]))


def _earliest(stored: int | None, computed: int) -> int:
    # An operator's earlier retires_at (say, after a leak) always wins.
    return computed if stored is None else min(stored, computed)
