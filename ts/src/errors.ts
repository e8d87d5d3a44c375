/**
 * The exception tree, the same as the Python library's: every refusal a caller can catch
 * derives from StateCodecError, and every rejected token is one InvalidState whose
 * `reason` is one of REASONS (the same stable strings as Python, so logs and metrics of a
 * mixed fleet read alike). Neither reason nor detail ever holds key material; neither
 * goes on the MCP wire (the adapter sends the SDK's uniform -32602).
 */

export const REASONS = [
  "malformed",
  "too_large",
  "unsupported_version",
  "wrong_mode",
  "unknown_key",
  "tampered",
  "expired",
  "not_yet_valid",
  "binding_mismatch",
  "round_limit",
  "flow_expired",
  "too_early",
  "replayed",
  "store_unavailable",
  "internal_error",
] as const;

export type Reason = (typeof REASONS)[number];

export class StateCodecError extends Error {
  override name = "StateCodecError";
}

/** What names a token and its flow once its header could be read (authentic from the MAC on). */
export interface TokenIds {
  kid?: string | undefined;
  tokenId?: string | undefined;
  flowId?: string | undefined;
  round?: number | undefined;
  retryAt?: number | undefined;
}

/**
 * A requestState token was rejected. `reason` says why (one of REASONS), `detail` says
 * what exactly; `retryAt` (Unix seconds) is set for `too_early`, a retry ahead of the
 * server's pacing rather than an attack.
 */
export class InvalidState extends StateCodecError {
  override name = "InvalidState";
  readonly reason: Reason;
  readonly detail: string;
  readonly kid: string | undefined;
  readonly tokenId: string | undefined;
  readonly flowId: string | undefined;
  readonly round: number | undefined;
  readonly retryAt: number | undefined;

  constructor(reason: Reason, detail = "", ids: TokenIds = {}) {
    super(detail ? `${reason}: ${detail}` : reason);
    this.reason = reason;
    this.detail = detail;
    this.kid = ids.kid;
    this.tokenId = ids.tokenId;
    this.flowId = ids.flowId;
    this.round = ids.round;
    this.retryAt = ids.retryAt;
  }
}

/** Sealing the next round was refused: past maxRounds (`round_limit`) or maxFlowAge (`flow_expired`). */
export class FlowBudgetExceeded extends StateCodecError {
  override name = "FlowBudgetExceeded";
  readonly reason: "round_limit" | "flow_expired";
  readonly flowId: string;
  readonly round: number;

  constructor(reason: "round_limit" | "flow_expired", detail: string, flowId: string, round: number) {
    super(`${reason}: ${detail}`);
    this.reason = reason;
    this.flowId = flowId;
    this.round = round;
  }
}

/** No key can mint right now (a ring without a primary, a key source gone stale). */
export class KeyUnavailable extends StateCodecError {
  override name = "KeyUnavailable";
}

/** A replay store could not answer; the token is refused unconsumed (`store_unavailable`). */
export class ReplayStoreError extends StateCodecError {
  override name = "ReplayStoreError";
}
