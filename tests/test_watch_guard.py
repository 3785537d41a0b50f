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

from conftest import BRIDGE, PYTHON, clean_env, git, run_bridge
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


# ---- poison pills: one bad task never wedges the queue ------------------------------------

def nested(levels, leaf="x"):
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


def test_submit_refuses_a_deeply_nested_task_naming_the_field(queue, tmp_path):
    source = tmp_path / "deep.json"
    for levels in (100, 500, 200000):  # beyond the task's limit; beyond any JSON bridge.py reads
        source.write_text(json.dumps(queue.task("deep1", extra=nested(levels))) if levels < 1000
                          else "[" * levels + "]" * levels)
        for args, stdin in ((("submit", source), None), (("submit", "-"), source.read_text())):
            out = run_bridge(*args, "--root", queue.repo, "--config", queue.config_path,
                             input=stdin)
            assert out.returncode == 2, out.stderr
            assert "nested deeper than" in out.stderr, out.stderr
            assert ("extra.a.a" if levels == 100 else "256 levels") in out.stderr
            assert ("stdin" if stdin else str(source)) in out.stderr
    assert queue.names("tasks") == []


@pytest.mark.parametrize("levels", [40, 254])  # beyond the task's limit; within any JSON's
def test_a_nested_task_in_tasks_is_schema_invalid_and_the_queue_goes_on(queue, levels):
    queue.put(queue.task("deep2", extra=nested(levels)))
    queue.put(queue.task("ok2"))
    out = queue.watch()
    r = queue.result("deep2")
    assert (r["reason"], r["exit_path"]) == ("schema_invalid", "skipped"), out.stderr
    assert any("extra.a.a" in e and "nested deeper than" in e for e in r["errors"])
    assert queue.result("ok2")["status"] == "success"
    assert queue.names("running") == [] and "deep2.json" in queue.names("failed")


def test_a_200000_level_task_file_never_crashes_a_start(queue):
    path = queue.handoff / "tasks" / "deep.json"
    path.write_text("[" * 200000 + "]" * 200000)
    os.utime(path, (1, 1))
    for _ in range(2):  # and the next start is fine too
        out = queue.watch()
        assert "Traceback" not in out.stderr and "internal error" not in out.stderr, out.stderr
    r = queue.result("deep")
    assert r["reason"] == "schema_invalid" and "nested" in " ".join(r["errors"])
    assert queue.names("tasks") == [] and queue.names("failed") == ["deep.json"]


def test_sweep_quarantines_a_running_task_it_cannot_recover(queue):
    """A task left in running/ whose result path is a directory: recovery cannot write
    there. The start goes on (the task is set aside in failed/), and so does the next one."""
    task = queue.task("stuck")
    (queue.handoff / "running" / "stuck.json").write_text(json.dumps(task))
    (queue.handoff / "results" / "stuck.json").mkdir()
    queue.put(queue.task("after"))
    out = queue.watch()
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr, out.stderr
    assert "stuck" in out.stderr and "quarantined" in out.stderr
    assert queue.names("running") == [] and "stuck.json" in queue.names("failed")
    assert queue.result("after")["status"] == "success"
    assert queue.watch().returncode == 0


def plant_lock_symlink(queue, task_id, tmp_path):
    """A symlink where the task's lock file goes: taking the lock fails in a way no step
    expects (an OSError naming it), before the task is even in running/."""
    (queue.handoff / "locks" / (task_id + ".lock")).symlink_to(tmp_path / "elsewhere")


def test_an_unexpected_error_fails_only_that_task_with_internal_error(git_repo, tmp_path):
    queue = Queue(git_repo, tmp_path, continue_on_failure=True)
    queue.put(queue.task("boom"))
    plant_lock_symlink(queue, "boom", tmp_path)
    queue.put(queue.task("next"))
    out = queue.watch()
    assert "Traceback" not in out.stderr and "internal error:" not in out.stderr, out.stderr
    r = queue.result("boom")
    assert (r["status"], r["reason"]) == ("failed", "internal_error")
    assert "boom.lock" in r["detail"] and "failed/boom.json" in r["detail"]
    assert "Traceback (most recent call last)" in (queue.handoff / "logs" / "boom.log").read_text()
    assert queue.names("running") == [] and "boom.json" in queue.names("failed")
    assert not (tmp_path / "elsewhere").exists()
    assert queue.result("next")["status"] == "success"
    assert branch(queue.repo) == "main"


