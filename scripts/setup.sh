#!/usr/bin/env bash
# Installs what est needs on a Debian 12 machine: LLVM 19's development packages for the
# host backend (inkwell, behind the `llvm` cargo feature), and Neovim, for `make test`'s
# check of the Neovim setup (editors/nvim/test.sh). Idempotent: when everything is
# present it installs nothing and touches nothing.
set -euo pipefail

packages=(llvm-19-dev libpolly-19-dev libzstd-dev neovim)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=""
if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo_cmd apt-get update -qq
$sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
