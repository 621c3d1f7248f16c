# est: the two commands of the README are `make demo` and `make test`. Both install
# what they need first (scripts/setup.sh is a no-op when everything is present).

CARGO ?= cargo
# llvm-sys finds LLVM 19 here (Debian's llvm-19-dev).
export LLVM_SYS_191_PREFIX ?= /usr/lib/llvm-19

.PHONY: all setup build demo test test-nvim nvim-check fmt clippy bench fuzz docs

all: build

setup:
	@bash scripts/setup.sh

# (with MPI: `mpirun -n N ./target/release/estc train ...` trains across ranks)
build: setup
	$(CARGO) build --release --features mpi

# The main job: train the digits MLP from scratch on the real 8x8 digits (1437 training
# images), evaluate it on the 360 held-out ones (must reach 0.95), write its
# predictions, and export it to ONNX, checked with onnxruntime. Then check every example on both targets and show a program with
# mistakes as a user sees them.
DEMO_DIR ?= target/demo/digits
# Examples using what the wafer does not lay out yet (tests/examples.rs says why).
HOST_ONLY_EXAMPLES = mobilenet resnet20 text_classifier
demo: build
	@rm -rf $(DEMO_DIR) target/demo/digits_tfrecord target/demo/cache
	@echo "== estc train examples/digits_mlp.est"
	@./target/release/estc train examples/digits_mlp.est --model-dir $(DEMO_DIR)
	@echo "== estc eval examples/digits_mlp.est (the held-out test split)"
	@./target/release/estc eval examples/digits_mlp.est --model-dir $(DEMO_DIR)
	@./target/release/estc eval examples/digits_mlp.est --model-dir $(DEMO_DIR) --message-format json \
	  | python3 -c 'import json,sys; a=json.load(sys.stdin)["accuracy"]; print("test accuracy: %.4f (needs 0.95)" % a); sys.exit(a < 0.95)'
	@echo "== estc predict examples/digits_mlp.est"
	@./target/release/estc predict examples/digits_mlp.est --model-dir $(DEMO_DIR)
	@head -c 200 $(DEMO_DIR)/predictions/predictions.jsonl; echo " ..."
	@echo "== estc export examples/digits_mlp.est (ONNX, served by onnxruntime at two batch sizes against est)"
	@./target/release/estc export examples/digits_mlp.est --model-dir $(DEMO_DIR) -o $(DEMO_DIR)/digits.onnx --verify
	@echo "== estc data convert: the digits CSVs as TFRecord shards"
	@./target/release/estc data convert --from csv examples/data/digits_train.csv --shards 2 \
	  --group pixels=p0:p63 --type pixels=float -o examples/data/tfrecord/digits_train
	@./target/release/estc data convert --from csv examples/data/digits_test.csv \
	  --group pixels=p0:p63 --type pixels=float -o examples/data/tfrecord/digits_test
	@echo "== estc perf-input examples/digits_tfrecord.est (2 input workers, interleave, parallel map, disk cache)"
	@EST_CACHE_DIR=target/demo/cache ./target/release/estc perf-input examples/digits_tfrecord.est --time 1
	@echo "== estc train and eval examples/digits_tfrecord.est"
	@EST_CACHE_DIR=target/demo/cache ./target/release/estc train examples/digits_tfrecord.est --model-dir target/demo/digits_tfrecord
	@EST_CACHE_DIR=target/demo/cache ./target/release/estc eval examples/digits_tfrecord.est --model-dir target/demo/digits_tfrecord
	@echo "== mpirun -n 2 estc train examples/digits_mlp.est (two ranks of one shard: the same bytes as one process of two shards)"
	@rm -rf target/demo/digits_ranks target/demo/digits_shards
	@OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -n 2 \
	  ./target/release/estc train examples/digits_mlp.est --model-dir target/demo/digits_ranks --max-steps 300
	@./target/release/estc train examples/digits_mlp.est --model-dir target/demo/digits_shards --max-steps 300 --config num_shards=2 > /dev/null 2>&1
	@cmp target/demo/digits_ranks/ckpt-300.safetensors target/demo/digits_shards/ckpt-300.safetensors && echo "ckpt-300: identical"
	@OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -n 2 \
	  ./target/release/estc eval examples/digits_mlp.est --model-dir target/demo/digits_ranks
	@for f in examples/*.est; do \
	  n=$$(basename $$f .est); \
	  case " $(HOST_ONLY_EXAMPLES) " in *" $$n "*) ts=host;; *) ts="host wafer";; esac; \
	  for t in $$ts; do \
	    ./target/release/estc check $$f --target $$t || exit 1; \
	  done; \
	done
	@echo "(on the host only, as the wafer's default test32 does not lay them out: $(HOST_ONLY_EXAMPLES))"
	@echo "== estc check examples/mobilenet.est on the wafer's wse2, at its batch of 32"
	@./target/release/estc check examples/mobilenet.est --target wafer --wafer wse2
	@echo "== and a program with mistakes, as a user sees them:"
	@./target/release/estc check tests/ui/multiple/several_errors.est; test $$? -eq 1

# Every check: formatting, lints (warnings are errors) and the whole test suite for
# the feature sets we ship (the host backend through LLVM with training across ranks
# on MPI, whose tests run `mpirun -n 2` on this machine; and --no-default-features,
# with neither), and the Neovim setup (when nvim is installed).
# (the Neovim check reuses the estc that `cargo test --no-default-features` just built
# for its integration tests, target/debug/estc: the language server needs neither LLVM
# nor MPI, and a build of its own would be a third full debug build)
# The suites run under cargo-nextest where it is installed (each test a process, the
# tests of every suite in one queue over the cores, the slowest first:
# .config/nextest.toml), else under cargo test, one suite after another.
NEXTEST := $(shell $(CARGO) nextest --version >/dev/null 2>&1 && echo yes)
TEST_RUN = $(if $(NEXTEST),$(CARGO) nextest run,$(CARGO) test)
test: setup fmt clippy
	$(TEST_RUN) --features mpi
	$(TEST_RUN) --no-default-features
	@$(MAKE) --no-print-directory nvim-check

# docs/editors.md's Neovim setup, headless, against the debug estc (built first).
test-nvim:
	$(CARGO) build
	@$(MAKE) --no-print-directory nvim-check

nvim-check:
	@if command -v nvim >/dev/null 2>&1; then \
	  editors/nvim/test.sh target/debug/estc; \
	else \
	  echo "test-nvim: skipped: no nvim on the PATH (make setup installs it)"; \
	fi

fmt:
	$(CARGO) fmt --check

clippy:
	$(CARGO) clippy --all-targets --features mpi -- -D warnings
	$(CARGO) clippy --all-targets --no-default-features -- -D warnings

bench: setup
	$(CARGO) bench --bench check

# Fuzz the checker and the record decoders (needs the nightly toolchain and
# cargo-fuzz): FUZZ_TARGETS="tfrecord example" FUZZ_SECS=600 make fuzz.
FUZZ_TARGETS ?= check tfrecord example
fuzz:
	for t in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/corpus/$$t; \
	  seeds=seeds; [ $$t = check ] || seeds=seeds_$$t; \
	  (cd fuzz && $(CARGO) +nightly fuzz run -O $$t corpus/$$t $$seeds -- \
	    -max_total_time=$${FUZZ_SECS:-600} -timeout=10 -rss_limit_mb=2048) || exit 1; \
	done

# Regenerate the diagnostics catalogue from the compiler's table.
docs: build
	./target/release/estc explain --markdown > docs/diagnostics.md