def test_an_unexpected_error_stops_the_queue_per_stop_on_failure(queue, tmp_path):
    queue.put(queue.task("boom1"))
    plant_lock_symlink(queue, "boom1", tmp_path)
    queue.put(queue.task("boom2"))
    out = queue.watch()
    assert out.returncode == 1, out.stderr
    assert queue.result("boom1")["reason"] == "internal_error"
    assert queue.names("tasks") == ["boom2.json"] and queue.names("running") == []


def test_every_id_submit_accepts_runs_and_status_reports_skipped_files(queue, tmp_path):
    source = tmp_path / "t.json"
    source.write_text(json.dumps(queue.task("fix.tmp.parser")))
    assert queue.bridge("submit", source).returncode == 0
    (queue.handoff / "tasks" / "notes.txt").write_text("not a task")
    (queue.handoff / "tasks" / ".half-written.json").write_text("{")
    queue.watch()
    assert queue.result("fix.tmp.parser")["status"] == "success"
    status = json.loads(queue.bridge("status", "--json").stdout)
    skipped = {item["name"]: item["reason"] for item in status["skipped_in_tasks"]}
    assert set(skipped) == {"notes.txt", ".half-written.json"}
    text = queue.bridge("status").stdout
    assert "notes.txt" in text and ".half-written.json" in text
    for bad in (".hidden", "-dash", "a" * 101, "x.lock", "a..b", "tail."):
        source.write_text(json.dumps(queue.task(bad)))
        out = queue.bridge("submit", source)
        assert out.returncode == 2 and "id:" in out.stderr, (bad, out.stderr)


# ---- tamper check: what the agent must not change ----------------------------------------

def tamper_run(queue, agent, **fields):
    queue.put(queue.task("t1", agent=agent, **fields))
    queue.put(queue.task("t2"))
    out = queue.watch()
    return out, queue.result("t1")


@pytest.mark.parametrize("continue_on_failure", [False, True])
def test_agent_editing_git_config_fails_as_tampered_restored_and_the_queue_stops(
        git_repo, tmp_path, continue_on_failure):
    queue = Queue(git_repo, tmp_path, continue_on_failure=continue_on_failure)
    config = queue.repo / ".git" / "config"
    original = config.read_bytes()
    out, r = tamper_run(queue, {"append": {".git/config": "[core]\n\tfsmonitor = evil\n"},
                                "write": {"x.txt": "x\n"}})
    assert (r["status"], r["reason"]) == ("failed", "agent_tampered"), out.stderr
    assert ".git/config" in r["detail"] and any(".git/config changed" in n for n in r["tampered"])
    assert config.read_bytes() == original  # restored
    aside = queue.handoff / "meta" / "t1.tampered" / ".git" / "config"
    assert aside.read_text().endswith("fsmonitor = evil\n")  # the agent's version kept
    assert "agent_tampered" in (queue.handoff / "logs" / "t1.log").read_text()
    assert out.returncode == 1 and queue.names("tasks") == ["t2.json"]  # stopped either way
    assert "t1.json" in queue.names("failed")


def test_planted_hook_and_info_attributes_are_moved_aside_and_named(queue):
    out, r = tamper_run(queue, {"write": {".git/hooks/post-checkout": "#!/bin/sh\nevil\n",
                                          ".git/info/attributes": "* filter=lfs\n"}})
    assert r["reason"] == "agent_tampered", out.stderr
    assert ".git/hooks/post-checkout" in r["detail"] and ".git/info/attributes" in r["detail"]
    assert not (queue.repo / ".git" / "hooks" / "post-checkout").exists()
    assert not (queue.repo / ".git" / "info" / "attributes").exists()
    assert (queue.handoff / "meta" / "t1.tampered" / ".git" / "hooks" / "post-checkout").exists()


def test_gitattributes_pointing_files_at_a_filter_is_tampering_other_lines_are_not(queue):
    out, r = tamper_run(queue, {"write": {".gitattributes": "*.png binary\n*.txt filter=lfs\n"}})
    assert r["reason"] == "agent_tampered", out.stderr
    assert ".gitattributes" in r["detail"] and "filter" in " ".join(r["tampered"])


def test_gitattributes_lines_without_a_filter_are_the_agents_to_edit(queue):
    queue.put(queue.task("t3", agent={"write": {"sub/.gitattributes": "*.png binary -diff\n"}}))
    out = queue.watch()
    assert queue.result("t3")["status"] == "success", out.stderr


