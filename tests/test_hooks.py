"""`bridge.py hooks install|uninstall|doctor`: the seam's hooks written into Claude Code's,
Codex's and Pi's settings, run as the hosts run them (sh -c, real files, real processes)."""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import BRIDGE, clean_env, make_git_repo, readme_quickstart, run_bridge

README = (BRIDGE.parent / "README.md").read_text()
SEAM_SECTION = README[README.index("<!-- section:seam -->"):README.index("<!-- end section:seam -->")]


def readme_blocks(lang):
    return re.findall(r"```%s\n(.*?)```" % lang, SEAM_SECTION, re.S)


@pytest.fixture
def home(tmp_path):
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def project(tmp_path):
    repo = make_git_repo(tmp_path / "proj")
    (repo / "scripts").mkdir()
    (repo / "scripts" / "bridge.py").write_bytes(BRIDGE.read_bytes())
    (repo / "sub" / "deep").mkdir(parents=True)
    return repo


def hooks(*args, cwd, home):
    return run_bridge("hooks", *args, cwd=cwd, env=clean_env(HOME=home, CODEX_HOME=home / ".codex"))


def run_hook(command, cwd, payload, **env):
    """A hook command as Claude Code and Codex run it: sh -c, the payload on stdin."""
    return subprocess.run(["sh", "-c", command], cwd=cwd, input=json.dumps(payload), text=True,
                          capture_output=True, env=clean_env(**env), timeout=60)


def events(repo):
    path = Path(repo) / "_bridge" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def bridge_commands(settings):
    return [(event, hook["command"]) for event, groups in settings["hooks"].items()
            for group in groups for hook in group["hooks"] if "seam_main" in hook["command"]]


def test_claude_install_in_a_fresh_repository_writes_the_readme_hooks_and_they_run(project, home):
    out = hooks("install", "--host", "claude", cwd=project / "sub", home=home)
    assert out.returncode == 0, out.stderr
    settings_file = project / ".claude" / "settings.json"
    assert "added PostToolUse: egress emit" in out.stdout and str(settings_file) in out.stdout
    settings = json.loads(settings_file.read_text())
    assert settings == json.loads(readme_blocks("json")[0])  # the README's reference block
    assert not (project / ".claude" / "settings.json.bridge-backup").exists()  # nothing to back up
    (project / "_bridge").mkdir()
    (project / "_bridge" / "fo.alpha.json").write_text(json.dumps(
        {"session_id": "s1", "host": "claude", "ts": "2026-07-03T12:00:00Z", "state": "idle"}))
    (project / "_bridge" / "inbox.jsonl").write_text('{"id":"i1","ts":"2026-07-03T11:00:00Z",'
                                                      '"kind":"tell","text":"hi","target":"alpha"}\n')
    for event, command in bridge_commands(settings):
        result = run_hook(command, project / "sub", {"session_id": "s1", "cwd": str(project / "sub"),
                                                     "hook_event_name": event},
                          CLAUDE_PROJECT_DIR=project)
        assert result.returncode == 0 and result.stderr == "", (event, result)
        if "inbox check" in command:
            assert json.loads(result.stdout)["decision"] == "block"
    assert [e["event"] for e in events(project)] == ["SessionStart", "UserPromptSubmit", "PostToolUse",
                                                     "Notification", "SubagentStop", "Stop"]
    before = settings_file.read_bytes()
    again = hooks("install", "--host", "claude", cwd=project, home=home)
    assert again.returncode == 0 and "unchanged" in again.stdout
    assert settings_file.read_bytes() == before


USER_SETTINGS = {
    "model": "opus", "permissions": {"allow": ["Bash(ls:*)"]},
    "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "./guard.sh"}]}],
              "Stop": [{"hooks": [{"type": "command", "command": "say done", "timeout": 5}]}]},
}


