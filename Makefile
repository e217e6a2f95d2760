# Agora — every target sets itself up; `make test` works on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test demo lint typecheck bench clean

$(STAMP): pyproject.toml tests/support/install_pymesos.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# A venv made before the distribution was renamed holds "agora" and its import hook.
	@if $(BIN)/pip show --quiet agora >/dev/null 2>&1; then \
		$(BIN)/pip uninstall --quiet --yes agora; fi
	$(BIN)/pip install --quiet -e '.[test,dev]'
	@# pymesos, run unmodified by the Mesos-compatibility tests: its http-parser needs a build
	@# step pip cannot express (see the script).
	sh tests/support/install_pymesos.sh $(VENV)
	touch $(STAMP)

# System packages: a busybox image for filesystem/rootfs, nftables plus iproute2 for the
# multi-host rig (deploy/rig.py) of the fault suite, Open MPI for the MPI framework (mpi4py
# comes from PyPI with the test extras), and tmux for the terminal test of `agora top`.
# Installed with apt when running as root on Debian; skipped otherwise (the tests that need
# them then skip, and agora mpirun says what is missing).
SYSDEPS := $(VENV)/.system-deps
$(SYSDEPS): $(STAMP)
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	   ! { [ -x /bin/busybox ] && command -v nft >/dev/null && command -v ip >/dev/null && \
	       command -v mpirun >/dev/null && command -v orted >/dev/null && \
	       command -v tmux >/dev/null; }; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
			busybox-static nftables iproute2 openmpi-bin libopenmpi-dev tmux; \
	fi
	touch $@

# The whole suite: lint, strict types on the pure cores, then every test.
test: $(STAMP) $(SYSDEPS)
	$(BIN)/ruff check .
	$(MAKE) --no-print-directory typecheck
	$(BIN)/pytest

# A local cluster (1 master, 2 agents) runs the quickstart framework's 20 tasks, then stops.
demo: $(STAMP) $(SYSDEPS)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check .

# mypy finds the agora.* packages as a user's does: through the editable install's .pth entry
# (pkg/, whose agora/ holds a symlink to each folder).
typecheck: $(STAMP)
	$(BIN)/mypy -p agora.sdk -p agora.master -p agora.agent -p agora.frameworks

# Benchmarks print JSON lines; run by hand, never asserted in CI.
bench: $(STAMP)
	$(BIN)/python tests/bench/allocator.py --agents 10000 --frameworks 1000
	$(BIN)/python tests/bench/latency.py
	$(BIN)/python tests/bench/throughput.py --tasks 5000 --isolation default
	$(BIN)/python tests/bench/throughput.py --tasks 5000 --isolation posix
	$(BIN)/python tests/bench/containers.py --containers 1000
	$(BIN)/python tests/bench/failover.py
	$(BIN)/python tests/bench/batch.py --tasks 5000
	$(BIN)/python tests/bench/batch_core.py --tasks 5000 --burst 100
	$(BIN)/python tests/bench/mpi.py
	$(BIN)/python tests/bench/state.py --agents 10000 --frameworks 50 --tasks 20000

clean:
	rm -rf $(VENV) build *.egg-info pkg/*.egg-info .pytest_cache .mypy_cache .ruff_cache
