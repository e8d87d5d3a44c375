/**
 * Keys from Vault or OpenBao, read as the Python library reads them (`vault-transit:` and
 * `vault-kv:`), for a KeyManager: `KeyManager.start(vaultTransitSource(...))`.
 *
 * - transit: every version of an exportable transit key is one key, kid `<name>-v<N>` (or
 *   `v<N>` when that is no valid kid), dated by the key's metadata; versions below
 *   `min_decryption_version` are retired by Vault and not exported. The ring has no primary:
 *   the key manager's timeline chooses it. Cryptography stays local (the secrets are exported
 *   once per refresh), so minting never waits on Vault.
 * - KV v2: the secret's data is the key ring document itself, or `{"keyring": "<JSON text>"}`.
 *
 * Authentication: a token, or AppRole (role id and secret id), logging in again before the
 * token's lease runs out and after a 403 (a revoked or expired token).
 */

import { StateCodecError } from "./errors.js";
import { Key, KeyRing, MIN_SECRET_BYTES } from "./keys.js";
import { validKid } from "./format.js";
import type { KeySource } from "./kms.js";

export interface VaultOptions {
  /** The server, e.g. "https://vault.internal:8200" (default: VAULT_ADDR or BAO_ADDR). */
  address?: string;
  /** A token (default: VAULT_TOKEN or BAO_TOKEN), unless AppRole is configured. */
  token?: string;
  /** AppRole login (default: VAULT_ROLE_ID / VAULT_SECRET_ID, mount VAULT_APPROLE_MOUNT or "approle"). */
  roleId?: string;
  secretId?: string;
  approleMount?: string;
  /** Enterprise/OpenBao namespace (default: VAULT_NAMESPACE). */
  namespace?: string;
  /** Seconds one request may take (default 10). */
  timeout?: number;
}

/** A Vault/OpenBao key source could not answer (the KeyManager keeps its last good ring). */
export class VaultError extends StateCodecError {
  override name = "VaultError";
}

class VaultSession {
  readonly address: string;
  readonly #options: VaultOptions;
  #token: string | null;
  #renewAt = Infinity; // monotonic seconds: log in again from then on (AppRole)

  constructor(options: VaultOptions) {
    const env = process.env;
    const address = options.address ?? env["VAULT_ADDR"] ?? env["BAO_ADDR"];
    if (!address) throw new VaultError("no Vault address: pass address or set VAULT_ADDR");
    this.address = address.replace(/\/+$/, "");
    this.#options = {
      ...options,
      roleId: options.roleId ?? env["VAULT_ROLE_ID"],
      secretId: options.secretId ?? env["VAULT_SECRET_ID"],
      approleMount: options.approleMount ?? env["VAULT_APPROLE_MOUNT"] ?? "approle",
      namespace: options.namespace ?? env["VAULT_NAMESPACE"],
    };
    this.#token = this.#approle ? null : (options.token ?? env["VAULT_TOKEN"] ?? env["BAO_TOKEN"] ?? null);
    if (!this.#approle && this.#token === null) throw new VaultError("no Vault token: pass token or roleId and secretId");
  }

  get #approle(): boolean {
    return Boolean(this.#options.roleId && this.#options.secretId);
  }

