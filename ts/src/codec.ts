/**
 * StateCodec: seal and unseal sc1 requestState tokens, every policy check in one place,
 * in the order docs/format.md fixes: parse strictly (size cap first), resolve the kid to
 * exactly one key, verify the MAC or AEAD tag, and only then judge the authentic times,
 * flow budgets, binding and pacing. Consuming the token id in the replay store comes last,
 * so nothing that fails a check can burn a valid token. Any unexpected exception fails
 * closed as `internal_error`.
 *
 * Time: a token is valid at `now` while `iat - maxSkew <= now < exp + expiryGrace`.
 */

import { xchacha20poly1305 } from "@noble/ciphers/chacha.js";
import { equalBytes } from "@noble/ciphers/utils.js";
import { randomFillSync } from "node:crypto";

import { bytesToHex, hexToBytes } from "@noble/hashes/utils.js";

import { b64encode } from "./base64url.js";
import { Binding, concat, UNBOUND } from "./binding.js";
import { FlowBudgetExceeded, InvalidState, type Reason } from "./errors.js";
import {
  MAC_LEN, MAX_ROUND, NONCE_SUFFIX_LEN, PREFIX_ENCRYPT, PREFIX_SIGN, TOKEN_ID_LEN,
  packHeader, parse, type FlowFields, type ParsedToken,
} from "./format.js";
import { KeyRing, type Key, type KeyProvider } from "./keys.js";
import type { ReplayStore } from "./replay/base.js";

export type Mode = "sign" | "encrypt";

export const DEFAULT_TTL = 600;
export const DEFAULT_MAX_SKEW = 60;
export const DEFAULT_EXPIRY_GRACE = 0;
export const DEFAULT_MAX_TOKEN_BYTES = 8192;
export const DEFAULT_MAX_ROUNDS = 10;
export const DEFAULT_MAX_FLOW_AGE = 3600;
export const DEFAULT_NAMESPACE = "default";
/** The longest span, in seconds, of every time setting: a signed 32-bit number of seconds. */
export const MAX_SECONDS = 2 ** 31 - 1;
export const MIN_TOKEN_BYTES = 128;

const ASCII = new TextEncoder();

/** A verified token: its payload and the authenticated header fields. */
export interface OpenedState {
  readonly payload: Uint8Array;
  readonly kid: string;
  readonly issuedAt: number;
  readonly expiresAt: number;
  /** 32 hex digits. */
  readonly tokenId: string;
  readonly mode: Mode;
  /** 32 hex digits: the token id of the flow's first token (this one's in a first round). */
  readonly flowId: string;
  readonly round: number;
  readonly flowStartedAt: number;
  /** Unix seconds before which a paced token is too early, or null. */
  readonly notBefore: number | null;
}

/** Where the codec reports what it refused or could not do (a subset of `console`). */
export interface CodecLogger {
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

export interface CodecOptions {
  /** "sign" (HMAC-SHA256, payload readable) or "encrypt" (XChaCha20-Poly1305). Default "sign". */
  mode?: Mode;
  /** Lifetime of minted tokens, seconds (default 600). */
  ttl?: number;
  /** Whole seconds a token may have been issued in the future (default 60). */
  maxSkew?: number;
  /** Whole seconds a token is still accepted past its expiry (default 0). */
  expiryGrace?: number;
  maxTokenBytes?: number;
  /** The most tokens one flow may have, 1..255 (default 10). */
  maxRounds?: number;
  /** Whole seconds a flow may last from its first token (default 3600; null: no limit). */
  maxFlowAge?: number | null;
  /** With a store, each token unseals at most once. */
  replay?: ReplayStore | null;
  /** Prefix of replay-store entries (default "default"); the same on every instance of a service. */
  namespace?: string;
  /** The current Unix time in seconds (default: Date.now() / 1000). */
  clock?: () => number;
  logger?: CodecLogger | null;
}

export interface SealOptions {
  ttl?: number;
  /** The OpenedState this round was unsealed from: the token is the next round of its flow. */
  parent?: OpenedState;
  /** Seconds before the token may be redeemed; earlier it is `too_early`. */
  retryAfter?: number;
}

/** Randomness a test fixes to reproduce the published vectors; never taken from callers. */
interface Fresh {
  tokenId: Uint8Array;
  nonceSuffix: Uint8Array;
}

const systemClock = (): number => Date.now() / 1000;

// Fresh token ids come from a pool filled by the CSPRNG a few KiB at a time: one small
// randomBytes call per seal costs about as much as the MAC. Each byte is handed out once.
const POOL_SIZE = 4096;
const pool = new Uint8Array(POOL_SIZE);
let poolAt = POOL_SIZE;

function freshBytes(n: number): Uint8Array {
  if (poolAt + n > POOL_SIZE) {
    randomFillSync(pool);
    poolAt = 0;
  }
  const out = pool.slice(poolAt, poolAt + n);
  pool.fill(0, poolAt, poolAt + n);
  poolAt += n;
  return out;
}

export class StateCodec {
  readonly mode: Mode;
  readonly keys: KeyProvider;
  readonly ttl: number;
  readonly maxSkew: number;
  readonly expiryGrace: number;
  readonly maxTokenBytes: number;
  readonly maxRounds: number;
  readonly maxFlowAge: number | null;
  readonly replay: ReplayStore | null;
  readonly namespace: string;
  readonly clock: () => number;
  readonly #prefix: string;
  readonly #prefixBytes: Uint8Array;
  readonly #logger: CodecLogger | null;
  #storeFailing = false;

