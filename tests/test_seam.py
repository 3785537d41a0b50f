"""The _bridge/ seam (seed 001, issue 6), driven through the CLI on real files.

Re-creates the conformance behaviours of the Go implementation's tests
(reference/seam.md section 8) with fixture payloads of Claude Code, Codex and
Pi, plus the issue-6 decisions: torn lines, terminal-only delivery, root
resolution, id rules, concurrent appenders and hostile input.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (BRIDGE, FIXTURES, PYTHON, clean_env, load_bridge, make_git_repo,
                      process_running, run_bridge, wait_for)

SEAM = FIXTURES / "seam"
SEAM_INDEX = ".seam-index.json"
EVENT_KEYS = ["timestamp", "ts", "host", "event", "session_id", "agent_id", "agent_type",
              "actor_id", "detail"]


# ---- helpers ------------------------------------------------------------------

def payload(name, cwd, **changes):
    text = (SEAM / name).read_text().replace("{cwd}", str(cwd))
    data = json.loads(text)
    data.update(changes)
    return json.dumps(data)


def emit(host, data, cwd=None, env=None, *extra):
    result = run_bridge("egress", "emit", "--host", host, *extra, cwd=cwd, input=data, env=env)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result
    return result


def seam(*args, cwd=None, input=None, env=None):
    """Run a seam verb; return (exit code, parsed JSON answer, stderr)."""
    result = run_bridge(*args, cwd=cwd, input=input, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) <= 1, result.stdout
    return result.returncode, (json.loads(lines[0]) if lines else None), result.stderr


def records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def write_inbox(root, *recs, torn=None):
    bdir = Path(root) / "_bridge"
    bdir.mkdir(exist_ok=True)
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs)
    if torn:
        text += torn
    (bdir / "inbox.jsonl").write_text(text)
    return bdir


def heartbeat(root, slug, session_id, host="claude"):
    bdir = Path(root) / "_bridge"
    bdir.mkdir(exist_ok=True)
    (bdir / ("fo.%s.json" % slug)).write_text(json.dumps(
        {"session_id": session_id, "host": host, "ts": "2026-07-03T12:00:00Z", "state": "idle"}) + "\n")


def files_under(path):
    return sorted(str(p.relative_to(path)) for p in Path(path).rglob("*"))


@pytest.fixture
def repo(git_repo):
    return git_repo


INBOX3 = [
    {"id": "i1", "ts": "2026-07-03T11:00:00Z", "kind": "tell", "text": "do the thing",
     "target_set": ["alpha"]},
    {"id": "i2", "ts": "2026-07-03T11:01:00Z", "kind": "tell", "text": "not yours", "target": "beta"},
    {"id": "i3", "ts": "2026-07-03T11:02:00Z", "kind": "decision", "entity": "e1",
     "field": "status", "value": "approved", "target": "alpha"},
]


# ---- egress emit ---------------------------------------------------------------

def test_emit_claude_event_schema_and_marker(repo):
    emit("claude", payload("claude_post_tool_use_read_ensign.json", repo,
                           timestamp="2026-07-01T01:02:03Z"), cwd=repo)
    (line,) = (repo / "_bridge" / "events.jsonl").read_text().splitlines()
    assert line == ('{"timestamp":"2026-07-01T01:02:03Z","ts":"2026-07-01T01:02:03Z",'
                    '"host":"claude","event":"PostToolUse","session_id":"ses-ensign","agent_id":"",'
                    '"agent_type":"spacedock:ensign","actor_id":"ses-ensign",'
                    '"detail":{"tool":"Read","source":""}}')
    assert "SECRET PROMPT" not in line
    marker = (repo / "_bridge" / "sessions" / "ses-ensign.json").read_text()
    assert marker == ('{"host":"claude","session_id":"ses-ensign","agent_id":"",'
                      '"actor_id":"ses-ensign","entity":"drc-3467","workflow":"linear-drc-review"}\n')


def test_emit_session_start_contract_keys_and_now_time(repo):
    emit("Claude", payload("claude_session_start.json", repo), cwd=repo)
    (rec,) = records(repo / "_bridge" / "events.jsonl")
    assert list(rec) == EVENT_KEYS
    assert rec["host"] == "claude" and rec["event"] == "SessionStart"
    assert rec["actor_id"] == "ses-1" and rec["detail"] == {"tool": "", "source": "startup"}
    assert rec["ts"] == rec["timestamp"] and rec["ts"].endswith("Z") and len(rec["ts"]) == 20
    assert not (repo / "_bridge" / "sessions").exists()


def test_emit_prompt_text_never_recorded(repo):
    emit("claude", payload("claude_user_prompt.json", repo), cwd=repo)
    text = (repo / "_bridge" / "events.jsonl").read_text()
    assert "deploy" not in text and "sk-" not in text


def test_emit_edit_never_creates_marker(repo):
    emit("claude", payload("claude_post_tool_use_edit_ensign.json", repo), cwd=repo)
    assert (repo / "_bridge" / "events.jsonl").exists()
    assert not (repo / "_bridge" / "sessions").exists()


def test_emit_marker_first_write_wins(repo):
    first = payload("claude_post_tool_use_read_ensign.json", repo)
    second = payload("claude_post_tool_use_read_ensign.json", repo, tool_input={
        "file_path": str(repo / "docs/spacedock/other-flow/other-ent/index.md")})
    emit("claude", first, cwd=repo)
    emit("claude", second, cwd=repo)
    marker = json.loads((repo / "_bridge/sessions/ses-ensign.json").read_text())
    assert (marker["workflow"], marker["entity"]) == ("linear-drc-review", "drc-3467")
    assert len(records(repo / "_bridge/events.jsonl")) == 2


def test_emit_archive_paths_and_outside_paths_make_no_marker(repo, tmp_path):
    for path in (repo / "docs/spacedock/wf/_archive/old/index.md", tmp_path / "elsewhere/x.md",
                 "../escape/docs/spacedock/wf/e/index.md"):
        emit("claude", payload("claude_post_tool_use_read_ensign.json", repo,
                               tool_input={"file_path": str(path)}), cwd=repo)
    assert not (repo / "_bridge" / "sessions").exists()


def test_emit_marker_from_readme_state_root(repo):
    wf = repo / "docs" / "dev"
    (wf / ".spacedock-state" / "wire-egress").mkdir(parents=True)
    (wf / "README.md").write_text("---\nstate: .spacedock-state\n---\n# dev\n")
    emit("claude", payload("claude_post_tool_use_read_ensign.json", repo, tool_input={
        "file_path": "docs/dev/.spacedock-state/wire-egress/index.md"}), cwd=repo)
    marker = json.loads((repo / "_bridge/sessions/ses-ensign.json").read_text())
    assert (marker["workflow"], marker["entity"]) == ("dev", "wire-egress")


def test_emit_codex_explicit_entity_path_combines_session_and_agent(repo):
    emit("codex", payload("codex_subagent_entity.json", repo), cwd=repo)
    (rec,) = records(repo / "_bridge/events.jsonl")
    assert rec["actor_id"] == "parent.agent-7" and rec["host"] == "codex"
    marker = json.loads((repo / "_bridge/sessions/parent.agent-7.json").read_text())
    assert marker == {"host": "codex", "session_id": "parent", "agent_id": "agent-7",
                      "actor_id": "parent.agent-7", "entity": "flat-task", "workflow": "dev"}


def test_emit_codex_session_start(repo):
    emit("codex", payload("codex_session_start.json", repo), cwd=repo)
    (rec,) = records(repo / "_bridge/events.jsonl")
    assert (rec["host"], rec["event"], rec["actor_id"]) == ("codex", "SessionStart", "019a-codex-thread")
    assert "gpt-5" not in json.dumps(rec)


@pytest.mark.parametrize("pi_name,canonical", [
    ("session_start", "SessionStart"), ("session_shutdown", "Stop"), ("turn_end", "Stop"),
    ("agent_start", "SubagentStart"), ("agent_end", "SubagentStop"),
    ("turn_start", "UserPromptSubmit"), ("tool_execution_start", "PostToolUse"),
    ("tool_execution_end", "PostToolUse"), ("TOOL_CALL", "PostToolUse"),
    ("tool_result", "PostToolUse"), ("something_new", "something_new")])
def test_emit_pi_lifecycle_names_normalized(repo, pi_name, canonical):
    emit("pi", payload("pi_tool_execution_start.json", repo, event=pi_name), cwd=repo)
    (rec,) = records(repo / "_bridge/events.jsonl")
    assert rec["event"] == canonical and rec["host"] == "pi"


def test_emit_pi_payload_host_and_detail(repo):
    result = run_bridge("egress", "emit", cwd=repo, input=payload("pi_turn_end.json", repo))
    assert result.returncode == 0 and result.stdout == ""
    (rec,) = records(repo / "_bridge/events.jsonl")
    assert (rec["host"], rec["event"], rec["detail"]) == ("pi", "Stop", {"tool": "", "source": "pi"})
    emit("pi", payload("pi_tool_execution_start.json", repo), cwd=repo)
    assert records(repo / "_bridge/events.jsonl")[1]["detail"] == {"tool": "bash", "source": "pi"}


def test_emit_anchors_at_git_root_from_nested_cwd(repo):
    nested = repo / "a" / "b"
    nested.mkdir(parents=True)
    emit("claude", payload("claude_session_start.json", nested), cwd=nested)
    assert (repo / "_bridge/events.jsonl").exists()
    assert not (nested / "_bridge").exists()


def test_emit_anchors_at_worktree_not_main_checkout(repo, tmp_path):
    wt = tmp_path / "wt"
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", str(wt), "-b", "x"], check=True)
    emit("claude", payload("claude_session_start.json", wt), cwd=wt)
    assert (wt / "_bridge/events.jsonl").exists()
    assert not (repo / "_bridge").exists()


def test_emit_falls_back_to_cwd_without_git(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    emit("codex", payload("codex_session_start.json", plain), cwd=plain)
    assert (plain / "_bridge/events.jsonl").exists()


def test_emit_repo_root_flag_wins(repo, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    emit("claude", payload("claude_session_start.json", repo), repo, None, "--repo-root", str(other))
    assert (other / "_bridge/events.jsonl").exists() and not (repo / "_bridge").exists()


@pytest.mark.parametrize("data", [
    "{", "", "[1,2]", "null", "\"text\"", json.dumps({"cwd": "/"}),
    json.dumps({"hook_event_name": "Stop"}), "\xff\xfe not json",
])
def test_emit_malformed_or_incomplete_payload_is_silent_noop(repo, data):
    emit("claude" if "Stop" not in data else "", data, cwd=repo)
    assert not (repo / "_bridge").exists()


def test_emit_debug_says_why_on_stderr(repo):
    result = run_bridge("egress", "emit", "--host", "claude", cwd=repo, input="{",
                        env=clean_env(BRIDGE_DEBUG="1"))
    assert result.returncode == 0 and result.stdout == ""
    assert "payload is not JSON" in result.stderr


def test_emit_wrong_types_and_unsafe_ids(repo):
    data = payload("claude_post_tool_use_read_ensign.json", repo, session_id="bad/id",
                   tool_name=["Read"], detail="not an object", agent_type=7)
    emit("claude", data, cwd=repo)
    (rec,) = records(repo / "_bridge/events.jsonl")
    assert rec["actor_id"] == "" and rec["session_id"] == "bad/id" and rec["agent_type"] == ""
    assert rec["detail"] == {"tool": "", "source": ""}
    assert not (repo / "_bridge/sessions").exists()
    emit("codex", payload("codex_subagent_entity.json", repo, session_id="..", agent_id="-x"), cwd=repo)
    assert records(repo / "_bridge/events.jsonl")[1]["actor_id"] == "-x"
    emit("codex", payload("codex_subagent_entity.json", repo, actor_id="../../etc"), cwd=repo)
    assert records(repo / "_bridge/events.jsonl")[2]["actor_id"] == ""
    assert files_under(repo / "_bridge/sessions") == ["-x.json"]


def test_emit_go_escaping_and_utf8(repo):
    emit("claude", payload("claude_session_start.json", repo, source="a<b>&c \u00e9\u2028"), cwd=repo)
    raw = (repo / "_bridge/events.jsonl").read_bytes()
    assert b'"source":"a\\u003cb\\u003e\\u0026c \xc3\xa9\\u2028"' in raw


def test_emit_huge_payload(repo):
    emit("claude", payload("claude_session_start.json", repo, tool_response="x" * (3 << 20)), cwd=repo)
    assert len((repo / "_bridge/events.jsonl").read_bytes()) < 400


def test_emit_trims_events_to_last_1000(repo):
    bdir = repo / "_bridge"
    bdir.mkdir()
    (bdir / "events.jsonl").write_text("".join('{"n":%d}\n' % i for i in range(2000)))
    emit("claude", payload("claude_session_start.json", repo, ts="LAST"), cwd=repo)
    lines = (bdir / "events.jsonl").read_text().splitlines()
    assert len(lines) == 2001 - 1001 and lines[0] == '{"n":1001}' and json.loads(lines[-1])["ts"] == "LAST"
    assert [p.name for p in bdir.iterdir()] == ["events.jsonl"]  # no temp file left


def test_emit_refuses_symlinked_events_file(repo, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    bdir = repo / "_bridge"
    bdir.mkdir()
    (bdir / "events.jsonl").symlink_to(outside)
    emit("claude", payload("claude_session_start.json", repo), cwd=repo)
    assert outside.read_text() == "precious\n"


def test_emit_refuses_symlinked_sessions_dir(repo, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (repo / "_bridge").mkdir()
    (repo / "_bridge" / "sessions").symlink_to(outside)
    emit("claude", payload("claude_post_tool_use_read_ensign.json", repo), cwd=repo)
    assert list(outside.iterdir()) == []


FLIP_SESSIONS = """
import itertools, os, sys
bdir, outside = sys.argv[1], sys.argv[2]
sessions = os.path.join(bdir, "sessions")
for n in itertools.count():  # move the folder away, link it elsewhere, unlink (a hook remakes it)
    for step in (lambda: os.rename(sessions, os.path.join(bdir, "old.%d" % n)),
                 lambda: os.symlink(outside, sessions),
                 lambda: os.path.islink(sessions) and os.unlink(sessions)):
        try:
            step()
        except OSError:
            pass
