"""`bridge.py proxy --watch`: a live session in front of a copy of the fixture MCP server whose
source file the test edits. Each edit burst restarts the server once (not a crash), the client's
session goes on, requests in progress get close_grace_sec, and doctor:reloaded carries the
tool-list diff. Events come from tests/proxy_harness.py's recording stand-in."""
import json
import os
import queue
import shutil
import sys
import time

import pytest

from conftest import FIXTURES, PYTHON, load_bridge
from test_proxy import Session

FAST = {"lifecycle": {"cooldown": 20}}


def server_copy(tmp_path):
    folder = tmp_path / "srv"
    folder.mkdir()
    shutil.copy(FIXTURES / "mcp_server.py", folder / "server.py")
    return folder


def edit(path, tools):
    """Rewrite the copy with another EXTRA_TOOLS line (the way an editor saves: whole file)."""
    text = path.read_text()
    start = text.index("EXTRA_TOOLS = ")
    end = text.index("\n", start)
    path.write_text(text[:start] + "EXTRA_TOOLS = %r" % (tools,) + text[end:])


def start(tmp_path, folder, grace=2.0, debounce=150, by_cli=False, server=None):
    config = dict(FAST, proxy={"close_grace_sec": grace}, doctor={"watch_debounce_ms": debounce})
    args = ["--watch", str(folder)] if by_cli else []
    if not by_cli:
        config["doctor"]["watch"] = [str(folder)]
    s = Session(tmp_path, command=[PYTHON, str(server or folder / "server.py"), "--log", str(tmp_path / "server.jsonl")],
                harness=True, config=config, args=args)
    s.initialize()
    deadline = time.time() + 10                             # the watch has its first look
    while "bridge proxy: info: watch: " not in s.err() and time.time() < deadline:
        time.sleep(0.02)
    mid = s.request("tools/list")
    assert "echo" in [t["name"] for t in s.reply()["result"]["tools"]] and mid
    return s


def test_a_burst_of_saves_reloads_once_and_the_session_goes_on(tmp_path):
    folder = server_copy(tmp_path)
    s = start(tmp_path, folder, debounce=1000, by_cli=True)
    try:
        first = s.pids()
        assert len(first) == 1
        for n in range(5):          # five saves over 0.4 s: several scans see them, one reload follows
            edit(folder / "server.py", {"added": {"type": "object"}, "crash": None,
                                        "echo": {"type": "object", "n": n}})
            time.sleep(0.1 * (n < 4))
        last_save = time.time()
        done = s.wait_event("doctor:reloaded")[0]["data"]
        # the restart waited out the debounce from the last save, not from the first one seen
        assert s.event_list("doctor:reloading")[0]["ts"] >= (last_save + 1.0 - 0.1) * 1000
        assert done["file"] == str(folder / "server.py")
        assert done["added"] == ["added"] and done["removed"] == ["crash"] and done["changed"] == ["echo"]
        assert done["generation"] == 2
        # the same client, on the same pipes, is answered by the new server
        mid = s.call("echo", text="after")
        got = s.recv()
        notes = []
        while "id" not in got:
            notes.append(got["method"])
            got = s.recv()
        assert got["id"] == mid and got["result"]["content"][0]["text"] == "after"
        assert "notifications/tools/list_changed" in notes
        mid = s.request("tools/list")
        names = [t["name"] for t in s.reply()["result"]["tools"]]
        assert "added" in names and "crash" not in names
        assert len(s.event_list("doctor:reloading")) == 1 and len(s.event_list("doctor:reloaded")) == 1
        assert s.event_list("doctor:crashed") == []
        restarting = s.event_list("doctor:restarting")
        assert [e["data"]["reason"] for e in restarting] == ["reload"]
        assert len(s.pids()) == 2 and s.pids()[0] == first[0]
        # a second edit later is a second reload, compared with the list the first one saw
        edit(folder / "server.py", {"added": {"type": "object"}})
        second = s.wait_event("doctor:reloaded", count=2)[1]["data"]
        assert second["added"] == ["crash"] and second["removed"] == [] and second["changed"] == ["echo"]
    finally:
        s.close()


