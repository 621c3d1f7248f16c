#!/usr/bin/env bash
# Checks the Neovim setup (editors/nvim/lua/est.lua) headless with the nvim on the
# PATH: opens a .est file with an unknown name and checks that estc lsp's diagnostic
# reaches vim.diagnostic.get(), then a whole program and checks its inlay hints (the
# shape of a `let`). Usage: editors/nvim/test.sh [ESTC] (default
# target/debug/estc). Exits 0 when it passes, non-zero otherwise.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
estc="$(realpath "${1:-$root/target/debug/estc}")"
[ -x "$estc" ] || { echo "nvim test: no estc at $estc (cargo build first)" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/bad.est" <<'EST'
// An unknown name on line 3, column 15.
fn f(x) {
  let y = x + zzz
  y
}
EST
cat > "$tmp/good.est" <<'EST'
use std.nn.dense
use std.losses.softmax_cross_entropy
params { hidden: int = 16 }
input d() { range(64) |> map |i| (fill([4], 1.0), i) |> repeat |> batch(8, drop_remainder: true) }
model m(features: f32[B, 4], labels: i32[B]) {
  let h = dense(features, params.hidden)
  let logits = dense(h, 2)
  let loss = softmax_cross_entropy(labels, logits)
  train { minimize loss with sgd(lr: 0.1) }
}
estimator e { model = m  train_input = d() }
EST

# The output goes to a file: headless Neovim may write to the terminal.
status=0
ESTC="$estc" EST_NVIM_DIR="$here" EST_GOOD="$tmp/good.est" HOME="$tmp" XDG_CONFIG_HOME="$tmp" XDG_DATA_HOME="$tmp" \
  XDG_STATE_HOME="$tmp" XDG_CACHE_HOME="$tmp" \
  timeout 60 nvim --headless -n -i NONE -u "$here/test/init.lua" "$tmp/bad.est" \
  -c "luafile $here/test/check.lua" > "$tmp/out" 2>&1 || status=$?
cat "$tmp/out"
if [ "$status" -ne 0 ]; then
  echo "nvim test: failed (status $status)" >&2
  exit 1
fi
grep -q "nvim test: ok" "$tmp/out" || { echo "nvim test: no result" >&2; exit 1; }