"""


def has_open(pid, path):
    """True when process `pid` has `path` open (a lock file it is taking, say)."""
    fds = "/proc/%d/fd" % pid
    for fd in os.listdir(fds) if os.path.isdir(fds) else ():
        try:
            if os.readlink(os.path.join(fds, fd)) == str(path):
                return True
        except OSError:
            pass
    return False


def test_marker_is_never_written_through_a_sessions_folder_swapped_for_a_symlink(repo, tmp_path):
    """An agent may swap _bridge/sessions for a symlink to elsewhere between any two steps of a
    hook (a check for a link, then a write, is a race it can win): whatever the timing, no
    marker, temporary file or link ever lands outside, and markers still get written."""
    bridge = load_bridge()
    bdir, outside = repo / "_bridge", tmp_path / "outside"
    (bdir / "sessions").mkdir(parents=True)
    outside.mkdir()
    flipper = subprocess.Popen([PYTHON, "-c", FLIP_SESSIONS, str(bdir), str(outside)])
    said = {}
    try:
        for n in range(4000):
            answer = bridge.write_marker(str(bdir), {"actor_id": "race-%d" % n, "host": "claude"})
            said[answer.split(":")[0]] = said.get(answer.split(":")[0], 0) + 1
            if list(outside.iterdir()):
                break
    finally:
        flipper.kill()
        flipper.wait()
    assert list(outside.iterdir()) == [], (n, said)
    assert said.get("marker written"), said
    # a symlink (here dangling) at the marker's own name is never written through either
    if (bdir / "sessions").is_symlink():
        (bdir / "sessions").unlink()
    (bdir / "sessions").mkdir(exist_ok=True)
    (bdir / "sessions" / "last.json").symlink_to(outside / "planted.json")
    assert bridge.write_marker(str(bdir), {"actor_id": "last"}) == "marker exists (first write wins)"
    assert list(outside.iterdir()) == []


def test_emit_bridge_dir_is_a_file(repo):
    (repo / "_bridge").write_text("not a dir")
    emit("claude", payload("claude_session_start.json", repo), cwd=repo)
    assert (repo / "_bridge").read_text() == "not a dir"


def test_concurrent_emitters_lose_nothing(repo):
    """Many hook processes at once, across a trim: every line intact, none lost but by policy."""
    bdir = repo / "_bridge"
    bdir.mkdir()
    (bdir / "events.jsonl").write_text("".join('{"pre":%d}\n' % i for i in range(1990)))
    procs = []
    for n in range(40):
        data = payload("codex_session_start.json", repo, session_id="s%d" % n)
        procs.append(subprocess.Popen(
            [PYTHON, str(BRIDGE), "egress", "emit", "--host", "codex"], cwd=repo, env=clean_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        procs[-1].stdin.write(data.encode())
        procs[-1].stdin.close()
    for proc in procs:
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read() == b"" and proc.stderr.read() == b""
    recs = records(bdir / "events.jsonl")  # every line parses: none interleaved
    sessions = sorted(r["session_id"] for r in recs if "session_id" in r)
    assert sessions == sorted("s%d" % n for n in range(40))
    assert 1000 <= len(recs) <= 2000


# ---- inbox drain / ack / commit ---------------------------------------------------

def test_drain_returns_addressed_records_and_stamps_heartbeat(repo):
    bdir = write_inbox(repo, *INBOX3)
    code, out, _ = seam("inbox", "drain", "--host", "claude", "--slug", "alpha",
                        "--session-id", "sess-1", cwd=repo)
    assert code == 0
    assert list(out) == ["status", "slug", "host", "cursor", "high_water", "count", "heartbeat", "records"]
    assert (out["status"], out["cursor"], out["high_water"], out["count"]) == ("ok", 0, 3, 2)
    assert out["records"][0] == {"line": 1, "id": "i1", "ts": "2026-07-03T11:00:00Z", "kind": "tell",
                                 "text": "do the thing", "target_set": ["alpha"]}
    assert out["records"][1] == {"line": 3, "id": "i3", "ts": "2026-07-03T11:02:00Z",
                                 "kind": "decision", "target": "alpha", "entity": "e1",
                                 "field": "status", "value": "approved"}
    beat = json.loads((bdir / "fo.alpha.json").read_text())
    assert list(beat) == ["session_id", "host", "ts", "state"]
    assert (beat["session_id"], beat["host"], beat["state"]) == ("sess-1", "claude", "idle")
    assert not (bdir / ".inbox-cursor.alpha").exists()


def test_drain_emits_one_acting_ack_per_record_once(repo):
    bdir = write_inbox(repo, *INBOX3)
    for _ in range(2):
        seam("inbox", "drain", "--slug", "alpha", "--host", "codex", "--session-id", "th-1", cwd=repo)
    acks = records(bdir / "fo-replies.jsonl")
    assert [(a["in_reply_to_line"], a["status"], a["kind"]) for a in acks] == [
        (1, "acting", "reply"), (3, "acting", "decision-ack")]
    assert list(acks[0]) == ["schema", "ts", "kind", "target", "in_reply_to_id", "in_reply_to_line",
                             "in_reply_to_ts", "intent_kind", "status", "session_id", "host"]
    assert acks[0]["in_reply_to_ts"] == "2026-07-03T11:00:00Z"


def test_drain_preserves_raw_timestamp(repo):
    write_inbox(repo, {"id": "i1", "ts": "2026-07-03T19:00:00.500+08:00", "kind": "tell",
                       "text": "x", "target": "alpha"})
    _, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert out["records"][0]["ts"] == "2026-07-03T19:00:00.500+08:00"


def test_acting_is_not_delivery_but_terminal_ack_is(repo):
    write_inbox(repo, *INBOX3)
    seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    _, again, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert again["count"] == 2  # crashed between drain and ack: delivered again
    code, ack, _ = seam("inbox", "ack", "--slug", "alpha", "--line", "3", "--id", "i3", "--kind",
                        "decision", "--status", "applied", cwd=repo)
    assert code == 0 and ack == {"appended": True, "kind": "decision-ack", "target": "alpha", "line": 3}
    _, after, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert [r["line"] for r in after["records"]] == [1]


def test_drain_respects_cursor(repo):
    bdir = write_inbox(repo, *INBOX3)
    (bdir / ".inbox-cursor.alpha").write_text("1\n")
    _, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert out["cursor"] == 1 and [r["line"] for r in out["records"]] == [3]


def test_drain_adopts_legacy_cursor(repo):
    bdir = write_inbox(repo, *INBOX3)
    (bdir / ".inbox-cursor").write_text("2\n")
    _, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert out["cursor"] == 2 and (bdir / ".inbox-cursor.alpha").read_text() == "2\n"


def test_drain_no_inbox_still_heartbeats(repo):
    code, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert code == 0 and out["status"] == "no-inbox" and out["records"] == [] and out["heartbeat"]
    assert (repo / "_bridge/fo.alpha.json").exists()


@pytest.mark.parametrize("slug", ["../escape", "", "..", "a/b", "."])
def test_drain_invalid_slug_rejected(repo, slug):
    code, out, _ = seam("inbox", "drain", "--slug", slug, cwd=repo)
    assert code == 2 and out["status"] == "failed" and out["records"] is None
    assert out["error"] == "invalid or missing --slug"
    assert not (repo / "_bridge").exists() and not (repo.parent / "escape").exists()


def test_torn_last_line_not_counted_or_delivered(repo):
    bdir = write_inbox(repo, INBOX3[0], torn='{"id":"i9","ts":"2026-07-03T11:09:00Z","kind":"tell","tar')
    _, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert out["high_water"] == 1 and [r["line"] for r in out["records"]] == [1]
    code, out, _ = seam("inbox", "commit", "--slug", "alpha", "--cursor", "2", cwd=repo)
    assert code == 1 and "past the inbox" in out["error"]
    with open(bdir / "inbox.jsonl", "a") as handle:
        handle.write('get":"alpha"}\n')
    _, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert out["high_water"] == 2 and [r["id"] for r in out["records"]] == ["i1", "i9"]


def test_malformed_lines_consume_numbers_and_are_skipped(repo):
    write_inbox(repo, "not json", "", {"id": "x", "ts": "yesterday", "kind": "tell", "target": "alpha"},
                {"id": "y", "ts": "2026-07-03T11:00:00Z", "kind": "tell", "granted": "yes", "target": "alpha"},
                {"id": "z", "ts": "2026-07-03T11:00:00Z", "kind": "tell", "target_set": "alpha"},
                {"id": "ok", "ts": "2026-07-03T11:00:00Z", "kind": "tell", "target": "alpha",
                 "text": "x" * (2 << 20)})
    _, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert out["high_water"] == 6 and [(r["line"], r["id"]) for r in out["records"]] == [(6, "ok")]


ROUTES = [
    # (record routing fields, members flag, slugs that receive it)
    ({"target_set": ["alpha"], "target": "all"}, None, {"alpha"}),
    ({"target_set": ["beta", "alpha", "alpha"]}, None, {"alpha", "beta"}),
    ({"target_set": [], "target": "beta"}, None, {"beta"}),
    ({"target_set": ["../x", "a b"]}, None, set()),
    ({"target": "all"}, None, {"alpha", "beta", "gamma"}),
    ({}, None, {"alpha", "beta", "gamma"}),
    ({"target": " "}, "alpha,gamma", {"alpha", "gamma"}),
    ({"target": " beta "}, None, {"beta"}),
    ({"target": "delta"}, None, set()),
]


@pytest.mark.parametrize("fields,members,expected", ROUTES)
def test_routing_truth_table(repo, fields, members, expected):
    rec = {"id": "r1", "ts": "2026-07-03T11:00:00Z", "kind": "tell", "text": "hi"}
    rec.update(fields)
    write_inbox(repo, rec)
    got = set()
    for slug in ("alpha", "beta", "gamma"):
        args = ["inbox", "drain", "--slug", slug] + (["--members", members] if members else [])
        _, out, _ = seam(*args, cwd=repo)
        if out["count"]:
            got.add(slug)
    # (a legacy broadcast reaches each draining slug: --members defaults to the slug itself)
    assert got == expected


def test_ack_is_compact_single_line_and_maps_kind(repo):
    write_inbox(repo,
                {"id": "t", "ts": "2026-07-02T11:58:00Z", "kind": "tell", "target": "a"},
                {"id": "c", "ts": "2026-07-02T11:58:00Z", "kind": "conn", "granted": True, "target": "a"},
                {"id": "d", "ts": "2026-07-02T11:58:00Z", "kind": "decision", "target": "a"},
                {"id": "p", "ts": "2026-07-02T11:58:00Z", "kind": "permission-decision", "target": "a"})
    kinds = []
    for line, (rid, kind, status) in enumerate([("t", "tell", "answered"), ("c", "conn", "accepted"),
                                                ("d", "decision", "applied"),
                                                ("p", "permission-decision", "denied")], 1):
        extra = ["--granted"] if kind == "conn" else []
        code, out, _ = seam("inbox", "ack", "--slug", "a", "--line", str(line), "--id", rid, "--ts",
                            "2026-07-02T11:58:00Z", "--kind", kind, "--status", status,
                            "--text", "line one\nline\ttwo\r", *extra, cwd=repo,
                            env=clean_env(CLAUDE_CODE_SESSION_ID="cc-1"))
        assert code == 0, out
        kinds.append(out["kind"])
    assert kinds == ["reply", "conn-ack", "decision-ack", "permission-ack"]
    raw = (repo / "_bridge/fo-replies.jsonl").read_text().splitlines()
    assert len(raw) == 4 and all(": " not in line for line in raw)
    first = json.loads(raw[0])
    assert list(first) == ["schema", "ts", "kind", "target", "in_reply_to_id", "in_reply_to_line",
                           "in_reply_to_ts", "intent_kind", "status", "text"]
    assert first["text"] == "line one line\ttwo" and "granted" not in first
    assert json.loads(raw[1])["granted"] is True


def test_ack_session_env_and_host(repo):
    write_inbox(repo, INBOX3[0])
    seam("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", "i1", "--kind", "tell",
         "--status", "answered", "--host", " Codex ", cwd=repo,
         env=clean_env(CODEX_THREAD_ID="thread-9", CLAUDE_CODE_SESSION_ID="nope"))
    (rec,) = records(repo / "_bridge/fo-replies.jsonl")
    assert (rec["session_id"], rec["host"]) == ("thread-9", "codex")


@pytest.mark.parametrize("args,error", [
    ([], "invalid or missing --slug"),
    (["--slug", "alpha", "--line", "0"], "--line must be a positive integer"),
    (["--slug", "alpha", "--line", "1", "--kind", "poke"], "unknown --kind"),
    (["--slug", "alpha", "--line", "1", "--kind", "tell"], "--status is required"),
    (["--slug", "alpha", "--line", "1", "--kind", "tell", "--status", "answered"],
     "ack has no correlator"),
    (["--slug", "alpha", "--line", "1", "--kind", "tell", "--status", "answered", "--id", "zz"],
     "does not match inbox line 1"),
    (["--slug", "alpha", "--line", "1", "--kind", "decision", "--status", "applied", "--id", "i1"],
     "--kind decision does not match"),
    (["--slug", "alpha", "--line", "7", "--kind", "tell", "--status", "answered", "--id", "i1"],
     "does not exist"),
    (["--slug", "alpha", "--line", "1", "--kind", "tell", "--status", "answered", "--ts", "noon"],
     "not an RFC 3339 time"),
    (["--slug", "alpha", "--line", "1", "--kind", "tell", "--status", "answered", "--id", "i1",
      "--session-id", "-rf"], "--session-id may not start with -"),
    (["--slug", "alpha", "--bogus", "1"], "unknown flag: --bogus"),
])
def test_ack_guards_write_nothing(repo, args, error):
    write_inbox(repo, *INBOX3)
    code, out, _ = seam("inbox", "ack", *args, cwd=repo)
    assert code in (1, 2) and out["appended"] is False and error in out["error"], out
    assert not (repo / "_bridge/fo-replies.jsonl").exists()


def test_ack_id_only_is_correlatable(repo):
    write_inbox(repo, *INBOX3)
    code, _, _ = seam("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", "i1", "--kind", "tell",
                      "--status", "answered", cwd=repo)
    (rec,) = records(repo / "_bridge/fo-replies.jsonl")
    assert code == 0 and "in_reply_to_ts" not in rec and rec["in_reply_to_id"] == "i1"


def test_ack_ts_only_dedups_id_less_record(repo):
    write_inbox(repo, {"ts": "2026-07-03T19:00:00.10+08:00", "kind": "tell", "target": "alpha"})
    code, _, _ = seam("inbox", "ack", "--slug", "alpha", "--line", "1", "--ts",
                      "2026-07-03T19:00:00.1+08:00", "--kind", "tell", "--status", "answered", cwd=repo)
    assert code == 0
    _, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert out["count"] == 0


def test_go_flag_grammar_first_wins_and_equals(repo):
    write_inbox(repo, *INBOX3)
    code, out, _ = seam("inbox", "ack", "--slug=alpha", "--slug", "beta", "--line=1", "--id", "i1",
                        "--kind", "tell", "--status", "answered", "--granted=FALSE", cwd=repo)
    assert code == 0 and out["target"] == "alpha"
    assert records(repo / "_bridge/fo-replies.jsonl")[0]["granted"] is False


@pytest.mark.parametrize("argv", [
    ("inbox", "drain"), ("inbox", "commit", "--cursor", "1"), ("inbox", "ack", "--line", "1"),
    ("inbox", "commit", "--slug", "alpha", "--cursor", "abc"), ("inbox", "commit", "--slug", "alpha"),
    ("inbox", "ack", "--slug", "alpha", "--line", "x", "--kind", "tell", "--status", "answered"),
])
def test_a_missing_flag_or_malformed_value_is_a_usage_error(repo, argv):
    """Exit 2 (usage), as for an unknown flag, with the JSON answer naming the flag;
    exit 1 stays for a verb that failed."""
    bdir = write_inbox(repo, *INBOX3)
    code, out, _ = seam(*argv, cwd=repo)
    assert code == 2 and "--" in out["error"], out
    assert not (bdir / ".inbox-cursor.alpha").exists() and not (bdir / "fo-replies.jsonl").exists()
    code, out, _ = seam("inbox", "ack", "--slug", "alpha", "--line", "9", "--id", "i9", "--kind",
                        "tell", "--status", "answered", cwd=repo)
    assert code == 1 and "does not exist" in out["error"]


def test_commit_advances_monotonically(repo):
    bdir = write_inbox(repo, *(INBOX3 + INBOX3))
    assert seam("inbox", "commit", "--slug", "alpha", "--cursor", "5", cwd=repo)[1] == {"cursor": 5}
    assert seam("inbox", "commit", "--slug", "alpha", "--cursor", "2", cwd=repo)[1] == {"cursor": 5}
    assert (bdir / ".inbox-cursor.alpha").read_text() == "5\n"
    code, out, _ = seam("inbox", "commit", "--slug", "alpha", "--cursor", "x", cwd=repo)
    assert code == 2 and out == {"cursor": 5, "error": "--cursor must be a line count, got 'x'"}
    code, out, _ = seam("inbox", "commit", "--slug", "alpha", cwd=repo)
    assert code == 2 and out == {"cursor": 5, "error": "negative --cursor"}  # Go's words
    code, out, _ = seam("inbox", "commit", "--slug", "alpha", "--cursor", cwd=repo)
    assert code == 2 and out["error"] == "missing value for --cursor"


def test_commit_concurrent_committers_keep_the_maximum(repo):
    bdir = write_inbox(repo, *([INBOX3[0]] * 30))
    procs = [subprocess.Popen([PYTHON, str(BRIDGE), "inbox", "commit", "--slug", "alpha",
                               "--cursor", str(n)], cwd=repo, env=clean_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for n in range(1, 31)]
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    assert (bdir / ".inbox-cursor.alpha").read_text() == "30\n"


def test_full_first_officer_loop(repo):
    """drain -> act -> ack -> commit, then nothing is pending and check lets Claude stop."""
    write_inbox(repo, *INBOX3)
    heartbeat(repo, "alpha", "sess-1")
    _, out, _ = seam("inbox", "drain", "--slug", "alpha", "--host", "claude", "--session-id", "sess-1",
                     cwd=repo)
    for rec in out["records"]:
        code, _, _ = seam("inbox", "ack", "--slug", "alpha", "--line", str(rec["line"]), "--id",
                          rec["id"], "--ts", rec["ts"], "--kind", rec["kind"], "--status",
                          "answered" if rec["kind"] == "tell" else "applied", cwd=repo)
        assert code == 0
    assert seam("inbox", "commit", "--slug", "alpha", "--cursor", str(out["high_water"]),
                cwd=repo)[1] == {"cursor": 3}
    assert seam("inbox", "drain", "--slug", "alpha", cwd=repo)[1]["count"] == 0
    stop = payload("claude_stop.json", repo)
    assert seam("inbox", "check", "--host", "claude", cwd=repo, input=stop)[1] == {}


# ---- inbox check (the Claude Stop hook) ---------------------------------------------

def test_check_blocks_when_intent_queued_for_session(repo, tmp_path):
    write_inbox(repo, *INBOX3)
    heartbeat(repo, "alpha", "sess-1")
    heartbeat(repo, "beta", "someone-else")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, out, err = seam("inbox", "check", "--host", "claude", cwd=elsewhere,
                          input=payload("claude_stop.json", repo))
    assert code == 0 and err == "" and out["decision"] == "block"
    assert out["reason"].startswith("Bridge has 2 queued captain-intent records in "
                                    "_bridge/inbox.jsonl for workflow(s): alpha.")
    assert "inbox drain --host claude --slug alpha" in out["reason"]


def test_check_singular_and_marker_session(repo):
    write_inbox(repo, INBOX3[1])
    (repo / "_bridge/sessions").mkdir()
    (repo / "_bridge/sessions/x.json").write_text(json.dumps(
        {"host": "claude", "session_id": "sess-1", "agent_id": "", "actor_id": "x",
         "entity": "e", "workflow": "beta"}))
    _, out, _ = seam("inbox", "check", cwd=repo, input=payload("claude_stop.json", repo))
    assert "1 queued captain-intent record in" in out["reason"] and "workflow(s): beta." in out["reason"]


@pytest.mark.parametrize("case", ["stop_hook_active", "unknown_session", "no_session_in_heartbeat",
                                  "nothing_pending", "no_inbox", "garbage", "unsafe_session"])
def test_check_lets_claude_stop(repo, case):
    write_inbox(repo, *INBOX3)
    heartbeat(repo, "alpha", "" if case == "no_session_in_heartbeat" else "sess-1")
    data = payload("claude_stop.json", repo)
    if case == "stop_hook_active":
        data = payload("claude_stop.json", repo, stop_hook_active=True)
    elif case == "unknown_session":
        data = payload("claude_stop.json", repo, session_id="other")
    elif case == "nothing_pending":
        (repo / "_bridge/.inbox-cursor.alpha").write_text("3\n")
    elif case == "no_inbox":
        (repo / "_bridge/inbox.jsonl").unlink()
    elif case == "garbage":
        data = "\x00{{{ not json"
    elif case == "unsafe_session":
        heartbeat(repo, "alpha", "../x")
        data = payload("claude_stop.json", repo, session_id="../x")
    code, out, err = seam("inbox", "check", "--host", "claude", cwd=repo, input=data)
    assert (code, out, err) == (0, {}, "")


def test_check_explicit_slug_and_session_flags(repo):
    write_inbox(repo, *INBOX3)
    _, out, _ = seam("inbox", "check", "--slug", "beta", "--repo-root", str(repo), input="{}")
    assert out["decision"] == "block" and "workflow(s): beta." in out["reason"]
    _, out, _ = seam("inbox", "check", "--slug", "../beta", "--repo-root", str(repo), input="{}")
    assert out == {}


# ---- initiate / alert / feed ------------------------------------------------------

def test_initiate_writes_gate_record(repo):
    code, out, err = seam("initiate", "--kind", "gate-review", "--id", "gate-ship-a-ideation",
                          "--headline", "ship-a ideation\nready\tfor a call", "--workflow", "prq",
                          "--entity", "ship-a", "--ship-id", "prq/ship-a", "--host", "Claude",
                          "--session-id", "s1", "--body", "chosen: <reuse> & go", cwd=repo)
    assert (code, err) == (0, "")
    assert out == {"id": "gate-ship-a-ideation", "request_id": "gate-ship-a-ideation", "queued": True}
    raw = (repo / "_bridge/fo-initiate.jsonl").read_text()
    rec = json.loads(raw)
    assert list(rec) == ["schema", "id", "ts", "kind", "workflow", "entity", "ship_id", "host",
                         "session_id", "headline", "body", "request_id", "status"]
    assert rec["headline"] == "ship-a ideation ready for a call" and rec["status"] == "open"
    assert rec["host"] == "claude" and "\\u003creuse\\u003e \\u0026 go" in raw


def test_initiate_request_id_only_defaults_for_gates(repo):
    _, out, _ = seam("initiate", "--kind", "status", "--id", "st-1", "--headline", "h", cwd=repo)
    assert out == {"id": "st-1", "request_id": "", "queued": True}
    assert "request_id" not in records(repo / "_bridge/fo-initiate.jsonl")[0]


@pytest.mark.parametrize("args,error", [
    (["--kind", "status", "--headline", "h"], "initiation: id is required"),
    (["--kind", "poke", "--id", "x", "--headline", "h"], "initiation: kind must be one of"),
    (["--kind", "status", "--id", "x", "--headline", " \n\t"], "initiation: headline is required"),
    (["--kind", "status", "--id", "../x", "--headline", "h"], "must match"),
    (["--kind", "--id", "x"], "missing value for --kind"),
    (["--kind", "status", "--nope", "x"], "unknown flag: --nope"),
    (["stray"], "unexpected positional argument: stray"),
])
def test_initiate_errors_are_non_blocking(repo, args, error):
    code, out, err = seam("initiate", *args, cwd=repo)
    assert (code, err) == (0, "") and out["queued"] is False and error in out["error"]
    assert not (repo / "_bridge/fo-initiate.jsonl").exists()


def test_initiate_body_bounded(repo):
    seam("initiate", "--kind", "reco", "--id", "r", "--headline", "h" * 500, "--body",
         "\u00e9" * 3000, cwd=repo)
    rec = records(repo / "_bridge/fo-initiate.jsonl")[0]
    assert len(rec["headline"].encode()) == 240 and 2000 <= len(rec["body"].encode()) <= 2003


def test_initiate_trim_keeps_open_undecided_gates(repo):
    bdir = repo / "_bridge"
    bdir.mkdir()
    lines = [{"schema": 1, "id": "gate-open", "ts": "2026-07-01T00:00:00Z", "kind": "gate-review",
              "headline": "h", "request_id": "gate-open", "status": "open"},
             {"schema": 1, "id": "gate-decided", "ts": "2026-07-01T00:00:00Z", "kind": "gate-review",
              "headline": "h", "request_id": "req-d", "status": "open"},
             {"schema": 1, "id": "gate-closed", "ts": "2026-07-01T00:00:00Z", "kind": "gate-review",
              "headline": "h", "status": "resolved"}]
    lines += [{"schema": 1, "id": "s%d" % i, "ts": "2026-07-01T00:00:00Z", "kind": "status",
               "headline": "h", "status": "open"} for i in range(1997)]
    (bdir / "fo-initiate.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    write_inbox(repo, {"id": "d1", "ts": "2026-07-02T00:00:00Z", "kind": "decision",
                       "request_id": "req-d", "verdict": "approve", "target": "a"})
    seam("initiate", "--kind", "status", "--id", "last", "--headline", "h", cwd=repo)
    ids = [r["id"] for r in records(bdir / "fo-initiate.jsonl")]
    assert ids[0] == "gate-open" and len(ids) == 1001 and ids[-1] == "last"
    assert "gate-decided" not in ids and "gate-closed" not in ids


def test_alert_permission_writes_alert(repo):
    code, out, err = seam("alert", "permission", "--id", "perm-1", "--workflow", "prq", "--entity",
                          "ship-1", "--host", "codex", "--session-id", "s1", "--reason",
                          "sandbox blocked state gitdir", "--command", "git status",
                          "--prefix-rule", "git, -C,,", cwd=repo)
    assert (code, err) == (0, "") and out == {"id": "perm-1", "request_id": "perm-1", "queued": True}
    raw = (repo / "_bridge/fo-alerts.jsonl").read_text()
    assert raw.endswith('"reason":"sandbox blocked state gitdir","command":"git status",'
                        '"prefix_rule":["git","-C"],"status":"open"}\n')
    assert raw.startswith('{"schema":1,"id":"perm-1","ts":"')
    assert '"kind":"permission-request","severity":"blocked","workflow":"prq"' in raw


def test_alert_default_id_and_redaction(repo):
    _, out, _ = seam("alert", "permission", "--reason", "needs creds", "--command",
                     "TOKEN=sk-abcdefghijklmnop1234 deploy", cwd=repo)
    assert out["id"].startswith("perm_") and len(out["id"]) == 37
    assert "abcdefghijklmnop1234" not in (repo / "_bridge/fo-alerts.jsonl").read_text()


def test_alert_missing_reason_and_unwritable_are_non_blocking(repo):
    code, out, err = seam("alert", "permission", "--reason", cwd=repo)
    assert (code, err, out["queued"]) == (0, "", False) and "missing value" in out["error"]
    (repo / "_bridge").write_text("a file")
    code, out, err = seam("alert", "permission", "--reason", "r", cwd=repo)
    assert (code, err, out["queued"]) == (0, "", False) and "not a directory" in out["error"]


def test_feed_appends_narration(repo):
    code, out, _ = seam("feed", "--verb", "dispatch", "--entity", "ship-a", "--workflow", "alpha",
                        "--stage", "ideation", "--text", 'sent "ensign" to ideation', cwd=repo)
    assert code == 0 and out == {"appended": True, "verb": "dispatch"}
    (rec,) = records(repo / "_bridge/fo-feed.jsonl")
    assert list(rec) == ["ts", "verb", "entity", "workflow", "stage", "text"]
    code, out, _ = seam("feed", "--verb", "gossip", "--text", "x", cwd=repo)
    assert out["appended"] is False and "--verb" in out["error"]


# ---- wake --host codex ------------------------------------------------------------

def wake_env(tmp_path, mode="ok"):
    log = tmp_path / "codex.log"
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)  # where the prompt files go (and must not stay)
    return clean_env(FAKE_CODEX_MODE=mode, FAKE_CODEX_LOG=log, TMPDIR=tmp), log


def resumes_logged(log, count, timeout=30):
    """The fake codex's log once `count` resumes have written their entry: wake starts them
    and does not wait, so they write after it answers."""
    deadline = time.monotonic() + timeout
    while True:
        text = log.read_text() if log.exists() else ""
        if text.count("\n--\n") >= count or time.monotonic() > deadline:
            assert text.count("\n--\n") == count, text
            return text
        time.sleep(0.05)


def resume_pids(text, session=None):
    """Pids of the logged resumes in log order, or only those of `session`'s resumes (two
    resumes started at once may log in either order)."""
    pids, argv = [], ""
    for line in text.splitlines():
        if line.startswith("argv: "):
            argv = line
        elif line.startswith("pid: ") and (session is None or argv.split()[3:4] == [session]):
            pids.append(int(line.split()[1]))
    return pids


@pytest.fixture
def stop_resumes():
    """Kill the (hanging) stand-ins a test started, each in its own session."""
    logs = []
    yield logs.append
    for log in logs:
        for pid in resume_pids(log.read_text() if log.exists() else ""):
            try:
                os.killpg(pid, 9)
            except OSError:
                pass


def test_wake_resumes_heartbeat_session_without_moving_cursor(repo, tmp_path):
    bdir = write_inbox(repo, {"id": "w1", "ts": "2026-07-02T11:00:00Z", "kind": "tell", "target": "all"},
                       {"id": "w2", "ts": "2026-07-02T11:01:00Z", "kind": "tell", "target_set": ["b"]})
    heartbeat(repo, "a", "session-a", "codex")
    heartbeat(repo, "b", "session-a", "codex")
    env, log = wake_env(tmp_path)
    code, out, _ = seam("wake", "--host", "codex", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert code == 0 and out == {"status": "woke", "lines": [1, 2], "sessions": 1, "targets": ["a", "b"],
                                 "message": "resumed Codex FO session"}
    text = resumes_logged(log, 1)
    assert text.count("argv: exec resume session-a -") == 1
    assert "Pending physical inbox lines for this session: 1,2" in text
    assert "Addressed workflow slugs: a,b" in text and str(bdir / "inbox.jsonl") in text
    assert not list(bdir.glob(".inbox-cursor*")) and not (bdir / ".wake-cursor.codex").exists()
    event = records(bdir / "wake-events.jsonl")[-1]
    assert list(event)[:8] == ["timestamp", "ts", "host", "event", "status", "lines", "targets", "session_id"]
    assert (event["status"], event["targets"], event["session_id"]) == ("woke", ["a", "b"], "session-a")


def test_wake_noop_when_delivered_by_cursor_or_terminal_ack(repo, tmp_path):
    bdir = write_inbox(repo, *INBOX3)
    heartbeat(repo, "alpha", "th-1", "codex")
    heartbeat(repo, "beta", "th-2", "codex")
    (bdir / ".inbox-cursor.beta").write_text("3\n")
    env, log = wake_env(tmp_path)
    seam("inbox", "drain", "--slug", "alpha", "--session-id", "th-1", cwd=repo)  # acting acks only
    code, out, _ = seam("wake", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert out["status"] == "woke" and out["targets"] == ["alpha"] and out["lines"] == [1, 3]
    for line, rid, kind in ((1, "i1", "tell"), (3, "i3", "decision")):
        seam("inbox", "ack", "--slug", "alpha", "--line", str(line), "--id", rid, "--kind", kind,
             "--status", "blocked", cwd=repo)
    code, out, _ = seam("wake", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert (code, out) == (0, {"status": "noop", "message": "no pending inbox records"})
    assert resumes_logged(log, 1).count("argv:") == 1


def test_wake_marker_and_event_fallbacks_and_no_session(repo, tmp_path):
    bdir = write_inbox(repo, {"id": "w1", "ts": "2026-07-02T11:00:00Z", "kind": "tell",
                              "target_set": ["a"]})
    env, log = wake_env(tmp_path)
    code, out, _ = seam("wake", "--members", "a", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert code == 0 and out["status"] == "skipped-no-session" and out["targets"] == ["a"]
    assert records(bdir / "wake-events.jsonl")[-1]["status"] == "skipped-no-session"
    emit("codex", payload("codex_session_start.json", repo, session_id="-evil", ts="2026-07-09T00:00:00Z"),
         cwd=repo)
    emit("codex", payload("codex_session_start.json", repo, session_id="from-event",
                          ts="2026-07-01T00:00:00Z"), cwd=repo)
    code, out, _ = seam("wake", "--members", "a", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert out["status"] == "woke" and "resume from-event -" in resumes_logged(log, 1)
    (bdir / "sessions").mkdir(exist_ok=True)
    (bdir / "sessions/m.json").write_text(json.dumps({"session_id": "from-marker", "workflow": "a"}))
    seam("wake", "--members", "a", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    text = resumes_logged(log, 2)
    assert "resume from-marker -" in text and "-evil" not in text


def test_wake_starts_resumes_detached_and_never_resumes_a_running_one_again(repo, tmp_path, stop_resumes):
    """As Go: each resume is started, not awaited (a Codex turn may take an hour), in its own
    session, the prompt on stdin from a temp file that is then removed, output to /dev/null.
    A session whose resume still runs is not resumed again; a dead or recycled pid does not count."""
    bdir = write_inbox(repo, {"id": "w1", "ts": "2026-07-02T11:00:00Z", "kind": "tell", "target": "a"},
                       {"id": "w2", "ts": "2026-07-02T11:01:00Z", "kind": "tell", "target": "b"})
    heartbeat(repo, "a", "session-a", "codex")
    heartbeat(repo, "b", "session-b", "codex")
    env, log = wake_env(tmp_path, "hang")
    stop_resumes(log)
    started = time.monotonic()
    code, out, _ = seam("wake", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert time.monotonic() - started < 10  # two resumes of 300 s each: not waited for
    assert (code, out["status"], out["sessions"]) == (0, "woke", 2), out
    pids = resume_pids(resumes_logged(log, 2))
    for pid in pids:
        assert os.getsid(pid) == pid  # its own session (and process group)
        assert os.readlink("/proc/%d/fd/1" % pid) == "/dev/null" == os.readlink("/proc/%d/fd/2" % pid)
    assert list((tmp_path / "tmp").iterdir()) == []  # the prompt files are gone
    assert not (bdir / ".wake-lock.codex").exists()
    # the resumes still run: a second wake starts none, and says so
    code, out, _ = seam("wake", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert (code, out["status"], sorted(out["running"])) == (0, "running", ["session-a", "session-b"]), out
    assert [e["status"] for e in records(bdir / "wake-events.jsonl")][-2:] == ["skipped-running"] * 2
    [pid_a] = resume_pids(log.read_text(), "session-a")
    os.killpg(pid_a, 9)  # session-a's resume ends
    for _ in range(200):
        if not process_running(pid_a):
            break
        time.sleep(0.05)
    code, out, _ = seam("wake", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert (code, out["status"], out["running"]) == (0, "woke", ["session-b"]), out
    assert resumes_logged(log, 3).count("resume session-a -") == 2
    # a recorded pid that now belongs to another process (here: this test) is not a resume
    resumes = json.loads((bdir / ".wake-resumes.codex").read_text())
    resumes["session-b"]["pid"] = os.getpid()
    (bdir / ".wake-resumes.codex").write_text(json.dumps(resumes))
    code, out, _ = seam("wake", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert out["running"] == ["session-a"] and resumes_logged(log, 4).count("resume session-b -") == 2


def test_wake_counts_resumes_that_cannot_start(repo, tmp_path, stop_resumes):
    bdir = write_inbox(repo, {"id": "w1", "ts": "2026-07-02T11:00:00Z", "kind": "tell", "target": "a"},
                       {"id": "w2", "ts": "2026-07-02T11:01:00Z", "kind": "tell", "target": "b"})
    heartbeat(repo, "a", "session-a", "codex")
    heartbeat(repo, "b", "session-b", "codex")
    env, log = wake_env(tmp_path)
    code, out, _ = seam("wake", "--codex-bin", str(tmp_path / "no-codex"), cwd=repo, env=env)
    assert (code, out["status"]) == (1, "failed") and out["error"].startswith(
        "cannot start %s: No such file" % (tmp_path / "no-codex")), out
    # one session's command exists, the other's does not: partial
    (tmp_path / "bin-session-a").symlink_to(SEAM / "codex")
    (repo / "bridge.config.json").write_text(json.dumps({"seam": {"wake_command": [
        str(tmp_path / "bin-{session_id}"), "exec", "resume", "{session_id}", "-"]}}))
    code, out, _ = seam("wake", cwd=repo, env=env)
    assert (code, out["status"]) == (1, "partial") and "bin-session-b" in out["error"], out
    assert "resume session-a -" in resumes_logged(log, 1)
    assert [e["status"] for e in records(bdir / "wake-events.jsonl")] == ["failed", "failed", "woke", "failed"]
    assert list((tmp_path / "tmp").iterdir()) == []


def test_wake_lock_follows_gos_protocol(repo, tmp_path, stop_resumes):
    """`_bridge/.wake-lock.codex`: created exclusively, mode 0600, "<pid>\\n", removed when the
    pass ends; a fresh one (Go's wake holds it) answers locked; one older than 5 minutes is
    reclaimed. The first wake is caught mid-pass: stopped (SIGSTOP) as soon as its lock holds
    its pid; a pass that starts 40 resumes lasts long enough to catch (tried again if not)."""
    slugs = ["s%02d" % i for i in range(40)]
    bdir = write_inbox(repo, *[{"id": "w%d" % i, "ts": "2026-07-02T11:00:00Z", "kind": "tell", "target": slug}
                               for i, slug in enumerate(slugs)])
    for slug in slugs:
        heartbeat(repo, slug, "session-" + slug, "codex")
    env, log = wake_env(tmp_path)
    lock, wake = bdir / ".wake-lock.codex", [PYTHON, str(BRIDGE), "wake", "--codex-bin", str(SEAM / "codex")]
    for _ in range(10):
        first = subprocess.Popen(wake, cwd=repo, env=env, stdout=subprocess.PIPE, text=True)
        mine = "%d\n" % first.pid
        while first.poll() is None and not (lock.exists() and lock.read_text() == mine):
            pass
        if first.poll() is None:
            os.kill(first.pid, signal.SIGSTOP)
        if lock.exists() and lock.read_text() == mine:
            break
        os.kill(first.pid, signal.SIGCONT)
        first.communicate(timeout=30)
    else:
        pytest.fail("never caught a wake holding its lock")
    try:
        assert (lock.stat().st_mode & 0o777) == 0o600
        code, out, _ = seam("wake", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
        assert (code, out) == (3, {"status": "locked", "message": "another bridge ingress wake is running"})
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out = json.loads(first.communicate(timeout=30)[0])
    assert out["status"] in ("woke", "running") and not lock.exists()
    # a lock as Go's wake leaves it while it runs: fresh, so honoured
    lock.write_text("99999\n")
    lock.chmod(0o600)
    code, out, _ = seam("wake", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert code == 3 and out["status"] == "locked" and lock.read_text() == "99999\n"
    # older than 5 minutes: its wake died; reclaimed, and removed after the pass
    os.utime(lock, (time.time() - 301, time.time() - 301))
    before = log.read_text().count("\n--\n") if log.exists() else 0
    code, out, _ = seam("wake", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert code == 0 and out["status"] in ("woke", "running") and not lock.exists(), out
    assert out["status"] == "running" or resumes_logged(log, before + 40).count("\n--\n") == before + 40


def test_planted_fifos_never_block_a_hook(repo):
    """A FIFO in place of a file the Stop hook or egress reads or appends to (nobody would
    ever write to it) answers as if the file were not there, at once."""
    bdir = write_inbox(repo, {"id": "i1", "ts": "2026-07-03T11:00:00Z", "kind": "tell", "target": "alpha"})
    for name in ("fo.alpha.json", "fo-replies.jsonl", ".seam-index.json", "events.jsonl"):
        os.mkfifo(bdir / name)
    (bdir / "sessions").mkdir()
    os.mkfifo(bdir / "sessions" / "s1.json")
    payload = json.dumps({"session_id": "s1", "cwd": str(repo), "hook_event_name": "Stop"})
    began = time.time()
    check = subprocess.run([PYTHON, str(BRIDGE), "inbox", "check", "--host", "claude"], input=payload,
                           cwd=repo, env=clean_env(), capture_output=True, text=True, timeout=30)
    emit = subprocess.run([PYTHON, str(BRIDGE), "egress", "emit", "--host", "claude"], input=payload,
                          cwd=repo, env=clean_env(), capture_output=True, text=True, timeout=30)
    assert time.time() - began < 20
    assert (check.returncode, check.stdout.strip()) == (0, "{}") and (emit.returncode, emit.stdout) == (0, "")
    os.unlink(bdir / "fo.alpha.json")
    heartbeat(repo, "alpha", "s1")
    code, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)  # replies: a FIFO is no file
    assert out["count"] == 1, out


def test_wake_rejects_other_hosts(repo):
    code, out, _ = seam("wake", "--host", "claude", cwd=repo)
    assert code == 2 and out["error"] == "bridge ingress wake currently supports host codex only"


# ---- fo-replies.jsonl trim (Go's truncateReplies, reference 5.1) ------------------

def reply(line, target="alpha", status="answered", rid=None):
    return {"schema": 1, "ts": "2026-07-03T12:00:00Z", "kind": "reply", "target": target,
            "in_reply_to_id": rid or "h%d" % line, "in_reply_to_line": line, "intent_kind": "tell",
            "status": status}


def write_replies(bdir, lines, **cursors):
    """fo-replies.jsonl with `lines` (records or raw strings) and the given slug cursors."""
    Path(bdir).mkdir(exist_ok=True)
    (Path(bdir) / "fo-replies.jsonl").write_text(
        "".join((r if isinstance(r, str) else json.dumps(r, separators=(",", ":"))) + "\n" for r in lines))
    for slug, cursor in cursors.items():
        (Path(bdir) / (".inbox-cursor." + slug)).write_text(cursor if isinstance(cursor, str) else "%d\n" % cursor)
    return (Path(bdir) / "fo-replies.jsonl").read_text().splitlines()


def ack_line1(repo, status="answered"):
    """One terminal ack through the CLI (answering INBOX3's line 1): what triggers a trim."""
    code, out, _ = seam("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", "i1", "--kind",
                        "tell", "--status", status, cwd=repo)
    assert code == 0 and out["appended"] is True, out


def replies_after(bdir):
    lines = (Path(bdir) / "fo-replies.jsonl").read_text().splitlines()
    return lines[:-1], json.loads(lines[-1])  # the history, and the ack that was just appended


def test_truncate_replies_no_op_without_cursor(repo):
    bdir = write_inbox(repo, *INBOX3)
    before = write_replies(bdir, [reply(1 + n % 3) for n in range(2500)])
    ack_line1(repo)
    history, last = replies_after(bdir)
    assert history == before and last["in_reply_to_id"] == "i1"


def test_truncate_replies_no_op_under_cap(repo):
    bdir = write_inbox(repo, *INBOX3)
    before = write_replies(bdir, [reply(1) for _ in range(1999)], alpha=500)
    ack_line1(repo)  # 2,000 lines: at the cap, not over it
    assert replies_after(bdir)[0] == before
    ack_line1(repo)  # 2,001: over it; every line is below the floor, so the window is what stays
    after = (bdir / "fo-replies.jsonl").read_text().splitlines()
    assert len(after) == 1000 and after[:998] == before[-998:]


def test_truncate_replies_drops_below_floor_outside_window(repo):
    bdir = write_inbox(repo, *INBOX3)
    before = write_replies(bdir, [reply((99, 100, 101)[n % 3], rid="r%d" % n) for n in range(2500)],
                           alpha=100)
    ack_line1(repo)
    history, last = replies_after(bdir)
    head, window = before[:1501], before[1501:]  # the window is the last 1,000 lines, the ack included
    kept = [raw for raw in head if json.loads(raw)["in_reply_to_line"] >= 100]
    assert history == kept + window and last["in_reply_to_id"] == "i1"
    assert len(kept) == 1000 and any('"in_reply_to_line":99,' in raw for raw in window)


def test_truncate_replies_keeps_only_window_when_all_below_floor(repo):
    bdir = write_inbox(repo, *INBOX3)
    before = write_replies(bdir, [reply(n + 1) for n in range(2500)], alpha=5000)
    ack_line1(repo)
    history, last = replies_after(bdir)
    assert history == before[-999:] and last["in_reply_to_id"] == "i1"


def test_truncate_replies_floor_is_lowest_across_slugs(repo):
    bdir = write_inbox(repo, *INBOX3)
    lines = [reply((50, 150, 350)[n % 3], target=("alpha", "beta")[n % 2], rid="r%d" % n)
             for n in range(2500)]
    before = write_replies(bdir, lines, alpha=300, beta=100)
    ack_line1(repo)
    history, _ = replies_after(bdir)
    head, window = before[:1501], before[1501:]
    assert history == [raw for raw in head if json.loads(raw)["in_reply_to_line"] != 50] + window


def test_truncate_replies_waits_for_every_slug_that_may_still_ask(repo):
    """Stricter than Go: a slug with a heartbeat but no cursor, or a reply target without
    one, holds the floor at its cursor (0), so none of its acks go before it commits."""
    bdir = write_inbox(repo, *INBOX3)
    history = [reply(1 + n % 3, rid="r%d" % n) for n in range(2500)]
    before = write_replies(bdir, history, alpha=300)
    heartbeat(repo, "beta", "sess-b")
    ack_line1(repo)
    assert replies_after(bdir)[0] == before
    (bdir / "fo.beta.json").unlink()
    before = write_replies(bdir, history + [reply(1, target="gamma")], alpha=300)
    ack_line1(repo)
    assert replies_after(bdir)[0] == before
    (bdir / ".inbox-cursor.gamma").write_text("300\n")
    ack_line1(repo)
    assert len((bdir / "fo-replies.jsonl").read_text().splitlines()) == 1000


def test_truncate_replies_hostile_files(repo, tmp_path):
    bdir = write_inbox(repo, *INBOX3)
    # a garbage cursor reads as 0, so nothing is below the floor
    before = write_replies(bdir, [reply(1) for _ in range(2500)], alpha="garbage\n", beta=100)
    ack_line1(repo)
    assert replies_after(bdir)[0] == before
    (bdir / ".inbox-cursor.alpha").write_text("100\n")
    # lines that answer nothing (not JSON, no line number, a wrong type) go like any below the floor
    junk = ["not json", "{}", json.dumps(reply(1) | {"in_reply_to_line": "7"}), "[1]"]
    write_replies(bdir, junk + [reply(200, target="beta")] + [reply(1, target="beta")] * 2400)
    ack_line1(repo)
    after = (bdir / "fo-replies.jsonl").read_text().splitlines()
    assert len(after) == 1001 and json.loads(after[0])["in_reply_to_line"] == 200
    assert not any(line in after for line in junk)
    # a symlinked fo-replies.jsonl is never appended to, trimmed or followed
    outside = tmp_path / "outside.jsonl"
    outside.write_text("".join(json.dumps(reply(1)) + "\n" for _ in range(2500)))
    (bdir / "fo-replies.jsonl").unlink()
    (bdir / "fo-replies.jsonl").symlink_to(outside)
    (bdir / ".inbox-cursor.alpha").unlink()  # so that drain has records to ack
    snapshot = outside.read_bytes()
    code, out, _ = seam("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", "i1", "--kind",
                        "tell", "--status", "answered", cwd=repo)
    assert code == 1 and "cannot append to %s:" % (bdir / "fo-replies.jsonl") in out["error"]
    code, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert code == 1 and "acting acks not written: %s:" % (bdir / "fo-replies.jsonl") in out["error"]
    assert outside.read_bytes() == snapshot and (bdir / "fo-replies.jsonl").is_symlink()
    assert sorted(p.name for p in bdir.iterdir() if p.name.endswith(".tmp")) == []


def test_concurrent_acks_across_a_replies_trim_lose_nothing(repo):
    """40 acks at once push fo-replies.jsonl over the cap: every ack survives the trims,
    so none of those intents is delivered again."""
    bdir = write_inbox(repo, *[{"id": "c%d" % n, "ts": "2026-07-03T11:00:00Z", "kind": "tell",
                                "target": "alpha"} for n in range(1, 51)])
    write_replies(bdir, [reply(1 + n % 5, rid="old%d" % n) for n in range(1990)], alpha=10)
    procs = [subprocess.Popen(
        [PYTHON, str(BRIDGE), "inbox", "ack", "--slug", "alpha", "--line", str(n), "--id", "c%d" % n,
         "--kind", "tell", "--status", "answered"], cwd=repo, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE) for n in range(11, 51)]
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and json.loads(out)["appended"] is True and err == b"", (out, err)
    recs = records(bdir / "fo-replies.jsonl")  # every line parses: none torn or interleaved
    assert sorted(r["in_reply_to_line"] for r in recs if r["in_reply_to_id"].startswith("c")) == \
        list(range(11, 51))
    assert len(recs) <= 2000  # trimmed at least once
    _, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert out["cursor"] == 10 and out["count"] == 0


def test_history_index_stays_right_across_a_replies_trim(repo):
    """.seam-index.json remembers the acks past the floor; a trim replaces the file under it."""
    inbox = [{"id": "h%d" % n, "ts": "2026-07-03T11:00:00Z", "kind": "tell", "target": "alpha"}
             for n in range(1, 1011)]
    bdir = write_inbox(repo, *inbox)
    # terminal acks for 1001-1005 far from the end (outside the window), 2,400 below the floor
    write_replies(bdir, [reply(n) for n in range(1001, 1006)] + [reply(1 + n % 900) for n in range(2400)],
                  alpha=1000)
    _, first, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)  # its acting acks trigger the trim
    assert [r["line"] for r in first["records"]] == [1006, 1007, 1008, 1009, 1010]
    assert len((bdir / "fo-replies.jsonl").read_text().splitlines()) == 1005
    index = json.loads((bdir / SEAM_INDEX).read_text())
    assert "replies" not in index  # it named the old file
    _, again, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert again["records"] == first["records"]
    seam("inbox", "ack", "--slug", "alpha", "--line", "1008", "--id", "h1008", "--kind", "tell",
         "--status", "answered", cwd=repo)
    _, third, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert [r["line"] for r in third["records"]] == [1006, 1007, 1009, 1010]
    (bdir / SEAM_INDEX).unlink()
    assert seam("inbox", "drain", "--slug", "alpha", cwd=repo)[1]["records"] == third["records"]


def test_replies_trim_remembers_a_fruitless_look_only_while_it_holds(repo):
    bdir = write_inbox(repo, *INBOX3)

    def fruitless_look():
        write_replies(bdir, [reply(150) for _ in range(2500)], alpha=100)
        ack_line1(repo)  # everything answers a line past the floor: nothing to drop
        assert len((bdir / "fo-replies.jsonl").read_text().splitlines()) == 2501
        note = json.loads((bdir / SEAM_INDEX).read_text())["replies_trim"]
        assert (note["floor"], note["lines"], note["targets"]) == (100, 2501, ["alpha"])

    fruitless_look()
    ack_line1(repo)  # same file, same floor, one line more: not looked at again
    assert json.loads((bdir / SEAM_INDEX).read_text())["replies_trim"]["lines"] == 2501
    write_replies(bdir, [reply(1) for _ in range(2500)])  # a new file: the note does not describe it
    ack_line1(repo)
    assert len((bdir / "fo-replies.jsonl").read_text().splitlines()) == 1000
    fruitless_look()
    (bdir / ".inbox-cursor.alpha").write_text("200\n")  # the floor rises: look again
    ack_line1(repo)
    assert len((bdir / "fo-replies.jsonl").read_text().splitlines()) == 1000
    assert "replies_trim" not in json.loads((bdir / SEAM_INDEX).read_text())


# ---- Go's case-insensitive JSON keys (reference 2.6) ------------------------------

def test_inbox_keys_match_case_insensitively(repo):
    write_inbox(repo,
                {"ID": "i1", "Ts": "2026-07-03T11:00:00Z", "KIND": "tell", "Text": "upper",
                 "TARGET_SET": ["alpha"], "Request_ID": "rq"},
                {"id": "a", "ID": "b", "ts": "2026-07-03T11:00:00Z", "kind": "tell", "target": "alpha"},
                {"ID": "b", "id": "a", "ts": "2026-07-03T11:00:00Z", "kind": "tell", "target": "alpha"},
                {"id": "n", "ID": None, "ts": "2026-07-03T11:00:00Z", "kind": "tell", "target": "alpha"},
                {"id": "s", "ts": "2026-07-03T11:00:00Z", "kind": "tell", "target": "beta",
                 "target_set": ["alpha"], "Target_Set": None},
                {"id": "t", "ID": 5, "ts": "2026-07-03T11:00:00Z", "kind": "tell", "target": "alpha"},
                {"id": "u", "ts": "2026-07-03T11:00:00Z", "kind": "tell", "target": "alpha",
                 "Bogus": 1, "texts": "ignored", "t\u0435xt": "cyrillic e: no field"},
                {"id": "k", "ts": "2026-07-03T11:00:00Z", "\u212aind": "tell", "target": "alpha"})
    code, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert code == 0
    got = {r["line"]: r for r in out["records"]}
    assert got[1] == {"line": 1, "id": "i1", "ts": "2026-07-03T11:00:00Z", "kind": "tell",
                      "text": "upper", "target_set": ["alpha"], "request_id": "rq"}
    assert got[2]["id"] == "b" and got[3]["id"] == "a"  # the later key wins
    assert got[4]["id"] == "n"  # a null leaves a string field alone
    assert 5 not in got  # ... but resets a slice: legacy routing to beta
    assert 6 not in got  # the later key's wrong type rejects the record
    assert got[7] == {"line": 7, "id": "u", "ts": "2026-07-03T11:00:00Z", "kind": "tell",
                      "target": "alpha"}  # unknown keys still ignored
    assert got[8]["kind"] == "tell"  # KELVIN SIGN folds to k, as in Go
    raw = (repo / "_bridge/fo-replies.jsonl").read_text()  # written with the canonical keys only
    assert '"in_reply_to_id":"i1"' in raw and '"request_id":"rq"' in raw and "ID" not in raw


def test_hook_payload_keys_match_case_insensitively(repo):
    data = json.loads(payload("claude_post_tool_use_read_ensign.json", repo,
                              timestamp="2026-07-01T01:02:03Z"))
    renamed = {{"session_id": "Session_ID", "cwd": "CWD", "hook_event_name": "Hook_Event_Name",
                "tool_name": "TOOL_NAME", "tool_input": "Tool_Input", "agent_type": "Agent_Type"}
               .get(k, k): v for k, v in data.items()}
    renamed["Tool_Input"] = {"FILE_PATH": renamed["Tool_Input"]["file_path"]}
    elsewhere = repo / "sub"
    elsewhere.mkdir()
    emit("claude", json.dumps(renamed), cwd=elsewhere)  # the payload's CWD names the repo
    (line,) = (repo / "_bridge/events.jsonl").read_text().splitlines()
    assert line == ('{"timestamp":"2026-07-01T01:02:03Z","ts":"2026-07-01T01:02:03Z",'
                    '"host":"claude","event":"PostToolUse","session_id":"ses-ensign","agent_id":"",'
                    '"agent_type":"spacedock:ensign","actor_id":"ses-ensign",'
                    '"detail":{"tool":"Read","source":""}}')
    assert (repo / "_bridge/sessions/ses-ensign.json").exists()
    emit("pi", json.dumps({"EVENT": "turn_end", "CWD": str(repo), "\u017fession_id": "pi-1",
                           "DETAIL": {"Source": "pi", "TOOL": "bash"}, "session_id_x": "no"}),
         cwd=elsewhere)
    rec = records(repo / "_bridge/events.jsonl")[1]
    assert (rec["event"], rec["session_id"], rec["detail"]) == ("Stop", "pi-1", {"tool": "bash", "source": "pi"})
    assert not (elsewhere / "_bridge").exists()


def test_stop_payload_heartbeat_and_marker_keys_match_case_insensitively(repo, tmp_path):
    write_inbox(repo, *INBOX3)
    bdir = repo / "_bridge"
    (bdir / "fo.alpha.json").write_text(json.dumps({"Session_ID": "sess-1", "TS": "2026-07-03T12:00:00Z"}))
    stop = {"Session_ID": "sess-1", "CWD": str(repo), "Hook_Event_Name": "Stop"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _, out, _ = seam("inbox", "check", cwd=elsewhere, input=json.dumps(stop))
    assert out["decision"] == "block" and "workflow(s): alpha." in out["reason"]
    _, out, _ = seam("inbox", "check", cwd=elsewhere, input=json.dumps(stop | {"STOP_HOOK_ACTIVE": True}))
    assert out == {}
    (bdir / "fo.alpha.json").write_text(json.dumps({"session_id": "sess-1", "Ts": "yesterday"}))
    assert seam("inbox", "check", cwd=elsewhere, input=json.dumps(stop))[1] == {}  # a bad TS fails it whole
    (bdir / "sessions").mkdir()
    (bdir / "sessions/x.json").write_text(json.dumps({"SESSION_ID": "sess-1", "Workflow": "beta"}))
    _, out, _ = seam("inbox", "check", cwd=elsewhere, input=json.dumps(stop))
    assert "workflow(s): beta." in out["reason"]


def test_reply_keys_match_case_insensitively(repo):
    bdir = write_inbox(repo, *INBOX3)
    (bdir / "fo-replies.jsonl").write_text(json.dumps(
        {"SCHEMA": 1, "Kind": "reply", "TARGET": "alpha", "In_Reply_To_ID": "i1",
         "IN_REPLY_TO_LINE": 1, "Intent_Kind": "tell", "STATUS": "answered"}) + "\n" + json.dumps(
        {"schema": 1, "target": "alpha", "in_reply_to_id": "i3", "in_reply_to_line": 3,
         "intent_kind": "decision", "status": "applied", "STATUS": "acting"}) + "\n")
    _, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert [r["line"] for r in out["records"]] == [3]  # line 3's later STATUS is acting: not delivered


def test_initiate_and_event_keys_match_case_insensitively(repo, tmp_path):
    bdir = repo / "_bridge"
    bdir.mkdir()
    gate = {"SCHEMA": 1, "ID": "gate-upper", "Kind": "gate-review", "Headline": "h",
            "Request_ID": "gate-upper", "STATUS": "open"}
    lines = [gate] + [{"schema": 1, "id": "s%d" % i, "kind": "status", "headline": "h",
                       "status": "open"} for i in range(1999)]
    (bdir / "fo-initiate.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    seam("initiate", "--kind", "status", "--id", "last", "--headline", "h", cwd=repo)
    assert json.loads((bdir / "fo-initiate.jsonl").read_text().splitlines()[0]) == gate
    write_inbox(repo, {"id": "w1", "ts": "2026-07-02T11:00:00Z", "kind": "tell", "target_set": ["a"]})
    (bdir / "events.jsonl").write_text(json.dumps(
        {"HOST": "codex", "Session_ID": "from-upper", "TS": "2026-07-01T00:00:00Z"}) + "\n")
    env, log = wake_env(tmp_path)
    _, out, _ = seam("wake", "--members", "a", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert out["status"] == "woke" and "resume from-upper -" in resumes_logged(log, 1)


# ---- CLI surface -------------------------------------------------------------------

def test_cli_usage_and_unknown_subcommands(repo):
    result = run_bridge("inbox", "frobnicate", cwd=repo)
    assert result.returncode == 2 and json.loads(result.stdout) == {
        "error": "unknown inbox subcommand: frobnicate"}
    result = run_bridge("inbox", "drain", "--help", cwd=repo)
    assert result.returncode == 0 and "--slug SLUG" in result.stdout
    result = run_bridge("alert", cwd=repo)
    assert result.returncode == 2 and "alert permission" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_bridge("--help")
    assert "egress" in result.stdout and "wake" in result.stdout


def test_fast_hook_entry_point_matches_cli(repo):
    """The README's hook form (cached bytecode, no argparse) writes what the CLI writes."""
    scripts = repo / "scripts"
    scripts.mkdir()
    (scripts / "bridge.py").write_bytes(BRIDGE.read_bytes())
    code = 'import gc,sys;gc.disable();sys.path[:0]=["scripts"];import bridge;sys.exit(bridge.seam_main())'
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code, "egress", "emit", "--host", "claude"],
                            cwd=repo, input=payload("claude_session_start.json", repo, ts="T"),
                            capture_output=True, text=True, env=clean_env())
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert records(repo / "_bridge/events.jsonl")[0]["ts"] == "T"
    assert (scripts / "__pycache__").is_dir()  # -I keeps bytecode caching on


def test_fast_hook_turns_the_collector_back_on(repo):
    """The hook command disables gc for the import; seam_main freezes the module and re-enables it."""
    scripts = repo / "scripts"
    scripts.mkdir()
    (scripts / "bridge.py").write_bytes(BRIDGE.read_bytes())
    code = ('import gc,sys;gc.disable();sys.path[:0]=["scripts"];import bridge;rc=bridge.seam_main();'
            'print(rc, gc.isenabled(), gc.get_freeze_count() > 1000)')
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code, "egress", "emit", "--host", "claude"],
                            cwd=repo, input=payload("claude_session_start.json", repo),
                            capture_output=True, text=True, env=clean_env())
    assert (result.stdout, result.stderr) == ("0 True True\n", "")
    assert len(records(repo / "_bridge/events.jsonl")) == 1


