/**
 * The sc1 token format: bytes <-> text, nothing else (no clock, no key, no policy).
 * docs/format.md in the repository is the normative description; the shared vectors in
 * tests/vectors hold this module and the Python one to it.
 *
 *     "sc1s." base64url(header || payload || mac)                     SIGN    (HMAC-SHA256)
 *     "sc1e." base64url(header || nonce_suffix || ciphertext || tag)  ENCRYPT (XChaCha20-Poly1305)
 *
 * header: flags|kid_len u8, kid, iat u32be, exp u32be, tid 16, btag 16,
 * then flow 16, round u8, start u32be if CHAINED, then nbf_ms u32be if PACED.
 */

import { b64decode, CUT_SHORT } from "./base64url.js";
import { InvalidState } from "./errors.js";

export const PREFIX_SIGN = "sc1s.";
export const PREFIX_ENCRYPT = "sc1e.";
export const KID_MAX = 32;
export const TOKEN_ID_LEN = 16;
export const BIND_TAG_LEN = 16;
export const MAC_LEN = 32;
export const NONCE_LEN = 24;
export const NONCE_SUFFIX_LEN = NONCE_LEN - TOKEN_ID_LEN;
export const AEAD_TAG_LEN = 16;
export const MAX_TIME = 2 ** 32 - 1;
export const MAX_ROUND = 255;
export const FLAG_CHAINED = 0x80;
export const FLAG_PACED = 0x40;

const KID_LEN_MASK = 0x3f;
const HEADER_FIXED = 1 + 8 + TOKEN_ID_LEN + BIND_TAG_LEN; // 41 bytes and the kid
const CHAIN_LEN = TOKEN_ID_LEN + 1 + 4;
const PACE_LEN = 4;
const KID_RE = /^[A-Za-z0-9._:-]{1,32}$/;
// ASCII digits only: another version or mode is told apart from garbage.
const PREFIX_RE = /^sc([0-9]{1,3})([a-z])\./;

/** A token split into its fields. Nothing here has been verified. */
export interface ParsedToken {
  prefix: string;
  mode: "s" | "e";
  kid: string;
  issuedAt: number;
  expiresAt: number;
  tokenId: Uint8Array;
  bindTag: Uint8Array;
  header: Uint8Array;
  /** SIGN: the payload; ENCRYPT: nonce_suffix || ciphertext || tag. */
  body: Uint8Array;
  /** SIGN: the 32-byte MAC; ENCRYPT: empty. */
  mac: Uint8Array;
  /** SIGN: header || payload, one view (the bytes the MAC covers after the prefix); ENCRYPT: empty. */
  signed: Uint8Array;
  /** The tid of the flow's first token (this token's own in a first round). */
  flowId: Uint8Array;
  round: number;
  flowStartedAt: number;
  /** 0, or milliseconds after issuedAt before which the token is too early. */
  notBeforeMs: number;
}

export interface FlowFields {
  flowId: Uint8Array;
  round: number;
  startedAt: number;
}

export function validKid(kid: string): boolean {
  return KID_RE.test(kid);
}

/** The header, or a RangeError for values it cannot carry. */
export function packHeader(
  kid: string,
  issuedAt: number,
  expiresAt: number,
  tokenId: Uint8Array,
  bindTag: Uint8Array,
  flow?: FlowFields,
  notBeforeMs = 0,
): Uint8Array {
  if (!validKid(kid)) throw new RangeError(`invalid kid ${JSON.stringify(kid)}: 1-32 characters of [A-Za-z0-9._:-]`);
  if (!(isU32(issuedAt) && isU32(expiresAt) && issuedAt <= expiresAt)) {
    throw new RangeError("times must satisfy 0 <= issued_at <= expires_at < 2**32 (the last is 2106-02-07T06:28:15Z)");
  }
  if (tokenId.length !== TOKEN_ID_LEN || bindTag.length !== BIND_TAG_LEN) {
    throw new RangeError("token id and binding tag must be 16 bytes each");
  }
  let flags = 0;
  let length = HEADER_FIXED + kid.length;
  if (flow !== undefined) {
    const { flowId, round, startedAt } = flow;
    if (flowId.length !== TOKEN_ID_LEN || !(Number.isInteger(round) && round >= 2 && round <= MAX_ROUND) ||
        !(isU32(startedAt) && startedAt <= issuedAt)) {
      throw new RangeError("a chained header needs a 16-byte flow id, round 2..255, 0 <= start <= iat");
    }
    flags |= FLAG_CHAINED;
    length += CHAIN_LEN;
  }
  if (notBeforeMs) {
    if (!(Number.isInteger(notBeforeMs) && notBeforeMs > 0 && notBeforeMs <= (expiresAt - issuedAt) * 1000)) {
      throw new RangeError("not_before_ms must be positive and no later than the expiry");
    }
    flags |= FLAG_PACED;
    length += PACE_LEN;
  }
  const out = new Uint8Array(length);
  const view = new DataView(out.buffer);
  out[0] = kid.length | flags;
  for (let i = 0; i < kid.length; i++) out[1 + i] = kid.charCodeAt(i);
  let at = 1 + kid.length;
  view.setUint32(at, issuedAt);
  view.setUint32(at + 4, expiresAt);
  out.set(tokenId, at + 8);
  out.set(bindTag, at + 8 + TOKEN_ID_LEN);
  at += 8 + TOKEN_ID_LEN + BIND_TAG_LEN;
  if (flow !== undefined) {
    out.set(flow.flowId, at);
    out[at + TOKEN_ID_LEN] = flow.round;
    view.setUint32(at + TOKEN_ID_LEN + 1, flow.startedAt);
    at += CHAIN_LEN;
  }
  if (notBeforeMs) view.setUint32(at, notBeforeMs);
  return out;
}

