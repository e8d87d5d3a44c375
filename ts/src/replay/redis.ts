/**
 * A replay store in Redis or Valkey (standalone server), sharing its entries with the
 * Python library's RedisReplayStore: the same key (`prefix` + namespace + ":" + token id
 * hex, prefix "statecodec:replay:" by default), the same command and the same retention,
 * so Python and TypeScript instances in front of one server consume each other's tokens.
 *
 * A consume is one atomic command, `SET <key> <nonce> NX GET PX <ms>`: NX lets exactly one
 * of any number of concurrent consumers create the key, PX makes the entry vanish on the
 * server's own clock once no instance can accept the token, GET answers what was there.
 * The value is a nonce unique to the call, so a call can tell its own write from anyone
 * else's.
 *
 * `wait: N` closes the window of asynchronous replication: a WAIT follows the SET on the
 * same connection, and the token is accepted only once N replicas hold the entry; with
 * fewer the consume fails closed and the entry is taken back (a compare-and-delete of this
 * call's nonce), so the token stays redeemable. A take-back no WAIT has confirmed, and a
 * call whose reply was lost after its SET may have run, stay listed: their entries are
 * deleted again, in the pipeline of the next consume, until a WAIT (or, without wait, the
 * server's reply) confirms it, so a token nobody accepted is never left "replayed".
 *
 * No false replays, as in Python: with `wait: N` an entry exists from its SET on while its
 * writer may still be undecided (its WAIT running, or fallen short with the take-back on its
 * way). So a `wait: N` consume writes its nonce and its retention (`<nonce>/<ms>`, Python's
 * format), and whoever finds such an entry of someone else asks its PTTL (one more round
 * trip, on this rare path only): retention minus time left is its age on the server's
 * clock. Younger than the settle window (`waitTimeout + commandTimeout`: Python's
 * `wait_timeout + socket_timeout x (retries + 1)`, this store retrying nothing), the consume
 * fails closed ("not settled yet", `store_unavailable`, retry); older, it is a replay. Keys
 * this store object accepted are settled at once (RecentlyAccepted). With `wait: 0` the value
 * is the bare nonce, and nothing changes.
 *
 * Needs Redis >= 7.0 or Valkey >= 7.2 (SET with both NX and GET).
 */

import { randomBytes } from "node:crypto";

import { createClient, ErrorReply, type RedisClientType } from "redis";

import { ReplayStoreError } from "../errors.js";
import { checkRetention, type ReplayStore } from "./base.js";
import { RecentlyAccepted } from "./settle.js";

export const DEFAULT_REDIS_PREFIX = "statecodec:replay:";
/** Deletes the key only if it still holds this call's nonce (the Python store's script). */
export const RELEASE_SCRIPT =
  "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
/** How many unsettled entries one consume sends along at most. */
const TAKE_BACKS_PER_CONSUME = 16;
const UNSETTLED_MAX = 10_000;
/** Between a wait=N entry's nonce and the retention (ms) it was written with, as in Python. */
const PENDING = "/";

export interface RedisStoreOptions {
  /** Prepended to every key (default "statecodec:replay:", as in Python). */
  prefix?: string;
  /** Replicas that must acknowledge a consume before the token is accepted (default 0). */
  wait?: number;
  /** Seconds WAIT may block (default 1). */
  waitTimeout?: number;
  /** Seconds a command may take before the store gives up and fails closed (default 2). */
  commandTimeout?: number;
  /** Seconds to establish a connection (default 2). */
  connectTimeout?: number;
}

type Client = RedisClientType;

export class RedisReplayStore implements ReplayStore {
  readonly kind = "redis";
  readonly prefix: string;
  readonly wait: number;
  readonly waitTimeout: number;
  /** With wait=N: milliseconds after its SET (server clock) another's entry may still be undecided. */
  readonly settleWindowMs: number;
  readonly #accepted: RecentlyAccepted;
  readonly #client: Client;
  readonly #ownsClient: boolean;
  readonly #commandMs: number;
  #connecting: Promise<unknown> | null = null;
  #everReady = false;
  readonly #nonceBase = randomBytes(16).toString("hex");
  #counter = 0;
  // Entries this store wrote that nobody accepted a token on: name -> nonce.
  readonly #unsettled = new Map<string, string>();

