"""watch with several agents: an executor per task, an agent that goes silent, retries that
are told what failed, and a notifier that tells a person.

Through the CLI on real repositories; the agents are fixtures/agent.py and the fixture
`claude`, `codex`, `opencode` and `aider` executables in fixtures/ (they accept exactly
their real CLI's flags), the notifier fixtures/notify.py.
"""
import json
import os
import subprocess
import time

import pytest

from conftest import BRIDGE, FIXTURES, PYTHON, REPO, git, process_running
from test_watch import AGENT, Queue, branch  # noqa: F401 (fixture helpers)


@pytest.fixture
def queue(git_repo, tmp_path):
    return Queue(git_repo, tmp_path)


def recorder(tmp_path, name):
    """An argv template of an agent that records its argv in tmp/NAME.json, then edits."""
    record = tmp_path / (name + ".json")
    script = ("import json,sys; json.dump(sys.argv[1:], open(%r, 'w')); "
              "open('by-%s.txt', 'w').write('edited\\n')" % (str(record), name))
    return [PYTHON, "-c", script, name, "{id}"], record


# ---- executors ---------------------------------------------------------------

def test_a_task_names_its_executor_and_the_default_stays_executor_command(queue, tmp_path):
    claude, claude_record = recorder(tmp_path, "claude")
    queue.config["executors"] = {"claude": claude}
    queue.save_config()
    queue.put(queue.task("e1", executor="claude", commands_to_run=["test -f by-claude.txt"]))
    queue.put(queue.task("e2"))  # no executor: executor.command (the fixture agent)
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    assert json.loads(claude_record.read_text()) == ["claude", "e1"]
    first, second = queue.result("e1"), queue.result("e2")
    assert first["status"] == "success" and first["executor"]["name"] == "claude"
    assert first["executor"]["argv"][-2:] == ["claude", "{id}"]
    assert "running the editing agent (claude)" in out.stderr
    assert second["status"] == "success" and second["executor"]["name"] is None
    assert second["executor"]["argv"] == AGENT


def test_an_unknown_executor_is_schema_invalid_naming_it(queue, tmp_path):
    queue.config["executors"] = {"claude": ["claude", "-p", "{prompt}"]}
    queue.save_config()
    task = queue.task("u1", executor="cladue")
    path = tmp_path / "u1.json"
    path.write_text(json.dumps(task))
    out = queue.bridge("submit", path)  # refused at once, naming it and what there is
    assert out.returncode == 2 and "executor: 'cladue'" in out.stderr and "claude" in out.stderr
    queue.put(task)  # a planner that drops the file in tasks/ itself
    out = queue.watch()
    result = queue.result("u1")
    assert result["reason"] == "schema_invalid" and result["exit_path"] == "skipped"
    assert any("executor: 'cladue'" in e for e in result["errors"])
    assert queue.names("failed") == ["u1.json"] and out.returncode == 4


def test_a_nul_character_the_agent_argv_cannot_carry_is_schema_invalid_naming_the_field(queue, tmp_path):
    path = tmp_path / "z.json"
    path.write_text(json.dumps(queue.task("z", prompt="do\u0000it", scope=["a", "b\u0000"])))
    out = queue.bridge("submit", path)
    assert out.returncode == 2, out.stderr
    assert "prompt: contains a NUL character" in out.stderr and "scope[1]: contains" in out.stderr
    queue.put(queue.task("z", commands_to_run=["true\u0000"]))
    assert queue.watch().returncode == 4
    result = queue.result("z")
    assert result["reason"] == "schema_invalid", result["detail"]
    assert result["errors"] == ["commands_to_run[0]: contains a NUL character, which no command "
                                "line can carry"]


def test_a_bad_executors_entry_or_notify_event_is_a_config_error(queue):
    queue.config["executors"] = {"claude": "claude -p"}
    queue.save_config()
    out = queue.watch()
    assert out.returncode == 2 and "executors.claude must be a non-empty list" in out.stderr
    queue.config["executors"] = {}
    queue.config["notify"] = {"command": ["true"], "on": ["failed", "needs_approval"]}
    queue.save_config()
    out = queue.watch()
    assert out.returncode == 2 and 'notify.on must be a list of success, failed' in out.stderr
    assert '"needs_approval"' in out.stderr