def test_install_keeps_every_existing_hook_backs_up_once_and_uninstall_removes_exactly_ours(project, home):
    settings_file = project / ".claude" / "settings.json"
    settings_file.parent.mkdir()
    original = json.dumps(USER_SETTINGS)
    settings_file.write_text(original)
    out = hooks("install", "--host", "claude", cwd=project, home=home)
    assert out.returncode == 0, out.stderr
    backup = project / ".claude" / "settings.json.bridge-backup"
    assert backup.read_text() == original and str(backup) in out.stdout
    settings = json.loads(settings_file.read_text())
    assert settings["model"] == "opus" and settings["permissions"] == USER_SETTINGS["permissions"]
    assert settings["hooks"]["PreToolUse"] == USER_SETTINGS["hooks"]["PreToolUse"]
    assert settings["hooks"]["Stop"][0] == USER_SETTINGS["hooks"]["Stop"][0]
    assert len(bridge_commands(settings)) == 7
    # the user edits around our entries; a reinstall leaves theirs and ours where they are
    settings["hooks"]["PostToolUse"].insert(0, {"matcher": "Edit", "hooks": [{"type": "command", "command": "fmt"}]})
    settings_file.write_text(json.dumps(settings))
    assert "unchanged" in hooks("install", "--host", "claude", cwd=project, home=home).stdout
    out = hooks("uninstall", "--host", "claude", cwd=project, home=home)
    assert out.returncode == 0 and "removed Stop: inbox check" in out.stdout
    left = json.loads(settings_file.read_text())
    expected = json.loads(original)
    expected["hooks"]["PostToolUse"] = [{"matcher": "Edit", "hooks": [{"type": "command", "command": "fmt"}]}]
    assert left == expected
    assert backup.read_text() == original  # the first backup is the file before bridge.py
    assert "unchanged" in hooks("uninstall", "--host", "claude", cwd=project, home=home).stdout


def test_install_over_the_pasted_readme_hooks_changes_nothing(project, home):
    (project / ".claude").mkdir()
    (project / ".claude" / "settings.json").write_text(readme_blocks("json")[0])
    (project / ".codex").mkdir()
    (project / ".codex" / "hooks.json").write_text(readme_blocks("json")[1])
    for host in ("claude", "codex"):
        out = hooks("install", "--host", host, cwd=project, home=home)
        assert out.returncode == 0 and "unchanged" in out.stdout, out


def test_codex_install_writes_the_readme_hooks_prints_the_trust_step_and_runs_from_a_subfolder(project, home):
    (project / ".codex").mkdir()
    (project / ".codex" / "hooks.json").write_text('{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "notify"}]}]}}')
    out = hooks("install", "--host", "codex", cwd=project, home=home)
    assert out.returncode == 0, out.stderr
    assert "/hooks" in out.stdout and 'trust_level = "trusted"' in out.stdout and str(project) in out.stdout
    settings = json.loads((project / ".codex" / "hooks.json").read_text())
    readme = json.loads(readme_blocks("json")[1])
    assert settings["hooks"]["Stop"][0] == {"hooks": [{"type": "command", "command": "notify"}]}
    settings["hooks"]["Stop"].pop(0)
    assert settings["hooks"] == readme["hooks"]
    for event, command in bridge_commands(settings):
        result = run_hook(command, project / "sub" / "deep", {"session_id": "c1", "hook_event_name": event,
                                                              "cwd": str(project / "sub" / "deep")})
        assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), (event, result)
    assert [e["host"] for e in events(project)] == ["codex"] * 6