  constructor(keys: KeyProvider, options: CodecOptions = {}) {
    if (keys === null || typeof keys !== "object" || typeof keys.keyring !== "function" ||
        typeof keys.signingKey !== "function") {
      throw new TypeError("keys must be a KeyRing or a KeyProvider (keyring() and signingKey())");
    }
    if (keys instanceof KeyRing && keys.size === 0) {
      throw new RangeError("the key ring has no keys, so the codec could neither seal nor unseal");
    }
    const mode = options.mode ?? "sign";
    if (mode !== "sign" && mode !== "encrypt") throw new RangeError(`mode must be "sign" or "encrypt", got ${String(mode)}`);
    const ttl = options.ttl ?? DEFAULT_TTL;
    checkTtl(ttl);
    const maxSkew = options.maxSkew ?? DEFAULT_MAX_SKEW;
    const expiryGrace = options.expiryGrace ?? DEFAULT_EXPIRY_GRACE;
    for (const [name, value] of [["maxSkew", maxSkew], ["expiryGrace", expiryGrace]] as const) {
      if (!(Number.isInteger(value) && value >= 0 && value <= MAX_SECONDS)) {
        throw new RangeError(`${name} must be a whole number of seconds >= 0, got ${value}`);
      }
    }
    const maxRounds = options.maxRounds ?? DEFAULT_MAX_ROUNDS;
    if (!(Number.isInteger(maxRounds) && maxRounds >= 1 && maxRounds <= MAX_ROUND)) {
      throw new RangeError(`maxRounds must be a whole number from 1 to ${MAX_ROUND}, got ${maxRounds}`);
    }
    const maxFlowAge = options.maxFlowAge === undefined ? DEFAULT_MAX_FLOW_AGE : options.maxFlowAge;
    if (maxFlowAge !== null && !(Number.isInteger(maxFlowAge) && maxFlowAge > 0 && maxFlowAge <= MAX_SECONDS)) {
      throw new RangeError(`maxFlowAge must be a positive whole number of seconds or null, got ${maxFlowAge}`);
    }
    const maxTokenBytes = options.maxTokenBytes ?? DEFAULT_MAX_TOKEN_BYTES;
    if (!(Number.isInteger(maxTokenBytes) && maxTokenBytes >= MIN_TOKEN_BYTES)) {
      throw new RangeError(`maxTokenBytes below ${MIN_TOKEN_BYTES} cannot hold a token`);
    }
    const replay = options.replay ?? null;
    if (replay !== null && typeof replay.consume !== "function") {
      throw new TypeError("replay must be a ReplayStore (consume(key, retentionSeconds))");
    }
    const namespace = options.namespace ?? DEFAULT_NAMESPACE;
    if (typeof namespace !== "string") throw new TypeError("namespace must be a string");
    this.mode = mode;
    this.keys = keys;
    this.ttl = ttl;
    this.maxSkew = maxSkew;
    this.expiryGrace = expiryGrace;
    this.maxTokenBytes = maxTokenBytes;
    this.maxRounds = maxRounds;
    this.maxFlowAge = maxFlowAge;
    this.replay = replay;
    this.namespace = namespace;
    this.clock = options.clock ?? systemClock;
    this.#logger = options.logger ?? null;
    this.#prefix = mode === "sign" ? PREFIX_SIGN : PREFIX_ENCRYPT;
    this.#prefixBytes = ASCII.encode(this.#prefix);
  }

