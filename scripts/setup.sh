#!/usr/bin/env bash
# Create .venv (once) and install the course into it with the lab, grading and test extras.
# torch is installed first only when the venv lacks it: the CPU build on a machine without an
# NVIDIA GPU (the PyTorch CPU index; pip's own find-links serve it where that index is out of
# reach), the default build otherwise. An existing torch is never replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
stamp=.venv/.mlexp-installed
if ! "$VPY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    "$VPY" -m pip install "torch>=2.1"
  else
    cpu=https://download.pytorch.org/whl/cpu
    # torch alone from the CPU index; its small dependencies come with the package below.
    PIP_INDEX_URL=$cpu PIP_EXTRA_INDEX_URL=$cpu "$VPY" -m pip install --no-deps --retries 1 --timeout 15 "torch>=2.1"
  fi
fi
# The grader runs each student's kernel in a bubblewrap sandbox (Linux). Install it where it is
# missing and this machine can (root with apt-get); otherwise say how, once.
if [ "$(uname -s)" = Linux ] && ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) \
      || echo "setup: could not install bubblewrap; grading will refuse to run without it" >&2
  else
    echo "setup: the grader needs bubblewrap: sudo apt-get install bubblewrap (or your distribution's package)" >&2
  fi
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "$VPY" -m pip install -e ".[lab,grade,test]"
  touch "$stamp"
fi