def test_user_scope_hooks_find_bridge_py_from_any_project_and_stay_silent_without_one(project, home, tmp_path):
    out = hooks("install", "--host", "claude", "--scope", "user", cwd=project, home=home)
    assert out.returncode == 0, out.stderr
    settings = json.loads((home / ".claude" / "settings.json").read_text())
    assert not (project / ".claude").exists()
    other = make_git_repo(tmp_path / "other")  # no scripts/bridge.py there
    for cwd, root in ((project / "sub", project), (other, other)):
        for event, command in bridge_commands(settings):
            result = run_hook(command, cwd, {"session_id": "u1", "hook_event_name": event, "cwd": str(cwd)},
                              CLAUDE_PROJECT_DIR=root)
            assert result.returncode == 0 and result.stderr == "", result
    assert len(events(project)) == 6 and not (other / "_bridge").exists()
    for host, path in (("codex", home / ".codex" / "hooks.json"),  # $CODEX_HOME
                       ("pi", home / ".pi" / "agent" / "extensions" / "bridge.ts")):
        assert hooks("install", "--host", host, "--scope", "user", cwd=project, home=home).returncode == 0
        assert path.is_file() and (host == "pi" or len(bridge_commands(json.loads(path.read_text()))) == 6)
    out = hooks("doctor", "--scope", "user", cwd=project, home=home)
    assert out.returncode == 0 and [l[:2] for l in out.stdout.splitlines()] == ["ok"] * 4, out.stdout


def test_malformed_settings_are_refused_with_file_and_line_never_overwritten(project, home):
    settings_file = project / ".claude" / "settings.json"
    settings_file.parent.mkdir()
    broken = '{\n  "model": "opus",\n  "hooks": {,\n}\n'
    settings_file.write_text(broken)
    out = hooks("install", "--host", "claude", cwd=project, home=home)
    assert out.returncode == 2 and str(settings_file) in out.stderr and "line 3" in out.stderr, out
    assert "Traceback" not in out.stderr and settings_file.read_text() == broken
    assert not (project / ".claude" / "settings.json.bridge-backup").exists()
    settings_file.write_text('{"hooks": []}')
    out = hooks("install", "--host", "claude", cwd=project, home=home)
    assert out.returncode == 2 and str(settings_file) in out.stderr and '"hooks"' in out.stderr
    assert settings_file.read_text() == '{"hooks": []}'


def test_symlinked_settings_file_is_refused_and_left_alone(project, home, tmp_path):
    target = tmp_path / "dotfiles-settings.json"
    target.write_text('{"model": "opus"}')
    (project / ".codex").mkdir()
    (project / ".codex" / "hooks.json").symlink_to(target)
    out = hooks("install", "--host", "codex", cwd=project, home=home)
    assert out.returncode == 2 and "symlink" in out.stderr and str(project / ".codex" / "hooks.json") in out.stderr
    assert (project / ".codex" / "hooks.json").is_symlink() and target.read_text() == '{"model": "opus"}'
    # a repository folder linked elsewhere is never written through; the user's own linked ~/.claude is
    outside = tmp_path / "outside"
    outside.mkdir()
    (project / ".claude").symlink_to(outside)
    out = hooks("install", "--host", "claude", cwd=project, home=home)
    assert out.returncode == 2 and "symlink" in out.stderr and list(outside.iterdir()) == []
    (home / ".claude").symlink_to(outside)
    assert hooks("install", "--host", "claude", "--scope", "user", cwd=project, home=home).returncode == 0
    assert len(bridge_commands(json.loads((outside / "settings.json").read_text()))) == 7


def test_pi_install_writes_the_readme_extension_and_never_touches_a_foreign_one(project, home):
    path = project / ".pi" / "extensions" / "bridge.ts"
    out = hooks("install", "--host", "pi", cwd=project, home=home)
    assert out.returncode == 0 and path.read_text() == readme_blocks("ts")[0]
    assert "unchanged" in hooks("install", "--host", "pi", cwd=project, home=home).stdout
    assert hooks("uninstall", "--host", "pi", cwd=project, home=home).returncode == 0 and not path.exists()
    assert not (path.parent / "bridge.ts.bridge-backup").exists()
    # edited after install: uninstall still removes it, keeping the edit as the backup
    assert hooks("install", "--host", "pi", cwd=project, home=home).returncode == 0
    path.write_text(path.read_text() + "// mine\n")
    out = hooks("uninstall", "--host", "pi", cwd=project, home=home)
    assert out.returncode == 0 and not path.exists()
    assert (path.parent / "bridge.ts.bridge-backup").read_text().endswith("// mine\n")
    (path.parent / "bridge.ts.bridge-backup").unlink()
    path.write_text("// my own extension\n")
    out = hooks("install", "--host", "pi", cwd=project, home=home)
    assert out.returncode == 2 and str(path) in out.stderr and path.read_text() == "// my own extension\n"


