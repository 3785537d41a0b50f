"""watch against a careless or prompt-injected agent: git config that runs programs,
tampering with .git/ and .ai-handoff/, poison-pill tasks, unwritable directories.

Everything goes through the CLI on real repositories with fixtures/agent.py as the
editing agent; a "marker" is a script that records that it ran and must never run.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, clean_env, git, run_bridge
from test_watch import Queue, branch, head, wait_for  # noqa: F401 (fixture helpers)


@pytest.fixture
def queue(git_repo, tmp_path):
    return Queue(git_repo, tmp_path)


def marker_script(tmp_path, name):
    """An executable that appends its name to tmp/markers and passes stdin through (a filter)."""
    log = tmp_path / "markers"
    script = tmp_path / ("marker-" + name)
    script.write_text("#!/bin/sh\necho %s \"$@\" >> %s\ncat\n" % (name, log))
    script.chmod(0o755)
    return str(script), log


# key -> (config text appended, extra files the agent writes). Each key makes git start a
# program (or rewrite content) in some of the git calls the watcher makes.
def key_cases(m):
    return {
        "core.fsmonitor": ("[core]\n\tfsmonitor = %s\n" % m, {}),
        "core.hooksPath": ("[core]\n\thooksPath = HOOKS\n", {}),
        "core.pager": ("[core]\n\tpager = %s\n[pager]\n\tstatus = %s\n\tdiff = %s\n" % (m, m, m), {}),
        "core.editor": ("[core]\n\teditor = %s\n[sequence]\n\teditor = %s\n" % (m, m), {}),
        "core.sshCommand": ("[core]\n\tsshCommand = %s\n[remote \"origin\"]\n\turl = ssh://h/r\n" % m, {}),
        "diff.external": ("[diff]\n\texternal = %s\n" % m, {}),
        "textconv": ("[diff \"m\"]\n\ttextconv = %s\n\tcommand = %s\n" % (m, m),
                     {".git/info/attributes": "* diff=m\n"}),
        "filter.clean": ("[filter \"m\"]\n\tclean = %s\n\trequired = true\n" % m,
                         {".git/info/attributes": "* filter=m\n"}),
        "filter.smudge": ("[filter \"Mixed.Case\"]\n\tsmudge = %s\n\tclean = cat\n" % m,
                          {".git/info/attributes": "* filter=Mixed.Case\n"}),
        "filter.process": ("[filter \"m\"]\n\tprocess = %s\n\trequired = true\n" % m,
                           {".git/info/attributes": "* filter=m\n"}),
        "credential.helper": ("[credential]\n\thelper = !%s\n" % m, {}),
        "gpg.program": ("[commit]\n\tgpgSign = true\n[gpg]\n\tprogram = %s\n" % m, {}),
    }


def hooks_dir(tmp_path, marker):
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    for name in ("pre-commit", "post-commit", "post-checkout", "post-index-change",
                 "reference-transaction"):
        (hooks / name).write_text("#!/bin/sh\n%s %s\n" % (marker, name))
        (hooks / name).chmod(0o755)
    return str(hooks)


@pytest.mark.parametrize("key", sorted(key_cases("M")))
def test_repo_config_that_runs_programs_never_runs_from_the_watcher(queue, tmp_path, key):
    """The key is in .git/config before the watcher starts (a repository set up that way)."""
    marker, log = marker_script(tmp_path, key)
    text, files = key_cases(marker)[key]
    text = text.replace("HOOKS", hooks_dir(tmp_path, marker))
    with open(queue.repo / ".git" / "config", "a") as handle:
        handle.write(text)
    for path, content in files.items():
        (queue.repo / path).write_text(content)
    # the agent edits a tracked file and adds one, so add/diff/commit/checkout all see content
    queue.put(queue.task("k1", agent={"write": {"README.md": "changed\n", "new.txt": "new\n"}}))
    out = queue.watch()
    assert not log.exists(), "%s ran: %s" % (key, log.read_text())
    assert out.returncode == 0, out.stderr
    r = queue.result("k1")
    assert r["status"] == "success", r
    patch = (queue.handoff / "patches" / "k1_pre.patch").read_text()
    assert "+changed" in patch and "+new" in patch  # a real git patch, not a tool's output


def test_agent_appending_to_git_config_never_gets_a_program_run(queue, tmp_path):
    """Every key at once, appended by the agent during its run."""
    marker, log = marker_script(tmp_path, "agent")
    text = "".join(t for t, _ in key_cases(marker).values()).replace("HOOKS", hooks_dir(tmp_path, marker))
    queue.put(queue.task("k2", agent={"append": {".git/config": text},
                                      "write": {".git/info/attributes": "* filter=m diff=m\n",
                                                "README.md": "changed\n"}}))
    queue.watch()
    assert not log.exists(), log.read_text()


def test_global_diff_external_does_not_replace_the_audit_patch(queue, tmp_path):
    marker, log = marker_script(tmp_path, "global")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[diff]\n\texternal = %s\n[core]\n\tfsmonitor = %s\n"
                                     % (marker, marker))
    env = clean_env(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
    queue.put(queue.task("g1", agent={"write": {"README.md": "changed\n"}}))
    out = queue.watch(env=env)
    assert out.returncode == 0, out.stderr
    assert not log.exists(), log.read_text()
    patch = (queue.handoff / "patches" / "g1_pre.patch").read_text()
    assert patch.startswith("diff --git a/README.md b/README.md") and "+changed" in patch
