"""Shared test helpers: run bridge.py as users do (a subprocess), in temp dirs."""
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# TEST_BRIDGE_PY runs the tests against another copy, e.g. an old bridge.py, to check that a new
# test fails before its fix.
BRIDGE = Path(os.environ.get("TEST_BRIDGE_PY") or REPO / "bridge.py")
FIXTURES = REPO / "fixtures"
PYTHON = sys.executable

_SECRETISH = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")


def clean_env(**extra):
    """os.environ without BRIDGE_* settings and secret-looking variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("BRIDGE_") and not any(s in k.upper() for s in _SECRETISH)}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_bridge(*args, cwd=None, input=None, env=None, timeout=60):
    """Run `python bridge.py ARGS...` and return the CompletedProcess (text mode)."""
    return subprocess.run(
        [PYTHON, str(BRIDGE), *map(str, args)], cwd=cwd, input=input,
        env=clean_env() if env is None else env, capture_output=True, text=True,
        timeout=timeout, stdin=None if input is not None else subprocess.DEVNULL)


def load_bridge(path=BRIDGE, name="bridge_under_test"):
    """bridge.py imported as a fresh module (its own globals) from `path`."""
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The same, as the first line of a `python -c` script: bridge.py as `b`.
IMPORT_BRIDGE = ("import importlib.util as u; s = u.spec_from_file_location('b', %r); "
                 "b = u.module_from_spec(s); s.loader.exec_module(b)" % str(BRIDGE))


def wait_for(predicate, timeout=20.0):
    """Poll until `predicate()` is true (True) or `timeout` seconds passed (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def readme_quickstart(name):
    """The sh script of a README quick start: the ```sh block between `<!-- NAME -->` and
    `<!-- end NAME -->`, so a test runs it exactly as a reader would copy it."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- %s -->\n" % name, 1)[1].split("<!-- end %s -->" % name, 1)[0]
    return block.split("```sh\n", 1)[1].rsplit("```", 1)[0]


def process_running(pid):
    """True if `pid` exists and is not a zombie waiting for a reaper (for orphan checks)."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def git(repo, *args, check=True):
    return subprocess.run(["git", "-C", str(repo), *args], check=check,
                          capture_output=True, text=True).stdout


def make_git_repo(path):
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.name", "Test User")
    git(path, "config", "user.email", "test@example.com")
    git(path, "config", "commit.gpgsign", "false")
    (path / "README.md").write_text("# test repo\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "initial")
    return path


@pytest.fixture
def git_repo(tmp_path):
    """A fresh git repository on `main` with one commit."""
    return make_git_repo(tmp_path / "repo")
