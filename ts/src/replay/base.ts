/**
 * What a codec needs from a replay store: one atomic "first time?" per token id.
 *
 * `consume(key, retentionSeconds)` records `key` if it is new and answers true, answers
 * false if it was already there, and throws (ReplayStoreError or anything else) when it
 * cannot answer; the codec then refuses the token unconsumed (`store_unavailable`). The
 * retention is measured on the store's own clock from when it records the key, so the
 * clocks of the application servers never shorten it. A non-positive or non-finite
 * retention is refused.
 */

import { ReplayStoreError } from "../errors.js";

export interface ReplayStore {
  /** A short name for logs and errors: "memory", "redis", "postgres". */
  readonly kind: string;
  consume(key: string, retentionSeconds: number): Promise<boolean>;
  close?(): Promise<void>;
}

export function checkRetention(retentionSeconds: number): void {
  if (!(typeof retentionSeconds === "number" && Number.isFinite(retentionSeconds) && retentionSeconds > 0)) {
    throw new ReplayStoreError(`refusing to remember a token for ${retentionSeconds} seconds: the retention must be positive and finite`);
  }
}
