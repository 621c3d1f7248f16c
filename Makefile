# est: the two commands of the README are `make demo` and `make test`. Both install
# what they need first (scripts/setup.sh is a no-op when everything is present).

CARGO ?= cargo
# llvm-sys finds LLVM 19 here (Debian's llvm-19-dev).
export LLVM_SYS_191_PREFIX ?= /usr/lib/llvm-19

.PHONY: all setup build demo test fmt clippy check-llvm bench fuzz docs

all: build

setup:
	@bash scripts/setup.sh

build: setup
	$(CARGO) build --release

# The main job. Until the runtime exists: check every example on both targets.
demo: build
	@for f in examples/*.est; do \
	  for t in host wafer; do \
	    echo "== estc check $$f --target $$t"; \
	    ./target/release/estc check $$f --target $$t || exit 1; \
	  done; \
	done
	@echo "== the train graph of examples/mnist_cnn.est (wafer):"
	@./target/release/estc check examples/mnist_cnn.est --target wafer --mode train --emit ir | head -60
	@echo "== and a program with mistakes, as a user sees them:"
	@./target/release/estc check tests/ui/multiple/several_errors.est; test $$? -eq 1

# Every check: formatting, lints (warnings are errors), the LLVM feature builds, and the
# whole test suite.
test: setup fmt clippy check-llvm
	$(CARGO) test

fmt:
	$(CARGO) fmt --check

clippy:
	$(CARGO) clippy --all-targets -- -D warnings

check-llvm:
	$(CARGO) check --features llvm

bench: setup
	$(CARGO) bench --bench check

# Fuzz the parser and the checker (needs the nightly toolchain and cargo-fuzz).
fuzz:
	mkdir -p fuzz/corpus/check
	cd fuzz && $(CARGO) +nightly fuzz run check corpus/check seeds -- -max_total_time=$${FUZZ_SECS:-600} -timeout=10

# Regenerate the diagnostics catalogue from the compiler's table.
docs: build
	./target/release/estc explain --markdown > docs/diagnostics.md
