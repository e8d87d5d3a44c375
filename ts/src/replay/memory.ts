/**
 * An in-process replay store, bounded and expiring: for one process and for tests. Two
 * processes with a memory store each would each accept the same token once; use the
 * Redis/Valkey or PostgreSQL store as soon as there is more than one.
 */

import { ReplayStoreError } from "../errors.js";
import { checkRetention, type ReplayStore } from "./base.js";

export interface MemoryStoreOptions {
  /** When full of live entries the store refuses to answer rather than forget one (default 100,000). */
  maxEntries?: number;
  /** Monotonic seconds (default performance.now): setting the wall clock never shortens a retention. */
  clock?: () => number;
}

export class MemoryReplayStore implements ReplayStore {
  readonly kind = "memory";
  readonly maxEntries: number;
  readonly #clock: () => number;
  readonly #entries = new Map<string, number>(); // key -> when it is forgotten, on #clock
  #lastPurge = -Infinity;

  constructor(options: MemoryStoreOptions = {}) {
    const maxEntries = options.maxEntries ?? 100_000;
    if (!(Number.isInteger(maxEntries) && maxEntries >= 1)) {
      throw new RangeError(`maxEntries must be a positive integer, got ${maxEntries}`);
    }
    this.maxEntries = maxEntries;
    this.#clock = options.clock ?? (() => performance.now() / 1000);
  }

  get size(): number {
    return this.#entries.size;
  }

  async consume(key: string, retentionSeconds: number): Promise<boolean> {
    return this.consumeNow(key, retentionSeconds);
  }

  /** The same decision, synchronously (no I/O here). */
  consumeNow(key: string, retentionSeconds: number): boolean {
    checkRetention(retentionSeconds);
    const now = this.#clock();
    // A scan at most once a second keeps memory to the live entries at O(1) per consume.
    if (now - this.#lastPurge >= 1) this.purge(now);
    const forgottenAt = this.#entries.get(key);
    // Present but past its retention counts as absent, whatever the purge schedule.
    if (forgottenAt !== undefined && forgottenAt > now) return false;
    if (forgottenAt === undefined && this.#entries.size >= this.maxEntries) {
      this.purge(now);
      if (this.#entries.size >= this.maxEntries) {
        throw new ReplayStoreError(
          `memory replay store is full (${this.maxEntries} live entries); raise maxEntries, shorten the token ttl, or use a shared store`,
        );
      }
    }
    this.#entries.set(key, now + retentionSeconds);
    return true;
  }

  /** Drop expired entries now; returns how many were dropped. */
  purge(now = this.#clock()): number {
    this.#lastPurge = now;
    let dropped = 0;
    for (const [key, forgottenAt] of this.#entries) {
      if (forgottenAt <= now) {
        this.#entries.delete(key);
        dropped += 1;
      }
    }
    return dropped;
  }
}
