"""StateCodec: seal and unseal requestState tokens, with every policy check in one place.

Read top to bottom, a token is: parsed strictly (size cap first), its kid resolved to
exactly one key, its MAC or AEAD tag verified, and only then are the authenticated times
and binding tag read and judged. Consuming the token id in the replay store comes last,
so nothing that fails a check can burn a valid token. Any unexpected exception fails
closed (deny-on-error) as ``internal_error``.

Time: a token is valid at ``now`` while ``iat - max_skew <= now < exp + expiry_grace``.
A TTL is at most its TTL, as JWT's ``exp`` and the MCP SDKs have it: with ``ttl=600`` and
the default grace of 0, a token issued at ``iat`` is refused from ``iat + 600`` on (and,
``iat`` being ``floor`` of the minting time, it lives at most 600 s, up to a second less).
It may come from an instance whose clock runs up to ``max_skew`` seconds ahead
(``iat <= now + max_skew``). The times are whole seconds, so both comparisons give the
same answer with ``floor(now)`` as with a fractional ``now``.

Flows: a token sealed with ``parent=`` (the :class:`OpenedState` its round was opened
from) is the next round of the parent's flow and carries, authenticated, the flow id (the
first token's id), its round number and the flow's start. ``max_rounds`` and
``max_flow_age`` are enforced when sealing (:class:`FlowBudgetExceeded`) and when
unsealing (``round_limit``, ``flow_expired``), so an instance with looser settings cannot
extend another's flow. ``retry_after=`` paces a round: the token is ``too_early`` until
then, a distinct outcome that never consumes it.

The codec knows nothing about MCP: adapters build the :class:`Binding` and map
:class:`InvalidState` to the wire error.
"""

from __future__ import annotations

import enum
import hmac
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Final, NamedTuple

from nacl.exceptions import CryptoError

from . import _aead, _format, _telemetry
from ._binding import UNBOUND, Binding
from ._errors import FlowBudgetExceeded, InvalidState, Reason, ReplayStoreError
from ._humanize import duration
from ._keys import Key, KeyProvider, KeyRing
from .replay.base import ReplayStore

logger = logging.getLogger("statecodec")

DEFAULT_TTL: Final = 600
DEFAULT_MAX_SKEW: Final = 60
DEFAULT_EXPIRY_GRACE: Final = 0
DEFAULT_MAX_TOKEN_BYTES: Final = 8192
DEFAULT_MAX_ROUNDS: Final = 10  # the official MCP clients' own default
DEFAULT_MAX_FLOW_AGE: Final = 3600
DEFAULT_NAMESPACE: Final = "default"
#: The longest span, in seconds, of every time setting (ttl, max_skew, expiry_grace,
#: max_flow_age, retry_after): 68 years, what a signed 32-bit number of seconds holds.
MAX_SECONDS: Final = 2**31 - 1
#: The smallest max_token_bytes: the shortest token is longer.
MIN_TOKEN_BYTES: Final = 128


class Mode(enum.StrEnum):
    """SIGN: payload readable by the client, integrity-protected (HMAC-SHA256).
    ENCRYPT: payload confidential and integrity-protected (XChaCha20-Poly1305)."""

    SIGN = "sign"
    ENCRYPT = "encrypt"


_PREFIX: Final = {Mode.SIGN: _format.PREFIX_SIGN, Mode.ENCRYPT: _format.PREFIX_ENCRYPT}
_MODE_CHAR: Final = {Mode.SIGN: "s", Mode.ENCRYPT: "e"}
_CHAR_MODE: Final = {"s": Mode.SIGN, "e": Mode.ENCRYPT}


class OpenedState(NamedTuple):
    """A verified token: its payload and the authenticated header fields.

    Immutable. A named tuple rather than a frozen dataclass because one is built on every
    unseal, and a frozen dataclass takes four times as long to construct.
    """

    payload: bytes
    kid: str
    issued_at: int
    expires_at: int
    token_id: str  # 32 hex digits
    mode: Mode
    flow_id: str  # 32 hex digits: the token id of the flow's first token (this one's, in a first round)
    round: int  # 1 for a first round
    flow_started_at: int  # the issued_at of the flow's first token
    not_before: float | None  # the server's pacing: not redeemable before this Unix time


