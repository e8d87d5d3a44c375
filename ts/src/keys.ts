/**
 * Keys, key rings and their subkeys, as the Python library has them.
 *
 * A key is 32+ secret bytes with a public id (kid) that selects exactly one key: there is
 * no trial of several keys (XChaCha20-Poly1305 is not key-committing). The secret is never
 * used directly: HKDF-SHA256 (no salt) derives one subkey per purpose, so a SIGN key never
 * acts as an ENCRYPT key and a binding tag is never a MAC.
 */

import { createHmac } from "node:crypto";

import { hkdf } from "@noble/hashes/hkdf.js";
import { sha256 } from "@noble/hashes/sha2.js";
import { bytesToHex, randomBytes } from "@noble/hashes/utils.js";

import { b64decode, b64encode } from "./base64url.js";
import { KeyUnavailable } from "./errors.js";
import { PREFIX_SIGN, validKid } from "./format.js";

export const MIN_SECRET_BYTES = 32;
export const KEYRING_FORMAT = 1;

const ASCII = new TextEncoder();
const SIGN_PREFIX = ASCII.encode(PREFIX_SIGN);

export function deriveSubkey(secret: Uint8Array, purpose: string): Uint8Array {
  return hkdf(sha256, secret, undefined, ASCII.encode(`statecodec/v1/${purpose}`), 32);
}

/** One secret with its id and lifetime; `retiresAt` (Unix seconds) is when it stops verifying. */
export class Key {
  readonly kid: string;
  readonly createdAt: number;
  readonly retiresAt: number | null;
  /** The AEAD key of ENCRYPT tokens (XChaCha20-Poly1305). */
  readonly aeadKey: Uint8Array;
  readonly #secret: Uint8Array;
  readonly #macKey: Uint8Array;
  readonly #bindKey: Uint8Array;

  constructor(kid: string, secret: Uint8Array, createdAt = 0, retiresAt: number | null = null) {
    if (typeof kid !== "string" || !validKid(kid)) {
      throw new RangeError(`invalid kid ${JSON.stringify(kid)}: use 1-32 characters of [A-Za-z0-9._:-]`);
    }
    if (!(secret instanceof Uint8Array) || secret.length < MIN_SECRET_BYTES) {
      throw new RangeError(`key '${kid}': the secret must be at least ${MIN_SECRET_BYTES} bytes`);
    }
    if (!Number.isInteger(createdAt) || !(retiresAt === null || Number.isInteger(retiresAt))) {
      throw new TypeError(`key '${kid}': createdAt and retiresAt must be integers (retiresAt may be null)`);
    }
    this.kid = kid;
    this.#secret = Uint8Array.from(secret);
    this.createdAt = createdAt;
    this.retiresAt = retiresAt;
    this.aeadKey = deriveSubkey(secret, "encrypt/xchacha20-poly1305");
    this.#macKey = deriveSubkey(secret, "sign/hmac-sha256");
    this.#bindKey = deriveSubkey(secret, "binding/hmac-sha256");
  }

  /** A fresh 32-byte key, stamped `createdAt` (default: now). */
  static generate(kid?: string, createdAt?: number): Key {
    return new Key(kid ?? newKid(), randomBytes(32), createdAt ?? Math.floor(Date.now() / 1000));
  }