def test_history_index_is_only_a_cache(repo):
    """.seam-index.json speeds up long histories; a stale, foreign or garbage one changes nothing."""
    bdir = write_inbox(repo, *(INBOX3 * 40))
    (bdir / ".inbox-cursor.alpha").write_text("117\n")
    _, first, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert [r["line"] for r in first["records"]] == [118, 120] and (bdir / SEAM_INDEX).exists()
    seam("inbox", "ack", "--slug", "alpha", "--line", "120", "--id", "i3", "--kind", "decision",
         "--status", "applied", cwd=repo)
    _, second, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert [r["line"] for r in second["records"]] == [118]
    # the inbox is rewritten in place with other records: the index no longer matches it
    write_inbox(repo, *([{"id": "n%d" % n, "ts": "2026-07-04T00:00:00Z", "kind": "tell",
                          "target": "alpha"} for n in range(125)]))
    _, third, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert [r["id"] for r in third["records"]] == ["n117", "n118", "n119", "n120", "n121", "n122",
                                                  "n123", "n124"]
    (bdir / SEAM_INDEX).write_text('{"inbox":[[5,[1,2,"zz"]],"x"],"replies":{"floor":-1,"keys":7}}')
    _, fourth, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert fourth["records"] == third["records"]
    (bdir / SEAM_INDEX).write_text("\x00garbage")
    assert seam("inbox", "drain", "--slug", "alpha", cwd=repo)[1]["records"] == third["records"]


