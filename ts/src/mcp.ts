/**
 * statecodec for a TypeScript MCP SDK server, in process (`@statecodec/ts/mcp`).
 *
 *     const guard = protect(codec, { audience: "deploy-svc" });
 *     const server = new McpServer(info, { requestState: guard.requestState });
 *     server.registerTool("deploy", { inputSchema }, guard.tool("deploy", async (args, ctx, round) => {
 *       if (round.state === undefined) return inputRequired({ inputRequests, requestState: round.seal({ plan }) });
 *       ...
 *     }));
 *
 * Every round of a tool is judged like the Python boundary judges it: the SDK's
 * `requestState.verify` hook checks what needs no request (format, key, MAC or AEAD, times,
 * flow budgets) before the handler runs; the wrapped handler then checks the binding
 * (principal, audience, method, tool name, arguments: the Python library's default
 * binding) and consumes the token in the replay store, and only then runs. Whatever fails
 * is refused with -32602 "Invalid or expired requestState" (reason `invalid_request_state`),
 * a replay store outage with -32603 and a retry message (the token was not consumed); the
 * precise reason goes to `onRefused`, never to the client. `McpServer` turns what a tool
 * callback throws into an `isError` tool result, so `guard.tool` refusals reach the client in
 * that shape; `guard.callTool` serves a low-level `Server`'s tools/call, where they reach the
 * wire as these JSON-RPC errors.
 * The next round's token is sealed with `round.seal`, chained to this one and bound to the
 * same request; a handler that returns any other requestState (a plaintext one) is answered
 * with an internal error, so no unsealed state ever reaches a client.
 */

import { ProtocolError, ProtocolErrorCode, type ServerContext } from "@modelcontextprotocol/server";

import { Binding } from "./binding.js";
import type { OpenedState, SealOptions, StateCodec } from "./codec.js";
import { InvalidState } from "./errors.js";

/** The wire error of every refused state: the one the SDK's own seam sends. */
export function invalidRequestState(): ProtocolError {
  return new ProtocolError(ProtocolErrorCode.InvalidParams, "Invalid or expired requestState", {
    reason: "invalid_request_state",
  });
}

/** A replay store that could not answer: the token was not consumed, the same request may be sent again. */
export function storeUnavailable(): ProtocolError {
  return new ProtocolError(
    ProtocolErrorCode.InternalError,
    "Temporarily unavailable: retry the same request (its requestState was not consumed)",
    { reason: "temporarily_unavailable" },
  );
}

export interface ProtectOptions {
  /**
   * The authenticated principal of a request (null: none). Default: the access token's
   * `[clientId, issuer, subject]` as compact JSON, issuer and subject read from
   * `authInfo.extra.iss` / `.sub` when they are strings: the Python adapters' principal.
   */
  principal?: (ctx: ServerContext) => string | null;
  /** The audience every token is bound to (this service's name or URL); default none. */
  audience?: string | null;
  /** Told the precise reason of every refusal (for logs and metrics). */
  onRefused?: (error: InvalidState, ctx: ServerContext) => void;
}

/** What a protected handler gets for the current round. */
export interface Round<S> {
  /** The verified state of this round (the JSON the previous round sealed); undefined in round 1. */
  readonly state: S | undefined;
  /** The authenticated token fields of this round's state; undefined in round 1. */
  readonly opened: OpenedState | undefined;
  /** Seal the next round's state (any JSON value), chained to this round and bound to this request. */
  seal(state: unknown, options?: Pick<SealOptions, "retryAfter" | "ttl">): string;
}

export type ProtectedToolCallback<A, S, R> = (args: A, ctx: ServerContext, round: Round<S>) => R | Promise<R>;

/** A state the verify hook passed: opaque to everyone but the handler wrapper. */
class Pending {
  constructor(readonly token: string) {}
}

export function defaultPrincipal(ctx: ServerContext): string | null {
  const auth = ctx.http?.authInfo;
  if (auth === undefined) return null;
  const extra = (auth.extra ?? {}) as Record<string, unknown>;
  const text = (value: unknown): string | null => (typeof value === "string" ? value : null);
  return JSON.stringify([auth.clientId ?? null, text(extra["iss"]), text(extra["sub"])]);
}

