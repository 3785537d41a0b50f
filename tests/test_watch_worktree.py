"""isolation "worktree" and workers > 1: each task in a git worktree of its own, several at once.

Through the CLI on real repositories with real `git worktree`s; the agents are fixtures/agent.py
processes running at the same time. Overlap is proven by a barrier the agents pass only when
all of them run at once (fixtures/agent.py `barrier`), never by timing.
"""
import json
import os
import shutil
import signal

import pytest

from conftest import FIXTURES, PYTHON, clean_env, git, load_bridge, process_running
from test_watch import Queue, branch, head, wait_for
from test_watch_crash import crash_watch

USER_FILES = {"README.md": "# test repo\nmy uncommitted edit\n", "mine.txt": "my own file\n"}


def worktree_queue(repo, tmp_path, **config):
    config.setdefault("isolation", "worktree")
    queue = Queue(repo, tmp_path, **config)
    for name, text in USER_FILES.items():  # the user's uncommitted work: never touched, never seen
        (queue.repo / name).write_text(text)
    queue.user_status = git(queue.repo, "status", "--porcelain", "--untracked-files=all")
    queue.user_head = head(queue.repo)
    return queue


def made_by_git(queue):
    """Have `git worktree add` make the task worktrees, not bridge.py: a sparse-checkout file
    git would copy into a new worktree (ignored here: core.sparseCheckout is off)."""
    (queue.repo / ".git" / "info").mkdir(exist_ok=True)
    (queue.repo / ".git" / "info" / "sparse-checkout").write_text("/*\n")