def test_gitattributes_filter_lines_already_there_with_allow_dirty_are_not_tampering(queue):
    (queue.repo / ".gitattributes").write_text("*.bin filter=lfs\n")
    queue.put(queue.task("d1", allow_dirty=True, agent={"write": {"d1.txt": "d\n"}}))
    out = queue.watch()
    assert queue.result("d1")["status"] == "success", out.stderr


@pytest.mark.parametrize("target", ["pending/other.json", "results/other.json",
                                    "meta/other.bead", "running/t1.json", "failed/new.json"])
def test_agent_writing_into_ai_handoff_is_tampering(queue, target):
    for state in ("pending", "results"):
        (queue.handoff / state / "other.json").write_text('{"id": "other"}\n')
    (queue.handoff / "meta" / "other.bead").write_text("bd-1\n")
    out, r = tamper_run(queue, {"write": {".ai-handoff/" + target: '{"id": "forged"}\n'}})
    assert r["reason"] == "agent_tampered", out.stderr
    assert ".ai-handoff/" + target in r["detail"]


def test_a_verification_command_that_tampers_fails_the_task(queue):
    out, r = tamper_run(queue, {"write": {"v.txt": "v\n"}},
                        commands_to_run=["true", "echo '[core]' >> .git/config", "true"])
    assert r["reason"] == "agent_tampered" and "verification command 2" in r["detail"], out.stderr
    assert [c["cmd"] for c in r["commands"]] == ["true", "echo '[core]' >> .git/config"]
    assert "[core]\n[core]" not in (queue.repo / ".git" / "config").read_text()


def test_a_task_the_agent_queues_runs_after_its_run_like_any_planner_task(queue):
    planted = queue.task("from-agent", agent={"write": {"fa.txt": "fa\n"}})
    out, r = tamper_run(queue, {"write": {".ai-handoff/tasks/0-from-agent.json": json.dumps(
        dict(planted, id="0-from-agent"))}})
    assert r["status"] == "success", out.stderr
    assert queue.result("0-from-agent")["status"] == "success"
    assert queue.result("t2")["status"] == "success"
    order = [line for line in out.stderr.splitlines() if "running the editing agent" in line]
    assert [line.split(":")[2].strip() for line in order] == ["t1", "0-from-agent", "t2"]


def test_approve_and_retry_wait_while_a_task_runs_instead_of_failing_it(queue, tmp_path):
    queue.put(queue.task("gate", requires_confirmation=True))
    queue.put(queue.task("done1"))
    assert queue.watch().returncode == 4  # a task needs a person
    pids = tmp_path / "pids"
    queue.put(queue.task("slow", agent={"sleep": 60, "pidfile": str(pids)}))
    watcher = queue.popen_watch("--once")
    try:
        assert wait_for(lambda: pids.exists() and pids.read_text().strip())
        approve = queue.bridge("approve", "gate")
        assert approve.returncode == 3 and "slow is running" in approve.stderr
        source = tmp_path / "done1.json"
        source.write_text(json.dumps(queue.task("done1")))
        retry = queue.bridge("submit", "--retry", source)
        assert retry.returncode == 3 and "slow is running" in retry.stderr
        assert queue.names("pending") == ["gate.json"] and queue.result("done1")["status"] == "success"
    finally:
        watcher.terminate()
        watcher.wait(20)
    assert queue.bridge("approve", "gate").returncode == 0


# ---- write preflight and clean OS errors ----------------------------------------------------

class Unwritable:
    """Make a folder really unwritable, also for root (tests run as root in CI containers):
    chattr +i as root, chmod 0555 otherwise. Undone on exit."""

    def __init__(self, path):
        self.path = str(path)

    def __enter__(self):
        if os.geteuid() == 0:
            done = subprocess.run(["chattr", "+i", self.path], capture_output=True)
            if done.returncode != 0:
                pytest.skip("chattr +i is not available here: %s" % done.stderr)
        else:
            os.chmod(self.path, 0o555)
        return self

    def __exit__(self, *exc):
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", self.path], capture_output=True)
        else:
            os.chmod(self.path, 0o755)


