# attnforge — the two README commands:
#   make prebuild   get NVRTC if missing, build the CLI, prebuild the default matrix (sm80, sm90a)
#   make test       fmt, clippy, unit + snapshot tests, the compile sweep, the cache fault tests
# GPU work (on the H200 machine; build the binaries here first with `make gpu-bundle`):
#   make gpu-test   correctness suite + compute-sanitizer memcheck
#   make gpu-bench  our kernels and the peers in one run
#   make gpu-session both, each step under its own time limit (one device call; scripts/gpu-session.sh)
SHELL := /bin/bash
NVRTC_DIR := $(CURDIR)/.nvrtc
NVRTC_LIB := $(NVRTC_DIR)/nvidia/cu13/lib/libnvrtc.so.13
ARCH ?= sm80,sm90a
CARGO ?= cargo

.PHONY: all nvrtc build prebuild test pytest sweep gpu-bundle gpu-test gpu-bench gpu-session clean

all: prebuild

# NVRTC from PyPI into a project-local folder (skipped when ATTNFORGE_NVRTC is set).
nvrtc:
ifeq ($(origin ATTNFORGE_NVRTC), environment)
	@echo "nvrtc: using ATTNFORGE_NVRTC=$(ATTNFORGE_NVRTC)"
else
	@scripts/get-nvrtc.sh $(NVRTC_DIR) >/dev/null
endif

ifneq ($(origin ATTNFORGE_NVRTC), environment)
export ATTNFORGE_NVRTC := $(NVRTC_LIB)
endif

build:
	$(CARGO) build --release -p attnforge-cli

prebuild: nvrtc build
	target/release/attnforge prebuild --arch $(ARCH)
	@echo "kernels cached in $$(target/release/attnforge cache path); export ATTNFORGE_NVRTC=$(ATTNFORGE_NVRTC) for JIT use"

test: nvrtc
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	ATTNFORGE_REQUIRE_NVRTC=1 $(CARGO) test --workspace
	$(MAKE) --no-print-directory pytest

# The Python package's CPU tests: a project-local venv (.venv-py) with
# torch==$(TORCH_VERSION) from PyPI (a big download, done once: the stamp file
# records it), pytest, and the package built by maturin (`pip install ./python`).
# GPU tests are deselected here; on a GPU run `.venv-py/bin/python -m pytest python/tests -m gpu`.
PY_VENV := $(CURDIR)/.venv-py
PY := $(PY_VENV)/bin/python
TORCH_VERSION ?= 2.11.0
PY_STAMP := $(PY_VENV)/.deps-torch-$(TORCH_VERSION)

$(PY_STAMP):
	test -x $(PY) || python3 -m venv $(PY_VENV)
	$(PY) -m pip install --disable-pip-version-check torch==$(TORCH_VERSION) pytest numpy
	touch $@

pytest: $(PY_STAMP)
	$(CARGO) fmt --manifest-path python/Cargo.toml --check
	$(PY) -m pip install --disable-pip-version-check ./python
	$(PY) -m pytest python/tests -m "not gpu" -rs; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest: no tests were collected (exit 5)"; exit 1; fi; exit $$rc

# The coverage sweep alone (fresh temporary cache; rewrites docs/coverage.md).
sweep: nvrtc
	ATTNFORGE_REQUIRE_NVRTC=1 $(CARGO) test --release -p attnforge-codegen-tests --test sweep -- --nocapture

# Build the GPU test and bench binaries here; they travel in .gpu/ to the GPU machine.
gpu-bundle: $(PY_STAMP)
	mkdir -p .gpu
	rm -f .gpu/attnforge-*.whl
	$(PY) -m pip wheel --disable-pip-version-check --no-deps -q -w .gpu ./python
	$(CARGO) build --release --example gpu_bench
	cp target/release/examples/gpu_bench .gpu/gpu_bench
	for t in gpu_fwd gpu_bwd; do f=$$(CARGO='$(CARGO)' scripts/test-exe.sh $$t) && cp "$$f" .gpu/$$t || exit 1; done
	# Without their symbol tables (1.4 MB each of the device call's 64 MiB carry;
	# a panic still names its file and line).
	if command -v strip >/dev/null; then strip .gpu/gpu_bench .gpu/gpu_fwd .gpu/gpu_bwd; fi
	@ls -la .gpu

gpu-test:
	scripts/gpu-test.sh --sanitize

gpu-bench:
	scripts/gpu-bench.sh

gpu-session:
	scripts/gpu-session.sh

clean:
	$(CARGO) clean
	rm -rf .gpu gpu-results
