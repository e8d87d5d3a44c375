/**
 * The Redis/Valkey store against a real server: the Python suite's wrapper
 * (tests/ts/test_ts_package.py) starts one and passes its URL in STATECODEC_TEST_REDIS_URL.
 * Run alone without it, these tests are skipped (the wrapper fails on any skip).
 */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { createClient } from "redis";

import { KeyRing, ReplayStoreError, StateCodec, InvalidState } from "../src/index.js";
import { RedisReplayStore } from "../src/replay/redis.js";
import { until } from "./helpers.js";

const URL = process.env["STATECODEC_TEST_REDIS_URL"];
const skip = URL === undefined ? "STATECODEC_TEST_REDIS_URL is not set (tests/ts/test_ts_package.py sets it)" : false;
/** A primary with one replica in sync, for wait: 1. */
const REPLICATED = process.env["STATECODEC_TEST_REDIS_REPLICATED_URL"];
const noReplica = REPLICATED === undefined ? "STATECODEC_TEST_REDIS_REPLICATED_URL is not set (tests/ts/test_ts_package.py sets it)" : false;

describe("the Redis/Valkey replay store", { skip }, () => {
  const prefix = `ts-test:${process.pid}:${Date.now()}:`;

  it("consumes a key once, with the Python store's key, value and PX retention", async () => {
    const store = new RedisReplayStore(URL as string, { prefix });
    const admin = createClient({ url: URL as string });
    await admin.connect();
    try {
      const start = performance.now();
      assert.equal(await store.consume("ns:abc", 12.3451), true);
      assert.equal(await store.consume("ns:abc", 12.3451), false);
      const pttl = Number(await admin.sendCommand(["PTTL", `${prefix}ns:abc`]));
      const elapsed = performance.now() - start;
      // PX is the retention rounded up to the millisecond, counting down from the SET.
      assert.ok(pttl >= 12_346 - elapsed - 1 && pttl <= 12_346, `${pttl} after ${elapsed} ms`);
      await assert.rejects(store.consume("ns:zero", 0), ReplayStoreError);
    } finally {
      await store.close();
      admin.destroy();
    }
  });

  it("lets exactly one of many concurrent consumers of one token through", async () => {
    const stores = Array.from({ length: 4 }, () => new RedisReplayStore(URL as string, { prefix }));
    try {
      const answers = await Promise.all(
        Array.from({ length: 40 }, (_, i) => (stores[i % stores.length] as RedisReplayStore).consume("race", 60)),
      );
      assert.equal(answers.filter((a) => a).length, 1);
    } finally {
      await Promise.all(stores.map((s) => s.close()));
    }
  });

  it("single use through a codec; a server that does not answer fails closed, unconsumed", async () => {
    const ring = KeyRing.generate("k1");
    const store = new RedisReplayStore(URL as string, { prefix });
    const codec = new StateCodec(ring, { replay: store });
    const token = codec.seal("x");
    await codec.unseal(token);
    await assert.rejects(codec.unseal(token), (e: InvalidState) => e.reason === "replayed");
    await store.close();
    // Nothing listens on port 1 of loopback: connection refused, at once.
    const deadStore = new RedisReplayStore("redis://127.0.0.1:1/0", { prefix, connectTimeout: 0.5 });
    const dead = new StateCodec(ring, { replay: deadStore });
    const fresh = codec.seal("y");
    await assert.rejects(dead.unseal(fresh), (e: InvalidState) => e.reason === "store_unavailable");
    await assert.rejects(dead.unseal(fresh), (e: InvalidState) => e.reason === "store_unavailable");
    await deadStore.close();
    const live = new RedisReplayStore(URL as string, { prefix });
    await new StateCodec(ring, { replay: live }).unseal(fresh);
    await live.close();
  });
});

describe("the Redis/Valkey replay store with wait: N, against an undecided entry", () => {
  const prefix = `ts-settle:${process.pid}:${Date.now()}:`;
  const isUnsettled = (e: Error) => e instanceof ReplayStoreError && /not settled yet/.test(e.message);

  it("writes Python's <nonce>/<ms>; another store's fresh entry is an outage, an older one a replay, its own at once", { skip: noReplica }, async () => {
    const first = new RedisReplayStore(REPLICATED as string, { prefix, wait: 1, waitTimeout: 5 });
    // A settle window of 30 + 2 s: the entry is surely younger than that when this looks.
    const other = new RedisReplayStore(REPLICATED as string, { prefix, wait: 1, waitTimeout: 30 });
    // A window of 50 + 50 ms: waited out below.
    const quick = new RedisReplayStore(REPLICATED as string, { prefix, wait: 1, waitTimeout: 0.05, commandTimeout: 0.05 });
    const admin = createClient({ url: REPLICATED as string });
    await admin.connect();
    try {
      assert.equal(first.settleWindowMs, 7000);
      assert.equal(await first.consume("ns:k", 60), true);
      assert.match(String(await admin.sendCommand(["GET", `${prefix}ns:k`])), /^[0-9a-z]+\/60000$/);
      assert.equal(await first.consume("ns:k", 60), false); // accepted here: settled at once
      await assert.rejects(other.consume("ns:k", 60), isUnsettled);
      await until(async () => 60_000 - Number(await admin.sendCommand(["PTTL", `${prefix}ns:k`])) > quick.settleWindowMs);
      assert.equal(await quick.consume("ns:k", 60), false);
    } finally {
      admin.destroy();
      await Promise.all([first.close(), other.close(), quick.close()]);
    }
  });

  it("reads Python's entries: bare nonce settled, <nonce>/<ms> judged by PTTL, through a codec too", { skip }, async () => {
    const store = new RedisReplayStore(URL as string, { prefix });
    const admin = createClient({ url: URL as string });
    await admin.connect();
    try {
      // A settle window of 1 + 2 s for this store (and for wait: 0 readers alike).
      await admin.sendCommand(["SET", `${prefix}bare`, "py-nonce-1", "PX", "60000"]);
      await admin.sendCommand(["SET", `${prefix}fresh`, "py-nonce-2/60000", "PX", "60000"]);
      await admin.sendCommand(["SET", `${prefix}aged`, "py-nonce-3/60000", "PX", "50000"]); // written 10 s ago
      assert.equal(await store.consume("bare", 60), false);
      await assert.rejects(store.consume("fresh", 60), isUnsettled);
      assert.equal(await store.consume("aged", 60), false);
      const ring = KeyRing.generate("k1");
      const codec = new StateCodec(ring, { replay: store, namespace: "ns" });
      const token = codec.seal("x");
      await codec.unseal(token);
      const [name] = (await admin.sendCommand(["KEYS", `${prefix}ns:*`])) as string[];
      await admin.sendCommand(["SET", name as string, "py-nonce-4/60000", "PX", "60000", "XX"]);
      await assert.rejects(codec.unseal(token), (e: InvalidState) => e.reason === "store_unavailable");
    } finally {
      admin.destroy();
      await store.close();
    }
  });
});
