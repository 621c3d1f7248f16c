#!/usr/bin/env bash
# Installs what est needs on a Debian 12 machine: LLVM 19's development packages for the
# host backend (inkwell, behind the `llvm` cargo feature), Open MPI's development
# packages for training across processes (rsmpi, behind the `mpi` cargo feature; bindgen
# needs libclang), Neovim, for `make test`'s
# check of the Neovim setup (editors/nvim/test.sh), and the virtualenv bench/.venv with
# the pinned Python peers the tests run (bench/requirements-test.txt: onnx and
# onnxruntime, which check every exported model). Idempotent: when everything is
# present it installs nothing and touches nothing.
set -euo pipefail

packages=(llvm-19-dev libpolly-19-dev libzstd-dev neovim python3-venv libopenmpi-dev openmpi-bin libclang-dev)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The tests' Python peers, at their pinned versions (pip is not run when they are).
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo_root/bench/.venv"
requirements="$repo_root/bench/requirements-test.txt"
pinned() {
  "$venv/bin/python" - "$requirements" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, want = line.split("==")
        if version(name) != want:
            sys.exit(1)
PY
}
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  echo "setup: creating $venv"
  "${PYTHON:-python3}" -m venv --clear "$venv"
fi
if ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: $venv has Python $("$venv/bin/python" -V 2>&1); the pinned numpy needs 3.11 or newer (PYTHON=python3.11 scripts/setup.sh after removing it)" >&2
  exit 1
fi
if ! pinned; then
  echo "setup: installing bench/requirements-test.txt into $venv"
  "$venv/bin/python" -m pip install --quiet -r "$requirements"
fi