@pytest.mark.parametrize("folder", ["results", "logs", "patches", "running", "meta"])
def test_an_unwritable_folder_stops_the_watcher_before_any_agent_runs(queue, tmp_path, folder):
    runs = tmp_path / "runs"
    queue.put(queue.task("w1", agent={"count_file": str(runs)}))
    with Unwritable(queue.handoff / folder):
        out = queue.watch()
    assert out.returncode == 2, out.stderr
    assert "cannot write %s" % (queue.handoff / folder) in out.stderr, out.stderr
    assert "internal error" not in out.stderr and "Traceback" not in out.stderr
    assert not runs.exists() and queue.names("tasks") == ["w1.json"]  # nothing started
    assert branch(queue.repo) == "main"
    assert queue.watch().returncode == 0 and queue.result("w1")["status"] == "success"


def test_init_and_submit_in_unwritable_folders_say_cannot_write(git_repo, tmp_path):
    with Unwritable(git_repo):
        out = run_bridge("init", "--root", git_repo)
    assert out.returncode != 0 and "internal error" not in out.stderr, out.stderr
    assert "cannot write %s" % (git_repo / ".ai-handoff") in out.stderr, out.stderr
    queue = Queue(git_repo, tmp_path)
    source = tmp_path / "s.json"
    source.write_text(json.dumps(queue.task("s1")))
    with Unwritable(queue.handoff / "tasks"):
        out = queue.bridge("submit", source)
    assert out.returncode != 0 and "internal error" not in out.stderr, out.stderr
    assert "cannot write %s" % (queue.handoff / "tasks") in out.stderr, out.stderr


# ---- SIGTERM/SIGINT stop the watcher within 10 s in every state ---------------------------

STUBBORN = "trap '' TERM INT; echo $$ >> %s; sleep 60"  # ignores SIGTERM, as does its sleep


def gone(pidfile):
    from conftest import process_running
    return all(not process_running(int(pid)) for pid in pidfile.read_text().split())


@pytest.mark.parametrize("state", ["idle", "agent", "verify", "bd"])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_ends_the_watcher_within_10_seconds(git_repo, tmp_path, state, sig):
    import signal
    pids = tmp_path / "pids"
    stubborn = ["sh", "-c", STUBBORN % pids]
    config = {"poll_sec": 30}
    if state == "agent":
        config["executor"] = {"command": stubborn}
    if state == "bd":
        config["bead"] = {"command": stubborn + ["bd"]}
    queue = Queue(git_repo, tmp_path, **config)
    if state != "idle":
        queue.put(queue.task("s1", commands_to_run=[STUBBORN % pids] if state == "verify" else ["true"]))
    watcher = queue.popen_watch()
    lock = queue.handoff / "locks" / "__worker__.lock"
    if state == "idle":
        assert wait_for(lambda: lock.exists() and '"pid": %d' % watcher.pid in lock.read_text())
        import time
        time.sleep(0.5)  # into the 30 s poll
    else:
        assert wait_for(lambda: pids.exists() and pids.read_text().strip())
    watcher.send_signal(getattr(signal, sig))
    try:
        watcher.wait(10)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert json.loads(lock.read_text()).get("released_at")
    if state != "idle":
        assert wait_for(lambda: gone(pids), 2)
        assert queue.names("running") == []


def test_a_folder_that_turns_unwritable_stops_the_watcher_before_the_next_task(queue, tmp_path):
    runs = tmp_path / "runs"
    watcher = queue.popen_watch()
    lock = queue.handoff / "locks" / "__worker__.lock"
    try:
        assert wait_for(lambda: lock.exists() and '"pid": %d' % watcher.pid in lock.read_text())
        with Unwritable(queue.handoff / "results"):
            queue.put(queue.task("w2", agent={"count_file": str(runs)}))
            assert watcher.wait(20) == 2
    finally:
        if watcher.poll() is None:
            watcher.kill()
    err = watcher.stderr.read()
    assert "cannot write %s" % (queue.handoff / "results") in err, err
    assert not runs.exists() and queue.names("tasks") == ["w2.json"]


@pytest.mark.parametrize("levels", [500, 200000])
def test_a_deep_task_left_in_running_never_crashes_a_start(queue, levels):
    """What a watcher that crashed on such a task left behind (running/, no lock)."""
    text = json.dumps(queue.task("deep3", extra=nested(levels))) if levels < 1000 \
        else "[" * levels + "]" * levels
    (queue.handoff / "running" / "deep3.json").write_text(text)
    queue.put(queue.task("after3"))
    out = queue.watch()
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr, out.stderr
    assert queue.result("deep3")["status"] == "failed"
    assert queue.names("running") == [] and "deep3.json" in queue.names("failed")
    assert queue.result("after3")["status"] == "success"