def test_readme_hook_commands_work_as_documented(repo):
    """The copy-paste hook configuration in the README runs as written, through a shell."""
    import re
    readme = (BRIDGE.parent / "README.md").read_text()
    section = readme[readme.index("<!-- section:seam -->"):readme.index("<!-- end section:seam -->")]
    claude, codex = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", section, re.S)]
    (repo / "scripts").mkdir()
    (repo / "scripts" / "bridge.py").write_bytes(BRIDGE.read_bytes())
    (repo / "sub" / "deep").mkdir(parents=True)
    write_inbox(repo, *INBOX3)
    heartbeat(repo, "alpha", "sess-1")
    env = clean_env(CLAUDE_PROJECT_DIR=repo)
    for event, entries in claude["hooks"].items():
        for hook in entries[0]["hooks"]:
            data = payload("claude_stop.json", repo / "sub", hook_event_name=event)
            result = subprocess.run(["sh", "-c", hook["command"]], input=data, text=True,
                                    capture_output=True, env=env, cwd=repo / "sub")
            assert result.returncode == 0 and result.stderr == "", (event, result)
            if "inbox check" in hook["command"]:
                assert json.loads(result.stdout)["decision"] == "block"
            else:
                assert result.stdout == ""
    for event, entries in codex["hooks"].items():
        data = payload("codex_session_start.json", repo / "sub" / "deep", hook_event_name=event)
        result = subprocess.run(["sh", "-c", entries[0]["hooks"][0]["command"]], input=data,
                                text=True, capture_output=True, env=clean_env(),
                                cwd=repo / "sub" / "deep")
        assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), (event, result)
    events = records(repo / "_bridge" / "events.jsonl")
    assert [e["host"] for e in events] == ["claude"] * 6 + ["codex"] * 6
    assert list(codex["hooks"]) == ["SessionStart", "UserPromptSubmit", "PostToolUse", "SubagentStart",
                                    "SubagentStop", "Stop"]  # the reference's hooks/codex-hooks.json


