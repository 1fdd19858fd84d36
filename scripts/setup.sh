#!/usr/bin/env bash
# Create .venv (once) and install the course into it. One argument says how much:
#   grade   the course library (mlexp, ./pyproject.toml) and the grader (mlexp-autograder,
#           autograder/pyproject.toml): enough to grade, check, build and run lessons from the
#           command line (`make grade`, `make lessons`)
#   lab     adds mlexp's lab extra: JupyterLab and ipywidgets (`make lab`)
#   book    grade's packages and the grader's book extra: Sphinx, myst-nb, sphinx-book-theme,
#           jupyter-cache (`make book`)
#   test    (the default) adds the grader's test extra too: pytest, triton, playwright, and the
#           book extra (`make test`)
# torch is installed first only when the venv lacks it: the CPU build (torch==$TORCH_VERSION, from
# the PyTorch CPU index; pip's own find-links serve it where that index is out of reach) on a
# machine without an NVIDIA GPU, the default build otherwise. An existing torch is never replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
level=${1:-test}
case "$level" in
  grade) packages=(-e . -e ./autograder) ;;
  lab) packages=(-e ".[lab]" -e ./autograder) ;;
  book) packages=(-e . -e "./autograder[book]") ;;
  test) packages=(-e ".[lab,check]" -e "./autograder[test]") ;;
  *) echo "setup: unknown level '$level' (grade, lab, book or test)" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
# pip's notes about this machine's own package folders (a configured local index without a
# package's folder) say nothing is wrong: they are left out of what a newcomer reads.
quiet_pip() { "$VPY" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
if ! "$VPY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "setup: installing PyTorch with CUDA (an NVIDIA GPU is present; about 2-3 GB to download)"
    quiet_pip install --progress-bar off "torch>=2.1"
  else
    cpu=https://download.pytorch.org/whl/cpu
    echo "setup: installing PyTorch $TORCH_VERSION, CPU build (about 190 MB to download, 750 MB in .venv)" \
      "from $cpu, or from pip's local wheels when that index is out of reach"
    # torch alone from the CPU index (the only index pip looks in for it, no retries: offline, pip
    # goes straight to its find-links); its small dependencies come with the package below.
    PIP_INDEX_URL=$cpu PIP_EXTRA_INDEX_URL=$cpu quiet_pip install --quiet --progress-bar off --no-deps \
      --retries 0 --timeout 15 "torch==$TORCH_VERSION"
    # (torch's own dependencies come later, so this asks pip's records rather than importing it)
    "$VPY" -c "import importlib.metadata as m; m.version('torch')" 2>/dev/null \
      || { echo "setup: PyTorch did not install (see pip's message above)" >&2; exit 1; }
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
# One stamp per level; each level includes the ones before it (grade < lab < test; grade < book < test). Install again
# when either pyproject.toml is newer than the stamp.
fresh() { [ -f ".venv/.mlexp-installed-$1" ] && [ ! pyproject.toml -nt ".venv/.mlexp-installed-$1" ] \
  && [ ! autograder/pyproject.toml -nt ".venv/.mlexp-installed-$1" ]; }
case "$level" in
  grade) fresh grade || fresh lab || fresh test ;;
  lab) fresh lab || fresh test ;;
  book) fresh book || fresh test ;;
  test) fresh test ;;
esac && exit 0
case "$level" in
  grade) size="numpy, matplotlib, nbgrader, nbclient: about 250 MB" ;;
  lab) size="grade's packages and JupyterLab: about 350 MB" ;;
  book) size="grade's packages and Sphinx, myst-nb: about 300 MB" ;;
  test) size="JupyterLab, Sphinx, pytest, playwright (165 MB) and triton (1 GB): about 1.8 GB" ;;
esac
echo "setup: installing the course for '$level' into .venv ($size; the first time takes a few minutes)"
quiet_pip install --quiet --progress-bar off "${packages[@]}"
echo "setup: .venv ready for '$level' after ${SECONDS} s"
touch ".venv/.mlexp-installed-$level"
