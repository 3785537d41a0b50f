"""Fault injection: the watcher is SIGKILLed at each step of a task, then started again.

Deterministic, no sleeps: the crash comes from a `git` wrapper on PATH (after the real git
command ran), from the fixture agent or a verify command (SIGKILL to their parent, the
watcher), or from tests/crashpoint.py (an audit hook that kills the watcher right before a
given rename or unlink). After the restart, for every step: exactly one final result,
running/ empty, no index.lock, the base branch checked out and clean, and no process of the
task alive.
"""
import json
import os
import shutil
import signal
import subprocess

import pytest

from conftest import BRIDGE, PYTHON, REPO, git, process_running
from test_watch import Queue, branch, wait_for

TASK = "k"
# step -> (how the watcher dies, the attempt that finally succeeds)
STEPS = {
    "lock": ({"event": "os.rename", "args": {"0": "/tasks/k.json", "1": "/running/"}}, 1),
    "branch": ("checkout -q -b feat/ai/k", 2),
    "agent start": ("start", 2),
    "agent end": ("end", 2),
    "verify": ("verify", 2),
    "commit": ("commit -q --no-verify", 2),
    "return to base": ("checkout -q main", 2),
    "result write": ({"event": "os.rename", "args": {"0": ".tmp", "1": "/results/k.json"}}, 2),
    "move": ({"event": "os.remove", "args": {"0": "/running/k.json"}}, 1),
}
VERIFY_CRASH = ("echo $$ >> {pids}; if mkdir {mark} 2>/dev/null; then "
                "sleep 60 & echo $! >> {pids}; "
                "until grep -q \"\\\"pid\\\": $$,\" {lock}; do sleep 0.01; done; "
                "kill -9 $PPID; sleep 60; fi")


def git_wrapper(bin_dir, pattern, mark):
    """A `git` that runs the real one, then SIGKILLs its parent after the first matching call."""
    bin_dir.mkdir()
    wrapper = bin_dir / "git"
    wrapper.write_text('#!/bin/sh\n"%s" "$@"\nrc=$?\ncase " $* " in\n  *" %s "*)\n'
                       '    if mkdir "%s" 2>/dev/null; then kill -9 $PPID; fi ;;\nesac\nexit $rc\n'
                       % (shutil.which("git"), pattern, mark))
    wrapper.chmod(0o755)
    return str(bin_dir)


