"""Seal+unseal cost and token size of statecodec next to its primitives and its peers.

    .venv/bin/python benchmarks/bench_codec.py            # full run, writes benchmarks/results/
    .venv/bin/python benchmarks/bench_codec.py --quick    # a fast look, writes *-quick files

Everything runs in one process and the candidates are interleaved: every repeat runs
each candidate once, in a fresh random order, so a slow phase of a noisy shared machine
hits all of them alike. Time is the CPU time of the benchmarking thread
(``time.thread_time_ns``): every candidate is CPU-bound and single-threaded, and CPU time
leaves out the slices the scheduler gives to other processes. A candidate's figure is the
median over repeats of the mean time of one seal+unseal pair; a ratio is the median over
repeats of the per-repeat ratio to the floor. See benchmarks/README.md.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import io
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _harness
import _peers
import pybase64
from _harness import ARGS, AUDIENCE, METHOD, OTHER_ARGS, PRINCIPAL, ROOT, TARGET, compact, make_state
from mcp.shared.exceptions import MCPError
from nacl.bindings import crypto_aead_xchacha20poly1305_ietf_decrypt as xc_decrypt
from nacl.bindings import crypto_aead_xchacha20poly1305_ietf_encrypt as xc_encrypt

from statecodec import Binding, InvalidState, KeyRing, StateCodec, _aead, _format, _keys
from statecodec.compat import ts_v1
from statecodec.replay.memory import MemoryReplayStore

DOCS_CHART = ROOT / "docs" / "img" / "bench-codec.png"
XC_DIRECT_FLOOR = "floor: XChaCha20-Poly1305 via libsodium directly + pybase64"
HMAC_DIRECT_FLOOR = "floor: HMAC-SHA256 via OpenSSL's HMAC object directly + pybase64"
# The stricter floor of each mode: the primitive called the way statecodec calls it.
DIRECT_FLOOR = {"SIGN": HMAC_DIRECT_FLOOR, "ENCRYPT": XC_DIRECT_FLOOR}
TS_PEER = "TS SDK v1 codec (compat.ts_v1) + bind tag"
STATE_BYTES = 300
SWEEP_BYTES = (64, 256, 1024, 2048, 4096, 8192)
TTL = 600


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# statecodec encodes with pybase64 (SIMD base64 in C) rather than the standard library;
# the stricter floors do the same, so that advantage is visible, not hidden. Encoding is
# statecodec's own call; decoding skips its canonical-spelling checks, as a floor should.
fast_b64url = _format.b64encode


def fast_b64url_decode(text: str) -> bytes:
    return pybase64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def bind_string(request: dict[str, Any]) -> str:
    """What a TS ``bind(ctx)`` callback or a PASETO implicit assertion would carry."""
    return json.dumps(
        [request["principal"], request["audience"], request["method"], request["target"], request["args"]],
        sort_keys=True,
        separators=(",", ":"),
    )


# ------------------------------------------------------------------------ candidates
@dataclass
class Candidate:
    name: str
    group: str  # floor | statecodec | peer | reference
    op: Callable[[], object]  # one seal + unseal
    token: Callable[[], str | bytes]  # a fresh token for the size column
    check: Callable[[], None]  # raises AssertionError when the round trip or a rejection fails
    protection: str
    samples: list[float] = field(default_factory=list)


def _expect_reject(fn: Callable[[], object], *errors: type[BaseException]) -> None:
    try:
        fn()
    except errors:
        return
    raise AssertionError("a token was accepted where it must be rejected")


def _hmac_pair(
    mac: Any, encode: Callable[[bytes], str], decode: Callable[[str], bytes], payload: bytes
) -> tuple[Callable[[], str], Callable[[str], bytes]]:
    """seal/unseal of ``payload || HMAC`` with a keyed HMAC object copied per use."""

    def seal() -> str:
        h = mac.copy()
        h.update(payload)
        return encode(payload + h.digest())

    def unseal(token: str) -> bytes:
        raw = decode(token)
        body = raw[:-32]
        h = mac.copy()
        h.update(body)
        if not hmac.compare_digest(h.digest(), raw[-32:]):
            raise ValueError("bad mac")
        return body

    return seal, unseal


def _xc_pair(
    encrypt: Callable[..., bytes],
    decrypt: Callable[..., bytes],
    encode: Callable[[bytes], str],
    decode: Callable[[str], bytes],
    payload: bytes,
    secret: bytes,
    aad: Any,
) -> tuple[Callable[[], str], Callable[[str], bytes]]:
    """seal/unseal of ``nonce || XChaCha20-Poly1305(payload)`` with a random 24-byte nonce."""

    def seal() -> str:
        nonce = os.urandom(24)
        return encode(nonce + encrypt(payload, aad, nonce, secret))

    def unseal(token: str) -> bytes:
        raw = decode(token)
        return bytes(decrypt(raw[24:], aad, raw[:24], secret))

    return seal, unseal


def floors(payload: bytes, secret: bytes) -> list[Candidate]:
    # The fastest stdlib HMAC (keyed once, copied), and the stricter floor: statecodec copies
    # OpenSSL's HMAC object without hmac.HMAC's Python wrapper (statecodec/_keys.py,
    # _keyed_hmac) and encodes with pybase64, and so does this floor.
    hmac_seal, hmac_unseal = _hmac_pair(
        hmac.new(secret, digestmod=hashlib.sha256), b64url, b64url_decode, payload
    )
    direct_seal, direct_unseal = _hmac_pair(
        _keys._keyed_hmac(secret), fast_b64url, fast_b64url_decode, payload
    )
    # PyNaCl's public API, and the stricter floor: statecodec calls libsodium without
    # PyNaCl's per-call wrapper (statecodec/_aead.py), and so does this floor.
    xc_seal, xc_unseal = _xc_pair(xc_encrypt, xc_decrypt, b64url, b64url_decode, payload, secret, None)
    xcd_seal, xcd_unseal = _xc_pair(
        _aead.encrypt, _aead.decrypt, fast_b64url, fast_b64url_decode, payload, secret, b""
    )

    def check_hmac() -> None:
        for seal, unseal in ((hmac_seal, hmac_unseal), (direct_seal, direct_unseal)):
            assert unseal(seal()) == payload
            t = seal()
            forged = t[:-2] + ("A" if t[-2] != "A" else "B") + t[-1]
            _expect_reject(functools.partial(unseal, forged), ValueError)

    def check_xc() -> None:
        assert xc_unseal(xc_seal()) == payload
        assert xcd_unseal(xcd_seal()) == payload

    integrity, confidentiality = "integrity only", "integrity + confidentiality"
    return [
        Candidate(
            "floor: HMAC-SHA256 + b64url",
            "floor",
            lambda: hmac_unseal(hmac_seal()),
            hmac_seal,
            check_hmac,
            integrity,
        ),
        Candidate(
            HMAC_DIRECT_FLOOR,
            "floor",
            lambda: direct_unseal(direct_seal()),
            direct_seal,
            check_hmac,
            integrity,
        ),
        Candidate(
            "floor: XChaCha20-Poly1305 + b64url",
            "floor",
            lambda: xc_unseal(xc_seal()),
            xc_seal,
            check_xc,
            confidentiality,
        ),
        Candidate(
            XC_DIRECT_FLOOR, "floor", lambda: xcd_unseal(xcd_seal()), xcd_seal, check_xc, confidentiality
        ),
    ]


def statecodec_candidates(payload: bytes, ring: KeyRing, *, variants: bool = True) -> list[Candidate]:
    out = []
    reused = Binding(PRINCIPAL, AUDIENCE, METHOD, TARGET, ARGS)
    wrong = Binding(PRINCIPAL, AUDIENCE, METHOD, TARGET, OTHER_ARGS)
    for mode in ("sign", "encrypt"):
        label = mode.upper()
        for replay in (False, True) if variants else (False,):
            store = MemoryReplayStore(max_entries=10_000_000) if replay else None
            codec = StateCodec(ring, mode=mode, replay=store, max_token_bytes=16384)

            def fresh(codec: StateCodec = codec) -> bytes:
                # A request builds its Binding once and uses it for its unseal and its seal.
                b = Binding(PRINCIPAL, AUDIENCE, METHOD, TARGET, ARGS)
                return codec.unseal(codec.seal(payload, b), b).payload

            def check(codec: StateCodec = codec) -> None:
                assert fresh(codec) == payload
                t = codec.seal(payload, reused)
                _expect_reject(lambda: codec.unseal(t, wrong), InvalidState)
                if codec.replay is not None:
                    codec.unseal(t, reused)
                    _expect_reject(lambda: codec.unseal(t, reused), InvalidState)

            name = f"statecodec {label}" + (" + memory replay store" if replay else "")
            prot = (
                "integrity" if mode == "sign" else "integrity + confidentiality"
            ) + ", expiry, binding, kid"
            out.append(
                Candidate(
                    name,
                    "statecodec",
                    fresh,
                    lambda c=codec: c.seal(payload, reused),
                    check,
                    prot + (", single use" if replay else ""),
                )
            )
            if variants and not replay:
                # A later round of a flow: sealed with the opened state of round 1 as parent.
                parent = codec.unseal(codec.seal(payload, reused), reused)

                def chained(codec: StateCodec = codec, parent: Any = parent) -> bytes:
                    b = Binding(PRINCIPAL, AUDIENCE, METHOD, TARGET, ARGS)
                    return codec.unseal(codec.seal(payload, b, parent=parent), b).payload

                def check_chained(codec: StateCodec = codec, parent: Any = parent) -> None:
                    assert chained(codec) == payload
                    assert codec.unseal(codec.seal(payload, reused, parent=parent), reused).round == 2

                out.append(
                    Candidate(
                        f"statecodec {label} chained (a later round of a flow)",
                        "statecodec",
                        chained,
                        lambda c=codec, p=parent: c.seal(payload, reused, parent=p),
                        check_chained,
                        prot + ", flow id, round, flow start",
                    )
                )

                def reuse(codec: StateCodec = codec) -> bytes:
                    return codec.unseal(codec.seal(payload, reused), reused).payload

                out.append(
                    Candidate(
                        f"statecodec {label} (Binding reused across requests)",
                        "statecodec",
                        reuse,
                        lambda c=codec: c.seal(payload, reused),
                        lambda: None,
                        prot,
                    )
                )
    return out


def peer_candidates(
    payload: bytes, secret: bytes, ring: KeyRing, *, references: bool = True
) -> list[Candidate]:
    state_obj = json.loads(payload)
    state_str = payload.decode("utf-8")
    request = {"principal": PRINCIPAL, "audience": AUDIENCE, "method": METHOD, "target": TARGET, "args": ARGS}
    other = {**request, "args": OTHER_ARGS}
    out = []

    sdk = _peers.McpSdkBoundary(
        secret, principal=PRINCIPAL, audience=AUDIENCE, method=METHOD, name=TARGET, arguments=ARGS
    )
    sdk.unseal(sdk.seal(state_str))  # one round first, so every timed seal reuses its request's binding

    def check_sdk() -> None:
        assert sdk.unseal(sdk.seal(state_str)) == state_str
        elsewhere = _peers.McpSdkBoundary(
            secret, principal=PRINCIPAL, audience=AUDIENCE, method=METHOD, name=TARGET, arguments=OTHER_ARGS
        )
        t = sdk.seal(state_str)
        _expect_reject(lambda: elsewhere.unseal(t), MCPError)

    out.append(
        Candidate(
            "MCP Python SDK: AES-GCM codec + claims envelope",
            "peer",
            lambda: sdk.unseal(sdk.seal(state_str)),
            lambda: sdk.seal(state_str),
            check_sdk,
            "integrity + confidentiality, expiry, binding, kid",
        )
    )

    # What a TS server's bind(ctx) returns, built once per request like a Binding.
    def ts_round() -> object:
        bind = bind_string(request)
        token = ts_v1.seal(secret, state_obj, ttl_seconds=TTL, bind=bind)
        return ts_v1.unseal(token, secret, bind=bind).payload

    def check_ts() -> None:
        assert ts_round() == state_obj
        t = ts_v1.seal(secret, state_obj, bind=bind_string(request))
        _expect_reject(lambda: ts_v1.unseal(t, secret, bind=bind_string(other)), InvalidState)

    out.append(
        Candidate(
            TS_PEER,
            "peer",
            ts_round,
            lambda: ts_v1.seal(secret, state_obj, bind=bind_string(request)),
            check_ts,
            "integrity, expiry, binding",
        )
    )

    pseal, punseal = _peers.pyseto_v4_local(secret, TTL)

    def paseto() -> object:
        assertion = bind_string(request).encode("utf-8")  # once per request, for both directions
        return punseal(pseal({"s": state_obj}, assertion), assertion)

    def check_paseto() -> None:
        assert paseto()["s"] == state_obj  # type: ignore[index]
        t = pseal({"s": state_obj}, bind_string(request).encode())
        _expect_reject(lambda: punseal(t, bind_string(other).encode()), Exception)

    out.append(
        Candidate(
            "pyseto v4.local + implicit assertion + exp",
            "peer",
            paseto,
            lambda: pseal({"s": state_obj}, bind_string(request).encode()),
            check_paseto,
            "integrity + confidentiality, expiry, binding",
        )
    )

    fseal, funseal = _peers.fernet(secret, TTL)

    def check_fernet() -> None:
        assert funseal(fseal(payload)) == payload

    out.append(
        Candidate(
            "cryptography Fernet (ttl)",
            "peer",
            lambda: funseal(fseal(payload)),
            lambda: fseal(payload),
            check_fernet,
            "integrity + confidentiality, expiry; no binding",
        )
    )

    iseal, iunseal = _peers.itsdangerous_timed(secret, TTL)

    def check_its() -> None:
        assert iunseal(iseal(state_obj)) == state_obj

    out.append(
        Candidate(
            "itsdangerous URLSafeTimedSerializer (max_age)",
            "peer",
            lambda: iunseal(iseal(state_obj)),
            lambda: iseal(state_obj),
            check_its,
            "integrity (HMAC-SHA1), expiry; no binding",
        )
    )

    if references:
        codec = sdk.codec_only()
        key = ring.primary

        def binding_only() -> bytes:
            return Binding(PRINCIPAL, AUDIENCE, METHOD, TARGET, ARGS).tag(key)

        out.append(
            Candidate(
                "reference: statecodec Binding(...) + its tag, alone",
                "reference",
                binding_only,
                lambda: b"",
                lambda: None,
                "(the per-request binding work in the statecodec rows)",
            )
        )
        out.append(
            Candidate(
                "reference: MCP SDK AES-GCM codec alone (no envelope)",
                "reference",
                lambda: codec.unseal(codec.seal(payload)),
                lambda: codec.seal(payload),
                lambda: None,
                "integrity + confidentiality",
            )
        )
        out.append(
            Candidate(
                "reference: json.dumps + json.loads of the state",
                "reference",
                lambda: json.loads(compact(state_obj)),
                lambda: b"",
                lambda: None,
                "(the JSON work inside the object-based rows)",
            )
        )
    return out


# ------------------------------------------------------------------------- timing
def run_interleaved(cands: list[Candidate], repeats: int, target_s: float, seed: int) -> None:
    loops = {c.name: _harness.calibrate(c.op, target_s) for c in cands}  # doubles as the warm-up
    for order in _harness.interleaved(cands, repeats, seed):
        for c in order:
            c.samples.append(_harness.sample_us(c.op, loops[c.name]))  # µs per seal+unseal


# ----------------------------------------------------------------------- reporting
def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| candidate | median µs | IQR µs | vs floor | vs direct floor | token chars | overhead "
        "| peak alloc B |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in rows:
        ratio = f"{r['ratio']:.2f}x {r['ratio_to'].split(':')[1].split('+')[0].strip()}" if r["ratio"] else ""
        direct = f"{r['ratio_direct_floor']:.2f}x" if r["ratio_direct_floor"] else ""
        size = str(r["token_chars"]) if r["token_chars"] else ""
        over = str(r["overhead_chars"]) if r["token_chars"] else ""
        lines.append(
            f"| {r['name']} | {r['median_us']:.1f} | {r['iqr_us'][0]:.1f}-{r['iqr_us'][1]:.1f} | "
            f"{ratio} | {direct} | {size} | {over} | {r['peak_alloc_bytes']} |"
        )
    return "\n".join(lines)


def goals(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    sign, enc = rows["statecodec SIGN"], rows["statecodec ENCRYPT"]
    sdk = rows["MCP Python SDK: AES-GCM codec + claims envelope"]
    ts = rows[TS_PEER]
    paseto = rows["pyseto v4.local + implicit assertion + exp"]
    same_protection = [sdk, ts, paseto]
    out = []

    def goal(text: str, ok: bool, value: str) -> None:
        out.append({"goal": text, "met": ok, "value": value})

    for r, limit in ((sign, 2.0), (enc, 2.0)):
        goal(
            f"{r['name']} <= {limit}x its floor (target 1.5x), Binding built per request",
            r["ratio"] <= limit,
            f"{r['ratio']:.2f}x",
        )
        reused = rows[r["name"] + " (Binding reused across requests)"]
        goal(
            f"{reused['name']} <= {limit}x its floor (target 1.5x)",
            reused["ratio"] <= limit,
            f"{reused['ratio']:.2f}x",
        )
    for r in (sign, rows["statecodec SIGN (Binding reused across requests)"]):
        goal(
            f"(stricter) {r['name']} <= 2.0x OpenSSL's HMAC called directly",
            r["ratio_direct_floor"] <= 2.0,
            f"{r['ratio_direct_floor']:.2f}x",
        )
    for r in (enc, rows["statecodec ENCRYPT (Binding reused across requests)"]):
        goal(
            f"(stricter) {r['name']} <= 2.0x libsodium called directly",
            r["ratio_direct_floor"] <= 2.0,
            f"{r['ratio_direct_floor']:.2f}x",
        )
    for r in (sign, enc):
        slowest_win = min(p["median_us"] / r["median_us"] for p in same_protection)
        goal(
            f"{r['name']} faster than the SDK envelope, the TS v1 codec and pyseto v4.local",
            all(r["median_us"] < p["median_us"] for p in same_protection),
            f"closest peer is {slowest_win:.2f}x slower",
        )
    goal("SIGN overhead <= 120 chars", sign["overhead_chars"] <= 120, str(sign["overhead_chars"]))
    goal("ENCRYPT overhead <= 140 chars", enc["overhead_chars"] <= 140, str(enc["overhead_chars"]))
    for r, limit in ((sign, 150), (enc, 140)):  # issue 21: a later round of a flow
        chained = rows[r["name"] + " chained (a later round of a flow)"]
        more = chained["overhead_chars"] - r["overhead_chars"]
        goal(
            f"{chained['name']} overhead <= {limit} chars",
            chained["overhead_chars"] <= limit,
            f"{chained['overhead_chars']} ({more:+d} on a first round)",
        )
    for r in (sign, enc):
        goal(
            f"{r['name']} token shorter than both SDKs' tokens",
            r["token_chars"] < min(sdk["token_chars"], ts["token_chars"]),
            f"{r['token_chars']} vs SDK {sdk['token_chars']}, TS {ts['token_chars']}",
        )
    return out


SHORT = {  # legend labels of the size sweep
    "floor: HMAC-SHA256 + b64url": "floor HMAC-SHA256",
    HMAC_DIRECT_FLOOR: "floor HMAC-SHA256 (OpenSSL object direct)",
    "floor: XChaCha20-Poly1305 + b64url": "floor XChaCha20 (PyNaCl)",
    XC_DIRECT_FLOOR: "floor XChaCha20 (libsodium direct)",
    "MCP Python SDK: AES-GCM codec + claims envelope": "MCP Python SDK envelope",
    TS_PEER: "TS SDK v1 + bind",
    "pyseto v4.local + implicit assertion + exp": "pyseto v4.local",
    "cryptography Fernet (ttl)": "Fernet",
    "itsdangerous URLSafeTimedSerializer (max_age)": "itsdangerous",
}


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib  # noqa: PLC0415 - only needed for the chart, and slow to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415 - a matplotlib dependency

    colors = {"floor": "#9e9e9e", "statecodec": "#1f77b4", "peer": "#ff7f0e", "reference": "#c7c7c7"}
    rows = [r for r in result["results"] if r["group"] != "reference"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [1.2, 1]})
    names = [r["name"].replace(" (Binding reused across requests)", " (reused Binding)") for r in rows]
    ax1.barh(range(len(rows)), [r["median_us"] for r in rows], color=[colors[r["group"]] for r in rows])
    ax1.set_yticks(range(len(rows)), names, fontsize=7)
    ax1.invert_yaxis()
    for i, r in enumerate(rows):
        ax1.text(r["median_us"], i, f" {r['median_us']:.0f}", va="center", fontsize=7)
    ax1.set_xlabel("µs per seal+unseal (median), 300-byte state")
    ax1.set_title("One seal + unseal, full binding", fontsize=9)
    ax1.margins(x=0.12)
    palette = {  # greys for floors, blues for statecodec, warm colours for peers
        "floor": iter(["#444444", "#666666", "#888888", "#bbbbbb"]),
        "statecodec": iter(["#1f77b4", "#17becf"]),
        "peer": iter(["#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"]),
    }
    for name, series in result["sweep"]["series"].items():
        group = (
            "floor" if name.startswith("floor") else "statecodec" if name.startswith("statecodec") else "peer"
        )
        style = {"floor": ":", "statecodec": "-", "peer": "--"}[group]
        ax2.plot(
            result["sweep"]["sizes"],
            series,
            style,
            color=next(palette[group], None),
            marker="o",
            markersize=3,
            label=SHORT.get(name, name),
            linewidth=1.4 if group == "statecodec" else 1.1,
        )
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("payload bytes")
    ax2.set_ylabel("µs per seal+unseal (median)")
    ax2.set_title("Cost growth with payload size", fontsize=9)
    ax2.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    ax2.grid(True, which="both", alpha=0.25)
    fig.suptitle(
        f"statecodec benchmark, {result['machine']['cpu']}, {result['machine']['nproc']} cores, "
        f"Python {result['machine']['python']}",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    # A 64-colour palette keeps the committed chart small (well under 100 KB).
    Image.open(buf).convert("RGB").quantize(colors=64).save(path, optimize=True)


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    args = _harness.parser(__doc__).parse_args(argv)
    repeats, target = (7, 0.01) if args.quick else (41, 0.02)
    sweep_repeats = 5 if args.quick else 21

    secret = os.urandom(32)
    ring = KeyRing.generate()  # a generated kid: "k" + 8 hex digits, the common case
    payload = make_state(STATE_BYTES)
    cands = (
        floors(payload, secret)
        + statecodec_candidates(payload, ring)
        + peer_candidates(payload, secret, ring)
    )
    for c in cands:
        c.check()
    print(
        f"checks passed for {len(cands)} candidates; timing {repeats} interleaved repeats...", file=sys.stderr
    )
    run_interleaved(cands, repeats, target, args.seed)

    by_name = {c.name: c for c in cands}
    hmac_floor, xc_floor = (
        by_name["floor: HMAC-SHA256 + b64url"],
        by_name["floor: XChaCha20-Poly1305 + b64url"],
    )
    b64_len = len(b64url(payload))
    rows = []
    for c in cands:
        floor = xc_floor if ("ENCRYPT" in c.name or "confidentiality" in c.protection) else hmac_floor
        tok = c.token()
        rows.append(
            {
                "name": c.name,
                "group": c.group,
                "protection": c.protection,
                "median_us": statistics.median(c.samples),
                "iqr_us": _harness.quartiles(c.samples),
                "ratio": None
                if c.group == "floor" or c.name.endswith("alone") or "json" in c.name
                else _harness.paired_ratio(c.samples, floor.samples),
                "ratio_to": floor.name,
                # statecodec against the stricter floor that calls the primitive as it does
                "ratio_direct_floor": _harness.paired_ratio(
                    c.samples, by_name[DIRECT_FLOOR[c.name.split()[1]]].samples
                )
                if c.group == "statecodec"
                else None,
                "token_chars": len(tok),
                "overhead_chars": len(tok) - b64_len if tok else None,
                "peak_alloc_bytes": _harness.peak_alloc(c.op),
                "samples_us": [round(s, 3) for s in c.samples],
            }
        )
    result: dict[str, Any] = {
        "command": "python benchmarks/bench_codec.py" + (" --quick" if args.quick else ""),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": _harness.machine(),
        "config": {
            "state_bytes": STATE_BYTES,
            "b64url_state_chars": b64_len,
            "repeats": repeats,
            "target_seconds_per_sample": target,
            "seed": args.seed,
            "kid": ring.primary.kid,
            "binding": {
                "principal": PRINCIPAL,
                "audience": AUDIENCE,
                "method": METHOD,
                "target": TARGET,
                "arguments": ARGS,
            },
        },
        "results": rows,
    }
    result["goals"] = goals({r["name"]: r for r in rows})

    # Cost growth: the per-request rows only, one interleaved run per payload size.
    print("payload-size sweep...", file=sys.stderr)
    series: dict[str, list[float]] = {}
    for size in SWEEP_BYTES:
        p = make_state(size)
        sweep = (
            floors(p, secret)
            + statecodec_candidates(p, ring, variants=False)
            + peer_candidates(p, secret, ring, references=False)
        )
        run_interleaved(sweep, sweep_repeats, target, args.seed + size)
        for c in sweep:
            series.setdefault(c.name, []).append(round(statistics.median(c.samples), 3))
    result["sweep"] = {"sizes": list(SWEEP_BYTES), "repeats": sweep_repeats, "series": series}

    stem = "codec-quick" if args.quick else "codec"
    _harness.write_json(result, args.out, stem)
    chart(result, args.out / f"{stem}.png")
    if not args.quick and args.out == _harness.RESULTS:  # for docs/performance.md: mkdocs serves docs/ only
        DOCS_CHART.parent.mkdir(exist_ok=True)
        shutil.copyfile(args.out / f"{stem}.png", DOCS_CHART)

    m = result["machine"]
    print(
        f"\n{m['cpu']}, {m['nproc']} cores, Python {m['python']}, {repeats} repeats, "
        f"{STATE_BYTES}-byte state ({b64_len} chars of base64url)\n"
    )
    print(table(rows))
    print("\n| payload bytes | " + " | ".join(str(s) for s in SWEEP_BYTES) + " |")
    print("|---|" + "---:|" * len(SWEEP_BYTES))
    for name, values in series.items():
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + " |")
    print()
    for g in result["goals"]:
        print(f"{'MET ' if g['met'] else 'MISS'}  {g['goal']}: {g['value']}")
    print(f"\nwrote {args.out / (stem + '.json')} and {args.out / (stem + '.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
