#!/usr/bin/env python3
"""Several tasks at once, and what a worktree of its own costs a task (isolation "worktree").

1. 8 tasks whose fixture agent sleeps 1 s, `workers: 4` vs `workers: 1`, both in worktree
   mode: the wall-time ratio (target <= 0.35: the agents sleep, the watcher must not be
   the bottleneck).
2. A no-op agent (`true`) and `true` as verification, one worker: the watcher's time per task
   in worktree mode vs checkout mode (target <= 1.5x): wall time minus the agent's and the
   verification's own time and Python's start-up; the median of 2 x ROUNDS + 1 pairs' ratios.
Medians of several rounds, side by side in one run. Not a test: figures only.
Usage: python3 tests/bench_workers.py [ROUNDS] [NOOP_TASKS]
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_watch import PY, print_figures, startup_seconds, watcher_round  # noqa: E402

AGENT = os.path.join(HERE, "..", "fixtures", "agent.py")


def in_tmp(function, *args):
    tmp = tempfile.mkdtemp(prefix="bench-workers-")
    try:
        return function(tmp, *args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    noop = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    sleeper = [PY, AGENT, "--task", "{task_file}"]
    four, one, worktree, checkout, ratios = [], [], [], [], []
    for _ in range(rounds):
        for workers, into in ((4, four), (1, one)):
            into.append(in_tmp(watcher_round, 8, {"executor": {"command": sleeper},
                                                  "isolation": "worktree", "workers": workers},
                               {"sleep": 1})[0])
    # the per-task figures are a few ms apart on a noisy machine: more rounds, each a pair
    # measured back to back (in turn which goes first), and the median of the pairs' ratios
    for turn in range(2 * rounds + 1):
        start = startup_seconds()
        pair = {}
        for mode in ("worktree", "checkout")[::1 - 2 * (turn % 2)]:
            wall, child = in_tmp(watcher_round, noop, {"executor": {"command": ["true"]},
                                                       "isolation": mode})
            pair[mode] = (wall - child - start) / noop * 1000
        worktree.append(pair["worktree"])
        checkout.append(pair["checkout"])
        ratios.append(pair["worktree"] / pair["checkout"])
    four, one, worktree, checkout, ratio = (statistics.median(x) for x in (
        four, one, worktree, checkout, ratios))
    print_figures("several tasks at once: 8 tasks, fixture agent sleeping 1 s, isolation worktree, "
                  "median of %d rounds" % rounds, [
                      ("workers 4", "%7.2f s", four), ("workers 1", "%7.2f s", one),
                      ("ratio workers 4 / workers 1", "%7.2f x      (target <= 0.35)", four / one)])
    print_figures("a worktree per task: %d tasks, no-op agent, one worker, the watcher's own time, "
                  "median of %d pairs" % (noop, len(ratios)), [
                      ("isolation worktree", "%7.1f ms/task", worktree),
                      ("isolation checkout", "%7.1f ms/task", checkout),
                      ("ratio worktree / checkout", "%7.2f x      (target <= 1.5)", ratio)])


if __name__ == "__main__":
    main()
