/**
 * A protect()ed TypeScript SDK server and the official client, in one process, for the
 * Python suite's adapter interoperability test (tests/ts/test_ts_adapter.py). Reads on stdin
 *
 *   {"keyring": {...}, "mode": "encrypt", "audience": "deploy-svc", "server": "mcp" | "low-level",
 *    "calls": [{"arguments": {...}, "requestState": "sc1e..." | null, "next": <JSON state>}]}
 *
 * "mcp" registers the tool on an McpServer through guard.tool, "low-level" serves it from a
 * low-level Server's tools/call through guard.callTool.
 *
 * Each call is one tools/call of the tool "deploy": the protected handler answers, as its
 * text content, {"state": <the verified state or null>, "round": n, "sealed": round.seal(next)}
 * (the next round's token, for the Python side to open), or the call is refused:
 * {"refused": reason, "wire": what the client saw}.
 */

import { readFileSync } from "node:fs";

import { Client } from "@modelcontextprotocol/client";
import { InMemoryTransport, McpServer, Server } from "@modelcontextprotocol/server";
import { z } from "zod";

import { InvalidState, KeyRing, MemoryReplayStore, StateCodec, type Mode } from "../src/index.js";
import { protect, type Round } from "../src/mcp.js";

type Json = Record<string, unknown>;
const spec = JSON.parse(readFileSync(0, "utf8")) as Json;
const codec = new StateCodec(KeyRing.fromObject(spec["keyring"]), { mode: spec["mode"] as Mode, replay: new MemoryReplayStore() });
let refused: InvalidState | null = null;
let next: unknown = null;
const guard = protect(codec, { audience: spec["audience"] as string, onRefused: (e) => { refused = e; } });
const deploy = async (_args: unknown, _ctx: unknown, round: Round<unknown>) => {
  const text = JSON.stringify({ state: round.state ?? null, round: round.opened?.round ?? null, sealed: round.seal(next) });
  return { content: [{ type: "text" as const, text }] };
};
let server: McpServer | Server;
if (spec["server"] === "low-level") {
  server = new Server({ name: "ts-adapter", version: "1" }, { capabilities: { tools: {} }, requestState: guard.requestState });
  server.setRequestHandler("tools/call", guard.callTool({ deploy }));
} else {
  server = new McpServer({ name: "ts-adapter", version: "1" }, { requestState: guard.requestState });
  server.registerTool("deploy", { inputSchema: z.object({ version: z.string() }) }, guard.tool("deploy", deploy));
}
const client = new Client({ name: "adapter-test", version: "1" }, { versionNegotiation: { mode: "auto" } });
const [a, b] = InMemoryTransport.createLinkedPair();
await server.connect(b);
await client.connect(a);
const results: Json[] = [];
for (const call of spec["calls"] as Json[]) {
  refused = null;
  next = call["next"] ?? null;
  const params: Json = { name: "deploy", arguments: call["arguments"] };
  if (typeof call["requestState"] === "string") params["requestState"] = call["requestState"];
  try {
    const answer = await client.callTool(params as Parameters<Client["callTool"]>[0]) as Json;
    if (refused !== null) results.push({ refused: (refused as InvalidState).reason, wire: answer });
    else results.push(JSON.parse(((answer["content"] as Json[])[0] as Json)["text"] as string) as Json);
  } catch (error) {
    const e = error as { code?: number; message?: string; data?: unknown };
    results.push({ refused: refused === null ? "?" : (refused as InvalidState).reason, wire: { code: e.code, message: e.message, data: e.data } });
  }
}
await client.close();
await server.close();
process.stdout.write(JSON.stringify({ results }));
