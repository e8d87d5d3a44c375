# statecodec rotation job (and `statecodec keys retire`) with a keyring document in KV v2.
#
# It reads the document and writes a new version with check-and-set (cas), so two runs
# at once cannot both add a key. It cannot delete or destroy versions, nor touch any
# other path. `statecodec keys init` (the first write, cas=0) needs "create" as well.
#
# Replace "secret" (the KV v2 mount) and "statecodec/mcp-state" (the path) with yours.
# Load: bao policy write statecodec-rotate-kv docs/policies/statecodec-rotate-kv.hcl

path "secret/data/statecodec/mcp-state" {
  capabilities = ["read", "create", "update"]
}
