# The two commands: `make demo` and `make test`. Both install what they need first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
export PYTHONUNBUFFERED := 1

.PHONY: demo test deps proto bench lint v2-check gpu-check clean

deps:
	@bash scripts/install-deps.sh

demo: deps
	$(PY) -m demo

test: deps
	$(PY) -m pytest -q -rs $(PYTEST_ARGS)

proto: deps
	PYTHON=$(PY) bash scripts/gen-proto.sh

bench: deps
	$(PY) bench/proxy_overhead.py

lint: deps
	$(PY) -m ruff check .

# Real cgroup v2 and real NVML: run on the lent device machine, never in CI (see README).
v2-check:
	bash scripts/device-check.sh v2

gpu-check:
	bash scripts/device-check.sh gpu

clean:
	-bash scripts/containerd-down.sh
	rm -rf $(VENV) .pytest_cache
