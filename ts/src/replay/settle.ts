/**
 * Keys a store object accepted lately: a replay of them is one whatever the entry looks like
 * (as the Python library's `replay/_settle.py`).
 *
 * A shared store answers an entry it cannot yet call settled (its writer's redemption may
 * still be undecided) like an outage. An entry this very store object accepted is settled by
 * definition (it said yes), so its replays are `replayed` at once, without asking the server
 * how old the entry is. Kept only as long as an entry can look undecided (the store's settle
 * window), and bounded.
 */

export class RecentlyAccepted {
  /** Beyond this many, the oldest are forgotten first: their replays then ask the server. */
  static readonly LIMIT = 100_000;
  readonly #windowMs: number;
  readonly #until = new Map<string, number>(); // key -> performance.now() deadline, oldest first

  constructor(windowSeconds: number) {
    this.#windowMs = windowSeconds * 1000;
  }

  add(key: string, retentionSeconds: number): void {
    const now = performance.now();
    this.#expire(now);
    if (this.#until.size >= RecentlyAccepted.LIMIT) {
      const oldest = this.#until.keys().next().value;
      if (oldest !== undefined) this.#until.delete(oldest);
    }
    this.#until.delete(key); // re-inserted last: the map stays in deadline order
    this.#until.set(key, now + Math.min(this.#windowMs, retentionSeconds * 1000));
  }

  has(key: string): boolean {
    const until = this.#until.get(key);
    return until !== undefined && until > performance.now();
  }

  get size(): number {
    return this.#until.size;
  }

  #expire(now: number): void {
    for (const [key, until] of this.#until) {
      if (until > now) return;
      this.#until.delete(key);
    }
  }
}
