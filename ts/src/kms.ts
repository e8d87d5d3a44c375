/**
 * Keys from the sources the Python library reads (a key ring file, an environment
 * variable), refreshed in the background, with the same timeline: every instance of a
 * mixed fleet promotes and retires keys at the same instants, so what one mints every
 * other verifies. With
 *
 *     D = refreshInterval * (1 + jitter) + maxSkew + 1 s
 *     M = stalenessLimit + maxTtl + expiryGrace + 1 s
 *
 * a key created at c verifies as soon as a refresh sees it, mints from c + D (the newest
 * such key is primary), and the key it replaced verifies until c + D + M. The ring's
 * stored `primary` only breaks ties between keys created in the same second. When the
 * source fails, the last good ring keeps verifying and minting; once it is older than
 * `stalenessLimit`, minting stops (KeyUnavailable) and verification goes on.
 * (statecodec/kms/_timeline.py is the Python side; tests/ts holds the two to each other.)
 */

import { readFile } from "node:fs/promises";

import { b64decode } from "./base64url.js";
import { KeyUnavailable } from "./errors.js";
import { Key, KeyRing, MIN_SECRET_BYTES, type KeyProvider } from "./keys.js";

export interface TimelineSettings {
  refreshInterval?: number;
  jitter?: number;
  maxSkew?: number;
  maxTtl?: number;
  expiryGrace?: number;
  stalenessLimit?: number;
}

export interface Plan {
  /** The ring with the timeline's primary and the retirements it computed. */
  ring: KeyRing;
  /** When the primary changes next without a refresh (Unix seconds), or null. */
  nextPromotion: number | null;
}

export class Timeline {
  readonly refreshInterval: number;
  readonly jitter: number;
  readonly maxSkew: number;
  readonly maxTtl: number;
  readonly expiryGrace: number;
  readonly stalenessLimit: number;

  constructor(settings: TimelineSettings = {}) {
    this.refreshInterval = settings.refreshInterval ?? 60;
    this.jitter = settings.jitter ?? 0.1;
    this.maxSkew = settings.maxSkew ?? 60;
    this.maxTtl = settings.maxTtl ?? 600;
    this.expiryGrace = settings.expiryGrace ?? 0;
    this.stalenessLimit = settings.stalenessLimit ?? 900;
    if (!(this.refreshInterval > 0)) throw new RangeError("refreshInterval must be positive");
    if (!(this.jitter >= 0 && this.jitter < 1)) throw new RangeError("jitter is a fraction of refreshInterval in [0, 1)");
    if (!(this.maxSkew >= 0 && this.expiryGrace >= 0 && this.maxTtl > 0)) {
      throw new RangeError("maxSkew and expiryGrace must be >= 0 and maxTtl > 0");
    }
    if (this.stalenessLimit < this.maxRefreshGap) {
      // Otherwise an instance would stop minting between two healthy refreshes.
      throw new RangeError(`stalenessLimit=${this.stalenessLimit}s is shorter than refreshInterval * (1 + jitter) = ${this.maxRefreshGap}s`);
    }
  }

  get maxRefreshGap(): number {
    return this.refreshInterval * (1 + this.jitter);
  }

  /** D: by then every instance that refreshes on schedule verifies a new key. */
  get promotionDelay(): number {
    return Math.ceil(this.maxRefreshGap + this.maxSkew + 1);
  }

  /** M: how long a replaced key keeps verifying after its successor's promotion. */
  get retirementMargin(): number {
    return Math.ceil(this.stalenessLimit + this.maxTtl + this.expiryGrace + 1);
  }

  promotesAt(key: Key): number {
    return key.createdAt + this.promotionDelay;
  }

  /** Choose the primary by time and give each replaced key its retirement. */
  plan(ring: KeyRing, now: number): Plan {
    const position = new Map(ring.kids.map((kid, i) => [kid, i]));
    // Live keys, oldest first; within one second the stored primary sorts last (newest).
    const live = ring.keys.filter((k) => k.verifiesAt(now)).sort((a, b) =>
      a.createdAt - b.createdAt ||
      Number(a.kid === ring.primaryKid) - Number(b.kid === ring.primaryKid) ||
      (position.get(a.kid) as number) - (position.get(b.kid) as number));
    if (live.length === 0) return { ring: new KeyRing(ring.keys, null), nextPromotion: null };
    const primary = this.#primary(live, now);
    const retire = new Map<string, number>();
    const cut = live.indexOf(primary);
    for (let i = 0; i < cut; i++) {
      const key = live[i] as Key;
      const computed = this.promotesAt(live[i + 1] as Key) + this.retirementMargin;
      // An operator's earlier retirement (after a leak) always wins.
      retire.set(key.kid, key.retiresAt === null ? computed : Math.min(key.retiresAt, computed));
    }
    const keys = ring.keys.map((k) => (retire.has(k.kid) ? k.retiring(retire.get(k.kid) as number) : k));
    const pending = live.map((k) => this.promotesAt(k)).filter((at) => at > now);
    if (primary.retiresAt !== null) pending.push(primary.retiresAt); // a retiring primary hands over then
    return { ring: new KeyRing(keys, primary.kid), nextPromotion: pending.length ? Math.min(...pending) : null };
  }

