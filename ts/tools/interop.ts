/**
 * The TypeScript side of the Python suite's interoperability tests (tests/ts/): reads one
 * JSON batch on stdin, runs each operation with this package, writes the results as JSON.
 *
 *   {"keyring": {...}, "codec": {"mode": "encrypt", "ttl": 600, ...}, "now": 1750000000.5,
 *    "ops": [{"op": "seal", "payload_hex": "..", "binding": {...}, "ttl": 60,
 *             "parent": {"flow_id": "..", "round": 1, "flow_started_at": 1}, "retry_after": 2},
 *            {"op": "open", "token": "sc1e...", "binding": {...}},
 *            {"op": "unseal", "token": "sc1e...", "binding": {...}},
 *            {"op": "canonical", "value": ...},
 *            {"op": "plan", "keyring": {...}, "now": 1750000000, "timeline": {"refreshInterval": 30, ...}},
 *            {"op": "env", "name": "VAR"},
 *            {"op": "vault", "kind": "transit" | "kv", "mount": "transit", "name" | "path": .., "options": {...}}],
 *    "store": {"kind": "memory"} | {"kind": "redis", "url": "redis://...", "prefix": .., "wait": 1, "waitTimeout": 0.3}
 *             | {"kind": "postgres", "url": "postgresql://...", "table": .., "timeout": 1}}
 *
 * "open" checks without consuming; "unseal" consumes in the store (single use).
 *
 * A binding is {"principal", "audience", "method", "target", "arguments" or
 * "argument_digest" (hex), "extra"}; null means none.
 */

import { readFileSync } from "node:fs";

import {
  Binding, canonicalJson, envSource, InvalidState, KeyRing, MemoryReplayStore, StateCodec, Timeline,
  vaultKvSource, vaultTransitSource,
  type CodecOptions, type OpenedState, type ReplayStore, type TimelineSettings, type VaultOptions,
} from "../src/index.js";
import { PostgresReplayStore } from "../src/replay/postgres.js";
import { RedisReplayStore } from "../src/replay/redis.js";

type Json = Record<string, unknown>;

function binding(doc: Json | null | undefined): Binding | null {
  if (doc === null || doc === undefined) return null;
  const digest = doc["argument_digest"] as string | null | undefined;
  return new Binding({
    principal: doc["principal"] as string | null,
    audience: doc["audience"] as string | null,
    method: doc["method"] as string | null,
    target: doc["target"] as string | null,
    ...("arguments" in doc ? { arguments: doc["arguments"] } : {}),
    argumentDigest: digest ? new Uint8Array(Buffer.from(digest, "hex")) : null,
    extra: (doc["extra"] as Record<string, string> | undefined) ?? {},
  });
}

function opened(state: OpenedState): Json {
  return {
    payload_hex: Buffer.from(state.payload).toString("hex"),
    kid: state.kid,
    issued_at: state.issuedAt,
    expires_at: state.expiresAt,
    token_id: state.tokenId,
    mode: state.mode,
    flow_id: state.flowId,
    round: state.round,
    flow_started_at: state.flowStartedAt,
    not_before: state.notBefore,
  };
}

async function run(op: Json, codec: StateCodec): Promise<Json> {
  try {
    switch (op["op"]) {
      case "seal": {
        const parent = op["parent"] as Json | undefined;
        const token = codec.seal(new Uint8Array(Buffer.from(op["payload_hex"] as string, "hex")), binding(op["binding"] as Json), {
          ...(op["ttl"] !== undefined ? { ttl: op["ttl"] as number } : {}),
          ...(op["retry_after"] !== undefined ? { retryAfter: op["retry_after"] as number } : {}),
          ...(parent ? {
            parent: { flowId: parent["flow_id"], round: parent["round"], flowStartedAt: parent["flow_started_at"] } as OpenedState,
          } : {}),
        });
        return { token };
      }
      case "open":
        return opened(codec.open(op["token"] as string, binding(op["binding"] as Json)));
      case "unseal":
        return opened(await codec.unseal(op["token"] as string, binding(op["binding"] as Json)));
      case "plan": {
        const plan = new Timeline(op["timeline"] as TimelineSettings).plan(KeyRing.fromObject(op["keyring"]), op["now"] as number);
        return { ring: plan.ring.toObject(), next_promotion: plan.nextPromotion };
      }
      case "vault": {
        const source = op["kind"] === "transit"
          ? vaultTransitSource(op["mount"] as string, op["name"] as string, op["options"] as VaultOptions)
          : vaultKvSource(op["mount"] as string, op["path"] as string, op["options"] as VaultOptions);
        return { ring: (await source()).toObject() };
      }
      case "env":
        return { ring: (await envSource(op["name"] as string)()).toObject() };
      case "canonical":
        return { canonical: canonicalJson(op["value"]) };
      default:
        return { error: `unknown op ${String(op["op"])}` };
    }
  } catch (exc) {
    if (exc instanceof InvalidState) return { reason: exc.reason, detail: exc.detail };
    return { error: `${(exc as Error).name}: ${(exc as Error).message}` };
  }
}

function store(doc: Json | undefined): ReplayStore | null {
  if (doc === undefined) return null;
  if (doc["kind"] === "memory") return new MemoryReplayStore();
  if (doc["kind"] === "redis") {
    const { url, ...options } = doc;
    delete options["kind"];
    return new RedisReplayStore(url as string, options);
  }
  if (doc["kind"] === "postgres") {
    const { url, ...options } = doc;
    delete options["kind"];
    return new PostgresReplayStore(url as string, options);
  }
  throw new Error(`unknown store ${String(doc["kind"])}`);
}

const spec = JSON.parse(readFileSync(0, "utf8")) as Json;
const now = spec["now"] as number | undefined;
const replay = store(spec["store"] as Json | undefined);
const codec = new StateCodec(KeyRing.fromObject(spec["keyring"]), {
  ...(spec["codec"] as CodecOptions | undefined),
  ...(now !== undefined ? { clock: () => now } : {}),
  replay,
});
const results: Json[] = [];
for (const op of spec["ops"] as Json[]) results.push(await run(op, codec));
await replay?.close?.();
process.stdout.write(JSON.stringify({ results }));
