#!/bin/sh
# Prints the path of a python that can run the test suite (pytest, pytest-timeout,
# coverage >= 7.10 for subprocess measurement). Uses $PYTHON when it already has
# them; otherwise creates ./.venv (never installs into the system python) and
# installs them there. Progress goes to stderr, only the path to stdout.
# Best effort, into .venv only (bridge.py itself never needs them): PyYAML, the reader every
# consumer of relay queue files uses, and the official MCP Python SDK (`mcp`, Python 3.10+), a
# real client for the proxy's interop test. Without them those checks skip, saying why.
set -eu
PYTHON=${PYTHON:-python3}
optional() {  # PY MODULE PACKAGE WHAT-SKIPS
  "$1" -c "import $2" >/dev/null 2>&1 && return 0
  [ "$1" = .venv/bin/python ] && .venv/bin/python -m pip install -q --disable-pip-version-check "$3" >&2 \
    && return 0
  echo "tests: $3 is not installed for $1; $4 will skip" >&2
}
extras() {
  optional "$1" yaml pyyaml "the relay tests' PyYAML cross-checks"
  optional "$1" mcp mcp "the proxy's MCP SDK interop test (tests/test_proxy_sdk.py)"
}
check='import pytest, pytest_timeout, coverage, sys; sys.exit(0 if tuple(map(int, coverage.__version__.split(".")[:2])) >= (7, 10) else 1)'
if "$PYTHON" -c "$check" >/dev/null 2>&1; then
  extras "$PYTHON"
  command -v "$PYTHON"; exit 0
fi
if [ -x .venv/bin/python ] && .venv/bin/python -c "$check" >/dev/null 2>&1; then
  extras .venv/bin/python
  echo "$(pwd)/.venv/bin/python"; exit 0
fi
echo "tests: installing pytest, pytest-timeout and coverage into .venv ..." >&2
rm -rf .venv
"$PYTHON" -m venv .venv >&2 || { echo "tests: cannot create .venv (is python3-venv installed?)" >&2; exit 2; }
.venv/bin/python -m pip install -q --disable-pip-version-check pytest pytest-timeout "coverage>=7.10" >&2 \
  || { echo "tests: pip could not install pytest, pytest-timeout, coverage" >&2; exit 2; }
extras .venv/bin/python
echo "$(pwd)/.venv/bin/python"
