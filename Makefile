# The two commands: `make demo` and `make test`. Both install what they need first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
export PYTHONUNBUFFERED := 1

.PHONY: demo test test-latest deps image proto bench bench-v2 soak lint lock chart-digest v2-check gpu-check clean

deps:
	@bash scripts/install-deps.sh

demo: deps
	$(PY) -m demo

# The host suite in parallel beside the cgroup v2 stage in a VM (scripts/test-all.sh, docs/testing.md); one total
# line at the end.
test: deps
	bash scripts/test-all.sh

# The koordlet-py image (Containerfile) as an OCI archive under out/image/, built with no registry.
image: deps
	bash scripts/build-image.sh

proto: deps
	PYTHON=$(abspath $(PY)) bash scripts/gen-proto.sh

bench: deps
	$(PY) bench/proxy_overhead.py

# 300 pod lifecycles through the proxy and the koordlet hooks; exits 1 unless fds, RSS and store stay flat.
soak: deps
	$(PY) bench/soak.py

lint: deps
	$(PY) -m ruff check .

# The locks, made together so they agree (tests/deploy/test_lock.py holds them to it), each pinning every file
# PyPI publishes for each version by its sha256, resolved for this Python:
#   requirements-dev.lock  the runtime dependencies, the build backend and the dev extras: what `make test`,
#                          `make demo` and CI install (scripts/install-deps.sh, --require-hashes);
#   requirements.lock      the runtime dependencies and the build backend alone, at the same versions:
#                          what scripts/install-baremetal.sh and the image install.
# The runtime lock is compiled from the dev lock (pip-compile keeps a pin that still fits and drops the rest), so
# a release between the two compiles cannot make them differ. pip-tools runs in a throwaway virtualenv;
# PIP_CONFIG_FILE=/dev/null: PyPI itself, not a machine's local mirror. A pin that still fits pyproject.toml is
# kept; `make lock LOCK_ARGS=--upgrade` moves every pin to the newest release (`make test-latest` first).
LOCK_COMPILE = env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null CUSTOM_COMPILE_COMMAND="make lock" \
  out/lock-venv/bin/pip-compile -q --generate-hashes --allow-unsafe --strip-extras --build-deps-for=wheel
lock: deps
	rm -rf out/lock-venv && $(PY) -m venv out/lock-venv
	env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null out/lock-venv/bin/pip install -q pip-tools
	$(LOCK_COMPILE) $(LOCK_ARGS) --extra dev --output-file=requirements-dev.lock pyproject.toml
	cp requirements-dev.lock requirements.lock
	$(LOCK_COMPILE) --output-file=requirements.lock pyproject.toml

# After a change to the chart (deploy/chart/koordlet-py) and a new `version` in its Chart.yaml with an entry at the top
# of its CHANGELOG.md: record the digest of its content there (refused for a version already recorded).
# tests/deploy/test_chart_version.py fails until it is done.
chart-digest:
	python3 scripts/chart-version.py

# The suite on the newest releases of every dependency (not the lock): a virtualenv of its own (.venv-latest), the
# versions that differ from requirements-dev.lock printed first, then the whole test command. Not in CI: it says
# whether `make lock` would be safe today.
test-latest:
	bash scripts/test-latest.sh

# The cgroup v2 stage alone: the tests marked cgroupv2, in a VM booting Debian's kernel (part of `make test`).
v2-check: deps
	bash scripts/v2-stage.sh $(PYTEST_ARGS)

# bench/qos_reaction.py on the host and in the v2 VM, side by side.
bench-v2: deps
	$(PY) bench/qos_reaction.py --v2

# The real-NVML tests (skip without a GPU; the fake NVML runs in `make test`).
gpu-check: deps
	$(PY) -m pytest -q -rs -m gpu tests

clean:
	-bash scripts/containerd-down.sh
	rm -rf $(VENV) .pytest_cache