# ---- a silent agent ------------------------------------------------------------

def test_an_agent_silent_for_the_idle_timeout_is_stopped_and_blocked_with_its_tail(queue, tmp_path):
    queue.config["agent_idle_timeout_sec"] = 1.5
    queue.config["continue_on_failure"] = False  # blocked never stops the queue
    queue.save_config()
    pids = tmp_path / "pids"
    queue.put(queue.task("s1", agent={"write": {"half.txt": "half\n"}, "silent": 60,
                                      "grandchild": True, "pidfile": str(pids)}))
    queue.put(queue.task("s2"))  # runs after it: the checkout is back on main, clean
    started = time.monotonic()
    out = queue.watch()
    assert time.monotonic() - started < 30
    assert out.returncode == 4, out.stderr
    result = queue.result("s1")
    assert (result["status"], result["exit_path"], result["reason"]) == ("blocked", "blocked",
                                                                         "agent_idle")
    assert "printed nothing for 1.5s" in result["detail"]
    assert result["executor"]["last_lines"][-1] == "fixture agent: shall I go on? [y/N]"
    assert result["executor"]["exit_code"] is None
    for pid in map(int, pids.read_text().split()):  # the whole group is gone
        assert not process_running(pid)
    # its work is parked on its branch, the queue went on from a clean main
    assert result["git"]["wip_commit"] and branch(queue.repo) == "main"
    assert "half.txt" in git(queue.repo, "show", "--stat", "feat/ai/s1")
    assert queue.result("s2")["status"] == "success"
    assert queue.names("failed") == ["s1.json"]


def test_an_agent_that_keeps_printing_is_not_idle(queue, tmp_path):
    script = ("import time\nfor i in range(8):\n print('step', i, flush=True)\n time.sleep(0.4)\n"
              "open('done.txt', 'w').write('ok')\n")
    queue.config["executor"] = {"command": [PYTHON, "-c", script]}
    queue.config["agent_idle_timeout_sec"] = 1.0
    queue.save_config()
    queue.put(queue.task("p1", commands_to_run=["test -f done.txt"]))
    assert queue.watch().returncode == 0
    assert queue.result("p1")["status"] == "success"


# ---- retries are told what failed ---------------------------------------------

TOKEN = "ghp_" + "R3tryC0ntextT0kenAbcdefghijklmnopqrst"  # a GitHub token's shape


def test_a_retry_is_told_the_reason_the_failing_command_and_its_output_redacted(queue, tmp_path):
    queue.config.update(retry_context_bytes=700, continue_on_failure=True)
    queue.save_config()
    seen = tmp_path / "prompt.txt"
    verify = "seq 1 400; cat out.txt; echo 'boom: expected 3, got 2'; test -f fixed.txt"
    task = queue.task("r1", agent={"write": {"out.txt": "using %s\n" % TOKEN},
                                   "save_prompt": str(seen)}, commands_to_run=["true", verify])
    queue.put(task)
    assert queue.watch().returncode == 4  # verify_failed: the work parked on its branch
    first = queue.result("r1")
    assert first["reason"] == "verify_failed" and first["retry_context"] is None
    assert "What went wrong" not in seen.read_text()
    retry = tmp_path / "r1.json"
    retry.write_text(json.dumps(task))
    assert queue.bridge("submit", "--retry", retry).returncode == 0
    assert queue.watch().returncode == 4
    told = seen.read_text()  # what attempt 2's agent read
    section = told.split("## What went wrong last time\n", 1)[1].split("\n## Rules", 1)[0]
    assert section.startswith("Attempt 1 ended failed (verify_failed): `%s` exit 1" % verify)
    assert "The failing verification command: `%s` (exit 1)" % verify in section
    assert section.rstrip().endswith("boom: expected 3, got 2\n```")
    assert TOKEN not in told and "\nusing " in section  # the output redacted: cat out.txt
    assert "\n1\n" not in section and "\n400\n" in section  # capped: its tail
    second = queue.result("r1")
    assert len(second["retry_context"].encode()) <= 700
    assert second["retry_context"] == "## What went wrong last time\n" + section.rstrip("\n")
    # the history shows each attempt and what it was told
    assert [(h["attempt"], h["retry_context"]) for h in queue.history("r1")] == [(1, None)]
    assert second["attempt"] == 2 and (queue.handoff / "meta" / "r1.prompt.md").read_text() == told