export interface Protection {
  /** Pass as `ServerOptions.requestState`. */
  readonly requestState: { verify: (state: string, ctx: ServerContext) => Promise<unknown> };
  /** Wrap a `registerTool` callback for the tool `name`. */
  tool<A = Record<string, unknown>, S = unknown, R = unknown>(
    name: string, handler: ProtectedToolCallback<A, S, R>,
  ): (args: A, ctx: ServerContext) => Promise<R>;
  /**
   * A `tools/call` handler for a low-level `Server` (`server.setRequestHandler("tools/call",
   * guard.callTool({ deploy: ... }))`) serving the named callbacks: a refused state reaches
   * the wire as JSON-RPC -32602, a store outage as -32603, since no `McpServer` sits in
   * between to turn them into tool results. Arguments are bound as the client sent them.
   */
  callTool(
    handlers: Record<string, ProtectedToolCallback<Record<string, unknown>, any, unknown>>,
  ): (request: { params: { name: string; arguments?: Record<string, unknown> } }, ctx: ServerContext) => Promise<any>;
}

export function protect(codec: StateCodec, options: ProtectOptions = {}): Protection {
  const principalOf = options.principal ?? defaultPrincipal;
  const audience = options.audience ?? null;
  const refuse = (error: unknown, ctx: ServerContext): ProtocolError => {
    const invalid = error instanceof InvalidState ? error : new InvalidState("internal_error", String(error));
    options.onRefused?.(invalid, ctx);
    return invalid.reason === "store_unavailable" ? storeUnavailable() : invalidRequestState();
  };

  const verify = async (state: string, ctx: ServerContext): Promise<Pending> => {
    try {
      codec.verifyUnbound(state);
    } catch (error) {
      // Too early is judged again after the binding, which comes first (docs/format.md).
      if (!(error instanceof InvalidState && error.reason === "too_early")) {
        if (error instanceof InvalidState) options.onRefused?.(error, ctx);
        throw error;
      }
    }
    return new Pending(state);
  };

  const tool = <A, S, R>(name: string, handler: ProtectedToolCallback<A, S, R>) =>
    async (args: A, ctx: ServerContext): Promise<R> => {
      let binding: Binding;
      try {
        binding = new Binding({
          principal: principalOf(ctx),
          audience,
          method: ctx.mcpReq.method,
          target: name,
          arguments: args ?? {},
        });
      } catch (error) {
        throw refuse(error, ctx);
      }
      const pending = ctx.mcpReq.requestState();
      let opened: OpenedState | undefined;
      let state: S | undefined;
      if (pending !== undefined) {
        // Only the verify hook makes a Pending: anything else means the hook is not installed.
        if (!(pending instanceof Pending)) throw refuse(new InvalidState("internal_error", "requestState.verify is not protect()'s"), ctx);
        try {
          opened = await codec.unseal(pending.token, binding);
          state = JSON.parse(new TextDecoder().decode(opened.payload)) as S;
        } catch (error) {
          throw refuse(error, ctx);
        }
      }
      const minted = new Set<string>();
      const round: Round<S> = {
        state,
        opened,
        seal(next, sealOptions = {}) {
          const token = codec.seal(JSON.stringify(next), binding, { ...sealOptions, ...(opened ? { parent: opened } : {}) });
          minted.add(token);
          return token;
        },
      };
      const result = await handler(args, ctx, round);
      const issued = (result as { requestState?: unknown } | null)?.requestState;
      if (issued !== undefined && !(typeof issued === "string" && minted.has(issued))) {
        // Never let an unsealed (plaintext) state reach the client.
        throw new ProtocolError(ProtocolErrorCode.InternalError, "the tool returned a requestState it did not seal with round.seal");
      }
      return result;
    };

  const callTool: Protection["callTool"] = (handlers) => {
    const wrapped = new Map(Object.entries(handlers).map(([name, handler]) => [name, tool(name, handler)]));
    return async (request, ctx) => {
      const run = wrapped.get(request.params.name);
      if (run === undefined) throw new ProtocolError(ProtocolErrorCode.InvalidParams, `Tool ${request.params.name} not found`);
      return run(request.params.arguments ?? {}, ctx);
    };
  };

  return { requestState: { verify }, tool, callTool };
}