  /** `target`: a redis:// or rediss:// URL, or a node-redis client (its options are then yours). */
  constructor(target: string | Client, options: RedisStoreOptions = {}) {
    const prefix = options.prefix ?? DEFAULT_REDIS_PREFIX;
    const wait = options.wait ?? 0;
    const waitTimeout = options.waitTimeout ?? 1;
    const commandTimeout = options.commandTimeout ?? 2;
    if (typeof prefix !== "string") throw new TypeError("prefix must be a string");
    if (!(Number.isInteger(wait) && wait >= 0)) throw new RangeError(`wait must be a whole number >= 0, got ${wait}`);
    for (const [name, value] of [["waitTimeout", waitTimeout], ["commandTimeout", commandTimeout]] as const) {
      if (!(Number.isFinite(value) && value > 0)) throw new RangeError(`${name} must be a positive number of seconds`);
    }
    this.prefix = prefix;
    this.wait = wait;
    this.waitTimeout = waitTimeout;
    this.settleWindowMs = Math.ceil((waitTimeout + commandTimeout) * 1000);
    this.#accepted = new RecentlyAccepted(this.settleWindowMs / 1000);
    // WAIT blocks up to waitTimeout; the command must be allowed longer than that.
    this.#commandMs = Math.ceil((commandTimeout + (wait ? waitTimeout : 0)) * 1000);
    if (typeof target === "string") {
      this.#client = createClient({
        url: target,
        // A command sent while the connection is down fails at once instead of waiting
        // in a queue: the codec then refuses the token unconsumed.
        disableOfflineQueue: true,
        socket: {
          connectTimeout: Math.ceil((options.connectTimeout ?? 2) * 1000),
          // A first connection that fails ends the attempt (the consume fails closed, the
          // next one tries again); a connection that was up is re-established in the background.
          reconnectStrategy: (retries: number, cause: Error) =>
            this.#everReady ? Math.min(50 * 2 ** Math.min(retries, 5), 1000) : cause,
        },
      }) as Client;
      this.#ownsClient = true;
    } else {
      this.#client = target;
      this.#ownsClient = false;
    }
    // An unhandled "error" event would end the process; failures reach callers as rejections.
    this.#client.on("error", () => {});
  }

  toString(): string {
    return `RedisReplayStore(prefix=${JSON.stringify(this.prefix)}, wait=${this.wait})`;
  }

  async consume(key: string, retentionSeconds: number): Promise<boolean> {
    checkRetention(retentionSeconds);
    // Rounded up: never kept shorter than asked (and never 0 ms, which the server refuses).
    const px = Math.ceil(retentionSeconds * 1000);
    const name = this.prefix + key;
    // With wait=N the retention goes along: whoever finds the entry can tell its age.
    const nonce = this.#nonceBase + (this.#counter++).toString(36) + (this.wait ? `${PENDING}${px}` : "");
    try {
      await this.#connected();
    } catch (exc) {
      throw this.#error(exc);
    }
    const listed = this.#takeBacks(name);
    const opts = { timeout: this.#commandMs };
    // One connection carries everything, in order: the WAIT counts the replicas holding
    // this connection's writes up to it, the take-backs and the SET included.
    const releases = listed.map(([n, v]) => this.#client.sendCommand(["EVAL", RELEASE_SCRIPT, "1", n, v], opts));
    const set = this.#client.sendCommand(["SET", name, nonce, "NX", "GET", "PX", String(px)], opts);
    const waited = this.wait
      ? this.#client.sendCommand(["WAIT", String(this.wait), String(Math.ceil(this.waitTimeout * 1000))], opts)
      : null;
    const [releaseReplies, setReply, acks] = await Promise.all([
      Promise.allSettled(releases), settle(set), waited === null ? null : settle(waited),
    ]);
    const confirmed = this.wait === 0 || (acks !== null && acks.ok && typeof acks.value === "number" && acks.value >= this.wait);
    listed.forEach(([n, v], i) => {
      if (releaseReplies[i]?.status === "fulfilled" && confirmed && this.#unsettled.get(n) === v) this.#unsettled.delete(n);
    });
    if (!setReply.ok) {
      // The SET may have run before the reply was lost: take its entry back later.
      this.#note(name, nonce);
      throw this.#error(setReply.error);
    }
    const previous = setReply.value;
    if (previous !== null && previous !== nonce) {
      // Someone else's: a replay, unless its writer may still be undecided.
      const written = writtenPx(previous);
      if (written !== null && !this.#accepted.has(name)) await this.#judgeUndecided(name, written);
      return false;
    }
    if (this.wait === 0) return true;
    if (confirmed) {
      this.#accepted.add(name, px / 1000);
      return true;
    }
    // Fewer replicas than asked hold the entry: refuse, and take the entry back now. The
    // deletion is not confirmed by a WAIT of its own, so it stays listed for the next one.
    this.#note(name, nonce);
    let after = "its entry was deleted on the primary (and is deleted again before the next consume until replicas confirm it), so a retry can redeem it";
    try {
      await this.#client.sendCommand(["EVAL", RELEASE_SCRIPT, "1", name, nonce], opts);
    } catch (exc) {
      after = `taking its entry back failed (${describe(exc)}): the store tries again before the next consume`;
    }
    const count = acks !== null && acks.ok && typeof acks.value === "number" ? acks.value : 0;
    const why = acks !== null && !acks.ok ? ` (WAIT failed: ${describe(acks.error)})` : "";
    throw new ReplayStoreError(
      `only ${count} of ${this.wait} replica(s) acknowledged the consume within ${this.waitTimeout} s${why}; the token was not accepted and ${after}`,
    );
  }

  /**
   * Return if another's wait=N entry, written with `px` ms of retention, is settled (a replay);
   * throw if its writer may not have decided yet: nobody may have accepted the token, so the
   * caller fails closed as in an outage. The entry stays: no second consume is accepted.
   */
  async #judgeUndecided(name: string, px: number): Promise<void> {
    let left: unknown;
    try {
      left = await this.#client.sendCommand(["PTTL", name], { timeout: this.#commandMs });
    } catch (exc) {
      if (exc instanceof ErrorReply) return; // PTTL refused (an ACL without +pttl): judged settled
      throw this.#error(exc);
    }
    if (typeof left !== "number" || left === -1) return; // no TTL: judged settled
    if (left === -2) throw new ReplayStoreError("the entry was taken back meanwhile; retry");
    const age = px - left;
    if (age < this.settleWindowMs) {
      throw new ReplayStoreError(
        `an earlier redemption of this token is not settled yet (written ${Math.max(age, 0)} ms ago, ` +
          "its replicas' confirmation may still be pending): retry",
      );
    }
  }

  /** Connect now and PING; throws ReplayStoreError if the store cannot serve. */
  async check(): Promise<void> {
    try {
      await this.#connected();
      await this.#client.sendCommand(["PING"], { timeout: this.#commandMs });
    } catch (exc) {
      throw this.#error(exc);
    }
  }

  /** Close the connection the store opened (not a client passed in). */
  async close(): Promise<void> {
    if (this.#ownsClient && this.#client.isOpen) this.#client.destroy();
  }

  /** How many entries wait to be taken back (for tests and health checks). */
  get unsettled(): number {
    return this.#unsettled.size;
  }

  #connected(): Promise<unknown> {
    if (this.#client.isReady) return Promise.resolve();
    if (this.#connecting !== null) return this.#connecting;
    if (this.#client.isOpen) {
      // Open but reconnecting: fail now rather than queue (disableOfflineQueue).
      return Promise.reject(new Error("the connection is down and reconnecting"));
    }
    this.#connecting = this.#client.connect().then(() => {
      this.#everReady = true;
    }).finally(() => {
      this.#connecting = null;
    });
    return this.#connecting;
  }

  #takeBacks(name: string): [string, string][] {
    const listed: [string, string][] = [];
    const own = this.#unsettled.get(name);
    if (own !== undefined) listed.push([name, own]);
    for (const entry of this.#unsettled) {
      if (listed.length >= TAKE_BACKS_PER_CONSUME) break;
      if (entry[0] !== name) listed.push(entry);
    }
    return listed;
  }

  #note(name: string, nonce: string): void {
    // Bounded: past the bound the oldest listed entry is dropped and simply expires.
    if (this.#unsettled.size >= UNSETTLED_MAX) {
      const oldest = this.#unsettled.keys().next().value;
      if (oldest !== undefined) this.#unsettled.delete(oldest);
    }
    this.#unsettled.delete(name);
    this.#unsettled.set(name, nonce);
  }

  #error(exc: unknown): ReplayStoreError {
    if (exc instanceof ReplayStoreError) return exc;
    return new ReplayStoreError(`redis replay store did not answer: ${describe(exc)}`);
  }
}

/** The retention a wait=N consume wrote into its entry, or null (wait=0, another writer). */
function writtenPx(value: unknown): number | null {
  if (typeof value !== "string") return null;
  const at = value.lastIndexOf(PENDING);
  const px = value.slice(at + 1);
  return at >= 0 && /^[0-9]+$/.test(px) ? Number(px) : null;
}

type Settled = { ok: true; value: unknown } | { ok: false; error: unknown };

async function settle(promise: Promise<unknown>): Promise<Settled> {
  try {
    return { ok: true, value: await promise };
  } catch (error) {
    return { ok: false, error };
  }
}

function describe(exc: unknown): string {
  return exc instanceof Error ? `${exc.name}: ${exc.message}` : String(exc);
}
