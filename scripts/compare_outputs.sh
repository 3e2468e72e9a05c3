#!/usr/bin/env bash
# Every study's outputs on the shipped samples with one checkout, for a refactor's "byte-identical before and
# after" check (issue 39): capture, counterfactual, study masking, study interference (ircot captured in the
# loop, seed002 without) and study attention on each, ibis all, and the runner with and without a policy, on
# the bundled model. About 6 min on 2 cores.
# Usage: scripts/compare_outputs.sh CHECKOUT OUT; then python scripts/compare_outputs.py OUT_BEFORE OUT_AFTER.
# CHECKOUT needs its own .venv (scripts/install.sh) with attnprobe installed from CHECKOUT.
set -euo pipefail
C=$(cd "$1" && pwd); O=$2; AP="$C/.venv/bin/attnprobe"; T=$C/trajectories
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
rm -rf "$O"; mkdir -p "$O"; cd "$O"
head -n 2 "$T/questions_loop.jsonl" > q2.jsonl
L=(--layers 0,14,29)
( $AP -q capture "$T/long_research.jsonl" "$T/parallel_calls.jsonl" "${L[@]}" --out capture > capture.log 2>&1
  $AP -q counterfactual "$T/long_research.jsonl" "${L[@]}" --max-steps 2 --policy mask:1 --policy ircot:oq --out cf > cf.log 2>&1
  $AP -q study masking "$T/long_research.jsonl" "${L[@]}" --max-steps 2 --out masking > masking.log 2>&1
  $AP -q ibis all --limit 2 --max-new-tokens 48 --folder ibis > ibis.log 2>&1 ) &
a=$!
( $AP -q study interference q2.jsonl --scaffold ircot --policy none --policy mask:1 --policy ircot:oq --structured-actions \
      --max-new-tokens 32 --max-turns 2 --capture-in-loop "${L[@]}" --out loop-ircot > loop-ircot.log 2>&1
  $AP -q study attention loop-ircot "${L[@]}" > att-ircot.log 2>&1
  $AP -q study interference q2.jsonl --scaffold seed002 --preset cpu --top-k 2 --policy none --policy mask:1 \
      --max-new-tokens 32 --max-turns 2 --out loop-seed002 > loop-seed002.log 2>&1
  $AP -q study attention loop-seed002 "${L[@]}" > att-seed002.log 2>&1
  $AP -q run "$T/questions.jsonl" --limit 1 --preset baseline --max-new-tokens 48 --manager-steps 2 --worker-steps 2 \
      --out run/base.jsonl > run.log 2>&1
  $AP -q run "$T/questions.jsonl" --limit 1 --preset baseline --context-policy mask:1 --max-new-tokens 48 \
      --manager-steps 2 --worker-steps 2 --out run/mask.jsonl > run2.log 2>&1 ) &
b=$!
wait $a; wait $b
echo "compare_outputs: wrote $O"
