/**
 * The shared vectors (tests/vectors/*.json, the same files the Python suite runs) against
 * this package: every positive case opens to the expected payload and header fields,
 * every negative case is refused with exactly the expected reason, the intermediate values
 * (subkeys, binding encoding and tag, canonical arguments) match, and every positive token
 * is rebuilt byte for byte by the sealer from its fields and the vector's fixed randomness.
 */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  argumentDigest, Binding, canonicalJson, deriveSubkey, InvalidState, KeyRing, REASONS, StateCodec,
  type Mode, type OpenedState,
} from "../src/index.js";
import { fromHex, hex, repoFile } from "./helpers.js";

interface BindingDoc {
  principal: string | null;
  audience: string | null;
  method: string | null;
  target: string | null;
  argument_digest: string | null;
  extra: Record<string, string>;
  arguments?: unknown;
}

interface Case {
  name: string;
  keyring: string;
  mode: Mode;
  ttl: number;
  max_skew: number;
  expiry_grace: number;
  max_token_bytes: number;
  max_rounds?: number;
  max_flow_age?: number;
  now: number;
  binding: BindingDoc | null;
  token: string;
  expected: Record<string, unknown>;
  intermediate?: Record<string, string>;
}

interface VectorFile {
  keyrings: Record<string, unknown>;
  derived_subkeys: Record<string, Record<string, Record<string, string>>>;
  cases: Case[];
}

const FILES = ["sign.json", "encrypt.json", "negative.json"] as const;
const DOCS = Object.fromEntries(
  FILES.map((name) => [name, JSON.parse(repoFile(`tests/vectors/${name}`)) as VectorFile]),
) as Record<(typeof FILES)[number], VectorFile>;
const CASES = FILES.flatMap((file) => DOCS[file].cases.map((c) => [file, c] as const));

function binding(doc: BindingDoc | null): Binding | null {
  if (doc === null) return null;
  return new Binding({
    principal: doc.principal,
    audience: doc.audience,
    method: doc.method,
    target: doc.target,
    argumentDigest: doc.argument_digest === null ? null : fromHex(doc.argument_digest),
    extra: doc.extra,
  });
}

function codec(file: (typeof FILES)[number], c: Case): StateCodec {
  return new StateCodec(KeyRing.fromObject(DOCS[file].keyrings[c.keyring]), {
    mode: c.mode,
    ttl: c.ttl,
    maxSkew: c.max_skew,
    expiryGrace: c.expiry_grace,
    maxTokenBytes: c.max_token_bytes,
    maxRounds: c.max_rounds ?? 10,
    maxFlowAge: c.max_flow_age ?? 3600,
    clock: () => c.now,
  });
}

/** A sealer with the vector's randomness: the only way randomness is ever fixed. */
class FixedRandomCodec extends StateCodec {
  sealFixed(payload: Uint8Array, b: Binding | null, opts: Parameters<StateCodec["seal"]>[2], tokenId: Uint8Array,
    nonceSuffix: Uint8Array): string {
    return this.sealWith(payload, b, opts ?? {}, { tokenId, nonceSuffix });
  }
}

