// Drives the REAL createRequestStateCodec of @modelcontextprotocol/server (see package.json)
// for tests/compat/test_compat_ts_v1.py: one JSON document on stdin, one on stdout.
//
// stdin:  {"key": {"utf8": "..."} | {"hex": "..."}, "ttlSeconds": 600?, "bindField": "principal"?,
//          "ops": [{"op": "mint", "payload": <json>, "ctx": {...}?, "now": <unix seconds>?},
//                  {"op": "verify", "token": "...", "ctx": {...}?, "now": <unix seconds>?}]}
// stdout: {"sdkVersion": "2.4.0", "results": [{"ok": true, "token": "..."} | {"ok": true, "payload": <json>}
//                                             | {"ok": false, "error": "mac"}]}
//
// bindField configures the codec's bind option as ctx => String(ctx[bindField]), the shape a
// server uses with its request context. "now" pins Date.now() for that one call (the SDK has
// no clock option), so tests can mint tokens in the past and check expiry at exact instants.
import { readFileSync } from 'node:fs';
import { createRequestStateCodec } from '@modelcontextprotocol/server';

const pkg = JSON.parse(readFileSync(new URL('./node_modules/@modelcontextprotocol/server/package.json', import.meta.url)));
const spec = JSON.parse(readFileSync(0, 'utf8'));

const key = spec.key.hex !== undefined ? Uint8Array.from(Buffer.from(spec.key.hex, 'hex')) : spec.key.utf8;
const options = { key };
if (spec.ttlSeconds !== undefined) options.ttlSeconds = spec.ttlSeconds;
if (spec.bindField !== undefined && spec.bindField !== null) {
  options.bind = (ctx) => String(ctx[spec.bindField]);
}
const codec = createRequestStateCodec(options);

const realNow = Date.now;
async function atTime(now, fn) {
  if (now === undefined || now === null) return fn();
  Date.now = () => Math.round(now * 1000);
  try {
    return await fn();
  } finally {
    Date.now = realNow;
  }
}

const results = [];
for (const op of spec.ops) {
  try {
    if (op.op === 'mint') {
      const token = await atTime(op.now, () => codec.mint(op.payload, op.ctx));
      results.push({ ok: true, token });
    } else if (op.op === 'verify') {
      const payload = await atTime(op.now, () => codec.verify(op.token, op.ctx));
      results.push({ ok: true, payload: payload === undefined ? null : payload });
    } else {
      results.push({ ok: false, error: `unknown op ${op.op}` });
    }
  } catch (err) {
    results.push({ ok: false, error: err instanceof Error ? err.message : String(err), name: err?.name });
  }
}
process.stdout.write(JSON.stringify({ sdkVersion: pkg.version, results }));