def test_excluded_files_do_not_reload(tmp_path):
    folder = server_copy(tmp_path)
    (folder / "__pycache__").mkdir()
    (folder / ".git").mkdir()
    (folder / ".venv").mkdir()
    (folder / "notes.txt").write_text("watched\n")
    s = start(tmp_path, folder)
    try:
        # changes the defaults exclude, made before a watched one: a scan that sees the watched
        # change has seen these too, so they would be in that reload (or one before it)
        (folder / "__pycache__" / "server.cpython-311.pyc").write_bytes(b"\0" * 10)
        (folder / ".git" / "HEAD").write_text("ref: refs/heads/x\n")
        (folder / ".pytest_cache").mkdir()                  # the server's own tests run meanwhile
        (folder / ".pytest_cache" / "lastfailed").write_text("{}")
        (folder / ".venv" / "pkg.py").write_text("installed")
        (folder / "server.py.swp").write_bytes(b"swap")
        (folder / "server.py~").write_text("backup")
        (folder / ".#server.py").write_text("lock")
        (folder / "old.pyc").write_bytes(b"\0")
        (folder / "notes.txt").write_text("changed\n")
        done = s.wait_event("doctor:reloaded")[0]["data"]
        assert done["files"] == [str(folder / "notes.txt")]
        assert done["added"] == done["removed"] == done["changed"] == []
        assert len(s.event_list("doctor:reloading")) == 1
    finally:
        s.close()


def test_requests_in_progress_get_the_grace_then_an_error(tmp_path):
    folder = server_copy(tmp_path)
    s = start(tmp_path, folder, grace=5.0)
    try:
        slow = s.call("slow", sec=0.5)                      # answered within the grace
        edit(folder / "server.py", {"added": {"type": "object"}})
        s.wait_event("doctor:reloading")
        held = s.call("echo", text="held")                  # sent during the grace: held, then relayed
        got = s.reply()
        assert got["id"] == slow and "result" in got, got
        got = s.reply()
        assert got["id"] == held and got["result"]["content"][0]["text"] == "held", got
        s.wait_event("doctor:reloaded")
    finally:
        s.close()
    tmp2 = tmp_path / "past"
    tmp2.mkdir()
    folder = server_copy(tmp2)
    s = start(tmp2, folder, grace=0.3)
    try:
        hang = s.call("hang")                               # never answers: past the grace
        edit(folder / "server.py", {"added": {"type": "object"}})
        got = s.reply()
        assert got["id"] == hang and got["error"]["data"]["reason"] == "reload", got
        s.wait_event("doctor:reloaded")
        mid = s.call("echo", text="next")
        assert s.reply()["id"] == mid
        assert s.event_list("doctor:crashed") == []
    finally:
        s.close()


def test_a_watched_file_saved_by_rename_reloads_each_time(tmp_path):
    """Editors save by writing a new file and renaming it over the old one: the second save
    must be seen as well as the first (an inotify watch on the replaced file is gone)."""
    folder = server_copy(tmp_path)
    target = folder / "server.py"
    s = start(tmp_path, target, by_cli=True, server=target)
    try:
        for n, tools in enumerate(({"one": {"type": "object"}}, {"two": {"type": "object"}})):
            new = folder / ".server.py.new"
            text = target.read_text()
            at = text.index("EXTRA_TOOLS = ")
            new.write_text(text[:at] + "EXTRA_TOOLS = %r" % (tools,) + text[text.index("\n", at):])
            os.replace(str(new), str(target))
            done = s.wait_event("doctor:reloaded", count=n + 1)[n]["data"]
            assert done["added"] == list(tools) and done["files"] == [str(target)], done
        mid = s.call("echo", text="still")
        assert s.reply()["id"] == mid
    finally:
        s.close()


@pytest.mark.parametrize("how", ["inotify", "polling"])
def test_watch_sees_new_folders_and_deletions_but_not_excluded_names(tmp_path, how, monkeypatch):
    """ProxyWatch itself, both ways it watches (inotify is Linux only)."""
    bridge = load_bridge()
    if how == "polling":
        monkeypatch.setattr(bridge.ProxyWatch, "inotify", lambda self: (None, None))
    elif not sys.platform.startswith("linux"):
        pytest.skip("inotify is Linux only")
    (tmp_path / "a.py").write_text("a")
    got = queue.Queue()
    watch = bridge.ProxyWatch([str(tmp_path)], bridge.CONFIG_DEFAULTS["doctor"]["watch_exclude"], 0.05, got.put)
    watch.start()
    try:
        assert watch.watching.wait(10) and watch.how == how
        (tmp_path / "node_modules").mkdir()
        (tmp_path / "node_modules" / "x.js").write_text("x")
        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "b.py").write_text("b")
        files = set(got.get(timeout=10))
        assert str(tmp_path / "pkg" / "b.py") in files or str(tmp_path / "pkg") in files
        assert not [f for f in files if "node_modules" in f]
        (tmp_path / "pkg" / "c.py").write_text("c")              # in the new folder: watched too
        assert str(tmp_path / "pkg" / "c.py") in got.get(timeout=10)
        (tmp_path / "a.py").unlink()
        assert str(tmp_path / "a.py") in got.get(timeout=10)
    finally:
        watch.stop()


