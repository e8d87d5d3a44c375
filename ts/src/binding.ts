/**
 * Binding a token to who asked, where and for what: the token stores only a 16-byte keyed
 * tag over these facts (never the values, never an unkeyed hash that would let a token
 * holder guess a user id offline).
 *
 * The argument digest is SHA-256 over RFC 8785 (JCS) canonical JSON, so this package and
 * the Python library agree on the digest of the same JSON arguments.
 */

import * as nodeCrypto from "node:crypto";

import canonicalize from "canonicalize";

import { typeName } from "./format.js";
import type { Key } from "./keys.js";

export const MAX_ARGUMENT_DEPTH = 64;
export const MAX_ARGUMENT_NODES = 100_000;

const DOMAIN = new TextEncoder().encode("statecodec/v1/binding\0");
/**
 * Text as the binding encodes it: UTF-8, and a lone surrogate as its own three bytes (what
 * Python's "surrogatepass" writes), so two different strings never share an encoding (a
 * plain UTF-8 encoder would turn every lone surrogate into U+FFFD).
 */
export function encodeText(text: string): Uint8Array {
  // Buffer.from, not TextEncoder.encode: the same bytes for well-formed text, in a fraction
  // of the time for the short strings a binding holds.
  if (text.isWellFormed()) return Buffer.from(text, "utf8");
  const out: number[] = [];
  for (let i = 0; i < text.length; i++) {
    let cp = text.codePointAt(i) as number;
    if (cp > 0xffff) i++;
    if (cp < 0x80) out.push(cp);
    else if (cp < 0x800) out.push(0xc0 | (cp >> 6), 0x80 | (cp & 0x3f));
    else if (cp < 0x10000) out.push(0xe0 | (cp >> 12), 0x80 | ((cp >> 6) & 0x3f), 0x80 | (cp & 0x3f));
    else out.push(0xf0 | (cp >> 18), 0x80 | ((cp >> 12) & 0x3f), 0x80 | ((cp >> 6) & 0x3f), 0x80 | (cp & 0x3f));
  }
  return Uint8Array.from(out);
}

/**
 * The RFC 8785 canonical JSON of `value`, or a TypeError/RangeError naming the culprit.
 *
 * Accepted: plain objects (string keys), arrays, strings without lone surrogates, finite
 * numbers, booleans, null; at most 64 levels of nesting and 100,000 values. JavaScript
 * has one number type, so an integer beyond 2^53 (which Python refuses as an int) is taken
 * as the float it already is; a value parsed from JSON is digested as the Python library
 * digests the same JSON text for every value both accept.
 */
export function canonicalJson(value: unknown): string {
  let nodes = 0;
  const visit = (item: unknown, depth: number): void => {
    nodes += 1;
    if (nodes > MAX_ARGUMENT_NODES) throw new RangeError(`arguments have more than ${MAX_ARGUMENT_NODES} JSON values`);
    if (depth > MAX_ARGUMENT_DEPTH) throw new RangeError(`arguments are nested deeper than ${MAX_ARGUMENT_DEPTH} levels`);
    if (item === null || typeof item === "boolean") return;
    if (typeof item === "string") {
      if (!item.isWellFormed()) throw new TypeError("arguments cannot be canonical JSON: text with a lone surrogate");
    } else if (typeof item === "number") {
      if (!Number.isFinite(item)) throw new TypeError(`argument value ${item} is not a finite number`);
    } else if (Array.isArray(item)) {
      for (const member of item) visit(member, depth + 1);
    } else if (typeof item === "object" && isPlainObject(item)) {
      for (const [key, member] of Object.entries(item)) {
        if (!key.isWellFormed()) throw new TypeError("arguments cannot be canonical JSON: a key holds a lone surrogate");
        visit(member, depth + 1);
      }
    } else {
      throw new TypeError(`argument value of type ${typeName(item)} cannot be canonical JSON`);
    }
  };
  visit(value, 0);
  return canonicalize(value) as string;
}