def after_worktree_made(tmp_path, script):
    """PATH for a `git` that runs the real one, then the shell `script` with $dir the new
    worktree, once it is made: by bridge.py (its read-tree there) or by `git worktree add`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "git"
    wrapper.write_text('#!/bin/sh\n"%s" "$@"\nrc=$?\ncase " $* " in\n'
                       '  *" worktree add "*) eval dir=\\${$(($# - 1))} ;;\n'
                       '  *" read-tree -u --reset "*) dir=$GIT_WORK_TREE ;;\n'
                       '  *) exit $rc ;;\nesac\n%s\nexit $rc\n' % (shutil.which("git"), script))
    wrapper.chmod(0o755)
    return str(bin_dir) + os.pathsep + os.environ["PATH"]


def assert_user_checkout_untouched(queue):
    assert branch(queue.repo) == "main" and head(queue.repo) == queue.user_head
    assert git(queue.repo, "status", "--porcelain", "--untracked-files=all") == queue.user_status
    for name, text in USER_FILES.items():
        assert (queue.repo / name).read_text() == text


def worktrees(queue):
    """Paths of the linked worktrees git knows, and what is in the worktree folder."""
    listed = [line[9:] for line in git(queue.repo, "worktree", "list", "--porcelain").splitlines()
              if line.startswith("worktree ")][1:]
    folder = queue.repo / ".git" / "bridge-worktrees"
    return listed + (sorted(p.name for p in folder.iterdir()) if folder.exists() else [])


def test_worktree_success_leaves_your_checkout_and_uncommitted_work_alone(git_repo, tmp_path):
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("w1", agent={"write": {"src/new.py": "print('hi')\n"}},
                         commands_to_run=["test -f src/new.py", "test ! -e mine.txt",
                                          "grep -qv uncommitted README.md", "pwd"]))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    r = queue.result("w1")
    assert (r["status"], r["reason"]) == ("success", "verified"), r["detail"]
    g = r["git"]
    path = str(queue.repo / ".git" / "bridge-worktrees" / "w1")
    assert r["commands"][3]["stdout"].strip() == os.path.realpath(path)  # verified in the worktree
    assert (g["worktree"], g["worktree_kept"], g["base_branch"]) == (path, None, "main")
    assert g["base_commit"] == queue.user_head and g["branch"] == "feat/ai/w1"
    assert g["branch_created"] is True and g["dirty_before"] is False
    assert "?? src/new.py" in g["status_after_verify"] and g["returned_to_base"] is None
    assert git(queue.repo, "show", "feat/ai/w1:src/new.py") == "print('hi')\n"
    assert head(queue.repo, "feat/ai/w1") == g["commit"]
    assert git(queue.repo, "rev-parse", g["commit"] + "^").strip() == queue.user_head
    assert "src/new.py" in (queue.handoff / r["artifacts"]["patch_post"]).read_text()
    assert worktrees(queue) == []  # removed once the result was written
    assert_user_checkout_untouched(queue)
    assert queue.names("running") == [] and queue.names("locks") == ["__worker__.lock"]


def test_worktree_failure_is_kept_listed_and_removed_by_unlock(git_repo, tmp_path):
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("w2", agent={"write": {"half.txt": "half done\n"}},
                         commands_to_run=["false"]))
    assert queue.watch().returncode == 1
    r = queue.result("w2")
    path = queue.repo / ".git" / "bridge-worktrees" / "w2"
    assert r["reason"] == "verify_failed" and "unlock --worktrees" in r["git"]["worktree_kept"]
    assert (path / "half.txt").read_text() == "half done\n"  # as the agent left it
    status = json.loads(queue.bridge("status", "--json").stdout)
    assert status["worktrees"] == [{"id": "w2", "path": str(path), "why": r["git"]["worktree_kept"]}]
    assert "worktree %s: verify_failed" % path in queue.bridge("status").stdout
    again = queue.watch()  # a restart keeps it, saying why
    assert "kept the worktree %s: verify_failed" % path in again.stderr
    out = queue.bridge("unlock", "--worktrees")
    assert out.returncode == 0 and "removed the worktree %s" % path in out.stdout, out.stderr
    assert worktrees(queue) == []
    assert git(queue.repo, "show", "feat/ai/w2:half.txt") == "half done\n"  # WIP on its branch
    assert "WIP(bridge)" in git(queue.repo, "log", "-1", "--format=%s", "feat/ai/w2")
    assert json.loads(queue.bridge("status", "--json").stdout)["worktrees"] == []
    assert_user_checkout_untouched(queue)


def test_a_retry_uses_the_kept_worktree_after_committing_it(git_repo, tmp_path):
    queue = worktree_queue(git_repo, tmp_path)
    task = queue.task("w3", agent={"write": {"a.txt": "first\n"}}, commands_to_run=["false"])
    queue.put(task)
    assert queue.watch().returncode == 1
    retry = tmp_path / "w3.json"
    task.update(fixture_agent={"write": {"b.txt": "second\n"}}, commands_to_run=["test -f a.txt"])
    retry.write_text(json.dumps(task))
    assert queue.bridge("submit", "--retry", retry).returncode == 0
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    r = queue.result("w3")
    assert (r["status"], r["attempt"], r["git"]["branch_created"]) == ("success", 2, False)
    assert git(queue.repo, "show", "feat/ai/w3:a.txt") == "first\n"
    assert git(queue.repo, "show", "feat/ai/w3:b.txt") == "second\n"
    subjects = git(queue.repo, "log", "--format=%s", "main..feat/ai/w3").splitlines()
    assert subjects[0].startswith("bridge: w3") and "WIP(bridge): w3" in subjects[1]
    assert worktrees(queue) == []
    assert_user_checkout_untouched(queue)


def test_worktree_add_runs_no_hook_and_no_filter(git_repo, tmp_path):
    """A post-checkout hook and a smudge filter planted in the repository do not run when
    the watcher makes a worktree (its git pins them off)."""
    marks = tmp_path / "ran"
    hook = git_repo / ".git" / "hooks" / "post-checkout"
    hook.write_text("#!/bin/sh\necho hook >> %s\n" % marks)
    hook.chmod(0o755)
    (git_repo / ".gitattributes").write_text("*.txt filter=evil\n")
    (git_repo / "f.txt").write_text("text\n")
    git(git_repo, "add", ".gitattributes", "f.txt")
    git(git_repo, "commit", "-q", "-m", "attributes")
    git(git_repo, "config", "filter.evil.smudge", "sh -c 'echo smudge >> %s; cat'" % marks)
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("w4"))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    assert not marks.exists()


def test_an_agent_rewriting_its_worktree_link_is_tampering(git_repo, tmp_path):
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("w5", agent={"write": {".git": "gitdir: /tmp/elsewhere\n"}}))
    assert queue.watch().returncode == 1
    r = queue.result("w5")
    assert r["reason"] == "agent_tampered" and any(".git changed" in t for t in r["tampered"])
    path = queue.repo / ".git" / "bridge-worktrees" / "w5"
    assert (path / ".git").read_text().startswith("gitdir: %s" % (queue.repo / ".git" / "worktrees"))
    assert r["git"]["worktree_kept"]
    assert_user_checkout_untouched(queue)


def test_config_refusals_name_the_key(git_repo, tmp_path):
    for config, words in (({"workers": 2}, "workers 2 needs isolation \"worktree\""),
                          ({"isolation": "container"}, "isolation must be"),
                          ({"isolation": "worktree", "worktree_dir": "trees"}, "is inside the work tree"),
                          ({"isolation": "worktree", "workers": 0}, "workers must be")):
        queue = Queue(git_repo, tmp_path, **config)
        out = queue.watch()
        assert out.returncode == 2 and words in out.stderr, (config, out.stderr)
        if "worktree_dir" in config:    # refused alike, not "no task worktrees" and exit 0
            for verb in (("unlock", "--worktrees"), ("status",)):
                out = queue.bridge(*verb)
                assert out.returncode == 2 and words in out.stderr, (verb, out.stderr)
    queue = Queue(git_repo, tmp_path, isolation="worktree", worktree_dir="../trees")
    queue.put(queue.task("w6"))
    assert queue.watch().returncode == 0
    assert queue.result("w6")["git"]["worktree"] == str(tmp_path / "trees" / "w6")


# ---- several at once -----------------------------------------------------------

def test_three_workers_really_overlap(git_repo, tmp_path):
    queue = worktree_queue(git_repo, tmp_path, workers=3)
    barrier = tmp_path / "barrier"
    for n in (1, 2, 3, 4):  # each of the first three waits for the other two: none passes alone
        queue.put(queue.task("p%d" % n, agent={"write": {"p%d.txt" % n: "%d\n" % n},
                                               "barrier": [str(barrier), 3, 60]}))
    out = queue.watch(timeout=120)
    assert out.returncode == 0, out.stderr
    for n in (1, 2, 3, 4):
        r = queue.result("p%d" % n)
        assert r["status"] == "success", (n, r["detail"], r["executor"])
        assert git(queue.repo, "show", "feat/ai/p%d:p%d.txt" % (n, n)) == "%d\n" % n
        assert r["git"]["base_commit"] == queue.user_head
    assert set(barrier.read_text().splitlines()[:3]) == {"p1", "p2", "p3"}  # queue order
    assert worktrees(queue) == [] and queue.names("locks") == ["__worker__.lock"]
    assert_user_checkout_untouched(queue)


def start_three(queue, tmp_path, **agent):
    pids = tmp_path / "pids"
    for n in (1, 2, 3):
        queue.put(queue.task("s%d" % n, agent=dict(
            {"write": {"s%d.txt" % n: "%d\n" % n}, "pidfile": str(pids), "grandchild": True},
            **agent), retry_policy={"max_attempts": 2}))
    watcher = queue.popen_watch("--once")
    assert wait_for(lambda: pids.exists() and len(pids.read_text().splitlines()) == 3, 60)
    return watcher, [int(p) for p in pids.read_text().split()]


def test_sigterm_stops_every_running_task_and_requeues_it(git_repo, tmp_path):
    queue = worktree_queue(git_repo, tmp_path, workers=3)
    watcher, pids = start_three(queue, tmp_path, sleep=60)
    watcher.send_signal(signal.SIGTERM)
    assert watcher.wait(30) == 128 + signal.SIGTERM
    assert "done: requeued 3" in watcher.stderr.read()  # not "failed 3": each runs again
    assert queue.names("tasks") == ["s1.json", "s2.json", "s3.json"] and queue.names("running") == []
    for n in (1, 2, 3):
        assert [h["reason"] for h in queue.history("s%d" % n)] == ["interrupted"]
        assert git(queue.repo, "show", "feat/ai/s%d:s%d.txt" % (n, n)) == "%d\n" % n  # parked
    assert worktrees(queue) == [] and queue.names("locks") == ["__worker__.lock"]
    for pid in pids:
        assert wait_for(lambda: not process_running(pid), 10), pid
    assert_user_checkout_untouched(queue)


def test_sigkill_while_three_run_then_restart(git_repo, tmp_path):
    """The watcher is SIGKILLed while three agents run: the next start recovers each one
    (its groups killed, its work parked on its branch, its worktree removed), re-runs it, and
    every task ends with exactly one result; nothing left that no result explains."""
    queue = worktree_queue(git_repo, tmp_path, workers=3)
    watcher, pids = start_three(queue, tmp_path, sleep=60, sleep_attempts=[1])
    watcher.send_signal(signal.SIGKILL)
    assert watcher.wait(10) == -signal.SIGKILL
    assert queue.names("running") == ["s1.json", "s2.json", "s3.json"]
    out = queue.watch(timeout=120)
    assert out.returncode == 0, out.stderr
    assert queue.names("results") == ["s1.json", "s2.json", "s3.json"]
    for n in (1, 2, 3):
        r = queue.result("s%d" % n)
        assert (r["status"], r["attempt"]) == ("success", 2), r["detail"]
        assert [h["reason"] for h in queue.history("s%d" % n)] == ["stale_lock_recovered"]
        assert git(queue.repo, "show", "feat/ai/s%d:s%d.txt" % (n, n)) == "%d\n" % n
    branches = git(queue.repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split()
    assert sorted(branches) == ["feat/ai/s1", "feat/ai/s2", "feat/ai/s3", "main"]
    assert worktrees(queue) == [] and queue.names("locks") == ["__worker__.lock"]
    assert queue.names("running") == [] and queue.names("tasks") == []
    for pid in pids:
        assert wait_for(lambda: not process_running(pid), 10), pid
    assert_user_checkout_untouched(queue)


def test_a_failure_stops_the_queue_after_the_running_tasks_end(git_repo, tmp_path):
    queue = worktree_queue(git_repo, tmp_path, workers=2)
    barrier = tmp_path / "barrier"
    queue.put(queue.task("f1", agent={"barrier": [str(barrier), 2, 60]}, commands_to_run=["false"]))
    queue.put(queue.task("f2", agent={"barrier": [str(barrier), 2, 60]}, commands_to_run=[
        "until test -e %s; do sleep 0.05; done" % (queue.handoff / "results" / "f1.json")]))
    queue.put(queue.task("f3"))
    out = queue.watch(timeout=120)
    assert out.returncode == 1, out.stderr
    assert queue.result("f1")["reason"] == "verify_failed"
    assert queue.result("f2")["status"] == "success"  # it ran alongside: finished, not cut
    assert queue.names("tasks") == ["f3.json"]
    assert "the queue stopped on the failure of f1" in out.stderr


def test_a_dependent_task_waits_and_starts_from_its_dependency_in_its_worktree(git_repo, tmp_path):
    queue = worktree_queue(git_repo, tmp_path, workers=2)
    queue.put(queue.task("d1", agent={"write": {"d1.txt": "one\n"}}))
    queue.put(queue.task("d2", agent={"write": {"d2.txt": "two\n"}}, depends_on=["d1"],
                         commands_to_run=["test -f d1.txt"]))
    out = queue.watch(timeout=120)
    assert out.returncode == 0, out.stderr
    first, second = queue.result("d1"), queue.result("d2")
    assert second["status"] == "success", second["detail"]
    assert second["git"]["base_commit"] == first["git"]["commit"]  # a chain
    assert git(queue.repo, "show", "feat/ai/d2:d1.txt") == "one\n"
    assert worktrees(queue) == []
    assert_user_checkout_untouched(queue)


def test_a_task_started_while_another_takes_its_record_is_not_its_tampering(git_repo, tmp_path):
    """The watcher writes the files of each task it starts (task file to running/, prompt,
    log, result) while other agents run: none of that is their doing. Found by the benchmark:
    task b, started just as task a recorded what its agent must not change, was taken for a's
    tampering. A `git` on PATH holds b's start (its dependency check asks `git merge-base`)
    until a's agent runs, so a's record is taken in that moment, every time."""
    queue = worktree_queue(git_repo, tmp_path, workers=2)
    queue.put(queue.task("z"))
    assert queue.watch().returncode == 0
    pids, barrier, bin_dir = tmp_path / "pids", tmp_path / "barrier", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(  # b's start asks `merge-base` (is z's work in HEAD?)
        '#!/bin/sh\ncase " $* " in *" merge-base "*)\n'
        '  n=0; while [ ! -s "%s" ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n+1)); done ;;\n'
        'esac\nexec "%s" "$@"\n' % (pids, shutil.which("git")))
    (bin_dir / "git").chmod(0o755)
    queue.put(queue.task("a", agent={"pidfile": str(pids), "barrier": [str(barrier), 2, 60]}))
    queue.put(queue.task("b", depends_on=["z"], agent={"barrier": [str(barrier), 2, 60]}))
    out = queue.watch(env=dict(queue.env, PATH="%s%s%s" % (bin_dir, os.pathsep, queue.env["PATH"])),
                      timeout=120)
    assert out.returncode == 0, out.stderr
    assert queue.result("a")["status"] == queue.result("b")["status"] == "success"




def test_a_worktree_of_yours_named_like_the_task_is_left_and_git_names_the_task_one(git_repo,
                                                                                    tmp_path):
    """A worktree you made yourself whose folder is named like the task (git registers it
    under that name): bridge.py does not make the task's worktree itself, git does, under
    another name, and yours is untouched."""
    queue = worktree_queue(git_repo, tmp_path)
    mine = tmp_path / "elsewhere" / "w20"
    git(queue.repo, "worktree", "add", "-q", "-b", "yours", str(mine))
    (mine / "wip.txt").write_text("mine\n")
    queue.put(queue.task("w20", agent={"write": {"x.txt": "x\n"}}))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    assert queue.result("w20")["status"] == "success"
    assert git(queue.repo, "show", "feat/ai/w20:x.txt") == "x\n"
    assert worktrees(queue) == [str(mine)]
    assert (mine / "wip.txt").read_text() == "mine\n" and branch(mine) == "yours"
    assert_user_checkout_untouched(queue)


def test_a_sparse_checkout_of_yours_is_copied_into_each_task_worktree_as_git_does(git_repo,
                                                                                   tmp_path):
    """Your checkout is sparse (per-worktree config, patterns): git copies both into a new
    worktree, so bridge.py has git make it; the task sees the same sparse tree."""
    for name in ("keep/a.txt", "drop/b.txt"):
        (git_repo / name).parent.mkdir()
        (git_repo / name).write_text(name + "\n")
    git(git_repo, "add", ".")
    git(git_repo, "commit", "-q", "-m", "two folders")
    git(git_repo, "sparse-checkout", "set", "keep")
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("w21", commands_to_run=["test -f keep/a.txt && test ! -e drop/b.txt"]))
    out = queue.watch()
    assert out.returncode == 0, out.stdout + out.stderr
    assert queue.result("w21")["status"] == "success"
    assert_user_checkout_untouched(queue)


def test_a_worktree_git_cannot_check_out_is_removed_with_its_branch(git_repo, tmp_path):
    """The checkout into a new worktree fails (here git is made to fail it): the task is
    blocked saying why, and neither the folder, nor git's record of it, nor the branch made
    for it stays."""
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("w22"))
    out = queue.watch(env=dict(queue.env, PATH=after_worktree_made(
        tmp_path, 'echo "fatal: no space left on device" >&2\nexit 128')))
    r = queue.result("w22")
    assert (r["status"], r["reason"]) == ("blocked", "branch_checkout_failed"), out.stderr
    assert "no space left on device" in r["detail"] and r["executor"] is None
    assert worktrees(queue) == [] and not (queue.repo / ".git" / "worktrees" / "w22").exists()
    assert git(queue.repo, "branch", "--list", "feat/ai/w22") == ""
    assert_user_checkout_untouched(queue)


# step -> (how the watcher dies, the attempt that finally succeeds)
WORKTREE_STEPS = {
    "branch made": ("branch feat/ai/k", 2),
    "worktree made": ("read-tree -u --reset", 2),
    "worktree made by git": ("worktree add -q", 2),
    # inside bridge.py's own making of it (each audit event fires before its step)
    "worktree folder made": ({"event": "open", "args": {"0": "bridge-worktrees/k/..git."}}, 2),
    "worktree link half written": ({"event": "os.rename", "args": {"1": "bridge-worktrees/k/.git"}},
                                   2),
    "worktree link written": ({"event": "os.mkdir", "args": {"0": ".git/worktrees/k"}}, 2),
    "worktree git dir half written": ({"event": "os.rename", "args": {"1": "worktrees/k/HEAD"}}, 2),
    "worktree not checked out": ({"event": "subprocess.Popen", "args": {"1": "read-tree"}}, 2),
    "commit": ("commit -q --no-verify", 2),
    "result write": ({"event": "os.rename", "args": {"0": ".tmp", "1": "/results/k.json"}}, 2),
    "worktree remove": ("worktree remove", 1),
}


@pytest.mark.parametrize("step", list(WORKTREE_STEPS))
def test_sigkill_at_each_worktree_step_then_restart(git_repo, tmp_path, step):
    """The watcher dies while or right after making the worktree, after committing in it,
    before writing the result, or after removing the worktree: the next start ends the task
    with one result holding only the task's change, leaves no worktree behind and never
    touches your checkout."""
    how, final_attempt = WORKTREE_STEPS[step]
    queue = worktree_queue(git_repo, tmp_path)
    if step.endswith("by git"):
        made_by_git(queue)
    queue.put(queue.task("k", agent={"write": {"k.txt": "k\n"}}, retry_policy={"max_attempts": 2}))
    crash_watch(queue, tmp_path, how)
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    assert queue.names("results") == ["k.json"]
    r = queue.result("k")
    assert (r["status"], r["attempt"]) == ("success", final_attempt), r["detail"]
    assert queue.names("running") == [] and queue.names("tasks") == []
    assert queue.names("locks") == ["__worker__.lock"]
    assert worktrees(queue) == []
    # the task's one change, nothing a half-made worktree's WIP commit would add
    assert git(queue.repo, "diff", "--name-status", queue.user_head, "feat/ai/k") == "A\tk.txt\n"
    assert_user_checkout_untouched(queue)


def test_a_folder_holding_more_than_a_half_made_worktree_is_never_removed(git_repo, tmp_path):
    """The watcher died having made the task's worktree folder, and a file was put there
    before the next start: that is no longer only what the watcher made, so the recovery
    leaves it (and the task is blocked saying why), the file untouched."""
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("k", retry_policy={"max_attempts": 2}))
    crash_watch(queue, tmp_path, WORKTREE_STEPS["worktree folder made"][0])
    path = queue.repo / ".git" / "bridge-worktrees" / "k"
    (path / "yours.txt").write_text("yours\n")
    out = queue.watch()
    r = queue.result("k")
    assert (r["status"], r["reason"]) == ("blocked", "branch_checkout_failed"), out.stderr
    assert (path / "yours.txt").read_text() == "yours\n"
    assert_user_checkout_untouched(queue)


def test_a_half_made_worktree_whose_git_directory_leads_elsewhere_removes_nothing_there(
        git_repo, tmp_path):
    """The watcher died having made the task's worktree folder and its .git file; before the
    next start .git/worktrees is pointed (a symlink) at a folder of yours holding one named
    like the task: the recovery removes nothing there (git's own add refuses such a link)."""
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("k", retry_policy={"max_attempts": 2}))
    crash_watch(queue, tmp_path, WORKTREE_STEPS["worktree link written"][0])
    yours = tmp_path / "yours"
    (yours / "k").mkdir(parents=True)
    (yours / "k" / "precious.txt").write_text("mine\n")
    shutil.rmtree(queue.repo / ".git" / "worktrees")
    (queue.repo / ".git" / "worktrees").symlink_to(yours)
    out = queue.watch()
    assert queue.names("results") == ["k.json"], out.stderr
    assert (yours / "k" / "precious.txt").read_text() == "mine\n"