def test_restart_tool_is_offered_only_when_enabled_and_restarts(tmp_path):
    folder = server_copy(tmp_path)
    config = dict(FAST, doctor={"restart_tool": True})
    s = Session(tmp_path, command=[PYTHON, str(folder / "server.py"), "--log", str(tmp_path / "server.jsonl")],
                harness=True, config=config)
    try:
        s.initialize()
        s.request("tools/list")
        tools = s.reply()["result"]["tools"]
        assert tools[-1]["name"] == "bridge_restart_server" and "echo" in [t["name"] for t in tools]
        edit(folder / "server.py", {"added": {"type": "object"}})        # not watched: no reload
        mid = s.call("bridge_restart_server")
        got = s.reply()
        assert got["id"] == mid and got["result"]["isError"] is False, got
        assert "tools added: added; removed: none; changed: none" in got["result"]["content"][0]["text"]
        assert len(s.pids()) == 2
        assert not [line for line in s.received() if "bridge_restart_server" in line]   # never relayed
        done = s.event_list("doctor:reloaded")[0]["data"]
        assert done["file"] == "bridge_restart_server" and done["added"] == ["added"]
        assert s.event_list("doctor:crashed") == []
    finally:
        s.close()
    plain = tmp_path / "plain"
    plain.mkdir()
    s = Session(plain, harness=True, config=FAST)
    try:
        s.initialize()
        s.request("tools/list")
        assert "bridge_restart_server" not in [t["name"] for t in s.reply()["result"]["tools"]]
        mid = s.call("bridge_restart_server")                  # relayed: the server does not know it
        assert s.reply()["id"] == mid
        assert [line for line in s.received() if "bridge_restart_server" in line]
    finally:
        s.close()


def test_a_server_that_never_lists_its_tools_does_not_stall_later_reloads(tmp_path):
    folder = server_copy(tmp_path)
    s = start(tmp_path, folder)
    try:
        # the next generation leaves tools/list unanswered (a method it ignores)
        text = (folder / "server.py").read_text().replace("if mid is None:  ",
                                                          "if mid is None or method == 'tools/list':  ")
        (folder / "server.py").write_text(text)
        s.wait_event("doctor:ready", count=2)
        edit(folder / "server.py", {"added": {"type": "object"}})
        first = s.wait_event("doctor:reloaded")[0]["data"]
        assert "tools/list" in first["error"] and first["generation"] == 2
        s.wait_event("doctor:ready", count=3)
        assert len(s.event_list("doctor:reloading")) == 2
        mid = s.call("echo", text="on")
        assert s.reply()["id"] == mid
    finally:
        s.close()


def test_a_client_without_initialize_is_reloaded_through_the_discover_probe(tmp_path):
    """A 2026-07-28 client sends no initialize: the new server is probed with server/discover,
    then listed; the client's next request is answered by it."""
    folder = server_copy(tmp_path)
    config = dict(FAST, doctor={"watch": [str(folder)], "watch_debounce_ms": 100})
    s = Session(tmp_path, command=[PYTHON, str(folder / "server.py"), "--log", str(tmp_path / "server.jsonl")],
                harness=True, config=config)
    try:
        mid = s.request("server/discover", {"supportedVersions": ["2026-07-28"]})
        assert s.reply()["id"] == mid
        s.request("tools/list")
        s.reply()
        deadline = time.time() + 10
        while "bridge proxy: info: watch: " not in s.err() and time.time() < deadline:
            time.sleep(0.02)
        edit(folder / "server.py", {"added": {"type": "object"}})
        done = s.wait_event("doctor:reloaded")[0]["data"]
        assert done["added"] == ["added"] and done["generation"] == 2
        assert s.wait_event("doctor:ready", count=2)[1]["data"]["signal"] == "answered server/discover"
        mid = s.call("echo", text="2026")
        assert s.reply()["id"] == mid
    finally:
        s.close()


