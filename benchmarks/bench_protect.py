"""What ``protect(...)`` costs on a real MRTR round through the MCP SDK.

    .venv/bin/python benchmarks/bench_protect.py            # in process, writes benchmarks/results/
    .venv/bin/python benchmarks/bench_protect.py --quick
    .venv/bin/python benchmarks/bench_protect.py --transport http   # where servers really run

``--transport http`` runs ``MCPServer`` under uvicorn (on uvloop and httptools when they
are installed, as ``uvicorn.run`` would) over streamable HTTP on loopback, one server
per variant (unprotected, the SDK's own ``RequestStateBoundary``, statecodec SIGN and
ENCRYPT), driven by the official ``mcp`` client. Variants are interleaved in a fresh
random order each repeat; each round's wall time is recorded (client and server share
one process and one event loop, so a round's wall time is their CPU work plus the
kernel's loopback work). The figure is each variant's p50, and its overhead the median
over repeats of the ratio of per-repeat p50s. It writes ``protect-http.json`` and the
plot of the round-time distributions (``protect-http.png``, matplotlib from the
``bench`` group).

The rest of this docstring is about the in-process run.

One timed round is one complete multi-round-trip exchange, as a client makes it:

1. ``tools/call`` with the tool's arguments; the server answers ``input_required`` with
   one elicitation and a 300-byte JSON ``requestState`` (protected: one seal);
2. the same ``tools/call`` again with ``inputResponses`` and the byte-exact
   ``requestState``; the server checks the state it gets back and completes with a
   ``CallToolResult`` (protected: one unseal and one replay-store consume).

Both requests go through the official ``mcp.client.Client`` and the SDK's whole server
path (dispatch, validation, the middleware chain with its OpenTelemetry layer, the
handler, result serialisation). Transports: ``direct`` is what ``Client(server)`` does for
an in-process server on the 2026-07-28 protocol (the SDK's DirectDispatcher pair, no
JSON-RPC framing); ``memory`` is ``Client(InMemoryTransport(server))``, JSON-RPC messages
over in-memory streams.

Variants, on the same lowlevel ``Server``:

- ``unprotected``: no boundary at all (the handler's plaintext travels as it is);
- ``MCP SDK RequestStateBoundary (AES-GCM)``: the SDK's own boundary, what ``MCPServer``
  installs by default, with the same principal bound (the fair baseline);
- ``statecodec SIGN/ENCRYPT + memory replay store``: ``protect(server, codec)``;
- ``reference: codec calls only``: a bare middleware that makes exactly the codec calls
  ``protect`` makes (one ``Binding`` per request, ``aunseal`` with the replay store,
  ``seal``, the same copy of the request context) and nothing else: no shape checks, no
  logging, no metrics, no error mapping.
  ``protect`` minus this row is the adapter's own cost; this row minus ``unprotected`` is
  what the codec costs inside the SDK's request path.

Besides the rounds, the same process times, with no SDK in between:

- the codec work of one round on its own (``Binding`` twice, seal, unseal with the
  replay store), in a hot loop;
- both requests of a round through ``protect``'s middleware and through the reference
  middleware, called directly with a ``call_next`` that returns the wire dicts the SDK's
  runner would: the paired difference is the adapter's own work without the SDK's noise.

Hot-loop figures are not what the same calls cost in a round. Inside a round, the codec
runs once per request between a few hundred microseconds of the SDK's own code, with its
code and data evicted from the CPU caches in between: the same instructions (valgrind
counts them equal, in the round and in the loop) take about three times as long, and the
SDK's own code runs a little slower after them too. So, per transport, the bench also
times each codec call of the reference *where it runs*, inside the SDK round, and the very
same calls in a hot loop, both per call with ``perf_counter_ns``: the first is the
codec's real share of "reference minus unprotected", the rest of that row being the
extra middleware layer and the SDK's own code slowed down. A tiny-footprint loop of the
same hot duration costs the same in the round as in a loop (issue 8): it is the codec's
footprint, not anything the SDK does with the longer token or the copied context.

Variants run interleaved, each repeat in a fresh random order, timed in process CPU time
(see _harness.py for why); an overhead is the median over repeats of the per-repeat
ratio to the baseline on the same transport. Each client is entered in its own task, so
every variant runs at the same depth of anyio cancel scopes (entered one inside the
other, a later client walked one scope more per level at every checkpoint).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import _harness
import mcp_types as types
from _harness import ARGS, PRINCIPAL, TARGET, gc_paused, interleaved, make_state, paired_diff, paired_ratio
from mcp.client import Client
from mcp.client._memory import InMemoryTransport
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp_requests import request_context

from statecodec import Binding, KeyRing, StateCodec
from statecodec.adapters.mcp import StateCodecMiddleware, _with_params, protect
from statecodec.replay.memory import MemoryReplayStore

Ctx = ServerRequestContext[Any, Any]
STATE = make_state(300).decode("utf-8")
AUDIENCE = "forecast"  # the server's name: protect()'s default audience
QUESTION = types.ElicitRequest(
    params=types.ElicitRequestFormParams(
        message="Book the cheapest flight?",
        requested_schema={"type": "object", "properties": {"confirm": {"type": "boolean"}}},
    )
)
ANSWERS: dict[str, types.InputResponse] = {
    "confirm": types.ElicitResult(action="accept", content={"confirm": True})
}
DONE = types.CallToolResult(content=[types.TextContent(type="text", text="booked")])

UNPROTECTED = "unprotected"
SDK = "MCP SDK RequestStateBoundary (AES-GCM)"
SIGN = "statecodec SIGN + memory replay store"
ENCRYPT = "statecodec ENCRYPT + memory replay store"
REF_SIGN = "reference: codec calls only, SIGN"
REF_ENCRYPT = "reference: codec calls only, ENCRYPT"
VARIANTS = (UNPROTECTED, SDK, SIGN, ENCRYPT, REF_SIGN, REF_ENCRYPT)


def codec_for(variant: str, ring: KeyRing) -> StateCodec:
    mode = "sign" if "SIGN" in variant else "encrypt"
    return StateCodec(ring, mode=mode, replay=MemoryReplayStore(max_entries=10_000_000))


def codec_calls_only(codec: StateCodec) -> Callable[[Ctx, CallNext], Any]:
    """The reference middleware: ``protect``'s codec calls and not one check more.

    Never use this shape in a server: it skips the state-shape checks, the fail-closed
    error mapping, logging and metrics. It exists to split ``protect``'s cost into the
    codec's and the adapter's.
    """

    async def middleware(ctx: Ctx, call_next: CallNext) -> HandlerResult:
        if ctx.method != "tools/call":
            return await call_next(ctx)
        params: Any = ctx.params
        binding = Binding(PRINCIPAL, AUDIENCE, ctx.method, params["name"], params.get("arguments") or {})
        token = params.get("requestState")
        if token is not None:
            opened = await codec.aunseal(token, binding)
            # The same context copy as protect's, so that the difference is the adapter's own work.
            ctx = _with_params(ctx, {**params, "requestState": opened.payload.decode("utf-8")})
        result: Any = await call_next(ctx)
        if result.get("resultType") == "input_required":
            result = {**result, "requestState": codec.seal(result["requestState"].encode("utf-8"), binding)}
        return result  # type: ignore[no-any-return]

    return middleware


PHASES = ("Binding, request 1", "seal", "Binding, request 2", "aunseal + consume", "context copy")


def codec_calls_timed(codec: StateCodec, spent: dict[str, list[int]]) -> Callable[[Ctx, CallNext], Any]:
    """:func:`codec_calls_only` with each call timed where it runs, in ns, into ``spent``."""

    async def middleware(ctx: Ctx, call_next: CallNext) -> HandlerResult:
        if ctx.method != "tools/call":
            return await call_next(ctx)
        params: Any = ctx.params
        token = params.get("requestState")
        t0 = time.perf_counter_ns()
        binding = Binding(PRINCIPAL, AUDIENCE, ctx.method, params["name"], params.get("arguments") or {})
        t1 = time.perf_counter_ns()
        if token is not None:
            opened = await codec.aunseal(token, binding)
            t2 = time.perf_counter_ns()
            ctx = _with_params(ctx, {**params, "requestState": opened.payload.decode("utf-8")})
            t3 = time.perf_counter_ns()
            spent[PHASES[2]].append(t1 - t0)
            spent[PHASES[3]].append(t2 - t1)
            spent[PHASES[4]].append(t3 - t2)
        else:
            spent[PHASES[0]].append(t1 - t0)
        result: Any = await call_next(ctx)
        if result.get("resultType") == "input_required":
            t4 = time.perf_counter_ns()
            result = {**result, "requestState": codec.seal(result["requestState"].encode("utf-8"), binding)}
            spent[PHASES[1]].append(time.perf_counter_ns() - t4)
        return result  # type: ignore[no-any-return]

    return middleware


def make_server(variant: str, ring: KeyRing, secret: bytes) -> tuple[Server[Any], list[str | None]]:
    """A server whose ``book`` tool asks once, then completes; ``seen`` records round-2 states."""
    seen: list[str | None] = []

    async def list_tools(ctx: Ctx, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name=TARGET, input_schema={"type": "object"})])

    async def call_tool(ctx: Ctx, params: types.CallToolRequestParams) -> Any:
        if params.request_state is None:
            return types.InputRequiredResult(input_requests={"confirm": QUESTION}, request_state=STATE)
        # The handler must get back exactly the plaintext it minted, and the answers.
        if params.request_state != STATE or not params.input_responses:
            seen.append(params.request_state)
            raise ValueError("the handler did not get its own state back")
        return DONE

    server: Server[Any] = Server(AUDIENCE, on_list_tools=list_tools, on_call_tool=call_tool)
    if variant in (SIGN, ENCRYPT):
        protect(server, codec_for(variant, ring), principal=lambda ctx: PRINCIPAL)
    elif variant in (REF_SIGN, REF_ENCRYPT):
        server.middleware.append(codec_calls_only(codec_for(variant, ring)))
    elif variant == SDK:
        security = RequestStateSecurity(keys=[secret], bind_principal=lambda ctx: PRINCIPAL)
        server.middleware.append(RequestStateBoundary(security, default_audience=AUDIENCE))
    return server, seen


async def one_round(client: Client) -> str:
    """Request 1 (``input_required``) and request 2 (the retry); returns the wire state."""
    session = client.session
    first = await session.call_tool(TARGET, ARGS, allow_input_required=True)
    state = first.request_state  # type: ignore[union-attr]
    second = await session.call_tool(
        TARGET, ARGS, input_responses=ANSWERS, request_state=state, allow_input_required=True
    )
    if not isinstance(second, types.CallToolResult) or second.is_error:
        raise AssertionError(f"round did not complete: {second!r}")
    return state  # type: ignore[return-value]


async def run_rounds(client: Client, n: int) -> int:
    """``n`` rounds; returns the CPU nanoseconds they took (GC paused, as for every variant)."""
    session = client.session
    with gc_paused():
        t0 = time.process_time_ns()
        for _ in range(n):
            first = await session.call_tool(TARGET, ARGS, allow_input_required=True)
            await session.call_tool(
                TARGET,
                ARGS,
                input_responses=ANSWERS,
                request_state=first.request_state,  # type: ignore[union-attr]
                allow_input_required=True,
            )
        t1 = time.process_time_ns()
    return t1 - t0


async def check(variant: str, client: Client, seen: list[str | None]) -> None:
    """The round must complete, the handler see its plaintext, and the wire carry a token."""
    wire = await one_round(client)
    assert not seen, (variant, seen)
    if variant == UNPROTECTED:
        assert wire == STATE
    else:
        assert wire != STATE and STATE not in wire, variant


async def codec_alone(ring: KeyRing, mode: str, n: int) -> float:
    """µs of one round's codec work with no SDK around it: 2 Bindings, seal, unseal."""
    codec = codec_for(mode, ring)
    payload = STATE.encode("utf-8")
    with gc_paused():
        t0 = time.process_time_ns()
        for _ in range(n):
            token = codec.seal(payload, Binding(PRINCIPAL, AUDIENCE, "tools/call", TARGET, dict(ARGS)))
            binding = Binding(PRINCIPAL, AUDIENCE, "tools/call", TARGET, dict(ARGS))
            (await codec.aunseal(token, binding)).payload.decode("utf-8")
        t1 = time.process_time_ns()
    return (t1 - t0) / n / 1000.0


