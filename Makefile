# The two commands a new user needs:
#   make demo   set up .venv, install recordforge, generate a demo image folder and convert it
#   make test   set up .venv with the test tools (and Debian's chromium) and run the test suite
#   make bench  set up .venv with the benchmark's tools and run it (ARGS="..." passes options,
#               e.g. make bench ARGS="--large"; see benchmarks/README.md)
#   make mutate mutation testing of the pure core with mutmut (long; not part of `make test`):
#               a score per module, the surviving mutants listed (see docs/testing.md);
#               MUTANTS="recordforge.transforms.core.tfrecord.framing.*" runs some mutants only
# recordforge is installed as a package (not in editable mode), as workers will import it;
# the install is redone whenever a source file changes, without setuptools' build/ folder
# (a stale one puts modules that no longer exist into the wheel).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SOURCES := pyproject.toml $(shell find recordforge pipelines transforms schemas -name '*.py' -o -name '*.proto')

.PHONY: demo test bench mutate install browser clean

demo: $(VENV)/.installed
	$(BIN)/recordforge demo --data demo-data --output demo-output

test: $(VENV)/.installed-test browser
	$(BIN)/pytest

bench: $(VENV)/.installed-bench
	$(BIN)/python -m benchmarks $(ARGS)

# mutmut names a module by its file's path, so it runs in a copy of the package laid out as
# installed (src/recordforge/transforms/...); [tool.mutmut] in pyproject.toml says what it mutates
# and which tests it runs. Each run starts afresh: mutmut's cache keys on paths and times.
MUTATE_DIR := build/mutate
# What an earlier `pip install .` leaves in build/ (a stale copy would go into the next wheel);
# not build/ whole: a mutation run (MUTATE_DIR) may be working there.
SETUPTOOLS_LEFTOVERS := build/lib build/bdist.*
MUTMUT := $(abspath $(BIN))/mutmut

mutate: $(VENV)/.installed-mutate
	rm -rf $(MUTATE_DIR)
	mkdir -p $(MUTATE_DIR)/src/recordforge
	cp -R recordforge/. $(MUTATE_DIR)/src/recordforge/
	cp -R pipelines transforms schemas $(MUTATE_DIR)/src/recordforge/
	cp -R tests pyproject.toml schemas $(MUTATE_DIR)/
	find $(MUTATE_DIR) -name __pycache__ -prune -exec rm -rf {} +
	cd $(MUTATE_DIR) && TF_CPP_MIN_LOG_LEVEL=3 $(MUTMUT) run $(MUTANTS) > run.log 2>&1 || { tail -n 40 run.log; exit 1; }
	cd $(MUTATE_DIR) && $(MUTMUT) results --all true > results.txt
	@echo "Killed (or timed out) of all mutants, per module:"
	@awk -F': ' '/: / && $$2 != "not checked" { m = $$1; sub(/^ +/, "", m); sub(/\.x(_|ǁ).*/, "", m); n[m]++; \
	    if ($$2 == "killed" || $$2 == "timeout") k[m]++ } \
	  END { for (m in n) printf "  %-45s %4d of %4d (%.1f%%)\n", m, k[m], n[m], 100 * k[m] / n[m] }' \
	  $(MUTATE_DIR)/results.txt | sort
	@echo "Not killed (docs/testing.md lists those judged equivalent):"
	@grep -Ev ': (killed|timeout|not checked)$$' $(MUTATE_DIR)/results.txt || echo "  none"
	@echo "Diff of one mutant: cd $(MUTATE_DIR) && $(MUTMUT) show NAME"

# The --html test opens the page in a real browser: Debian's Chromium and its WebDriver.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; }

install: $(VENV)/.installed

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(VENV)/bin/python $(SOURCES)
	rm -rf $(SETUPTOOLS_LEFTOVERS)
	$(BIN)/pip install --quiet --upgrade .
	touch $@

$(VENV)/.installed-test: $(VENV)/bin/python $(SOURCES)
	rm -rf $(SETUPTOOLS_LEFTOVERS)
	$(BIN)/pip install --quiet --upgrade '.[test]'
	touch $@ $(VENV)/.installed

$(VENV)/.installed-mutate: $(VENV)/bin/python $(SOURCES)
	rm -rf $(SETUPTOOLS_LEFTOVERS)
	$(BIN)/pip install --quiet --upgrade '.[test,mutate]'
	touch $@ $(VENV)/.installed $(VENV)/.installed-test

$(VENV)/.installed-bench: $(VENV)/bin/python $(SOURCES)
	rm -rf $(SETUPTOOLS_LEFTOVERS)
	$(BIN)/pip install --quiet --upgrade '.[bench]'
	touch $@ $(VENV)/.installed

clean:
	rm -rf $(VENV) build *.egg-info demo-data demo-output .pytest_cache .hypothesis
