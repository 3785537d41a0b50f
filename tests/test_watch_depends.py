"""`depends_on` in watch tasks, through the CLI on real git repositories with the fixture
agent: a task starts only after its dependencies succeeded, from their work; a failed,
unknown or circular dependency blocks it with a result saying why."""
import json

from conftest import FIXTURES, PYTHON, clean_env, git
from test_watch import Queue, head  # noqa: F401  (the queue fixture's class)

import pytest


@pytest.fixture
def queue(git_repo, tmp_path):
    return Queue(git_repo, tmp_path, continue_on_failure=True)


def status(queue):
    out = queue.bridge("status", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_chain_starts_from_the_dependency_commit_and_sees_its_change(queue):
    base = head(queue.repo)
    queue.put(queue.task("a", agent={"write": {"a.txt": "from a\n"}}))
    # b sorts after a, verifies that a's file is there and adds its own
    queue.put(queue.task("b", depends_on=["a"], agent={"write": {"b.txt": "from b\n"}},
                         commands_to_run=["grep -q 'from a' a.txt", "test -f b.txt"]))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    a, b = queue.result("a"), queue.result("b")
    assert a["status"] == "success" and b["status"] == "success", b["detail"]
    assert b["git"]["base_commit"] == a["git"]["commit"]  # the audit's base: where it started
    assert b["git"]["base_head"] == base and b["git"]["branch"] == "feat/ai/b"
    assert b["dependencies"] == [{"id": "a", "status": "success", "reason": "verified",
                                  "commit": a["git"]["commit"]}]
    patch = (queue.handoff / b["artifacts"]["patch_post"]).read_text()
    assert "b.txt" in patch and "a.txt" not in patch  # only b's own work
    assert git(queue.repo, "rev-parse", "feat/ai/b~1").strip() == a["git"]["commit"]
    assert head(queue.repo) == base and git(queue.repo, "status", "--porcelain") == ""


def test_a_task_queued_before_its_dependency_waits_and_the_dependency_runs_first(queue):
    count = queue.repo.parent / "order.txt"
    queue.put(queue.task("1_b", depends_on=["2_a"],
                         agent={"append": {str(count): "b\n"}, "write": {"b.txt": "b\n"}}))
    queue.put(queue.task("2_a", agent={"append": {str(count): "a\n"}, "write": {"a.txt": "a\n"}}))
    queue.put(queue.task("3_c", agent={"append": {str(count): "c\n"}, "write": {"c.txt": "c\n"}}))
    report = status(queue)
    assert report["waiting"] == [{"id": "1_b", "state": "waiting",
                                  "detail": "waiting for 2_a (queued)"}]
    out = queue.bridge("status")
    assert "1_b waiting for 2_a (queued)" in out.stdout
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    # the waiting task is skipped, not refused; the queue goes on; it runs once 2_a succeeded
    assert count.read_text() == "a\nb\nc\n"
    assert "1_b: waiting for 2_a (queued)" in out.stderr
    assert {queue.result(t)["status"] for t in ("1_b", "2_a", "3_c")} == {"success"}
    assert status(queue)["waiting"] == []


def test_a_failed_dependency_blocks_its_dependents_transitively(queue):
    queue.put(queue.task("a", commands_to_run=["false"]))
    queue.put(queue.task("b", depends_on=["a"]))
    queue.put(queue.task("c", depends_on=["b"]))
    out = queue.watch()
    assert out.returncode == 4, out.stderr
    assert queue.result("a")["reason"] == "verify_failed"
    b, c = queue.result("b"), queue.result("c")
    assert (b["status"], b["exit_path"], b["reason"]) == ("blocked", "blocked", "dependency_failed")
    assert b["detail"] == "dependency a ended failed (verify_failed)"
    assert b["dependencies"][0] == {"id": "a", "status": "failed", "reason": "verify_failed",
                                    "commit": None}
    assert c["reason"] == "dependency_failed" and "b ended blocked (dependency_failed)" in c["detail"]
    assert b["executor"] is None and not (queue.repo / "b.txt").exists()
    assert sorted(queue.names("failed")) == ["a.json", "b.json", "c.json"]
    for ref in ("feat/ai/b", "feat/ai/c"):  # nothing started: no branch
        assert git(queue.repo, "rev-parse", "--verify", "-q", ref, check=False) == ""
    failures = {item["id"]: item for item in status(queue)["recent_failures"]}
    assert failures["b"]["reason"] == "dependency_failed" and "a ended failed" in failures["b"]["detail"]
    out = queue.bridge("status")
    assert "b  blocked/dependency_failed  dependency a ended failed (verify_failed)" in out.stdout


def test_a_retried_dependency_that_succeeds_releases_its_blocked_dependent(queue, tmp_path):
    queue.put(queue.task("a", commands_to_run=["test -f fixed.txt"]))
    queue.put(queue.task("b", depends_on=["a"]))
    assert queue.watch().returncode == 4
    assert queue.result("b")["reason"] == "dependency_failed"
    # submit --retry of b while a still failed is refused: it would be blocked again
    retry_b = tmp_path / "b.json"
    retry_b.write_text(json.dumps(queue.task("b", depends_on=["a"])))
    out = queue.bridge("submit", "--retry", retry_b)
    assert out.returncode == 2 and "depends_on: dependency a ended failed (verify_failed)" in out.stderr
    # a retried, and fixed this time; b retried while a waits in the queue: b waits
    retry_a = tmp_path / "a.json"
    retry_a.write_text(json.dumps(queue.task("a", commands_to_run=["test -f fixed.txt"],
                                             agent={"write": {"fixed.txt": "ok\n"}})))
    assert queue.bridge("submit", "--retry", retry_a).returncode == 0
    assert queue.bridge("submit", "--retry", retry_b).returncode == 0
    assert status(queue)["waiting"] == [{"id": "b", "state": "waiting",
                                         "detail": "waiting for a (queued)"}]
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    a, b = queue.result("a"), queue.result("b")
    assert (a["status"], a["attempt"], b["status"], b["attempt"]) == ("success", 2, "success", 2)
    assert b["git"]["base_commit"] == a["git"]["commit"]
    assert [r["reason"] for r in queue.history("b")] == ["dependency_failed"]
    assert b["retry_context"] is None  # its blocked attempt never ran: nothing to tell the agent


def test_unknown_dependency_is_refused_by_submit_and_blocked_by_the_watcher(queue, tmp_path):
    task = tmp_path / "b.json"
    task.write_text(json.dumps(queue.task("b", depends_on=["nosuch"])))
    out = queue.bridge("submit", task)
    assert out.returncode == 2, out.stderr
    assert "depends_on: dependency nosuch is unknown" in out.stderr
    assert queue.names("tasks") == []
    queue.put(queue.task("b", depends_on=["nosuch"]))  # dropped in by a planner
    out = queue.watch()
    assert out.returncode == 4
    b = queue.result("b")
    assert (b["status"], b["reason"]) == ("blocked", "dependency_failed")
    assert "nosuch is unknown (not queued, running or pending, and it has no result)" in b["detail"]
    assert b["dependencies"] == [{"id": "nosuch", "status": "unknown", "reason": None, "commit": None}]


def test_a_cycle_is_blocked_with_its_path_and_never_busy_waits(queue):
    queue.put(queue.task("a", depends_on=["c"]))
    queue.put(queue.task("b", depends_on=["a"]))
    queue.put(queue.task("c", depends_on=["b"]))
    queue.put(queue.task("d"))
    out = queue.watch(timeout=30)
    assert out.returncode == 4, out.stderr
    a = queue.result("a")
    assert (a["status"], a["exit_path"], a["reason"]) == ("blocked", "blocked", "dependency_cycle")
    assert "depends_on forms a cycle (a -> c -> b -> a)" in a["detail"]
    # the others wait on a task of the cycle: they are blocked by it
    for task_id in ("b", "c"):
        assert queue.result(task_id)["reason"] in ("dependency_cycle", "dependency_failed")
    assert queue.result("d")["status"] == "success"
    assert queue.names("tasks") == []


def test_depends_on_is_validated_naming_the_field(queue, tmp_path):
    bad = tmp_path / "bad.json"
    cases = [("x", "depends_on: must be a list"),
             ([3], "depends_on[0]: must be a task id, got 3"),
             (["../x"], "depends_on[0]: '../x' must match"),
             (["x.lock"], "depends_on[0]: 'x.lock' is not a valid branch name"),
             (["t"], "depends_on[0]: 't' is the task itself"),
             (["a", "a"], "depends_on[1]: 'a' is listed twice"),
             (["d%d" % n for n in range(17)], "depends_on: at most 16 dependencies, got 17")]
    for value, message in cases:
        bad.write_text(json.dumps(queue.task("t", depends_on=value)))
        out = queue.bridge("submit", bad)
        assert out.returncode == 2 and message in out.stderr, (value, out.stderr)
    queue.put(queue.task("t", depends_on=["t"]))
    assert queue.watch().returncode == 4
    r = queue.result("t")
    assert r["reason"] == "schema_invalid" and "depends_on[0]" in r["errors"][0]


def test_several_dependencies_start_from_the_one_containing_the_others(queue):
    """c depends on a and b, b built on a: c starts from b's commit (a chain)."""
    queue.put(queue.task("a", agent={"write": {"a.txt": "a\n"}}))
    queue.put(queue.task("b", depends_on=["a"], agent={"write": {"b.txt": "b\n"}}))
    queue.put(queue.task("c", depends_on=["a", "b"], agent={"write": {"c.txt": "c\n"}},
                         commands_to_run=["test -f a.txt && test -f b.txt"]))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    assert queue.result("c")["git"]["base_commit"] == queue.result("b")["git"]["commit"]


def test_several_dependencies_on_separate_branches_wait_for_a_merge(queue):
    queue.put(queue.task("a", agent={"write": {"a.txt": "a\n"}}))
    queue.put(queue.task("b", agent={"write": {"b.txt": "b\n"}}))
    queue.put(queue.task("c", depends_on=["a", "b"], agent={"write": {"c.txt": "c\n"}},
                         commands_to_run=["test -f a.txt && test -f b.txt"]))
    out = queue.watch()
    assert out.returncode == 4, out.stderr  # a task still waits: it needs a person
    assert queue.names("tasks") == ["c.json"]  # waits: the watcher merges nothing
    a, b = queue.result("a")["git"]["commit"], queue.result("b")["git"]["commit"]
    detail = ("the work of a (%s), b (%s) is on separate branches: merge it into the base "
              "branch (the watcher merges nothing), then the task starts from there" % (a[:12], b[:12]))
    assert "c: " + detail in out.stderr
    assert status(queue)["waiting"] == [{"id": "c", "state": "waiting", "detail": detail}]
    git(queue.repo, "merge", "-q", "--no-edit", "feat/ai/a", "feat/ai/b")
    merged = head(queue.repo)
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    c = queue.result("c")
    assert c["status"] == "success" and c["git"]["base_commit"] == merged
    assert c["git"]["branch"] == "feat/ai/c"


def test_a_dependency_done_on_the_base_branch_itself_needs_no_chain(queue):
    """On a branch that is not protected every task commits on it: the dependent simply
    runs there after it (queued first, it waits for it)."""
    git(queue.repo, "checkout", "-q", "-b", "dev")
    queue.put(queue.task("2_a", agent={"write": {"a.txt": "a\n"}}))
    queue.put(queue.task("1_b", depends_on=["2_a"], commands_to_run=["test -f a.txt"]))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    a, b = queue.result("2_a"), queue.result("1_b")
    assert a["git"]["branch"] == b["git"]["branch"] == "dev"
    assert b["git"]["base_commit"] == a["git"]["commit"] == git(
        queue.repo, "rev-parse", "dev~1").strip()


def test_a_refused_dependency_blocks_and_a_pending_one_keeps_waiting(queue):
    queue.put(queue.task("a", prompt=""))  # schema_invalid
    queue.put(queue.task("b", depends_on=["a"]))
    queue.put(queue.task("c", requires_confirmation=True, agent={"write": {"c.txt": "c\n"}}))
    queue.put(queue.task("d", depends_on=["c"], commands_to_run=["test -f c.txt"]))
    out = queue.watch()
    assert out.returncode == 4, out.stderr
    assert queue.result("b")["detail"] == "dependency a ended failed (schema_invalid)"
    assert queue.names("tasks") == ["d.json"] and queue.names("pending") == ["c.json"]
    assert "d: waiting for c (pending approval)" in out.stderr
    assert queue.bridge("approve", "c").returncode == 0
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    assert queue.result("d")["git"]["base_commit"] == queue.result("c")["git"]["commit"]


def test_a_chain_from_a_detached_head_returns_to_that_commit(queue):
    git(queue.repo, "commit", "-q", "--allow-empty", "-m", "second")
    git(queue.repo, "checkout", "-q", "--detach", "HEAD~1")
    detached = head(queue.repo)
    queue.put(queue.task("a", agent={"write": {"a.txt": "a\n"}}))
    queue.put(queue.task("b", depends_on=["a"], commands_to_run=["test -f a.txt"]))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    b = queue.result("b")
    assert b["git"]["base_commit"] == queue.result("a")["git"]["commit"]
    assert b["git"]["base_head"] == detached and b["git"]["returned_to_base"] is True
    assert head(queue.repo) == detached  # not a's commit: the checkout given back as it was
    assert git(queue.repo, "symbolic-ref", "-q", "HEAD", check=False) == ""


def test_a_chained_task_killed_with_the_watcher_is_recovered_onto_its_chain(queue):
    """SIGKILL of the watcher while a chained task's agent runs: the next start parks the
    work on feat/ai/b, gives the checkout back on main and runs the retry on the same
    branch, still on top of a's work; every result names a's commit as base_commit."""
    base = head(queue.repo)
    queue.put(queue.task("a", agent={"write": {"a.txt": "a\n"}}))
    queue.put(queue.task("b", depends_on=["a"], retry_policy={"max_attempts": 2},
                         agent={"write": {"b.txt": "b\n"}, "kill_watcher": "start"},
                         commands_to_run=["test -f a.txt && test -f b.txt"]))
    out = queue.watch()
    assert out.returncode == -9, out.stderr
    a_commit = queue.result("a")["git"]["commit"]
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    first, = queue.history("b")
    assert (first["reason"], first["git"]["base_commit"]) == ("stale_lock_recovered", a_commit)
    b = queue.result("b")
    assert (b["status"], b["attempt"], b["git"]["branch"]) == ("success", 2, "feat/ai/b")
    git(queue.repo, "merge-base", "--is-ancestor", a_commit, "feat/ai/b")  # raises if not
    assert b["git"]["base_commit"] != base
    assert head(queue.repo) == base and git(queue.repo, "symbolic-ref", "--short", "HEAD").strip() == "main"


@pytest.mark.parametrize("isolation", ["checkout", "worktree"])
def test_a_chained_task_that_fails_before_its_agent_leaves_no_branch(queue, tmp_path, isolation):
    """bd fails as b starts: b's empty branch, made from a's commit (not merged into main),
    is removed all the same (and in worktree isolation its worktree); a's branch stays."""
    queue.config["isolation"] = isolation
    queue.save_config()
    queue.put(queue.task("a", agent={"write": {"a.txt": "a\n"}}))
    assert queue.watch().returncode == 0
    queue.config["bead"] = {"command": [PYTHON, str(FIXTURES / "bd")], "timeout_sec": 5}
    queue.save_config()
    queue.env = clean_env(BD_FIXTURE_STATE=tmp_path / "bd.json", BD_FIXTURE_FAIL="create")
    queue.put(queue.task("b", depends_on=["a"]))
    assert queue.watch().returncode == 4
    b = queue.result("b")
    # in a worktree the branch goes after the result is written, with the worktree
    assert (b["reason"], b["executor"], b["git"]["branch_created"]) == (
        "bead_failed", None, isolation == "worktree")
    assert git(queue.repo, "branch", "--list", "feat/ai/*").split() == ["feat/ai/a"]
    assert git(queue.repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_blocking_a_dependent_while_another_task_runs_is_no_tampering(git_repo, tmp_path):
    """workers 2: the watcher writes the blocked dependent's result while a task runs
    alongside; that task's guard must know the watcher wrote it, not its agent."""
    queue = Queue(git_repo, tmp_path, isolation="worktree", workers=2, continue_on_failure=True)
    queue.put(queue.task("1_a", commands_to_run=["false"]))
    queue.put(queue.task("2_b", depends_on=["1_a"]))
    queue.put(queue.task("3_x", commands_to_run=[
        "until test -e %s; do sleep 0.05; done" % (queue.handoff / "results" / "2_b.json")]))
    out = queue.watch(timeout=120)
    assert out.returncode == 4, out.stderr
    assert queue.result("2_b")["reason"] == "dependency_failed"
    x = queue.result("3_x")
    assert x["status"] == "success", (x["reason"], x["detail"])


def test_a_crash_between_a_dependency_block_and_its_move_is_finished_at_the_next_start(queue):
    """The blocked result is written while the task file is still in tasks/; a SIGKILL
    before its move to failed/ must not leave it queued for ever (skipped by idempotency,
    holding its own dependents in `waiting`): the next start files it away."""
    from test_watch_crash import crash_watch
    queue.put(queue.task("a", commands_to_run=["false"]))
    queue.put(queue.task("b", depends_on=["a"]))
    queue.put(queue.task("c", depends_on=["b"]))
    crash_watch(queue, None, {"event": "os.rename", "args": {"0": "/tasks/b.json", "1": "/failed/"}})
    before = queue.result("b")
    assert before["reason"] == "dependency_failed" and queue.names("tasks") == ["b.json", "c.json"]
    out = queue.watch()
    assert out.returncode == 4, out.stderr
    assert queue.result("b") == before  # the result stands: finished, not run again
    assert queue.names("tasks") == [] and queue.names("failed") == ["a.json", "b.json", "c.json"]
    assert queue.result("c")["detail"] == "dependency b ended blocked (dependency_failed)"
    assert status(queue)["waiting"] == []


def test_a_result_forged_by_an_agent_running_alongside_never_starts_a_dependent(git_repo, tmp_path):
    """workers 2: while 1_a's agent runs it removes the queued 9_d and writes a result
    saying 9_d succeeded with a commit of its own. Its tamper check moves the forgery away,
    but only when it ends: until then no dependent of 9_d may start from that commit."""
    release = tmp_path / "release"
    forge = ('h=$(dirname "$(dirname "$BRIDGE_TASK_FILE")"); echo evil > evil.txt; '
             'git add evil.txt; git -c user.name=x -c user.email=x@y commit -qm evil; '
             'printf \'{"id": "9_d", "status": "success", "exit_path": "success", '
             '"reason": "verified", "attempt": 1, "git": {"commit": "%%s"}}\' '
             '"$(git rev-parse HEAD)" > "$h/results/.f"; mv "$h/results/.f" "$h/results/9_d.json"; '
             'rm "$h/tasks/9_d.json"; until test -e %s; do sleep 0.05; done' % release)
    queue = Queue(git_repo, tmp_path, isolation="worktree", workers=2,
                  executors={"forge": ["sh", "-c", forge]})
    queue.put(queue.task("1_a", executor="forge"))
    queue.put(queue.task("2_t", depends_on=["9_d"], commands_to_run=["test ! -f evil.txt"]))
    queue.put(queue.task("9_d", depends_on=["1_a"]))
    watcher = queue.popen_watch("--once")
    try:
        seen = []
        while True:  # the watcher's first word on 2_t but "waiting for 9_d (queued)"
            line = watcher.stderr.readline()
            assert line, "".join(seen)
            seen.append(line)
            if "2_t: " in line and "(queued)" not in line:
                break
        assert "2_t: running the editing agent" not in line, line
        assert "9_d" in line and "while other agents ran" in line, line
    finally:
        release.touch()
        out, err = watcher.communicate(timeout=120)
    assert watcher.returncode == 1, err  # the tampering stops the queue
    assert queue.result("1_a")["reason"] == "agent_tampered"
    assert not (queue.handoff / "results" / "2_t.json").exists()
    assert queue.names("tasks") == ["2_t.json"]


def test_a_dependency_queued_again_after_its_result_holds_nothing(queue):
    """A planner drops a task file again after it ran: the watcher skips it (idempotency),
    so its dependents must go by its result instead of waiting for a run that never comes."""
    queue.put(queue.task("a"))
    queue.put(queue.task("f", commands_to_run=["false"]))
    assert queue.watch().returncode == 4
    queue.put(queue.task("a"))
    queue.put(queue.task("f", commands_to_run=["false"]))
    queue.put(queue.task("b", depends_on=["a"], commands_to_run=["test -f a.txt"]))
    queue.put(queue.task("c", depends_on=["f"]))
    out = queue.watch()
    assert out.returncode == 4, out.stderr
    assert queue.result("b")["status"] == "success", queue.result("b")["detail"]
    assert queue.result("c")["detail"] == "dependency f ended failed (verify_failed)"
    assert queue.names("tasks") == ["a.json", "f.json"]  # skipped, as before
    report = status(queue)  # and `status` says so, instead of counting them as queued work
    assert {item["name"]: item["reason"] for item in report["skipped_in_tasks"]} == dict.fromkeys(
        ["a.json", "f.json"], "already has a result for its attempt: never run again (`submit "
        "--retry` queues the next attempt)")


COUNT_OPENS = """import atexit, os, runpy, sys
opened = [0]
def hook(event, args):
    if event == "open" and "/tasks/" in str(args[0]):
        opened[0] += 1
sys.addaudithook(hook)
atexit.register(lambda: os.write(2, b"opened %d task files\\n" % opened[0]))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("command", ["status", "watch"])
def test_a_long_chain_reads_each_task_file_a_few_times_per_look(queue, command):
    """60 tasks in a chain, the last waiting for a pending one: every waiting task's cycle
    check walks the rest of the chain. Each task file is read a bounded number of times per
    look at the queue, not once per task whose walk reaches it (quadratic: 8 s for 300)."""
    import subprocess
    from conftest import BRIDGE
    queue.put(queue.task("zz_p", requires_confirmation=True))
    assert queue.watch().returncode == 4
    count = 60
    for n in range(count):
        queue.put(queue.task("t%03d" % n, depends_on=["t%03d" % (n + 1) if n + 1 < count else "zz_p"]))
    argv = [PYTHON, "-c", COUNT_OPENS, str(BRIDGE), command, "--root", str(queue.repo),
            "--config", str(queue.config_path)] + (["--once"] if command == "watch" else [])
    out = subprocess.run(argv, env=queue.env, capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert "waiting for zz_p (pending approval)" in out.stdout + out.stderr, out.stderr
    opened = int(out.stderr.rsplit("opened ", 1)[1].split()[0])
    assert opened <= 3 * count, opened