def wire(model: Any) -> dict[str, Any]:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)  # type: ignore[no-any-return]


ASKED = wire(types.InputRequiredResult(input_requests={"confirm": QUESTION}, request_state=STATE))
COMPLETED = wire(DONE)
ANSWERED = {key: wire(value) for key, value in ANSWERS.items()}


async def ask(ctx: Ctx) -> HandlerResult:
    return dict(ASKED)  # the runner hands every middleware a fresh dict


async def complete(ctx: Ctx) -> HandlerResult:
    if ctx.params is None or ctx.params["requestState"] != STATE:
        raise AssertionError("the handler did not get its own state back")
    return dict(COMPLETED)


async def middleware_rounds(middleware: Callable[[Ctx, CallNext], Any], n: int) -> float:
    """µs per round of both requests through ``middleware`` alone, no SDK around it."""
    with gc_paused():
        t0 = time.process_time_ns()
        for _ in range(n):
            first = await middleware(request_context({"name": TARGET, "arguments": dict(ARGS)}), ask)
            retry = {"name": TARGET, "arguments": dict(ARGS), "inputResponses": ANSWERED}
            await middleware(request_context({**retry, "requestState": first["requestState"]}), complete)
        t1 = time.process_time_ns()
    return (t1 - t0) / n / 1000.0


