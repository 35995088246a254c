# Two commands a user needs: `make demo` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# ranks for `make demo` / `make evolve-demo`: rank 0 (the master, idle while it waits) and a
# worker per core, from the machine it runs on; `make demo NP=2` chooses (MPI oversubscribes)
NP     ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$((n + 1)))
STAMP  := $(VENV)/.installed
# `make docs` installs mkdocs here, never into $(VENV): the project does not depend on it
DOCS_VENV ?= .venv-docs
SITE   ?= build/site

.PHONY: demo test test-fast test-long lint docs docs-check evolve-demo pbt-demo install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[cpu,mpich,test]"
	touch $(STAMP)

install: $(STAMP)

# writes runs/digits, or runs/digits-2, -3, ... beside an earlier run; its last line names the report
demo: $(STAMP)
	$(BIN)/mpirun -n $(NP) $(BIN)/python -m ensemble.run configs/digits.toml

evolve-demo: $(STAMP)
	$(BIN)/mpirun -n $(NP) $(BIN)/python -m ensemble.run configs/digits_evolve.toml

pbt-demo: $(STAMP)
	$(BIN)/mpirun -n 5 $(BIN)/python -m ensemble.run configs/digits_pbt.toml

# two pytest processes (pytest-xdist: a test waiting on its ranks leaves a core idle the other takes):
# 11:36 on 2 cores (docs/tests.md; 22:21 in one process before some scenarios moved to test-long)
test: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not long" --durations=15

# the long real-MPI scenarios `make test` leaves out (about 12-16 minutes on 2 cores)
test-long: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q -m long

# inner loop: everything that starts no mpiexec (under a minute, about 55 s on 2 cores); `make test`
# (under 12 minutes) runs all but the `long` scenarios
test-fast: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q -m "not mpi and not slow"

# ruff (rules in pyproject.toml [tool.ruff]) over every Python file, mypy over the typed
# config and the run's records/events ([tool.mypy] files); `.ci/run` runs it after `make test`
lint: $(STAMP)
	$(BIN)/ruff check ensemble evolve datafeed tests scripts
	$(BIN)/mypy

# every page of the built site in headless Chromium: pages load, images decode, site links answer
# (chromium and chromedriver from Debian's packages when missing, selenium in the docs venv)
docs-check: docs
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q chromium chromium-driver >/dev/null || \
		  { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; }; }
	$(DOCS_VENV)/bin/python -c "import selenium" 2>/dev/null || \
		$(DOCS_VENV)/bin/python -m pip install --quiet "selenium~=4.0"
	$(DOCS_VENV)/bin/python scripts/check_site.py $(SITE)

# the documentation site (mkdocs.yml, docs/), warnings as errors: a broken link or anchor fails
docs:
	test -x $(DOCS_VENV)/bin/mkdocs || { $(PYTHON) -m venv $(DOCS_VENV) && \
		$(DOCS_VENV)/bin/python -m pip install --quiet "mkdocs~=1.6"; }
	$(DOCS_VENV)/bin/mkdocs build --strict --site-dir $(SITE)

clean:
	rm -rf runs build *.egg-info .pytest_cache .mypy_cache .ruff_cache
