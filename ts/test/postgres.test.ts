/**
 * The PostgreSQL store against a real server: tests/ts/test_ts_package.py starts one
 * (tests/fixtures_postgres.py) and passes its URL in STATECODEC_TEST_POSTGRES_URL.
 */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import pg from "pg";

import { ReplayStoreError } from "../src/index.js";
import { PostgresReplayStore } from "../src/replay/postgres.js";

const URL = process.env["STATECODEC_TEST_POSTGRES_URL"];
const skip = URL === undefined ? "STATECODEC_TEST_POSTGRES_URL is not set (tests/ts/test_ts_package.py sets it)" : false;

describe("the PostgreSQL replay store", { skip }, () => {
  const table = `ts_replay_${process.pid}_${Date.now() % 100000}`;

  it("creates its table, consumes a key once, and keeps it on the database's clock", async () => {
    const store = new PostgresReplayStore(URL as string, { table });
    const admin = new pg.Client({ connectionString: URL as string });
    await admin.connect();
    try {
      const start = performance.now();
      assert.equal(await store.consume("ns:a", 30), true);
      assert.equal(await store.consume("ns:a", 30), false);
      const row = await admin.query(`SELECT extract(epoch FROM expires_at - now()) AS left FROM ${table} WHERE key = 'ns:a'`);
      const left = Number(row.rows[0].left);
      const elapsed = (performance.now() - start) / 1000;
      assert.ok(left >= 30 - elapsed - 0.001 && left <= 30, `${left} after ${elapsed} s`);
      await assert.rejects(store.consume("ns:b", -1), ReplayStoreError);
    } finally {
      await admin.end();
      await store.close();
    }
  });

  it("an expired row that was not purged yet counts as absent", async () => {
    const store = new PostgresReplayStore(URL as string, { table });
    try {
      assert.equal(await store.consume("short", 0.05), true);
      await new Promise((resolve) => setTimeout(resolve, 200));
      assert.equal(await store.consume("short", 30), true);
      assert.equal(await store.consume("short", 30), false);
    } finally {
      await store.close();
    }
  });

  it("lets exactly one of many concurrent consumers through", async () => {
    const stores = Array.from({ length: 3 }, () => new PostgresReplayStore(URL as string, { table }));
    try {
      const answers = await Promise.all(
        Array.from({ length: 30 }, (_, i) => (stores[i % stores.length] as PostgresReplayStore).consume("race", 60)),
      );
      assert.equal(answers.filter((a) => a).length, 1);
    } finally {
      await Promise.all(stores.map((s) => s.close()));
    }
  });

  it("fails closed when the server cannot be reached", async () => {
    const store = new PostgresReplayStore("postgresql://u:p@127.0.0.1:1/db", { table, timeout: 0.5 });
    await assert.rejects(store.consume("x", 10), /postgres replay store did not answer/);
    await store.close();
  });
});
