"""watch attacked by a hostile editing agent, beyond test_watch_guard: output cut at the
capture cap without whitespace, terminal escapes in names the agent chooses, git config
the agent edits through an include, a nested repository's filter."""
import json
import os
import sys

import pytest

from conftest import PYTHON, git
from test_watch import Queue, branch  # noqa: F401
from test_watch_guard import marker_script


@pytest.fixture
def queue(git_repo, tmp_path):
    return Queue(git_repo, tmp_path)


def test_a_secret_straddling_the_capture_cut_in_output_without_whitespace_is_not_kept_raw(
        git_repo, tmp_path):
    """Minified JSON has no whitespace for megabytes: the cut at the capture cap must still
    not keep a token's prefix raw (an AWS key's first 14 characters were kept)."""
    secret = "AKIAQWERTYUIOPASDFGH"
    script = tmp_path / "agent.py"
    # 4 MiB (half the 8 MiB cap) lands 6 characters into the key
    script.write_text(
        "import sys\nhead = '{\"a\":\"' + 'x' * (4 * 1024 * 1024 - 20) + '\",\"k\":\"'\n"
        "sys.stdout.write(head + %r + '\",\"b\":\"' + 'y' * (5 << 20) + '\"}')\n" % secret)
    queue = Queue(git_repo, tmp_path, executor={"command": [PYTHON, str(script)]})
    queue.put(queue.task("s1"))
    out = queue.watch()
    log = (queue.handoff / "logs" / "s1.log").read_text()
    assert "bytes cut here" in log, out.stderr
    for n in range(4, len(secret) + 1):
        assert secret[:n] not in log, (n, out.stderr)


def test_names_the_agent_chooses_reach_the_terminal_inert(queue):
    """A file the agent plants under .ai-handoff/ is named in the watcher's messages: an
    escape sequence in its name must not reach the user's terminal."""
    name = "x\x1b]0;pwned\x07\x1b[2J.json"
    queue.put(queue.task("e1", agent={"write": {".ai-handoff/meta/" + name: "{}"}}))
    out = queue.watch()
    assert "agent_tampered" in out.stderr, out.stderr
    assert "\x1b" not in out.stderr and "\x07" not in out.stderr


def test_git_config_included_from_the_work_tree_is_guarded_too(queue, tmp_path):
    """.git/config includes a tracked file (a shared team config): the agent editing it
    changes git's config as surely as editing .git/config, e.g. core.worktree, which points
    every later git call (checkout, add, commit) at another folder."""
    (queue.repo / "team.gitconfig").write_text("[user]\n\tname = team\n")
    git(queue.repo, "add", "team.gitconfig")
    git(queue.repo, "commit", "-qm", "team config")
    with open(queue.repo / ".git" / "config", "a") as handle:
        handle.write("[include]\n\tpath = ../team.gitconfig\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    queue.put(queue.task("i1", agent={"append": {"team.gitconfig": "[core]\n\tworktree = %s\n"
                                                 % elsewhere}, "write": {"i1.txt": "x\n"}}))
    out = queue.watch()
    r = queue.result("i1")
    assert r["reason"] == "agent_tampered" and "team.gitconfig" in r["detail"], (out.stderr, r)
    assert list(elsewhere.iterdir()) == []
    assert "worktree" not in (queue.repo / "team.gitconfig").read_text()


def test_status_prints_agent_written_names_and_details_inert(queue):
    (queue.handoff / "tasks" / "x\x1b[2J.txt").write_text("{}")
    (queue.handoff / "results" / "f1.json").write_text(json.dumps({
        "id": "f1\x1b]0;t\x07", "status": "failed", "exit_path": "failed", "reason": "r\x1b[31m",
        "detail": "d\x1b[2J"}))
    out = queue.bridge("status")
    assert out.returncode == 0 and "f1" in out.stdout and "skipped in tasks/" in out.stdout, out
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout


def test_a_result_the_agent_forges_does_not_stand(queue):
    """The agent rewrites another task's result (failed -> success): the task is
    agent_tampered and the forged verdict is moved aside, not left as that task's result."""
    other = queue.handoff / "results" / "other.json"
    other.write_text(json.dumps({"id": "other", "status": "failed", "exit_path": "failed"}))
    forged = json.dumps({"id": "other", "status": "success", "exit_path": "success"})
    queue.put(queue.task("t1", agent={"write": {".ai-handoff/results/other.json": forged}}))
    out = queue.watch()
    r = queue.result("t1")
    assert r["reason"] == "agent_tampered", out.stderr
    assert not other.exists()
    aside = queue.handoff / "meta" / "t1.tampered" / ".ai-handoff" / "results" / "other.json"
    assert json.loads(aside.read_text())["status"] == "success"


def shell_agent(tmp_path, body):
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\nset -e\n" + body)
    script.chmod(0o755)
    return {"command": [str(script)]}


@pytest.mark.parametrize("how", ["checkout", "update-ref"])
def test_work_never_lands_on_the_protected_base_behind_the_watchers_back(git_repo, tmp_path, how):
    """The agent commits onto main itself (update-ref), or checks main out and leaves its
    edits for the watcher to commit there: either way main, a protected branch, would get
    work no one reviewed while the result said success on feat/ai/<id>."""
    body = {"checkout": "echo x > p.txt\ngit checkout -q main\n",
            "update-ref": "echo x > p.txt\ngit add p.txt\n"
                          "git -c user.name=a -c user.email=a@b commit -qm sneaky\n"
                          "git update-ref refs/heads/main HEAD\n"}[how]
    queue = Queue(git_repo, tmp_path, executor=shell_agent(tmp_path, body))
    before = git(queue.repo, "rev-parse", "main").strip()
    queue.put(queue.task("p1"))
    out = queue.watch()
    r = queue.result("p1")
    assert r["status"] == "failed" and r["reason"] == "agent_tampered", (out.stderr, r)
    assert "main" in r["detail"]
    if how == "checkout":
        assert git(queue.repo, "rev-parse", "main").strip() == before


def test_a_git_dir_swapped_by_the_agent_never_gets_the_watcher_writing_elsewhere(git_repo, tmp_path):
    """.git replaced by a `gitdir:` file pointing at a repository whose core.worktree is
    another folder: after the tamper check nothing bridge.py runs writes there."""
    elsewhere, evil = tmp_path / "elsewhere", tmp_path / "evil.git"
    elsewhere.mkdir()
    git(tmp_path, "clone", "-q", "--bare", str(git_repo), str(evil))
    git(evil, "config", "core.bare", "false")
    git(evil, "config", "core.worktree", str(elsewhere))
    body = "echo x > p.txt\nmv .git %s\nprintf 'gitdir: %s\\n' > .git\n" % (tmp_path / "moved.git", evil)
    queue = Queue(git_repo, tmp_path, executor=shell_agent(tmp_path, body), continue_on_failure=True)
    queue.put(queue.task("g1"))
    out = queue.watch()
    r = queue.result("g1")
    assert r["reason"] == "agent_tampered", (out.stderr, r)
    assert list(elsewhere.iterdir()) == [], out.stderr