def failed_twice(queue, tmp_path, task):
    """Run `task`, which fails, then its retry (`submit --retry`), which fails again."""
    queue.put(task)
    assert queue.watch().returncode == 4
    retry = tmp_path / (task["id"] + ".json")
    retry.write_text(json.dumps(task))
    assert queue.bridge("submit", "--retry", retry).returncode == 0
    assert queue.watch().returncode == 4


@pytest.mark.parametrize("word", ["x", "\U0001F600"])  # one byte, four bytes
def test_the_retry_section_keeps_its_cap_with_a_long_command(queue, tmp_path, word):
    """retry_context_bytes is a cap in bytes, even at its least (256) with a verification
    command long enough to fill it (in ASCII, or in characters of four bytes)."""
    queue.config.update(retry_context_bytes=256, continue_on_failure=True)
    queue.save_config()
    task = queue.task("rc", commands_to_run=["echo failing; false # " + word * 190])
    failed_twice(queue, tmp_path, task)
    told = queue.result("rc")["retry_context"]
    assert told.startswith("## What went wrong last time\nAttempt 1 ended failed (verify_failed)")
    assert told.endswith("\n```") and len(told.encode()) <= 256, (len(told.encode()), told)


def test_a_retry_after_an_agent_stopped_is_told_how_it_ended_not_exit_none(queue, tmp_path):
    """An agent stopped for silence (or killed) has no exit code: its retry is told it was
    killed by a signal, not `exit None`, a Python word that means nothing to an agent."""
    queue.config.update(agent_idle_timeout_sec=0.5)
    queue.save_config()
    seen = tmp_path / "prompt.txt"
    task = queue.task("ai", agent={"silent": 30, "save_prompt": str(seen)})
    failed_twice(queue, tmp_path, task)
    section = queue.result("ai")["retry_context"]
    assert "Attempt 1 ended blocked (agent_idle)" in section, section
    assert "The editing agent's run (killed by signal 15)" in section and "None" not in section
    assert "shall I go on? [y/N]" in section and section in seen.read_text()


def test_prompt_and_prompt_file_carry_the_same_retry_section(queue, tmp_path):
    record = tmp_path / "given.json"
    script = ("import json,sys; json.dump({'arg': sys.argv[1], 'file': open(sys.argv[2]).read()},"
              " open(%r, 'w'))" % str(record))
    queue.config["executor"] = {"command": [PYTHON, "-c", script, "{prompt}", "{prompt_file}"]}
    queue.config["continue_on_failure"] = True
    queue.save_config()
    task = queue.task("pp", commands_to_run=["echo nope {id}; false"])
    failed_twice(queue, tmp_path, task)
    given = json.loads(record.read_text())
    assert given["arg"] == given["file"]
    assert "`echo nope {id}; false` (exit 1)" in given["arg"] and "\nnope {id}\n" in given["arg"]


