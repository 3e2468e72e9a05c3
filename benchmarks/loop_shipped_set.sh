#!/usr/bin/env bash
# The tables of docs/loop.md ("What a 135M model can show"): both scaffolds on the shipped question set with
# the bundled model, then the attention side, and the small result files copied into docs/results/ so every
# number in docs/loop.md can be recomputed from the repository (study.json / attention.json hold them all).
#
#   bash benchmarks/loop_shipped_set.sh [RUNS_DIR]      # default runs/loop-docs (issue 37's files: ircot 2 min,
#                                                       # seed002 about 20 min on 2 cores)
#
# The options are those of the tables before issue 26 (32 new tokens, 3 turns, greedy; seed002 top-k 3), so
# old and new can be compared row by row.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-runs/loop-docs}
AP=${ATTNPROBE:-attnprobe}
Q=trajectories/questions_loop.jsonl
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}   # the two studies run side by side, one core each
( $AP -q study interference "$Q" --scaffold ircot --ircot-form chat --policy none --policy ircot:o --policy ircot:oq \
      --policy ircot:oqp --policy refine:bm25:3 --max-new-tokens 32 --max-turns 3 --episodes-per-batch 40 \
      --capture-in-loop --out "$RUNS/ircot" \
  && $AP -q study attention "$RUNS/ircot" ) &
ircot=$!
( $AP -q study interference "$Q" --scaffold seed002 --preset cpu --top-k 3 --policy none --policy mask:1 \
      --policy mask-obs:1 --max-new-tokens 32 --max-turns 3 --episodes-per-batch 24 --out "$RUNS/seed002" \
  && $AP -q study attention "$RUNS/seed002" ) &
seed002=$!
wait $ircot; wait $seed002
for s in ircot seed002; do
  dest=docs/results/loop-$s
  mkdir -p "$dest"
  cp "$RUNS/$s/study.json" "$RUNS/$s/study.md" "$RUNS/$s/attention.json" "$RUNS/$s/attention.md" "$dest/"
done
echo "copied to docs/results/loop-ircot and docs/results/loop-seed002"