def test_unlock_worktrees_leaves_a_worktree_whose_git_link_points_at_your_repository(git_repo, tmp_path):
    """A kept worktree whose .git file was rewritten later (by an agent running in another
    worktree, or a process it left) to name your own git directory: git there works on your
    index and your branch. unlock --worktrees must neither commit it nor touch your index."""
    queue = worktree_queue(git_repo, tmp_path)
    git(queue.repo, "add", "mine.txt")  # something staged of yours
    queue.user_status = git(queue.repo, "status", "--porcelain", "--untracked-files=all")
    queue.put(queue.task("w7", agent={"write": {"half.txt": "half\n"}}, commands_to_run=["false"]))
    assert queue.watch().returncode == 1
    path = queue.repo / ".git" / "bridge-worktrees" / "w7"
    (path / ".git").write_text("gitdir: %s\n" % (queue.repo / ".git"))
    out = queue.bridge("unlock", "--worktrees")
    assert "kept the worktree %s" % path in out.stdout, out.stdout + out.stderr
    assert_user_checkout_untouched(queue)
    assert (path / "half.txt").read_text() == "half\n"
    # pointing it at another task's worktree is refused too: it is not on its own branch
    queue.put(queue.task("w8", agent={"write": {"other.txt": "other\n"}}, commands_to_run=["false"]))
    assert queue.watch().returncode == 1
    other = queue.repo / ".git" / "bridge-worktrees" / "w8"
    (path / ".git").write_text((other / ".git").read_text())
    before = head(queue.repo, "feat/ai/w8")
    out = queue.bridge("unlock", "--worktrees")
    assert "kept the worktree %s" % path in out.stdout, out.stdout + out.stderr
    assert git(queue.repo, "show", "feat/ai/w8:other.txt") == "other\n"
    assert git(queue.repo, "ls-tree", "-r", "--name-only", "feat/ai/w8").count("half.txt") == 0
    assert_user_checkout_untouched(queue)


