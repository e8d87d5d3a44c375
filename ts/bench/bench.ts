/**
 * One round's seal + unseal, side by side in one run: statecodec (SIGN, ENCRYPT) against the
 * TypeScript SDK's createRequestStateCodec (mint + verify) and against the bare primitives
 * over the same bytes (HMAC-SHA256 twice; XChaCha20-Poly1305 encrypt + decrypt).
 *
 * The state is 300 bytes of JSON; statecodec builds its binding per request (principal,
 * audience, method, tool, arguments) and checks every rule but single use (no store: the
 * stores' cost is the network's). Variants run round-robin, SAMPLES times BATCH
 * operations each; the table gives each one's median microseconds per round and its ratio
 * to the bare primitive of its mode.
 *
 *   node dist/bench/bench.js [--samples 15] [--batch 2000]
 */

import { createHmac, randomBytes as nodeRandom } from "node:crypto";
import { parseArgs } from "node:util";

import { xchacha20poly1305 } from "@noble/ciphers/chacha.js";
import { hmac } from "@noble/hashes/hmac.js";
import { sha256 } from "@noble/hashes/sha2.js";
import { randomBytes } from "@noble/hashes/utils.js";
import { createRequestStateCodec, type ServerContext } from "@modelcontextprotocol/server";

import { Binding, KeyRing, StateCodec } from "../src/index.js";

const { values } = parseArgs({ options: { samples: { type: "string", default: "15" }, batch: { type: "string", default: "2000" } } });
const SAMPLES = Number(values.samples);
const BATCH = Number(values.batch);

const state = { plan: "p-" + "x".repeat(240), version: "v2.1.0", steps: [1, 2, 3] };
const stateText = JSON.stringify(state).slice(0, 300).padEnd(300, " ");
const stateBytes = new TextEncoder().encode(stateText);
const args = { version: "v2.1.0", force: false, replicas: 3 };
const ring = KeyRing.fromSecret(randomBytes(32), "k2025b");
const sign = new StateCodec(ring, { mode: "sign" });
const encrypt = new StateCodec(ring, { mode: "encrypt" });
const binding = () => new Binding({ principal: '["client-1","https://issuer",null]', audience: "deploy-svc", method: "tools/call", target: "deploy", arguments: args });
const reused = binding();
const sdk = createRequestStateCodec({ key: nodeRandom(32), bind: (ctx) => `${ctx.mcpReq.method}\0${ctx.http?.authInfo?.clientId ?? ""}` });
const ctx = { mcpReq: { method: "tools/call" }, http: { authInfo: { clientId: "client-1" } } } as unknown as ServerContext;
// The same bytes the statecodec SIGN token authenticates: header (57 bytes with this kid) and state.
const signed = new Uint8Array(5 + 47 + stateBytes.length);
const macKey = randomBytes(32);
const aeadKey = randomBytes(32);
const aad = new Uint8Array(5 + 47);

type Variant = { name: string; mode: "sign" | "encrypt" | "sdk"; run: () => unknown };

const variants: Variant[] = [
  { name: "statecodec SIGN", mode: "sign", run: () => { const b = binding(); sign.open(sign.seal(stateBytes, b), b); } },
  { name: "statecodec SIGN, one binding reused", mode: "sign", run: () => { sign.open(sign.seal(stateBytes, reused), reused); } },
  { name: "statecodec ENCRYPT", mode: "encrypt", run: () => { const b = binding(); encrypt.open(encrypt.seal(stateBytes, b), b); } },
  { name: "plain HMAC-SHA256 x2 (@noble/hashes)", mode: "sign", run: () => { hmac(sha256, macKey, signed); hmac(sha256, macKey, signed); } },
  { name: "plain HMAC-SHA256 x2 (node:crypto)", mode: "sign", run: () => {
    createHmac("sha256", macKey).update(signed).digest(); createHmac("sha256", macKey).update(signed).digest(); } },
  { name: "plain XChaCha20-Poly1305 seal + open (@noble/ciphers)", mode: "encrypt", run: () => {
    const nonce = randomBytes(24);
    xchacha20poly1305(aeadKey, nonce, aad).decrypt(xchacha20poly1305(aeadKey, nonce, aad).encrypt(stateBytes)); } },
];

async function sdkBatch(): Promise<number> {
  const start = performance.now();
  for (let i = 0; i < BATCH; i++) await sdk.verify(await sdk.mint(state, ctx), ctx);
  return performance.now() - start;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] as number;
}

const times = new Map<string, number[]>([...variants.map((v) => [v.name, []] as [string, number[]]), ["TypeScript SDK createRequestStateCodec (mint + verify)", []]]);
for (const v of variants) for (let i = 0; i < BATCH; i++) v.run(); // warm up
await sdkBatch();
for (let s = 0; s < SAMPLES; s++) {
  for (const v of variants) {
    const start = performance.now();
    for (let i = 0; i < BATCH; i++) v.run();
    times.get(v.name)?.push(((performance.now() - start) * 1000) / BATCH);
  }
  times.get("TypeScript SDK createRequestStateCodec (mint + verify)")?.push((await sdkBatch()) * 1000 / BATCH);
}
const us = (name: string) => median(times.get(name) as number[]);
const base = { sign: us("plain HMAC-SHA256 x2 (@noble/hashes)"), encrypt: us("plain XChaCha20-Poly1305 seal + open (@noble/ciphers)") };
console.log(`node ${process.version}, ${SAMPLES} samples of ${BATCH} rounds, median microseconds per round (seal + unseal)\n`);
console.log("| variant | µs per round | vs the plain primitive of its mode |");
console.log("|---|---|---|");
for (const [name] of times) {
  const mode = name.includes("ENCRYPT") || name.includes("XChaCha") ? "encrypt" : "sign";
  console.log(`| ${name} | ${us(name).toFixed(2)} | ${(us(name) / base[mode]).toFixed(2)}x |`);
}
