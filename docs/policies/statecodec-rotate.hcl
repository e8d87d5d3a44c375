# statecodec rotation job (`statecodec keys rotate`, cron / systemd timer / CronJob), and the
# operator's `statecodec keys list` and emergency `statecodec keys retire`.
#
# It reads the key's metadata to decide (newest version's age, creation times), adds a
# version, and retires old ones by raising min_decryption_version. It never sees key
# material: no export here (`keys list` reads the metadata only). It cannot delete or
# trim the key either.
#
# Replace "transit" (the mount) and "mcp-state" (the key) with yours.
# Load: bao policy write statecodec-rotate docs/policies/statecodec-rotate.hcl

path "transit/keys/mcp-state" {
  capabilities = ["read"]
}

path "transit/keys/mcp-state/rotate" {
  capabilities = ["update"]
}

path "transit/keys/mcp-state/config" {
  capabilities = ["update"]
}