def plant_worktree_filter(queue, task_id, marks):
    """What an agent of another task can write into a worktree it does not run in, when you
    use per-worktree config (extensions.worktreeConfig, set by `git sparse-checkout`): a
    filter driver in that worktree's config.worktree and a .gitattributes naming it."""
    path = queue.repo / ".git" / "bridge-worktrees" / task_id
    admin = git(path, "rev-parse", "--absolute-git-dir").strip()
    with open(os.path.join(admin, "config.worktree"), "a") as handle:
        handle.write("[filter \"evil\"]\n\tclean = \"sh -c 'echo ran >> %s; cat'\"\n" % marks)
    (path / ".gitattributes").write_text("* filter=evil\n")
    return path


def test_unlock_worktrees_runs_no_filter_from_the_worktrees_own_config(git_repo, tmp_path):
    marks = tmp_path / "ran"
    git(git_repo, "config", "extensions.worktreeConfig", "true")
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("w9", agent={"write": {"half.txt": "half\n"}}, commands_to_run=["false"]))
    assert queue.watch().returncode == 1
    path = plant_worktree_filter(queue, "w9", marks)
    out = queue.bridge("unlock", "--worktrees")
    assert not marks.exists(), out.stdout + out.stderr
    assert git(queue.repo, "show", "feat/ai/w9:half.txt") == "half\n"
    assert not path.exists() and out.returncode == 0, out.stdout + out.stderr