  // ------------------------------------------------------------------ sealing
  /**
   * Mint a token carrying `payload` (bytes, or text as UTF-8), bound to `binding`.
   * Throws FlowBudgetExceeded past maxRounds or maxFlowAge, RangeError for values a token
   * cannot carry (a ttl out of range, a token over maxTokenBytes).
   */
  seal(payload: Uint8Array | string, binding: Binding | null = null, options: SealOptions = {}): string {
    return this.sealWith(payload, binding, options, null);
  }

  /** `seal` with fixed randomness: for reproducing the published vectors only. */
  protected sealWith(
    payload: Uint8Array | string, binding: Binding | null, options: SealOptions, fresh: Fresh | null,
  ): string {
    // The key first, then the clock: a key promoted between the two reads must never mint
    // a token dated before its promotion.
    const key = this.keys.signingKey();
    const now = this.clock();
    if (!Number.isFinite(now)) throw new RangeError(`the clock returned ${now}, not a finite time`);
    const iat = Math.floor(now);
    let ttl = options.ttl ?? this.ttl;
    checkTtl(ttl);
    let flow: FlowFields | undefined;
    if (options.parent !== undefined) {
      [flow, ttl] = this.#nextRound(options.parent, iat, ttl);
    } else if (this.maxFlowAge !== null && ttl > this.maxFlowAge) {
      ttl = this.maxFlowAge; // a first round: its flow starts now
    }
    let notBeforeMs = 0;
    if (options.retryAfter !== undefined) {
      const r = options.retryAfter;
      if (!(typeof r === "number" && r > 0 && r <= MAX_SECONDS)) {
        throw new RangeError(`retryAfter must be a positive number of seconds, got ${r}`);
      }
      // Rounded to the microsecond first: float noise must not add a millisecond.
      notBeforeMs = Math.ceil(Math.round((now + r - iat) * 1e6) / 1e3);
      if (notBeforeMs > ttl * 1000) throw new RangeError(`retryAfter=${r}s is beyond the token's ${ttl}s lifetime`);
    }
    // Buffer.from writes the same UTF-8 as TextEncoder (U+FFFD for a lone surrogate), faster.
    const body = typeof payload === "string" ? Buffer.from(payload, "utf8") : payload;
    if (!(body instanceof Uint8Array)) throw new TypeError("payload must be a Uint8Array or a string");
    const signs = this.mode === "sign";
    let tokenId: Uint8Array;
    let nonceSuffix: Uint8Array;
    if (fresh !== null) {
      ({ tokenId, nonceSuffix } = fresh);
    } else {
      // One draw for the whole 24-byte ENCRYPT nonce: its first 16 bytes are the token id.
      const drawn = freshBytes(signs ? TOKEN_ID_LEN : TOKEN_ID_LEN + NONCE_SUFFIX_LEN);
      tokenId = drawn.subarray(0, TOKEN_ID_LEN);
      nonceSuffix = drawn.subarray(TOKEN_ID_LEN);
    }
    const header = packHeader(key.kid, iat, iat + ttl, tokenId, (binding ?? UNBOUND).tag(key), flow, notBeforeMs);
    let raw: Uint8Array;
    if (signs) {
      // header || payload || MAC in one buffer, the MAC computed over its first part in place.
      const signedLen = header.length + body.length;
      raw = new Uint8Array(signedLen + MAC_LEN);
      raw.set(header);
      raw.set(body, header.length);
      raw.set(key.signMac(raw.subarray(0, signedLen)), signedLen);
    } else {
      const aad = concat([this.#prefixBytes, header]);
      const sealed = xchacha20poly1305(key.aeadKey, concat([tokenId, nonceSuffix]), aad).encrypt(body);
      raw = concat([header, nonceSuffix, sealed]);
    }
    const token = this.#prefix + b64encode(raw);
    if (token.length > this.maxTokenBytes) {
      throw new RangeError(
        `sealed token would be ${token.length} characters, over maxTokenBytes=${this.maxTokenBytes}; ` +
          "keep less in requestState or raise the limit on every instance",
      );
    }
    return token;
  }

  #nextRound(parent: OpenedState, iat: number, ttl: number): [FlowFields, number] {
    const round = parent.round + 1;
    const { flowId, flowStartedAt: startedAt } = parent;
    if (round > this.maxRounds) {
      throw new FlowBudgetExceeded(
        "round_limit", `flow ${flowId.slice(0, 8)} has had its ${this.maxRounds} rounds (maxRounds); round ${round} refused`,
        flowId, round,
      );
    }
    if (this.maxFlowAge !== null) {
      const left = startedAt + this.maxFlowAge - iat;
      if (left < 1) {
        throw new FlowBudgetExceeded(
          "flow_expired",
          `flow ${flowId.slice(0, 8)} started ${iat - startedAt}s ago, maxFlowAge is ${this.maxFlowAge}s; round ${round} refused`,
          flowId, round,
        );
      }
      ttl = Math.min(ttl, left);
    }
    return [{ flowId: hexToBytes(flowId), round, startedAt }, ttl];
  }

  // ---------------------------------------------------------------- unsealing
  /**
   * Verify `token` against `binding` and return its payload, or throw InvalidState. With a
   * replay store and `consume` (the default), a token unseals only once.
   */
  async unseal(token: string, binding: Binding | null = null, options: { consume?: boolean } = {}): Promise<OpenedState> {
    const now = this.#now();
    const opened = this.#guardedOpen(token, binding, now, true);
    if ((options.consume ?? true) && this.replay !== null) {
      let first: unknown;
      try {
        first = await this.replay.consume(this.namespace + ":" + opened.tokenId, opened.expiresAt + this.expiryGrace + this.maxSkew - now);
      } catch (exc) {
        throw this.#storeDown(opened, exc);
      }
      this.#judgeReplay(opened, first);
    }
    return opened;
  }

  /** Every check but single use (steps 1-12), synchronously; never consumes. */
  open(token: string, binding: Binding | null = null): OpenedState {
    return this.#guardedOpen(token, binding, this.#now(), true);
  }

  /**
   * Format, key, MAC/AEAD and times but NOT the binding; never consumes. For debugging
   * tools only: a server must always check the binding.
   */
  verifyUnbound(token: string): OpenedState {
    return this.#guardedOpen(token, null, this.#now(), false);
  }

  #now(): number {
    let now: number;
    try {
      now = this.clock();
    } catch (exc) {
      this.#logger?.error("the clock failed; token rejected", { reason: "internal_error", error: String(exc) });
      throw new InvalidState("internal_error", `unexpected ${errorName(exc)} from the clock`);
    }
    // NaN compares false with everything: no token would ever expire.
    if (typeof now !== "number" || !Number.isFinite(now)) {
      throw new InvalidState("internal_error", `the clock returned ${String(now)}, not a finite time`);
    }
    return now;
  }

