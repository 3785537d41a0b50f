"""`bridge.py proxy` and an MCP 2026-07-28 client across restarts: no handshake, per-request `_meta`,
no `ping`, and `subscriptions/listen` streams that a restarted server knows nothing about.
The server is fixtures/mcp_server.py --modern, a strict 2026-07-28 server (it refuses a request
without the protocol version and client capabilities in `_meta`, and knows no ping); a 2025-era
session (initialize) against the plain fixture is the comparison where the eras differ."""
import json
import time

import pytest

from conftest import PYTHON
from test_proxy import HEALTH, INIT, session  # noqa: F401  (session: the fixture)
from test_proxy_reload import server_copy

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "modern-client", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
SUB = "io.modelcontextprotocol/subscriptionId"


def ask(s, method, params=None, mid=None):
    """A 2026-07-28 request: the protocol fields in params._meta."""
    return s.request(method, dict(params or {}, _meta=META), mid=mid)


def call(s, tool, **args):
    return ask(s, "tools/call", {"name": tool, "arguments": args})


def until_reply(s, mid, timeout=10):
    """Messages up to the answer to `mid`: (notifications before it, the answer)."""
    notes, got = [], s.recv(timeout)
    while got.get("id") != mid or "method" in got:
        notes.append(got)
        got = s.recv(timeout)
    return notes, got


def ready(s, gen):
    """The doctor:ready event of generation `gen` (waited for)."""
    for _ in range(500):
        got = [e["data"] for e in s.event_list("doctor:ready") if e["data"]["generation"] == gen]
        if got:
            return got[0]
        time.sleep(0.02)
    raise AssertionError("generation %d never ready: %s" % (gen, s.event_list()))


def listen_lines(s, pid, wait=False):
    """The subscriptions/listen requests generation `pid` received (wait: until there is one)."""
    deadline = time.time() + (10 if wait else 0)
    while True:
        got = [line for line in s.received(pid) if '"subscriptions/listen"' in line]
        if got or time.time() >= deadline:
            return got
        time.sleep(0.02)


def test_listen_is_re_established_after_a_crash_and_a_reload(tmp_path, session):  # noqa: F811
    folder = server_copy(tmp_path)
    s = session(command=[PYTHON, str(folder / "server.py"), "--modern", "--log", str(tmp_path / "server.jsonl")],
                harness=True, config={"lifecycle": {"cooldown": 20},
                                      "doctor": {"watch": [str(folder)], "watch_debounce_ms": 100}})
    mid = s.request("tools/list")                                         # the fixture is strict
    assert s.reply()["error"]["code"] == -32602 and mid
    mid = ask(s, "tools/list")
    assert "listchanged" in [t["name"] for t in s.reply()["result"]["tools"]] and mid
    s.send({"jsonrpc": "2.0", "id": "sub-1", "method": "subscriptions/listen",
            "params": {"_meta": META, "notifications": {"toolsListChanged": True, "promptsListChanged": True}}})
    ack = s.recv()
    assert ack["method"] == "notifications/subscriptions/acknowledged" and ack["params"]["_meta"][SUB] == "sub-1"
    assert ack["params"]["notifications"] == {"toolsListChanged": True}     # what this server honours
    sent = listen_lines(s, s.pids()[0])
    # a crash: the call in flight gets the error reply, the open subscription does not
    mid = call(s, "crash", code=3)
    notes, got = until_reply(s, mid)
    assert got["error"]["data"]["reason"] == "crashed" and notes == []
    assert ready(s, 2)["signal"] == "answered server/discover"              # without a client request
    second = s.wait_pids(2)[1]
    assert listen_lines(s, second, wait=True) == sent                               # the same request, same id
    probe = json.loads(s.received(second)[0])
    assert probe["method"] == "server/discover" and probe["params"]["_meta"] == META
    # the new acknowledgement is the one the client had: swallowed; the lists may have changed
    note = s.recv()
    assert note == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": {"_meta": {SUB: "sub-1"}}}
    mid = call(s, "state")
    notes, got = until_reply(s, mid)
    assert json.loads(got["result"]["content"][0]["text"])["listens"] == ["sub-1"] and notes == []
    mid = call(s, "listchanged")                                         # the new server's own, relayed
    notes, got = until_reply(s, mid)
    assert [n["params"]["_meta"][SUB] for n in notes] == ["sub-1"] and "result" in got
    # a reload: the tool-list diff is asked of the strict server with _meta, and the client hears of
    # it; the new server honours more of the filter, so its acknowledgement is relayed this time
    text = (folder / "server.py").read_text()
    honour = '{"toolsListChanged": True} if wanted.get("toolsListChanged") is True else {}'
    assert honour in text
    at = text.index("EXTRA_TOOLS = ")
    text = text[:at] + "EXTRA_TOOLS = {'added': {'type': 'object'}}" + text[text.index("\n", at):]
    (folder / "server.py").write_text(text.replace(honour, "wanted"))
    done = s.wait_event("doctor:reloaded")[0]["data"]
    assert "error" not in done and done["added"] == ["added"] and done["generation"] == 3, done
    third = s.wait_pids(3)[2]
    owned = [json.loads(line) for line in s.received(third) if '"id":"bridge.py-' in line]
    assert [m["method"] for m in owned] == ["server/discover", "tools/list"]
    assert all(m["params"]["_meta"] == META for m in owned)
    assert listen_lines(s, third, wait=True) == sent
    ack = s.recv()
    assert ack["method"] == "notifications/subscriptions/acknowledged" and ack["params"]["notifications"] == {
        "toolsListChanged": True, "promptsListChanged": True}
    assert [(n["method"], n["params"]) for n in (s.recv(), s.recv())] == [
        ("notifications/%s/list_changed" % kind, {"_meta": {SUB: "sub-1"}}) for kind in ("tools", "prompts")]
    assert not [line for line in s.received() if '"method":"ping"' in line]
    # cancelled by the client: not re-established on the next generation
    s.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "sub-1"}})
    mid = call(s, "crash", code=3)
    until_reply(s, mid)
    ready(s, 4)
    mid = call(s, "state")
    notes, got = until_reply(s, mid)
    assert json.loads(got["result"]["content"][0]["text"])["listens"] == [] and notes == []
    assert listen_lines(s, s.wait_pids(4)[3]) == []
    s.close()