def test_doctor_runs_and_times_each_hook_and_names_a_broken_one(project, home):
    for host in ("claude", "codex"):
        assert hooks("install", "--host", host, cwd=project, home=home).returncode == 0
    out = hooks("doctor", cwd=project / "sub", home=home)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("ok")]
    assert len(lines) == 3 and all(re.search(r'ms median, python3 -I -S -c "import json" [\d.]+ ms \(x', l)
                                   for l in lines), out.stdout
    assert any(e["session_id"] == "bridge-hooks-doctor" for e in events(project))
    (project / "scripts" / "bridge.py").unlink()  # the hooks can no longer find bridge.py
    out = hooks("doctor", "--host", "codex", cwd=project, home=home)
    assert out.returncode == 1 and "broken" in out.stdout and "hooks.json egress emit" in out.stdout
    assert "wrote nothing to %s" % (project / "_bridge" / "events.jsonl") in out.stdout
    out = hooks("doctor", "--host", "claude", cwd=project, home=home)
    assert out.returncode == 1 and "settings.json egress emit" in out.stdout and ": exit 1: " in out.stdout
    # a bridge.py that fails as it loads: every installed command, unchanged, is broken
    (project / "scripts" / "bridge.py").write_text("import sys\nsys.stderr.write('bad bridge')\nsys.exit(3)\n")
    out = hooks("doctor", cwd=project, home=home)
    assert out.returncode == 1 and out.stdout.count(": exit 3: bad bridge") == 3, out.stdout


def test_doctor_runs_only_the_commands_install_writes_and_names_the_others(project, home):
    """Settings files are agent-writable: a command that mentions bridge.py and a seam verb but is
    not byte for byte one install writes for that host, scope and event is never run, only named
    (JSON-escaped, so its control characters stay inert); the installed ones still run."""
    for host in ("claude", "codex"):
        assert hooks("install", "--host", host, cwd=project, home=home).returncode == 0
    claude_file, codex_file = project / ".claude" / "settings.json", project / ".codex" / "hooks.json"
    claude, codex = json.loads(claude_file.read_text()), json.loads(codex_file.read_text())
    check = claude["hooks"]["Stop"][0]["hooks"][1]["command"]
    claude["hooks"]["PostToolUse"][0]["hooks"].append(
        {"type": "command", "command": "python3 scripts/bridge.py egress emit; touch PWNED1 \x1b]0;x\x07"})
    claude["hooks"]["Notification"][0]["hooks"].append({"type": "command", "command": check})  # wrong event
    codex["hooks"]["Stop"][0]["hooks"][0]["command"] += "; touch PWNED2"
    claude_file.write_text(json.dumps(claude))
    codex_file.write_text(json.dumps(codex))
    out = hooks("doctor", cwd=project, home=home)
    assert out.returncode == 1, out.stdout + out.stderr
    assert not list(project.glob("PWNED*")) and not list((project / "sub").glob("PWNED*"))
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    assert '"python3 scripts/bridge.py egress emit; touch PWNED1 \\u001b]0;x\\u0007"' in out.stdout, out.stdout
    not_run = [line for line in out.stdout.splitlines() if line.startswith("not run")]
    assert len(not_run) == 3 and all("not a command hooks install writes: " in l for l in not_run), out.stdout
    assert all("an old bridge.py hook: remove it, then run `bridge.py hooks install --host " in l
               for l in not_run), out.stdout  # what to do about it
    assert any(str(codex_file) + " Stop" in l and "PWNED2" in l for l in not_run)
    assert any(str(claude_file) + " Notification" in l and "inbox check" in l for l in not_run)
    # the commands install wrote still run: claude's two and codex's one (its Stop is not among them)
    assert len([line for line in out.stdout.splitlines() if line.startswith("ok")]) == 3, out.stdout