describe("the shared vectors", () => {
  it("cover every reason of the format document but the replay store's", () => {
    assert.ok(CASES.length >= 30);
    const reasons = new Set(CASES.flatMap(([, c]) => ("reason" in c.expected ? [c.expected["reason"]] : [])));
    assert.deepEqual([...reasons].sort(), REASONS.filter((r) => !["replayed", "store_unavailable", "internal_error"].includes(r)).sort());
  });

  it("name the same reasons as the Python library", () => {
    const source = repoFile("statecodec/_errors.py");
    const block = /Reason = Literal\[([^\]]*)\]/.exec(source);
    assert.ok(block, "the Reason literal of statecodec/_errors.py");
    assert.deepEqual([...(block[1] as string).matchAll(/"([a-z_]+)"/g)].map((m) => m[1]), [...REASONS]);
  });

  for (const [file, c] of CASES) {
    it(`${file} ${c.name}`, async () => {
      const verifier = codec(file, c);
      const b = binding(c.binding);
      const expected = c.expected;
      if ("reason" in expected) {
        assert.throws(() => verifier.open(c.token, b), (exc: unknown) => {
          assert.ok(exc instanceof InvalidState, String(exc));
          assert.equal(exc.reason, expected["reason"], exc.detail);
          return true;
        });
        await assert.rejects(verifier.unseal(c.token, b), (exc: InvalidState) => exc.reason === expected["reason"]);
        return;
      }
      const opened = await verifier.unseal(c.token, b);
      assert.equal(hex(opened.payload), expected["payload_hex"]);
      assert.equal(opened.kid, expected["kid"]);
      assert.equal(opened.issuedAt, expected["issued_at"]);
      assert.equal(opened.expiresAt, expected["expires_at"]);
      assert.equal(opened.tokenId, expected["token_id"]);
      assert.equal(opened.mode, c.mode);
      if ("round" in expected) {
        assert.equal(opened.flowId, expected["flow_id"]);
        assert.equal(opened.round, expected["round"]);
        assert.equal(opened.flowStartedAt, expected["flow_started_at"]);
        assert.equal(opened.notBefore, expected["not_before"]);
      } else {
        assert.deepEqual([opened.flowId, opened.round, opened.flowStartedAt, opened.notBefore],
          [opened.tokenId, 1, opened.issuedAt, null]);
      }
    });
  }

  const positives = CASES.filter(([, c]) => "payload_hex" in c.expected);

  for (const [file, c] of positives) {
    it(`${file} ${c.name}: the sealer rebuilds the token byte for byte`, () => {
      const e = c.expected;
      const iat = e["issued_at"] as number;
      const ring = KeyRing.fromObject(DOCS[file].keyrings[c.keyring]).withPrimary(e["kid"] as string);
      const sealer = new FixedRandomCodec(ring, {
        mode: c.mode, maxTokenBytes: c.max_token_bytes, maxRounds: 255, maxFlowAge: null, clock: () => iat,
      });
      let parent: OpenedState | undefined;
      if ("round" in e && (e["round"] as number) > 1) {
        parent = { flowId: e["flow_id"], round: (e["round"] as number) - 1, flowStartedAt: e["flow_started_at"] } as OpenedState;
      }
      const notBefore = e["not_before"] as number | null | undefined;
      const nonce = c.intermediate?.["nonce"];
      const token = sealer.sealFixed(
        fromHex(e["payload_hex"] as string), binding(c.binding),
        {
          ttl: (e["expires_at"] as number) - iat,
          ...(parent ? { parent } : {}),
          ...(notBefore != null ? { retryAfter: notBefore - iat } : {}),
        },
        fromHex(e["token_id"] as string),
        nonce === undefined ? new Uint8Array(0) : fromHex(nonce.slice(32)),
      );
      assert.equal(token, c.token);
    });
  }

  it("derive the subkeys of every key as the vectors say", () => {
    let checked = 0;
    for (const file of FILES) {
      const doc = DOCS[file];
      for (const [ringName, ringDoc] of Object.entries(doc.keyrings)) {
        const ring = KeyRing.fromObject(ringDoc);
        for (const key of ring.keys) {
          const want = doc.derived_subkeys[ringName]?.[key.kid];
          assert.ok(want, `${file} ${ringName} ${key.kid}`);
          assert.equal(hex(deriveSubkey(key.secret, "sign/hmac-sha256")), want["mac_key"]);
          assert.equal(hex(deriveSubkey(key.secret, "encrypt/xchacha20-poly1305")), want["aead_key"]);
          assert.equal(hex(key.aeadKey), want["aead_key"]);
          assert.equal(hex(deriveSubkey(key.secret, "binding/hmac-sha256")), want["bind_key"]);
          checked += 1;
        }
      }
    }
    assert.ok(checked >= 3);
  });

  it("encode and tag every positive case's binding as the vectors say", () => {
    for (const [file, c] of positives) {
      const b = binding(c.binding) ?? new Binding();
      const key = KeyRing.fromObject(DOCS[file].keyrings[c.keyring]).require(c.expected["kid"] as string);
      assert.equal(hex(b.encoded), c.intermediate?.["binding_encoded"], c.name);
      assert.equal(hex(b.tag(key)), c.intermediate?.["binding_tag"], c.name);
    }
  });

  it("digest the vectors' JSON arguments to their argument digests (RFC 8785)", () => {
    let checked = 0;
    for (const [, c] of CASES) {
      if (c.binding === null || !("arguments" in c.binding)) continue;
      assert.equal(hex(argumentDigest(c.binding.arguments)), c.binding.argument_digest, c.name);
      const canonical = c.intermediate?.["canonical_arguments"];
      if (canonical !== undefined) assert.equal(canonicalJson(c.binding.arguments), canonical, c.name);
      checked += 1;
    }
    assert.ok(checked > 10);
  });
});