def test_readme_codex_hook_finds_bridge_py_only_within_the_git_repository(tmp_path):
    """A scripts/bridge.py above the repository (or above the working directory when there is no
    repository) is never run; without one in the repository the hook does nothing, silently."""
    import re
    readme = (BRIDGE.parent / "README.md").read_text()
    section = readme[readme.index("<!-- section:seam -->"):readme.index("<!-- end section:seam -->")]
    command = json.loads(re.findall(r"```json\n(.*?)```", section, re.S)[1])["hooks"]["Stop"][0]["hooks"][0]["command"]
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "bridge.py").write_text(
        "open(%r, 'w').write('ran')\n" % str(tmp_path / "outer-ran"))
    repo = make_git_repo(tmp_path / "repo")
    plain = tmp_path / "plain" / "sub"  # no repository at all
    for cwd in (repo, repo / "sub" / "deep", plain, tmp_path / "wt"):
        cwd.mkdir(parents=True, exist_ok=True)
    (tmp_path / "wt" / ".git").write_text("gitdir: /nowhere\n")  # a linked worktree's .git file
    for cwd in (repo, repo / "sub" / "deep", plain, tmp_path / "wt"):
        result = subprocess.run(["sh", "-c", command], input=payload("codex_session_start.json", cwd),
                                text=True, capture_output=True, env=clean_env(), cwd=cwd)
        assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), (cwd, result)
    assert not (tmp_path / "outer-ran").exists()
    assert not list(tmp_path.rglob("_bridge"))
    (repo / "scripts").mkdir()
    (repo / "scripts" / "bridge.py").write_bytes(BRIDGE.read_bytes())
    result = subprocess.run(["sh", "-c", command], input=payload("codex_session_start.json", repo / "sub"),
                            text=True, capture_output=True, env=clean_env(), cwd=repo / "sub" / "deep")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert [e["host"] for e in records(repo / "_bridge" / "events.jsonl")] == ["codex"]
    assert (repo / "scripts" / "__pycache__").is_dir() and not (tmp_path / "outer-ran").exists()


