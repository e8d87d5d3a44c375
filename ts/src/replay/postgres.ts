/**
 * A replay store in PostgreSQL, sharing its table with the Python library's
 * PostgresReplayStore (default table "statecodec_replay": key text PRIMARY KEY, nonce,
 * expires_at timestamptz): Python and TypeScript instances on one database consume each
 * other's tokens. A consume is one atomic statement,
 *
 *     INSERT INTO statecodec_replay (key, nonce, expires_at)
 *     VALUES ($1, $2, now() + make_interval(secs => $3)) ON CONFLICT (key) DO NOTHING
 *
 * whose row count says whether this call created the row. The expiry runs on the
 * database's clock (`now()`), never the application servers'. A row that has expired but
 * is not purged yet counts as absent: it is deleted (only if `expires_at <= now()`) and the
 * insert tried again, atomically again. Expired rows are purged in bounded batches by one
 * consume every `purgeInterval` seconds, in the background.
 *
 * Fail closed, bounded in time: `timeout` seconds for the pool, the connection and the
 * statement (the server's statement_timeout and a client-side deadline for a server that
 * no longer answers). A call whose insert may have committed although it failed closed
 * lists its (key, nonce); the rows are deleted before the next consume of that key (and
 * with the next consume at all), so a retry redeems the token instead of finding it
 * "replayed".
 */

import { randomBytes } from "node:crypto";

import pg from "pg";

import { ReplayStoreError } from "../errors.js";
import { checkRetention, type ReplayStore } from "./base.js";

export const DEFAULT_TABLE = "statecodec_replay";
const TABLE_NAME = /^[a-z_][a-z0-9_]{0,62}$/;
const TAKE_OVERS = 3;
const PURGE_BATCH = 1000;
const UNSETTLED_MAX = 10_000;
const TAKE_BACKS_PER_CONSUME = 64;

export interface PostgresStoreOptions {
  /** The table (default "statecodec_replay", as in Python). */
  table?: string;
  /** Seconds one consume may take, connection and statement included (default 2). */
  timeout?: number;
  /** Connections at most (default 4). */
  poolSize?: number;
  /** Seconds between two purges of expired rows by this process (default 10). */
  purgeInterval?: number;
  /** Create the table on first use if it is missing (default true, as in Python; needs the privilege). */
  createSchema?: boolean;
}

/** The statements that create the table and its expiry index (idempotent), as Python's. */
export function schemaStatements(table = DEFAULT_TABLE): string[] {
  checkTable(table);
  return [
    `CREATE TABLE IF NOT EXISTS ${table} (key text COLLATE "C" PRIMARY KEY, nonce text NOT NULL, expires_at timestamptz NOT NULL)`,
    `CREATE INDEX IF NOT EXISTS ${table}_expires_at ON ${table} (expires_at)`,
  ];
}

function checkTable(table: string): void {
  if (typeof table !== "string" || !TABLE_NAME.test(table)) {
    throw new RangeError(`table must be a lower-case SQL identifier of at most 63 of [a-z0-9_], got ${JSON.stringify(table)}`);
  }
}

export class PostgresReplayStore implements ReplayStore {
  readonly kind = "postgres";
  readonly table: string;
  readonly timeout: number;
  readonly purgeInterval: number;
  readonly #pool: pg.Pool;
  readonly #ownsPool: boolean;
  readonly #sql: { insert: string; takeOver: string; takeBack: string; purge: string };
  readonly #nonceBase = randomBytes(16).toString("hex");
  #counter = 0;
  #nextPurge = 0;
  readonly #createSchema: boolean;
  #schemaReady = false;
  // Rows failed calls may have written: key -> nonces.
  readonly #unsettled = new Map<string, Map<string, number>>(); // key -> nonce -> when to forget

