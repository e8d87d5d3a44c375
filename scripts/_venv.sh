# Sourced by scripts/test and scripts/demo: make sure .venv exists with the package and
# the extras named in $1 (e.g. "dev" or "mcp"). Needs only python3 >= 3.11, no root.
set -euo pipefail
PY=${PYTHON:-python3}
VENV=${STATECODEC_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[$1]"
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
export PATH="$VENV/bin:$PATH"