def test_the_startup_sweep_runs_no_filter_from_a_left_worktrees_config(git_repo, tmp_path):
    """git worktree remove checks the worktree is clean with a git status in it, which reads
    that worktree's config: its filter drivers are pinned off too."""
    marks = tmp_path / "ran"
    git(git_repo, "config", "extensions.worktreeConfig", "true")
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("w10"))
    assert queue.watch().returncode == 0
    path = queue.repo / ".git" / "bridge-worktrees" / "w10"  # as a SIGKILL after the result leaves it
    git(queue.repo, "worktree", "add", "-q", str(path), "feat/ai/w10")
    plant_worktree_filter(queue, "w10", marks)
    (path / "w10.txt").write_text("changed after the run\n")
    out = queue.watch()
    assert not marks.exists(), out.stderr
    assert "kept the worktree %s: git cannot remove it" % path in out.stderr
    assert (path / "w10.txt").read_text() == "changed after the run\n"


def test_an_agent_replacing_its_worktree_by_a_link_to_your_checkout_moves_nothing_of_yours(
        git_repo, tmp_path):
    """The agent swaps its worktree folder for a symlink to your checkout: the tamper check
    names it and restores nothing through the link (restoring WORKTREE/.git through it would
    move your .git away and write a .git file in its place), and unlock leaves it."""
    queue = worktree_queue(git_repo, tmp_path, executor={"command": [
        "sh", "-c", 'd="$PWD"; cd ..; mv "$d" "$d.moved"; ln -s "%s" "$d"' % git_repo]})
    queue.put(queue.task("w11"))
    assert queue.watch().returncode == 1
    r = queue.result("w11")
    path = queue.repo / ".git" / "bridge-worktrees" / "w11"
    assert r["reason"] == "agent_tampered", r
    assert r["tampered"] == [".git/bridge-worktrees/w11 changed (not restorable)"], r["tampered"]
    assert (queue.repo / ".git").is_dir() and os.path.islink(path)
    assert_user_checkout_untouched(queue)
    out = queue.bridge("unlock", "--worktrees")
    assert "kept the worktree %s" % path in out.stdout, out.stdout + out.stderr
    assert_user_checkout_untouched(queue)


