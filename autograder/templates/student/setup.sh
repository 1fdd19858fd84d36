#!/usr/bin/env bash
# Create .venv (once) and install the course library mlexp with JupyterLab and the self-check.
# torch is installed first only when the venv lacks it: on Linux without an NVIDIA GPU the CPU
# build (a few hundred MB instead of several GB), elsewhere pip's default. An existing torch is
# never replaced.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
if ! "$VPY" -c "import torch" 2>/dev/null; then
  if [ "$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1; then
    "$VPY" -m pip install --index-url https://download.pytorch.org/whl/cpu "torch>=2.1"
  else
    "$VPY" -m pip install "torch>=2.1"
  fi
fi
if [ ! -f .venv/.mlexp-installed ] || [ pyproject.toml -nt .venv/.mlexp-installed ]; then
  echo "setup: installing the course library into .venv (the first time takes a few minutes)"
  "$VPY" -m pip install --quiet -e ".[lab,check]"
  touch .venv/.mlexp-installed
fi
