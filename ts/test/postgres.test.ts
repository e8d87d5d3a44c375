/**
 * The PostgreSQL store against a real server: tests/ts/test_ts_package.py starts one
 * (tests/fixtures_postgres.py) and passes its URL in STATECODEC_TEST_POSTGRES_URL.
 */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import pg from "pg";

import { InvalidState, KeyRing, ReplayStoreError, StateCodec } from "../src/index.js";
import { PostgresReplayStore } from "../src/replay/postgres.js";
import { until } from "./helpers.js";

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
      // The others: a replay, or (another store's row, younger than the settle window) not settled yet.
      const answers = await Promise.all(
        Array.from({ length: 30 }, (_, i) =>
          (stores[i % stores.length] as PostgresReplayStore).consume("race", 60).catch((e: Error) => {
            assert.match(e.message, /not settled yet/);
            return false;
          }),
        ),
      );
      assert.equal(answers.filter((a) => a).length, 1);
    } finally {
      await Promise.all(stores.map((s) => s.close()));
    }
  });

  it("another store's fresh row is not settled yet (an outage), an older one is a replay, its own at once", async () => {
    const first = new PostgresReplayStore(URL as string, { table });
    // A settle window of 2 x 30 + 1 s: the row is surely younger than that when this looks.
    const other = new PostgresReplayStore(URL as string, { table, timeout: 30 });
    // A window of 2 x 0.05 + 1 s: waited out below. On a pool of the test's own: a store that
    // makes its pool gives it the same 50 ms as connect and statement timeouts, which a loaded
    // machine can miss (one run did), and this test is about the window, not those timeouts.
    const quickPool = new pg.Pool({ connectionString: URL as string });
    const quick = new PostgresReplayStore(quickPool, { table, timeout: 0.05 });
    const admin = new pg.Client({ connectionString: URL as string });
    await admin.connect();
    try {
      assert.equal(first.settleWindow, 5);
      assert.equal(await first.consume("settle", 60), true);
      assert.equal(await first.consume("settle", 60), false); // accepted here: settled at once
      await assert.rejects(other.consume("settle", 60), (e: Error) => e instanceof ReplayStoreError && /not settled yet/.test(e.message));
      const age = async () =>
        Number((await admin.query(`SELECT extract(epoch FROM clock_timestamp() - written_at) AS age FROM ${table} WHERE key = 'settle'`)).rows[0].age);
      await until(async () => (await age()) > quick.settleWindow);
      assert.equal(await quick.consume("settle", 60), false);
      await admin.query(`UPDATE ${table} SET written_at = written_at - interval '1 hour' WHERE key = 'settle'`);
      assert.equal(await other.consume("settle", 60), false);
    } finally {
      await admin.end();
      await Promise.all([first.close(), other.close(), quick.close()]);
      await quickPool.end();
    }
  });

  it("through codecs: store_unavailable while another instance's row is undecided, replayed once settled", async () => {
    const ring = KeyRing.generate("k1");
    const mine = new PostgresReplayStore(URL as string, { table });
    const theirs = new PostgresReplayStore(URL as string, { table, timeout: 30 });
    const admin = new pg.Client({ connectionString: URL as string });
    await admin.connect();
    try {
      const codec = new StateCodec(ring, { replay: mine });
      const other = new StateCodec(ring, { replay: theirs });
      const token = codec.seal("x");
      await codec.unseal(token);
      await assert.rejects(codec.unseal(token), (e: InvalidState) => e.reason === "replayed");
      await assert.rejects(other.unseal(token), (e: InvalidState) => e.reason === "store_unavailable");
      await admin.query(`UPDATE ${table} SET written_at = written_at - interval '1 hour'`);
      await assert.rejects(other.unseal(token), (e: InvalidState) => e.reason === "replayed");
    } finally {
      await admin.end();
      await Promise.all([mine.close(), theirs.close()]);
    }
  });

  it("takes a failed call's row back in the background, without another consume", async () => {
    // The store's own client gives up after 1 s while its insert waits behind another
    // transaction's row of the same key; that insert then commits once the way is free.
    const pool = new pg.Pool({ connectionString: URL as string, query_timeout: 1000 });
    pool.on("error", () => {});
    const store = new PostgresReplayStore(pool, { table, timeout: 30 });
    const admin = new pg.Client({ connectionString: URL as string });
    await admin.connect();
    try {
      assert.equal(await store.consume("warm-up", 60), true); // the table is known: one statement below
      await admin.query("BEGIN");
      await admin.query(`INSERT INTO ${table} (key, nonce, expires_at) VALUES ('late', 'admin', now() + interval '1 minute')`);
      await assert.rejects(store.consume("late", 60), /did not answer/);
      assert.equal(store.unsettled, 1);
      await admin.query("ROLLBACK");
      await until(async () => store.unsettled === 0);
      const left = await admin.query(`SELECT count(*)::int AS n FROM ${table} WHERE key = 'late'`);
      assert.equal(left.rows[0].n, 0);
    } finally {
      await admin.query("ROLLBACK").catch(() => {});
      await admin.end();
      await store.close();
      await pool.end();
    }
  });

  it("refuses a table made before written_at, naming statecodec replay init", async () => {
    const old = `${table}_old`;
    const admin = new pg.Client({ connectionString: URL as string });
    await admin.connect();
    await admin.query(`CREATE TABLE ${old} (key text PRIMARY KEY, nonce text NOT NULL, expires_at timestamptz NOT NULL)`);
    const store = new PostgresReplayStore(URL as string, { table: old });
    try {
      await assert.rejects(store.consume("k", 60), /no written_at column.*statecodec replay init/);
    } finally {
      await store.close();
      await admin.query(`DROP TABLE ${old}`);
      await admin.end();
    }
  });

  it("fails closed when the server cannot be reached", async () => {
    const store = new PostgresReplayStore("postgresql://u:p@127.0.0.1:1/db", { table, timeout: 0.5 });
    await assert.rejects(store.consume("x", 10), /postgres replay store did not answer/);
    await store.close();
  });
});
