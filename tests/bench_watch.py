#!/usr/bin/env python3
"""Watcher overhead per task vs the floor of the git commands it needs (issue 2).

Runs 50 tasks with a no-op agent (`true`) and `true` as verification in a small
repository through `bridge.py watch --once`, and the same git commands the watcher
runs per task directly in a shell loop (the floor). Prints ms per task and the
ratio, median of several rounds. Target: overhead <= 1.5x the floor. Not a test:
figures only. Usage: python3 tests/bench_watch.py [TASKS] [ROUNDS]
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
BRIDGE = os.path.join(HERE, "..", "bridge.py")
PY = sys.executable

# What the watcher runs per task when the agent changes nothing (see Watcher.steps):
# snapshot (status --porcelain=v2 --branch), checkout -b, audit pre (add -A + diff through a
# temp index), [agent], [verify], audit post, snapshot after verify, checkout back.
# The agent's and verification's own time is measured from the results and
# subtracted from the watcher's wall time, as is Python's start-up.
FLOOR_LOOP = r'''
set -ef
G="git -c core.hooksPath=/dev/null"
GD=$($G rev-parse --absolute-git-dir)
audit() {
  cp "$GD/index" "$GD/bench-index"
  GIT_INDEX_FILE="$GD/bench-index" $G add -A
  GIT_INDEX_FILE="$GD/bench-index" $G diff --cached --binary --shortstat -p "$1" -- . ':(exclude).ai-handoff' >/dev/null
  rm -f "$GD/bench-index"
}
i=0
while [ $i -lt "$N" ]; do
  i=$((i+1))
  set -- $($G status --porcelain=v2 --branch --untracked-files=all -- . ':(exclude).ai-handoff')
  base=$3                                # "# branch.oid SHA ..."
  $G checkout -q -b "floor/$i"
  audit "$base"
  audit "$base"
  $G status --porcelain=v2 -z --branch --untracked-files=all -- . ':(exclude).ai-handoff' >/dev/null
  $G checkout -q main
done
'''


def make_repo(path):
    os.makedirs(path)
    run = lambda *a: subprocess.run(["git", "-C", path, *a], check=True, capture_output=True)
    run("init", "-q", "-b", "main")
    run("config", "user.name", "Bench")
    run("config", "user.email", "bench@example.com")
    for i in range(20):
        with open(os.path.join(path, "file%02d.txt" % i), "w") as handle:
            handle.write("line\n" * 50)
    run("add", "-A")
    run("commit", "-q", "-m", "initial")


def env():
    return {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}


def watcher_round(tmp, tasks, config=None, agent=None):
    """Wall time of `watch --once` over `tasks` queued tasks and the agents' and verifications'
    own time (from the results). `config` defaults to a no-op agent; `agent` is each task's
    fixture_agent (for fixtures/agent.py)."""
    repo = os.path.join(tmp, "repo")
    make_repo(repo)
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as handle:
        json.dump(config or {"executor": {"command": ["true"]}}, handle)
    subprocess.run([PY, BRIDGE, "init", "--root", repo], check=True, capture_output=True)
    past = time.time() - 10
    for n in range(tasks):
        task = {"id": "2026-01-15_%03d_bench" % n, "bead_title": "bench %d" % n, "prompt": "nothing",
                "commands_to_run": ["true"], "fixture_agent": agent or {}}
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


def print_figures(title, rows):
    """A benchmark's report: its title, then a line per (label, printf format, value)."""
    print(title)
    for label, form, value in rows:
        print("  %-30s" % label + form % value)


def startup_seconds():
    started = time.perf_counter()
    subprocess.run([PY, BRIDGE, "--version"], capture_output=True, check=True)
    return time.perf_counter() - started


def floor_round(tmp, tasks):
    repo = os.path.join(tmp, "floor")
    make_repo(repo)
    os.makedirs(os.path.join(repo, ".ai-handoff"))
    started = time.perf_counter()
    subprocess.run(["sh", "-c", FLOOR_LOOP], cwd=repo, check=True, env=dict(env(), N=str(tasks)))
    return time.perf_counter() - started


def main():
    tasks = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    walls, overheads, floors = [], [], []
    for _ in range(rounds):
        tmp = tempfile.mkdtemp(prefix="bench-watch-")
        try:
            start = startup_seconds()
            wall, child = watcher_round(tmp, tasks)
            floor = floor_round(tmp, tasks)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        walls.append(wall / tasks * 1000)
        overheads.append((wall - child - start) / tasks * 1000)
        floors.append(floor / tasks * 1000)
    wall, overhead, floor = (statistics.median(x) for x in (walls, overheads, floors))
    print_figures("watcher overhead, %d tasks (no-op agent, `true` verify), median of %d rounds"
                  % (tasks, rounds), [
                      ("watch --once wall time", "%7.1f ms/task", wall),
                      ("minus agent/verify and start", "%7.1f ms/task  (the watcher's own overhead)",
                       overhead),
                      ("floor: same git commands, sh",
                       "%7.1f ms/task  (git only, plus the temp-index cp)", floor),
                      ("ratio overhead / floor", "%7.2f x      (target <= 1.5)", overhead / floor)])


if __name__ == "__main__":
    main()