def test_an_open_listen_ends_with_an_error_only_when_no_server_follows(session):  # noqa: F811
    """doctor:kill while the server is down (a crash's cooldown) answers an open subscription
    with the error reply, so the client knows it ended; at shutdown the server's own completion
    result ends it."""
    s = session(["--modern"], harness=True, config={"lifecycle": {"cooldown": 5000}})
    for sid in ("a", "b"):
        s.send({"jsonrpc": "2.0", "id": sid, "method": "subscriptions/listen",
                "params": {"_meta": META, "notifications": {"toolsListChanged": True}}})
        assert s.recv()["params"]["_meta"][SUB] == sid
    s.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "b"}})
    mid = call(s, "crash", code=3)
    notes, got = until_reply(s, mid)
    assert got["error"]["data"]["reason"] == "crashed" and notes == []
    s.wait_event("doctor:restarting")
    s.nothing()                                                          # "a" waits for the next server
    assert s.ctl("bridge:stats")[0]["data"]["result"]["subscriptions"] == 1
    s.ctl("doctor:kill")
    got = s.recv()
    assert got["id"] == "a" and got["error"]["data"]["reason"] == "kill", got
    s.nothing()                                                          # "b" was cancelled: nothing owed
    s.ctl("doctor:restart")
    ready(s, 2)
    assert listen_lines(s, s.wait_pids(2)[1]) == []
    s.send({"jsonrpc": "2.0", "id": "c", "method": "subscriptions/listen",
            "params": {"_meta": META, "notifications": {"toolsListChanged": True}}})
    assert s.recv()["params"]["_meta"][SUB] == "c"
    s.proc.stdin.close()                                                 # shutdown: stdin closed
    got = s.recv()
    assert got == {"jsonrpc": "2.0", "id": "c", "result": {"resultType": "complete", "_meta": {SUB: "c"}}}
    s.close()


def test_a_listen_the_server_completes_as_bridge_restarts_it_goes_on(session):  # noqa: F811
    """A server asking for a graceful restart gets its stdin closed and time to exit: it ends
    its subscriptions with their completion result, as the revision says a server should. That
    is the old server's end, not the subscription's: swallowed, and the listen re-sent."""
    s = session(["--modern"], harness=True)
    s.send({"jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen",
            "params": {"_meta": META, "notifications": {"toolsListChanged": True}}})
    assert s.recv()["method"] == "notifications/subscriptions/acknowledged"
    mid = call(s, "graceful")
    assert until_reply(s, mid)[1]["result"]["resultType"] == "complete"
    ready(s, 2)
    # the old server reached its end (the fixture writes each completion result before this record)
    assert any(r["event"] == "eof" and r["pid"] == s.pids()[0] for r in s.server_log())
    assert s.recv() == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": {"_meta": {SUB: 9}}}
    assert len(listen_lines(s, s.pids()[1], wait=True)) == 1
    s.nothing()
    s.close()