  /** A copy of the secret (for serialising the ring; treat it as one). */
  get secret(): Uint8Array {
    return Uint8Array.from(this.#secret);
  }

  // HMAC runs in Node's own OpenSSL: per token it is the hot path of both modes' binding
  // and of SIGN, and native HMAC takes a fraction of a pure-JavaScript one's time
  // (docs/performance.md); HKDF runs once per key and stays in @noble/hashes.

  /** HMAC-SHA256(mac_key, "sc1s." || header || payload). */
  signMac(...parts: Uint8Array[]): Uint8Array {
    const h = createHmac("sha256", this.#macKey).update(SIGN_PREFIX);
    for (const part of parts) h.update(part);
    return h.digest();
  }

  /** HMAC-SHA256(bind_key, encoded binding), cut to 16 bytes. */
  bindingTag(encoded: Uint8Array): Uint8Array {
    return createHmac("sha256", this.#bindKey).update(encoded).digest().subarray(0, 16);
  }

  verifiesAt(now: number): boolean {
    return this.retiresAt === null || now < this.retiresAt;
  }

  /** The same key, retiring at `at` (Unix seconds). */
  retiring(at: number): Key {
    return new Key(this.kid, this.#secret, this.createdAt, at);
  }

  toString(): string {
    return `Key(${this.kid})`;
  }
}

export function newKid(): string {
  return "k" + bytesToHex(randomBytes(4));
}

/** What a codec needs: a ring to verify with and a key to mint with. */
export interface KeyProvider {
  keyring(): KeyRing;
  signingKey(): Key;
}

export interface KeyRingDocument {
  statecodec_keyring: 1;
  primary: string | null;
  keys: { kid: string; secret: string; created_at: number; retires_at: number | null }[];
}

/** An immutable set of keys: one primary that mints, all others verify until retired. */
export class KeyRing implements KeyProvider {
  readonly keys: readonly Key[];
  readonly primaryKid: string | null;
  readonly #byKid: Map<string, Key>;

  constructor(keys: Iterable<Key>, primary: string | null = null) {
    this.keys = Object.freeze([...keys]);
    this.#byKid = new Map(this.keys.map((k) => [k.kid, k]));
    if (this.#byKid.size !== this.keys.length) throw new RangeError("duplicate kid in key ring");
    if (primary !== null && !this.#byKid.has(primary)) {
      throw new RangeError(`primary kid '${primary}' is not in the ring`);
    }
    this.primaryKid = primary;
  }

  /** A ring of one fresh 32-byte key, which is primary. */
  static generate(kid?: string): KeyRing {
    const key = Key.generate(kid);
    return new KeyRing([key], key.kid);
  }

  static fromSecret(secret: Uint8Array, kid = "k0", createdAt = 0): KeyRing {
    return new KeyRing([new Key(kid, secret, createdAt)], kid);
  }

  /** The ring of a parsed key ring document (docs/format.md), refused as a whole if any rule breaks. */
  static fromObject(doc: unknown): KeyRing {
    if (!isObject(doc) || doc["statecodec_keyring"] !== KEYRING_FORMAT) {
      throw new RangeError('not a statecodec key ring (missing "statecodec_keyring": 1)');
    }
    const entries = doc["keys"] ?? [];
    if (!Array.isArray(entries)) throw new RangeError('"keys" must be a list of key objects');
    const primary = doc["primary"] ?? null;
    if (primary !== null && typeof primary !== "string") throw new RangeError('"primary" must be a kid or null');
    return new KeyRing(entries.map(keyFromObject), primary);
  }

  static fromJSON(text: string): KeyRing {
    let doc: unknown;
    try {
      doc = JSON.parse(text);
    } catch (exc) {
      throw new RangeError(`key ring is not valid JSON: ${(exc as Error).message}`);
    }
    return KeyRing.fromObject(doc);
  }

  toObject(): KeyRingDocument {
    return {
      statecodec_keyring: KEYRING_FORMAT,
      primary: this.primaryKid,
      keys: this.keys.map((k) => ({
        kid: k.kid,
        secret: b64encode(k.secret),
        created_at: k.createdAt,
        retires_at: k.retiresAt,
      })),
    };
  }

  /** The ring with its secrets, for a file or a secret store. Treat it as a secret. */
  toJSON(): string {
    return JSON.stringify(this.toObject(), null, 2);
  }

  withKey(key: Key, primary = false): KeyRing {
    return new KeyRing([...this.keys.filter((k) => k.kid !== key.kid), key], primary ? key.kid : this.primaryKid);
  }

  withPrimary(kid: string): KeyRing {
    return new KeyRing(this.keys, kid);
  }

  /** A copy in which `kid` stops verifying at Unix time `at`. */
  retire(kid: string, at: number): KeyRing {
    const key = this.require(kid);
    if (kid === this.primaryKid) throw new RangeError(`cannot retire the primary key '${kid}'; promote another key first`);
    return new KeyRing(this.keys.map((k) => (k === key ? k.retiring(at) : k)), this.primaryKid);
  }

  get kids(): string[] {
    return [...this.#byKid.keys()];
  }

  get size(): number {
    return this.keys.length;
  }

  get primary(): Key {
    if (this.primaryKid === null) throw new KeyUnavailable("the key ring has no primary key, so it can verify but not mint");
    return this.#byKid.get(this.primaryKid) as Key;
  }

  get(kid: string): Key | undefined {
    return this.#byKid.get(kid);
  }

  require(kid: string): Key {
    const key = this.#byKid.get(kid);
    if (key === undefined) throw new RangeError(`no key '${kid}' in the ring (it has ${this.kids.join(", ") || "none"})`);
    return key;
  }

  keyring(): KeyRing {
    return this;
  }

  signingKey(): Key {
    return this.primary;
  }

  toString(): string {
    return `KeyRing(kids=${JSON.stringify(this.kids)}, primary=${JSON.stringify(this.primaryKid)})`;
  }
}

function keyFromObject(entry: unknown): Key {
  if (!isObject(entry) || typeof entry["kid"] !== "string") throw new RangeError('each key must be an object with a string "kid"');
  const kid = entry["kid"];
  let secret: Uint8Array;
  try {
    if (typeof entry["secret"] !== "string") throw new TypeError("not a string");
    secret = b64decode(entry["secret"]);
  } catch {
    throw new RangeError(`key '${kid}': secret is not canonical base64url`);
  }
  const createdAt = entry["created_at"] ?? 0;
  const retiresAt = entry["retires_at"] ?? null;
  if (!Number.isInteger(createdAt) || !(retiresAt === null || Number.isInteger(retiresAt))) {
    throw new RangeError(`key '${kid}': created_at and retires_at must be integers (retires_at may be null)`);
  }
  return new Key(kid, secret, createdAt as number, retiresAt as number | null);
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