def test_install_and_uninstall_leave_a_users_own_bridge_py_hooks_and_name_them(project, home):
    settings_file = project / ".claude" / "settings.json"
    settings_file.parent.mkdir()
    mine = {"hooks": {
        "Stop": [{"hooks": [{"type": "command", "command": "./notify.sh && python3 scripts/bridge.py inbox check --slug me"}]}],
        "PostToolUse": [{"matcher": "Bash", "hooks": [{"type": "command",
                                                       "command": "python3 scripts/bridge.py egress emit --host claude"}]}]}}
    settings_file.write_text(json.dumps(mine))
    out = hooks("install", "--host", "claude", cwd=project, home=home)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("left as it is: not a command hooks install writes") == 2, out.stdout
    assert "added Stop: inbox check" in out.stdout and "added PostToolUse: egress emit" in out.stdout
    settings = json.loads(settings_file.read_text())
    assert mine["hooks"]["Stop"][0] in settings["hooks"]["Stop"] and len(bridge_commands(settings)) == 7
    assert mine["hooks"]["PostToolUse"][0] in settings["hooks"]["PostToolUse"]
    out = hooks("uninstall", "--host", "claude", cwd=project, home=home)
    assert out.returncode == 0 and "removed Stop: inbox check" in out.stdout, out
    assert out.stdout.count("left as it is") == 2 and json.loads(settings_file.read_text()) == mine
    out = hooks("uninstall", "--host", "claude", cwd=project, home=home)
    assert "unchanged" in out.stdout and out.stdout.count("left as it is") == 2


def test_readme_seam_quick_start_runs_as_written(tmp_path, home):
    """The README's seam quick start, run with sh in a fresh repository: the hooks land in
    .claude/settings.json, doctor finds both commands working, drain hands out the intent."""
    repo = make_git_repo(tmp_path / "mine")
    out = subprocess.run(["sh", "-ec", readme_quickstart("quickstart seam")], cwd=repo, capture_output=True,
                         text=True, timeout=300, stdin=subprocess.DEVNULL,
                         env=clean_env(src=str(BRIDGE.parent), HOME=home))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("\nok ") + out.stdout.startswith("ok ") == 2, out.stdout
    drained = json.loads(out.stdout.strip().splitlines()[-1])
    assert (drained["status"], drained["count"], drained["records"][0]["text"]) == ("ok", 1, "hello")
    settings = json.loads((repo / ".claude" / "settings.json").read_text())
    assert len(bridge_commands(settings)) == 7 and (repo / ".gitignore").read_text() == "_bridge/\nscripts/__pycache__/\n"
    assert any(e["session_id"] == "bridge-hooks-doctor" for e in events(repo))


def test_doctor_without_any_hooks_says_so(project, home):
    out = hooks("doctor", cwd=project, home=home)
    assert out.returncode == 1 and "hooks install" in out.stdout


# ---- payload drift: what hosts send changes between versions; the hooks take every form --------

SUBAGENT_INPUT = {"subagent_type": "ensign", "description": "review", "prompt": "SECRET-PROMPT-TEXT"}
DRIFT = {
    # Claude Code renamed its subagent tool from Task to Agent (v2.1.63); both are one PostToolUse
    "Task tool": ("PostToolUse", {"tool_name": "Task", "tool_input": SUBAGENT_INPUT}, "Task"),
    "Agent tool": ("PostToolUse", {"tool_name": "Agent", "tool_input": SUBAGENT_INPUT}, "Agent"),
    # the tool's output under today's name and the older one: never recorded, never a failure
    "tool_response": ("PostToolUse", {"tool_name": "Bash", "tool_response": {"stdout": "OUTPUT-TEXT " * 5000}}, "Bash"),
    "tool_output": ("PostToolUse", {"tool_name": "Bash", "tool_output": "OUTPUT-TEXT " * 5000}, "Bash"),
    # events the seam has no name for (newer hosts add them) are recorded under their own name
    "unknown event": ("PostToolBatch", {"tool_calls": [{"tool_name": "Read"}]}, ""),
    # unknown fields of every JSON type, and known ones of the wrong type, are ignored
    "unknown fields": ("PostToolUse", {"tool_name": "Read", "permission_mode": "plan", "effort": {"level": 3},
                                       "tool_use_id": None, "extra": [1, [2, {"x": True}]], "agent_type": 7}, "Read"),
}