def test_bad_watch_settings_exit_2_naming_them(tmp_path):
    from conftest import clean_env, run_bridge
    (tmp_path / "cfg.json").write_text('{"doctor": {"watch_exclude": [".git", 3]}}')
    env = clean_env(BRIDGE_OBS_ENABLED="false")
    got = run_bridge("proxy", "--config", tmp_path / "cfg.json", "--watch", tmp_path, "--", PYTHON, "-c", "0",
                     env=env, cwd=tmp_path)
    assert got.returncode == 2 and "doctor.watch_exclude" in got.stderr and "3" in got.stderr, got.stderr
    got = run_bridge("proxy", "--watch", tmp_path / "missing", "--", PYTHON, "-c", "0", env=env, cwd=tmp_path)
    assert got.returncode == 2 and "missing" in got.stderr and "does not exist" in got.stderr, got.stderr


def test_a_server_that_writes_into_the_watched_tree_does_not_reload_forever(tmp_path):
    """A server that writes a file under a watched folder at every start (a log, a database, a
    cache) restarted itself continuously: the same files changing right after each of two reloads
    in a row space the next reloads PROXY_RELOAD_PACE (10 s) apart, with a warning naming them and
    doctor.watch_exclude. A save is never dropped: one of another file reloads at once."""
    folder = server_copy(tmp_path)
    stamp = folder / "state.db"
    config = dict(FAST, doctor={"watch": [str(folder)], "watch_debounce_ms": 100},
                  proxy={"stats_interval_sec": 0.2})
    command = ["sh", "-c", 'echo started >> "$0"; exec "$@"', str(stamp), PYTHON, str(folder / "server.py"),
               "--log", str(tmp_path / "server.jsonl")]
    s = Session(tmp_path, command=command, harness=True, config=config)
    try:
        s.initialize()
        deadline = time.time() + 10
        while "bridge proxy: info: watch: " not in s.err() and time.time() < deadline:
            time.sleep(0.02)
        edit(folder / "server.py", {"added": {"type": "object"}})
        deadline = time.time() + 20
        while "doctor.watch_exclude" not in s.err() and time.time() < deadline:
            time.sleep(0.05)
        warning = [line for line in s.err().splitlines() if "doctor.watch_exclude" in line]
        assert warning and str(stamp) in warning[0], s.err()
        reloads = len(s.event_list("doctor:reloading"))
        assert reloads <= 4, reloads
        s.wait_event("doctor:reloaded", count=reloads)
        s.past(2.0)                                         # twenty debounces: the loop waits
        mid = s.call("echo", text="settled")
        assert s.reply()["id"] == mid
        assert len(s.event_list("doctor:reloading")) == reloads
        # a save of the server's own code meanwhile reloads at once, the waiting change with it
        edit(folder / "server.py", {"later": {"type": "object"}})
        done = s.wait_event("doctor:reloaded", count=reloads + 1, timeout=5)[reloads]["data"]
        assert done["added"] == ["later"] and done["files"] == sorted([str(stamp), str(folder / "server.py")]), done
    finally:
        s.close()


