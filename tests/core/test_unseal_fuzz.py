"""The fuzz oracle (fuzz/fuzz_unseal.py) run inside pytest.

The coverage-guided campaign needs atheris and runs from scripts/test; these tests make
sure the same oracle holds on the seed corpus and on every past crash
(fuzz/regressions/), drive it with hypothesis mutations on any machine, and prove the
oracle itself can fail: a deliberately broken codec must be caught.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import statecodec._codec

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> types.ModuleType:
    path = ROOT / "fuzz" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # build_corpus imports fuzz_unseal by name
    spec.loader.exec_module(module)
    return module


harness = _load("fuzz_unseal")
corpus = _load("build_corpus")
MINTED = sorted(harness.MINTED)
VALID = sorted(t for t, m in harness.MINTED.items() if m.valid)


def test_minted_tokens_cover_accept_and_every_reject_path() -> None:
    # The seeds are only useful if they reach every branch behind the MAC check.
    assert 0 < len(VALID) < len(MINTED)
    reasons = set()
    for token, minted in harness.MINTED.items():
        codec = harness.CODECS[minted.mode]
        try:
            codec.unseal(token, harness.BINDING)
        except harness.InvalidState as exc:
            reasons.add(exc.reason)
    assert {"expired", "not_yet_valid", "unknown_key", "binding_mismatch"} <= reasons


def test_seed_corpus_and_regressions_hold_the_oracle() -> None:
    seeds = corpus.seeds()
    assert len(seeds) >= len(MINTED)
    for seed in seeds:
        harness.check_one(seed)


def test_vector_tokens_are_seeds_when_vectors_exist() -> None:
    vectors = sorted((ROOT / "tests" / "vectors").glob("*.json"))
    assert vectors, "tests/vectors/*.json are committed; the seed corpus depends on them"
    assert corpus.vector_tokens(), "vector files exist but no token-like strings were found in them"


def test_build_corpus_writes_one_file_per_distinct_seed(tmp_path: Path) -> None:
    assert corpus.main(["build_corpus", str(tmp_path)]) == 0
    files = list(tmp_path.iterdir())
    assert len(files) == len(set(corpus.seeds()))
    assert {f.read_bytes() for f in files} == set(corpus.seeds())


def _mutate(token: str, op: str, pos: int, char: str) -> str:
    i = pos % (len(token) + 1)
    if op == "replace" and i < len(token):
        return token[:i] + char + token[i + 1 :]
    if op == "insert":
        return token[:i] + char + token[i:]
    if op == "delete":
        return token[:i] + token[i + 1 :]
    if op == "truncate":
        return token[:i]
    return token + char


@given(
    token=st.sampled_from(MINTED),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["replace", "insert", "delete", "truncate", "append"]),
            st.integers(0, 4096),
            st.sampled_from([*"AQgw_-=.+/ \x00\n", "\udc80", "\u00e9", "\U0001f600"]),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_hypothesis_fuzz_mutated_tokens(token: str, ops: list[tuple[str, int, str]]) -> None:
    """The fallback fuzzer (hypothesis, no coverage guidance): edits of real tokens."""
    for op, pos, char in ops:
        token = _mutate(token, op, pos, char)
    harness.check_one(token.encode("utf-8", "surrogateescape"))


@given(st.binary(max_size=600) | st.text(max_size=300).map(lambda s: s.encode("utf-8", "surrogatepass")))
def test_hypothesis_fuzz_arbitrary_input(data: bytes) -> None:
    harness.check_one(b"sc1s." + data)
    harness.check_one(b"sc1e." + data)
    harness.check_one(data)


def _tampered(token: str) -> str:
    last = token[-2]
    return token[:-2] + ("B" if last == "A" else "A") + token[-1]


def test_oracle_catches_a_codec_that_skips_the_mac(monkeypatch: pytest.MonkeyPatch) -> None:
    # A deliberately broken codec (fault injection on the hmac module the codec uses),
    # to prove the oracle fails when acceptance is wrong, and not only on crashes.
    sign_valid = _minted(mode=harness.Mode.SIGN, valid=True)
    harness.check_one(_tampered(sign_valid).encode())  # healthy codec: no violation
    broken = types.SimpleNamespace(digest=statecodec._codec.hmac.digest, compare_digest=lambda a, b: True)
    monkeypatch.setattr(statecodec._codec, "hmac", broken)
    with pytest.raises(harness.ContractViolationError, match="accepted a token it must reject"):
        harness.check_one(_tampered(sign_valid).encode())


def _minted(**want: object) -> str:
    return next(t for t, m in harness.MINTED.items() if all(getattr(m, k) == v for k, v in want.items()))


def test_oracle_catches_a_codec_that_ignores_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    expired = _minted(mode=harness.Mode.SIGN, kid="fz-a", case="expired", binding=harness.BINDING)
    harness.check_one(expired.encode())
    monkeypatch.setattr(harness.CODECS[harness.Mode.SIGN], "_expired_after", 10**6)
    with pytest.raises(harness.ContractViolationError, match="accepted a token it must reject"):
        harness.check_one(expired.encode())


def test_oracle_catches_a_codec_that_rejects_valid_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    valid = _minted(mode=harness.Mode.ENCRYPT, kid="fz-b", case="edge-expiring", binding=harness.BINDING)
    monkeypatch.setattr(harness.CODECS[harness.Mode.ENCRYPT], "_expired_after", 0)
    with pytest.raises(harness.ContractViolationError, match="rejected a valid minted token"):
        harness.check_one(valid.encode())


def test_oracle_catches_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: object) -> bool:
        raise RuntimeError("injected")

    valid = _minted(mode=harness.Mode.SIGN, valid=True)
    monkeypatch.setattr(statecodec._codec.hmac, "compare_digest", explode)
    with pytest.raises(harness.ContractViolationError, match="internal_error"):
        harness.check_one(valid.encode())
