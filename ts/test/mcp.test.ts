/**
 * protect() on a real TypeScript SDK server (@modelcontextprotocol/server 2.4.0), driven by
 * the official client (@modelcontextprotocol/client 2.4.0) over the SDK's in-memory
 * transport: a two-round tool, single use, binding, the uniform wire error, and no
 * plaintext state on the wire.
 */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Client } from "@modelcontextprotocol/client";
import { InMemoryTransport, McpServer, Server, acceptedContent, inputRequired } from "@modelcontextprotocol/server";
import { z } from "zod";

import { Binding, InvalidState, KeyRing, MemoryReplayStore, ReplayStoreError, StateCodec } from "../src/index.js";
import { protect, type Round } from "../src/mcp.js";

interface Plan { version: string; plan: string }

/** A tools/call with a requestState of the test's choosing (the params type does not list it). */
function call(client: Client, params: Record<string, unknown>) {
  return client.callTool(params as Parameters<Client["callTool"]>[0]);
}

async function serve(mode: "sign" | "encrypt" = "encrypt", plaintext = false) {
  const codec = new StateCodec(KeyRing.generate("mcp1"), { mode, replay: new MemoryReplayStore() });
  const refusals: InvalidState[] = [];
  const issued: string[] = [];
  const guard = protect(codec, { audience: "deploy-svc", onRefused: (e) => refusals.push(e) });
  const server = new McpServer({ name: "protected", version: "1.0.0" }, { requestState: guard.requestState });
  server.registerTool(
    "deploy",
    { inputSchema: z.object({ version: z.string() }) },
    guard.tool("deploy", async ({ version }: { version: string }, ctx, round: Round<Plan>) => {
      if (round.state === undefined) {
        const requestState = plaintext ? JSON.stringify({ version, plan: "p-secret" }) : round.seal({ version, plan: "p-secret" });
        issued.push(requestState);
        return inputRequired({
          inputRequests: {
            confirm: inputRequired.elicit({
              message: `Deploy ${version}?`,
              requestedSchema: { type: "object", properties: { confirm: { type: "boolean" } }, required: ["confirm"] },
            }),
          },
          requestState,
        });
      }
      const answer = acceptedContent(ctx.mcpReq.inputResponses, "confirm") as { confirm?: boolean } | undefined;
      return { content: [{ type: "text", text: `${answer?.confirm ? "deployed" : "cancelled"} ${round.state.version} (${round.state.plan}, round ${round.opened?.round})` }] };
    }),
  );
  const client = new Client({ name: "t", version: "1" }, { capabilities: { elicitation: { form: {} } }, versionNegotiation: { mode: "auto" } });
  client.setRequestHandler("elicitation/create", async () => ({ action: "accept", content: { confirm: true } }));
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  await server.connect(serverSide);
  await client.connect(clientSide);
  return { client, server, codec, refusals, issued, close: async () => { await client.close(); await server.close(); } };
}

/** A memory store that can be switched off: a store outage without killing a server process. */
class SwitchableStore extends MemoryReplayStore {
  down = false;
  override async consume(key: string, retentionSeconds: number): Promise<boolean> {
    if (this.down) throw new ReplayStoreError("switched off by the test");
    return super.consume(key, retentionSeconds);
  }
}

