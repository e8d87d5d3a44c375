# statecodec service (every MCP server instance): read ONE transit key, nothing else.
#
# The service exports the key's versions and does all cryptography locally; it can
# neither rotate nor reconfigure the key, nor export any other key. Tokens that log in
# with AppRole or Kubernetes also get Vault's "default" policy, which allows
# auth/token/renew-self and lookup-self (used for renewal); keep it attached.
#
# Replace "transit" (the mount) and "mcp-state" (the key) with yours.
# Load: bao policy write statecodec-service docs/policies/statecodec-service.hcl

# Metadata: versions, creation times (promotion timing), min_decryption_version.
path "transit/keys/mcp-state" {
  capabilities = ["read"]
}

# The secrets, every version >= min_decryption_version. Only the export type the key
# uses: encryption-key for chacha20-poly1305 / aes256-gcm96 keys.
path "transit/export/encryption-key/mcp-state" {
  capabilities = ["read"]
}

# For a key of type hmac, grant this instead of the path above:
# path "transit/export/hmac-key/mcp-state" {
#   capabilities = ["read"]
# }