  #guardedOpen(token: string, binding: Binding | null, now: number, checkBinding: boolean): OpenedState {
    try {
      return this.#open(token, binding, now, checkBinding);
    } catch (exc) {
      if (exc instanceof InvalidState) throw exc;
      // Deny on error: a bug or an exotic input must never let a token through.
      this.#logger?.error("unexpected error while unsealing; token rejected", { reason: "internal_error", error: String(exc) });
      throw new InvalidState("internal_error", `unexpected ${errorName(exc)} while unsealing`);
    }
  }

  #open(token: string, binding: Binding | null, now: number, checkBinding: boolean): OpenedState {
    const parsed = parse(token, this.maxTokenBytes);
    const { kid, issuedAt: iat, expiresAt: exp, round, flowStartedAt: started, notBeforeMs } = parsed;
    const tokenMode: Mode = parsed.mode === "s" ? "sign" : "encrypt";
    if (tokenMode !== this.mode) {
      throw new InvalidState("wrong_mode", `token is a ${tokenMode.toUpperCase()} token, this codec is ${this.mode.toUpperCase()}`, { kid });
    }
    const key = this.#verificationKey(kid, now);
    const payload = this.#authenticPayload(key, parsed);
    // From here on the header is authentic.
    const tokenId = bytesToHex(parsed.tokenId);
    if (exp < iat || started > iat) {
      throw new InvalidState("malformed", "expires before it was issued, or issued before its flow", { kid, tokenId });
    }
    const flowId = round === 1 ? tokenId : bytesToHex(parsed.flowId);
    const notBefore = notBeforeMs ? iat + notBeforeMs / 1000 : null;
    let why: [Reason, string] | null = null;
    if (now >= exp + this.expiryGrace) {
      why = ["expired", `expired ${fmt(now - exp)}s ago (expiry grace ${this.expiryGrace}s)`];
    } else if (iat > now + this.maxSkew) {
      why = ["not_yet_valid", `issued ${fmt(iat - now)}s in the future, beyond the ${this.maxSkew}s skew allowance (clock skew between instances?)`];
    } else if (round > this.maxRounds) {
      why = ["round_limit", `round ${round} of its flow, beyond maxRounds=${this.maxRounds}`];
    } else if (this.maxFlowAge !== null && now >= started + this.maxFlowAge + this.expiryGrace) {
      why = ["flow_expired", `its flow started ${fmt(now - started)}s ago, beyond maxFlowAge=${this.maxFlowAge}s`];
    } else if (checkBinding && !equalBytes((binding ?? UNBOUND).tag(key), parsed.bindTag)) {
      why = ["binding_mismatch", "the token was sealed for a different principal, audience, method, target, " +
        "arguments or extra binding" + (binding ? "" : " (no binding was given)")];
    } else if (notBefore !== null && now < notBefore) {
      // Pacing, last before consuming: an early retry burns nothing.
      why = ["too_early", `redeemable in ${(notBefore - now).toFixed(3)}s: the server paces this round`];
    }
    if (why !== null) {
      const [reason, detail] = why;
      throw new InvalidState(reason, detail, {
        kid, tokenId, flowId, round, retryAt: reason === "too_early" ? (notBefore as number) : undefined,
      });
    }
    return Object.freeze({
      payload, kid, issuedAt: iat, expiresAt: exp, tokenId, mode: this.mode, flowId, round, flowStartedAt: started, notBefore,
    });
  }

  #authenticPayload(key: Key, parsed: ParsedToken): Uint8Array {
    const { kid, header, body } = parsed;
    if (this.mode === "sign") {
      if (!equalBytes(key.signMac(parsed.signed), parsed.mac)) {
        throw new InvalidState("tampered", "MAC does not match: the token was modified or forged", { kid });
      }
      // A copy the caller owns (the decoded token may sit in Node's shared buffer pool).
      const copy = new Uint8Array(body.length);
      copy.set(body);
      return copy;
    }
    // The token id is half of the nonce and part of the associated data: a changed tid
    // fails the tag twice over.
    const nonce = concat([parsed.tokenId, body.subarray(0, NONCE_SUFFIX_LEN)]);
    try {
      return xchacha20poly1305(key.aeadKey, nonce, concat([this.#prefixBytes, header])).decrypt(body.subarray(NONCE_SUFFIX_LEN));
    } catch {
      throw new InvalidState("tampered", "AEAD tag does not verify: the token was modified or forged", { kid });
    }
  }

  #verificationKey(kid: string, now: number): Key {
    const ring = this.keys.keyring();
    const key = ring.get(kid);
    if (key === undefined) {
      throw new InvalidState("unknown_key", `unknown key id ${kid} - the ring has ${ring.kids.join(", ") || "no keys"}`, { kid });
    }
    if (!key.verifiesAt(now)) {
      throw new InvalidState("unknown_key", `key ${kid} was retired ${fmt(now - (key.retiresAt ?? 0))}s ago`, { kid });
    }
    return key;
  }

  #storeDown(opened: OpenedState, exc: unknown): InvalidState {
    const kind = this.replay?.kind ?? "custom";
    const cause = exc instanceof Error ? `${exc.name}: ${exc.message}` : String(exc);
    // One warning when an outage starts, not one per request.
    if (!this.#storeFailing) {
      this.#logger?.warn(`${kind} replay store unavailable, token ${opened.tokenId.slice(0, 8)} rejected unconsumed: ${cause}`, {
        reason: "store_unavailable", store: kind, kid: opened.kid, tokenId: opened.tokenId,
      });
    }
    this.#storeFailing = true;
    return new InvalidState(
      "store_unavailable", `${kind} replay store did not answer (${cause}); the token was not consumed, retry later`,
      { kid: opened.kid, tokenId: opened.tokenId, flowId: opened.flowId, round: opened.round },
    );
  }

  #judgeReplay(opened: OpenedState, first: unknown): void {
    // Only a real boolean counts: a buggy store answering anything else fails closed.
    if (first !== true && first !== false) {
      throw this.#storeDown(opened, new TypeError(`replay store answered ${typeof first}, not a boolean`));
    }
    if (this.#storeFailing) {
      this.#storeFailing = false;
      this.#logger?.warn(`${this.replay?.kind ?? "custom"} replay store answers again`, { store: this.replay?.kind });
    }
    if (!first) {
      throw new InvalidState("replayed", "this token was already redeemed (single use)", {
        kid: opened.kid, tokenId: opened.tokenId, flowId: opened.flowId, round: opened.round,
      });
    }
  }
}

function checkTtl(ttl: number): void {
  if (!(Number.isInteger(ttl) && ttl > 0 && ttl <= MAX_SECONDS)) {
    throw new RangeError(`ttl must be a positive whole number of seconds, got ${ttl}`);
  }
}

function fmt(seconds: number): string {
  return Number.isInteger(seconds) ? String(seconds) : seconds.toFixed(3);
}

function errorName(exc: unknown): string {
  return exc instanceof Error ? exc.name : typeof exc;
}