def test_filter_drivers_are_listed_again_only_when_a_config_file_changes(queue, tmp_path):
    """One `git config` listing per Git object, not per git call (the bench's 1.5x budget)."""
    trace = tmp_path / "trace"
    for n in range(3):
        queue.put(queue.task("c%d" % n))
    out = queue.watch(env=clean_env(GIT_TRACE=str(trace)))
    assert out.returncode == 0, out.stderr
    calls = [line for line in trace.read_text().splitlines() if "built-in: git" in line]
    listings = [line for line in calls if " config -z --show-origin --list" in line]
    assert len(calls) > 20 and 1 <= len(listings) <= 2, listings  # the watcher's, init's


# ---- nested repositories and submodules in the work tree ---------------------------------

NESTED_AGENT = """set -e
git init -q sub && echo work > sub/file.txt && echo top > top.txt
if [ "$1" = committed ]; then
  git -C sub add -A && git -C sub -c user.name=a -c user.email=a@b commit -qm sub
  git add sub top.txt && git -c user.name=a -c user.email=a@b commit -qm 'the agent commits sub'
fi
if [ "$1" = submodule ]; then
  git -c protocol.file.allow=always submodule -q add "$2" lib
fi
printf '[filter "evil"]\\n\\tclean = %s\\n' "$3" >> sub/.git/config
echo '* filter=evil' > sub/.gitattributes
sleep 1.1; touch sub/file.txt   # stat-dirty, same size: a git status there runs the filter
"""


@pytest.mark.parametrize("case", ["committed", "uncommitted", "submodule"])
def test_a_nested_repository_fails_the_task_keeps_its_files_and_runs_none_of_its_config(
        git_repo, tmp_path, case):
    """A repository the agent makes inside the work tree (with or without a commit, committed
    by the agent or not): git would record only a commit id, never the files, so the task
    fails as nested_repository naming it and the files stay where they are (a submodule it
    adds writes .git/config: agent_tampered). bridge.py's own git calls never run a program
    from the nested repository's config (git runs `git status` inside a nested repository
    its index holds)."""
    script, log = marker_script(tmp_path, "nested")
    other = tmp_path / "other"
    git(tmp_path, "init", "-q", str(other))
    git(other, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "--allow-empty", "-m", "o")
    agent = tmp_path / "agent.sh"
    agent.write_text(NESTED_AGENT)
    queue = Queue(git_repo, tmp_path, executor={"command": ["sh", str(agent), case, str(other), script]})
    queue.put(queue.task("n1", commands_to_run=["true"]))
    out = queue.watch()
    r = queue.result("n1")
    if case == "submodule":
        assert r["reason"] == "agent_tampered" and ".git/config" in r["detail"], r["detail"]
    else:
        assert (r["status"], r["reason"]) == ("failed", "nested_repository"), (r["detail"], out.stderr)
        assert "of its own at sub," in r["detail"] and str(queue.repo) in r["detail"]
    assert not log.exists(), log.read_text()
    assert (queue.repo / "sub" / "file.txt").read_text() == "work\n"
    assert (queue.repo / "top.txt").read_text() == "top\n"
    if case == "committed":
        patch = (queue.handoff / r["artifacts"]["patch_pre"]).read_text()
        assert "+Subproject commit " in patch


@pytest.mark.parametrize("split", ["", "git update-index --split-index"])
def test_a_submodule_of_yours_runs_none_of_its_config_and_the_task_commits(git_repo, tmp_path, split):
    """Your repository has a submodule; the agent plants a filter driver in its config (in
    .git/modules/, which the tamper check does not cover) and leaves a file there stat-dirty.
    git would run `git status` inside the submodule from the audit's and the commit's `add -A`
    and from `status`: none of bridge.py's git calls does, and the task's own work commits. A
    split index (the gitlink in its shared index file, the index naming it) changes nothing."""
    script, log = marker_script(tmp_path, "nested")
    other = tmp_path / "other"
    git(tmp_path, "init", "-q", str(other))
    (other / "file.txt").write_text("lib\n")
    git(other, "add", "file.txt")
    git(other, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "o")
    git(git_repo, "-c", "protocol.file.allow=always", "submodule", "-q", "add", str(other), "lib")
    git(git_repo, "commit", "-q", "-m", "a submodule")
    agent = tmp_path / "agent.sh"
    agent.write_text("""set -e
printf '[filter "evil"]\\n\\tclean = %s\\n' "$1" >> .git/modules/lib/config
echo '* filter=evil' > lib/.gitattributes
sleep 1.1; touch lib/file.txt
echo mine > mine.txt
""" + split)
    queue = Queue(git_repo, tmp_path, executor={"command": ["sh", str(agent), script]})
    queue.put(queue.task("s1", commands_to_run=["true"]))
    out = queue.watch()
    r = queue.result("s1")
    assert (r["status"], r["reason"]) == ("success", "verified"), (r["detail"], out.stderr)
    assert not log.exists(), log.read_text()
    assert git(queue.repo, "show", "--stat", "--format=", r["git"]["commit"]).split() == [
        "mine.txt", "|", "1", "+", "1", "file", "changed,", "1", "insertion(+)"]