@pytest.mark.parametrize("variant", list(DRIFT))
def test_installed_hooks_accept_payload_drift_without_failing_the_host(project, home, variant):
    assert hooks("install", "--host", "claude", cwd=project, home=home).returncode == 0
    settings = json.loads((project / ".claude" / "settings.json").read_text())
    command = settings["hooks"]["PostToolUse"][0]["hooks"][0]["command"]
    check = settings["hooks"]["Stop"][0]["hooks"][1]["command"]
    event, fields, tool = DRIFT[variant]
    data = dict(fields, session_id="s-drift", cwd=str(project), hook_event_name=event,
                transcript_path="/home/u/.claude/projects/p/s.jsonl")
    result = run_hook(command, project, data, CLAUDE_PROJECT_DIR=project)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), result
    [record] = events(project)
    assert (record["event"], record["detail"]["tool"], record["session_id"]) == (event, tool, "s-drift")
    raw = (project / "_bridge" / "events.jsonl").read_text()
    assert "OUTPUT-TEXT" not in raw and "SECRET-PROMPT-TEXT" not in raw
    result = run_hook(check, project, dict(data, stop_hook_active=False), CLAUDE_PROJECT_DIR=project)
    assert (result.returncode, result.stdout, result.stderr) == (0, "{}\n", ""), result


def test_event_names_an_agent_wrote_reach_the_terminal_inert_and_malformed_tables_are_named(project, home):
    """Settings files are agent-writable, event names included: one holding our command under an
    event named with terminal escapes is spelled out in every line install, uninstall and doctor
    print (their summaries too); a "hooks" that is not an object, or a group whose hooks are not a
    list, is named by doctor (broken, exit 1), never a traceback."""
    assert hooks("install", "--host", "claude", cwd=project, home=home).returncode == 0
    settings_file = project / ".claude" / "settings.json"
    planted = json.loads(settings_file.read_text())
    check = planted["hooks"]["Stop"][0]["hooks"][1]["command"]
    planted["hooks"]["\x1b]0;PWNED\x07\x1b[2J"] = [{"hooks": [{"type": "command", "command": check}]}]
    planted["hooks"]["Stop"].append({"matcher": "mine", "hooks": 5})
    for verb in ("doctor", "install", "uninstall"):
        settings_file.write_text(json.dumps(planted))
        out = hooks(verb, "--host", "claude", cwd=project, home=home)
        assert out.returncode == (1 if verb == "doctor" else 0), (verb, out)
        assert "\x1b" not in out.stdout + out.stderr and "\x07" not in out.stdout, (verb, out.stdout)
        assert "\\x1b]0;PWNED\\x07\\x1b[2J" in out.stdout and "internal error" not in out.stderr, (verb, out)
        assert {"matcher": "mine", "hooks": 5} in json.loads(settings_file.read_text())["hooks"]["Stop"]
    for table in ("[]", "null", '"x"'):
        settings_file.write_text('{"hooks": %s}' % table)
        out = hooks("doctor", cwd=project, home=home)
        assert out.returncode == 1 and "internal error" not in out.stderr, out
        assert 'broken  settings file %s: "hooks" is not a JSON object' % settings_file in out.stdout, out.stdout


def test_uninstall_keeps_a_users_own_empty_group(project, home):
    """Only a group uninstall empties is removed: one the user left empty stays as it was."""
    settings_file = project / ".claude" / "settings.json"
    settings_file.parent.mkdir()
    mine = {"hooks": {"Stop": [{"matcher": "disabled-for-now", "hooks": []}]}}
    settings_file.write_text(json.dumps(mine))
    assert hooks("install", "--host", "claude", cwd=project, home=home).returncode == 0
    assert hooks("uninstall", "--host", "claude", cwd=project, home=home).returncode == 0
    assert json.loads(settings_file.read_text()) == mine