async def alone(repeats: int, rounds: int, seed: int) -> dict[str, Any]:
    """The codec's work and the adapter's own work, each without the SDK around them."""
    ring = KeyRing.generate()
    middlewares: dict[str, Callable[[Ctx, CallNext], Any]] = {}
    for full, ref in ((SIGN, REF_SIGN), (ENCRYPT, REF_ENCRYPT)):
        middlewares[full] = StateCodecMiddleware(
            codec_for(full, ring), audience=AUDIENCE, principal=lambda ctx: PRINCIPAL
        )
        middlewares[ref] = codec_calls_only(codec_for(ref, ring))
    for middleware in middlewares.values():
        await middleware_rounds(middleware, rounds)  # warm-up
    codec: dict[str, list[float]] = {"SIGN": [], "ENCRYPT": []}
    direct: dict[str, list[float]] = {name: [] for name in middlewares}
    for order in interleaved(list(direct), repeats, seed):
        for name in order:
            direct[name].append(await middleware_rounds(middlewares[name], rounds))
        for mode, times in codec.items():
            times.append(await codec_alone(ring, mode, rounds))
    return {
        "repeats": repeats,
        "rounds_per_sample": rounds,
        "codec_us_per_round": {mode: statistics.median(times) for mode, times in codec.items()},
        "middleware_us_per_round": {name: statistics.median(times) for name, times in direct.items()},
        "adapter_own_us_per_round": {
            mode: paired_diff(direct[full], direct[ref])
            for mode, full, ref in (("SIGN", SIGN, REF_SIGN), ("ENCRYPT", ENCRYPT, REF_ENCRYPT))
        },
    }


