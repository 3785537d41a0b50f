# bridge.py - the two commands a newcomer needs are `make demo` and `make test`.
PYTHON ?= python3

.PHONY: help demo test bench clean

help:
	@echo "make demo   - run the watcher on a throwaway repo with sample tasks and a fixture agent"
	@echo "make test   - run every test (installs pytest, pytest-timeout, coverage into .venv if missing)"
	@echo "make bench  - run the benchmarks and print figures and ratios"

demo:
	@bash fixtures/demo.sh

# tests/tools.sh prints the python that has pytest, pytest-timeout and coverage,
# creating .venv and installing them there first when no python has them. Coverage data a
# process killed by a test left unwritten cannot be combined: it is dropped, not reported on.
test:
	@py=$$(PYTHON=$(PYTHON) sh tests/tools.sh) || exit 2; \
	rm -f .coverage .coverage.*; \
	COVERAGE_RCFILE=tests/coverage.ini BRIDGE_PYTHON=$$py \
	  $$py -m coverage run -m pytest -p no:cacheprovider --timeout=300 -q -rs tests; status=$$?; \
	COVERAGE_RCFILE=tests/coverage.ini $$py -m coverage combine -q >/dev/null 2>&1; \
	rm -f .coverage.*; \
	COVERAGE_RCFILE=tests/coverage.ini $$py -m coverage report || true; \
	exit $$status

bench:
	@status=0; for bench in tests/bench_*.py; do \
	  [ -e "$$bench" ] || continue; \
	  echo "== $$bench"; $(PYTHON) "$$bench" || status=1; echo; \
	done; exit $$status

clean:
	rm -rf .venv .coverage .coverage.* tests/__pycache__ __pycache__