def crash_watch(queue, tmp_path, how=None):
    """Run `watch --once` that gets SIGKILLed (asserted): at a crashpoint.py audit event
    (`how` a dict), after the first git call matching `how` (a string: git_wrapper's marker is
    tmp/crashed), or by the agent or a verification command (`how` None)."""
    env, argv = dict(queue.env), [PYTHON, str(BRIDGE)]
    if isinstance(how, dict):
        argv = [PYTHON, str(REPO / "tests" / "crashpoint.py"), str(BRIDGE)]
        env["CRASH_AT"] = json.dumps(how)
    elif how is not None:
        bin_dir = git_wrapper(tmp_path / "bin", how, tmp_path / "crashed")
        env["PATH"] = bin_dir + os.pathsep + env["PATH"]
    crashed = subprocess.run(argv + ["watch", "--once", "--root", str(queue.repo), "--config",
                                     str(queue.config_path)], env=env, capture_output=True,
                             text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    return crashed


@pytest.mark.parametrize("step", list(STEPS))
def test_sigkill_at_every_step(git_repo, tmp_path, step):
    how, final_attempt = STEPS[step]
    queue = Queue(git_repo, tmp_path, protected_branches=["main"])
    pids, mark = tmp_path / "pids", tmp_path / "crashed"
    agent = {"write": {"k.txt": "k\n"}, "pidfile": str(pids), "grandchild": True}
    verify = "echo $$ >> %s" % pids
    if how in ("start", "end"):
        agent.update(kill_watcher=how, linger=str(tmp_path / "late"))
        if how == "start":
            agent.update(sleep=60, sleep_attempts=[1])
    elif how == "verify":
        verify = VERIFY_CRASH.format(pids=pids, mark=mark,
                                     lock=queue.handoff / "locks" / (TASK + ".lock"))
    queue.put(queue.task(TASK, agent=agent, commands_to_run=[verify],
                         retry_policy={"max_attempts": 2}))
    crash_watch(queue, tmp_path, None if how in ("start", "end", "verify") else how)

    out = queue.watch()
    assert out.returncode == 0, out.stderr
    assert queue.names("results") == ["k.json"]  # a half-written one is cleared too
    r = queue.result(TASK)
    assert (r["status"], r["attempt"]) == ("success", final_attempt), r["detail"]
    assert [h["reason"] for h in queue.history(TASK)] == (
        ["stale_lock_recovered"] if final_attempt == 2 else [])
    assert queue.names("running") == [] and queue.names("tasks") == []
    assert queue.names("locks") == ["__worker__.lock"]
    assert not (queue.repo / ".git" / "index.lock").exists()
    assert branch(queue.repo) == "main"
    assert git(queue.repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert git(queue.repo, "show", "feat/ai/k:k.txt") == "k\n"
    for pid in map(int, pids.read_text().split()):
        assert wait_for(lambda: not process_running(pid), 5), (step, pid)


@pytest.mark.parametrize("state, fields", [
    ("failed", {"commands_to_run": ["false"]}),
    ("pending", {"requires_confirmation": True}),
])
def test_sigkill_between_result_and_move_keeps_the_task_file(git_repo, tmp_path, state, fields):
    """The result is written first; a crash before the task file reaches failed/ or
    pending/ must not lose the file (a pending task could never be approved)."""
    queue = Queue(git_repo, tmp_path)
    queue.put(queue.task(TASK, **fields))
    crash_watch(queue, tmp_path, {"event": "os.rename",
                                  "args": {"0": "/running/k.json", "1": "/%s/" % state}})
    before = queue.result(TASK)
    assert queue.names("running") == ["k.json"]
    queue.watch()
    assert queue.result(TASK) == before
    assert queue.names("running") == [] and queue.names(state) == ["k.json"]
    assert queue.names("locks") == ["__worker__.lock"]


def test_sigkill_during_the_recovery_is_recovered_again(git_repo, tmp_path):
    """The recovery itself dies right after parking the work as a WIP commit: the next
    start still knows the base and the task branch, and returns to the base."""
    queue = Queue(git_repo, tmp_path, protected_branches=["main"])
    queue.put(queue.task(TASK, agent={"write": {"k.txt": "k\n"}, "kill_watcher": "end"},
                         retry_policy={"max_attempts": 2}))
    assert queue.watch().returncode == -signal.SIGKILL  # the agent killed it after its edit
    env = dict(queue.env)
    env["PATH"] = git_wrapper(tmp_path / "bin", "commit -q --no-verify", tmp_path / "crashed") \
        + os.pathsep + env["PATH"]
    assert queue.watch(env=env).returncode == -signal.SIGKILL  # died after the WIP commit
    assert branch(queue.repo) == "feat/ai/k"
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    assert queue.result(TASK)["status"] == "success" and queue.result(TASK)["attempt"] == 2
    assert branch(queue.repo) == "main"
    assert git(queue.repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert queue.names("running") == [] and queue.names("tasks") == []


def test_a_stop_on_your_own_dirty_branch_commits_nothing_of_yours(git_repo, tmp_path):
    """A task allowed to run in a dirty checkout of an unprotected branch: interrupted, it
    leaves the checkout as it is (the changes from before are yours), re-queued."""
    queue = Queue(git_repo, tmp_path)
    git(queue.repo, "checkout", "-q", "-b", "work")
    base = git(queue.repo, "rev-parse", "HEAD")
    (queue.repo / "mine.txt").write_text("my own change\n")
    pids = tmp_path / "pids"
    queue.put(queue.task(TASK, allow_dirty=True, agent={"write": {"k.txt": "k\n"}, "sleep": 60,
                                                        "pidfile": str(pids)}))
    watcher = queue.popen_watch("--once")
    assert wait_for(lambda: pids.exists() and pids.read_text().strip())
    watcher.send_signal(signal.SIGTERM)
    assert watcher.wait(20) == 128 + signal.SIGTERM
    assert git(queue.repo, "rev-parse", "HEAD") == base and branch(queue.repo) == "work"
    assert "?? mine.txt" in git(queue.repo, "status", "--porcelain")
    assert [h["reason"] for h in queue.history(TASK)] == ["interrupted"]
    assert queue.names("tasks") == ["k.json"] and queue.names("running") == []
