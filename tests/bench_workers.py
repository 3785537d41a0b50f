#!/usr/bin/env python3
"""Several tasks at once, and what a worktree of its own costs a task (isolation "worktree").

1. 8 tasks whose fixture agent sleeps 1 s, `workers: 4` vs `workers: 1`, both in worktree
   mode: the wall-time ratio (target <= 0.35: the agents sleep, the watcher must not be
   the bottleneck).
2. A no-op agent (`true`) and `true` as verification, one worker: the watcher's time per task
   in worktree mode vs checkout mode (target <= 1.5x): wall time minus the agent's and the
   verification's own time and Python's start-up.
Medians of several rounds, side by side in one run. Not a test: figures only.
Usage: python3 tests/bench_workers.py [ROUNDS] [NOOP_TASKS]
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_watch import BRIDGE, PY, env, make_repo, startup_seconds  # noqa: E402

AGENT = os.path.join(HERE, "..", "fixtures", "agent.py")


def run_queue(tmp, tasks, agent, sleep=0, **config):
    """Wall time of `watch --once` over `tasks` tasks, and the agents' and verifications' time."""
    repo = os.path.join(tmp, "repo")
    make_repo(repo)
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as handle:
        json.dump(dict({"executor": {"command": agent}}, **config), handle)
    subprocess.run([PY, BRIDGE, "init", "--root", repo], check=True, capture_output=True)
    past = time.time() - 10
    for n in range(tasks):
        task = {"id": "2026-01-15_%03d_bench" % n, "bead_title": "bench %d" % n, "prompt": "work",
                "commands_to_run": ["true"], "fixture_agent": {"sleep": sleep} if sleep else {}}
        name = os.path.join(repo, ".ai-handoff", "tasks", task["id"] + ".json")
        with open(name, "w") as handle:
            json.dump(task, handle)
        os.utime(name, (past, past))
    started = time.perf_counter()
    out = subprocess.run([PY, BRIDGE, "watch", "--once", "--root", repo, "--config", path],
                         capture_output=True, text=True, env=env(), stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        sys.exit("watch failed: %s" % out.stderr[-2000:])
    child = 0.0
    results = os.path.join(repo, ".ai-handoff", "results")
    for name in os.listdir(results):
        with open(os.path.join(results, name)) as handle:
            result = json.load(handle)
        assert result["status"] == "success", result
        child += result["executor"]["duration_ms"] / 1000.0
        child += sum(c["duration_ms"] for c in result["commands"]) / 1000.0
    return wall, child


def in_tmp(function, *args, **kwargs):
    tmp = tempfile.mkdtemp(prefix="bench-workers-")
    try:
        return function(tmp, *args, **kwargs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    noop = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    sleeper = [PY, AGENT, "--task", "{task_file}"]
    four, one, worktree, checkout = [], [], [], []
    for _ in range(rounds):
        four.append(in_tmp(run_queue, 8, sleeper, 1, isolation="worktree", workers=4)[0])
        one.append(in_tmp(run_queue, 8, sleeper, 1, isolation="worktree", workers=1)[0])
        start = startup_seconds()
        for mode, into in (("worktree", worktree), ("checkout", checkout)):
            wall, child = in_tmp(run_queue, noop, ["true"], isolation=mode)
            into.append((wall - child - start) / noop * 1000)
    four, one, worktree, checkout = (statistics.median(x) for x in (four, one, worktree, checkout))
    print("several tasks at once: 8 tasks, fixture agent sleeping 1 s, isolation worktree, "
          "median of %d rounds" % rounds)
    print("  workers 4                     %7.2f s" % four)
    print("  workers 1                     %7.2f s" % one)
    print("  ratio workers 4 / workers 1   %7.2f x      (target <= 0.35)" % (four / one))
    print("a worktree per task: %d tasks, no-op agent, one worker, the watcher's own time" % noop)
    print("  isolation worktree            %7.1f ms/task" % worktree)
    print("  isolation checkout            %7.1f ms/task" % checkout)
    print("  ratio worktree / checkout     %7.2f x      (target <= 1.5)" % (worktree / checkout))


if __name__ == "__main__":
    main()
