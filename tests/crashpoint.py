"""Run bridge.py and SIGKILL it at a chosen point: the crash half of the fault-injection tests.

    CRASH_AT='{"event": "os.rename", "args": {"1": "/running/"}}' python3 tests/crashpoint.py bridge.py watch ...

Python's audit hooks (PEP 578) are told of every rename, unlink and process start before it
happens. The first event named `event` whose arguments contain each given text (argument
index -> text) kills this process with SIGKILL, so the watcher dies exactly between two of its
steps, every time, with no test hook inside bridge.py. The steps around git and the agent
are cut by wrappers on PATH and by the fixture agent instead (see tests/test_watch_crash.py).
"""
import json
import os
import runpy
import signal
import sys


def main():
    spec = json.loads(os.environ.pop("CRASH_AT"))

    def hook(event, args):
        if event == spec["event"] and all(
                text in str(args[int(index)]) for index, text in spec.get("args", {}).items()):
            os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
