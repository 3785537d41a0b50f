"""bridge.py watch and its queue commands, through the CLI on real git repositories.

The editing agent is fixtures/agent.py (what it does comes from the task's
`fixture_agent` field), beads is fixtures/bd. Nothing of the core is mocked.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (BRIDGE, FIXTURES, PYTHON, clean_env, git, make_git_repo, process_running,
                      readme_quickstart, run_bridge, wait_for)

AGENT = [PYTHON, str(FIXTURES / "agent.py"), "--task", "{task_file}", "--prompt-file", "{prompt_file}"]
SEED_RESULT_KEYS = {"id", "status", "exit_path", "reason", "attempt", "bead", "git", "commands",
                    "artifacts", "task_snapshot", "timestamp"}
SEED_GIT_KEYS = {"base_commit", "head_commit", "branch", "dirty_before", "dirty_after_verify",
                 "status_before", "status_after_verify", "diff_stat_pre", "diff_stat_post"}


# ---- helpers ------------------------------------------------------------------

class Queue:
    """A repository with .ai-handoff/ and a config file outside the work tree."""

    def __init__(self, repo, tmp_path, **config):
        self.repo = Path(repo)
        self.config_path = tmp_path / "bridge.config.json"
        self.config = {"executor": {"command": AGENT}, "poll_sec": 0.1}
        self.config.update(config)
        self.save_config()
        self.env = clean_env()
        out = run_bridge("init", "--root", repo)
        assert out.returncode == 0, out.stderr
        self.handoff = self.repo / ".ai-handoff"

    def save_config(self):
        self.config_path.write_text(json.dumps(self.config))

    def task(self, task_id, agent=None, **fields):
        task = {"id": task_id, "bead_title": "Task %s" % task_id, "goal": "a goal",
                "done_condition": "it works", "prompt": "Do the thing.", "scope": ["x.txt"],
                "constraints": ["edit files only"], "commands_to_run": ["true"],
                "timeout_sec": 30, "attempt": 1, "retry_policy": {"max_attempts": 1},
                "fixture_agent": agent if agent is not None else {"write": {"%s.txt" % task_id: "hello\n"}}}
        task.update(fields)
        return task

    def put(self, task, name=None):
        """Drop a task file into tasks/ as a planner would (rename into place)."""
        path = self.handoff / "tasks" / (name or task["id"] + ".json")
        tmp = path.parent / (".%s.tmp" % path.name)
        tmp.write_text(json.dumps(task))
        os.utime(tmp, (time.time() - 10, time.time() - 10))
        os.rename(tmp, path)
        return path

    def bridge(self, *args, env=None, timeout=60):
        return run_bridge(*args, "--root", self.repo, "--config", self.config_path,
                          env=env or self.env, timeout=timeout)

    def watch(self, env=None, timeout=60):
        return self.bridge("watch", "--once", env=env, timeout=timeout)

    def popen_watch(self, *extra, env=None):
        return subprocess.Popen(
            [PYTHON, str(BRIDGE), "watch", "--root", str(self.repo), "--config",
             str(self.config_path), *extra], env=env or self.env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self, task_id):
        return json.loads((self.handoff / "results" / (task_id + ".json")).read_text())

    def names(self, state):
        return sorted(p.name for p in (self.handoff / state).iterdir())

    def history(self, task_id):
        path = self.handoff / "meta" / (task_id + ".results.jsonl")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def queue(git_repo, tmp_path):
    return Queue(git_repo, tmp_path)


def head(repo, ref="HEAD"):
    return git(repo, "rev-parse", ref).strip()


def branch(repo):
    return git(repo, "symbolic-ref", "--short", "HEAD").strip()


# ---- init and submit ---------------------------------------------------------

def test_init_layout_and_repo_not_dirty(git_repo):
    out = run_bridge("init", "--root", git_repo)
    assert out.returncode == 0, out.stderr
    for name in ("tasks", "running", "results", "patches", "locks", "logs", "meta", "pending", "failed"):
        assert (git_repo / ".ai-handoff" / name).is_dir()
    (git_repo / ".ai-handoff" / "tasks" / "x.json").write_text("{}")
    assert git(git_repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert "/.ai-handoff/" in (git_repo / ".git" / "info" / "exclude").read_text()
    again = run_bridge("init", "--root", git_repo)
    assert again.returncode == 0 and "already set up" in again.stdout
    assert (git_repo / ".git" / "info" / "exclude").read_text().count(".ai-handoff") == 1


def test_init_from_a_subdirectory_uses_git_top_level(git_repo):
    (git_repo / "sub").mkdir()
    out = run_bridge("init", cwd=git_repo / "sub")
    assert out.returncode == 0, out.stderr
    assert (git_repo / ".ai-handoff" / "tasks").is_dir()


def test_submit_lists_every_schema_error_and_queues_atomically(queue, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"id": "a/../b", "prompt": 3, "commands_to_run": [],
                               "timeout_sec": "10", "requires_confirmation": "yes"}))
    out = queue.bridge("submit", bad)
    assert out.returncode == 2
    for field in ("id:", "bead_title:", "prompt:", "commands_to_run:", "timeout_sec:",
                  "requires_confirmation:"):
        assert field in out.stderr, field
    assert "Traceback" not in out.stderr
    assert queue.names("tasks") == []
    good = tmp_path / "whatever-name.json"
    good.write_text(json.dumps(queue.task("t1")))
    out = queue.bridge("submit", good)
    assert out.returncode == 0 and "queued t1" in out.stdout
    assert queue.names("tasks") == ["t1.json"]
    assert queue.bridge("submit", good).returncode == 1  # already queued


def test_every_command_has_help_with_an_example():
    for command in ("init", "submit", "watch", "status", "approve", "unlock"):
        out = run_bridge(command, "--help")
        assert out.returncode == 0 and "example:" in out.stdout and "--root" in out.stdout


# ---- the happy path and the result schema ------------------------------------

def test_success_result_complete_commit_on_branch_and_back_to_base(queue):
    base = head(queue.repo)
    queue.put(queue.task("2026-01-15_01_ok", agent={"write": {"src/new.py": "print('hi')\n"}},
                         commands_to_run=["test -f src/new.py", "echo verified-out"]))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    r = queue.result("2026-01-15_01_ok")
    assert SEED_RESULT_KEYS <= set(r)
    assert SEED_GIT_KEYS <= set(r["git"])
    assert (r["status"], r["exit_path"], r["reason"], r["attempt"]) == ("success", "success", "verified", 1)
    g = r["git"]
    assert g["base_commit"] == base and g["head_commit"] == base  # audit 2 is before the commit
    assert g["branch"] == "feat/ai/2026-01-15_01_ok" and g["base_branch"] == "main"
    assert g["branch_created"] is True and g["returned_to_base"] is True
    assert g["dirty_before"] is False and g["status_before"] == ""
    assert g["dirty_after_verify"] is True and "?? src/new.py" in g["status_after_verify"]
    assert g["diff_stat_pre"] == g["diff_stat_post"] == "1 file changed, 1 insertion(+)"
    assert [c["cmd"] for c in r["commands"]] == ["test -f src/new.py", "echo verified-out"]
    assert [c["exit_code"] for c in r["commands"]] == [0, 0]
    assert r["commands"][1]["stdout"] == "verified-out\n" and r["commands"][1]["stderr"] == ""
    assert r["executor"]["exit_code"] == 0 and "fixture agent" in r["executor"]["stdout"]
    for key in ("patch_pre", "patch_post", "logs", "prompt"):
        assert (queue.handoff / r["artifacts"][key]).is_file(), key
    patch = (queue.handoff / r["artifacts"]["patch_pre"]).read_text()
    assert "src/new.py" in patch and ".ai-handoff" not in patch
    assert r["patch_redacted"] == {"pre": False, "post": False}
    assert r["task_snapshot"]["id"] == "2026-01-15_01_ok"
    assert r["bead"]["title"] == "Task 2026-01-15_01_ok" and r["bead"]["skipped"]
    assert r["timestamp"][:4].isdigit() and r["timestamp"][19] in "+-"
    # committed on the task branch, main untouched, repo clean, queue dirs empty
    assert branch(queue.repo) == "main" and head(queue.repo) == base
    assert head(queue.repo, "feat/ai/2026-01-15_01_ok") == g["commit"]
    message = git(queue.repo, "log", "-1", "--format=%B", g["commit"])
    assert "2026-01-15_01_ok" in message and "Task 2026-01-15_01_ok" in message
    assert git(queue.repo, "status", "--porcelain") == ""
    assert queue.names("running") == [] and queue.names("tasks") == []
    assert queue.names("locks") == ["__worker__.lock"]
    assert "verify 1/2" in out.stderr  # progress on stderr


def test_tasks_run_in_fifo_order_each_from_base(queue):
    for n in (2, 1, 3):
        queue.put(queue.task("2026-01-15_0%d_t" % n))
    assert queue.watch().returncode == 0
    results = [queue.result("2026-01-15_0%d_t" % n) for n in (1, 2, 3)]
    assert [r["status"] for r in results] == ["success"] * 3
    assert all(r["git"]["base_branch"] == "main" for r in results)
    stamps = [r["started_at"] for r in results]
    assert stamps == sorted(stamps)


def test_agent_commits_and_untracked_files_are_in_the_patch(queue):
    base = head(queue.repo)
    queue.put(queue.task("c1", agent={"write": {"committed.txt": "one\n"}, "commit": "agent commit"}))
    queue.put(queue.task("c2", agent={"write": {"a.txt": "a\n", "dir/b.txt": "b\n"}}))
    assert queue.watch().returncode == 0
    r = queue.result("c1")
    assert r["git"]["base_commit"] == base and r["git"]["head_commit"] != base
    assert "committed.txt" in (queue.handoff / r["artifacts"]["patch_pre"]).read_text()
    r2 = queue.result("c2")
    post = (queue.handoff / r2["artifacts"]["patch_post"]).read_text()
    assert "a.txt" in post and "dir/b.txt" in post
    assert git(queue.repo, "diff", "--cached", "--name-only") == ""  # real index untouched


def test_executor_placeholders(queue, tmp_path):
    """(The agent's closed stdin: test_watch_agents.py, with a watcher whose stdin is open.)"""
    record = tmp_path / "argv.json"
    script = "import json,sys; json.dump(sys.argv[1:], open(%r, 'w'))" % str(record)
    queue.config["executor"] = {"command": [PYTHON, "-c", script, "{id}", "{root}", "{task_file}",
                                            "{prompt_file}", "P:{prompt}"],
                                "env": {"EXTRA_VAR": "1"}}
    queue.save_config()
    queue.put(queue.task("ph", timeout_sec=20))
    assert queue.watch().returncode == 0
    argv = json.loads(record.read_text())
    assert argv[0] == "ph" and argv[1] == str(queue.repo)
    assert argv[2].endswith(".ai-handoff/running/ph.json")
    assert argv[3].endswith(".ai-handoff/meta/ph.prompt.md")
    assert "Do the thing." in argv[4] and "a goal" in argv[4] and "it works" in argv[4]
    assert "- x.txt" in argv[4] and "edit files only" in argv[4]


# ---- failures ----------------------------------------------------------------

def test_verify_failed_stops_the_queue_and_keeps_the_work(queue):
    queue.put(queue.task("v1", agent={"write": {"v.txt": "wrong\n"}},
                         commands_to_run=["echo checking; grep -q right v.txt", "echo never"]))
    queue.put(queue.task("v2"))
    out = queue.watch()
    assert out.returncode == 1 and "stopped" in out.stderr
    r = queue.result("v1")
    assert (r["status"], r["exit_path"], r["reason"]) == ("failed", "failed", "verify_failed")
    assert r["commands"][0]["exit_code"] == 1 and r["commands"][0]["stdout"] == "checking\n"
    assert r["commands"][1]["skipped"] is True and r["commands"][1]["exit_code"] is None
    assert "grep -q right v.txt" in r["detail"]
    # nothing reverted: the work stays on the task branch for inspection
    assert branch(queue.repo) == "feat/ai/v1" and (queue.repo / "v.txt").read_text() == "wrong\n"
    assert r["git"]["commit"] is None and r["git"]["wip_commit"] is None
    assert queue.names("tasks") == ["v2.json"] and queue.names("failed") == ["v1.json"]
    assert not (queue.handoff / "results" / "v2.json").exists()


def test_continue_on_failure_parks_wip_commit_and_goes_on(git_repo, tmp_path):
    queue = Queue(git_repo, tmp_path, continue_on_failure=True)
    base = head(git_repo)
    queue.put(queue.task("w1", agent={"write": {"w.txt": "x\n"}}, commands_to_run=["false"]))
    queue.put(queue.task("w2"))
    out = queue.watch()
    assert out.returncode == 4, out.stderr  # went on, but a failure needs a person
    r = queue.result("w1")
    assert r["reason"] == "verify_failed" and r["git"]["wip_commit"]
    assert head(git_repo, "feat/ai/w1") == r["git"]["wip_commit"]
    assert "WIP" in git(git_repo, "log", "-1", "--format=%s", "feat/ai/w1")
    assert git(git_repo, "show", "feat/ai/w1:w.txt") == "x\n"
    assert branch(git_repo) == "main" and head(git_repo) == base
    assert queue.result("w2")["status"] == "success"


def test_stop_on_failure_false_goes_on_without_parking(git_repo, tmp_path):
    queue = Queue(git_repo, tmp_path, stop_on_failure=False)
    queue.put(queue.task("s1", commands_to_run=["false"]))
    queue.put(queue.task("s2"))
    assert queue.watch().returncode == 4
    assert queue.result("s1")["reason"] == "verify_failed"
    # s1's work is left in place, so s2 is refused as dirty rather than mixing work
    assert queue.result("s2")["reason"] == "dirty_repo"


def test_opencode_failed_on_exit_code_with_partial_evidence(queue):
    queue.put(queue.task("a1", agent={"write": {"partial.txt": "half\n"}, "exit": 3,
                                      "stderr": "model error"}))
    assert queue.watch().returncode == 1
    r = queue.result("a1")
    assert (r["status"], r["exit_path"], r["reason"]) == ("failed", "failed", "opencode_failed")
    assert r["executor"]["exit_code"] == 3 and "model error" in r["executor"]["stderr"]
    assert r["commands"] == []  # verification never ran
    assert "partial.txt" in (queue.handoff / r["artifacts"]["patch_pre"]).read_text()
    assert "?? partial.txt" in r["git"]["status_after_verify"]
    assert (queue.repo / "partial.txt").exists()  # not reverted


def test_opencode_timeout_kills_the_whole_group(queue, tmp_path):
    pids = tmp_path / "pids"
    queue.put(queue.task("slow", agent={"sleep": 60, "grandchild": True, "pidfile": str(pids)},
                         timeout_sec=2))
    started = time.monotonic()
    assert queue.watch().returncode == 1
    assert time.monotonic() - started < 20
    r = queue.result("slow")
    assert r["reason"] == "opencode_failed" and r["executor"]["timed_out"] is True
    assert "timed out" in r["detail"]
    for pid in map(int, pids.read_text().split()):
        assert wait_for(lambda: not process_running(pid), 5), pid


def test_nothing_of_the_agent_or_verify_group_outlives_a_normal_exit(queue, tmp_path):
    """A grandchild that let go of the output pipes but stayed in the process group
    is killed when the agent (or the verify command) exits, before it writes later."""
    pids, late = tmp_path / "pids", tmp_path / "late"
    verify_pid = tmp_path / "verify-pid"
    queue.put(queue.task("ling", agent={"linger": str(late), "pidfile": str(pids)},
                         commands_to_run=["(sleep 30; echo late >> %s) >/dev/null 2>&1 & echo $! > %s"
                                          % (late, verify_pid)]))
    assert queue.watch().returncode == 0
    left = [int(p) for p in pids.read_text().split()[1:] + verify_pid.read_text().split()]
    assert len(left) == 2
    for pid in left:
        assert wait_for(lambda: not process_running(pid), 5), pid


def test_executor_that_cannot_start_is_opencode_failed(queue):
    queue.config["executor"] = {"command": ["/nonexistent/agent-cli", "{prompt}"]}
    queue.save_config()
    queue.put(queue.task("nx"))
    assert queue.watch().returncode == 1
    r = queue.result("nx")
    assert r["reason"] == "opencode_failed" and "cannot start" in r["detail"]


def test_dirty_repo_is_blocked_and_does_not_stop_the_queue(queue):
    (queue.repo / "stray.txt").write_text("uncommitted\n")
    queue.put(queue.task("d1"))
    queue.put(queue.task("d2", allow_dirty=True))
    assert queue.watch().returncode == 4  # blocked: the queue goes on, CI is told
    r = queue.result("d1")
    assert (r["status"], r["exit_path"], r["reason"]) == ("blocked", "blocked", "dirty_repo")
    assert r["git"]["dirty_before"] is True and "?? stray.txt" in r["git"]["status_before"]
    assert branch(queue.repo) == "main"
    assert queue.result("d2")["status"] == "success"


def test_a_merge_in_progress_is_blocked_naming_it(queue):
    head = git(queue.repo, "rev-parse", "HEAD").strip()
    (queue.repo / ".git" / "MERGE_HEAD").write_text(head + "\n")  # as `git merge` leaves it
    queue.put(queue.task("m1"))
    assert queue.watch().returncode == 4
    r = queue.result("m1")
    assert (r["status"], r["reason"]) == ("blocked", "dirty_repo"), r
    assert r["detail"] == "a git operation is in progress (MERGE_HEAD); finish or abort it first"

def test_branch_checkout_failed_when_branch_exists_on_first_attempt(queue):
    git(queue.repo, "branch", "feat/ai/b1")
    queue.put(queue.task("b1"))
    assert queue.watch().returncode == 4  # blocked does not stop the queue
    r = queue.result("b1")
    assert (r["status"], r["exit_path"], r["reason"]) == ("blocked", "blocked", "branch_checkout_failed")
    assert "already exists" in r["detail"] and r["git"]["base_commit"]
    assert branch(queue.repo) == "main"


def test_internal_error_still_writes_a_result(queue):
    (queue.handoff / "logs" / "ie.log").mkdir()  # the log cannot be written
    queue.put(queue.task("ie"))
    assert queue.watch().returncode == 1
    r = queue.result("ie")
    assert (r["status"], r["exit_path"], r["reason"]) == ("failed", "failed", "internal_error")
    assert "cannot write" in r["detail"] and "logs/ie.log" in r["detail"]
    assert queue.names("running") == [] and queue.names("failed") == ["ie.json"]


# ---- task file rules -----------------------------------------------------------

def test_schema_invalid_files_are_refused_listed_and_moved(queue, tmp_path):
    tasks = queue.handoff / "tasks"
    target = tmp_path / "outside.json"
    target.write_text(json.dumps(queue.task("link")))
    before = target.read_bytes()
    os.symlink(target, tasks / "link.json")
    (tasks / "notjson.json").write_text("{ nope")
    os.utime(tasks / "notjson.json", (time.time() - 10, time.time() - 10))
    (tasks / "latin1.json").write_bytes(b'{"id": "caf\xe9"}')
    queue.put({"id": "types", "bead_title": 5, "prompt": "p", "commands_to_run": "true",
               "attempt": 0})
    queue.put(queue.task("mismatch"), name="other-name.json")
    queue.put(queue.task("bad..id"))
    queue.put({"id": "missing"})
    (tasks / ".hidden.json").write_text("{}")
    (tasks / "notes.txt").write_text("ignored")
    queue.put(queue.task("z-valid"))
    out = queue.watch()
    assert out.returncode == 4, out.stderr  # skipped does not stop the queue
    for stem in ("link", "notjson", "latin1", "types", "other-name", "bad..id", "missing"):
        r = queue.result(stem)
        assert SEED_RESULT_KEYS <= set(r) and SEED_GIT_KEYS <= set(r["git"]), stem
        assert (r["status"], r["exit_path"], r["reason"]) == ("failed", "skipped", "schema_invalid"), stem
        assert r["errors"], stem
    assert "symlink" in queue.result("link")["errors"][0]
    assert "not UTF-8" in queue.result("latin1")["errors"][0]
    errors = " ".join(queue.result("types")["errors"])
    assert "bead_title" in errors and "commands_to_run" in errors and "attempt" in errors
    assert "bead_title: must be a string, got 5" in errors
    assert 'commands_to_run: must be a list, got "true"' in errors
    assert "stem" in " ".join(queue.result("other-name")["errors"])
    assert "branch name" in " ".join(queue.result("bad..id")["errors"])
    missing = " ".join(queue.result("missing")["errors"])
    assert "prompt: required" in missing and "commands_to_run: required" in missing
    assert target.read_bytes() == before and not (tmp_path / "outside.json").is_symlink()
    assert os.path.islink(queue.handoff / "failed" / "link.json")
    assert sorted(os.listdir(tasks)) == [".hidden.json", "notes.txt"]
    assert queue.result("z-valid")["status"] == "success"


def test_fresh_unparseable_file_waits_for_its_writer(queue):
    path = queue.handoff / "tasks" / "late.json"
    path.write_text('{"id": "late", ')  # a producer still writing, without rename

    def finish():
        time.sleep(0.6)
        path.write_text(json.dumps(queue.task("late")))
    import threading
    thread = threading.Thread(target=finish)
    thread.start()
    out = queue.watch()
    thread.join()
    assert out.returncode == 0, out.stderr
    assert queue.result("late")["status"] == "success"


# ---- idempotency, retry, approve --------------------------------------------------

def test_idempotency_skip_and_submit_retry_really_reruns(queue, tmp_path):
    count = tmp_path / "runs"
    task = queue.task("i1", agent={"count_file": str(count)})
    queue.put(task)
    assert queue.watch().returncode == 0
    first = queue.result("i1")
    queue.put(task)  # the same attempt again: already done
    out = queue.watch()
    assert out.returncode == 0 and "already has a result" in out.stderr
    assert count.read_text().count("run") == 1 and queue.result("i1") == first
    (queue.handoff / "tasks" / "i1.json").unlink()
    path = tmp_path / "i1.json"
    path.write_text(json.dumps(task))
    assert queue.bridge("submit", path).returncode == 1  # has a result: refused
    out = queue.bridge("submit", "--retry", path)
    assert out.returncode == 0 and "attempt 2" in out.stdout
    assert queue.watch().returncode == 0
    assert count.read_text().splitlines() == ["run attempt 1", "run attempt 2"]
    second = queue.result("i1")
    assert second["attempt"] == 2 and second["status"] == "success"
    history = queue.history("i1")
    assert [h["attempt"] for h in history] == [1] and history[0]["timestamp"] == first["timestamp"]
    assert second["previous_results"][0]["attempt"] == 1
    # the branch of attempt 1 is reused for the retry of the same task
    assert second["git"]["branch"] == "feat/ai/i1" and second["git"]["branch_created"] is False


def test_confirmation_gate_before_any_git_change_then_approve(queue, tmp_path):
    count = tmp_path / "runs"
    queue.put(queue.task("g1", requires_confirmation=True, agent={"count_file": str(count)}))
    queue.put(queue.task("g2"))
    out = queue.watch()
    assert out.returncode == 4, out.stderr  # waiting for a person's approval
    r = queue.result("g1")
    assert (r["status"], r["exit_path"], r["reason"]) == (
        "needs_confirmation", "needs_confirmation", "requires_confirmation")
    for key in ("branch", "base_commit", "dirty_before", "status_porcelain"):
        assert key in r["git"]
    assert r["git"]["branch"] == "main"
    assert r["task_snapshot"]["id"] == "g1"
    assert queue.names("pending") == ["g1.json"] and not count.exists()
    assert "feat/ai/g1" not in git(queue.repo, "branch", "--list")
    assert queue.result("g2")["status"] == "success"  # pending does not block the queue
    status = json.loads(queue.bridge("status", "--json").stdout)
    assert status["pending"] == 1
    out = queue.bridge("approve", "g1")
    assert out.returncode == 0, out.stderr
    assert queue.names("pending") == [] and queue.names("tasks") == ["g1.json"]
    assert queue.watch().returncode == 0
    final = queue.result("g1")
    assert final["status"] == "success" and final["approved_at"] and final["attempt"] == 1
    assert count.read_text().count("run") == 1
    assert [h["reason"] for h in queue.history("g1")] == ["requires_confirmation"]
    assert queue.bridge("approve", "g1").returncode == 1  # nothing pending any more
    assert queue.bridge("approve", "../x").returncode == 2


# ---- beads ---------------------------------------------------------------------

def bd_state(path):
    return json.loads(Path(path).read_text())


def test_beads_create_block_close_by_explicit_id(git_repo, tmp_path):
    state = tmp_path / "bd.json"
    queue = Queue(git_repo, tmp_path, bead={"command": [PYTHON, str(FIXTURES / "bd")]},
                  continue_on_failure=True)
    queue.env = clean_env(BD_FIXTURE_STATE=state)
    queue.put(queue.task("e1"))
    queue.put(queue.task("e2", commands_to_run=["false"]))
    assert queue.watch().returncode == 4
    ok, bad = queue.result("e1"), queue.result("e2")
    assert ok["bead"]["id"] == "bd-1" and bad["bead"]["id"] == "bd-2"
    assert (queue.handoff / "meta" / "e1.bead").read_text().strip() == "bd-1"
    issues = bd_state(state)["issues"]
    assert issues["bd-1"]["status"] == "closed"
    assert issues["bd-2"]["status"] == "blocked" and "verify_failed" in issues["bd-2"]["notes"]
    calls = bd_state(state)["calls"]
    assert ["create", "Task e1", "--silent"] in calls
    assert all(call[1:2] in (["bd-1"], ["bd-2"]) for call in calls if call[0] in ("close", "update"))


def test_a_retry_keeps_its_bead_and_reports_the_bead_output(git_repo, tmp_path):
    queue = Queue(git_repo, tmp_path, bead={"command": [PYTHON, str(FIXTURES / "bd")]},
                  continue_on_failure=True)
    queue.env = clean_env(BD_FIXTURE_STATE=tmp_path / "bd.json")
    task = queue.task("rb", commands_to_run=["false"])
    queue.put(task)
    assert queue.watch().returncode == 4
    first = queue.result("rb")["bead"]
    retry = tmp_path / "rb.json"
    retry.write_text(json.dumps(task))
    assert queue.bridge("submit", "--retry", retry).returncode == 0
    assert queue.watch().returncode == 4
    second = queue.result("rb")["bead"]
    assert first["id"] == second["id"] == "bd-1" and second["reused"] is True
    assert second["raw_output"] == first["raw_output"] == \
        (queue.handoff / "meta" / "rb.bead").read_text()
    assert [c for c in bd_state(tmp_path / "bd.json")["calls"] if c[0] == "create"] == \
        [["create", "Task rb", "--silent"]]

def test_beads_failures_and_absence(git_repo, tmp_path):
    queue = Queue(git_repo, tmp_path, bead={"command": [PYTHON, str(FIXTURES / "bd")], "timeout_sec": 1},
                  stop_on_failure=False)
    queue.env = clean_env(BD_FIXTURE_STATE=tmp_path / "bd.json", BD_FIXTURE_FAIL="create")
    queue.put(queue.task("f1"))
    assert queue.watch().returncode == 4
    r = queue.result("f1")
    assert (r["status"], r["reason"]) == ("failed", "bead_failed") and "exclusive lock" in r["detail"]
    assert r["executor"] is None  # the agent never ran
    assert branch(queue.repo) == "main" and "feat/ai/f1" not in git(queue.repo, "branch", "--list")
    queue.env = clean_env(BD_FIXTURE_STATE=tmp_path / "bd2.json", BD_FIXTURE_HANG="10")
    queue.put(queue.task("f2"))
    started = time.monotonic()
    queue.watch()
    assert time.monotonic() - started < 8
    assert queue.result("f2")["reason"] == "bead_failed" and "timed out" in queue.result("f2")["detail"]
    # no bd on PATH and none configured: skipped, said so
    queue.config.pop("bead")
    queue.save_config()
    queue.env = clean_env(PATH="/usr/bin:/bin")
    git(queue.repo, "checkout", "-q", "main")
    git(queue.repo, "clean", "-fdq")
    queue.put(queue.task("f3"))
    assert queue.watch().returncode == 0
    r = queue.result("f3")
    assert r["status"] == "success" and "not on PATH" in r["bead"]["skipped"]


# ---- verification output: caps, log, progress -----------------------------------

def test_output_capped_with_marker_full_log_kept(git_repo, tmp_path):
    queue = Queue(git_repo, tmp_path, log_size_cap_kb=2, progress_sec=0.3)
    queue.put(queue.task("big", agent={"big_output": 50000},
                         commands_to_run=["python3 -c \"print('v' * 30000); print('END-OF-OUTPUT')\"",
                                          "sleep 1.2"]))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    r = queue.result("big")
    marker = "[TRUNCATED - see logs/big.log]"
    stdout = r["commands"][0]["stdout"]
    assert stdout.startswith(marker) and stdout.rstrip().endswith("END-OF-OUTPUT")
    assert len(stdout.encode()) <= 2048 + len(marker) + 1
    assert r["executor"]["stdout"].startswith(marker)
    log = (queue.handoff / "logs" / "big.log").read_text()
    assert "v" * 30000 in log and log.count("x" * 99) == 500
    assert "still running" in out.stderr  # progress lines for long commands


def test_output_beyond_the_capture_cap_keeps_head_and_real_tail(queue, tmp_path):
    """Past the 8 MiB capture cap the first and the last 4 MiB are kept (the end is the
    summary), the cut is said, and a token straddling either edge of the cut is dropped
    whole rather than leaving a raw piece that redaction cannot recognise."""
    half = 4 << 20
    script = tmp_path / "loud.py"
    script.write_text(
        "import sys\nw = sys.stdout.write\n"
        "w('HEAD-START ' + 'x' * (%d - 17) + ' ')\n"          # the head cut falls 5 bytes into
        "w('sk-proj-' + 'SECRETONE' * 5 + ' ')\n"             # this token
        "w('y ' * 500000)\n"
        "w(' sk-proj-' + 'SECRETTWO' * 5 + ' ')\n"            # the tail starts 20 bytes into C
        "w('z\\n' * %d + 'z' + 'FINAL-SUMMARY\\n')\n" % (half, (half - 49) // 2))
    queue.put(queue.task("loud", commands_to_run=["%s %s" % (sys.executable, script)]))
    assert queue.watch(timeout=120).returncode == 0
    r = queue.result("loud")
    assert r["commands"][0]["stdout"].endswith("z\nzFINAL-SUMMARY\n")
    assert r["commands"][0]["dropped_bytes"] > 500000 and r["executor"]["dropped_bytes"] == 0
    log = (queue.handoff / "logs" / "loud.log").read_text()
    assert log.count("HEAD-START") == 1 and log.count("FINAL-SUMMARY") == 1
    assert "bytes cut here: over the capture cap" in log and "cut from the middle" in log
    for path in queue.handoff.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for piece in (b"SECRETONE", b"SECRETTWO", b"sk-proj-S"):
                assert piece not in data, (path, piece)


# ---- secrets ----------------------------------------------------------------------

def test_secrets_never_reach_any_file_under_ai_handoff(queue):
    """The task file holds no secret; the agent and the verify command print them."""
    env_secret = "s3cr3t-Value-" + "q" * 24
    tokens = ["sk-proj-" + "A1b2C3d4" * 5, "Bearer eyJhbGciOiJIUzI1NiJ9.payload.signature123"]
    queue.env = clean_env(MY_SERVICE_API_TOKEN=env_secret, FIXTURE_ONE=tokens[0],
                          FIXTURE_TWO="Authorization: " + tokens[1])
    queue.put(queue.task("sec", agent={
        "print_env": ["MY_SERVICE_API_TOKEN", "FIXTURE_ONE", "FIXTURE_TWO"],
        "write_env": {"leak.txt": "MY_SERVICE_API_TOKEN", "leak2.txt": "FIXTURE_ONE"}},
        commands_to_run=["echo $MY_SERVICE_API_TOKEN; echo \"$FIXTURE_ONE $FIXTURE_TWO\" >&2",
                         "false"]))
    assert queue.watch().returncode == 1
    found = []
    for path in queue.handoff.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in [env_secret] + tokens:
                if secret.encode() in data:
                    found.append((str(path), secret))
    assert found == []
    r = queue.result("sec")
    assert "[REDACTED]" in r["executor"]["stdout"] and "[REDACTED]" in r["commands"][0]["stdout"]
    assert "[REDACTED]" in r["commands"][0]["stderr"]
    assert r["patch_redacted"]["pre"] is True  # flagged: the patch no longer applies as is
    assert (queue.repo / "leak.txt").read_text() == "value=%s\n" % env_secret  # the repo is the agent's


def test_prompt_and_prompt_file_give_the_agent_the_same_text(queue, tmp_path):
    """The agent gets the task as written through both placeholders; only the copy
    bridge.py keeps is redacted (also after a crash during the agent)."""
    secret = "sk-proj-" + "Q1w2E3r4" * 5
    seen_arg, seen_file = tmp_path / "arg", tmp_path / "file"
    copy = ("import sys, shutil; open(sys.argv[1], 'w').write(sys.argv[3]); "
            "shutil.copy(sys.argv[4], sys.argv[2])")
    queue.config["executor"] = {"command": [PYTHON, "-c", copy, str(seen_arg), str(seen_file),
                                            "{prompt}", "{prompt_file}"]}
    queue.save_config()
    queue.put(queue.task("pr", prompt="Rotate the key %s in config.py." % secret))
    assert queue.watch().returncode == 0
    assert seen_arg.read_text() == seen_file.read_text()
    assert "Rotate the key %s in config.py." % secret in seen_file.read_text()
    stored = (queue.handoff / queue.result("pr")["artifacts"]["prompt"]).read_text()
    assert secret not in stored and "[REDACTED]" in stored


# ---- git safety ---------------------------------------------------------------------

def test_planted_git_hooks_never_fire(queue, tmp_path):
    marker = tmp_path / "hook-fired"
    hooks = queue.repo / ".git" / "hooks"
    for name in ("pre-commit", "commit-msg", "post-commit", "post-checkout", "pre-auto-gc",
                 "reference-transaction", "post-index-change"):
        hook = hooks / name
        hook.write_text("#!/bin/sh\necho %s >> %s\n" % (name, marker))
        hook.chmod(0o755)
    queue.put(queue.task("h1"))
    queue.put(queue.task("h2", commands_to_run=["false"]))
    queue.config["continue_on_failure"] = True
    queue.save_config()
    assert queue.watch().returncode == 4
    assert queue.result("h1")["git"]["commit"] and queue.result("h2")["git"]["wip_commit"]
    assert not marker.exists()


# ---- locks, crashes, signals ------------------------------------------------------------

def test_two_watchers_exactly_one_works_and_sigterm_releases(queue):
    first = queue.popen_watch()
    lock = queue.handoff / "locks" / "__worker__.lock"
    assert wait_for(lambda: lock.exists() and '"pid": %d' % first.pid in lock.read_text())
    second = queue.watch()
    assert second.returncode == 3
    assert "pid %d" % first.pid in second.stderr
    queue.put(queue.task("tw"))
    assert wait_for(lambda: (queue.handoff / "results" / "tw.json").exists())
    first.send_signal(signal.SIGTERM)
    assert first.wait(10) == 0
    meta = json.loads(lock.read_text())
    assert meta["released_at"] and meta["pid"] == first.pid and meta["heartbeat_at"]
    assert queue.watch().returncode == 0  # the lock is free again


@pytest.mark.parametrize("sig, step", [(signal.SIGINT, "agent"), (signal.SIGTERM, "verify")])
def test_a_stop_during_a_task_parks_the_work_and_requeues_the_same_attempt(queue, tmp_path,
                                                                             sig, step):
    """SIGINT/SIGTERM mid-task ends like a crash recovery: the groups are stopped, the
    work parked on its branch, the base checked out, the task re-queued as the same
    attempt with the interrupted result kept in the history; exit 128+N."""
    pids = tmp_path / "pids"
    agent = {"write": {"t.txt": "partial\n"}, "grandchild": True, "pidfile": str(pids)}
    commands = ["true"]
    if step == "agent":
        agent["sleep"] = 60
    else:
        commands = ["echo $$ >> %s; sleep 60" % pids]
    queue.put(queue.task("term", agent=agent, commands_to_run=commands))
    watcher = queue.popen_watch("--once")
    assert wait_for(lambda: pids.exists() and len(pids.read_text().split()) == (2 if step == "agent" else 3))
    watcher.send_signal(sig)
    assert watcher.wait(20) == 128 + sig
    assert not (queue.handoff / "results" / "term.json").exists()
    [record] = queue.history("term")
    assert (record["status"], record["reason"], record["attempt"]) == ("failed", "interrupted", 1)
    assert sig.name in record["detail"] and "re-queued as attempt 1" in record["detail"]
    assert record["git"]["wip_commit"] and record["git"]["returned_to_base"] is True
    assert queue.names("running") == [] and queue.names("failed") == []
    assert queue.names("tasks") == ["term.json"]
    for pid in map(int, pids.read_text().split()):
        assert wait_for(lambda: not process_running(pid), 5), pid
    assert branch(queue.repo) == "main" and git(queue.repo, "status", "--porcelain") == ""
    assert git(queue.repo, "show", "feat/ai/term:t.txt") == "partial\n"
    meta = json.loads((queue.handoff / "locks" / "__worker__.lock").read_text())
    assert meta.get("released_at")
    # the re-run is attempt 1 again, on the same branch, and keeps the history
    task = json.loads((queue.handoff / "tasks" / "term.json").read_text())
    assert task["attempt"] == 1
    task["fixture_agent"] = {"write": {"t.txt": "done\n"}}
    task["commands_to_run"] = ["true"]
    queue.put(task)
    assert queue.watch().returncode == 0
    r = queue.result("term")
    assert (r["status"], r["attempt"], r["git"]["branch"]) == ("success", 1, "feat/ai/term")
    assert [p["reason"] for p in r["previous_results"]] == ["interrupted"]


def crash_while_agent_runs(queue, tmp_path, **task_fields):
    pids = tmp_path / "pids"
    count = tmp_path / "runs"
    queue.put(queue.task("crash", agent={"sleep": 60, "sleep_attempts": [1], "pidfile": str(pids),
                                         "count_file": str(count), "write": {"c.txt": "c\n"}},
                         **task_fields))
    watcher = queue.popen_watch("--once")
    assert wait_for(lambda: pids.exists() and pids.read_text().strip())
    os.kill(watcher.pid, signal.SIGKILL)
    watcher.wait(10)
    assert queue.names("running") == ["crash.json"]
    return int(pids.read_text().split()[0]), count


def test_kill_9_then_restart_recovers_with_a_result(queue, tmp_path):
    agent_pid, _count = crash_while_agent_runs(queue, tmp_path)
    out = queue.watch()
    assert out.returncode == 4, out.stderr  # failed after recovery
    r = queue.result("crash")
    assert (r["status"], r["exit_path"], r["reason"]) == ("failed", "failed", "stale_lock_recovered")
    assert SEED_RESULT_KEYS <= set(r) and SEED_GIT_KEYS <= set(r["git"])
    assert r["git"]["wip_commit"] and r["git"]["returned_to_base"] is True
    assert "no longer runs" in r["detail"] and "moved to failed/" in r["detail"]
    assert r["lock"]["recovered_from"]["task_id"] == "crash"
    assert queue.names("running") == [] and queue.names("failed") == ["crash.json"]
    assert queue.names("locks") == ["__worker__.lock"]
    assert wait_for(lambda: not process_running(agent_pid), 5)  # the orphaned agent was stopped
    # its partial work was parked on the task branch, the repo is back on main and clean
    assert branch(queue.repo) == "main" and git(queue.repo, "status", "--porcelain") == ""
    assert git(queue.repo, "show", "feat/ai/crash:c.txt") == "c\n"


def test_kill_9_with_retries_left_really_reruns(queue, tmp_path):
    _pid, count = crash_while_agent_runs(queue, tmp_path, retry_policy={"max_attempts": 2})
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    r = queue.result("crash")
    assert r["status"] == "success" and r["attempt"] == 2
    assert count.read_text().splitlines() == ["run attempt 1", "run attempt 2"]
    history = queue.history("crash")
    assert [(h["reason"], h["attempt"]) for h in history] == [("stale_lock_recovered", 1)]
    assert queue.names("running") == [] and queue.names("tasks") == []


def test_unlock_clears_only_provably_stale_locks(queue):
    lock = queue.handoff / "locks" / "__worker__.lock"
    dead = subprocess.Popen(["true"])
    dead.wait()
    ident = {"pid": dead.pid, "host": os.uname().nodename, "created_at": "2026-01-01T00:00:00+00:00",
             "mode": "flock"}
    boot = Path("/proc/sys/kernel/random/boot_id")
    if boot.exists():
        ident["boot_id"] = boot.read_text().strip()
    lock.write_text(json.dumps(ident))
    out = queue.bridge("status")
    out = queue.bridge("unlock")
    assert out.returncode == 0 and "pid %d" % dead.pid in out.stdout, out.stderr
    assert json.loads(lock.read_text())["released_at"]
    assert "no worker lock" in queue.bridge("unlock").stdout
    live = queue.popen_watch()
    assert wait_for(lambda: '"pid": %d' % live.pid in lock.read_text())
    out = queue.bridge("unlock")
    assert out.returncode == 3 and "pid %d" % live.pid in out.stderr
    live.terminate()
    assert live.wait(10) == 0


def test_watch_usage_errors(queue, tmp_path):
    bad = tmp_path / "bad-config.json"
    bad.write_text(json.dumps({"executor": {"command": "opencode run"}}))
    out = run_bridge("watch", "--once", "--root", queue.repo, "--config", bad)
    assert out.returncode == 2 and "executor.command" in out.stderr
    out = run_bridge("watch", "--once", "--root", tmp_path)
    assert out.returncode == 2 and "init" in out.stderr
    bad.write_text("{\n  \"stop_on_failure\": tru\n}")
    out = run_bridge("watch", "--once", "--root", queue.repo, "--config", bad)
    assert out.returncode == 2 and "line 2" in out.stderr and "Traceback" not in out.stderr


def test_status_reports_counts_and_recent_failures(queue):
    queue.put(queue.task("st1", commands_to_run=["false"]))
    queue.watch()
    queue.put(queue.task("st2"))
    out = queue.bridge("status")
    assert out.returncode == 0
    assert "queued 1" in out.stdout and "st1" in out.stdout and "verify_failed" in out.stdout
    report = json.loads(queue.bridge("status", "--json").stdout)
    assert report["queued"] == 1 and report["results"] == {"failed": 1}
    assert report["recent_failures"][0]["id"] == "st1" and report["worker"] is None
    (queue.handoff / "results" / "junk.json").write_text("[1, 2]")
    report = json.loads(queue.bridge("status", "--json").stdout)
    assert {"id": "junk", "reason": "unreadable result",
            "detail": str(queue.handoff / "results" / "junk.json") + " does not hold a JSON object"} \
        in report["recent_failures"]


def test_status_json_spells_out_c1_control_characters(queue):
    """Results and task file names are agent-writable: `status --json` prints them ASCII-only,
    so a C1 control (U+009B is a terminal's CSI) never reaches the terminal raw."""
    (queue.handoff / "results" / "c1.json").write_text(json.dumps(
        {"id": "c1\u009b2J", "status": "failed", "exit_path": "failed",
         "reason": "why\u0085\u009d0;pwned\u0007", "detail": "d\u0090"}))
    (queue.handoff / "tasks" / "bad\u009bname.txt").write_text("{}")
    out = queue.bridge("status", "--json")
    assert out.returncode == 0, out.stderr
    assert re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", out.stdout) is None and out.stdout.isascii(), out.stdout
    report = json.loads(out.stdout)
    assert report["recent_failures"][0]["id"] == "c1\u009b2J"
    assert report["recent_failures"][0]["reason"] == "why\u0085\u009d0;pwned\u0007"
    assert "\\u009b" in out.stdout


def test_status_text_spells_out_control_characters_in_result_states_and_the_lock_holder(queue):
    """The result files and the worker lock's content are agent-writable: `status` prints a result's
    status and the lock holder's host with their control characters spelled `\\xNN`."""
    import fcntl
    (queue.handoff / "results" / "r1.json").write_text(json.dumps({"id": "r1", "status": "ok\x1b[2J"}))
    lock = queue.handoff / "locks" / "__worker__.lock"
    lock.parent.mkdir(exist_ok=True)
    with open(lock, "w") as handle:
        handle.write(json.dumps({"pid": 1, "host": "h\x1b]0;pwned\x07", "created_at": "x\x9b2J"}))
        handle.flush()
        fcntl.flock(handle, fcntl.LOCK_EX)  # held, as a running watcher holds it
        out = queue.bridge("status")
    assert out.returncode == 0, out.stderr
    assert re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", out.stdout) is None, out.stdout
    assert "ok\\x1b[2J 1" in out.stdout and "h\\x1b]0;pwned\\x07" in out.stdout, out.stdout
    # a lone surrogate (valid JSON escape, no UTF-8 form) is spelled out, not a crash of status
    (queue.handoff / "results" / "r2.json").write_text(
        '{"id": "r2", "status": "failed", "exit_path": "failed", "reason": "x\\ud800y"}')
    out = queue.bridge("status")
    assert out.returncode == 0 and "r2  failed/x\\ud800y" in out.stdout, out


def test_log_size_cap_must_be_at_least_one_kb(queue, tmp_path):
    bad = tmp_path / "cap.json"
    bad.write_text(json.dumps({"log_size_cap_kb": 0}))
    out = run_bridge("watch", "--once", "--root", queue.repo, "--config", bad)
    assert out.returncode == 2 and "log_size_cap_kb" in out.stderr


def test_sweep_age_rule_for_locks_not_provably_dead(queue):
    """A task lock from another host is stale only after max(timeout_sec*2, 2h)."""
    for task_id, age in (("old", 3 * 3600), ("young", 60)):
        task = queue.task(task_id, timeout_sec=60)
        (queue.handoff / "running" / (task_id + ".json")).write_text(json.dumps(task))
        beat = time.time() - age
        (queue.handoff / "locks" / (task_id + ".lock")).write_text(json.dumps(
            {"pid": 12345, "host": "another-host", "task_id": task_id, "created_ts": beat,
             "heartbeat_ts": beat, "mode": "flock"}))
    out = queue.watch()
    assert out.returncode == 4, out.stderr
    r = queue.result("old")
    assert r["reason"] == "stale_lock_recovered" and "older than 7200s" in r["detail"]
    assert r["lock"]["recovered_from"]["host"] == "another-host"
    assert not (queue.handoff / "results" / "young.json").exists()
    assert queue.names("running") == ["young.json"] and "not provably stale" in out.stderr


def test_worker_lock_heartbeat_is_refreshed(git_repo, tmp_path):
    queue = Queue(git_repo, tmp_path, worker_lock_ttl_sec=4)  # heartbeat every 1 s
    watcher = queue.popen_watch()
    lock = queue.handoff / "locks" / "__worker__.lock"
    assert wait_for(lambda: lock.exists() and '"pid": %d' % watcher.pid in lock.read_text())
    first = json.loads(lock.read_text())["heartbeat_ts"]
    assert wait_for(lambda: json.loads(lock.read_text())["heartbeat_ts"] > first, 5)
    meta = json.loads(lock.read_text())
    assert {"pid", "created_at", "host", "heartbeat_at"} <= set(meta)
    watcher.terminate()
    assert watcher.wait(10) == 0


def test_detached_head_runs_on_a_task_branch_and_returns(queue):
    base = head(queue.repo)
    git(queue.repo, "checkout", "-q", "--detach")
    queue.put(queue.task("det"))
    assert queue.watch().returncode == 0
    r = queue.result("det")
    assert r["status"] == "success" and r["git"]["branch"] == "feat/ai/det"
    assert r["git"]["base_branch"] is None and r["git"]["returned_to_base"] is True
    assert git(queue.repo, "symbolic-ref", "-q", "HEAD", check=False) == ""  # detached again
    assert head(queue.repo) == base


def test_make_demo_script_runs_and_prints_every_result():
    out = subprocess.run(["bash", str(FIXTURES / "demo.sh")], capture_output=True, text=True,
                         env=clean_env(), timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-2000:]
    for expected in ("reason verified", "reason verify_failed", "reason requires_confirmation",
                     "approved 2026-01-15_03_remove-readme", "demo done.",
                     "notify: 2026-01-15_02_bump-version failed verify_failed"):
        assert expected in out.stdout, expected


def test_ai_handoff_never_committed_even_if_exclude_was_removed(queue):
    exclude = queue.repo / ".git" / "info" / "exclude"
    exclude.write_text("# emptied by someone\n")
    queue.put(queue.task("ex"))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    assert "/.ai-handoff/" in exclude.read_text()  # the watcher put it back before any task
    commit = queue.result("ex")["git"]["commit"]
    files = git(queue.repo, "show", "--name-only", "--format=", commit).split()
    assert files == ["ex.txt"]


def test_submit_from_stdin(queue):
    out = run_bridge("submit", "-", "--root", queue.repo, input=json.dumps(queue.task("stdin-task")))
    assert out.returncode == 0 and "queued stdin-task" in out.stdout, out.stderr
    out = run_bridge("submit", "-", "--root", queue.repo, input="{not json")
    assert out.returncode == 2 and "stdin" in out.stderr


# ---- special files and symlinks under .ai-handoff/ ------------------------------

def _outside_untouched(outside):
    return list(outside.iterdir()) == []


@pytest.mark.parametrize("where", ["results", "history"])
def test_fifo_where_the_watcher_reads_state_fails_the_task_naming_it(queue, where):
    """A FIFO at results/<id>.json or meta/<id>.results.jsonl: the task fails naming it
    before the agent runs, and `submit --retry` stops with exit 2 naming it; a plain open()
    blocked forever, holding the worker lock."""
    path = queue.handoff / ("results/t1.json" if where == "results" else "meta/t1.results.jsonl")
    os.mkfifo(path)
    queue.put(queue.task("t1"))
    out = queue.watch(timeout=20)
    assert out.returncode == 1, out.stderr
    assert str(path) in out.stderr and "not a regular file" in out.stderr
    assert queue.names("failed") == ["t1.json"] and not (queue.repo / "t1.txt").exists()
    # a result is still written: the FIFO in its place is moved aside, never opened
    assert (queue.handoff / "results" / "t1.json").is_file(), out.stderr
    result = queue.result("t1")
    assert result["reason"] == "internal_error" and str(path) in result["detail"], result
    if where == "results":
        assert "t1.result-unreadable" in queue.names("meta")
    else:
        assert "not a regular file" in result["history_error"]
        out = queue.bridge("submit", "--retry", queue.handoff / "failed" / "t1.json", timeout=20)
        assert out.returncode == 2 and str(path) in out.stderr
    assert queue.watch(timeout=20).returncode == 0  # the worker lock was released


def test_fifo_at_the_task_log_fails_the_task_with_a_result(queue):
    path = queue.handoff / "logs" / "t1.log"
    os.mkfifo(path)
    queue.put(queue.task("t1"))
    out = queue.watch(timeout=30)
    result = queue.result("t1")
    assert result["status"] == "failed" and str(path) in result["detail"], (out.stderr, result)
    assert branch(queue.repo) == "main"


def test_fifo_task_file_is_skipped_naming_it_not_a_hang(queue):
    """A FIFO in tasks/ (a plain open() would wait for a writer for ever, holding the worker
    lock) is refused as schema_invalid naming it; the next task still runs."""
    path = queue.handoff / "tasks" / "t1.json"
    os.mkfifo(path)
    queue.put(queue.task("t2"))
    out = queue.watch(timeout=20)
    assert out.returncode == 4 and str(path) in out.stderr and "not a regular file" in out.stderr
    assert queue.result("t1")["reason"] == "schema_invalid" and queue.result("t2")["status"] == "success"


def test_a_lone_surrogate_in_a_task_is_schema_invalid_with_a_result(queue, tmp_path):
    """JSON's "\\ud800" alone is valid JSON with no UTF-8 form: such a task failed as internal_error
    and its result could not be written (nor could submit queue it: an internal error). It is
    schema_invalid naming the field, with a result, and the next task still runs."""
    task = queue.task("s1")
    path = queue.put(task)
    path.write_text(json.dumps(task)[:-1] + ', "goal": "g\\ud800"}')
    queue.put(queue.task("s2"))
    out = queue.watch(timeout=60)
    assert out.returncode == 4, out.stderr
    result = queue.result("s1")
    assert result["reason"] == "schema_invalid" and "goal: holds a lone surrogate" in result["errors"][0], result
    assert queue.result("s2")["status"] == "success"
    planned = tmp_path / "s3.json"
    planned.write_text(json.dumps(queue.task("s3"))[:-1] + ', "goal": "g\\udc00"}')
    out = queue.bridge("submit", str(planned))
    assert out.returncode == 2 and "goal" in out.stderr and "internal error" not in out.stderr, out.stderr


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_planted_worker_lock_stops_the_watcher_naming_it(queue, tmp_path, kind):
    """A FIFO or a symlink as locks/__worker__.lock: the watcher exits 2 naming it before any
    task starts (never waits on it, never locks the file a link points to)."""
    lock, outside = queue.handoff / "locks" / "__worker__.lock", tmp_path / "outside.lock"
    os.mkfifo(lock) if kind == "fifo" else lock.symlink_to(outside)
    queue.put(queue.task("t1"))
    out = queue.watch(timeout=20)
    assert out.returncode == 2 and "cannot lock %s" % lock in out.stderr, out.stderr
    assert ("not a regular file" if kind == "fifo" else "symlink") in out.stderr
    assert queue.names("tasks") == ["t1.json"] and not outside.exists()


def test_symlinked_task_lock_fails_the_task_naming_it_not_a_crash(queue, tmp_path):
    """A symlink at locks/<id>.lock (today: an ELOOP crash on every start) fails that task
    with a result naming it; the lock is never followed, the agent never runs."""
    outside = tmp_path / "outside.lock"
    (queue.handoff / "locks" / "t1.lock").symlink_to(outside)
    queue.put(queue.task("t1"))
    out = queue.watch(timeout=20)
    result = queue.result("t1")
    assert result["reason"] == "internal_error", out.stderr
    assert str(queue.handoff / "locks" / "t1.lock") in result["detail"]
    assert "symlink" in result["detail"]
    assert queue.watch(timeout=20).returncode == 0  # the next start is clean
    assert not outside.exists() and not (queue.repo / "t1.txt").exists()


@pytest.mark.parametrize("name", ["results", "logs", "patches", "locks", "meta"])
def test_symlinked_state_folder_is_refused_never_written_through(queue, tmp_path, name):
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = queue.handoff / name
    folder.rmdir()
    folder.symlink_to(outside)
    queue.put(queue.task("t1"))
    out = queue.watch(timeout=30)
    assert out.returncode == 2, out.stderr
    assert str(folder) in out.stderr and "symlink" in out.stderr
    assert _outside_untouched(outside) and queue.names("tasks") == ["t1.json"]
    out = queue.bridge("submit", queue.handoff.parent / "x.json", timeout=20)
    assert out.returncode == 2 and str(folder) in out.stderr


def test_state_folder_swapped_for_a_symlink_mid_task_is_never_written_through(queue, tmp_path):
    """A verify command (or the agent) replaces results/ and patches/ with links to a folder
    outside while the task runs: nothing is written there; the watcher stops naming it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    swap = " && ".join("rm -rf .ai-handoff/%s && ln -s %s .ai-handoff/%s" % (n, outside, n)
                       for n in ("results", "patches", "logs"))
    queue.put(queue.task("t1", commands_to_run=[swap]))
    out = queue.watch(timeout=60)
    assert out.returncode == 2, out.stderr
    assert "symlink" in out.stderr and str(queue.handoff) in out.stderr
    assert _outside_untouched(outside)


def test_readme_quick_start_runs_as_written(tmp_path):
    """The README's watch quick start, taken from between its marker comments and run with
    sh in a fresh repository: the first task succeeds (not dirty_repo), the repo stays clean."""
    script = readme_quickstart("quickstart watch")
    repo = make_git_repo(tmp_path / "mine")
    out = subprocess.run(["sh", "-ec", script], cwd=repo, env=clean_env(src=str(BRIDGE.parent)),
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads((repo / ".ai-handoff" / "results" / "2026-01-15_01_hello.json").read_text())
    assert (result["status"], result["reason"]) == ("success", "verified"), result["detail"]
    assert branch(repo) == "main" and git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert git(repo, "show", "feat/ai/2026-01-15_01_hello:hello.txt") == "hello\n"


def test_a_daemon_holding_the_agents_output_neither_wedges_the_queue_nor_loses_its_output(
        queue, tmp_path):
    """An agent whose daemon leaves its process group (setsid) keeping its stdout and stderr
    open: the group kill cannot reach it and the pipes never end. The watcher waits for them
    a bounded time, keeps what the agent printed, says why in the log, and the queue goes
    on; the daemon itself lives on (bridge.py kills only what stays in the group)."""
    pidfile = tmp_path / "daemon.pid"
    queue.put(queue.task("d1", agent={"print": "the agent's own words", "daemon": [300, str(pidfile)]}))
    queue.put(queue.task("d2"))
    try:
        out = queue.watch(timeout=60)
        assert out.returncode == 0, out.stderr
        r = queue.result("d1")
        assert (r["status"], r["reason"]) == ("success", "verified"), r["detail"]
        assert "the agent's own words" in r["executor"]["stdout"]
        assert "held open" in (queue.handoff / "logs" / "d1.log").read_text()
        assert queue.result("d2")["status"] == "success"
        assert process_running(int(pidfile.read_text()))
    finally:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_the_prompt_kept_is_redacted_when_a_step_before_the_agent_fails(queue):
    """The agent's copy of the prompt (unredacted) is written only right before the agent
    runs: a step failing in between (here git's config, changed by the bead command, defines
    a filter driver git cannot switch off) leaves the redacted copy the result names."""
    secret = "sk-proj-" + "Q1w2E3r4" * 5
    plant = "printf '[filter \"a=b\"]\\n\\tclean = cat\\n' >> .git/config; echo bd-1"
    queue.config["bead"] = {"command": ["sh", "-c", plant, "bd"]}
    queue.save_config()
    queue.put(queue.task("pf", prompt="Rotate the key %s in config.py." % secret))
    queue.watch()
    result = queue.result("pf")
    assert result["status"] == "failed" and "filter driver" in result["detail"], result
    prompt = queue.handoff / "meta" / "pf.prompt.md"
    assert not prompt.exists() or secret not in prompt.read_text()