@pytest.mark.parametrize("era", ["2025-06-18", "2026-07-28"])
def test_a_hung_server_is_found_without_ping_in_2026(session, era):  # noqa: F811
    """The health check is `ping` where the protocol has it, `server/discover` (with the
    client's _meta) for a 2026-07-28 server, which knows no ping; an open subscriptions/listen
    is not an answer owed (no health check for it alone) and is re-established after the kill."""
    modern = era == "2026-07-28"
    s = session(["--modern"] if modern else [], harness=True,
                config={"proxy": dict(HEALTH["proxy"], stats_interval_sec=0.2)})
    if modern:
        mid = ask(s, "server/discover")                                  # answered: ready, checked
        assert s.reply()["result"]["supportedVersions"] == ["2026-07-28"] and mid
        s.send({"jsonrpc": "2.0", "id": 7, "method": "subscriptions/listen",
                "params": {"_meta": META, "notifications": {"toolsListChanged": True}}})
        assert s.recv()["method"] == "notifications/subscriptions/acknowledged"
        s.past(1.0)                                                      # twice health check + timeout
        mid = ask(s, "server/discover")
        assert s.reply()["id"] == mid
        assert not [line for line in s.received() if '"id":"bridge.py-' in line]   # never probed
    else:
        s.initialize()
    mid = call(s, "slow", sec=1.0)                  # a health check answered while busy: concurrent
    assert until_reply(s, mid)[1]["result"]["content"][0]["text"] == "ok"
    mid = call(s, "hang")
    reply = until_reply(s, mid)[1]
    assert reply["error"]["data"]["reason"] == "hung", reply
    probes = [json.loads(line) for line in s.received(s.pids()[0]) if '"id":"bridge.py-' in line]
    assert probes and {p["method"] for p in probes} == {"server/discover" if modern else "ping"}
    assert all(p.get("params", {}).get("_meta") == (META if modern else None) for p in probes)
    ready(s, 2)
    if modern:
        assert s.recv() == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed",
                            "params": {"_meta": {SUB: 7}}}
        assert len(listen_lines(s, s.wait_pids(2)[1], wait=True)) == 1
    mid = call(s, "echo", text="after")
    assert until_reply(s, mid)[1]["result"]["content"][0]["text"] == "after"
    s.close()


def test_a_listen_inside_a_batch_is_never_re_sent_with_its_neighbours(session):  # noqa: F811
    """bridge.py never re-sends a request: a listen that came inside a JSON-RPC batch (which
    2026-07-28 has no use for) is owed like any request, so a restart answers it with the error
    reply (the client subscribes again) instead of re-sending the whole batch, whose other
    requests would run a second time."""
    s = session(["--modern"], harness=True)
    listen = {"jsonrpc": "2.0", "id": "sub-b", "method": "subscriptions/listen",
              "params": {"_meta": META, "notifications": {"toolsListChanged": True}}}
    side = {"jsonrpc": "2.0", "id": "side-effect", "method": "tools/call",
            "params": {"_meta": META, "name": "echo", "arguments": {"text": "once"}}}
    s.send_raw(json.dumps([listen, side]).encode() + b"\n")
    mid = call(s, "crash", code=3)
    notes, got = until_reply(s, mid)
    assert got["error"]["data"]["reason"] == "crashed"
    assert {n["id"]: n["error"]["data"]["reason"] for n in notes} == {"sub-b": "crashed", "side-effect": "crashed"}
    ready(s, 2)
    mid = call(s, "echo", text="after")
    assert until_reply(s, mid) == ([], {"jsonrpc": "2.0", "id": mid, "result": {
        "content": [{"type": "text", "text": "after"}], "resultType": "complete"}})
    assert not [line for line in s.received(s.wait_pids(2)[1]) if "side-effect" in line or "sub-b" in line]
    s.close()


def test_a_hung_older_server_silent_on_unknown_methods_is_found_without_a_handshake(session):
    """A raw client (no initialize, no protocol version in _meta) and an older server that never
    answers a method it does not know: the health check is server/discover and ping, so the
    server is seen answering while busy (concurrent) and a later hang is found, not taken for a
    server that handles one request at a time."""
    s = session(["--ignore-unknown"], harness=True, config=HEALTH)
    mid = s.request("tools/list")                                     # ready: checked from now on
    assert until_reply(s, mid)[1]["result"]["tools"]
    mid = s.request("tools/call", {"name": "slow", "arguments": {"sec": 1.0}})
    assert until_reply(s, mid)[1]["result"]["content"][0]["text"] == "ok"
    mid = s.request("tools/call", {"name": "hang", "arguments": {}})
    reply = until_reply(s, mid)[1]
    assert reply["error"]["data"]["reason"] == "hung", reply
    probes = [json.loads(line)["method"] for line in s.received(s.pids()[0]) if '"id":"bridge.py-' in line]
    assert probes[:2] == ["server/discover", "ping"]
    assert ready(s, 2)["signal"] == "answered ping"
    s.close()