def test_a_restart_while_the_killed_watcher_is_still_a_zombie_recovers_its_tasks(git_repo, tmp_path):
    """Right after a SIGKILL the dead watcher stays a zombie until its parent reaps it (a
    shell that is busy, a container's init that reaps late): it runs nothing and holds no
    lock, so its tasks are recovered at once, not left for two hours as 'not provably stale'."""
    queue = worktree_queue(git_repo, tmp_path, workers=3)
    watcher, pids = start_three(queue, tmp_path, sleep=60, sleep_attempts=[1])
    watcher.send_signal(signal.SIGKILL)
    stat = "/proc/%d/stat" % watcher.pid
    assert wait_for(lambda: open(stat).read().rsplit(")", 1)[1].split()[0] == "Z", 10)
    out = queue.watch(timeout=120)  # not reaped yet: the test process is its parent
    assert out.returncode == 0 and "not provably stale" not in out.stderr, out.stderr
    assert watcher.wait(10) == -signal.SIGKILL
    for n in (1, 2, 3):
        assert queue.result("s%d" % n)["status"] == "success"
    assert worktrees(queue) == [] and queue.names("running") == []
    assert_user_checkout_untouched(queue)


@pytest.mark.parametrize("condition", ["gitdir:**/.git/worktrees/**", "onbranch:feat/ai/**"])
def test_a_filter_your_config_includes_only_in_task_worktrees_does_not_run(git_repo, tmp_path,
                                                                           condition):
    """Config included on a condition that holds in a task worktree (its folder, its branch)
    but not in your checkout: its filter drivers are pinned off there too."""
    marks = tmp_path / "ran"
    included = tmp_path / "worktrees.gitconfig"
    included.write_text("[filter \"evil\"]\n\tclean = \"sh -c 'echo ran >> %s; cat'\"\n" % marks)
    git(git_repo, "config", "includeIf.%s.path" % condition, str(included))
    (git_repo / ".gitattributes").write_text("*.txt filter=evil\n")
    git(git_repo, "add", ".gitattributes")
    git(git_repo, "commit", "-q", "-m", "attributes")
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("w12", agent={"write": {"w12.txt": "hello\n"}}))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    assert not marks.exists()
    assert git(queue.repo, "show", "feat/ai/w12:w12.txt") == "hello\n"


def test_a_forged_result_of_a_task_whose_id_extends_a_running_ones_is_tampering(git_repo, tmp_path):
    """With workers > 1 a task's check looks away from the files the watcher writes for the
    tasks running alongside (task a: a.json, a.log, a_pre.patch...), and only those: the
    result of task a_b, finished earlier, is no file of a's, and an agent forging it is caught."""
    queue = worktree_queue(git_repo, tmp_path, workers=2)
    queue.put(queue.task("a_b"))
    assert queue.watch().returncode == 0
    forged = queue.handoff / "results" / "a_b.json"
    barrier = tmp_path / "barrier"
    queue.put(queue.task("a", agent={"barrier": [str(barrier), 2, 60]}))
    queue.put(queue.task("x", agent={"barrier": [str(barrier), 2, 60],
                                     "write": {str(forged): '{"status": "success"}\n'}}))
    out = queue.watch(timeout=120)
    r = queue.result("x")
    assert r["reason"] == "agent_tampered", (r["reason"], out.stderr)
    # Task a's own check may see the forgery first and move it aside: then x's check finds
    # the file gone. Either way x is named and the forged result does not stand.
    assert any(t.startswith(".ai-handoff/results/a_b.json ") for t in r["tampered"]), r["tampered"]
    assert not forged.exists()  # moved aside: a forged result never stands


def test_a_lock_naming_another_worktree_is_never_parked_or_removed(git_repo, tmp_path):
    """locks/ is the agent's to write: a task lock rewritten to name one of your own linked
    worktrees (here by the test, as the agent could before the watcher died) made the next
    start commit your uncommitted work there as WIP and `git worktree remove` it."""
    mine = tmp_path / "mine"
    git(git_repo, "worktree", "add", "-q", "-b", "mywork", str(mine))
    queue = worktree_queue(git_repo, tmp_path)
    (mine / "wip.txt").write_text("my uncommitted work\n")
    queue.put(queue.task("k", agent={"kill_watcher": "end"}))
    assert queue.watch().returncode == -signal.SIGKILL
    lock = queue.handoff / "locks" / "k.lock"
    meta = json.loads(lock.read_text())
    meta.update(worktree=str(mine), branch="mywork")
    lock.write_text(json.dumps(meta))
    queue.watch()
    assert "not this task's: left as it is" in queue.result("k")["detail"], queue.result("k")
    assert (mine / "wip.txt").read_text() == "my uncommitted work\n"
    assert git(mine, "status", "--porcelain").strip() == "?? wip.txt"
    assert git(git_repo, "rev-parse", "mywork") == git(git_repo, "rev-parse", "main")


