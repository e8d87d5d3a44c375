export { b64decode, b64encode } from "./base64url.js";
export { argumentDigest, Binding, canonicalJson, UNBOUND, type BindingFields } from "./binding.js";
export {
  DEFAULT_EXPIRY_GRACE, DEFAULT_MAX_FLOW_AGE, DEFAULT_MAX_ROUNDS, DEFAULT_MAX_SKEW, DEFAULT_MAX_TOKEN_BYTES,
  DEFAULT_NAMESPACE, DEFAULT_TTL, StateCodec,
  type CodecLogger, type CodecOptions, type Mode, type OpenedState, type SealOptions,
} from "./codec.js";
export {
  FlowBudgetExceeded, InvalidState, KeyUnavailable, REASONS, ReplayStoreError, StateCodecError, type Reason,
} from "./errors.js";
export { PREFIX_ENCRYPT, PREFIX_SIGN } from "./format.js";
export { deriveSubkey, Key, KeyRing, newKid, type KeyProvider, type KeyRingDocument } from "./keys.js";
export { type ReplayStore } from "./replay/base.js";
export { MemoryReplayStore, type MemoryStoreOptions } from "./replay/memory.js";
export {
  ENV_SECRET_KID, envSource, fileSource, KeyManager, Timeline,
  type KeyManagerOptions, type KeySource, type Plan, type TimelineSettings,
} from "./kms.js";
export { VaultError, vaultKvSource, vaultTransitSource, type VaultOptions } from "./vault.js";