def test_a_typo_saved_waits_for_the_fix_instead_of_ending_the_proxy(tmp_path):
    """A save that makes the server crash at start (a syntax error) used to crash it maxRestarts
    times and end bridge.py with doctor:fatal, so the client lost the server for good. With
    --watch the proxy gives up restarting only until the next change: the fix, saved, starts the
    server, the reload completes, and its crashes count afresh."""
    folder = server_copy(tmp_path)
    config = {"lifecycle": {"cooldown": 20, "maxRestarts": 2}, "doctor": {"watch": [str(folder)],
                                                                        "watch_debounce_ms": 100}}
    s = Session(tmp_path, command=[PYTHON, str(folder / "server.py"), "--log", str(tmp_path / "server.jsonl")],
                harness=True, config=config)
    try:
        s.initialize()
        deadline = time.time() + 10
        while "bridge proxy: info: watch: " not in s.err() and time.time() < deadline:
            time.sleep(0.02)
        good = (folder / "server.py").read_text()
        (folder / "server.py").write_text(good.replace("import json\n", "import json(\n", 1))
        fatal = s.wait_event("doctor:fatal")[0]["data"]
        assert fatal["waitingForChange"] is True and s.proc.poll() is None
        assert "not restarted until a watched file changes" in s.err()
        assert s.ctl("bridge:stats")[0]["data"]["result"]["state"] == "waiting"
        mid = s.call("echo", text="held")                  # held while no server runs
        starts = len(s.pids())
        (folder / "server.py").write_text(good)
        assert s.reply()["id"] == mid
        done = s.wait_event("doctor:reloaded")[0]["data"]
        assert "error" not in done and len(s.pids()) == starts + 1, done
        for n in range(2):                                  # the typo's crashes no longer count
            mid = s.call("crash", code=3)
            assert s.reply()["error"]["data"]["reason"] == "crashed"
            s.wait_event("doctor:ready", count=len(s.event_list("doctor:ready")) + 1)
        assert len(s.event_list("doctor:fatal")) == 1
    finally:
        s.close()


@pytest.mark.parametrize("how", ["inotify", "polling"])
def test_a_watched_folder_removed_and_made_again_is_still_watched(tmp_path, how, monkeypatch):
    """`rm -rf dist && tsc`: a build removes the watched output folder and writes it again. The
    new folder's files are changes like any other (inotify loses its watch with the folder)."""
    bridge = load_bridge()
    if how == "polling":
        monkeypatch.setattr(bridge.ProxyWatch, "inotify", lambda self: (None, None))
    elif not sys.platform.startswith("linux"):
        pytest.skip("inotify is Linux only")
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "index.js").write_text("1")
    got = queue.Queue()
    watch = bridge.ProxyWatch([str(dist)], [], 0.05, got.put)
    watch.start()
    try:
        assert watch.watching.wait(10) and watch.how == how
        shutil.rmtree(str(dist))
        assert str(dist / "index.js") in got.get(timeout=10)
        dist.mkdir()
        (dist / "index.js").write_text("2")
        assert str(dist / "index.js") in got.get(timeout=10)
        (dist / "index.js").write_text("3")
        assert str(dist / "index.js") in got.get(timeout=10)
    finally:
        watch.stop()


def test_a_request_in_progress_that_waits_on_the_client_finishes_within_the_grace(tmp_path):
    """A tool call that asks the client something (sampling, elicitation) while a reload waits for
    it: the client's answer reaches the old server (holding it would fail the call the grace is
    for), the call is answered, and the restart follows it at once: the grace is far longer than
    the wait for doctor:reloaded, so a restart that waited the grace out is never seen."""
    folder = server_copy(tmp_path)
    s = start(tmp_path, folder, grace=300.0)
    try:
        mid = s.call("ask", id="q1")
        asked = s.recv()
        assert asked["id"] == "q1" and asked["method"] == "sampling/createMessage"
        edit(folder / "server.py", {"added": {"type": "object"}})
        s.wait_event("doctor:reloading")
        s.send({"jsonrpc": "2.0", "id": "q1", "result": {"role": "assistant",
                                                         "content": {"type": "text", "text": "yes"}}})
        got = s.reply()
        assert got["id"] == mid and "result" in got, got
        assert "error" not in s.wait_event("doctor:reloaded")[0]["data"]
        old, _new = s.pids()
        answers = [json.loads(line) for line in s.received(old) if '"result"' in line]
        assert [(a["id"], a["result"]["content"]["text"]) for a in answers] == [("q1", "yes")]
    finally:
        s.close()


def test_a_tool_list_whose_pages_never_end_does_not_keep_the_reload_asking(tmp_path):
    """A pagination bug (every page names the same nextCursor) made the reload ask for the next
    page for ever, as fast as the server answered: it ends with doctor:reloaded's error."""
    folder = server_copy(tmp_path)
    s = start(tmp_path, folder)
    try:
        text = (folder / "server.py").read_text()
        assert text.count("if schema is not None]}") == 1
        (folder / "server.py").write_text(text.replace("if schema is not None]}",
                                                       "if schema is not None], 'nextCursor': 'again'}"))
        done = s.wait_event("doctor:reloaded")[0]["data"]
        assert "again" in done["error"], done
        mid = s.call("echo", text="on")                # the server reads in order: asked before
        assert s.reply()["id"] == mid                  # the echo, an ask for a page is logged now
        asked = [line for line in s.received(s.pids()[1]) if '"cursor"' in line]
        assert len(asked) == 1, len(asked)
    finally:
        s.close()


