#!/usr/bin/env bash
# The main job on the embedded default: install into .venv, capture the shipped sample
# trajectories with the bundled SmolLM2-135M-Instruct, and write runs/demo/report.html.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "demo: installing attnprobe into .venv (a few minutes the first time; each step is named below)"
bash scripts/install.sh .venv dev,app
echo "demo: capturing the shipped sample trajectories with the bundled model into runs/demo"
.venv/bin/attnprobe demo --out runs/demo "$@"
