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
 * lists its (key, nonce); the rows are deleted at once in the background (a round that
 * cannot reach the server is retried, up to every second, and one that finds no row is
 * repeated until the insert's own statement_timeout has surely ended it), before the next
 * consume of that key, and a few with every consume, so a retry redeems the token instead
 * of finding it "replayed".
 *
 * No false replays, as in Python: a row can exist while nobody has accepted its token (its
 * writer's commit waits for a synchronous standby, or its writer failed closed and has not
 * taken it back yet). Rows hold `written_at` (`clock_timestamp()` at the insert), and a
 * consume whose insert finds another's row reads its age, on the server's clock, in the
 * statement it runs on that path anyway. Younger than the settle window (`2 x timeout + 1`
 * s: the writer answers within `timeout` of its insert, its take-back has a `timeout` of
 * its own) the consume fails closed ("not settled yet", `store_unavailable`, retry); older,
 * it is a replay. Keys this store object accepted are settled at once (RecentlyAccepted). A
 * row whose delete has begun (`xmax` set) is going, not a replay: the insert is tried again.
 */

import { randomBytes } from "node:crypto";

import pg from "pg";

import { ReplayStoreError } from "../errors.js";
import { checkRetention, type ReplayStore } from "./base.js";
import { RecentlyAccepted } from "./settle.js";

export const DEFAULT_TABLE = "statecodec_replay";
const TABLE_NAME = /^[a-z_][a-z0-9_]{0,62}$/;
const TAKE_OVERS = 3;
const PURGE_BATCH = 1000;
const UNSETTLED_MAX = 10_000;
const TAKE_BACKS_PER_CONSUME = 64;
/** Seconds added to a writer's longest undecided time: a cancelled commit's end, a loaded machine. */
const SETTLE_MARGIN = 1;
/** Milliseconds before a failed background take-back round is tried again, doubling up to the second. */
const RETAKE_FIRST_MS = 50;
const RETAKE_MAX_MS = 1000;
/** Keys of failed calls the background take-back holds at most; the others wait for consumes. */
const SOON_KEYS = 1024;

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

/**
 * The statements that create the table and its expiry index, or add `written_at` to an
 * older table (idempotent), as Python's: Python reads `written_at` to tell a settled row
 * from an undecided one, and refuses a table without it.
 */
export function schemaStatements(table = DEFAULT_TABLE): string[] {
  checkTable(table);
  return [
    `CREATE TABLE IF NOT EXISTS ${table} (key text COLLATE "C" PRIMARY KEY, nonce text NOT NULL, expires_at timestamptz NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp())`,
    `CREATE INDEX IF NOT EXISTS ${table}_expires_at ON ${table} (expires_at)`,
    `ALTER TABLE ${table} ADD COLUMN IF NOT EXISTS written_at timestamptz NOT NULL DEFAULT 'epoch'`,
    `ALTER TABLE ${table} ALTER COLUMN written_at SET DEFAULT clock_timestamp()`,
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
  /** Seconds after its insert (server clock) another instance's row may still be undecided. */
  readonly settleWindow: number;
  readonly #sql: { insert: string; inTheWay: string; takeBack: string; purge: string };
  readonly #nonceBase = randomBytes(16).toString("hex");
  #counter = 0;
  #nextPurge = 0;
  readonly #createSchema: boolean;
  #schemaReady = false;
  // Rows failed calls may have written: key -> nonces.
  readonly #unsettled = new Map<string, Map<string, number>>(); // key -> nonce -> when to forget
  readonly #accepted: RecentlyAccepted;
  // Failed calls' keys for the background take-back: key -> until when a missing row may still appear.
  readonly #failed = new Map<string, number>();
  #taker: Promise<void> | null = null;
  #closed = false;

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
    this.settleWindow = 2 * timeout + SETTLE_MARGIN;
    this.#accepted = new RecentlyAccepted(this.settleWindow);
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
      // The row in the way: deleted if it has expired or a failed call of this store wrote
      // it, else its age on the server's clock (NULL when it went meanwhile, or is going: a
      // delete of it has begun, and only failed calls' and expired rows are ever deleted).
      inTheWay:
        `WITH gone AS (DELETE FROM ${table} WHERE key = $1 AND (expires_at <= now() OR nonce = ANY($2::text[])) RETURNING nonce) ` +
        `SELECT ARRAY(SELECT nonce FROM gone) AS gone, (SELECT extract(epoch FROM clock_timestamp() - written_at)::float8 FROM ${table} ` +
        `WHERE key = $1 AND expires_at > now() AND NOT nonce = ANY($2::text[]) AND xmax = '0'::xid) AS age`,
      takeBack: `DELETE FROM ${table} WHERE (key, nonce) IN (SELECT * FROM unnest($1::text[], $2::text[])) RETURNING key, nonce`,
      purge: `DELETE FROM ${table} WHERE key IN (SELECT key FROM ${table} WHERE expires_at <= now() ORDER BY expires_at LIMIT ${PURGE_BATCH})`,
    };
  }

  toString(): string {
    return `PostgresReplayStore(table=${this.table})`;
  }

  async consume(key: string, retentionSeconds: number): Promise<boolean> {
    checkRetention(retentionSeconds);
    const age = await this.#consume(key, retentionSeconds);
    this.#maybePurge();
    if (age === null) {
      this.#accepted.add(key, retentionSeconds);
      return true;
    }
    this.#judge(key, age);
    return false;
  }

  /** null once this call's row is in; else the age (seconds) of another's live row in the way. */
  async #consume(key: string, retentionSeconds: number): Promise<number | null> {
    let sent: string | null = null;
    let client: pg.PoolClient | null = null;
    try {
      client = await this.#pool.connect();
      if (!this.#schemaReady) await this.#ensureSchema(client);
      await this.#takeBack(client, [key]);
      const nonce = this.#nonceBase + (this.#counter++).toString(36);
      for (let i = 0; i < TAKE_OVERS; i++) {
        sent = nonce;
        const inserted = await client.query(this.#sql.insert, [key, nonce, retentionSeconds]);
        sent = null;
        if (inserted.rowCount === 1) return null;
        // Taken: live, expired and not purged yet (absent), or a failed call's (not a use).
        const age = await this.#inTheWay(client, key);
        if (age !== null) return age;
      }
      throw new ReplayStoreError(`the row of this token was rewritten ${TAKE_OVERS} times meanwhile`);
    } catch (exc) {
      // The insert may have committed though its answer was lost: list it to take it back.
      if (sent !== null) {
        this.#note(key, sent, retentionSeconds);
        this.#takeBackSoon(key);
      }
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

  /**
   * Return if the live row of `key`, `age` seconds old on the server's clock, is settled (a
   * replay: old enough, or accepted by this store); throw if its writer may be undecided:
   * nobody may have accepted the token, so the caller fails closed as in an outage. The row
   * stays: no second consume is accepted.
   */
  #judge(key: string, age: number): void {
    if (age >= this.settleWindow || this.#accepted.has(key)) return;
    throw new ReplayStoreError(
      `an earlier redemption of this token is not settled yet (written ${Math.max(age, 0).toFixed(2)} s ago, ` +
        "its commit or its take-back may still be pending): retry",
    );
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
    let found = await lookAtTable(client, this.table);
    if (!found.exists) {
      if (!this.#createSchema) {
        throw new ReplayStoreError(
          `the table ${this.table} does not exist: create it (statecodec replay init --replay URL), then grant this role SELECT, INSERT and DELETE on it`,
        );
      }
      try {
        await createTable(client, this.table);
      } catch (exc) {
        // Another instance created it at the same moment: that is the table we wanted.
        if (!(await lookAtTable(client, this.table)).exists) throw exc;
      }
      found = { exists: true, writtenAt: true };
    }
    if (!found.writtenAt) {
      throw new ReplayStoreError(
        `the table ${this.table} has no written_at column (an earlier statecodec made it); add it once as the table's owner: statecodec replay init --replay URL`,
      );
    }
    this.#schemaReady = true;
  }

  /** Drop expired rows now (one batch); how many went. */
  async purge(): Promise<number> {
    return (await this.#pool.query(this.#sql.purge)).rowCount ?? 0;
  }

  async close(): Promise<void> {
    this.#closed = true;
    await this.#taker;
    if (this.#ownsPool) await this.#pool.end();
  }

  get unsettled(): number {
    let n = 0;
    for (const nonces of this.#unsettled.values()) n += nonces.size;
    return n;
  }

  /** The age of `key`'s live row, or null once the way is clear (expired, a failed call's, gone, going). */
  async #inTheWay(client: pg.PoolClient, key: string): Promise<number | null> {
    const listed = [...(this.#unsettled.get(key)?.keys() ?? [])];
    const found = await client.query<{ gone: string[]; age: number | null }>(this.#sql.inTheWay, [key, listed]);
    const row = found.rows[0];
    for (const nonce of row?.gone ?? []) this.#forget(key, nonce);
    return row === undefined || row.gone.length > 0 || row.age === null ? null : Number(row.age);
  }

  /** Delete the rows failed calls of this store may have written: all of `keys`', a few others. */
  async #takeBack(client: pg.PoolClient, keys: string[]): Promise<void> {
    this.#dropExpired();
    if (this.#unsettled.size === 0) return;
    const pending: [string, string][] = [];
    for (const key of keys) for (const nonce of this.#unsettled.get(key)?.keys() ?? []) pending.push([key, nonce]);
    const own = pending.length > 0;
    const mine = new Set(keys);
    for (const [k, nonces] of this.#unsettled) {
      if (mine.has(k)) continue;
      for (const nonce of nonces.keys()) if (pending.length < keys.length + TAKE_BACKS_PER_CONSUME) pending.push([k, nonce]);
    }
    try {
      const deleted = await client.query<{ key: string; nonce: string }>(
        this.#sql.takeBack, [pending.map(([k]) => k), pending.map(([, n]) => n)],
      );
      // Only what was deleted is settled: an insert still running on a loaded server may
      // commit after this look, and its row is then taken over by the insert below.
      for (const row of deleted.rows) this.#forget(row.key, row.nonce);
    } catch (exc) {
      if (own) throw exc; // these very tokens may still hold a failed call's row
    }
  }

  /**
   * Take back a failed call's row now, without waiting for more traffic: other instances
   * answer it "not settled" only for the settle window, and `replayed` after. One loop does
   * it (a burst of failures adds keys, not loops).
   */
  #takeBackSoon(key: string): void {
    // Until then a row not found may still appear: the insert's statement_timeout ends it.
    if (this.#failed.size < SOON_KEYS) this.#failed.set(key, performance.now() + (this.timeout + SETTLE_MARGIN) * 1000);
    this.#taker ??= this.#takeBackFailed().finally(() => {
      this.#taker = null;
    });
  }

  /** Rounds of take-backs while failed calls' keys are listed; a round that fails is tried again. */
  async #takeBackFailed(): Promise<void> {
    let pause = RETAKE_FIRST_MS;
    while (this.#failed.size > 0 && !this.#closed) {
      const keys = [...this.#failed.keys()];
      try {
        const client = await this.#pool.connect();
        try {
          await this.#takeBack(client, keys);
        } catch (exc) {
          client.release(exc instanceof Error ? exc : true);
          throw exc;
        }
        client.release();
        const now = performance.now();
        for (const key of keys) {
          if (!this.#unsettled.has(key) || (this.#failed.get(key) ?? 0) <= now) this.#failed.delete(key);
        }
      } catch {
        // The server did not answer: every key again, until a round gets through.
      }
      if (this.#failed.size > 0 && !this.#closed) await sleep(pause);
      pause = Math.min(pause * 2, RETAKE_MAX_MS);
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

/** Whether the table exists, and has `written_at` (which tells a settled row from an undecided one). */
async function lookAtTable(client: pg.PoolClient, table: string): Promise<{ exists: boolean; writtenAt: boolean }> {
  const found = await client.query<{ exists: boolean; written_at: boolean }>(
    "SELECT to_regclass($1) IS NOT NULL AS exists, EXISTS (SELECT FROM pg_attribute " +
      "WHERE attrelid = to_regclass($1) AND attname = 'written_at' AND NOT attisdropped) AS written_at",
    [table],
  );
  const row = found.rows[0];
  return { exists: row?.exists === true, writtenAt: row?.written_at === true };
}

/** A pause that does not keep the process alive. */
function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

function describe(exc: unknown): string {
  return exc instanceof Error ? `${exc.name}: ${exc.message}` : String(exc);
}