def test_doctor_reads_a_user_settings_file_a_dotfile_manager_links(project, home, tmp_path):
    """~/.claude/settings.json linked by a dotfile manager (stow) is the user's own: doctor checks
    the hooks in the file it points to instead of stopping at the link."""
    assert hooks("install", "--host", "claude", "--scope", "user", cwd=project, home=home).returncode == 0
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    (home / ".claude" / "settings.json").rename(dotfiles / "settings.json")
    (home / ".claude" / "settings.json").symlink_to(dotfiles / "settings.json")
    out = hooks("doctor", "--host", "claude", cwd=project, home=home)
    assert out.returncode == 0 and [l[:2] for l in out.stdout.splitlines()] == ["ok"] * 2, out


def test_doctor_names_an_events_file_an_agent_replaced_with_a_symlink(project, home, tmp_path):
    """_bridge/ is agent-writable: a symlink (or FIFO) planted at events.jsonl makes each egress hook
    broken, named with why (egress emit's own reason), and doctor still checks every hook."""
    for host in ("claude", "codex"):
        assert hooks("install", "--host", host, cwd=project, home=home).returncode == 0
    (tmp_path / "elsewhere").write_text("one\ntwo\n")
    (project / "_bridge").mkdir()
    (project / "_bridge" / "events.jsonl").symlink_to(tmp_path / "elsewhere")
    out = hooks("doctor", cwd=project, home=home)
    assert out.returncode == 1 and "cannot write" not in out.stderr, out
    broken = [line for line in out.stdout.splitlines() if line.startswith("broken")]
    assert len(broken) == 2 and all("wrote nothing to" in l and "symlink" in l for l in broken), out.stdout
    assert "inbox check (Stop)" in out.stdout and (tmp_path / "elsewhere").read_text() == "one\ntwo\n"


def test_install_and_doctor_say_when_scripts_bridge_py_is_missing(tmp_path, home):
    """Installed from the clone before bridge.py was copied in, the hooks run a file that is not
    there: install says so at once, and doctor's broken lines say what to do about it."""
    repo = make_git_repo(tmp_path / "fresh")
    script = repo / "scripts" / "bridge.py"
    out = hooks("install", "--host", "claude", cwd=repo, home=home)
    assert out.returncode == 0 and "%s does not exist: copy bridge.py there" % script in out.stdout, out
    out = hooks("doctor", cwd=repo, home=home)
    broken = [line for line in out.stdout.splitlines() if line.startswith("broken")]
    assert out.returncode == 1 and len(broken) == 2, out.stdout
    assert all("%s does not exist: copy bridge.py there" % script in line for line in broken), out.stdout
    script.parent.mkdir()
    script.write_bytes(BRIDGE.read_bytes())
    out = hooks("install", "--host", "codex", cwd=repo, home=home)
    assert out.returncode == 0 and "does not exist" not in out.stdout, out


def test_doctor_names_a_bridge_py_hook_gone_missing_or_changed(project, home):
    """The Stop check deleted, or an activity hook made synchronous (the agent then waits for it),
    by an agent or by hand: the hooks still there run fine, but doctor says the file is not as
    install writes it, what install would change, and exits 1."""
    assert hooks("install", "--host", "claude", cwd=project, home=home).returncode == 0
    settings_file = project / ".claude" / "settings.json"
    installed = settings_file.read_text()
    settings = json.loads(installed)
    settings["hooks"]["PostToolUse"][0]["hooks"][0]["async"] = False
    settings_file.write_text(json.dumps(settings))
    out = hooks("doctor", "--host", "claude", cwd=project, home=home)
    assert out.returncode == 1 and "updated PostToolUse: egress emit" in out.stdout, out.stdout
    assert "not as hooks install writes them (`bridge.py hooks install --host claude` would change: " in out.stdout
    del settings["hooks"]["Stop"][0]["hooks"][1]
    settings_file.write_text(json.dumps(settings))
    out = hooks("doctor", "--host", "claude", cwd=project, home=home)
    assert out.returncode == 1 and "added Stop: inbox check" in out.stdout, out.stdout
    assert hooks("install", "--host", "claude", cwd=project, home=home).returncode == 0
    assert settings_file.read_text() == installed
    assert hooks("doctor", "--host", "claude", cwd=project, home=home).returncode == 0