@pytest.mark.parametrize("end", ["doctor:kill", "stdin EOF"])
def test_a_restart_tool_call_is_answered_when_its_reload_cannot_end(tmp_path, end):
    """bridge_restart_server is answered when the new server has listed its tools; if no server
    will (doctor:kill, shutdown) before that, the call gets the error reply like any request."""
    folder = server_copy(tmp_path)
    text = (folder / "server.py").read_text()
    (folder / "server.py").write_text(text.replace("if mid is None:  ", "if mid is None or method == 'tools/list':  "))
    s = Session(tmp_path, command=[PYTHON, str(folder / "server.py"), "--log", str(tmp_path / "server.jsonl")],
                harness=True, config=dict(FAST, doctor={"restart_tool": True}))
    try:
        s.initialize()
        mid = s.call("bridge_restart_server")
        s.wait_event("doctor:ready", count=2)               # its tools/list goes unanswered
        if end == "doctor:kill":
            s.ctl("doctor:kill")
        else:
            s.proc.stdin.close()
        got = s.reply()
        assert got["id"] == mid and got["error"]["data"]["reason"] == ("kill" if end == "doctor:kill" else
                                                                        "shutdown"), got
        if end == "doctor:kill":
            s.ctl("doctor:restart")
            s.wait_event("doctor:ready", count=3)
            ping = s.request("ping")
            assert s.reply()["id"] == ping                  # the call is not answered a second time
    finally:
        s.close()


def test_polling_sees_every_file_beside_a_dangling_symlink(tmp_path):
    """An editor's lock file (`.#b.py -> user@host.pid`) is a dangling symlink: the polling
    scan lost every file listed after it in its folder, so saves to them reloaded nothing."""
    bridge = load_bridge()
    for name in ("a.py", "c.py", "z.py"):
        (tmp_path / name).write_text(name)
    os.symlink("user@host.1234", str(tmp_path / ".#b.py"))
    watch = bridge.ProxyWatch([str(tmp_path)], [], 0.05, lambda files: None)
    seen = set(os.path.basename(path) for path in watch.snapshot())
    assert {"a.py", "c.py", "z.py", ".#b.py"} <= seen, seen


def test_a_tool_name_with_a_lone_surrogate_does_not_end_the_proxy(tmp_path):
    """A server may name a tool "\\ud800x" (valid JSON, no valid UTF-8): adding
    bridge_restart_server to that answer, and telling its caller what changed, ended the proxy
    with an internal error (UnicodeEncodeError); now the escape goes back as it came."""
    folder = server_copy(tmp_path)
    s = Session(tmp_path, command=[PYTHON, str(folder / "server.py"), "--log", str(tmp_path / "server.jsonl")],
                harness=True, config=dict(FAST, doctor={"restart_tool": True}))
    try:
        s.initialize()
        edit(folder / "server.py", {"\ud800x": {"type": "object"}})     # the next generation has it
        mid = s.call("bridge_restart_server")
        got = s.reply()
        assert got["id"] == mid and got["result"]["isError"] is False, got
        s.request("tools/list")
        names = [t["name"] for t in s.reply()["result"]["tools"]]
        assert "\ud800x" in names and names[-1] == "bridge_restart_server", names
    finally:
        s.close()


def test_a_restart_tool_call_is_answered_when_the_new_server_crashes_at_start(tmp_path):
    """An agent that saved a server which dies as it starts and then called bridge_restart_server
    waited until the next save (--watch) or doctor:fatal; it is told at the first crash."""
    folder = server_copy(tmp_path)
    s = Session(tmp_path, command=[PYTHON, str(folder / "server.py"), "--log", str(tmp_path / "server.jsonl")],
                harness=True, config=dict(FAST, doctor={"restart_tool": True}))
    try:
        s.initialize()
        (folder / "server.py").write_text("raise SystemExit(3)\n")
        mid = s.call("bridge_restart_server")
        got = s.reply()
        assert got["id"] == mid and got["result"]["isError"] is True, got
        assert "crashed" in got["result"]["content"][0]["text"], got
    finally:
        s.close()
