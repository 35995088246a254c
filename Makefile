# Two commands a user needs: `make demo` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
NP     ?= 4
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast test-long lint evolve-demo pbt-demo install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[cpu,mpich,test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/mpirun -n $(NP) $(BIN)/python -m ensemble.run configs/digits.toml

evolve-demo: $(STAMP)
	$(BIN)/mpirun -n $(NP) $(BIN)/python -m ensemble.run configs/digits_evolve.toml

pbt-demo: $(STAMP)
	$(BIN)/mpirun -n 5 $(BIN)/python -m ensemble.run configs/digits_pbt.toml

test: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q -m "not long" --durations=15

# the long real-MPI scenarios `make test` leaves out (about 5 minutes on 2 cores)
test-long: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q -m long

# inner loop: everything that starts no mpiexec (under a minute on 2 cores); `make test` runs all
# but the `long` scenarios
test-fast: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q -m "not mpi and not slow"

# ruff (rules in pyproject.toml [tool.ruff]) over every Python file, mypy over the typed
# config and the run's records/events ([tool.mypy] files); `.ci/run` runs it after `make test`
lint: $(STAMP)
	$(BIN)/ruff check ensemble evolve datafeed tests scripts
	$(BIN)/mypy

clean:
	rm -rf runs build *.egg-info .pytest_cache .mypy_cache .ruff_cache