/** A low-level Server whose tools/call is guard.callTool: nothing turns a throw into a tool result. */
async function serveLowLevel(plaintext = false) {
  const store = new SwitchableStore();
  const codec = new StateCodec(KeyRing.generate("mcp1"), { mode: "encrypt", replay: store });
  const refusals: InvalidState[] = [];
  const issued: string[] = [];
  const guard = protect(codec, { audience: "deploy-svc", onRefused: (e) => refusals.push(e) });
  const server = new Server({ name: "protected", version: "1.0.0" }, { capabilities: { tools: {} }, requestState: guard.requestState });
  server.setRequestHandler("tools/call", guard.callTool({
    deploy: async (args, _ctx, round: Round<Plan>) => {
      if (round.state === undefined) {
        const state = { version: String(args["version"]), plan: "p-secret" };
        const requestState = plaintext ? JSON.stringify(state) : round.seal(state);
        issued.push(requestState);
        return inputRequired({ inputRequests: { confirm: inputRequired.elicit({
          message: "Deploy?", requestedSchema: { type: "object", properties: { confirm: { type: "boolean" } }, required: ["confirm"] },
        }) }, requestState });
      }
      return { content: [{ type: "text", text: `deployed ${round.state.version} (round ${round.opened?.round})` }] };
    },
  }));
  const client = new Client({ name: "t", version: "1" }, { capabilities: { elicitation: { form: {} } }, versionNegotiation: { mode: "auto" } });
  client.setRequestHandler("elicitation/create", async () => ({ action: "accept", content: { confirm: true } }));
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  await server.connect(serverSide);
  await client.connect(clientSide);
  return { client, store, refusals, issued, close: async () => { await client.close(); await server.close(); } };
}

/** The JSON-RPC error the client rejected with has this code, message and data. */
function wireError(code: number, message: string, reason: string) {
  return (e: { code?: number; message?: string; data?: unknown }) =>
    e.code === code && String(e.message).includes(message) && JSON.stringify(e.data) === JSON.stringify({ reason });
}

describe("protect() on a low-level Server: refusals are JSON-RPC errors, as in Python", () => {
  it("answers a replay -32602 and a store outage -32603, and the unconsumed token then redeems", async () => {
    const s = await serveLowLevel();
    try {
      const first = await s.client.callTool({ name: "deploy", arguments: { version: "1.2.3" } });
      assert.deepEqual(first.content, [{ type: "text", text: "deployed 1.2.3 (round 1)" }]);
      const redeemed = s.issued[0] as string;
      await assert.rejects(
        call(s.client, { name: "deploy", arguments: { version: "1.2.3" }, requestState: redeemed }),
        wireError(-32602, "Invalid or expired requestState", "invalid_request_state"),
      );
      assert.equal(s.refusals.at(-1)?.reason, "replayed");

      // A fresh round-1 token (its round 2 fails on the outage), taken from the issued list.
      s.store.down = true;
      await assert.rejects(
        s.client.callTool({ name: "deploy", arguments: { version: "2.0.0" } }),
        wireError(-32603, "retry the same request", "temporarily_unavailable"),
      );
      assert.equal(s.refusals.at(-1)?.reason, "store_unavailable");
      const pending = s.issued.at(-1) as string;
      assert.notEqual(pending, redeemed);
      s.store.down = false;
      const retried = await call(s.client, {
        name: "deploy", arguments: { version: "2.0.0" }, requestState: pending, inputResponses: { confirm: { action: "accept", content: { confirm: true } } },
      });
      assert.deepEqual(retried.content, [{ type: "text", text: "deployed 2.0.0 (round 1)" }]);
    } finally {
      await s.close();
    }
  });

  it("answers an unknown tool -32602 and a plaintext requestState -32603 with no state in it", async () => {
    const s = await serveLowLevel(true);
    try {
      await assert.rejects(
        call(s.client, { name: "undeploy", arguments: {} }),
        (e: { code?: number; message?: string }) => e.code === -32602 && String(e.message).includes("Tool undeploy not found"),
      );
      await assert.rejects(
        s.client.request({ method: "tools/call", params: { name: "deploy", arguments: { version: "1.2.3" } } }),
        (e: { code?: number; message?: string; data?: unknown }) =>
          e.code === -32603 && !JSON.stringify([e.message, e.data]).includes("p-secret"),
      );
    } finally {
      await s.close();
    }
  });

  it("answers a binding mismatch -32602 without consuming the token", async () => {
    const s = await serveLowLevel();
    try {
      s.store.down = true;
      await assert.rejects(s.client.callTool({ name: "deploy", arguments: { version: "1.2.3" } }), wireError(-32603, "retry the same request", "temporarily_unavailable"));
      s.store.down = false;
      const token = s.issued[0] as string;
      await assert.rejects(
        call(s.client, { name: "deploy", arguments: { version: "6.6.6" }, requestState: token }),
        wireError(-32602, "Invalid or expired requestState", "invalid_request_state"),
      );
      assert.equal(s.refusals.at(-1)?.reason, "binding_mismatch");
      const right = await call(s.client, {
        name: "deploy", arguments: { version: "1.2.3" }, requestState: token, inputResponses: { confirm: { action: "accept", content: { confirm: true } } },
      });
      assert.deepEqual(right.content, [{ type: "text", text: "deployed 1.2.3 (round 1)" }]);
    } finally {
      await s.close();
    }
  });
});