def overhead(samples: list[float], base: list[float]) -> float:
    return 100 * (paired_ratio(samples, base) - 1)


Job = tuple[Callable[[Client], Awaitable[Any]], "asyncio.Future[Any]"]


class HostedClients:
    """Each client in an asyncio task of its own, all at the same depth of cancel scopes.

    Entered one inside the other in a single task, the clients' anyio task groups nest: a
    client entered later runs under every earlier client's scopes, and anyio walks them
    at each checkpoint (some µs per round for the last of six). Here every client is
    entered, used and left in its own task; :meth:`call` runs ``work(client)`` there and
    waits for it, so what ``work`` times is only that client's rounds.
    """

    def __init__(self) -> None:
        self._jobs: dict[str, asyncio.Queue[Job | None]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def __aenter__(self) -> HostedClients:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for jobs in self._jobs.values():
            jobs.put_nowait(None)
        await asyncio.gather(*self._tasks.values(), return_exceptions=exc[0] is not None)

    def start(self, name: str, target: Any) -> None:
        jobs: asyncio.Queue[Job | None] = asyncio.Queue()
        self._jobs[name] = jobs
        self._tasks[name] = asyncio.create_task(self._host(target, jobs))

    @staticmethod
    async def _host(target: Any, jobs: asyncio.Queue[Job | None]) -> None:
        async with Client(target) as client:
            while (job := await jobs.get()) is not None:
                work, done = job
                try:
                    done.set_result(await work(client))
                except Exception as exc:  # handed to the caller of call()
                    done.set_exception(exc)

    async def call(self, name: str, work: Callable[[Client], Awaitable[Any]]) -> Any:
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._jobs[name].put_nowait((work, done))
        task = self._tasks[name]
        await asyncio.wait((done, task), return_when=asyncio.FIRST_COMPLETED)
        if not done.done():  # the client itself failed (connecting, or leaving)
            task.result()
            raise RuntimeError(f"the client of {name!r} stopped")
        return done.result()


async def codec_calls_where_they_run(
    transport: str, ring: KeyRing, repeats: int, rounds: int
) -> dict[str, dict[str, float]]:
    """Median µs of each codec call of the reference: inside the SDK round, and hot.

    The same calls, timed the same way (``perf_counter_ns`` around each), once where they
    run in a round through the SDK and once in a loop of nothing else.
    """
    in_round: dict[str, list[int]] = {phase: [] for phase in PHASES}
    hot: dict[str, list[int]] = {phase: [] for phase in PHASES}
    server, _ = make_server(UNPROTECTED, ring, b"")
    server.middleware.append(codec_calls_timed(codec_for(REF_SIGN, ring), in_round))
    alone = codec_calls_timed(codec_for(REF_SIGN, ring), hot)
    async with HostedClients() as clients:
        clients.start("timed", InMemoryTransport(server) if transport == "memory" else server)

        async def warm(client: Client) -> None:
            await client.session.list_tools()
            await run_rounds(client, max(3, rounds // 4))

        await clients.call("timed", warm)
        await middleware_rounds(alone, max(3, rounds // 4))
        for spent in (in_round, hot):
            for times in spent.values():
                times.clear()
        for _ in range(repeats):
            await clients.call("timed", lambda client: run_rounds(client, rounds))
            await middleware_rounds(alone, rounds)

    def medians(spent: dict[str, list[int]]) -> dict[str, float]:
        each = {phase: statistics.median(times) / 1000.0 for phase, times in spent.items()}
        return {**each, "round": sum(each.values())}

    return {"in_sdk_round": medians(in_round), "hot_loop": medians(hot)}


async def bench(transport: str, repeats: int, rounds: int, seed: int) -> dict[str, Any]:
    ring, secret = KeyRing.generate(), os.urandom(32)
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    async with HostedClients() as clients:
        for variant in VARIANTS:
            server, seen = make_server(variant, ring, secret)
            clients.start(variant, InMemoryTransport(server) if transport == "memory" else server)

            async def prepare(client: Client, variant: str = variant, seen: list[str | None] = seen) -> None:
                await client.session.list_tools()  # fills the client's output-schema cache
                await check(variant, client, seen)
                await run_rounds(client, max(3, rounds // 4))  # warm-up

            await clients.call(variant, prepare)
        for order in interleaved(VARIANTS, repeats, seed):
            for variant in order:
                ns = await clients.call(variant, lambda client: run_rounds(client, rounds))
                samples[variant].append(ns / rounds / 1000.0)  # µs per round
    base, sdk = samples[UNPROTECTED], samples[SDK]
    rows = []
    for variant in VARIANTS:
        s = samples[variant]
        rows.append(
            {
                "variant": variant,
                "median_us_per_round": statistics.median(s),
                "rounds_per_s": 1e6 / statistics.median(s),
                "added_us": paired_diff(s, base),
                "overhead_pct": None if variant == UNPROTECTED else overhead(s, base),
                "vs_sdk_pct": None if variant in (UNPROTECTED, SDK) else overhead(s, sdk),
                "samples_us": [round(x, 2) for x in s],
            }
        )
    own = {
        mode: paired_diff(samples[full], samples[ref])
        for mode, full, ref in (("SIGN", SIGN, REF_SIGN), ("ENCRYPT", ENCRYPT, REF_ENCRYPT))
    }
    return {
        "transport": transport,
        "repeats": repeats,
        "rounds_per_sample": rounds,
        "rows": rows,
        "protect_minus_reference_us_per_round": own,
        # Per call, then their sum for one round (2 Bindings, seal, unseal, copy), SIGN.
        "reference_codec_calls_us": await codec_calls_where_they_run(transport, ring, repeats, rounds),
    }


# ---------------------------------------------------------------- over streamable HTTP
HTTP_VARIANTS = (UNPROTECTED, SDK, SIGN, ENCRYPT)


def make_mcpserver(variant: str, ring: KeyRing, secret: bytes) -> MCPServer[Any]:
    """``MCPServer`` with the ``book`` tool: asks once, then completes (checks its own state)."""
    security = RequestStateSecurity(keys=[secret], bind_principal=lambda ctx: PRINCIPAL)
    server: MCPServer[Any] = MCPServer(AUDIENCE, request_state_security=security, log_level="WARNING")

    @server.tool(name=TARGET)
    async def book(
        city: str, days: int, units: str, ctx: Context
    ) -> types.CallToolResult | types.InputRequiredResult:
        if ctx.request_state is None:
            return types.InputRequiredResult(input_requests={"confirm": QUESTION}, request_state=STATE)
        if ctx.request_state != STATE or not ctx.input_responses:
            raise ValueError("the handler did not get its own state back")
        return DONE

    if variant == UNPROTECTED:  # the SDK's boundary out: the handler's plaintext travels as it is
        server.middleware[:] = [m for m in server.middleware if not isinstance(m, RequestStateBoundary)]
    elif variant in (SIGN, ENCRYPT):
        protect(server, codec_for(variant, ring), principal=lambda ctx: PRINCIPAL)
    return server


async def timed_rounds(client: Client, n: int) -> list[float]:
    """``n`` rounds; each one's wall time in ms."""
    session = client.session
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        first = await session.call_tool(TARGET, ARGS, allow_input_required=True)
        second = await session.call_tool(
            TARGET,
            ARGS,
            input_responses=ANSWERS,
            request_state=first.request_state,  # type: ignore[union-attr]
            allow_input_required=True,
        )
        times.append((time.perf_counter_ns() - t0) / 1e6)
        if not isinstance(second, types.CallToolResult) or second.is_error:
            raise AssertionError(f"round did not complete: {second!r}")
    return times


async def bench_http(repeats: int, rounds: int, seed: int) -> dict[str, Any]:
    import httpx2  # noqa: PLC0415 - the mcp client's HTTP library
    import uvicorn  # noqa: PLC0415
    from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415

    from statecodec.proxy import bind_socket  # noqa: PLC0415

    ring, secret = KeyRing.generate(), os.urandom(32)
    servers: list[uvicorn.Server] = []
    tasks: list[asyncio.Task[None]] = []
    urls: dict[str, str] = {}
    for variant in HTTP_VARIANTS:
        sock = bind_socket("127.0.0.1", 0)
        config = uvicorn.Config(
            make_mcpserver(variant, ring, secret).streamable_http_app(),
            log_level="warning",
            access_log=False,
            lifespan="on",
        )
        server = uvicorn.Server(config)
        servers.append(server)
        tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
        urls[variant] = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    while not all(server.started for server in servers):
        await asyncio.sleep(0.05)
    per_round: dict[str, list[float]] = {v: [] for v in HTTP_VARIANTS}
    p50s: dict[str, list[float]] = {v: [] for v in HTTP_VARIANTS}
    try:
        async with HostedClients() as clients:
            for variant in HTTP_VARIANTS:
                http = httpx2.AsyncClient(timeout=60)
                clients.start(variant, streamable_http_client(urls[variant], http_client=http))

                async def prepare(client: Client) -> None:
                    await client.session.list_tools()
                    await timed_rounds(client, max(5, rounds // 4))  # warm-up

                await clients.call(variant, prepare)
            for order in interleaved(HTTP_VARIANTS, repeats, seed):
                for variant in order:
                    times = await clients.call(variant, lambda client: timed_rounds(client, rounds))
                    per_round[variant].extend(times)
                    p50s[variant].append(statistics.median(times))
    finally:
        for server in servers:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
    base, sdk = p50s[UNPROTECTED], p50s[SDK]
    rows = []
    for variant in HTTP_VARIANTS:
        rows.append(
            {
                "variant": variant,
                "p50_ms": statistics.median(per_round[variant]),
                "p99_ms": sorted(per_round[variant])[int(0.99 * (len(per_round[variant]) - 1))],
                "added_p50_ms": paired_diff(p50s[variant], base),
                "overhead_pct": None if variant == UNPROTECTED else overhead(p50s[variant], base),
                "vs_sdk_pct": None if variant in (UNPROTECTED, SDK) else overhead(p50s[variant], sdk),
                "repeat_p50s_ms": [round(x, 4) for x in p50s[variant]],
                "distribution_ms": _harness.distribution(per_round[variant]),
            }
        )
    return {"transport": "http", "repeats": repeats, "rounds_per_sample": rounds, "rows": rows}


def plot_http(path: Any, out: Any) -> None:
    """The per-round time distributions of the HTTP run, from its JSON."""
    import json  # noqa: PLC0415

    import matplotlib  # noqa: PLC0415 - the bench dependency group

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    result = json.loads(path.read_text())
    rows = result["http"]["rows"]
    fig, ax = plt.subplots(figsize=(10, 3.2))
    _harness.draw_boxes(ax, [r["distribution_ms"] for r in rows][::-1], [r["variant"] for r in rows][::-1])
    ax.set_xlabel("ms per MRTR round over streamable HTTP (box: quartiles, whiskers: p1-p99)")
    ax.set_title(f"bench_protect --transport http, load average {result['load_average_before'][0]:.1f}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main_http(args: Any) -> int:
    import importlib.util  # noqa: PLC0415

    repeats, rounds = (5, 40) if args.quick else (15, 100)
    loop_factory = None
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop  # noqa: PLC0415

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        http = runner.run(bench_http(repeats, rounds, args.seed))
    result: dict[str, Any] = {
        "command": "python benchmarks/bench_protect.py --transport http" + (" --quick" if args.quick else ""),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": _harness.machine("uvicorn", "uvloop", "httptools", "httpx2"),
        "load_average_before": os.getloadavg(),
        "event_loop": "uvloop" if loop_factory else "asyncio",
        "http": http,
    }
    result["load_average_after"] = os.getloadavg()
    path = _harness.write_json(result, args.out, "protect-http-quick" if args.quick else "protect-http")
    print("| variant | p50 ms per round | p99 ms | added p50 ms | vs unprotected | vs SDK boundary |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in http["rows"]:
        over = "" if r["overhead_pct"] is None else f"{r['overhead_pct']:+.1f}%"
        vs_sdk = "" if r["vs_sdk_pct"] is None else f"{r['vs_sdk_pct']:+.1f}%"
        figures = f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['added_p50_ms']:+.3f}"
        print(f"| {r['variant']} | {figures} | {over} | {vs_sdk} |")
    print(f"load average {result['load_average_before']} -> {result['load_average_after']}\nwrote {path}")
    _harness.plot_beside(plot_http, path)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _harness.parser(__doc__)
    parser.add_argument("--transport", choices=["in-process", "http"], default="in-process")
    args = parser.parse_args(argv)
    if args.transport == "http":
        return main_http(args)
    repeats, rounds = (5, 50) if args.quick else (21, 200)
    result: dict[str, Any] = {
        "command": "python benchmarks/bench_protect.py" + (" --quick" if args.quick else ""),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": _harness.machine(),
        "load_average_before": os.getloadavg(),
        "state_bytes": len(STATE.encode()),
        "round": "request 1 -> input_required (seal); request 2 with inputResponses + requestState "
        "-> CallToolResult (unseal + replay consume)",
        "transports": [asyncio.run(bench(t, repeats, rounds, args.seed)) for t in ("direct", "memory")],
        "without_sdk": asyncio.run(alone(3 * repeats, rounds, args.seed)),
    }
    result["load_average_after"] = os.getloadavg()
    path = _harness.write_json(result, args.out, "protect-quick" if args.quick else "protect")

    print("| transport | variant | µs per round | rounds/s | added µs | vs unprotected | vs SDK boundary |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for t in result["transports"]:
        for r in t["rows"]:
            over = "" if r["overhead_pct"] is None else f"{r['overhead_pct']:+.1f}%"
            vs_sdk = "" if r["vs_sdk_pct"] is None else f"{r['vs_sdk_pct']:+.1f}%"
            print(
                f"| {t['transport']} | {r['variant']} | {r['median_us_per_round']:.0f} | "
                f"{r['rounds_per_s']:.0f} | {r['added_us']:.1f} | {over} | {vs_sdk} |"
            )
    for t in result["transports"]:
        own = ", ".join(f"{m} {v:+.1f}" for m, v in t["protect_minus_reference_us_per_round"].items())
        print(f"{t['transport']}: protect minus the reference (µs per round): {own}")
        calls = t["reference_codec_calls_us"]
        inside, hot = calls["in_sdk_round"], calls["hot_loop"]
        each = ", ".join(f"{phase} {inside[phase]:.1f}/{hot[phase]:.1f}" for phase in PHASES)
        print(
            f"{t['transport']}: the reference's codec calls where they run (SIGN, µs, in the round/hot): "
            f"{each}; one round {inside['round']:.1f}/{hot['round']:.1f}"
        )
    w = result["without_sdk"]
    print("without the SDK (µs per round):")
    for name, v in (*w["codec_us_per_round"].items(), *w["middleware_us_per_round"].items()):
        print(f"  {name}: {v:.1f}" if name in VARIANTS else f"  codec work alone, {name}: {v:.1f}")
    own = ", ".join(f"{m} {v:+.1f}" for m, v in w["adapter_own_us_per_round"].items())
    print(f"  adapter's own work (protect minus the reference): {own}")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
