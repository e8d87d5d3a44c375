# statecodec service with a keyring document in KV v2: read that one document.
#
# Replace "secret" (the KV v2 mount) and "statecodec/mcp-state" (the path) with yours.
# Load: bao policy write statecodec-service-kv docs/policies/statecodec-service-kv.hcl

path "secret/data/statecodec/mcp-state" {
  capabilities = ["read"]
}