describe("protect() on a TypeScript SDK server", () => {
  it("runs a two-round tool with the official client; the state on the wire is sealed", async () => {
    const s = await serve();
    try {
      const result = await s.client.callTool({ name: "deploy", arguments: { version: "1.2.3" } });
      assert.deepEqual(result.content, [{ type: "text", text: "deployed 1.2.3 (p-secret, round 1)" }]);
      assert.equal(s.issued.length, 1);
      assert.ok(s.issued[0]?.startsWith("sc1e."));
      assert.ok(!Buffer.from(s.issued[0]!.slice(5), "base64url").includes(Buffer.from("p-secret")));
      assert.deepEqual(s.refusals, []);
    } finally {
      await s.close();
    }
  });

  it("refuses a replayed round; a forged token gets the SDK's -32602 before the handler runs", async () => {
    const s = await serve("sign");
    try {
      await s.client.callTool({ name: "deploy", arguments: { version: "1.2.3" } });
      const token = s.issued[0] as string;
      const replay = await call(s.client, { name: "deploy", arguments: { version: "1.2.3" }, requestState: token });
      assert.deepEqual(replay, { content: [{ type: "text", text: "Invalid or expired requestState" }], isError: true });
      assert.deepEqual(s.refusals.map((e) => e.reason), ["replayed"]);
      // The second-to-last character carries six bits of the MAC whatever the length: changing it
      // always changes the token's bytes (the last one may be partly padding).
      const forged = token.slice(0, -2) + (token.at(-2) === "A" ? "B" : "A") + token.slice(-1);
      assert.notEqual(forged, token);
      await assert.rejects(
        call(s.client, { name: "deploy", arguments: { version: "1.2.3" }, requestState: forged }),
        (e: { code?: number; message?: string; data?: unknown }) =>
          e.code === -32602 && /Invalid or expired requestState/.test(String(e.message)) &&
          JSON.stringify(e.data) === JSON.stringify({ reason: "invalid_request_state" }),
      );
      assert.equal(s.refusals.at(-1)?.reason, "tampered");
    } finally {
      await s.close();
    }
  });

  it("binds the token to the tool's arguments; a refused round burns nothing", async () => {
    const s = await serve();
    try {
      // The adapter's binding is the Python library's default: principal, audience, method, tool, arguments.
      const binding = new Binding({ principal: null, audience: "deploy-svc", method: "tools/call", target: "deploy", arguments: { version: "1.2.3" } });
      const token = s.codec.seal(JSON.stringify({ version: "1.2.3", plan: "p-secret" }), binding);
      const moved = await call(s.client, { name: "deploy", arguments: { version: "9.9.9" }, requestState: token });
      assert.equal(moved.isError, true);
      assert.equal(s.refusals.at(-1)?.reason, "binding_mismatch");
      const right = await call(s.client, {
        name: "deploy", arguments: { version: "1.2.3" }, requestState: token, inputResponses: { confirm: { action: "accept", content: { confirm: true } } },
      });
      assert.deepEqual(right.content, [{ type: "text", text: "deployed 1.2.3 (p-secret, round 1)" }]);
    } finally {
      await s.close();
    }
  });

  it("never lets a plaintext requestState reach the client", async () => {
    const s = await serve("encrypt", true);
    try {
      const result = await s.client.request({ method: "tools/call", params: { name: "deploy", arguments: { version: "1.2.3" } } });
      assert.equal((result as { isError?: boolean }).isError, true);
      assert.ok(!JSON.stringify(result).includes("p-secret"));
      assert.equal((result as { requestState?: string }).requestState, undefined);
    } finally {
      await s.close();
    }
  });
});

