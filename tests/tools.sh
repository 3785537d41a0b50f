#!/bin/sh
# Prints the path of a python that can run the test suite (pytest, pytest-timeout,
# coverage >= 7.10 for subprocess measurement). Uses $PYTHON when it already has
# them; otherwise creates ./.venv (never installs into the system python) and
# installs them there. Progress goes to stderr, only the path to stdout.
# PyYAML is best effort, into .venv only: the relay tests check queue files with the reader
# every consumer uses and skip those checks, saying why, without it.
set -eu
PYTHON=${PYTHON:-python3}
yaml() {
  "$1" -c 'import yaml' >/dev/null 2>&1 && return 0
  [ "$1" = .venv/bin/python ] && .venv/bin/python -m pip install -q --disable-pip-version-check pyyaml >&2 \
    && return 0
  echo "tests: PyYAML is not installed for $1; the relay tests' PyYAML cross-checks will skip" >&2
}
check='import pytest, pytest_timeout, coverage, sys; sys.exit(0 if tuple(map(int, coverage.__version__.split(".")[:2])) >= (7, 10) else 1)'
if "$PYTHON" -c "$check" >/dev/null 2>&1; then
  yaml "$PYTHON"
  command -v "$PYTHON"; exit 0
fi
if [ -x .venv/bin/python ] && .venv/bin/python -c "$check" >/dev/null 2>&1; then
  yaml .venv/bin/python
  echo "$(pwd)/.venv/bin/python"; exit 0
fi
echo "tests: installing pytest, pytest-timeout and coverage into .venv ..." >&2
rm -rf .venv
"$PYTHON" -m venv .venv >&2 || { echo "tests: cannot create .venv (is python3-venv installed?)" >&2; exit 2; }
.venv/bin/python -m pip install -q --disable-pip-version-check pytest pytest-timeout "coverage>=7.10" >&2 \
  || { echo "tests: pip could not install pytest, pytest-timeout, coverage" >&2; exit 2; }
yaml .venv/bin/python
echo "$(pwd)/.venv/bin/python"
