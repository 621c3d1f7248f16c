#!/usr/bin/env bash
# Creates the benchmark virtualenv bench/.venv (if missing) and installs
# bench/requirements.txt into it: torch (CPU build when download.pytorch.org is
# reachable, otherwise PyPI's), tensorboard, numpy, scikit-learn, tensorflow-cpu.
# Idempotent: a second run finds every pin satisfied and changes nothing.
#
# Usage: scripts/setup_bench_venv.sh        (PYTHON=python3.11 to pick the interpreter)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo_root/bench/.venv"
requirements="$repo_root/bench/requirements.txt"

if [ ! -x "$venv/bin/python" ]; then
  echo "setup_bench_venv: creating $venv"
  "${PYTHON:-python3}" -m venv "$venv"
fi

# The CPU-only torch index when it is reachable (it is not on every build machine:
# then PyPI's torch, with CUDA wheels that go unused on a CPU).
extra=()
if "$venv/bin/python" -c 'import urllib.request; urllib.request.urlopen("https://download.pytorch.org/whl/cpu/", timeout=5)' 2>/dev/null; then
  extra=(--extra-index-url https://download.pytorch.org/whl/cpu)
fi
"$venv/bin/python" -m pip install --quiet "${extra[@]}" -r "$requirements"
