"""What one redemption came to, as the replay-store tests compare it: ``"ok"`` or the reason.

Also what a store that cannot be reached shows of itself (its repr, the codec's, the
refusal, the check's error), and the check that none of it shows a password of its URL,
and a counter of an event loop's ticks, for the tests that show a store's
waits never block the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

import statecodec as sc
from statecodec.replay import store_from_url


def verify_consume_args(token: str, keys: Path, replay: str, *extra: str) -> list[str]:
    """``statecodec verify`` arguments consuming ``token`` (unbound, keys from ``keys``) in ``replay``."""
    return ["verify", token, "--keys", f"file:{keys}", "--unbound", "--replay", replay, "--consume", *extra]


def outcome(codec: sc.StateCodec, token: str, binding: sc.Binding) -> str:
    """``"ok"`` if ``unseal`` accepts the token, else the reason it refused it."""
    try:
        codec.unseal(token, binding)
    except sc.InvalidState as exc:
        return exc.reason
    return "ok"


async def aoutcome(codec: sc.StateCodec, token: str, binding: sc.Binding) -> str:
    """:func:`outcome` through ``aunseal``."""
    try:
        await codec.aunseal(token, binding)
    except sc.InvalidState as exc:
        return exc.reason
    return "ok"


def assert_hidden(secrets: list[str], *texts: str) -> None:
    """No secret in any text, as written or percent-encoded (either way a URL may carry it)."""
    for text in texts:
        for secret in secrets:
            for form in {secret, quote(secret, safe=""), quote(secret)}:
                assert form not in text, f"{secret!r} shown as {form!r} in: {text}"


def shown_when_unavailable(url: str, binding: sc.Binding) -> list[str]:
    """Every text a store at ``url`` that cannot be reached gives a user or a log.

    The redemption must fail closed (``store_unavailable``), and ``check()`` must raise.
    """
    store = store_from_url(url)
    codec = sc.StateCodec(sc.KeyRing.generate("k1"), replay=store)
    shown = [repr(store), repr(codec)]
    with pytest.raises(sc.InvalidState) as info:
        codec.unseal(codec.seal(b"x", binding), binding)
    assert info.value.reason == "store_unavailable"
    shown += [str(info.value), info.value.detail or "", repr(info.value)]
    with pytest.raises(sc.ReplayStoreError) as failed:
        store.check()
    shown.append(str(failed.value))
    store.close()
    return shown


@dataclass
class Ticks:
    """How often the event loop ran a 10 ms sleep while something else waited."""

    count: int = 0


@contextlib.asynccontextmanager
async def ticking() -> AsyncIterator[Ticks]:
    """Counts the loop's ticks from entry to exit: a blocked loop counts none."""
    ticks = Ticks()

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.01)
            ticks.count += 1

    task = asyncio.create_task(tick())
    try:
        yield ticks
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