@pytest.mark.parametrize("name", ["süb", "a\"b", "sub"])
def test_a_nested_repository_is_seen_whatever_its_name_and_your_diff_config(git_repo, tmp_path, name):
    """git quotes a path holding a byte outside ASCII or a quote in a patch's `diff --git`
    line; your diff.mnemonicPrefix (c/ i/) or color.ui=always change that line, and your
    diff.submodule=diff (or log) shows a gitlink without it, running `git diff` inside the
    nested repository (its diff.external): a repository the agent commits inside the work
    tree still fails the task as nested_repository, the patch is git's plain one, and no
    program of the nested repository's config runs."""
    script, log = marker_script(tmp_path, "nested")
    config = tmp_path / "gitconfig"
    config.write_text("[diff]\n\tmnemonicPrefix = true\n\tsubmodule = diff\n[color]\n\tui = always\n")
    agent = tmp_path / "agent.sh"
    agent.write_text("""set -e
git init -q "$1" && echo work > "$1/file.txt" && git -C "$1" add -A
git -C "$1" -c user.name=a -c user.email=a@b commit -qm sub
printf '[diff]\\n\\texternal = %s\\n' "$2" >> "$1/.git/config"
git add -A 2>/dev/null && git -c user.name=a -c user.email=a@b commit -qm 'the agent commits it'
""")
    queue = Queue(git_repo, tmp_path, executor={"command": ["sh", str(agent), name, script]})
    queue.put(queue.task("q1", commands_to_run=["true"]))
    out = queue.watch(env=dict(queue.env, GIT_CONFIG_GLOBAL=str(config)))
    r = queue.result("q1")
    assert (r["status"], r["reason"]) == ("failed", "nested_repository"), (r["detail"], out.stderr)
    assert not log.exists(), log.read_text()
    patch = (queue.handoff / r["artifacts"]["patch_pre"]).read_text()
    assert "\x1b" not in patch and "--- /dev/null\n" in patch and "+Subproject commit " in patch
    assert (queue.repo / name / "file.txt").read_text() == "work\n"