function isPlainObject(value: object): boolean {
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

// crypto.hash (Node 20.12+) digests in one call, without a Hash object per digest.
const sha256Text: (text: string) => Uint8Array = typeof nodeCrypto.hash === "function"
  ? (text) => nodeCrypto.hash("sha256", text, "buffer")
  : (text) => nodeCrypto.createHash("sha256").update(text, "utf8").digest();

/** SHA-256 of the canonical JSON of `value` (32 bytes). */
export function argumentDigest(value: unknown): Uint8Array {
  return new Uint8Array(sha256Text(canonicalJson(value)));
}

export interface BindingFields {
  principal?: string | null;
  audience?: string | null;
  method?: string | null;
  target?: string | null;
  /** JSON arguments, digested now (null or absent: no digest; bind JSON null with argumentDigest(null)). */
  arguments?: unknown;
  argumentDigest?: Uint8Array | null;
  extra?: Record<string, string> | null;
}

/**
 * What a token is bound to. Every field is optional; absent and empty differ. Immutable;
 * build one per request and use it for the inbound unseal and the outbound seal.
 */
export class Binding {
  readonly principal: string | null;
  readonly audience: string | null;
  readonly method: string | null;
  readonly target: string | null;
  readonly argumentDigest: Uint8Array | null;
  readonly extra: Readonly<Record<string, string>>;
  /** The unambiguous, length-prefixed bytes the tag is computed over. */
  readonly encoded: Uint8Array;
  // One key's tag: a binding lives for one request, which seals and unseals with the
  // primary key or the token's key, so a single entry serves it (and costs no WeakMap).
  #tagKey: Key | null = null;
  #tag: Uint8Array | null = null;

  constructor(fields: BindingFields = {}) {
    this.principal = textField(fields, "principal");
    this.audience = textField(fields, "audience");
    this.method = textField(fields, "method");
    this.target = textField(fields, "target");
    let digest = fields.argumentDigest ?? null;
    if (fields.arguments !== undefined && fields.arguments !== null) {
      if (digest !== null) throw new RangeError("pass arguments or argumentDigest, not both");
      digest = argumentDigest(fields.arguments); // already a private copy
    } else if (digest !== null) {
      if (!(digest instanceof Uint8Array && digest.length === 32)) throw new RangeError("argumentDigest must be 32 bytes (SHA-256)");
      digest = Uint8Array.from(digest);
    }
    const extra: Record<string, string> = {};
    if (fields.extra) {
      for (const [key, value] of Object.entries(fields.extra)) {
        if (typeof value !== "string") throw new TypeError("binding extra must map strings to strings");
        extra[key] = value;
      }
    }
    this.argumentDigest = digest;
    this.extra = Object.freeze(extra);
    this.encoded = encode([this.principal, this.audience, this.method, this.target], digest, extra);
    Object.freeze(this);
  }

  /** HMAC-SHA256(key's binding subkey, encoded)[:16], cached for the last key asked. */
  tag(key: Key): Uint8Array {
    if (this.#tagKey !== key || this.#tag === null) {
      this.#tag = key.bindingTag(this.encoded);
      this.#tagKey = key;
    }
    return this.#tag;
  }

  /** A binding like this one with some fields changed (`arguments` replaces the digest). */
  replace(changes: BindingFields): Binding {
    const fields: BindingFields = {
      principal: this.principal,
      audience: this.audience,
      method: this.method,
      target: this.target,
      argumentDigest: this.argumentDigest,
      extra: this.extra,
      ...changes,
    };
    if (changes.arguments !== undefined && changes.argumentDigest === undefined) fields.argumentDigest = null;
    return new Binding(fields);
  }

  equals(other: Binding): boolean {
    return sameBytes(this.encoded, other.encoded);
  }
}

/** The binding of a token sealed without one. */
export const UNBOUND = new Binding();

function textField(fields: BindingFields, name: "principal" | "audience" | "method" | "target"): string | null {
  const value = fields[name] ?? null;
  if (value !== null && typeof value !== "string") {
    throw new TypeError(`binding ${name} must be a string or null, not ${typeName(value)}`);
  }
  return value;
}

/**
 * The domain, then per field 0x00 (absent) or 0x01 || u32be length || bytes, then the
 * count of extra entries and each entry's key and value, written into one buffer.
 */
function encode(texts: (string | null)[], digest: Uint8Array | null, extra: Record<string, string>): Uint8Array {
  const values: (Uint8Array | null)[] = texts.map((text) => (text === null ? null : encodeText(text)));
  values.push(digest);
  const entries = Object.entries(extra).map(([k, v]) => [encodeText(k), encodeText(v)] as const);
  // Sorted by code point, as Python's sorted(): the UTF-8 byte order is the code point order.
  entries.sort(([a], [b]) => compareBytes(a, b));
  for (const [k, v] of entries) values.push(k, v);
  let length = DOMAIN.length + 4;
  for (const value of values) length += value === null ? 1 : 5 + value.length;
  const out = new Uint8Array(length);
  const view = new DataView(out.buffer);
  out.set(DOMAIN, 0);
  let at = DOMAIN.length;
  const put = (value: Uint8Array | null): void => {
    if (value === null) {
      out[at++] = 0;
      return;
    }
    out[at] = 1;
    view.setUint32(at + 1, value.length);
    out.set(value, at + 5);
    at += 5 + value.length;
  };
  for (let i = 0; i < 5; i++) put(values[i] as Uint8Array | null);
  view.setUint32(at, entries.length);
  at += 4;
  for (let i = 5; i < values.length; i++) put(values[i] as Uint8Array | null);
  return out;
}

function compareBytes(a: Uint8Array, b: Uint8Array): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return (a[i] as number) - (b[i] as number);
  return a.length - b.length;
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && compareBytes(a, b) === 0;
}

export function concat(parts: Uint8Array[]): Uint8Array {
  let length = 0;
  for (const part of parts) length += part.length;
  const out = new Uint8Array(length);
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.length;
  }
  return out;
}