def test_a_retry_after_crash_recovery_is_told_and_retry_context_can_be_off(queue, tmp_path):
    import signal
    from test_watch import wait_for
    seen = tmp_path / "prompt.txt"
    pids = tmp_path / "pids"
    queue.put(queue.task("c1", agent={"sleep": 60, "sleep_attempts": [1], "pidfile": str(pids),
                                      "save_prompt": str(seen), "print": "halfway there"},
                         retry_policy={"max_attempts": 2}))
    watcher = queue.popen_watch("--once")
    assert wait_for(lambda: pids.exists() and pids.read_text().strip())
    os.kill(watcher.pid, signal.SIGKILL)
    watcher.wait(10)
    assert queue.watch().returncode == 0
    told = seen.read_text()
    assert "Attempt 1 ended failed (stale_lock_recovered): task lock was stale" in told
    assert queue.result("c1")["retry_context"].startswith("## What went wrong last time\nAttempt 1")
    # retry_context off: a retry is told nothing
    queue.config["retry_context"] = False
    queue.save_config()
    retry = tmp_path / "c1.json"
    retry.write_text(json.dumps(queue.task("c1", agent={"save_prompt": str(seen)},
                                           commands_to_run=["false"])))
    assert queue.bridge("submit", "--retry", retry).returncode == 0
    assert queue.watch().returncode == 1
    assert "What went wrong" not in seen.read_text() and queue.result("c1")["retry_context"] is None


# ---- notify ------------------------------------------------------------------------

NOTIFY = [PYTHON, str(FIXTURES / "notify.py")]


