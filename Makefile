# The two set-up commands of README.md: `make demo` and `make test`. Each installs what it needs.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.aerie-installed
DEMO_STAMP := $(VENV)/.aerie-demo-installed
PYTEST_ARGS ?=

.PHONY: install lint test test-fast demo bench stack clean

# What each set-up command installs: `make test` everything ([dev]: test tools and their stand-ins),
# `make demo` the product, the torch stack and the dev stack's loopback S3 server that `aerie up`
# starts ([train,stack]: moto's server; no test tools, no browser).
FULL_EXTRAS := dev,train
DEMO_EXTRAS := train,stack

# torch==2.13.0 first, through pip: on these machines pip takes the local CPU wheel; any other spec
# would pull gigabytes of CUDA wheels. The [train] extra pins the same version so nothing replaces
# it. The rest through uv, which keeps the installed torch and installs the other ~220 packages in
# parallel: ~45 s instead of pip's ~2.5 min (measured 2026-11-29, same package set); pip if uv fails.
# `--compile-bytecode` as pip does (+8 s, on every core): without it the tests' first processes each
# compiled transformers & co. for themselves. (Tried 2026-12-02: torch with `pip --no-compile`,
# then compileall -j 0 of what pip installed: no faster in all, ~75 s either way.)
# $(call install_project,EXTRAS)
define install_project
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 'uv>=0.5'
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -e '.[$(1)]' \
		|| { $(PY) -m pip install -q --upgrade pip && $(PY) -m pip install -q -e '.[$(1)]'; }
	@$(PY) -c "import torch, sys; v = torch.__version__.split('+')[0]; sys.exit(0 if v == '2.13.0' else f'torch {v} crept in; expected 2.13.0')"
endef

$(STAMP): pyproject.toml
	$(call install_project,$(FULL_EXTRAS))
	@# The browser tests (tests/browser) drive Debian's Chromium through Playwright's Python package.
	if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null; then \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } \
		|| echo "could not install chromium (root needed): tests/browser will fail until it is there"; fi
	touch $(STAMP) $(DEMO_STAMP)

install: $(STAMP)

# What `make demo` needs and no more (DEMO_EXTRAS). A full install (`make install`) serves it too.
$(DEMO_STAMP): pyproject.toml
	$(call install_project,$(DEMO_EXTRAS))
	touch $(DEMO_STAMP)

# Lint, format and import order (ruff) and types (mypy, strict where `[tool.mypy]` says) before any
# test: a violation fails `make test`, so CI enforces them.
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# The whole suite, slow tests included, in two phases (markers set in tests/conftest.py):
# 1. the jobs phase: the tests that run whole jobs on tight detection thresholds (`serial`), one
#    after another in one pytest process (never beside each other), and beside them, in a second
#    process, the clean 10-minute run (`beside_serial`: it must raise no verdict beside other jobs;
#    its output is printed when it ends). Alone, the serial tests left a quarter of the two cores
#    idle (measured 2026-11-29: 74 % busy) and the clean run mostly sleeps: together they take
#    about as long as the serial tests alone. (Two processes, not xdist's `loadgroup`: with
#    pytest 9.2 and pytest-xdist 3.8 it no longer keeps a group on one worker.)
# 2. everything else on two xdist workers: the unit tests and the whole-job tests that are not
#    timing-sensitive (`side_by_side`). Mostly CPU-bound (vmstat 2026-11-29: 84 % busy on average;
#    three workers were tried only in the old arrangement, beside the clean run: no faster).
# Every part always runs; pytest's exit 5 (no tests collected) is not a failure.
test: install lint
	@set +e; clean_log=$$(mktemp); \
	$(PY) -m pytest -m beside_serial -p no:cacheprovider $(PYTEST_ARGS) >$$clean_log 2>&1 & clean=$$!; \
	trap 'kill $$clean 2>/dev/null' INT TERM; \
	$(PY) -m pytest -m serial $(PYTEST_ARGS); a=$$?; \
	wait $$clean; c=$$?; echo "== the clean run (beside the serial tests)"; cat $$clean_log; rm -f $$clean_log; \
	$(PY) -m pytest -n 2 -m "not serial and not beside_serial" $(PYTEST_ARGS); b=$$?; \
	for rc in $$a $$c $$b; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done

test-fast: install
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

demo: $(DEMO_STAMP)
	$(PY) -m orchestrator.demo

bench: install
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
