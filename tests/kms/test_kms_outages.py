"""OpenBao sealed, stopped and slow, under a KeyManager that codecs keep using.

A real OpenBao server with Raft storage (``openbao_persistent``) is sealed with
``sys/seal``, stopped by its PID, or slowed down by a loopback TCP proxy that holds every
response longer than the client's timeout. The key source always talks to OpenBao
through that proxy, which forwards untouched unless told to delay.

What must hold (docs/keys.md, statecodec/kms/_manager.py): verification continues from
the cached ring throughout; minting continues until the ring is older than the staleness
limit and then stops with ``KeyUnavailable``; recovery needs no restart; and each outage
is logged once (one warning when it starts, one error when minting stops, one line when
it ends), not once per request or per refresh.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from clocks import ManualClock
from fixtures_openbao import OpenBao

from statecodec import Binding, InvalidState, KeyUnavailable, StateCodec
from statecodec.kms import KeyManager, KeySourceError, VaultSettings, init_keys, source_from_url
from statecodec.replay.memory import MemoryReplayStore

BINDING = Binding(principal="alice", audience="aud", method="tools/call", target="t", arguments={})
TIMEOUT = 1.0  # the key source's HTTP timeout; the slow proxy waits longer than this


class DelayProxy:
    """A loopback TCP proxy that can hold each response back by ``delay`` seconds."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.delay = 0.0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="delay-proxy", daemon=True)
        self._thread.start()

    @property
    def addr(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()  # upstream down: the client sees the connection drop
                continue
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, is_response: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if is_response and self.delay:
                    time.sleep(self.delay)
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()


@pytest.fixture
def proxy(openbao_persistent: OpenBao) -> Iterator[DelayProxy]:
    p = DelayProxy(openbao_persistent.port)
    try:
        yield p
    finally:
        p.close()


def make_manager(
    bao: OpenBao, proxy: DelayProxy, clock: Callable[[], float] = time.time, **timing: float
) -> KeyManager:
    settings = VaultSettings(addr=proxy.addr, token=bao.token, timeout=TIMEOUT, retries=0)
    url = f"vault-transit:transit/faults-{uuid.uuid4().hex[:8]}"
    init_keys(source_from_url(url, vault=settings))
    return KeyManager(source_from_url(url, vault=settings), clock=clock, **timing)


FAULTS = ["sealed", "stopped", "slow"]


@contextlib.contextmanager
def fault(kind: str, bao: OpenBao, proxy: DelayProxy) -> Iterator[None]:
    if kind == "sealed":
        bao.seal()
    elif kind == "stopped":
        bao.stop()
    else:
        proxy.delay = TIMEOUT * 2.5
    try:
        yield
    finally:
        if kind == "sealed":
            bao.unseal()
        elif kind == "stopped":
            bao.start()
            bao.unseal()
        else:
            proxy.delay = 0.0


def messages(caplog: pytest.LogCaptureFixture, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


@pytest.mark.parametrize("kind", FAULTS)
def test_outage_keeps_verifying_stops_minting_after_the_limit_and_recovers(
    kind: str, openbao_persistent: OpenBao, proxy: DelayProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="statecodec")
    clock = ManualClock(time.time())
    manager = make_manager(
        openbao_persistent, proxy, clock, refresh_interval=10, jitter=0, max_skew=0, max_ttl=600,
        staleness_limit=30,
    )  # fmt: skip
    manager.start(background=False)  # the test drives refreshes and time itself
    codec = StateCodec(manager, ttl=600, max_skew=0, replay=MemoryReplayStore(clock=clock), clock=clock)
    minted_before = [codec.seal(b"%d" % i, BINDING) for i in range(30)]

    with fault(kind, openbao_persistent, proxy):
        failures = 0
        for step in range(1, 6):  # 5 failing refreshes, 10 s apart: the ring ages to 50 s
            clock.now += 10
            with pytest.raises(KeySourceError):
                manager.refresh_now()
            failures += 1
            # verification never stops
            assert codec.unseal(minted_before[step], BINDING).payload == b"%d" % step
            if step * 10 <= 30:
                minted_before.append(codec.seal(b"during", BINDING))  # within the limit: still minting
            else:
                for _ in range(20):  # many requests, one log line
                    with pytest.raises(KeyUnavailable, match="minting stopped"):
                        codec.seal(b"x", BINDING)
        assert codec.unseal(minted_before[-1], BINDING).payload == b"during"
        with pytest.raises(InvalidState, match="replayed"):
            codec.unseal(minted_before[1], BINDING)  # the replay store still works too

    clock.now += 10
    manager.refresh_now()  # what the background thread does on its next tick
    assert codec.unseal(codec.seal(b"back", BINDING), BINDING).payload == b"back"
    assert manager.status()["failing_since"] is None

    assert failures == 5
    assert len(messages(caplog, "cannot refresh keys")) == 1, caplog.text
    assert len(messages(caplog, "minting stopped, verification continues")) == 1, caplog.text
    assert len(messages(caplog, "load again after")) == 1, caplog.text
    assert "minting resumed" in messages(caplog, "load again after")[0]
    assert openbao_persistent.token not in caplog.text


def test_background_refresh_recovers_by_itself(
    openbao_persistent: OpenBao, proxy: DelayProxy, caplog: pytest.LogCaptureFixture
) -> None:
    # Real time and the real refresher thread: seal, wait past the staleness limit,
    # unseal, and the manager must come back without anybody calling it.
    caplog.set_level(logging.DEBUG, logger="statecodec")
    manager = make_manager(
        openbao_persistent, proxy, refresh_interval=0.25, jitter=0, max_skew=0, max_ttl=60,
        staleness_limit=1.5,
    )  # fmt: skip
    with manager:
        codec = StateCodec(manager, ttl=60, max_skew=0)
        token = codec.seal(b"before", BINDING)
        with fault("sealed", openbao_persistent, proxy):
            deadline = time.monotonic() + 15
            while True:
                try:
                    codec.seal(b"x", BINDING)
                except KeyUnavailable:
                    break
                assert time.monotonic() < deadline, "minting never stopped"
                time.sleep(0.05)
            assert codec.unseal(token, BINDING).payload == b"before"
            deadline = time.monotonic() + 60
            while len(messages(caplog, "still failing")) < 3:  # the outage spans several refreshes
                assert time.monotonic() < deadline, "the refreshes stopped failing, or stopped"
                time.sleep(0.05)
        deadline = time.monotonic() + 15
        while True:
            try:
                codec.seal(b"y", BINDING)
                break
            except KeyUnavailable:
                assert time.monotonic() < deadline, "did not recover by itself"
                time.sleep(0.05)
    refreshes_failed = len(messages(caplog, "still failing"))
    assert refreshes_failed >= 3, "the outage should span several refreshes"
    assert len(messages(caplog, "cannot refresh keys")) == 1, caplog.text
    assert len(messages(caplog, "minting stopped, verification continues")) == 1
    assert len(messages(caplog, "load again after")) == 1