def notified(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_notify_fires_with_placeholders_and_the_redacted_result_on_stdin(queue, tmp_path):
    out_file = tmp_path / "notified.jsonl"
    queue.config["notify"] = {"command": NOTIFY + ["--out", str(out_file), "{id}", "{status}",
                                                   "{reason}", "{result_file}"]}
    queue.config["continue_on_failure"] = True
    queue.save_config()
    queue.put(queue.task("n1"))  # success: not in notify.on by default
    queue.put(queue.task("n2", agent={"print": "key " + TOKEN}, commands_to_run=["false"]))
    queue.put(queue.task("n3", requires_confirmation=True))
    out = queue.watch()
    assert out.returncode == 4, out.stderr
    calls = notified(out_file)
    assert [c["argv"][:3] for c in calls] == [["n2", "failed", "verify_failed"],
                                              ["n3", "needs_confirmation", "requires_confirmation"]]
    assert calls[0]["argv"][3] == str(queue.handoff / "results" / "n2.json")
    assert calls[0]["stdin"] == queue.result("n2")  # the result as written: redacted
    assert TOKEN not in out_file.read_text()
    assert "notify: n2 failed verify_failed" in (queue.handoff / "logs" / "n2.log").read_text()


def test_notify_on_success_and_when_the_queue_stops(queue, tmp_path):
    out_file = tmp_path / "notified.jsonl"
    queue.config["notify"] = {"command": NOTIFY + ["--out", str(out_file), "{id}", "{status}",
                                                   "{reason}"],
                              "on": ["success", "queue_stopped"]}
    queue.save_config()
    queue.put(queue.task("q1"))
    queue.put(queue.task("q2", commands_to_run=["false"]))
    queue.put(queue.task("q3"))  # never runs: the queue stopped
    assert queue.watch().returncode == 1
    assert [c["argv"] for c in notified(out_file)] == [["q1", "success", "verified"],
                                                      ["q2", "queue_stopped", "verify_failed"]]
    assert notified(out_file)[1]["stdin"]["id"] == "q2"


def test_queue_stopped_tells_what_the_watcher_wrote_not_a_file_an_agent_changed(git_repo, tmp_path):
    """workers 2: 1_f fails and stops the queue; while its `failed` notification runs, the
    agent of 2_x (running alongside: the watcher's writes for 1_f are no tampering to it)
    replaces results/1_f.json with shell syntax in `reason` and a token. The queue_stopped
    notification must carry the watcher's reason and redacted result, not that file."""
    out_file, forged = tmp_path / "notified.jsonl", tmp_path / "forged"
    forge = ('h=$(dirname "$(dirname "$BRIDGE_TASK_FILE")"); '
             'until test -e "$h/results/1_f.json"; do sleep 0.05; done; '
             'printf \'{"id": "1_f", "status": "failed", "reason": "$(touch pwned)", '
             '"detail": "key %s"}\' > "$h/results/.f"; mv "$h/results/.f" "$h/results/1_f.json"; '
             'touch %s' % (TOKEN, forged))
    notifier = ('if [ "$2" = failed ]; then until test -e %s; do sleep 0.05; done; fi; '
                'exec %s --out %s "$1" "$2" "$3"' % (forged, " ".join(NOTIFY), out_file))
    queue = Queue(git_repo, tmp_path, isolation="worktree", workers=2,
                  executors={"forge": ["sh", "-c", forge]},
                  notify={"command": ["sh", "-c", notifier, "n", "{id}", "{status}", "{reason}"],
                          "on": ["failed", "queue_stopped"]})
    queue.put(queue.task("1_f", commands_to_run=["false"]))
    queue.put(queue.task("2_x", executor="forge"))
    out = queue.watch(timeout=120)
    assert out.returncode == 1, out.stderr
    calls = notified(out_file)
    assert [c["argv"] for c in calls] == [["1_f", "failed", "verify_failed"],
                                          ["1_f", "queue_stopped", "verify_failed"]], calls
    assert calls[1]["stdin"] == calls[0]["stdin"] and calls[1]["stdin"]["reason"] == "verify_failed"
    assert TOKEN not in out_file.read_text()


def test_a_failing_or_hanging_notifier_never_changes_the_outcome(queue, tmp_path):
    queue.config["notify"] = {"command": NOTIFY + ["--hang", "60", "{id}"], "timeout_sec": 1,
                              "on": ["success", "blocked"]}
    queue.save_config()
    queue.put(queue.task("h1"))
    started = time.monotonic()
    out = queue.watch()
    assert time.monotonic() - started < 20
    assert out.returncode == 0, out.stderr
    assert queue.result("h1")["status"] == "success"
    assert "h1: warning: notify.command timed out after" in out.stderr
    log = (queue.handoff / "logs" / "h1.log").read_text()
    assert "--- notify (success)" in log and "notify: h1" in log and "timed out" in log
    queue.config["notify"] = {"command": NOTIFY + ["--exit", "3", "{id}"], "on": ["blocked"]}
    queue.save_config()
    (queue.repo / "dirt.txt").write_text("x")  # dirty_repo: blocked
    queue.put(queue.task("h2"))
    out = queue.watch()
    assert out.returncode == 4 and queue.result("h2")["reason"] == "dirty_repo"
    assert "h2: warning: notify.command exit 3" in out.stderr
    queue.config["notify"] = {"command": ["/nonexistent/notifier", "{id}"], "on": ["blocked"]}
    queue.save_config()
    queue.put(queue.task("h3"))
    out = queue.watch()
    assert out.returncode == 4 and queue.result("h3")["reason"] == "dirty_repo"
    assert "h3: warning: notify.command cannot start /nonexistent/notifier" in out.stderr


# ---- the README's templates of real agent CLIs ---------------------------------

CLIS = ("opencode", "claude", "codex", "aider")


def readme_executors():
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- executors -->\n", 1)[1].split("<!-- end executors -->", 1)[0]
    return json.loads(block.split("```json\n", 1)[1].rsplit("```", 1)[0])


def readme_clis_on_path(queue, tmp_path):
    """The README's executors in the queue's config, with the fixtures on PATH under the real
    CLIs' names (as strict as they are); their folder and the config."""
    config = readme_executors()
    assert sorted(config["executors"]) == sorted(CLIS)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in CLIS:
        (bin_dir / name).symlink_to(FIXTURES / name)
    queue.env["PATH"] = "%s%s%s" % (bin_dir, os.pathsep, queue.env.get("PATH", ""))
    queue.config.update(config)
    queue.save_config()
    return bin_dir, config


def test_the_readme_template_of_each_agent_cli_runs_and_edits(queue, tmp_path):
    bin_dir, config = readme_clis_on_path(queue, tmp_path)
    (tmp_path / "p.md").write_text("a prompt\n")
    for name in CLIS:
        argv = [w.replace("{prompt}", "p").replace("{prompt_file}", str(tmp_path / "p.md"))
                for w in config["executors"][name]]
        refused = subprocess.run([str(bin_dir / name)] + argv[1:] + ["--no-such-flag"],
                                 capture_output=True, text=True, stdin=subprocess.DEVNULL)
        assert refused.returncode == 2 and "no-such-flag" in refused.stderr, (name, refused)
    with open(queue.repo / ".git" / "info" / "exclude", "a") as handle:
        handle.write(".aider*\n")             # as the README says: aider's tags cache stays out
    for name in CLIS + (None,):
        edit = "%s.txt" % (name or "default")
        queue.put(queue.task("x-%s" % (name or "default"), executor=name,
                             agent={"write": {edit: "edited\n"}}, commands_to_run=["test -f " + edit]))
    out = queue.watch()
    assert out.returncode == 0, out.stderr
    for name in CLIS + (None,):
        result = queue.result("x-%s" % (name or "default"))
        assert result["status"] == "success", (name, result["detail"], result["executor"])
        assert result["executor"]["argv"][0] == (name or "opencode")
        # the watcher made the only commit, of the edit alone (aider's own commits, history
        # files and .gitignore line are all turned off by the template's flags)
        shown = git(queue.repo, "show", "--stat", "--format=%s", result["git"]["commit"])
        assert shown.startswith("bridge: ") and shown.count("|") == 1, (name, shown)
    assert git(queue.repo, "status", "--porcelain") == ""
    assert (queue.repo / ".aider.tags.cache.v4").is_dir()


def test_an_agent_cli_reads_a_closed_stdin_never_the_watchers(queue, tmp_path):
    """`claude -p`, `codex exec` and `opencode run` read stdin to its end when it is not a
    terminal (so do their fixtures): the watcher gives them a closed one. Its own stdin here is
    a pipe left open holding an instruction: an agent given it would act on it, then wait for
    the end of it until its timeout."""
    readme_clis_on_path(queue, tmp_path)
    names = ("claude", "codex", "opencode")
    for name in names:
        queue.put(queue.task("s-" + name, executor=name, timeout_sec=10,
                             agent={"write": {name + ".txt": "edited\n"}},
                             commands_to_run=["test -f %s.txt" % name]))
    with open(tmp_path / "watch.out", "w") as out:
        watcher = subprocess.Popen(
            [PYTHON, str(BRIDGE), "watch", "--once", "--root", str(queue.repo), "--config",
             str(queue.config_path)], env=queue.env, stdin=subprocess.PIPE, stdout=out,
            stderr=subprocess.STDOUT, text=True)
        try:
            watcher.stdin.write('@agent {"write": {"from-stdin.txt": "read\\n"}}\n')
            watcher.stdin.flush()
            assert watcher.wait(timeout=120) == 0, (tmp_path / "watch.out").read_text()
        finally:
            if watcher.poll() is None:
                watcher.kill()
                watcher.wait()
            watcher.stdin.close()
    for name in names:
        result = queue.result("s-" + name)
        assert result["status"] == "success", (name, result["reason"], result["detail"])
    assert list(tmp_path.rglob("from-stdin.txt")) == []


def test_the_agent_cli_fixtures_behave_like_the_real_defaults(queue, tmp_path):
    """Without the template's flags the fixtures do what the real CLIs do: no edit in codex's
    read-only sandbox or without OpenCode permissions, aider commits its edits on its own."""
    queue.config["executors"] = {
        "codex": [str(FIXTURES / "codex"), "exec", "{prompt}"],
        "opencode": [str(FIXTURES / "opencode"), "run", "{prompt}"],
        "aider": [str(FIXTURES / "aider"), "--message", "{prompt}", "--yes-always"]}
    queue.config["continue_on_failure"] = True
    queue.save_config()
    for index, name in enumerate(("codex", "opencode", "aider")):
        queue.put(queue.task("d%d-%s" % (index, name), executor=name, commands_to_run=[
            "test -f d.txt"], agent={"write": {"d.txt": "x\n"}}))
    assert queue.watch().returncode == 4
    assert queue.result("d0-codex")["reason"] == "verify_failed"
    assert queue.result("d1-opencode")["reason"] == "verify_failed"
    aider = queue.result("d2-aider")
    assert aider["status"] == "success"
    # aider commits the file it edited, that only; the .gitignore line it adds goes into the
    # watcher's commit of the verified work
    log = git(queue.repo, "log", "--format=%x00%s", "--name-only", "feat/ai/d2-aider")
    assert [[line for line in commit.split("\n") if line] for commit in log.split("\x00")[1:]] == [
        ["bridge: d2-aider: Task d2-aider", ".gitignore"], ["aider: edits", "d.txt"],
        ["initial", "README.md"]]
    assert git(queue.repo, "show", "feat/ai/d2-aider:.gitignore") == ".aider*\n"
    # its history files and tags cache, hidden by that line on the task branch, lie in the
    # user's checkout once the watcher is back on main
    assert git(queue.repo, "status", "--porcelain") == (
        "?? .aider.chat.history.md\n?? .aider.input.history\n?? .aider.tags.cache.v4/\n")


def test_the_readme_notify_examples_work_as_written(queue, tmp_path):
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- notify examples -->\n", 1)[1].split("<!-- end notify examples -->")[0]
    examples = [json.loads(part.split("```", 1)[0]) for part in block.split("```json\n")[1:]]
    assert len(examples) == 3
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("curl", "notify-send"):
        (bin_dir / name).symlink_to(FIXTURES / name)
    hook = "https://hooks.slack.com/services/T0000/B0000/" + "x" * 24
    queue.env.update(PATH="%s%s%s" % (bin_dir, os.pathsep, queue.env.get("PATH", "")),
                     CURL_FIXTURE_LOG=str(tmp_path / "curl.jsonl"), NTFY_TOPIC="my-topic",
                     NOTIFY_SEND_FIXTURE_LOG=str(tmp_path / "notify-send.jsonl"),
                     SLACK_WEBHOOK_URL=hook)
    queue.config["continue_on_failure"] = True
    for index, example in enumerate(examples):
        queue.config.update(example)
        queue.save_config()
        queue.put(queue.task("n-%d" % index, commands_to_run=["false"]))
        out = queue.watch()
        assert out.returncode == 4 and "warning" not in out.stderr, out.stderr
    assert notified(tmp_path / "notify-send.jsonl") == [
        {"summary": "bridge.py: n-0 failed", "body": "verify_failed", "urgency": None}]
    ntfy, slack = notified(tmp_path / "curl.jsonl")
    assert ntfy == {"url": "https://ntfy.sh/my-topic", "headers": ["Title: bridge.py n-1"],
                    "data": "n-1: failed (verify_failed)", "method": None}
    assert slack["url"] == hook and slack["headers"] == ["Content-Type: application/json"]
    assert json.loads(slack["data"]) == {"text": "bridge.py: n-2 failed (verify_failed)"}
    assert hook not in (tmp_path / "bridge.config.json").read_text()  # from the environment


def test_a_broken_line_in_the_result_history_is_no_internal_error(queue, tmp_path):
    """meta/ID.results.jsonl is the agent's to write: a line holding a JSON array, or a record
    whose commands is a number, made every later run of the task an internal_error."""
    queue.config.update(continue_on_failure=True)
    queue.save_config()
    task = queue.task("hb", commands_to_run=["false"])
    queue.put(task)
    assert queue.watch().returncode == 4
    history = queue.handoff / "meta" / "hb.results.jsonl"
    history.write_text('[1]\n{"status": "failed", "reason": "y", "commands": 5, "attempt": 9}\n')
    retry = tmp_path / "hb.json"
    retry.write_text(json.dumps(task))
    assert queue.bridge("submit", "--retry", retry).returncode == 0
    assert queue.watch().returncode == 4
    result = queue.result("hb")
    assert result["reason"] != "internal_error", result