class StateCodec:
    """Seal payloads into requestState tokens and unseal them, checking everything.

    :param keys: a :class:`KeyRing`, or any :class:`KeyProvider` such as a
        ``statecodec.kms.KeyManager`` that swaps rings while keys rotate.
    :param mode: :attr:`Mode.SIGN` or :attr:`Mode.ENCRYPT`. A codec accepts only tokens of
        its own mode and format version: the token never chooses the algorithm.
    :param ttl: default lifetime of minted tokens, in seconds.
    :param max_skew: how far, in whole seconds, the clocks of the instances sharing the
        keys may disagree: a token issued up to this far in the future (by an instance
        whose clock runs ahead) is accepted. Also how long past its acceptance a token id
        stays in the replay store, for an instance whose clock runs behind.
    :param expiry_grace: whole seconds a token is still accepted past its expiry;
        0 (the default) is strict: a TTL means what it says.
    :param max_rounds: the most tokens one flow may have (1..255, default 10, the MCP
        clients' own default): sealing round ``max_rounds + 1`` is refused, and a token
        of a later round (minted by a looser instance) is rejected as ``round_limit``.
    :param max_flow_age: whole seconds a flow may last from its first token (default
        3600; ``None``: no limit). A round's token never outlives its flow (its expiry is
        cut to the flow's end), sealing after that is refused, and a token of an older
        flow is rejected as ``flow_expired`` however fresh it is.
    :param replay: a :class:`ReplayStore`; when set, each token unseals at most once.
    :param namespace: prefix of replay-store entries, so services sharing a store never
        collide (defaults to ``"default"``).
    :param clock: returns the current Unix time, ``time.time`` by default. It is the one
        way time enters the codec: to seal or check "as of" another instant (tests, a
        server with its own time source, ``statecodec verify --at``), give a codec a clock
        that returns that instant.
    """

    def __init__(
        self,
        keys: KeyProvider,
        *,
        mode: Mode | str = Mode.SIGN,
        ttl: int = DEFAULT_TTL,
        max_skew: int = DEFAULT_MAX_SKEW,
        expiry_grace: int = DEFAULT_EXPIRY_GRACE,
        max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        max_flow_age: int | None = DEFAULT_MAX_FLOW_AGE,
        replay: ReplayStore | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(keys, KeyProvider):
            raise TypeError("keys must be a KeyRing or a KeyProvider (keyring() and signing_key())")
        if isinstance(keys, KeyRing) and not len(keys):
            # Refused now, as the SDK refuses an empty ring, not at the first seal.
            raise ValueError("the key ring has no keys, so the codec could neither seal nor unseal")
        if not 0 < ttl <= MAX_SECONDS:
            raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
        for name, value in (("max_skew", max_skew), ("expiry_grace", expiry_grace)):
            if not (0 <= value <= MAX_SECONDS and value == int(value)):
                raise ValueError(f"{name} must be a whole number of seconds >= 0, got {value!r}")
        if not (type(max_rounds) is int and 1 <= max_rounds <= _format.MAX_ROUND):
            raise ValueError(
                f"max_rounds must be a whole number from 1 to {_format.MAX_ROUND}, got {max_rounds!r}"
            )
        if max_flow_age is not None and not (
            0 < max_flow_age <= MAX_SECONDS and max_flow_age == int(max_flow_age)
        ):
            raise ValueError(
                f"max_flow_age must be a positive whole number of seconds or None, got {max_flow_age!r}"
            )
        if max_token_bytes < MIN_TOKEN_BYTES:
            raise ValueError(f"max_token_bytes below {MIN_TOKEN_BYTES} cannot hold a token")
        if replay is not None and not callable(getattr(replay, "consume", None)):
            raise TypeError("replay must be a ReplayStore (see statecodec.replay)")
        self.mode = Mode(mode)
        self.keys = keys
        self.ttl = int(ttl)
        self.max_skew = int(max_skew)
        self.expiry_grace = int(expiry_grace)
        self.max_token_bytes = int(max_token_bytes)
        self.max_rounds = max_rounds
        self.max_flow_age = None if max_flow_age is None else int(max_flow_age)
        self.replay = replay
        self.namespace = namespace
        self.clock = clock
        self._prefix = _PREFIX[self.mode]
        self._prefix_b = self._prefix.encode("ascii")
        self._mode_char = _MODE_CHAR[self.mode]
        # Tested on every seal and unseal: an attribute read, not an enum comparison.
        self._signs = self.mode is Mode.SIGN
        # Expired from this instant after exp: now >= exp + expiry_grace.
        self._expired_after = self.expiry_grace
        # A flow ends like a token: now >= start + max_flow_age + expiry_grace.
        self._flow_over_after = math.inf if max_flow_age is None else int(max_flow_age) + self._expired_after
        # A first round's token lives at most as long as its flow.
        self._flow_ttl_max = MAX_SECONDS if max_flow_age is None else int(max_flow_age)
        # Replay entries: "<namespace>:<token id hex>", kept until exp + expiry_grace +
        # max_skew on this codec's clock, handed to the store as a retention from now (the
        # comment above _store_down). Every instance sharing a store must use the same
        # max_skew and expiry_grace.
        self._replay_prefix = namespace + ":"
        self._kept_after_expiry = self._expired_after + self.max_skew
        self._store_failing = False  # log a store outage once, not once per request

    def __repr__(self) -> str:
        return (
            f"StateCodec(mode={self.mode.value!r}, ttl={self.ttl}, max_skew={self.max_skew}, "
            f"expiry_grace={self.expiry_grace}, max_rounds={self.max_rounds}, "
            f"max_flow_age={self.max_flow_age}, "
            f"keys={self.keys!r}, replay={self.replay!r})"
        )

    # ------------------------------------------------------------------ sealing
    def seal(
        self,
        payload: bytes,
        binding: Binding | None = None,
        *,
        ttl: int | None = None,
        parent: OpenedState | None = None,
        retry_after: float | None = None,
    ) -> str:
        """Mint a token carrying ``payload``, bound to ``binding``, valid for ``ttl`` seconds.

        ``parent``: the :class:`OpenedState` this round was unsealed from; the token is then
        the next round of its flow (refused with :class:`FlowBudgetExceeded` past
        ``max_rounds`` or ``max_flow_age``). ``retry_after``: seconds before the token may
        be redeemed (a round that only says "not ready yet"); earlier it is ``too_early``.
        """
        # The key first, then the clock: a key manager may promote a new key between the
        # two reads, and iat must never predate the moment the key was chosen, or other
        # instances (and the key's own timeline) see a token minted before its promotion.
        key = self.keys.signing_key()
        now = self.clock()
        iat = int(now)
        ttl = self.ttl if ttl is None else ttl
        if not 0 < ttl <= MAX_SECONDS:
            raise ValueError("ttl must be a positive number of seconds")
        flow = None
        if parent is not None:
            flow, ttl = self._next_round(parent, iat, ttl)
        elif ttl > self._flow_ttl_max:  # a first round: its flow starts now
            ttl = self._flow_ttl_max
        not_before_ms = 0
        if retry_after is not None:
            if not (isinstance(retry_after, int | float) and 0 < retry_after <= MAX_SECONDS):
                raise ValueError(f"retry_after must be a positive number of seconds, got {retry_after!r}")
            # Rounded to the microsecond first: float noise must not add a millisecond.
            not_before_ms = math.ceil(round((now + retry_after - iat) * 1000, 3))
            if not_before_ms > ttl * 1000:
                raise ValueError(f"retry_after={retry_after}s is beyond the token's {ttl}s lifetime")
        if not self._signs:
            # One call for the whole 24-byte nonce: its first 16 bytes are the token id.
            fresh = os.urandom(_format.NONCE_LEN)
            token_id, nonce_suffix = fresh[: _format.TOKEN_ID_LEN], fresh[_format.TOKEN_ID_LEN :]
        else:
            token_id, nonce_suffix = os.urandom(_format.TOKEN_ID_LEN), b""
        if flow is None and not not_before_ms:  # a first round, unpaced: the common case, fewest arguments
            return self._seal(
                payload, binding or UNBOUND, key, iat, ttl, token_id=token_id, nonce_suffix=nonce_suffix
            )
        return self._seal(
            payload,
            binding or UNBOUND,
            key,
            iat,
            ttl,
            token_id=token_id,
            nonce_suffix=nonce_suffix,
            flow=flow,
            not_before_ms=not_before_ms,
        )

    def _next_round(self, parent: OpenedState, iat: int, ttl: int) -> tuple[tuple[bytes, int, int], int]:
        """The chained fields of the round after ``parent``, and ``ttl`` cut to the flow's end."""
        if not isinstance(parent, OpenedState):
            raise TypeError(f"parent must be the OpenedState of this round, not {type(parent).__name__}")
        round_, started, flow_id = parent.round + 1, parent.flow_started_at, parent.flow_id
        if round_ > self.max_rounds:
            raise FlowBudgetExceeded(
                "round_limit",
                f"flow {flow_id[:8]} has had its {self.max_rounds} rounds (max_rounds); "
                f"round {round_} refused",
                flow_id=flow_id,
                round=round_,
            )
        if self.max_flow_age is not None:
            left = started + self.max_flow_age - iat
            if left < 1:
                raise FlowBudgetExceeded(
                    "flow_expired",
                    f"flow {flow_id[:8]} started {duration(iat - started)} ago, "
                    f"max_flow_age is {self.max_flow_age}s; round {round_} refused",
                    flow_id=flow_id,
                    round=round_,
                )
            ttl = min(ttl, left)
        return (bytes.fromhex(flow_id), round_, started), ttl

    def _seal(
        self,
        payload: bytes,
        binding: Binding,
        key: Key,
        iat: int,
        ttl: int,
        *,
        token_id: bytes,
        nonce_suffix: bytes,
        flow: tuple[bytes, int, int] | None = None,
        not_before_ms: int = 0,
    ) -> str:
        # Randomness arrives as arguments so the test-vector generator can fix it;
        # the public methods always draw it from os.urandom, never from the caller.
        # ENCRYPT's nonce is token_id || nonce_suffix (8 bytes); SIGN takes no suffix.
        if not isinstance(payload, bytes):
            if not isinstance(payload, bytearray | memoryview):
                raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
            payload = bytes(payload)
        if flow is None and not not_before_ms:  # a first round, unpaced: no keyword arguments to pass
            header = _format.pack_header(key.kid_field, iat, iat + ttl, token_id, binding.tag(key))
        else:
            header = _format.pack_header(
                key.kid_field,
                iat,
                iat + ttl,
                token_id,
                binding.tag(key),
                flow=flow,
                not_before_ms=not_before_ms,
            )
        if self._signs:
            if nonce_suffix:
                raise ValueError("SIGN tokens carry no nonce")
            signed = header + payload
            raw = signed + key.sign_mac(signed)
        else:
            nonce = _format.aead_nonce(token_id, nonce_suffix)
            raw = header + nonce_suffix + _aead.encrypt(payload, self._prefix_b + header, nonce, key.aead_key)
        token = self._prefix + _format.b64encode(raw)
        if len(token) > self.max_token_bytes:
            raise ValueError(
                f"sealed token would be {len(token)} characters, over "
                f"max_token_bytes={self.max_token_bytes}; "
                "keep less in requestState or raise the limit on every instance"
            )
        return token

    # ---------------------------------------------------------------- unsealing
    def unseal(self, token: str, binding: Binding | None = None, *, consume: bool = True) -> OpenedState:
        """Verify ``token`` against ``binding`` and return its payload, or raise :class:`InvalidState`.

        With a replay store and ``consume=True`` (the default), a token unseals only once.
        """
        now = self._now()
        opened = self._guarded_open(token, binding, now, True)
        if consume and self.replay is not None:
            try:
                first = self.replay.consume(
                    self._replay_prefix + opened.token_id, opened.expires_at + self._kept_after_expiry - now
                )
            except Exception as exc:  # deny on error: an unchecked token is never accepted
                raise self._store_down(opened, exc) from None
            self._judge_replay(opened, first)
        return opened

    async def aunseal(
        self, token: str, binding: Binding | None = None, *, consume: bool = True
    ) -> OpenedState:
        """:meth:`unseal` for async servers: the replay store is awaited, never blocking the loop."""
        now = self._now()
        opened = self._guarded_open(token, binding, now, True)
        if consume and self.replay is not None:
            try:
                first = await self.replay.aconsume(
                    self._replay_prefix + opened.token_id, opened.expires_at + self._kept_after_expiry - now
                )
            except Exception as exc:  # deny on error: an unchecked token is never accepted
                raise self._store_down(opened, exc) from None
            self._judge_replay(opened, first)
        return opened

    def verify_unbound(self, token: str) -> OpenedState:
        """Check format, key, MAC/AEAD and times but NOT the binding; never consumes.

        For debugging tools (``statecodec verify`` without binding options). Never use
        this to accept a token in a server: the binding is what ties it to the user.
        """
        return self._guarded_open(token, None, self._now(), False)

    # -------------------------------------------------------------- internals
    def _now(self) -> float:
        # The clock is guarded too: a clock that raises or returns NaN (every comparison
        # with NaN is False, so no token would ever expire) must reject the token, not
        # escape or accept it.
        try:
            now = self.clock()
            if math.isfinite(now):
                return now
        except Exception as exc:
            logger.exception(
                "the clock failed; token rejected",
                extra=_telemetry.fields("clock_failed", reason="internal_error"),
            )
            raise InvalidState("internal_error", f"unexpected {type(exc).__name__} from the clock") from None
        raise InvalidState("internal_error", f"the clock returned {now!r}, not a finite time")

    def _guarded_open(
        self, token: str, binding: Binding | None, now: float, check_binding: bool
    ) -> OpenedState:
        try:
            return self._open(token, binding, now, check_binding)
        except InvalidState:
            raise
        except Exception as exc:
            # Deny on error: a bug or an exotic input must never let a token through.
            logger.exception(
                "unexpected error while unsealing; token rejected",
                extra=_telemetry.fields("unseal_crashed", reason="internal_error"),
            )
            raise InvalidState("internal_error", f"unexpected {type(exc).__name__} while unsealing") from None

    def _open(self, token: str, binding: Binding | None, now: float, check_binding: bool) -> OpenedState:
        parsed = _format.parse(token, self.max_token_bytes)
        _, mode, kid, iat, exp, token_id, bind_tag, _, _, _, flow_id, round_, started, nbf_ms = parsed
        if mode != self._mode_char:
            raise InvalidState(
                "wrong_mode",
                f"token is a {_CHAR_MODE[mode].value.upper()} token, this codec is {self.mode.value.upper()}",
                kid=kid,
            )
        key = self._verification_key(kid, now)
        payload = self._authentic_payload(key, parsed)
        # From here on the header (kid, times, token id, binding tag, flow) is authentic.
        tid = token_id.hex()
        if exp < iat or started > iat:
            raise InvalidState(
                "malformed", "expires before it was issued, or issued before its flow", kid=kid, token_id=tid
            )
        not_before = iat + nbf_ms / 1000 if nbf_ms else None
        why: tuple[Reason, str] | None = None
        if now >= exp + self._expired_after:  # now >= exp + expiry_grace: a TTL is at most its TTL
            why = "expired", f"expired {duration(now - exp)} ago (expiry grace {self.expiry_grace}s)"
        elif iat > now + self.max_skew:  # the same as iat > floor(now) + max_skew: iat is whole
            why = (
                "not_yet_valid",
                (
                    f"issued {duration(iat - now)} in the future, beyond the {self.max_skew}s skew allowance "
                    "(clock skew between instances?)"
                ),
            )
        elif round_ > self.max_rounds:
            why = "round_limit", f"round {round_} of its flow, beyond max_rounds={self.max_rounds}"
        elif now >= started + self._flow_over_after:  # now >= start + max_flow_age + expiry_grace
            why = (
                "flow_expired",
                (f"its flow started {duration(now - started)} ago, beyond max_flow_age={self.max_flow_age}s"),
            )
        elif check_binding and not hmac.compare_digest((binding or UNBOUND).tag(key), bind_tag):
            why = (
                "binding_mismatch",
                (
                    "the token was sealed for a different principal, audience, method, target, "
                    "arguments or extra binding" + ("" if binding else " (no binding was given)")
                ),
            )
        elif not_before is not None and now < not_before:
            # Pacing, last before consuming: an early retry burns nothing.
            why = "too_early", f"redeemable in {not_before - now:.3f}s: the server paces this round"
        if why is not None:
            raise _refusal(why, kid, tid, flow_id, round_, not_before=not_before)
        flow_hex = tid if flow_id is token_id else flow_id.hex()
        return OpenedState(payload, kid, iat, exp, tid, self.mode, flow_hex, round_, started, not_before)

    def _authentic_payload(self, key: Key, parsed: _format.ParsedToken) -> bytes:
        """The payload once the MAC (SIGN) or the AEAD tag (ENCRYPT) verifies under ``key``."""
        kid, header, body = parsed.kid, parsed.header, parsed.body
        if self._signs:
            if not hmac.compare_digest(key.sign_mac(header + body), parsed.mac):
                raise InvalidState(
                    "tampered", "MAC does not match: the token was modified or forged", kid=kid
                )
            return body
        # The token id is half of the nonce and part of the associated data: a changed
        # tid fails the tag twice over.
        nonce = _format.aead_nonce(parsed.token_id, body[: _format.NONCE_SUFFIX_LEN])
        sealed = body[_format.NONCE_SUFFIX_LEN :]
        try:
            return _aead.decrypt(sealed, self._prefix_b + header, nonce, key.aead_key)
        except CryptoError:
            raise InvalidState(
                "tampered", "AEAD tag does not verify: the token was modified or forged", kid=kid
            ) from None

    def _verification_key(self, kid: str, now: float) -> Key:
        ring: KeyRing = self.keys.keyring()
        key = ring.get(kid)
        if key is None:
            have = ", ".join(ring.kids) or "no keys"
            raise InvalidState("unknown_key", f"unknown key id {kid} - the ring has {have}", kid=kid)
        if not key.verifies_at(now):
            retired = duration(now - (key.retires_at or 0))
            raise InvalidState("unknown_key", f"key {kid} was retired {retired} ago", kid=kid)
        return key

    # Why exp + expiry_grace + max_skew (self._kept_after_expiry): keep the entry while
    # ANY instance may still accept the token. This one rejects it from exp + expiry_grace
    # on its own clock, but an instance whose clock is behind by up to max_skew (the most the
    # fleet's clocks may disagree) accepts it until max_skew later on this clock: forgetting
    # earlier would let that instance redeem the token a second time
    # (tests/core/test_clock_skew.py replays exactly that).
    # Why a retention (that instant minus now) rather than the instant: the store measures
    # it on its own clock, so a store whose clock disagrees with this codec's by any amount
    # still remembers the entry exactly as long as needed. The retention is always positive
    # here, more than max_skew: the token passed the expiry check.

    def _store_down(self, opened: OpenedState, exc: BaseException) -> InvalidState:
        kind = getattr(self.replay, "kind", type(self.replay).__name__)
        cause = str(exc) if isinstance(exc, ReplayStoreError) else f"{type(exc).__name__}: {exc}"
        # One WARNING when an outage starts (and one when it ends, in _judge_replay), not
        # one per request: under load a dead store would otherwise flood the log.
        _telemetry.record_store_error(kind)
        log = logger.debug if self._store_failing else logger.warning
        self._store_failing = True
        log(
            "%s replay store unavailable, token %s rejected unconsumed: %s",
            kind,
            opened.token_id[:8],
            cause,
            extra=_telemetry.fields(
                "store_unavailable",
                reason="store_unavailable",
                store=kind,
                detail=cause,
                kid=opened.kid,
                token_id=opened.token_id,
            ),
        )
        return InvalidState(
            "store_unavailable",
            f"{kind} replay store did not answer ({cause}); the token was not consumed, retry later",
            kid=opened.kid,
            token_id=opened.token_id,
            flow_id=opened.flow_id,
            round=opened.round,
        )

    def _judge_replay(self, opened: OpenedState, first: object) -> None:
        # Only a real bool counts: a buggy custom store returning a coroutine or any other
        # truthy object must fail closed, not switch single use off.
        if first is not True and first is not False:
            answer = TypeError(f"replay store answered {type(first).__name__}, not bool")
            raise self._store_down(opened, answer)
        if self._store_failing:
            self._store_failing = False
            kind = getattr(self.replay, "kind", "custom")
            logger.warning(
                "%s replay store answers again", kind, extra=_telemetry.fields("store_recovered", store=kind)
            )
        if not first:
            raise InvalidState(
                "replayed",
                "this token was already redeemed (single use)",
                kid=opened.kid,
                token_id=opened.token_id,
                flow_id=opened.flow_id,  # authentic: the header passed every check
                round=opened.round,
            )


def _refusal(
    why: tuple[Reason, str], kid: str, tid: str, flow_id: bytes, round_: int, *, not_before: float | None
) -> InvalidState:
    """The rejection of an authentic token, naming it and its flow (``retry_at`` when paced)."""
    reason, detail = why
    return InvalidState(
        reason,
        detail,
        kid=kid,
        token_id=tid,
        flow_id=tid if round_ == 1 else flow_id.hex(),
        round=round_,
        retry_at=not_before if reason == "too_early" else None,
    )
