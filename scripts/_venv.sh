# Sourced by the scripts here: make sure a virtual environment exists with the package
# (editable), the extras named in $1 and the dependency groups named after it, e.g.
#   . scripts/_venv.sh mcp             # scripts/demo
#   . scripts/_venv.sh all dev         # scripts/test
# then put it first on PATH. Needs only python3 >= 3.11, no root.
#   PYTHON                  the interpreter that creates the venv (default python3)
#   STATECODEC_VENV         where (default .venv)
#   STATECODEC_CONSTRAINTS  a pip constraints file, e.g. to pin the lowest supported versions
#   STATECODEC_NEWEST=1     upgrade every dependency to its newest release, even in an existing venv
# Dependency groups (PEP 735, pyproject.toml) need pip >= 25.1: the venv's pip is upgraded first.
set -euo pipefail
PY=${PYTHON:-python3}
VENV=${STATECODEC_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
_venv_pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${_venv_pip[@]}" --upgrade 'pip>=25.1'
# `. scripts/_venv.sh dev` (from when dev was an extra) still works: a dependency group named
# where the extras go means every extra plus that group.
_venv_extras=$1
_venv_groups=("${@:2}")
if "$PY" -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))
sys.exit(sys.argv[1] in p["project"]["optional-dependencies"] or sys.argv[1] not in p["dependency-groups"])' "$1"; then
  echo "scripts/_venv.sh: '$1' is a dependency group: installing .[all] --group $1" >&2
  _venv_extras=all
  _venv_groups=("$@")
fi
_venv_args=(-e ".[$_venv_extras]")
for _venv_group in "${_venv_groups[@]}"; do _venv_args+=(--group "$_venv_group"); done
if [ -n "${STATECODEC_CONSTRAINTS:-}" ]; then _venv_args+=(--constraint "$STATECODEC_CONSTRAINTS"); fi
if [ -n "${STATECODEC_NEWEST:-}" ]; then _venv_args+=(--upgrade --upgrade-strategy eager); fi
"${_venv_pip[@]}" "${_venv_args[@]}"
unset _venv_pip _venv_args _venv_group _venv_groups _venv_extras
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
export PATH="$VENV/bin:$PATH"