def test_doctor_notes_hooks_installed_in_both_scopes(project, home):
    """The same host's hooks in the project's settings and the user's both run: every event would be
    recorded twice. Doctor says so and how to remove one (both still work: exit 0)."""
    for scope in ("project", "user"):
        assert hooks("install", "--host", "codex", "--scope", scope, cwd=project, home=home).returncode == 0
    out = hooks("doctor", "--host", "codex", cwd=project, home=home)
    assert out.returncode == 0, out
    [note] = [line for line in out.stdout.splitlines() if line.startswith("note")]
    assert "recorded twice" in note and "hooks uninstall --host codex --scope user" in note, out.stdout
    assert hooks("uninstall", "--host", "codex", "--scope", "user", cwd=project, home=home).returncode == 0
    out = hooks("doctor", "--host", "codex", cwd=project, home=home)
    assert out.returncode == 0 and "recorded twice" not in out.stdout, out


def test_pi_uninstall_never_deletes_an_edited_extension_without_a_copy(project, home):
    """An older bridge.py's extension updated by install leaves the first backup; an edit made after
    that cannot be backed up again (a backup is never overwritten), so uninstall keeps the file and
    says why instead of deleting the edit."""
    path = project / ".pi" / "extensions" / "bridge.ts"
    path.parent.mkdir(parents=True)
    path.write_text(readme_blocks("ts")[0].replace("queue", "older_queue"))  # an older version
    assert hooks("install", "--host", "pi", cwd=project, home=home).returncode == 0
    backup = path.parent / "bridge.ts.bridge-backup"
    assert "older_queue" in backup.read_text()
    path.write_text(path.read_text() + "// my edit\n")
    out = hooks("uninstall", "--host", "pi", cwd=project, home=home)
    assert out.returncode == 2 and str(backup) in out.stderr, out
    assert path.read_text().endswith("// my edit\n") and "older_queue" in backup.read_text()


def test_install_never_writes_a_number_json_cannot_hold(project, home):
    """1e400 is valid JSON but a float of infinity in Python: written back it would be `Infinity`,
    which no JSON parser (Claude Code's included) reads, so the whole settings file would stop
    loading. Install refuses, naming the file, and changes nothing."""
    settings_file = project / ".claude" / "settings.json"
    settings_file.parent.mkdir()
    settings_file.write_text('{"cleanupPeriodDays": 1e400}')
    out = hooks("install", "--host", "claude", cwd=project, home=home)
    assert out.returncode == 2 and str(settings_file) in out.stderr and "not changed" in out.stderr, out
    assert settings_file.read_text() == '{"cleanupPeriodDays": 1e400}'


def test_doctor_names_a_check_answer_nested_too_deeply(project, home):
    """scripts/bridge.py is in the agent's reach: an inbox check answering 200,000 `[` is a broken
    hook (not a JSON object), not a crash of doctor in the JSON decoder's recursion."""
    assert hooks("install", "--host", "claude", cwd=project, home=home).returncode == 0
    (project / "scripts" / "bridge.py").write_text(
        "import sys\ndef seam_main():\n    sys.stdout.write('[' * 200000)\n    return 0\n")
    out = hooks("doctor", "--host", "claude", "--scope", "project", cwd=project, home=home)
    assert out.returncode == 1 and "internal error" not in out.stderr, out.stderr
    assert "inbox check (Stop): answered '[[[" in out.stdout and "not a JSON object" in out.stdout, out.stdout