def test_emit_never_waits_on_a_wedged_lock_holder(repo):
    """A process that holds events.jsonl exclusively (a stopped trim) delays a hook <= 2 s."""
    bdir = repo / "_bridge"
    bdir.mkdir()
    (bdir / "events.jsonl").write_text("")
    holder = subprocess.Popen([PYTHON, "-c", "import fcntl,os,sys,time;fd=os.open(sys.argv[1],os.O_RDWR);"
                               "fcntl.flock(fd,fcntl.LOCK_EX);print('locked',flush=True);time.sleep(30)",
                               str(bdir / "events.jsonl")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        started = time.monotonic()
        emit("claude", payload("claude_session_start.json", repo), cwd=repo)
        assert time.monotonic() - started < 10
        assert (bdir / "events.jsonl").read_text() == ""  # observe-only: dropped, host not blocked
    finally:
        holder.kill()
        holder.wait()
    emit("claude", payload("claude_session_start.json", repo), cwd=repo)
    assert len(records(bdir / "events.jsonl")) == 1


def test_symlinked_state_files_are_replaced_or_refused_never_followed(repo, tmp_path):
    bdir = write_inbox(repo, *INBOX3)
    targets = {}
    for name in ("fo.alpha.json", ".inbox-cursor.alpha", "fo-replies.jsonl", SEAM_INDEX):
        target = tmp_path / ("outside-" + name.strip("."))
        target.write_text("precious\n")
        (bdir / name).symlink_to(target)
        targets[name] = target
    code, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert code == 1 and out["heartbeat"] is True and out["count"] == 2 and "acting acks not written" in out["error"]
    assert not (bdir / "fo.alpha.json").is_symlink()
    code, out, _ = seam("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", "i1", "--kind",
                        "tell", "--status", "answered", cwd=repo)
    assert code == 1 and "cannot append to %s:" % (bdir / "fo-replies.jsonl") in out["error"]
    assert seam("inbox", "commit", "--slug", "alpha", "--cursor", "2", cwd=repo)[1] == {"cursor": 2}
    assert (bdir / ".inbox-cursor.alpha").read_text() == "2\n"
    assert all(t.read_text() == "precious\n" for t in targets.values())


# ---- redaction of free text on every seam write (review findings) -------------------

GHP = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"  # a GitHub token shape, 36 after ghp_
ENV_SECRET = "Zq8vN3xLp2Rw7KsT4mYd"


def secret_env(**extra):
    return clean_env(SEAMTEST_API_TOKEN=ENV_SECRET, **extra)


def assert_no_secret(repo, *outputs):
    assert len(GHP) == 40
    for path in Path(repo, "_bridge").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert GHP.encode() not in data and ENV_SECRET.encode() not in data, path
    for text in outputs:
        assert GHP not in text and ENV_SECRET not in text, text


def test_ack_redacts_every_free_text_field_but_keeps_the_dedup_key(repo):
    write_inbox(repo, *INBOX3)
    env = secret_env()
    leak = "see %s and %s" % (GHP, ENV_SECRET)
    result = run_bridge("inbox", "ack", "--slug", "alpha", "--line", "3", "--id", "i3",
                        "--ts", "2026-07-03T11:02:00Z", "--kind", "decision", "--status", "applied",
                        "--text", leak, "--entity", "e1 " + GHP, "--field", ENV_SECRET,
                        "--value", leak, "--verdict", leak, "--request-id", "req-1",
                        cwd=repo, env=env)
    assert result.returncode == 0, result
    assert_no_secret(repo, result.stdout, result.stderr)
    (rec,) = records(repo / "_bridge/fo-replies.jsonl")
    assert (rec["target"], rec["in_reply_to_id"], rec["in_reply_to_line"], rec["in_reply_to_ts"],
            rec["intent_kind"], rec["status"], rec["request_id"]) == (
        "alpha", "i3", 3, "2026-07-03T11:02:00Z", "decision", "applied", "req-1")
    for key in ("text", "entity", "field", "value", "verdict"):
        assert rec[key], key  # redacted, not dropped
    # The terminal ack still matches its intent: line 3 is delivered, line 1 is not.
    code, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo, env=env)
    assert code == 0 and [r["line"] for r in out["records"]] == [1]
    assert_no_secret(repo)


def test_emit_redacts_timestamp_agent_type_and_source(repo):
    env = secret_env()
    for changes in ({"timestamp": "at " + GHP, "agent_type": "ensign " + ENV_SECRET,
                     "detail": {"source": "resume " + GHP}},
                    {"ts": ENV_SECRET + " " + GHP, "source": "token " + GHP}):
        result = run_bridge("egress", "emit", "--host", "codex", cwd=repo, env=env,
                            input=payload("codex_session_start.json", repo, **changes))
        assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), result
    assert_no_secret(repo)
    first, second = records(repo / "_bridge/events.jsonl")
    assert list(first) == EVENT_KEYS and first["agent_type"].startswith("ensign ")
    assert first["detail"]["source"].startswith("resume ") and second["ts"] == second["timestamp"]
    # A valid time passes through untouched.
    emit("codex", payload("codex_session_start.json", repo, ts="2026-07-09T00:00:00.5+02:00"),
         cwd=repo, env=env)
    assert records(repo / "_bridge/events.jsonl")[-1]["ts"] == "2026-07-09T00:00:00.5+02:00"


def test_wake_redacts_its_start_errors_and_never_keeps_codex_output(repo, tmp_path):
    bdir = write_inbox(repo, {"id": "w1", "ts": "2026-07-02T11:00:00Z", "kind": "tell", "target": "a"})
    heartbeat(repo, "a", "session-a", "codex")
    fake = tmp_path / "codex"
    pid = tmp_path / "codex.pid"
    fake.write_text("#!/bin/sh\necho $$ > %s\ncat >/dev/null\n"
                    "echo \"auth failed for %s with $SEAMTEST_API_TOKEN\" >&2\nexit 3\n" % (pid, GHP))
    fake.chmod(0o755)
    result = run_bridge("wake", "--host", "codex", "--codex-bin", fake, cwd=repo, env=secret_env())
    assert (result.returncode, json.loads(result.stdout)["status"]) == (0, "woke"), result
    missing = tmp_path / GHP / ENV_SECRET  # a start error names the command: redacted
    # the resume above has ended (its output went to /dev/null)
    assert wait_for(lambda: pid.exists() and pid.read_text().strip() and
                    not process_running(int(pid.read_text())), 30)
    result = run_bridge("wake", "--host", "codex", "--codex-bin", missing, cwd=repo, env=secret_env())
    assert result.returncode == 1 and "Traceback" not in result.stderr, result
    out = json.loads(result.stdout)
    assert out["status"] == "failed" and out["error"].startswith("cannot start ") and "[REDACTED]" in out["error"]
    assert_no_secret(repo, result.stdout, result.stderr)
    assert "auth failed" not in "".join(p.read_text() for p in bdir.rglob("*") if p.is_file())
    event = records(bdir / "wake-events.jsonl")[-1]
    assert event["status"] == "failed" and event["error"] == out["error"]



# ---- hostile nesting and a foreign index (review: RecursionError, unhashable keys) ---

DEEP = "[" * 5000 + "]" * 5000  # past Python's recursion limit inside json.loads


def test_deeply_nested_lines_are_skipped_like_malformed_ones(repo, tmp_path):
    bdir = write_inbox(repo, INBOX3[0], '{"id":"i2","target_set":%s}' % DEEP, INBOX3[2])
    heartbeat(repo, "alpha", "s1", "codex")
    (bdir / "fo.beta.json").write_text('{"session_id":"s2","x":%s}\n' % DEEP)
    (bdir / "fo-replies.jsonl").write_text('{"in_reply_to_line":1,"x":%s}\n' % DEEP)
    (bdir / "sessions").mkdir()
    (bdir / "sessions/deep.json").write_text('{"workflow":"alpha","x":%s}' % DEEP)
    code, out, err = seam("inbox", "drain", "--slug", "alpha", "--session-id", "s1", cwd=repo)
    assert (code, err) == (0, "") and [r["line"] for r in out["records"]] == [1, 3], out
    assert out["high_water"] == 3
    _, out, _ = seam("inbox", "check", cwd=repo, input=json.dumps({"session_id": "s1"}))
    assert out["decision"] == "block" and "2 queued" in out["reason"]
    code, out, _ = seam("inbox", "ack", "--slug", "alpha", "--line", "2", "--id", "i2", "--kind",
                        "tell", "--status", "answered", cwd=repo)
    assert code == 1 and out["error"] == "inbox line 2 is not a valid intent record"
    code, out, _ = seam("inbox", "ack", "--slug", "alpha", "--line", "3", "--id", "i3", "--kind",
                        "decision", "--status", "applied", cwd=repo)
    assert code == 0 and out["appended"] is True
    env, log = wake_env(tmp_path)
    code, out, err = seam("wake", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert (code, out["status"], out["lines"], err) == (0, "woke", [1], ""), out
    # a deep line in fo-initiate.jsonl when a trim reads it back
    (bdir / "fo-initiate.jsonl").write_text(DEEP + "\n" + "".join(json.dumps(
        {"schema": 1, "id": "g%d" % i, "ts": "2026-07-03T11:00:00Z", "kind": "gate-review",
         "headline": "h", "status": "open"}) + "\n" for i in range(2000)))
    code, out, err = seam("initiate", "--kind", "status", "--id", "s", "--headline", "h", cwd=repo)
    assert (code, out["queued"], err) == (0, True, ""), out
    # and in a hook payload: observe-only, silent
    emit("claude", '{"cwd":%s,"hook_event_name":"Stop","detail":%s}' % (json.dumps(str(repo)), DEEP),
         cwd=repo)


def test_ack_of_a_json_line_that_is_no_intent_says_it_is_invalid_not_missing(repo):
    """A line that is JSON but that Go would not decode as an intent (here its id is a number)
    exists: the ack names it invalid, not missing from an inbox that has it."""
    write_inbox(repo, {"id": 5, "kind": "tell", "target": "alpha"}, INBOX3[1])
    code, out, _ = seam("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", "5", "--kind",
                        "tell", "--status", "answered", cwd=repo)
    assert code == 1 and out["error"] == "inbox line 1 is not a valid intent record", out


def _set(path, value):
    """A mutation of a real index: set the entry at `path` (keys and list indexes) to `value`."""
    def mutate(index):
        node = index
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return json.dumps(index)
    return mutate


@pytest.mark.parametrize("mutate", [
    lambda index: DEEP,
    _set(("replies", "keys", 0, 1), ["unhashable"]),
    _set(("replies", "keys", 0, 0), True),
    _set(("replies", "floor"), "0"),
    _set(("inbox", 0, 1, 1), "0"),
    _set(("inbox",), {"1": 2}),
    _set(("replies_trim",), {"mark": [1, 0, ""], "floor": 1, "lines": "many", "targets": []}),
    _set(("replies_trim",), {"mark": [1, 0, ""], "floor": 1, "lines": 3, "targets": [["alpha"]]}),
], ids=["deep", "unhashable-key", "bool-line", "str-floor", "str-offset", "inbox-dict",
        "str-lines", "list-target"])
def test_a_wrong_typed_index_means_a_full_rescan(repo, mutate):
    bdir = write_inbox(repo, *INBOX3)
    heartbeat(repo, "alpha", "s1")
    drain = ("inbox", "drain", "--slug", "alpha", "--session-id", "s1")
    code, first, _ = seam(*drain, cwd=repo)
    assert code == 0 and first["count"] == 2
    seam(*drain, cwd=repo)  # now the index holds the acting acks too
    index = mutate(json.loads((bdir / SEAM_INDEX).read_text()))
    (bdir / SEAM_INDEX).write_text(index)
    for _ in range(2):
        code, out, err = seam(*drain, cwd=repo)
        assert (code, err, out["records"]) == (0, "", first["records"]), out
        _, out, err = seam("inbox", "check", cwd=repo, input=json.dumps({"session_id": "s1"}))
        assert out["decision"] == "block" and err == ""
    seam("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", "i1", "--kind", "tell",
         "--status", "answered", cwd=repo)
    (bdir / SEAM_INDEX).write_text(index)
    assert [r["line"] for r in seam(*drain, cwd=repo)[1]["records"]] == [3]


# ---- a failed append leaves no torn fragment (review: full disk mid-append) ---------

def run_size_limited(limit, *args, cwd, input=None, env=None):
    """Run bridge.py with a file size limit of `limit` bytes (RLIMIT_FSIZE): a write past it
    is cut short there, as on a full disk (SIGXFSZ ignored, so write() reports it)."""
    import resource
    import signal

    def limit_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    # not measured by coverage (`make test`): its data file would hit the same limit
    env = {k: v for k, v in (env or clean_env()).items() if not k.startswith("COVERAGE_")}
    return subprocess.run([PYTHON, str(BRIDGE), *args], cwd=cwd, input=input, text=True,
                          capture_output=True, env=env, preexec_fn=limit_size, timeout=60)


def test_a_short_append_leaves_nothing_for_the_next_record_to_be_glued_to(repo):
    bdir = write_inbox(repo, *INBOX3)
    history = write_replies(bdir, [reply(n, rid="h%d" % n) for n in range(1, 40)])
    before = (bdir / "fo-replies.jsonl").read_bytes()
    ack = ("inbox", "ack", "--slug", "alpha", "--line", "3", "--id", "i3", "--kind", "decision",
           "--status", "applied")
    result = run_size_limited(len(before) + 40, *ack, cwd=repo)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result
    out = json.loads(result.stdout)
    assert out["appended"] is False and "fo-replies.jsonl" in out["error"], out
    assert "short write" in out["error"]
    assert (bdir / "fo-replies.jsonl").read_bytes() == before  # the fragment was cut off
    code, out, _ = seam(*ack, cwd=repo)
    assert code == 0 and out["appended"] is True
    lines = records(bdir / "fo-replies.jsonl")  # every line parses: nothing glued
    assert len(lines) == len(history) + 1 and lines[-1]["in_reply_to_id"] == "i3"
    assert [r["line"] for r in seam("inbox", "drain", "--slug", "alpha", cwd=repo)[1]["records"]] == [1]
    # a hook's event: dropped whole, silently, and the next one lands intact
    emit("claude", payload("claude_session_start.json", repo), cwd=repo)
    events = (bdir / "events.jsonl").read_bytes()
    result = run_size_limited(len(events) + 30, "egress", "emit", "--host", "claude", cwd=repo,
                              input=payload("claude_session_start.json", repo),
                              env=clean_env(BRIDGE_DEBUG=1))
    assert (result.returncode, result.stdout) == (0, "") and "short write" in result.stderr
    assert (bdir / "events.jsonl").read_bytes() == events
    emit("claude", payload("claude_session_start.json", repo), cwd=repo)
    assert len(records(bdir / "events.jsonl")) == 2


# ---- cursor locks and the legacy cursor: never followed, never lowered ---------------

def test_symlinked_cursor_lock_and_legacy_cursor_are_never_followed(repo, tmp_path):
    bdir = write_inbox(repo, *(INBOX3 * 2))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "private").write_text("4\n")
    (bdir / ".inbox-cursor").symlink_to(outside / "private")
    (bdir / ".cursor-lock.alpha").symlink_to(outside / "created-by-commit")
    code, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert code == 1 and str(bdir / ".cursor-lock.alpha") in out["error"], out
    assert "symlink" in out["error"]
    (bdir / ".cursor-lock.alpha").unlink()
    code, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert code == 0 and out["cursor"] == 0 and out["count"] == 4  # the outside "4" is not read
    assert not (bdir / ".inbox-cursor.alpha").exists()
    (bdir / ".cursor-lock.alpha").unlink()
    (bdir / ".cursor-lock.alpha").symlink_to(outside / "created-by-commit")
    code, out, _ = seam("inbox", "commit", "--slug", "alpha", "--cursor", "1", cwd=repo)
    assert code == 1 and str(bdir / ".cursor-lock.alpha") in out["error"], out
    assert sorted(p.name for p in outside.iterdir()) == ["private"]
    assert not (bdir / ".inbox-cursor.alpha").exists()


