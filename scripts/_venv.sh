# Sourced by the scripts here: make sure a virtual environment exists with the package
# (editable), the extras named in $1 and the dependency groups named after it, e.g.
#   . scripts/_venv.sh mcp             # scripts/demo
#   . scripts/_venv.sh all dev         # scripts/test
# then put it first on PATH. Needs only python3 >= 3.11, no root.
#   PYTHON                  the interpreter that creates the venv (default python3)
#   STATECODEC_VENV         where (default .venv)
#   STATECODEC_CONSTRAINTS  a pip constraints file, e.g. to pin the lowest supported versions
# Dependency groups (PEP 735, pyproject.toml) need pip >= 25.1: the venv's pip is upgraded first.
set -euo pipefail
PY=${PYTHON:-python3}
VENV=${STATECODEC_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
_venv_pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${_venv_pip[@]}" --upgrade 'pip>=25.1'
_venv_args=(-e ".[$1]")
for _venv_group in "${@:2}"; do _venv_args+=(--group "$_venv_group"); done
if [ -n "${STATECODEC_CONSTRAINTS:-}" ]; then _venv_args+=(--constraint "$STATECODEC_CONSTRAINTS"); fi
"${_venv_pip[@]}" "${_venv_args[@]}"
unset _venv_pip _venv_args _venv_group
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
export PATH="$VENV/bin:$PATH"