  /** `target`: a postgresql:// URL, or a pg.Pool (its settings are then yours). */
  constructor(target: string | pg.Pool, options: PostgresStoreOptions = {}) {
    const table = options.table ?? DEFAULT_TABLE;
    checkTable(table);
    const timeout = options.timeout ?? 2;
    const purgeInterval = options.purgeInterval ?? 10;
    for (const [name, value] of [["timeout", timeout], ["purgeInterval", purgeInterval]] as const) {
      if (!(Number.isFinite(value) && value > 0)) throw new RangeError(`${name} must be a positive number of seconds`);
    }
    this.table = table;
    this.timeout = timeout;
    this.purgeInterval = purgeInterval;
    this.#createSchema = options.createSchema ?? true;
    const ms = Math.ceil(timeout * 1000);
    if (typeof target === "string") {
      this.#pool = new pg.Pool({
        connectionString: target,
        max: options.poolSize ?? 4,
        connectionTimeoutMillis: ms,
        statement_timeout: ms,
        query_timeout: ms + 500, // the client's own deadline, for a server that stopped answering
        idleTimeoutMillis: 10_000,
        allowExitOnIdle: true,
      });
      this.#ownsPool = true;
    } else {
      this.#pool = target;
      this.#ownsPool = false;
    }
    // An idle client's error would otherwise be an unhandled "error" event.
    this.#pool.on("error", () => {});
    this.#sql = {
      insert: `INSERT INTO ${table} (key, nonce, expires_at) VALUES ($1, $2, now() + make_interval(secs => $3::double precision)) ON CONFLICT (key) DO NOTHING`,
      takeOver: `DELETE FROM ${table} WHERE key = $1 AND (expires_at <= now() OR nonce = ANY($2::text[])) RETURNING nonce`,
      takeBack: `DELETE FROM ${table} WHERE (key, nonce) IN (SELECT * FROM unnest($1::text[], $2::text[])) RETURNING key, nonce`,
      purge: `DELETE FROM ${table} WHERE key IN (SELECT key FROM ${table} WHERE expires_at <= now() ORDER BY expires_at LIMIT ${PURGE_BATCH})`,
    };
  }

  toString(): string {
    return `PostgresReplayStore(table=${this.table})`;
  }

  async consume(key: string, retentionSeconds: number): Promise<boolean> {
    checkRetention(retentionSeconds);
    let sent: string | null = null;
    let client: pg.PoolClient | null = null;
    try {
      client = await this.#pool.connect();
      if (!this.#schemaReady) await this.#ensureSchema(client);
      await this.#takeBack(client, key);
      const nonce = this.#nonceBase + (this.#counter++).toString(36);
      for (let i = 0; i < TAKE_OVERS; i++) {
        sent = nonce;
        const inserted = await client.query(this.#sql.insert, [key, nonce, retentionSeconds]);
        sent = null;
        if (inserted.rowCount === 1) {
          this.#maybePurge();
          return true;
        }
        // Taken: live (a replay), expired and not purged yet, or a failed call's row.
        if (!(await this.#takeOver(client, key))) return false;
      }
      throw new ReplayStoreError(`the row of this token was rewritten ${TAKE_OVERS} times meanwhile`);
    } catch (exc) {
      // The insert may have committed though its answer was lost: list it to take it back.
      if (sent !== null) this.#note(key, sent, retentionSeconds);
      if (client !== null) {
        client.release(exc instanceof Error ? exc : true);
        client = null;
      }
      if (exc instanceof ReplayStoreError) throw exc;
      throw new ReplayStoreError(`postgres replay store did not answer: ${describe(exc)}`);
    } finally {
      client?.release();
    }
  }

  /** Create the table and its index if missing (as `statecodec replay init` does), in one transaction. */
  async createSchema(): Promise<void> {
    const client = await this.#pool.connect();
    try {
      await createTable(client, this.table);
    } finally {
      client.release();
    }
  }

  async #ensureSchema(client: pg.PoolClient): Promise<void> {
    if (!(await tableExists(client, this.table))) {
      if (!this.#createSchema) {
        throw new ReplayStoreError(
          `the table ${this.table} does not exist: create it (statecodec replay init --replay URL), then grant this role SELECT, INSERT and DELETE on it`,
        );
      }
      try {
        await createTable(client, this.table);
      } catch (exc) {
        // Another instance created it at the same moment: that is the table we wanted.
        if (!(await tableExists(client, this.table))) throw exc;
      }
    }
    this.#schemaReady = true;
  }

  /** Drop expired rows now (one batch); how many went. */
  async purge(): Promise<number> {
    return (await this.#pool.query(this.#sql.purge)).rowCount ?? 0;
  }

  async close(): Promise<void> {
    if (this.#ownsPool) await this.#pool.end();
  }

  get unsettled(): number {
    let n = 0;
    for (const nonces of this.#unsettled.values()) n += nonces.size;
    return n;
  }

  async #takeOver(client: pg.PoolClient, key: string): Promise<boolean> {
    const listed = [...(this.#unsettled.get(key)?.keys() ?? [])];
    const deleted = await client.query<{ nonce: string }>(this.#sql.takeOver, [key, listed]);
    for (const row of deleted.rows) this.#forget(key, row.nonce);
    return (deleted.rowCount ?? 0) > 0;
  }

  async #takeBack(client: pg.PoolClient, key: string): Promise<void> {
    this.#dropExpired();
    if (this.#unsettled.size === 0) return;
    const pending: [string, string][] = [];
    const own = this.#unsettled.get(key);
    for (const nonce of own?.keys() ?? []) pending.push([key, nonce]);
    for (const [k, nonces] of this.#unsettled) {
      if (k === key) continue;
      for (const nonce of nonces.keys()) if (pending.length < TAKE_BACKS_PER_CONSUME) pending.push([k, nonce]);
    }
    try {
      const deleted = await client.query<{ key: string; nonce: string }>(
        this.#sql.takeBack, [pending.map(([k]) => k), pending.map(([, n]) => n)],
      );
      // Only what was deleted is settled: an insert still running on a loaded server may
      // commit after this look, and its row is then taken over by the insert below.
      for (const row of deleted.rows) this.#forget(row.key, row.nonce);
    } catch (exc) {
      if (own !== undefined) throw exc; // this very token may still hold a failed call's row
    }
  }

  #note(key: string, nonce: string, retentionSeconds: number): void {
    if (this.unsettled >= UNSETTLED_MAX) {
      const oldest = this.#unsettled.keys().next().value;
      if (oldest !== undefined) this.#unsettled.delete(oldest);
    }
    const nonces = this.#unsettled.get(key) ?? new Map<string, number>();
    // Listed until the row, if it was ever written, has expired on its own.
    nonces.set(nonce, performance.now() / 1000 + retentionSeconds + this.timeout);
    this.#unsettled.set(key, nonces);
  }

  #forget(key: string, nonce: string): void {
    const nonces = this.#unsettled.get(key);
    if (nonces === undefined) return;
    nonces.delete(nonce);
    if (nonces.size === 0) this.#unsettled.delete(key);
  }

  #dropExpired(): void {
    const now = performance.now() / 1000;
    for (const [key, nonces] of this.#unsettled) {
      for (const [nonce, forgetAt] of nonces) if (forgetAt <= now) this.#forget(key, nonce);
    }
  }

  #maybePurge(): void {
    const now = performance.now() / 1000;
    if (now < this.#nextPurge) return;
    this.#nextPurge = now + this.purgeInterval;
    // In the background, after answering; a failed purge is retried at the next interval.
    this.purge().catch(() => {});
  }
}

/** The table and its index, in one transaction: rolled back, and the error thrown on, if a statement fails. */
async function createTable(client: pg.PoolClient, table: string): Promise<void> {
  try {
    await client.query("BEGIN");
    for (const statement of schemaStatements(table)) await client.query(statement);
    await client.query("COMMIT");
  } catch (exc) {
    await client.query("ROLLBACK").catch(() => {});
    throw exc;
  }
}

async function tableExists(client: pg.PoolClient, table: string): Promise<boolean> {
  const found = await client.query<{ found: boolean }>("SELECT to_regclass($1) IS NOT NULL AS found", [table]);
  return found.rows[0]?.found === true;
}

function describe(exc: unknown): string {
  return exc instanceof Error ? `${exc.name}: ${exc.message}` : String(exc);
}
