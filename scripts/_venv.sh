# Sourced by scripts/demo and scripts/test: make .venv (Python >= 3.11) and install Ratchet.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RATCHET_VENV:-$ROOT/.venv}"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in python3.11 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; raise SystemExit(sys.version_info < (3, 11))' 2>/dev/null; then
      PY="$candidate"; break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "error: Ratchet needs Python >= 3.11 on PATH (or set PYTHON=/path/to/python3.11)" >&2
  exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating virtualenv $VENV with $PY" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.ratchet-installed-$1"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
  echo "installing Ratchet ($1) into $VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[$1]"
  touch "$STAMP"
fi