  async read(path: string): Promise<Record<string, unknown>> {
    if (this.#approle && (this.#token === null || performance.now() / 1000 >= this.#renewAt)) await this.#login();
    let answer = await this.#request("GET", path);
    if (answer.status === 403 && this.#approle) {
      await this.#login(); // a revoked or expired token: one fresh login, then the same read
      answer = await this.#request("GET", path);
    }
    if (answer.status === 404) throw new VaultError(`nothing at ${path} on ${this.address}`);
    if (answer.status !== 200) throw new VaultError(`${path} answered HTTP ${answer.status} on ${this.address}`);
    return answer.body;
  }

  async #login(): Promise<void> {
    const mount = this.#options.approleMount as string;
    const answer = await this.#request("POST", `auth/${mount}/login`, {
      role_id: this.#options.roleId, secret_id: this.#options.secretId,
    }, false);
    const auth = answer.body["auth"] as { client_token?: unknown; lease_duration?: unknown } | undefined;
    if (answer.status !== 200 || typeof auth?.client_token !== "string") {
      throw new VaultError(`AppRole login at auth/${mount} answered HTTP ${answer.status}`);
    }
    this.#token = auth.client_token;
    const lease = typeof auth.lease_duration === "number" && auth.lease_duration > 0 ? auth.lease_duration : Infinity;
    this.#renewAt = performance.now() / 1000 + (lease * 2) / 3; // well before the lease runs out
  }

  async #request(method: string, path: string, body?: unknown, authed = true): Promise<{ status: number; body: Record<string, unknown> }> {
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (authed && this.#token !== null) headers["x-vault-token"] = this.#token;
    if (this.#options.namespace) headers["x-vault-namespace"] = this.#options.namespace;
    const response = await fetch(`${this.address}/v1/${path}`, {
      method,
      headers,
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      signal: AbortSignal.timeout((this.#options.timeout ?? 10) * 1000),
    });
    const text = await response.text();
    let parsed: unknown = {};
    try {
      parsed = text ? JSON.parse(text) : {};
    } catch {
      throw new VaultError(`${path} answered HTTP ${response.status} with a body that is not JSON`);
    }
    return { status: response.status, body: (typeof parsed === "object" && parsed !== null ? parsed : {}) as Record<string, unknown> };
  }
}

function dataOf(body: Record<string, unknown>, what: string): Record<string, unknown> {
  const data = body["data"];
  if (typeof data !== "object" || data === null || Array.isArray(data)) throw new VaultError(`${what}: the answer has no data object`);
  return data as Record<string, unknown>;
}

/** `vault-transit:MOUNT/NAME`: the versions of an exportable transit key. */
export function vaultTransitSource(mount: string, name: string, options: VaultOptions = {}): KeySource {
  const session = new VaultSession(options);
  const firstSeen = new Map<number, number>();
  let loaded = false;
  const kid = (version: number): string => (validKid(`${name}-v${version}`) ? `${name}-v${version}` : `v${version}`);
  return async () => {
    // Metadata first: a version rotated in between is then dated "now", which only delays its promotion.
    const meta = dataOf(await session.read(`${mount}/keys/${name}`), `${mount}/keys/${name}`);
    if (meta["exportable"] !== true) {
      throw new VaultError(`transit key ${name} is not exportable; statecodec caches exported keys and does the crypto locally`);
    }
    const type = meta["type"] === "hmac" ? "hmac-key" : "encryption-key";
    const exported = dataOf(await session.read(`${mount}/export/${type}/${name}`), `${mount}/export/${type}/${name}`)["keys"];
    if (typeof exported !== "object" || exported === null) throw new VaultError("the transit export has no keys");
    const versions = Object.keys(exported).map(Number).filter(Number.isInteger).sort((a, b) => a - b);
    if (versions.length === 0) throw new VaultError("the transit key exported no versions");
    const times = new Map<number, number>();
    for (const [v, t] of Object.entries((meta["keys"] ?? {}) as Record<string, unknown>)) {
      if (Number.isInteger(t)) times.set(Number(v), t as number);
    }
    const now = Math.floor(Date.now() / 1000);
    const firstLoad = !loaded;
    loaded = true;
    const keys = versions.map((v) => {
      let created = times.get(v);
      if (created === undefined) {
        // Unknown age (hmac keys): "long ago" only for what every instance must already have.
        if (!firstSeen.has(v)) {
          const old = firstLoad && (v !== versions[versions.length - 1] || versions.length === 1);
          firstSeen.set(v, old ? 0 : now);
        }
        created = firstSeen.get(v) as number;
      }
      const secret = new Uint8Array(Buffer.from(String((exported as Record<string, unknown>)[String(v)]), "base64"));
      if (secret.length < MIN_SECRET_BYTES) throw new VaultError(`version ${v} is a ${secret.length}-byte key; statecodec needs ${MIN_SECRET_BYTES}`);
      return new Key(kid(v), secret, created);
    });
    return new KeyRing(keys); // no primary: the key manager's timeline decides
  };
}

/** `vault-kv:MOUNT/PATH`: a key ring document in KV v2. */
export function vaultKvSource(mount: string, path: string, options: VaultOptions = {}): KeySource {
  const session = new VaultSession(options);
  return async () => {
    const answer = dataOf(await session.read(`${mount}/data/${path}`), `${mount}/data/${path}`);
    const data = (answer["data"] ?? {}) as Record<string, unknown>;
    return typeof data["keyring"] === "string" ? KeyRing.fromJSON(data["keyring"]) : KeyRing.fromObject(data);
  };
}
