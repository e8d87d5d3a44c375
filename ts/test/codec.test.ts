/** The codec's behaviour beyond the vectors: sealing, single use, flows, pacing, failing closed. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  argumentDigest, Binding, canonicalJson, FlowBudgetExceeded, InvalidState, Key, KeyRing, KeyUnavailable,
  MemoryReplayStore, StateCodec, type Reason, type ReplayStore,
} from "../src/index.js";

const T = 1_750_000_000;
const ring = KeyRing.generate("k1");
const alice = new Binding({ principal: "alice", method: "tools/call", target: "deploy", arguments: { version: "v2" } });

function reasonOf(fn: () => unknown): Reason {
  try {
    fn();
  } catch (exc) {
    assert.ok(exc instanceof InvalidState, String(exc));
    return exc.reason;
  }
  assert.fail("accepted");
}

async function rejection(promise: Promise<unknown>): Promise<InvalidState> {
  try {
    await promise;
  } catch (exc) {
    assert.ok(exc instanceof InvalidState, String(exc));
    return exc;
  }
  assert.fail("accepted");
}

describe("sealing and opening", () => {
  for (const mode of ["sign", "encrypt"] as const) {
    it(`${mode}: a round trip with a binding, refused under any other binding`, async () => {
      let now = T;
      const codec = new StateCodec(ring, { mode, clock: () => now });
      const token = codec.seal('{"step":2}', alice);
      assert.ok(token.startsWith(mode === "sign" ? "sc1s." : "sc1e."));
      if (mode === "encrypt") assert.ok(!Buffer.from(token.slice(5), "base64url").includes(Buffer.from("step")));
      const opened = await codec.unseal(token, alice);
      assert.equal(new TextDecoder().decode(opened.payload), '{"step":2}');
      assert.deepEqual([opened.issuedAt, opened.expiresAt, opened.round, opened.flowId], [T, T + 600, 1, opened.tokenId]);
      assert.equal(reasonOf(() => codec.open(token, alice.replace({ principal: "mallory" }))), "binding_mismatch");
      assert.equal(reasonOf(() => codec.open(token, alice.replace({ arguments: { version: "v3" } }))), "binding_mismatch");
      assert.equal(reasonOf(() => codec.open(token, null)), "binding_mismatch");
      now = T + 600;
      assert.equal(reasonOf(() => codec.open(token, alice)), "expired");
      const other = new StateCodec(ring, { mode: mode === "sign" ? "encrypt" : "sign", clock: () => T });
      assert.equal(reasonOf(() => other.open(token, alice)), "wrong_mode");
    });
  }

  it("refuses to mint a token over maxTokenBytes, and without a primary key", () => {
    const codec = new StateCodec(ring, { maxTokenBytes: 200 });
    assert.throws(() => codec.seal(new Uint8Array(200)), /over maxTokenBytes=200/);
    const verifyOnly = new StateCodec(new KeyRing(ring.keys, null));
    assert.throws(() => verifyOnly.seal("x"), KeyUnavailable);
  });

  it("refuses settings out of range when it is built", () => {
    assert.throws(() => new StateCodec(ring, { ttl: 0 }), RangeError);
    assert.throws(() => new StateCodec(ring, { maxSkew: 1.5 }), RangeError);
    assert.throws(() => new StateCodec(ring, { maxRounds: 256 }), RangeError);
    assert.throws(() => new StateCodec(ring, { maxTokenBytes: 127 }), RangeError);
    assert.throws(() => new StateCodec(new KeyRing([])), RangeError);
  });

  it("a retired key verifies nothing from its retirement on", () => {
    const old = Key.generate("old");
    const rotated = new KeyRing([old, Key.generate("new")], "new").retire("old", T + 10);
    const token = new StateCodec(new KeyRing([old], "old"), { clock: () => T }).seal("x");
    assert.equal(new StateCodec(rotated, { clock: () => T + 9 }).open(token).kid, "old");
    assert.equal(reasonOf(() => new StateCodec(rotated, { clock: () => T + 10 }).open(token)), "unknown_key");
  });

  it("fails closed as internal_error when the clock or the keys fail", () => {
    const token = new StateCodec(ring, { clock: () => T }).seal("x");
    assert.equal(reasonOf(() => new StateCodec(ring, { clock: () => NaN }).open(token)), "internal_error");
    assert.equal(reasonOf(() => new StateCodec(ring, { clock: () => { throw new Error("no time"); } }).open(token)), "internal_error");
    const broken = { keyring: (): KeyRing => { throw new Error("vault down"); }, signingKey: () => ring.primary };
    assert.equal(reasonOf(() => new StateCodec(broken, { clock: () => T }).open(token)), "internal_error");
    assert.equal(reasonOf(() => new StateCodec(ring).open(42 as unknown as string)), "malformed");
  });
});

describe("single use", () => {
  it("a token unseals once; a failed check never consumes it", async () => {
    const codec = new StateCodec(ring, { replay: new MemoryReplayStore(), clock: () => T });
    const token = codec.seal("x", alice);
    assert.equal((await rejection(codec.unseal(token, null))).reason, "binding_mismatch");
    await codec.unseal(token, alice);
    assert.equal((await rejection(codec.unseal(token, alice))).reason, "replayed");
  });

  it("a store that cannot answer refuses the token unconsumed, and it is redeemable afterwards", async () => {
    const memory = new MemoryReplayStore();
    let down = true;
    const retentions: number[] = [];
    const flaky: ReplayStore = {
      kind: "flaky",
      consume: async (key, retention) => {
        if (down) throw new Error("connection refused");
        retentions.push(retention);
        return memory.consume(key, retention);
      },
    };
    const codec = new StateCodec(ring, { replay: flaky, clock: () => T + 0.5, maxSkew: 60, expiryGrace: 5 });
    const token = codec.seal("x");
    const refused = await rejection(codec.unseal(token));
    assert.equal(refused.reason, "store_unavailable");
    assert.match(refused.detail, /flaky replay store did not answer/);
    down = false;
    await codec.unseal(token);
    assert.deepEqual(retentions, [T + 600 + 5 + 60 - (T + 0.5)]);
    assert.equal((await rejection(codec.unseal(token))).reason, "replayed");
  });

  it("a store answering anything but a boolean fails closed", async () => {
    const odd = { kind: "odd", consume: async () => "yes" as unknown as boolean };
    const codec = new StateCodec(ring, { replay: odd });
    assert.equal((await rejection(codec.unseal(codec.seal("x")))).reason, "store_unavailable");
  });

  it("the memory store forgets after the retention, refuses bad retentions, and refuses when full", async () => {
    let now = 0;
    const store = new MemoryReplayStore({ maxEntries: 2, clock: () => now });
    assert.equal(await store.consume("a", 10), true);
    assert.equal(await store.consume("a", 10), false);
    assert.equal(await store.consume("b", 10), true);
    await assert.rejects(store.consume("c", 10), /full/);
    await assert.rejects(store.consume("d", 0), /positive and finite/);
    await assert.rejects(store.consume("d", Infinity), /positive and finite/);
    now = 10;
    assert.equal(await store.consume("a", 10), true);
    assert.equal(await store.consume("c", 10), true);
    assert.equal(store.size, 2);
  });
});

describe("flows and pacing", () => {
  it("chains rounds, carries the flow, and enforces maxRounds on both sides", async () => {
    let now = T;
    const codec = new StateCodec(ring, { maxRounds: 3, clock: () => now });
    const first = await codec.unseal(codec.seal("1", alice), alice);
    now += 1;
    const second = await codec.unseal(codec.seal("2", alice, { parent: first }), alice);
    assert.deepEqual([second.flowId, second.round, second.flowStartedAt], [first.tokenId, 2, T]);
    const third = await codec.unseal(codec.seal("3", alice, { parent: second }), alice);
    assert.equal(third.round, 3);
    assert.throws(() => codec.seal("4", alice, { parent: third }),
      (exc: unknown) => exc instanceof FlowBudgetExceeded && exc.reason === "round_limit" && exc.round === 4);
    const looser = new StateCodec(ring, { maxRounds: 10, clock: () => now });
    const fourth = looser.seal("4", alice, { parent: third });
    assert.equal(reasonOf(() => codec.open(fourth, alice)), "round_limit");
  });

  it("cuts a round's expiry to its flow's end and refuses to seal after it", async () => {
    let now = T;
    const codec = new StateCodec(ring, { maxFlowAge: 100, clock: () => now });
    const first = codec.open(codec.seal("1"));
    assert.equal(first.expiresAt, T + 100);
    now = T + 90;
    assert.equal(codec.open(codec.seal("2", null, { parent: first })).expiresAt, T + 100);
    now = T + 100;
    assert.throws(() => codec.seal("3", null, { parent: first }), (exc: unknown) => (exc as FlowBudgetExceeded).reason === "flow_expired");
  });

  it("a paced token is too_early until its time, never consumed by an early retry", async () => {
    let now = T + 0.25;
    const codec = new StateCodec(ring, { replay: new MemoryReplayStore(), clock: () => now });
    const token = codec.seal("wait", alice, { retryAfter: 2 });
    now = T + 2.249;
    const early = await rejection(codec.unseal(token, alice));
    assert.equal(early.reason, "too_early");
    assert.equal(early.retryAt, T + 2.25);
    now = T + 1;
    assert.equal((await rejection(codec.unseal(token, null))).reason, "binding_mismatch");
    now = T + 2.25;
    assert.equal((await codec.unseal(token, alice)).notBefore, T + 2.25);
  });
});

describe("canonical JSON and key rings", () => {
  it("refuses what RFC 8785 cannot encode, and deep or huge arguments", () => {
    assert.throws(() => canonicalJson({ a: "\ud800" }), TypeError);
    assert.throws(() => canonicalJson({ ["\udc00"]: 1 }), TypeError);
    assert.throws(() => canonicalJson([NaN]), TypeError);
    assert.throws(() => canonicalJson({ when: new Date(0) }), TypeError);
    assert.throws(() => canonicalJson({ a: undefined }), TypeError);
    let deep: unknown = 1;
    for (let i = 0; i < 64; i++) deep = [deep];
    assert.equal(canonicalJson(deep).length, 64 * 2 + 1);
    assert.throws(() => canonicalJson([deep]), RangeError);
    assert.throws(() => canonicalJson(new Array(100_000).fill(0)), RangeError);
    assert.equal(canonicalJson({ b: [1e21, 1e-7, -0, 100.0], a: "é" }), '{"a":"é","b":[1e+21,1e-7,0,100]}');
    assert.equal(argumentDigest({ x: 1 }).length, 32);
  });

  it("binds lone surrogates as Python's surrogatepass does, never as U+FFFD", () => {
    const lone = new Binding({ principal: "a\ud800" });
    const replaced = new Binding({ principal: "a\ufffd" });
    assert.ok(!lone.equals(replaced));
    assert.ok(Buffer.from(lone.encoded).includes(Buffer.from([0x61, 0xed, 0xa0, 0x80])));
  });

  it("gives each key its own binding tag when one binding meets several keys in turn", () => {
    const k1 = Key.generate("k1");
    const k2 = Key.generate("k2");
    const fresh = (key: Key) => new Binding({ principal: "alice", arguments: { version: "v2" } }).tag(key);
    const shared = new Binding({ principal: "alice", arguments: { version: "v2" } });
    const tags = [k1, k2, k1, k2].map((key) => Buffer.from(shared.tag(key)).toString("hex"));
    assert.deepEqual(tags, [k1, k2, k1, k2].map((key) => Buffer.from(fresh(key)).toString("hex")));
    assert.notEqual(tags[0], tags[1]);
  });

  it("mints distinct token ids, many seals in a row", () => {
    const codec = new StateCodec(ring, { clock: () => T });
    const ids = new Set<string>();
    for (let i = 0; i < 1000; i++) ids.add(codec.open(codec.seal("x")).tokenId);
    assert.equal(ids.size, 1000);
  });

  it("round-trips a key ring through its JSON form and refuses a broken document as a whole", () => {
    const two = ring.withKey(Key.generate("k2")).retire("k2", T);
    const back = KeyRing.fromJSON(two.toJSON());
    assert.deepEqual(back.toObject(), two.toObject());
    const doc = two.toObject();
    assert.throws(() => KeyRing.fromObject({ ...doc, statecodec_keyring: 2 }), /not a statecodec key ring/);
    assert.throws(() => KeyRing.fromObject({ ...doc, primary: "nope" }), /not in the ring/);
    const badSecret = { ...doc, keys: [{ ...doc.keys[0], secret: doc.keys[0]!.secret + "=" }] };
    assert.throws(() => KeyRing.fromObject(badSecret), /canonical base64url/);
    const short = { ...doc, keys: [{ ...doc.keys[0], secret: "AAAA" }] };
    assert.throws(() => KeyRing.fromObject(short), /at least 32 bytes/);
    const badTime = { ...doc, keys: [{ ...doc.keys[0], retires_at: "2026-01-01" }] };
    assert.throws(() => KeyRing.fromObject(badTime), /integers/);
    assert.throws(() => KeyRing.fromJSON("{"), /not valid JSON/);
  });
});
