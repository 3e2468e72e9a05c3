#!/usr/bin/env bash
# Install what the app and its browser test need, from scratch on a fresh Debian machine:
# Streamlit + selenium into the active Python environment, Debian's chromium + chromedriver.
# No browser is downloaded by selenium or playwright: the test drives /usr/bin/chromium through
# /usr/bin/chromedriver (selenium-manager is kept offline with SE_OFFLINE=true).
# Usage: VENV=/path/to/venv bash .ci/app_setup.sh   (or with an activated environment: bash .ci/app_setup.sh)
set -euo pipefail

if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -n "${VENV:-}" ]; then PY=$VENV/bin/python
else PY=python
fi
"$PY" -m pip install --quiet "streamlit>=1.40" "selenium>=4.20"

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq chromium chromium-driver
fi

chromium --version
chromedriver --version
"$PY" -c "import streamlit, selenium; print('streamlit', streamlit.__version__, '| selenium', selenium.__version__)"
