# Sourced by scripts/test and scripts/test-on: install the Node packages of the TypeScript
# interoperability tests (tests/node, `npm ci`) and of the TypeScript package (ts/, `npm ci`)
# when node and npm exist; without them those tests are skipped with a message.
# `. scripts/_node.sh if-missing` keeps an existing install.
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1 || [ ! -f tests/node/package.json ]; then
  echo "scripts: node/npm not found; the TypeScript interoperability tests will be skipped" >&2
else
  for _node_dir in tests/node ts; do
    if [ -f "$_node_dir/package.json" ] && { [ "${1:-}" != if-missing ] || [ ! -d "$_node_dir/node_modules" ]; }; then
      (cd "$_node_dir" && npm ci --silent --no-audit --no-fund)
    fi
  done
  unset _node_dir
fi