def test_unlock_worktrees_force_clears_a_live_lock_as_unlock_force_does(git_repo, tmp_path):
    """--force means for --worktrees what it means for unlock: clear the worker lock even
    when its holder still runs (then remove the kept worktrees), not silently ignored."""
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("wf", agent={"write": {"half.txt": "half\n"}}, commands_to_run=["false"]))
    assert queue.watch().returncode == 1
    path = queue.repo / ".git" / "bridge-worktrees" / "wf"
    lock = queue.handoff / "locks" / "__worker__.lock"
    live = queue.popen_watch()
    try:
        assert wait_for(lambda: '"pid": %d' % live.pid in lock.read_text())
        out = queue.bridge("unlock", "--worktrees")
        assert out.returncode == 3 and "stop it first" in out.stderr and path.exists()
        out = queue.bridge("unlock", "--worktrees", "--force")
        assert out.returncode == 0, out.stderr
        assert "forced: removed the worker lock of pid %d" % live.pid in out.stdout
        assert "removed the worktree %s" % path in out.stdout and not path.exists()
        assert git(queue.repo, "show", "feat/ai/wf:half.txt") == "half\n"
    finally:
        live.terminate()
        live.wait(10)


@pytest.mark.parametrize("tag", [False, True])
def test_each_task_starts_from_what_your_checkout_has_checked_out_now(git_repo, tmp_path, tag):
    """The watcher asks git for your checkout's HEAD only when a file git keeps HEAD or that
    branch in changed: a commit on your branch, or a switch to another branch, between two
    tasks of one run is seen by the next task (also with a tag named like the branch)."""
    if tag:
        git(git_repo, "tag", "main")
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("h1", commands_to_run=[
        "git -C %s commit -q --allow-empty -m 'yours, meanwhile'" % queue.repo]))
    queue.put(queue.task("h2", commands_to_run=["git -C %s checkout -q -b other" % queue.repo]))
    queue.put(queue.task("h3"))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    first, second, third = (queue.result(t)["git"] for t in ("h1", "h2", "h3"))
    assert first["base_commit"] == queue.user_head and first["base_branch"] == "main"
    moved = git(queue.repo, "rev-parse", "refs/heads/main").strip()
    assert moved != queue.user_head and git(queue.repo, "log", "-1", "--format=%s", moved) \
        == "yours, meanwhile\n"
    assert (second["base_commit"], second["base_branch"]) == (moved, "main")
    assert (third["base_commit"], third["base_branch"]) == (moved, "other")


@pytest.mark.parametrize("maker", ["bridge.py", "git"])
def test_a_worktree_whose_new_git_link_names_your_repository_is_not_used(git_repo, tmp_path, maker):
    """The link written when the worktree was made is read, not asked about: rewritten right
    after (by an agent running alongside) to name your own git directory, the task is
    refused before any git call there, and your index and branch stay as they were."""
    queue = worktree_queue(git_repo, tmp_path)
    if maker == "git":
        made_by_git(queue)
    git(queue.repo, "add", "mine.txt")  # something staged of yours
    queue.user_status = git(queue.repo, "status", "--porcelain", "--untracked-files=all")
    queue.put(queue.task("w9", agent={"write": {"x.txt": "x\n"}}))
    out = queue.watch(env=dict(queue.env, PATH=after_worktree_made(
        tmp_path, 'printf "gitdir: %s\\n" > "$dir/.git"' % (queue.repo / ".git"))))
    r = queue.result("w9")
    assert (r["status"], r["reason"]) == ("blocked", "branch_checkout_failed"), out.stderr
    assert "is no worktree of this repository" in r["detail"] and r["executor"] is None
    assert_user_checkout_untouched(queue)


def test_a_repository_made_inside_a_task_worktree_is_never_removed_with_it(git_repo, tmp_path):
    """A successful task's worktree goes without git checking it again only when bridge.py's
    own status found no changes and no repository inside. A repository made there (its
    history is nowhere else; the commit on the task branch holds only a link to it) keeps
    the worktree, as git's own check would. (A commit would hold only a link to it: the task
    fails as nested_repository, tests/test_watch_guard.py, and its worktree is kept.)"""
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("n1", commands_to_run=[
        "git init -q sub && git -C sub -c user.name=a -c user.email=a@b commit -q --allow-empty"
        " -m 'only here'"]))
    out = queue.watch()
    r = queue.result("n1")
    assert (r["status"], r["reason"]) == ("failed", "nested_repository"), out.stderr
    path = queue.repo / ".git" / "bridge-worktrees" / "n1"
    assert str(path) in r["detail"] and r["git"]["worktree_kept"] and r["git"]["commit"] is None
    assert git(path / "sub", "log", "-1", "--format=%s") == "only here\n"
    assert_user_checkout_untouched(queue)


@pytest.mark.parametrize("how", ["git -c protocol.file.allow=always submodule update -q --init",
                                 "rmdir lib && git clone -q %(lib)s lib && echo mine > lib/only.txt",
                                 "rmdir lib && git clone -q %(lib)s lib && echo mine > lib/only.txt"
                                 " && git update-index --split-index",
                                 "split: rmdir lib && git clone -q %(lib)s lib && echo mine > "
                                 "lib/only.txt"])
def test_a_submodule_checked_out_in_a_task_worktree_keeps_it_as_git_would(git_repo, tmp_path, how):
    """A submodule the verification checked out (its repository under the worktree's git
    directory, modules/), or a clone made where the submodule goes, holding a file of its
    own, keeps a successful task's worktree: git refuses to remove it, and bridge.py does
    not skip that check (a split index holds the gitlink in its shared index file)."""
    lib = tmp_path / "lib"
    git(tmp_path, "init", "-q", "lib")
    git(lib, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "--allow-empty", "-m", "lib")
    git(git_repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "lib")
    git(git_repo, "commit", "-q", "-m", "a submodule")
    if how.startswith("split: "):  # most of the index in a sharedindex file
        git(git_repo, "config", "core.splitIndex", "true")
    queue = worktree_queue(git_repo, tmp_path)
    queue.put(queue.task("m1", agent={}, commands_to_run=[how.replace("split: ", "") % {"lib": lib}]))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    r = queue.result("m1")
    assert (r["status"], r["git"]["worktree_kept"], r["git"]["commit"]) == ("success", None, None)
    path = queue.repo / ".git" / "bridge-worktrees" / "m1"
    assert "could not be removed" in out.stdout + out.stderr
    assert git(path / "lib", "log", "-1", "--format=%s") == "lib\n"
    assert "only.txt" not in how or (path / "lib" / "only.txt").read_text() == "mine\n"