function isU32(value: number): boolean {
  return Number.isInteger(value) && value >= 0 && value <= MAX_TIME;
}

/** The size cap of an inbound token (`too_large`), before any decoding. */
export function checkSize(token: string, maxTokenBytes: number): void {
  if (token.length > maxTokenBytes) {
    throw new InvalidState("too_large", `token is ${token.length} characters, the limit is ${maxTokenBytes}`);
  }
}

function prefixError(token: string): InvalidState {
  const m = PREFIX_RE.exec(token);
  if (m === null) return new InvalidState("malformed", "not a statecodec token (no 'sc1s.' or 'sc1e.' prefix)");
  const [, version, mode] = m;
  if (version !== "1") return new InvalidState("unsupported_version", `token format version ${version} is not supported`);
  return new InvalidState("unsupported_version", `unknown mode '${mode}' in format version 1`);
}

/** Split `token` into fields, strictly, or throw InvalidState. */
export function parse(token: unknown, maxTokenBytes: number): ParsedToken {
  if (typeof token !== "string") throw new InvalidState("malformed", `token must be a string, not ${typeName(token)}`);
  checkSize(token, maxTokenBytes);
  let prefix: string;
  let mode: "s" | "e";
  let trailer: number;
  if (token.startsWith(PREFIX_SIGN)) {
    [prefix, mode, trailer] = [PREFIX_SIGN, "s", MAC_LEN];
  } else if (token.startsWith(PREFIX_ENCRYPT)) {
    [prefix, mode, trailer] = [PREFIX_ENCRYPT, "e", NONCE_SUFFIX_LEN + AEAD_TAG_LEN];
  } else {
    throw prefixError(token);
  }
  let raw: Uint8Array;
  try {
    raw = b64decode(token.slice(prefix.length));
  } catch (exc) {
    const detail = (exc as Error).message;
    throw new InvalidState("malformed", detail === CUT_SHORT ? `the token ${detail}` : detail);
  }
  if (raw.length === 0) throw new InvalidState("malformed", "empty token body");
  const first = raw[0] as number;
  const flags = first & ~KID_LEN_MASK;
  const kidLen = first & KID_LEN_MASK;
  if (kidLen < 1 || kidLen > KID_MAX) throw new InvalidState("malformed", `kid length ${kidLen} is out of range`);
  let headerLen = HEADER_FIXED + kidLen;
  if (flags & FLAG_CHAINED) headerLen += CHAIN_LEN;
  if (flags & FLAG_PACED) headerLen += PACE_LEN;
  if (raw.length < headerLen + trailer) {
    throw new InvalidState("malformed", "the token looks cut short (truncated before its tag)");
  }
  const kid = String.fromCharCode(...raw.subarray(1, 1 + kidLen));
  if (!validKid(kid)) throw new InvalidState("malformed", "kid has characters outside [A-Za-z0-9._:-]");
  const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  let at = 1 + kidLen;
  const issuedAt = view.getUint32(at);
  const expiresAt = view.getUint32(at + 4);
  const tokenId = raw.subarray(at + 8, at + 8 + TOKEN_ID_LEN);
  const bindTag = raw.subarray(at + 8 + TOKEN_ID_LEN, at + 8 + TOKEN_ID_LEN + BIND_TAG_LEN);
  at = HEADER_FIXED + kidLen;
  let flowId = tokenId;
  let round = 1;
  let flowStartedAt = issuedAt;
  let notBeforeMs = 0;
  if (flags & FLAG_CHAINED) {
    flowId = raw.subarray(at, at + TOKEN_ID_LEN);
    round = raw[at + TOKEN_ID_LEN] as number;
    flowStartedAt = view.getUint32(at + TOKEN_ID_LEN + 1);
    // Round 1 is spelled without the flag: one spelling per token.
    if (round < 2) throw new InvalidState("malformed", `a chained token of round ${round}`);
    at += CHAIN_LEN;
  }
  if (flags & FLAG_PACED) {
    notBeforeMs = view.getUint32(at);
    if (notBeforeMs === 0) throw new InvalidState("malformed", "a paced token without a wait");
  }
  const header = raw.subarray(0, headerLen);
  const body = trailer === MAC_LEN ? raw.subarray(headerLen, raw.length - MAC_LEN) : raw.subarray(headerLen);
  const mac = trailer === MAC_LEN ? raw.subarray(raw.length - MAC_LEN) : new Uint8Array(0);
  const signed = trailer === MAC_LEN ? raw.subarray(0, raw.length - MAC_LEN) : new Uint8Array(0);
  return {
    prefix, mode, kid, issuedAt, expiresAt, tokenId, bindTag, header, body, mac, signed,
    flowId, round, flowStartedAt, notBeforeMs,
  };
}

export function typeName(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  return typeof value === "object" ? (value.constructor?.name ?? "object") : typeof value;
}