def test_commit_lock_is_not_named_like_a_cursor_for_go(repo):
    """Go's truncateReplies collects `.inbox-cursor.*` files: a lock file there would read as a
    slug "alpha.lock" at cursor 0 and stop Go's trim for good."""
    bdir = write_inbox(repo, *INBOX3)
    assert seam("inbox", "commit", "--slug", "alpha", "--cursor", "2", cwd=repo)[1] == {"cursor": 2}
    assert sorted(p.name for p in bdir.glob(".inbox-cursor.*")) == [".inbox-cursor.alpha"]


def test_drain_adopts_the_legacy_cursor_under_the_cursor_lock(repo):
    """A commit holding the cursor lock is waited for, and the cursor it wrote is not replaced by
    the (lower) legacy cursor that drain adopts."""
    bdir = write_inbox(repo, *(INBOX3 + INBOX3[:2]))
    (bdir / ".inbox-cursor").write_text("1\n")
    holder = subprocess.Popen(
        [PYTHON, "-c", "import fcntl,os,sys;fd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT);"
         "fcntl.flock(fd,fcntl.LOCK_EX);print('locked',flush=True);sys.stdin.readline();"
         "open(sys.argv[2],'w').write('5\\n');fcntl.flock(fd,fcntl.LOCK_UN)",
         str(bdir / ".cursor-lock.alpha"), str(bdir / ".inbox-cursor.alpha")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        drain = subprocess.Popen([PYTHON, str(BRIDGE), "inbox", "drain", "--slug", "alpha"], cwd=repo,
                                 env=clean_env(), stdout=subprocess.PIPE, text=True)
        assert wait_for(lambda: has_open(drain.pid, bdir / ".cursor-lock.alpha"), 30)  # waiting
        holder.stdin.write("go\n")
        holder.stdin.flush()
        out = json.loads(drain.communicate(timeout=30)[0])
    finally:
        holder.kill()
        holder.wait()
    assert out["cursor"] == 5 and out["count"] == 0, out
    assert (bdir / ".inbox-cursor.alpha").read_text() == "5\n"


# ---- check decodes as Go does; a missing root; errors name the file ------------------

@pytest.mark.parametrize("data", [
    {"session_id": "sess-1", "stop_hook_active": "true"},
    {"session_id": "sess-1", "stop_hook_active": 1},
    {"session_id": "sess-1", "stop_hook_active": "false"},
    {"session_id": ["sess-1"]},
    {"session_id": "sess-1", "cwd": 7},
    ["sess-1"],
    "not json at all",
], ids=["str-true", "int-1", "str-false", "list-session", "int-cwd", "array", "not-json"])
def test_check_answers_empty_when_go_could_not_decode_the_stop_payload(repo, data):
    write_inbox(repo, *INBOX3)
    heartbeat(repo, "alpha", "sess-1")
    text = data if isinstance(data, str) else json.dumps(data)
    for extra in ((), ("--slug", "alpha")):
        code, out, err = seam("inbox", "check", "--repo-root", str(repo), *extra, cwd=repo, input=text)
        assert (code, out, err) == (0, {}, "")
    # the same payload with the right types blocks
    code, out, _ = seam("inbox", "check", "--repo-root", str(repo), cwd=repo,
                        input=json.dumps({"session_id": "sess-1", "stop_hook_active": False, "cwd": None}))
    assert out["decision"] == "block"


def test_a_repo_root_that_does_not_exist_is_an_error_naming_it(repo, tmp_path):
    missing = tmp_path / "no" / "such" / "root"
    args = {
        ("inbox", "drain", "--slug", "alpha"): 1,
        ("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", "i1", "--kind", "tell",
         "--status", "answered"): 1,
        ("inbox", "commit", "--slug", "alpha", "--cursor", "1"): 1,
        ("initiate", "--kind", "status", "--id", "s1", "--headline", "h"): 0,
        ("alert", "permission", "--reason", "r"): 0,
        ("feed", "--verb", "dispatch", "--text", "t"): 0,
        ("wake", "--host", "codex"): 1,
    }
    for argv, exit_code in args.items():
        code, out, err = seam(*argv, "--repo-root", str(missing), cwd=repo)
        assert code == exit_code and out["error"] == "--repo-root %s does not exist" % missing, (argv, out)
        assert err == "" and out.get("slug", "alpha") == "alpha"  # drain names its slug, as Go
    (tmp_path / "file").write_text("")
    code, out, _ = seam("feed", "--verb", "dispatch", "--text", "t", "--repo-root", str(tmp_path / "file"))
    assert out["error"] == "--repo-root %s is not a directory" % (tmp_path / "file")
    emit("claude", payload("claude_session_start.json", repo), repo, None, "--repo-root", str(missing))
    assert seam("inbox", "check", "--repo-root", str(missing), cwd=repo, input="{}")[1] == {}
    assert not (tmp_path / "no").exists() and not (repo / "_bridge").exists()


def test_write_failures_name_the_file_and_drain_does_not_say_ok_silently(repo):
    bdir = write_inbox(repo, *INBOX3)
    result = run_size_limited(1, "inbox", "commit", "--slug", "alpha", "--cursor", "2", cwd=repo)
    out = json.loads(result.stdout)
    assert result.returncode == 1 and out["cursor"] == 0, out
    assert out["error"].startswith("cannot write %s: " % (bdir / ".inbox-cursor.alpha")), out
    result = run_size_limited(20, "inbox", "drain", "--slug", "alpha", "--session-id", "s1", cwd=repo)
    out = json.loads(result.stdout)
    assert result.returncode == 1 and out["status"] == "ok" and out["heartbeat"] is False, out
    assert [r["line"] for r in out["records"]] == [1, 3]  # still delivered: nothing was recorded
    assert "heartbeat not written: %s: " % (bdir / "fo.alpha.json") in out["error"]
    assert "acting acks not written: %s: " % (bdir / "fo-replies.jsonl") in out["error"]
    assert not (bdir / "fo.alpha.json").exists()
    assert seam("inbox", "drain", "--slug", "alpha", cwd=repo)[0] == 0


# ---- ids: opaque intent ids, id-like flags, secrets in every field -------------------

def test_any_intent_id_bridge_wrote_can_be_acked(repo):
    """An intent id is an opaque correlator (reference 2.1): compared, never a path or argv."""
    rid = "bi:2026/07/14#1 ü"
    write_inbox(repo, {"id": rid, "ts": "2026-07-14T18:03:00Z", "kind": "tell", "text": "ping",
                       "target": "alpha"})
    heartbeat(repo, "alpha", "sess-1")
    _, out, _ = seam("inbox", "drain", "--slug", "alpha", "--session-id", "sess-1", cwd=repo)
    assert out["records"][0]["id"] == rid
    code, out, _ = seam("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", rid, "--kind", "tell",
                        "--status", "answered", cwd=repo)
    assert code == 0 and out["appended"] is True, out
    assert records(repo / "_bridge/fo-replies.jsonl")[-1]["in_reply_to_id"] == rid
    assert seam("inbox", "drain", "--slug", "alpha", "--session-id", "sess-1", cwd=repo)[1]["count"] == 0
    assert seam("inbox", "check", cwd=repo, input=payload("claude_stop.json", repo))[1] == {}
    for bad in ("i1\nforged", "i1\x01", "i1\x85"):
        code, out, _ = seam("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", bad, "--kind",
                            "tell", "--status", "answered", cwd=repo)
        assert code == 2 and out["error"].startswith("--id holds a control character (U+"), out


@pytest.mark.parametrize("argv,flag", [
    (("initiate", "--kind", "status", "--id", "s1", "--headline", "h", "--workflow", "../etc"), "--workflow"),
    (("initiate", "--kind", "status", "--id", "s1", "--headline", "h", "--entity", "a b"), "--entity"),
    (("initiate", "--kind", "status", "--id", "s1", "--headline", "h", "--ship-id", "wf/../x"), "--ship-id"),
    (("initiate", "--kind", "status", "--id", "s1", "--headline", "h", "--ship-id", "a/b/c"), "--ship-id"),
    (("initiate", "--kind", "status", "--id", "s1", "--headline", "h", "--session-id=-x"), "--session-id"),
    (("initiate", "--kind", "status", "--id", "s1", "--headline", "h", "--request-id", "r=1"), "--request-id"),
    (("initiate", "--kind", "status", "--id", "s1", "--headline", "h", "--host", "claude x"), "--host"),
    (("alert", "permission", "--reason", "r", "--workflow", "password=hunter2"), "--workflow"),
    (("alert", "permission", "--reason", "r", "--entity", "."), "--entity"),
    (("alert", "permission", "--reason", "r", "--session-id", "-rf"), "--session-id"),
    (("alert", "permission", "--reason", "r", "--host", "a/b"), "--host"),
    (("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", "i1", "--kind", "tell", "--status",
      "answered", "--request-id", "req 1"), "--request-id"),
    (("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", "i1", "--kind", "tell", "--status",
      "answered", "--host", "claude;x"), "--host"),
    (("inbox", "drain", "--slug", "alpha", "--host", "claude x"), "--host"),
    (("inbox", "drain", "--slug", "alpha", "--session-id", "a/b"), "--session-id"),
])
def test_id_flags_are_checked_like_feed_naming_the_flag(repo, argv, flag):
    write_inbox(repo, *INBOX3)
    before = files_under(repo / "_bridge")
    code, out, err = seam(*argv, cwd=repo)
    assert flag in out["error"] and err == "", out
    assert ("must match" in out["error"] or "may not start with -" in out["error"]), out
    assert code == (0 if argv[0] in ("initiate", "alert") else 2)  # usage
    assert out.get("queued", out.get("appended", out.get("status") != "failed")) is False
    assert files_under(repo / "_bridge") == before  # nothing written


def test_ship_id_takes_gos_workflow_entity_form_and_ack_status_is_checked(repo):
    code, out, _ = seam("initiate", "--kind", "gate-review", "--id", "g1", "--headline", "h",
                        "--ship-id", "prq/ship-a", cwd=repo)
    assert out["queued"] is True and records(repo / "_bridge/fo-initiate.jsonl")[0]["ship_id"] == "prq/ship-a"
    write_inbox(repo, *INBOX3)
    for kind, line, rid, status in (("tell", 1, "i1", "applied"), ("decision", 3, "i3", "answered"),
                                    ("tell", 1, "i1", "done")):
        code, out, _ = seam("inbox", "ack", "--slug", "alpha", "--line", str(line), "--id", rid,
                            "--kind", kind, "--status", status, cwd=repo)
        assert code == 2 and "--status %s is not one Bridge accepts" % status in out["error"], out
    code, out, _ = seam("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", "i1", "--kind", "tell",
                        "--status", "password=hunter2", cwd=repo)
    assert code == 2 and "hunter2" not in out["error"]
    assert not (repo / "_bridge/fo-replies.jsonl").exists()


def test_no_secret_reaches_disk_through_any_seam_field(repo):
    """Secrets passed in id-like flags are refused (nothing written); free text is redacted;
    every string egress emit writes from a hook payload is redacted, ids blanked."""
    write_inbox(repo, *INBOX3)
    env = secret_env(GITHUB_TOKEN=GHP)
    outputs = []

    def run(*args, input=None):
        result = run_bridge(*args, cwd=repo, env=env, input=input)
        assert "Traceback" not in result.stderr
        outputs.extend((result.stdout, result.stderr))
        return result

    run("inbox", "drain", "--slug", "alpha", "--host", "claude " + GHP, "--session-id", "s1")
    run("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", "i1", "--kind", "tell",
        "--status", "answered " + GHP, "--request-id", "req-" + ENV_SECRET, "--host", "claude " + GHP)
    run("initiate", "--kind", "status", "--id", "st1", "--headline", "h", "--workflow", "wf " + GHP,
        "--entity", GHP + "/", "--session-id", "password=hunter2hunter2")
    run("initiate", "--kind", "status", "--id", "st2", "--headline", "h " + GHP, "--body", ENV_SECRET)
    run("alert", "permission", "--reason", "r", "--prefix-rule", "curl,-H,Authorization: Bearer " + GHP,
        "--command", "deploy --token " + ENV_SECRET)
    run("feed", "--verb", "dispatch", "--text", "t " + GHP, "--entity", ENV_SECRET + "!")
    # an access key id of AWS's shape (AWS's own documentation id, ...EXAMPLE, is no secret and
    # stays, as gitleaks allows it)
    AWS_KEY_ID = "AKIA" + "QZ7RWNX4TL2KD5HM"
    hook = {"cwd": str(repo), "hook_event_name": "Stop password=hunter2hunter2", "session_id": GHP,
            "agent_id": AWS_KEY_ID, "tool_name": "Bash sk-proj-" + "a1B2c3D4" * 6,
            "actor_id": ENV_SECRET}
    assert run("egress", "emit", "--host", "claude", input=json.dumps(hook)).stdout == ""
    hook.update(host="codex " + GHP)
    run("egress", "emit", input=json.dumps(hook))
    assert_no_secret(repo, *outputs)
    for path in (repo / "_bridge").rglob("*"):
        if path.is_file():
            data = path.read_text()
            assert "hunter2hunter2" not in data and AWS_KEY_ID not in data, path
            assert "a1B2c3D4" * 6 not in data, path
    (event,) = records(repo / "_bridge/events.jsonl")  # the payload host was not an id: no event
    assert (event["session_id"], event["agent_id"], event["actor_id"]) == ("", "", "")
    assert event["event"] == "Stop password=[REDACTED]" and event["detail"]["tool"].startswith("Bash ")
    alert = records(repo / "_bridge/fo-alerts.jsonl")[0]
    assert alert["prefix_rule"][:2] == ["curl", "-H"] and "[REDACTED]" in alert["prefix_rule"][2]
    assert [r["id"] for r in records(repo / "_bridge/fo-initiate.jsonl")] == ["st2"]


def test_ack_text_is_redacted_before_it_is_flattened(repo):
    write_inbox(repo, *INBOX3)
    body = ["MIIEow" + "QIBAAKCAQEAx9" * 4] + ["Qk" + "x7Yb3" * 12 + str(n) for n in range(5)]
    key = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(body)  # pasted without its END line
    code, out, _ = seam("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", "i1", "--kind", "tell",
                        "--status", "answered", "--text", "here: " + key + "\nthanks", cwd=repo)
    assert code == 0
    text = records(repo / "_bridge/fo-replies.jsonl")[0]["text"]
    assert "\n" not in text and "BEGIN RSA PRIVATE KEY" in text and "[REDACTED]" in text
    assert not any(line[:20] in text for line in body), text


def test_hook_verbs_stay_silent_on_stderr_whatever_the_config_warns(repo):
    """A config key nothing reads (such as the removed seam.wake_timeout_sec) is warned about by
    the verbs people run, never by the hooks, which run on every tool call."""
    (repo / "bridge.config.json").write_text(json.dumps({"seam": {"wake_timeout_sec": 1800}}))
    write_inbox(repo, *INBOX3)
    heartbeat(repo, "alpha", "ses-1")
    emit("claude", payload("claude_session_start.json", repo), cwd=repo)  # asserts stderr == ""
    code, out, err = seam("inbox", "check", cwd=repo, input=payload("claude_stop.json", repo, session_id="ses-1"))
    assert (code, err, out["decision"]) == (0, "", "block")
    result = run_bridge("egress", "emit", "--host", "claude", cwd=repo, env=clean_env(BRIDGE_DEBUG=1),
                        input=payload("claude_session_start.json", repo))
    assert "unknown config key 'seam.wake_timeout_sec'" in result.stderr and result.stdout == ""
    code, _, err = seam("feed", "--verb", "dispatch", "--text", "t", cwd=repo)
    assert code == 0 and "unknown config key 'seam.wake_timeout_sec'" in err


# ---- reference section 8 behaviours that had no test (conformance review) ------------

def test_alert_normalizes_one_line_summaries_within_their_limits(repo):
    """bridgealert NormalizesOneLineSummaries: reason and command become one line (runs of
    whitespace and control characters -> one space), cut at 240 / 500 UTF-8 bytes."""
    code, out, _ = seam("alert", "permission", "--reason", "  sandbox\nblocked\t\tgit \r\n status \x07 ",
                        "--command", "git\tstatus\n--short", cwd=repo)
    assert code == 0 and out["queued"] is True
    rec = records(repo / "_bridge/fo-alerts.jsonl")[0]
    assert (rec["reason"], rec["command"]) == ("sandbox blocked git status", "git status --short")
    seam("alert", "permission", "--reason", "r" * 300, "--command", "c" * 600, cwd=repo)
    rec = records(repo / "_bridge/fo-alerts.jsonl")[1]
    assert (len(rec["reason"]), len(rec["command"])) == (240, 500)
    seam("alert", "permission", "--reason", "\u00e9" * 200, "--command", "x\n" * 400, cwd=repo)
    rec = records(repo / "_bridge/fo-alerts.jsonl")[2]
    assert 240 <= len(rec["reason"].encode()) <= 243 and "\n" not in rec["command"]
    assert len(rec["command"].encode()) <= 500 and rec["command"].startswith("x x x")


def verb_runs(tmp_path):
    """Every verb that writes `_bridge/`, run without --repo-root (argv, input, env)."""
    env, _ = wake_env(tmp_path)
    return [
        (("inbox", "drain", "--slug", "alpha", "--session-id", "s1"), None, None),
        (("inbox", "ack", "--slug", "alpha", "--line", "1", "--id", "i1", "--kind", "tell", "--status",
          "answered"), None, None),
        (("inbox", "commit", "--slug", "alpha", "--cursor", "1"), None, None),
        (("initiate", "--kind", "status", "--id", "st1", "--headline", "h"), None, None),
        (("alert", "permission", "--reason", "r"), None, None),
        (("feed", "--verb", "dispatch", "--text", "t"), None, None),
        (("wake", "--host", "codex", "--members", "beta", "--codex-bin", str(SEAM / "codex")), None, env),
    ]


def test_every_verb_anchors_at_the_git_root_from_a_subdirectory_and_a_linked_worktree(repo, tmp_path):
    """bridgeinitiate AnchorsAtRepoRoot, for every verb (decision 3): no --repo-root, run from
    below the root, `_bridge/` is the git root's; a linked worktree is its own root."""
    from conftest import git
    worktree = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", "-b", "side", str(worktree))
    for root in (repo, worktree):
        write_inbox(root, *INBOX3)
        heartbeat(root, "beta", "th-2", "codex")
        below = root / "sub" / "deep"
        below.mkdir(parents=True)
        for argv, data, env in verb_runs(tmp_path):
            code, out, err = seam(*argv, cwd=below, input=data, env=env)
            assert code == 0 and err == "", (root, argv, out)
        code, out, _ = seam("inbox", "check", cwd=below, input=json.dumps({"session_id": "th-2"}))
        assert out["decision"] == "block" and "workflow(s): beta." in out["reason"]
        emit("codex", payload("codex_session_start.json", below), cwd=below)
        names = {p.name for p in (root / "_bridge").iterdir()}
        assert {"fo.alpha.json", "fo-replies.jsonl", ".inbox-cursor.alpha", "fo-initiate.jsonl",
                "fo-alerts.jsonl", "fo-feed.jsonl", "wake-events.jsonl", "events.jsonl"} <= names, names
        assert [p for p in root.rglob("_bridge") if p != root / "_bridge"] == []
    resumes_logged(tmp_path / "codex.log", 2)
    # the main checkout got only its own records
    assert len(records(repo / "_bridge/fo-feed.jsonl")) == len(records(worktree / "_bridge/fo-feed.jsonl")) == 1


def test_wake_ignores_a_stale_retired_wake_cursor(repo, tmp_path):
    """TestWakeRetriesAlreadyStartedUndeliveredLines: the retired .wake-cursor.codex says lines 1
    and 2 were already started; they are undelivered, so wake resumes them anyway."""
    bdir = write_inbox(repo, {"id": "w1", "ts": "2026-07-02T11:00:00Z", "kind": "tell", "target": "a"},
                       {"id": "w2", "ts": "2026-07-02T11:01:00Z", "kind": "tell", "target": "a"})
    heartbeat(repo, "a", "session-a", "codex")
    (bdir / ".wake-cursor.codex").write_text("2\n")
    env, log = wake_env(tmp_path)
    code, out, _ = seam("wake", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert (code, out["status"], out["lines"]) == (0, "woke", [1, 2])
    assert "Pending physical inbox lines for this session: 1,2" in resumes_logged(log, 1)
    assert (bdir / ".wake-cursor.codex").read_text() == "2\n"  # neither read nor written


def test_wake_without_an_inbox_prints_the_json_noop(repo, tmp_path):
    """TestBridgeIngressWakeHiddenCLIPrintsJSONNoop: no inbox.jsonl, one JSON line, exit 0."""
    env, log = wake_env(tmp_path)
    result = run_bridge("wake", "--host", "codex", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    assert (result.returncode, result.stdout, result.stderr) == (
        0, '{"status":"noop","message":"no pending inbox records"}\n', "")
    heartbeat(repo, "a", "session-a", "codex")  # a heartbeat but still no inbox
    result = run_bridge("wake", cwd=repo, env=env)
    assert (result.returncode, json.loads(result.stdout)["status"]) == (0, "noop")
    assert sorted(p.name for p in (repo / "_bridge").iterdir()) == ["fo.a.json"] and not log.exists()


def test_wake_names_the_prompt_file_it_could_not_write(repo, tmp_path):
    write_inbox(repo, {"id": "w1", "ts": "2026-07-02T11:00:00Z", "kind": "tell", "target": "a"})
    heartbeat(repo, "a", "session-a", "codex")
    env, log = wake_env(tmp_path)
    result = run_size_limited(16, "wake", "--codex-bin", str(SEAM / "codex"), cwd=repo, env=env)
    out = json.loads(result.stdout)
    assert (result.returncode, out["status"]) == (1, "failed"), result
    assert out["error"].startswith("cannot start %s: %s" % (SEAM / "codex", tmp_path / "tmp" /
                                                             "spacedock-bridge-wake-")), out
    assert list((tmp_path / "tmp").iterdir()) == [] and not log.exists()
    assert not (repo / "_bridge" / ".wake-lock.codex").exists()


def test_a_bom_line_is_read_and_a_symlinked_bridge_dir_is_followed(repo, tmp_path):
    """README seam Decisions: an editor's byte-order mark does not hide an intent; `_bridge/`
    kept elsewhere through a symlink works (the files in it are never followed)."""
    elsewhere = tmp_path / "shared-bridge"
    elsewhere.mkdir()
    (repo / "_bridge").symlink_to(elsewhere)
    (elsewhere / "inbox.jsonl").write_bytes(b"\xef\xbb\xbf" + json.dumps(
        {"id": "b1", "ts": "2026-07-03T11:00:00Z", "kind": "tell", "text": "x", "target": "alpha"}).encode() + b"\n")
    code, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert code == 0 and [r["id"] for r in out["records"]] == ["b1"]
    assert (elsewhere / "fo.alpha.json").exists()                        # the heartbeat went there too


# ---- _bridge/ files symlinked to a file outside are never read --------------------------

def test_symlinked_inbox_to_outside_is_never_read(repo, tmp_path):
    outside = tmp_path / "outside-inbox.jsonl"
    outside.write_text("".join(json.dumps(r) + "\n" for r in INBOX3))
    bdir = repo / "_bridge"
    bdir.mkdir()
    (bdir / "inbox.jsonl").symlink_to(outside)
    heartbeat(repo, "alpha", "sess-1")
    code, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert code == 0 and out["count"] == 0 and out["records"] == []
    assert seam("inbox", "check", "--host", "claude", cwd=repo,
                input=payload("claude_stop.json", repo))[1] == {}


def test_symlinked_heartbeat_to_outside_is_never_read(repo, tmp_path):
    """fo.<slug>.json linked to a file outside naming a session: that session is not taken
    for the slug's (no Stop-hook block for it, nothing for wake to resume)."""
    write_inbox(repo, *INBOX3)
    outside = tmp_path / "outside-fo.json"
    outside.write_text(json.dumps({"session_id": "sess-1", "host": "claude",
                                   "ts": "2026-07-03T12:00:00Z", "state": "idle"}) + "\n")
    (repo / "_bridge" / "fo.alpha.json").symlink_to(outside)
    assert seam("inbox", "check", "--host", "claude", cwd=repo,
                input=payload("claude_stop.json", repo))[1] == {}


def test_an_unclosed_deep_inbox_line_is_one_malformed_line(repo):
    """A line of 100,000 opening brackets (never closed) nests past the JSON limit: it is a
    malformed line that consumes its number, and the intent after it is still delivered.
    Before, only closed pairs were counted, the decoder hit the recursion limit, and every
    drain ended in an internal error (no answer), so nothing after that line was delivered."""
    write_inbox(repo, "[" * 100000, INBOX3[0])
    code, out, err = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert code == 0 and out["status"] == "ok", (out, err)
    assert [r["id"] for r in out["records"]] == ["i1"] and out["high_water"] == 2
    code, out, _ = seam("inbox", "check", "--slug", "alpha", cwd=repo, input="{}")
    assert code == 0 and out["decision"] == "block"


def test_a_config_error_stops_the_verbs_that_write_text(repo):
    """A config that cannot be read (here a watch key out of range) used to fall back to the
    default redactor without a word: the user's own redaction pattern was dropped and the
    secret it names was written to _bridge/. Now each verb that writes free text refuses,
    naming the file and the key: initiate/alert/feed answer so and exit 0 (they never block
    the agent), ack and wake exit 2 as any config error, egress emit records nothing."""
    config = repo / "bridge.config.json"
    config.write_text(json.dumps({"redaction_patterns": ["ACME-[0-9]{6}"], "poll_sec": 0}))
    why = "%s: poll_sec must be a number between 0.05 and 3600, got 0" % config
    write_inbox(repo, INBOX3[0])
    secret = "key ACME-123456 rotated"
    for argv, answer, exit_code in [
            (["feed", "--verb", "advance", "--text", secret], {"appended": False}, 0),
            (["initiate", "--kind", "status", "--id", "s1", "--headline", secret], {"queued": False}, 0),
            (["alert", "permission", "--reason", secret], {"queued": False}, 0),
            (["inbox", "ack", "--slug", "alpha", "--line", "1", "--kind", "tell", "--status", "answered",
              "--id", "i1", "--text", secret], {"appended": False}, 2),
            (["wake", "--host", "codex"], {"status": "failed"}, 2)]:
        code, out, _ = seam(*argv, cwd=repo)
        assert code == exit_code and out.get("error") == why, (argv, out)
        assert {k: out[k] for k in answer} == answer
    emit("claude", payload("claude_post_tool_use_read_ensign.json", repo, tool_name=secret), cwd=repo)
    for path in (repo / "_bridge").iterdir():
        assert "ACME-123456" not in path.read_text(errors="replace"), path
    assert not (repo / "_bridge" / "events.jsonl").exists()


def test_check_with_a_config_error_says_so_instead_of_naming_the_default_command(repo):
    """The Stop check tells the agent how to run bridge.py (seam.command). A config that
    cannot be read used to make it name the default `python3 scripts/bridge.py` without a
    word; now it still blocks (intent is queued) but says the config error, file and key."""
    config = repo / "bridge.config.json"
    config.write_text(json.dumps({"seam": {"command": "./tools/bridge"}}))
    write_inbox(repo, INBOX3[0])
    code, out, err = seam("inbox", "check", "--slug", "alpha", cwd=repo, input="{}")
    assert code == 0 and "run `./tools/bridge inbox drain" in out["reason"], out
    config.write_text(json.dumps({"seam": {"command": "./tools/bridge"}, "poll_sec": 0}))
    code, out, err = seam("inbox", "check", "--slug", "alpha", cwd=repo, input="{}")
    assert (code, err, out["decision"]) == (0, "", "block")
    assert "%s: poll_sec must be a number between 0.05 and 3600, got 0" % config in out["reason"]
    assert "scripts/bridge.py" not in out["reason"] and "1 queued" in out["reason"]


def test_a_symlinked_sessions_folder_is_never_read(repo, tmp_path):
    """_bridge/sessions linked to a folder elsewhere is not read, as it is not written: a
    marker there does not make the Stop check block a session (nor name the session wake
    resumes)."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "claude-s1.json").write_text(json.dumps(
        {"actor_id": "claude-s1", "host": "claude", "session_id": "s1", "workflow": "alpha",
         "entity": "e1"}) + "\n")
    bdir = write_inbox(repo, INBOX3[0])
    (bdir / "sessions").symlink_to(outside)
    code, out, _ = seam("inbox", "check", cwd=repo, input=json.dumps({"session_id": "s1"}))
    assert code == 0 and out == {}
    (bdir / "sessions").unlink()
    (bdir / "sessions").mkdir()
    (bdir / "sessions" / "claude-s1.json").write_text((outside / "claude-s1.json").read_text())
    code, out, _ = seam("inbox", "check", cwd=repo, input=json.dumps({"session_id": "s1"}))
    assert code == 0 and out["decision"] == "block"  # the same marker inside is read


@pytest.mark.parametrize("digits", ["9" * 5000, "99999999999999999999"])
def test_a_cursor_beyond_a_go_int_reads_as_zero(repo, digits):
    """A cursor file too large for Go's Atoi reads as 0, as in Go (unparseable). Python's
    int() refuses more than 4,300 digits with a ValueError: drain and commit were internal
    errors with no answer, and the Stop check answered {} for queued intent."""
    bdir = write_inbox(repo, INBOX3[0])
    (bdir / ".inbox-cursor.alpha").write_text(digits + "\n")
    code, out, _ = seam("inbox", "drain", "--slug", "alpha", cwd=repo)
    assert code == 0 and out["cursor"] == 0 and [r["id"] for r in out["records"]] == ["i1"]
    code, out, _ = seam("inbox", "check", "--slug", "alpha", cwd=repo, input="{}")
    assert out["decision"] == "block"
    code, out, _ = seam("inbox", "commit", "--slug", "alpha", "--cursor", "1", cwd=repo)
    assert code == 0 and out == {"cursor": 1}
    for argv in (["inbox", "commit", "--slug", "alpha", "--cursor", digits],
                 ["inbox", "ack", "--slug", "alpha", "--line", digits, "--kind", "tell",
                  "--status", "answered", "--id", "i1"]):
        code, out, err = seam(*argv, cwd=repo)
        assert code == 2 and "must be" in out["error"] and err == "", (argv, out, err)