  #primary(live: Key[], now: number): Key {
    const promoted = live.filter((k) => this.promotesAt(k) <= now);
    // A key marked for retirement mints only when it must.
    const steady = promoted.filter((k) => k.retiresAt === null);
    if (steady.length) return steady[steady.length - 1] as Key;
    if (promoted.length) {
      return promoted.reduce((best, k) => ((k.retiresAt ?? 0) > (best.retiresAt ?? 0) ? k : best));
    }
    return (live.find((k) => k.retiresAt === null) ?? live[0]) as Key;
  }
}

export type KeySource = () => Promise<KeyRing>;

/** `file:PATH`: a key ring JSON file, as `statecodec keys init/rotate` write it. */
export function fileSource(path: string): KeySource {
  return async () => KeyRing.fromJSON(await readFile(path, "utf8"));
}

/** The kid of a ring made from one bare secret (the Python library's, so both agree). */
export const ENV_SECRET_KID = "k0";

/** `env:NAME`: a key ring JSON, or one unpadded base64url secret of 32+ bytes (kid "k0", created at 0). */
export function envSource(name: string, env: NodeJS.ProcessEnv = process.env): KeySource {
  return async () => {
    const value = env[name]?.trim();
    if (!value) throw new RangeError(`environment variable ${name} is not set`);
    if (value.startsWith("{")) return KeyRing.fromJSON(value);
    let secret: Uint8Array = new Uint8Array(0);
    try {
      secret = b64decode(value);
    } catch {
      // Never echo the value: it is (meant to be) a secret.
    }
    if (secret.length < MIN_SECRET_BYTES) {
      throw new RangeError(`${name} is neither a keyring JSON nor an unpadded base64url secret of at least ${MIN_SECRET_BYTES} bytes`);
    }
    return new KeyRing([new Key(ENV_SECRET_KID, secret, 0)], ENV_SECRET_KID);
  };
}

export interface KeyManagerOptions extends TimelineSettings {
  /** Unix seconds (default Date.now() / 1000). */
  clock?: () => number;
  /** Told of every failed refresh (the last good ring stays in use). */
  onError?: (error: unknown) => void;
}

/**
 * A KeyProvider over a key source, refreshed every `refreshInterval` seconds (± jitter) in
 * the background, with the fleet's timeline. `await KeyManager.start(source)` loads once
 * (and throws if it cannot); `stop()` ends the refreshes.
 */
export class KeyManager implements KeyProvider {
  readonly timeline: Timeline;
  readonly #source: KeySource;
  readonly #clock: () => number;
  readonly #onError: ((error: unknown) => void) | null;
  #loaded: KeyRing | null = null;
  #loadedAt = 0;
  #plan: Plan | null = null;
  #timer: NodeJS.Timeout | null = null;

  constructor(source: KeySource, options: KeyManagerOptions = {}) {
    this.timeline = new Timeline(options);
    this.#source = source;
    this.#clock = options.clock ?? (() => Date.now() / 1000);
    this.#onError = options.onError ?? null;
  }

  static async start(source: KeySource, options: KeyManagerOptions = {}): Promise<KeyManager> {
    const manager = new KeyManager(source, options);
    await manager.refresh();
    manager.#schedule();
    return manager;
  }

  /** Load the source now; on failure the last good ring stays and the error is thrown. */
  async refresh(): Promise<void> {
    const ring = await this.#source();
    if (ring.size === 0) throw new RangeError("the key source holds no keys");
    this.#loaded = ring;
    this.#loadedAt = this.#clock();
    this.#plan = null;
  }

  stop(): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
  }

  /** The ring to verify with: stale or not, verification never stops. */
  keyring(): KeyRing {
    return this.#current(this.#clock()).ring;
  }

  /** The promoted primary, unless the last good ring is older than stalenessLimit. */
  signingKey(): Key {
    const now = this.#clock();
    const plan = this.#current(now);
    const age = now - this.#loadedAt;
    if (age > this.timeline.stalenessLimit) {
      throw new KeyUnavailable(`the keys were last loaded ${Math.round(age)}s ago, beyond stalenessLimit=${this.timeline.stalenessLimit}s: minting stops until the source answers`);
    }
    return plan.ring.primary;
  }

  #current(now: number): Plan {
    if (this.#loaded === null) throw new KeyUnavailable("the key manager is not started; await KeyManager.start(source)");
    let plan = this.#plan;
    if (plan === null || (plan.nextPromotion !== null && now >= plan.nextPromotion)) {
      plan = this.#plan = this.timeline.plan(this.#loaded, now);
    }
    return plan;
  }

  #schedule(): void {
    const delay = this.timeline.refreshInterval * (1 + (Math.random() * 2 - 1) * this.timeline.jitter);
    this.#timer = setTimeout(() => {
      this.refresh().catch((error: unknown) => this.#onError?.(error)).finally(() => {
        if (this.#timer !== null) this.#schedule();
      });
    }, delay * 1000);
    this.#timer.unref(); // refreshing keys never keeps a process alive on its own
  }
}
