#!/usr/bin/env bash
# The second demo: a small closed-loop study on the embedded default, then the Study page.
#
#   bash scripts/demo_loop.sh [OUT]        # default runs/demo-loop (40 s on 2 quiet cores, 2026-12-04;
#                                          # the model answers most questions at its first call)
#
# The bundled SmolLM2-135M-Instruct runs IRCoT in Search-R1's single stream (the default --ircot-form)
# on the first 4 shipped questions under three settings (none, mask:1, ircot:oq) with --structured-actions,
# so that it writes valid <search> and <answer> tags (free decoding, as the seeds decode, gives 0 retrievals
# with this model: docs/loop.md). The episodes are stepped together (--episodes-per-batch 12) with each
# episode's KV cache kept between turns, and each call's attention is captured from the generator's own
# passes (--capture-in-loop: docs/loop.md), so `study attention` prefills nothing for the recorded calls and
# only computes the tables; then the app opens on the study (Ctrl-C stops it).
# Structured actions change the agent's behaviour: these numbers are not comparable with the seeds'.
# What the model searches for decides whether anything is retrieved: the 135M model copies the prompt's
# example "<search> query </search>", which the shipped corpus does not hold, so its observations are empty.
# The demo prints, per setting, how many observations held a passage (study.md says it too), and the
# caveats say what follows from it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/demo-loop}
AP=${ATTNPROBE:-.venv/bin/attnprobe}
[ -x "$AP" ] || { echo "demo_loop: $AP not found; run scripts/install.sh (or scripts/demo.sh) first" >&2; exit 2; }
mkdir -p "$OUT"
head -n 4 trajectories/questions_loop.jsonl > "$OUT/questions.jsonl"
echo "demo_loop: the study (12 episodes stepped together) -> $OUT/study"
"$AP" study interference "$OUT/questions.jsonl" --scaffold ircot --policy none --policy mask:1 \
    --policy ircot:oq --structured-actions --episodes-per-batch 12 \
    --capture-in-loop --layers 0,14,29 --out "$OUT/study"
echo "demo_loop: $(grep -m1 '^Observations that held a passage' "$OUT/study/study.md" || echo 'no observation counts')"
echo "demo_loop: its attention side -> $OUT/study/attention.md"
"$AP" study attention "$OUT/study" --layers 0,14,29
if [ -n "${DEMO_NO_APP:-}" ]; then exit 0; fi
echo "demo_loop: the app on $OUT (Study page); Ctrl-C to stop"
exec "$AP" app --data "$OUT"