def add_submodule_of_two_commits(git_repo, tmp_path):
    """Your repository gets a submodule `lib` (not committed yet) whose repository has two commits."""
    other = tmp_path / "other"
    git(tmp_path, "init", "-q", str(other))
    for text in ("1\n", "2\n"):
        (other / "file.txt").write_text(text)
        git(other, "add", "file.txt")
        git(other, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", text)
    git(git_repo, "-c", "protocol.file.allow=always", "submodule", "-q", "add", str(other), "lib")


def test_your_submodule_recurse_never_takes_bridge_py_into_a_submodule(git_repo, tmp_path):
    """Your submodule.recurse=true makes checkout update each submodule with a git run inside
    it, which reads that submodule's config (.git/modules/, the agent's to write): bridge.py's
    checkout back to your branch, after a task that moved your submodule to another commit,
    runs none of it."""
    script, log = marker_script(tmp_path, "nested")
    add_submodule_of_two_commits(git_repo, tmp_path)
    git(git_repo, "commit", "-q", "-m", "a submodule")
    config = tmp_path / "gitconfig"
    config.write_text("[submodule]\n\trecurse = true\n")
    agent = tmp_path / "agent.sh"
    agent.write_text("""set -e
git -C lib checkout -q HEAD~1
printf '[filter "evil"]\\n\\tclean = %s\\n\\tsmudge = %s\\n' "$1" "$1" >> .git/modules/lib/config
echo '* filter=evil' > .git/modules/lib/info/attributes
git add lib && git -c user.name=a -c user.email=a@b commit -qm 'the agent moves lib'
""")
    queue = Queue(git_repo, tmp_path, executor={"command": ["sh", str(agent), script]},
                  continue_on_failure=True)  # the work parked as WIP, then back to your branch
    queue.put(queue.task("r1", commands_to_run=["true"]))
    out = queue.watch(env=dict(queue.env, GIT_CONFIG_GLOBAL=str(config)))
    r = queue.result("r1")
    assert (r["status"], r["reason"], r["git"]["returned_to_base"]) == (
        "failed", "nested_repository", True), (r["detail"], out.stderr)
    assert not log.exists(), log.read_text()


@pytest.mark.parametrize("move", ["git mv lib lib2", "mv lib lib2", "mv lib 'l b'; git add -A"])
def test_a_submodule_the_agent_moves_fails_the_task_as_nested_repository(git_repo, tmp_path, move):
    """git shows a gitlink moved with its commit unchanged as a pure rename (no mode line):
    the task fails as nested_repository naming the new path all the same. A plain mv leaves
    .gitmodules naming the old path, so no clone would get the files there; even `git mv`
    moves your submodule's checkout out from under you (back on your branch it is an
    untracked folder) and rewrites its config in .git/modules/: moving one is yours to do,
    as with diff.renames=false, which shows the same move as a gitlink added."""
    add_submodule_of_two_commits(git_repo, tmp_path)
    git(git_repo, "commit", "-q", "-m", "a submodule")
    agent = tmp_path / "agent.sh"
    agent.write_text("set -e\n%s\necho mine > mine.txt\n" % move)
    queue = Queue(git_repo, tmp_path, executor={"command": ["sh", str(agent)]})
    queue.put(queue.task("m1", commands_to_run=["true"]))
    out = queue.watch()
    r = queue.result("m1")
    assert (r["status"], r["reason"]) == ("failed", "nested_repository"), (r["detail"], out.stderr)
    assert "of its own at %s, " % ("l b" if "'" in move else "lib2") in r["detail"]
    patch = (queue.handoff / r["artifacts"]["patch_pre"]).read_text()
    assert "similarity index 100%\nrename from lib\n" in patch and "160000" not in patch


def test_a_nested_repository_without_a_commit_is_named_whatever_its_name(git_repo, tmp_path):
    """A repository with no commit yet, at a path holding a newline, fails the task as
    nested_repository naming it (git cannot add it: the audit finds it in git's own list)."""
    agent = tmp_path / "agent.sh"
    agent.write_text('set -e\ngit init -q "a\nb" && echo work > "a\nb/file.txt"\n')
    queue = Queue(git_repo, tmp_path, executor={"command": ["sh", str(agent)]})
    queue.put(queue.task("q1", commands_to_run=["true"]))
    out = queue.watch()
    r = queue.result("q1")
    assert (r["status"], r["reason"]) == ("failed", "nested_repository"), (r["detail"], out.stderr)
    assert "of its own at a\\x0ab, " in r["detail"]
    assert (queue.repo / "a\nb" / "file.txt").read_text() == "work\n"


def test_a_failed_add_puts_your_submodule_back_in_your_index(git_repo, tmp_path):
    """`add -A` drops a checked-out submodule from the index before it runs (see the tests
    above): when git then refuses a path the agent made (x/.git.) and writes no index, the
    submodule goes back into your index as it was (it was left staged as deleted)."""
    other = tmp_path / "other"
    git(tmp_path, "init", "-q", str(other))
    git(other, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "--allow-empty", "-m", "o")
    git(git_repo, "-c", "protocol.file.allow=always", "submodule", "-q", "add", str(other), "lib")
    git(git_repo, "commit", "-q", "-m", "a submodule")
    before = git(git_repo, "ls-files", "-s", "lib")
    agent = tmp_path / "agent.sh"
    agent.write_text('mkdir x && echo a > "x/.git." && echo mine > mine.txt\n')
    queue = Queue(git_repo, tmp_path, executor={"command": ["sh", str(agent)]}, continue_on_failure=True)
    queue.put(queue.task("s1", commands_to_run=["true"]))
    out = queue.watch()
    r = queue.result("s1")
    assert r["status"] == "failed" and "invalid path 'x/.git.'" in r["detail"], (r["detail"], out.stderr)
    assert before.startswith("160000 ") and git(queue.repo, "ls-files", "-s", "lib") == before


def test_a_nested_repository_in_the_cut_middle_of_a_huge_patch_is_seen(git_repo, tmp_path):
    """A patch over the 64 MiB capture cap loses its middle, and with it the lines showing a
    gitlink sorted there (a.bin, m, z.bin): git is asked for the gitlinks alone, and the
    repository the agent committed inside the work tree fails the task all the same."""
    agent = tmp_path / "agent.sh"
    agent.write_text("""set -e
head -c 28000000 /dev/urandom > a.bin; head -c 28000000 /dev/urandom > z.bin
git init -q m && echo work > m/file.txt && git -C m add -A
git -C m -c user.name=a -c user.email=a@b commit -qm sub
""")
    queue = Queue(git_repo, tmp_path, executor={"command": ["sh", str(agent)]})
    queue.put(queue.task("q1", commands_to_run=["true"]))
    out = queue.watch(timeout=300)
    r = queue.result("q1")
    assert (r["status"], r["reason"]) == ("failed", "nested_repository"), (r["detail"], out.stderr)
    assert "of its own at m, " in r["detail"]
    patch = (queue.handoff / r["artifacts"]["patch_pre"]).read_text()
    assert " bytes cut here: over the capture cap ...]" in patch and "b/m\n" not in patch


def test_a_submodule_you_have_git_ignore_does_not_make_your_repository_dirty(git_repo, tmp_path):
    """submodule.<name>.ignore=all (in .gitmodules, or .git/config) hides a submodule checked
    out at another commit from git's status; bridge.py's status (whose --ignore-submodules
    keeps git out of every submodule, and overrides that setting) hides it too, so the task
    is not blocked as dirty_repo, and its commit holds only its own work."""
    add_submodule_of_two_commits(git_repo, tmp_path)
    git(git_repo, "config", "-f", ".gitmodules", "submodule.lib.ignore", "all")
    git(git_repo, "add", ".gitmodules")
    git(git_repo, "commit", "-q", "-m", "a submodule")
    git(git_repo / "lib", "checkout", "-q", "HEAD~1")
    assert git(git_repo, "status", "--porcelain") == ""
    queue = Queue(git_repo, tmp_path)
    queue.put(queue.task("s1"))
    out = queue.watch()
    r = queue.result("s1")
    assert (r["status"], r["reason"]) == ("success", "verified"), (r["detail"], out.stderr)
    assert git(queue.repo, "show", "--name-only", "--format=", r["git"]["commit"]) == "s1.txt\n"
    # a submodule your .git/config names with no path (one removed since) hides nothing else
    git(git_repo, "config", "submodule.gone.ignore", "all")
    (git_repo / "mine.txt").write_text("mine\n")
    queue.put(queue.task("s2"))
    out = queue.watch()
    r = queue.result("s2")
    assert (r["status"], r["reason"], r["git"]["status_before"]) == (
        "blocked", "dirty_repo", "?? mine.txt\n"), (r["detail"], out.stderr)


def test_an_index_made_gigabytes_of_holes_is_never_copied(git_repo, tmp_path):
    """An agent truncates the index to a huge size (holes, no disk used): the audit neither
    copies it into a temporary index (that writes all of it) nor reads it through, and the
    task ends with a result. What the watcher wrote is counted by the kernel (/proc/self/io,
    read as it exits); a file size limit keeps a copy from filling the disk."""
    import resource
    grow = ("import os, resource; resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,"
            " resource.RLIM_INFINITY)); os.truncate('.git/index', 300 << 20)")
    queue = Queue(git_repo, tmp_path, executor={"command": [PYTHON, "-c", grow]})
    queue.put(queue.task("holes"))
    counted = tmp_path / "io"
    watcher = ("import atexit, runpy, shutil, sys; atexit.register(shutil.copy, '/proc/self/io', %r); "
               "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')" % str(counted))

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (50 << 20, resource.RLIM_INFINITY))
    out = subprocess.run([PYTHON, "-c", watcher, str(BRIDGE), "watch", "--once", "--root",
                          str(queue.repo), "--config", str(queue.config_path)], env=queue.env,
                         preexec_fn=limit, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=120)
    r = queue.result("holes")  # git itself refuses the index of zeros it finds afterwards
    assert (r["status"], out.returncode) == ("failed", 1) and "index" in r["detail"], out.stderr
    io = dict(line.split(": ") for line in counted.read_text().splitlines())
    assert int(io["wchar"]) < 10 << 20 and int(io["rchar"]) < 100 << 20, io