@pytest.mark.parametrize("maker", ["bridge.py", "git"])
@pytest.mark.parametrize("link", ["gitdir: %(repo)s/.git\\0x", "gitdir %(repo)s/.git", ""])
def test_a_new_worktree_link_that_git_could_not_have_written_is_refused(git_repo, tmp_path, link,
                                                                         maker):
    """A NUL, a missing `gitdir: ` or an empty .git file, written right after the worktree
    was made: the task is blocked saying so, never an internal error."""
    queue = worktree_queue(git_repo, tmp_path)
    if maker == "git":
        made_by_git(queue)
    queue.put(queue.task("w10"))
    out = queue.watch(env=dict(queue.env, PATH=after_worktree_made(
        tmp_path, 'printf "%s" > "$dir/.git"' % (link % {"repo": queue.repo}))))
    r = queue.result("w10")
    assert (r["status"], r["reason"]) == ("blocked", "branch_checkout_failed"), out.stderr
    assert_user_checkout_untouched(queue)


@pytest.mark.parametrize("maker", ["bridge.py", "git"])
def test_a_new_worktree_pointed_at_a_forged_git_directory_on_your_branch_is_refused(git_repo, tmp_path,
                                                                                     maker):
    """Right after the worktree was made (an agent running alongside), a git directory is
    made under .git/worktrees/ whose HEAD names your branch, and the new worktree's .git file
    is pointed at it: every check of where it leads passes, but its HEAD is not the task's
    branch, so the task is refused and nothing is committed on your branch."""
    queue = worktree_queue(git_repo, tmp_path)
    if maker == "git":
        made_by_git(queue)
    evil = queue.repo / ".git" / "worktrees" / "evil"
    queue.put(queue.task("w11", agent={"write": {"x.txt": "x\n"}}))
    out = queue.watch(env=dict(queue.env, PATH=after_worktree_made(tmp_path, (
        'mkdir -p "%s"\nprintf "ref: refs/heads/main\\n" > "%s/HEAD"\n'
        'printf "../..\\n" > "%s/commondir"\nprintf "gitdir: %s\\n" > "$dir/.git"')
        % (evil, evil, evil, evil))))
    r = queue.result("w11")
    assert (r["status"], r["reason"]) == ("blocked", "branch_checkout_failed"), out.stderr
    assert "is not a worktree on feat/ai/w11" in r["detail"]
    assert_user_checkout_untouched(queue)


def test_a_worktree_head_pointed_at_your_branch_before_its_fingerprint_commits_nothing(git_repo, tmp_path):
    """Between making the worktree and taking its fingerprint, a process running alongside
    (here as the bead command runs) points the worktree's HEAD at your branch: the look at
    HEAD before the commit refuses it as tampering, and your branch does not move."""
    queue = worktree_queue(git_repo, tmp_path)
    queue.config["bead"] = {"command": ["sh", "-c", 'for f in "%s"/.git/worktrees/*/HEAD; do printf '
                                        '"ref: refs/heads/main\\n" > "$f"; done; exec "%s" "%s" "$@"'
                                        % (queue.repo, PYTHON, FIXTURES / "bd"), "bd"],
                            "timeout_sec": 10}
    queue.save_config()
    queue.env = clean_env(BD_FIXTURE_STATE=tmp_path / "bd.json")
    queue.put(queue.task("w12", agent={"write": {"x.txt": "x\n"}}))
    out = queue.watch()
    r = queue.result("w12")
    assert (r["status"], r["reason"]) == ("failed", "agent_tampered"), out.stderr
    assert "HEAD is not on feat/ai/w12" in r["detail"] and r["git"]["commit"] is None
    assert head(queue.repo) == queue.user_head and branch(queue.repo) == "main"


def test_a_head_naming_a_branch_that_is_a_symbolic_ref_is_asked_about_every_task(git_repo, tmp_path):
    """HEAD names `alias`, a symbolic ref to main; a task repoints alias at another branch:
    the next task starts from where HEAD leads now."""
    git(git_repo, "branch", "other")
    git(git_repo, "symbolic-ref", "refs/heads/alias", "refs/heads/main")
    git(git_repo, "symbolic-ref", "HEAD", "refs/heads/alias")
    queue = worktree_queue(git_repo, tmp_path)
    git(queue.repo, "checkout", "-q", "other")
    git(queue.repo, "commit", "-q", "--allow-empty", "-m", "on other")
    other = head(queue.repo)
    git(queue.repo, "checkout", "-q", "alias")
    queue.put(queue.task("s1"))
    queue.put(queue.task("s2", commands_to_run=[
        "git -C %s symbolic-ref refs/heads/alias refs/heads/other" % queue.repo]))
    queue.put(queue.task("s3"))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    first, second, third = (queue.result(t)["git"] for t in ("s1", "s2", "s3"))
    assert (first["base_commit"], first["base_branch"]) == (queue.user_head, "main")
    assert (second["base_commit"], second["base_branch"]) == (queue.user_head, "main")
    assert (third["base_commit"], third["base_branch"]) == (other, "other")


def test_a_worktree_folder_that_cannot_be_listed_is_named_with_why():
    """The listing error says what failed (listing) and why, not "cannot write"."""
    bridge = load_bridge()
    with pytest.raises(bridge.BridgeError) as caught:
        bridge.task_worktrees(__file__)  # a file, not a folder
    assert caught.value.message == "cannot list the task worktrees in %s: Not a directory" % __file__
