"""`bridge.py proxy`: a client drives the real CLI through pipes, in front of the fixture MCP server
(fixtures/mcp_server.py). Observability is off, or replaced by tests/proxy_harness.py's recording
stand-in when events and /control commands are under test. After every scenario no process the
proxy started may be left alive (leaders, grandchildren, `sh -c` wrappers)."""
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import (BRIDGE, FIXTURES, PYTHON, clean_env, make_git_repo, process_running,
                      readme_quickstart, wait_for)

SERVER = [PYTHON, str(FIXTURES / "mcp_server.py")]
HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "proxy_harness.py")
INIT = {"protocolVersion": "2025-06-18", "capabilities": {"roots": {}}, "clientInfo": {"name": "t", "version": "1"}}


class Session:
    """A running `bridge.py proxy` with a reader thread on its stdout (so reads can time out)."""

    def __init__(self, tmp_path, server_args=(), command=None, harness=False, config=None, env=None,
                 reader=True, args=()):
        self.tmp, self.log = tmp_path, tmp_path / "server.jsonl"
        self.events, self.control = tmp_path / "events.jsonl", tmp_path / "control.jsonl"
        cmd = [PYTHON, HARNESS, str(self.events), str(self.control)] if harness else [PYTHON, str(BRIDGE)]
        cmd += ["proxy"] + list(args)
        if config is not None:
            (tmp_path / "cfg.json").write_text(json.dumps(config))
            cmd += ["--config", str(tmp_path / "cfg.json")]
        if command is None:
            command = SERVER + ["--log", str(self.log)] + list(server_args)
        cmd += ["--"] + command
        base = {"BRIDGE_OBS_ENABLED": "false", "XDG_CONFIG_HOME": str(tmp_path / "config")}
        if "lifecycle" not in (config or {}):
            base["BRIDGE_RESTART_COOLDOWN"] = "20"
        if harness:
            base["BRIDGE_OBS_ENABLED"] = "true"
        base.update(env or {})
        self.stderr = open(tmp_path / "stderr.txt", "w+b")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     env=clean_env(**base), cwd=str(tmp_path))
        self.lines = queue.Queue()
        if reader:
            threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 100

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send_raw(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, obj):
        self.send_raw(json.dumps(obj).encode() + b"\n")

    def request(self, method, params=None, mid=None):
        if mid is None:
            self.next_id += 1
            mid = self.next_id
        msg = {"jsonrpc": "2.0", "id": mid, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return mid

    def call(self, tool, **args):
        return self.request("tools/call", {"name": tool, "arguments": args})

    def recv_raw(self, timeout=10):
        line = self.lines.get(timeout=timeout)
        assert line is not None, "proxy closed stdout; stderr:\n" + self.err()
        return line

    def recv(self, timeout=10):
        return json.loads(self.recv_raw(timeout))

    def reply(self, timeout=10):
        """The next message with an id (notifications such as list_changed are skipped)."""
        msg = self.recv(timeout)
        while "id" not in msg:
            msg = self.recv(timeout)
        return msg

    def nothing(self, wait=0.3):
        """No line for `wait` seconds (where no later event can show it: paused, or a server
        that knows no ping)."""
        with pytest.raises(queue.Empty):
            self.lines.get(timeout=wait)

    def settled(self):
        """Nothing more comes of what happened so far: a ping sent now is answered next (the
        server reads in order and bridge.py relays in order), so a line owed before it, or one
        relayed that should not be, would show up first."""
        self.next_id += 1
        mid = "settled-%d" % self.next_id
        self.request("ping", mid=mid)
        assert self.recv() == {"jsonrpc": "2.0", "id": mid, "result": {}}

    def past(self, seconds):
        """Wait until bridge.py's loop has gone on `seconds` from now: a bridge:stats event it
        published that late (harness=True, a short proxy.stats_interval_sec). What the loop was
        to do by then (a health check, a reload due) goes before a request sent after this."""
        moment = (time.time() + seconds) * 1000
        assert wait_for(lambda: [e for e in self.event_list("bridge:stats") if e["ts"] >= moment],
                        seconds + 10), self.event_list("bridge:stats")[-3:]

    def initialize(self):
        mid = self.request("initialize", INIT)
        reply = self.recv()
        while "id" not in reply:                                          # a log notification first
            reply = self.recv()
        assert reply["id"] == mid and "result" in reply
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return reply

    def err(self):
        self.stderr.flush()
        return (self.tmp / "stderr.txt").read_text(errors="replace")

    def server_log(self):
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def received(self, pid=None):
        """Lines the server processes received, optionally of one generation (pid)."""
        return [r["line"] for r in self.server_log() if r["event"] == "recv" and pid in (None, r["pid"])]

    def pids(self):
        return [r["pid"] for r in self.server_log() if r["event"] == "start"]

    def event_list(self, kind=None):
        if not self.events.exists():
            return []
        got = [json.loads(line) for line in self.events.read_text().splitlines()]
        return [e for e in got if kind in (None, e["type"])]

    def wait_event(self, kind, count=1, timeout=10):
        end = time.time() + timeout
        while time.time() < end:
            got = self.event_list(kind)
            if len(got) >= count:
                return got
            time.sleep(0.02)
        raise AssertionError("no %s event; events: %s" % (kind, self.event_list()))

    def ctl(self, action, params=None, cid=None):
        cid = cid or "c%d" % time.monotonic_ns()
        with open(self.control, "a") as handle:
            handle.write(json.dumps({"id": cid, "action": action, "params": params}) + "\n")
        return self.wait_until_ack(cid)

    def wait_until_ack(self, cid):
        end = time.time() + 10
        while time.time() < end:
            acks = [e for e in self.event_list("ack") if e["data"]["id"] == cid]
            if acks:
                return acks
            time.sleep(0.02)
        raise AssertionError("no ack for %s" % cid)

    def wait_pids(self, n, timeout=10):
        end = time.time() + timeout
        while len(self.pids()) < n and time.time() < end:
            time.sleep(0.02)
        return self.pids()

    def close(self, expect=0, timeout=15):
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        rc = self.proc.wait(timeout)
        assert rc == expect, "exit %s, stderr:\n%s" % (rc, self.err())
        self.assert_no_leftovers()
        return rc

    def assert_no_leftovers(self):
        pids = self.pids() + [r["child"] for r in self.server_log() if r["event"] == "grandchild"]
        end = time.time() + 3
        while any(process_running(p) for p in pids) and time.time() < end:
            time.sleep(0.02)
        alive = [p for p in pids if process_running(p)]
        assert not alive, "left behind: %s" % alive


@pytest.fixture
def session(tmp_path):
    made = []

    def start(*args, **kw):
        made.append(Session(tmp_path, *args, **kw))
        return made[-1]
    yield start
    for s in made:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
        for pid in s.pids():
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


# ---- relay ------------------------------------------------------------------------------

def test_relays_bytes_exactly_both_ways(session):
    s = session([])
    s.initialize()
    odd = '{ "id" : 7,"method":"echo" ,"jsonrpc":"2.0","params":{"text":"caf\\u00e9 ✓","n":1.50}}'
    s.send_raw(odd.encode() + b"\r\n")
    assert s.recv_raw() == b'{"jsonrpc":"2.0","id":7,"result":{"text":"caf\\u00e9 \\u2713","n":1.5}}\n'
    s.send_raw(b'{"jsonrpc":"2.0","id":8,"method":"ping"}')          # final line without newline
    s.proc.stdin.close()
    assert s.recv()["id"] == 8
    s.close()
    got = s.received()
    assert odd + "\r\n" in got                                             # as sent, \r included
    assert '{"jsonrpc":"2.0","id":8,"method":"ping"}\n' in got


def test_server_lines_relayed_as_written(session):
    """The server's own formatting, \r\n and a final line without a newline reach the client as
    written (a proxy that re-serialised would pass the other tests: the fixture writes compact JSON)."""
    s = session()
    odd = '{ "method" : "notifications/message", "jsonrpc":"2.0", "params":{"data":"caf\u00e9 \u00e9", "n":1.50} }'
    s.call("raw", line=odd + "\r\n")
    assert s.recv_raw() == odd.encode() + b"\r\n"
    s.recv()
    s.call("lastword", line='{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"bye"} }')
    assert s.recv_raw() == b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"bye"} }\n'
    s.close()


def test_integers_beyond_pythons_digit_limit_are_valid_json(session):
    s = session()
    big = "9" * 5000
    s.send_raw(('{"jsonrpc":"2.0","id":3,"method":"echo","params":{"n":%s}}\n' % big).encode())
    assert s.recv_raw() == ('{"jsonrpc":"2.0","id":3,"result":{"n":%s}}\n' % big).encode()
    assert "malformed" not in s.err()
    s.close()


def test_long_lines_within_limit_and_dropped_beyond(session):
    s = session(config={"proxy": {"max_line_bytes": 200000}})
    s.call("echo", text="a" * 150000)
    assert len(s.recv()["result"]["content"][0]["text"]) == 150000
    s.send_raw(b'{"jsonrpc":"2.0","id":9,"method":"echo","params":{"t":"' + b"b" * 300000 + b'"}}\n')
    too_large = s.recv()                                                   # answered, never sent on
    assert too_large["id"] == 9 and too_large["error"]["data"]["reason"] == "too_large"
    mid = s.call("huge", bytes=250000)                                     # answer over the limit: dropped
    answer = s.recv()                                                      # ... and the request answered
    assert answer["id"] == mid and answer["error"]["data"]["reason"] == "answer_too_large"
    assert answer["error"]["data"]["method"] == "tools/call"
    s.request("ping", mid=10)
    assert s.recv() == {"jsonrpc": "2.0", "id": 10, "result": {}}
    s.settled()
    assert not any('"id":9' in line for line in s.received()), "oversized line reached the server"
    assert "line longer than proxy.max_line_bytes" in s.err()
    # The TypeScript SDK writes the id last; a nested "id" is never taken for the message's own,
    # and a line whose id shows at neither end is dropped without an answer.
    s.send_raw(b'{"method":"echo","params":{"id":1,"t":"' + b"c" * 300000 + b'"},"jsonrpc":"2.0","id":"ts"}\r\n')
    assert s.recv()["id"] == "ts"
    s.send_raw(b'{"method":"echo","params":{"id":1,"t":"' + b"c" * 300000 + b'"},"id":12,"jsonrpc":"2.0"}\n')
    s.request("ping", mid=11)
    assert s.recv()["id"] == 11
    s.close()


def test_oversized_lines_are_answered_on_the_side_that_waits(session):
    """Server and client number their requests independently: what an oversized line was is
    read from its ends, never guessed from its id alone."""
    s = session(config={"proxy": {"max_line_bytes": 1000}})
    # the server's oversized request carries id 1 while the client's request 1 is pending:
    # the server is told (its tool call reports it), the client's request 1 is answered once
    s.request("tools/call", {"name": "ask", "arguments": {"id": 1, "bytes": 5000}}, mid=1)
    reply = s.recv()
    assert reply["id"] == 1 and "result" in reply, reply
    told = json.loads(reply["result"]["content"][0]["text"])["error"]
    assert told["data"]["reason"] == "too_large"
    s.settled()
    # the client's oversized request 2 while the server's own request 2 is pending: answered
    s.request("tools/call", {"name": "ask", "arguments": {"id": 2}}, mid=10)
    assert s.recv()["id"] == 2                                             # the server asks
    s.send_raw(b'{"jsonrpc":"2.0","id":2,"method":"echo","params":{"t":"' + b"x" * 2000 + b'"}}\n')
    refused = s.recv()
    assert refused["id"] == 2 and refused["error"]["data"]["reason"] == "too_large"
    # and the client's oversized answer to the server's request 2: the server is told
    s.send_raw(b'{"jsonrpc":"2.0","id":2,"result":{"t":"' + b"y" * 2000 + b'"}}\n')
    answer = s.recv()
    assert answer["id"] == 10
    assert json.loads(answer["result"]["content"][0]["text"])["error"]["data"]["reason"] == "answer_too_large"
    s.close()


def test_sixteen_mib_lines_by_default(session):
    s = session()
    s.call("huge", bytes=15 << 20)
    assert len(s.recv(timeout=30)["result"]["content"][0]["text"]) == 15 << 20
    s.close()


def test_sixteen_mib_limit_at_the_byte_from_the_client(session):
    s = session()
    head, tail = b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"t":"', b'"}}'
    exact = head + b"x" * ((16 << 20) - len(head) - len(tail)) + tail       # 16 MiB, newline aside
    s.send_raw(exact + b"\n")
    assert len(s.recv(timeout=30)["result"]["t"]) == len(exact) - len(head) - len(tail)
    s.send_raw(exact[:-3] + b'x"}}\n')                                   # one byte more
    assert s.recv(timeout=30)["error"]["data"]["reason"] == "too_large"
    s.close()


def test_big_integers_leave_ids_tracked(session):
    s = session()
    s.send_raw(('{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":'
                '{"text":"small","n":%s}}}\n' % ("7" * 5000)).encode())
    assert s.recv()["result"]["content"][0]["text"] == "small"            # an answer without big numbers
    s.request("tools/call", {"name": "crash", "arguments": {"code": 3}}, mid=4)
    assert s.recv()["id"] == 4
    s.settled()                                                           # 3 was answered: not owed
    s.close()


def test_malformed_json_logged_and_skipped(session):
    s = session()
    # `{"id":nope}`: the decoder's fast scan ends in StopIteration there, not a ValueError
    s.send_raw(b"{not json\n\n" + b'{"id":nope}\n' + b"[" * 200000 + b"]" * 200000 + b"\n")
    s.call("garbage")
    assert s.recv()["result"]["content"][0]["text"] == "ok"               # the garbage line is not relayed
    assert not any("not json" in line or "nope" in line for line in s.received())
    assert s.err().count("malformed JSON") == 4
    s.close()


def test_long_stderr_lines_cut_on_a_character_and_ended(session):
    s = session(harness=True)
    s.call("stderr", text="\u00e9" * 3000 + "\nsecond line\n")
    s.recv()
    s.call("crash", code=3)                                               # a crash event: a long log line
    s.recv()
    s.call("kill")                                                        # generation 2 says nothing
    s.recv()
    s.close()
    err = (s.tmp / "stderr.txt").read_bytes()
    err.decode("utf-8")                                                   # no character cut in half
    assert b"[doctor] " + "\u00e9".encode() * 1995 in err and b"bytes cut]\n[doctor] second line\n" in err
    assert all(line.startswith((b"[doctor] ", b"bridge proxy: ")) for line in err.splitlines()), err[-3000:]
    crashes = s.wait_event("doctor:crashed", count=2)
    assert crashes[0]["data"]["stderrTail"][-1] == "fixture: crashing with 3"
    assert crashes[1]["data"]["stderrTail"] == []                         # its own generation's only


def test_stderr_drained_forwarded_with_prefix(session):
    s = session(["--stderr-bytes", str(1 << 20)])
    s.call("stderr", bytes=300000)
    assert s.recv()["result"]["content"][0]["text"] == "ok"               # the child never blocked
    s.close()
    assert "[doctor] EEEE" in s.err() and "[doctor] SSSS" in s.err()


def test_secrets_in_server_stderr_are_redacted(session):
    secret = "hunter2-" + "z" * 24
    s = session(env={"SERVICE_API_TOKEN": secret})
    s.call("stderr", text="connecting with %s and sk-ant-api03-%s\n" % (secret, "A" * 40))
    s.recv()
    s.call("crash", code=3)
    s.recv()
    s.close()
    err = s.err()
    assert "[doctor] connecting with [REDACTED]" in err and secret not in err and "sk-ant-api03-AAAA" not in err


def test_pipelined_messages_never_interleave_with_error_replies(session):
    s = session(config={"lifecycle": {"cooldown": 10}})
    s.initialize()
    ids = list(range(1000, 1400))
    burst = b"".join(json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
        "name": "crash" if i == 1200 else "echo", "arguments": {"text": "x" * 500}}}).encode() + b"\n" for i in ids)
    s.send_raw(burst)
    answered = {}
    while len(answered) < len(ids):
        msg = s.recv()                                                    # every line parses: no interleaving
        if "id" in msg:
            assert msg["id"] not in answered
            answered[msg["id"]] = msg
    assert all("result" in answered[i] for i in ids if i < 1200)
    assert answered[1200]["error"]["data"]["reason"] == "crashed"
    s.close()


# ---- lifecycle ------------------------------------------------------------------------------

def test_ready_health_and_graceful_lines_are_swallowed(session):
    s = session(["--ready"], harness=True)
    s.request("ping", mid=1)
    assert s.recv() == {"jsonrpc": "2.0", "id": 1, "result": {}}          # not {"ready": true}
    assert s.wait_event("doctor:ready")[0]["data"]["signal"] == "ready line"
    s.call("health")
    assert s.recv()["result"]["content"][0]["text"] == "ok"
    s.call("graceful")
    assert s.recv()["result"]["content"][0]["text"] == "ok"
    s.wait_pids(2)
    s.request("ping", mid=2)
    assert s.recv()["id"] == 2
    assert not s.event_list("doctor:crashed")                             # a requested restart is no crash
    assert s.wait_event("doctor:restarting")[0]["data"]["reason"] == "graceful"
    s.close()


def test_crash_answers_in_flight_and_replays_handshake(session):
    s = session(["--notify-before-init"], harness=True)
    assert s.initialize()["result"]["capabilities"]["tools"]["listChanged"] is True
    s.send_raw(b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"crash","arguments":{"code":7}}}\n'
               b'{"jsonrpc":"2.0","id":"six","method":"tools/call","params":{"name":"echo","arguments":{}}}\n')
    errors = [s.recv(), s.recv()]
    assert [e["id"] for e in errors] == [5, "six"]
    for e in errors:
        assert e["error"]["code"] == -32000
        assert e["error"]["data"]["reason"] == "crashed" and e["error"]["data"]["retried"] is False
        assert e["error"]["data"]["exit"] == {"code": 7}
    mid = s.call("echo", text="after")
    seen = [s.recv()]
    while seen[-1].get("id") != mid:
        seen.append(s.recv())
    methods = [m.get("method") for m in seen]
    assert "notifications/message" in methods                             # the Doctor's own, relayed
    assert "notifications/tools/list_changed" in methods and "notifications/resources/list_changed" in methods
    assert "notifications/prompts/list_changed" not in methods            # not advertised as changeable
    s.settled()                                                           # the replay's answer was swallowed
    first, second = s.pids()[:2]
    crash = s.wait_event("doctor:crashed")[0]["data"]
    assert crash["exit"] == {"code": 7} and "crashing with 7" in crash["stderrTail"][-1]
    new = [json.loads(line) for line in s.received(second)]
    assert new[0]["method"] == "initialize" and new[0]["params"] == INIT and new[0]["id"] != 101
    assert new[1] == {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert new[2]["params"]["arguments"] == {"text": "after"}
    assert not any('"six"' in line for line in s.received(second))        # never re-sent
    assert first != second
    s.close()


def test_cancelled_request_is_no_longer_owed(session):
    """notifications/cancelled: the server need not answer, so a crash answers only the others."""
    s = session()
    s.request("tools/call", {"name": "slow", "arguments": {"sec": 30}}, mid=9)
    s.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}})
    s.request("tools/call", {"name": "crash", "arguments": {"code": 4}}, mid=10)
    assert s.recv()["id"] == 10
    s.request("ping", mid=11)
    assert s.recv()["id"] == 11                       # the restarted server; nothing for 9 came first
    s.close()


def test_restart_without_initialize_and_late_answers_dropped(session):
    s = session()
    s.call("ask")
    ask = s.recv()
    assert ask["method"] == "sampling/createMessage"
    s.call("kill")
    assert s.recv()["error"]["data"]["exit"] == {"signal": "SIGKILL"}
    assert s.recv()["error"]["data"]["reason"] == "crashed"
    s.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"late": True}})  # to the dead child: dropped
    s.request("ping", mid=3)
    assert s.recv()["id"] == 3
    new = s.received(s.pids()[1])
    assert not any("initialize" in line or "late" in line for line in new)
    s.close()


def test_answers_to_a_new_servers_reused_request_ids_reach_it(session):
    """SDK servers number their own requests from 0 in every process: an id the dead server used
    must not poison the same id of the next one."""
    s = session()
    s.request("tools/call", {"name": "ask", "arguments": {}}, mid=5)
    assert s.recv()["id"] == "srv-5"                                       # generation 1 asks, then dies
    s.call("kill")
    assert {s.recv()["id"], s.recv()["id"]} == {5, s.next_id}
    s.request("tools/call", {"name": "ask", "arguments": {}}, mid=5)       # generation 2 asks with the same id
    assert s.recv()["id"] == "srv-5"
    s.send({"jsonrpc": "2.0", "id": "srv-5", "result": {"answer": 42}})
    reply = s.recv()
    assert reply["id"] == 5 and json.loads(reply["result"]["content"][0]["text"]) == {"answer": 42}
    s.close()


def test_default_policy_survives_ten_crashes_in_a_minute_not_eleven(session):
    s = session(["--exit-first", "10"], config={"lifecycle": {"cooldown": 10}})
    assert len(s.wait_pids(11, timeout=30)) == 11
    s.request("ping", mid=1)
    assert s.recv(timeout=20) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert s.err().count("doctor:crashed {") == 10 and "doctor:fatal" not in s.err()
    s.close()


def test_default_policy_gives_up_on_the_eleventh_crash_in_a_minute(session):
    s = session(["--exit-at-start", "4"], config={"lifecycle": {"cooldown": 10}})
    assert s.proc.wait(30) == 1
    assert len(s.pids()) == 11 and s.err().count("doctor:fatal {") == 1


def test_server_runs_in_its_own_group_without_a_shell(session):
    s = session(harness=True)
    s.request("ping", mid=1)
    s.recv()
    assert s.wait_event("doctor:ready")[0]["data"]["signal"] == "first answer"
    start = s.server_log()[0]
    assert start["pgid"] == start["pid"]                                  # its own process group
    with open("/proc/%d/stat" % start["pid"]) as handle:
        ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
    assert ppid == s.proc.pid                                             # started directly: no shell between
    s.close()


def test_helpers_that_leave_the_group_are_killed_on_crash_and_exit(session, tmp_path):
    """A helper started in a session of its own (setsid; Playwright starts browsers so) is out of
    the server's process group: it must still not outlive the server that started it."""
    pids = tmp_path / "helpers"
    helper = "setsid sh -c 'echo $$ >> %s; exec sleep 300' </dev/null >/dev/null 2>&1 &" % pids
    s = session(command=["sh", "-c", helper + ' exec "$@"', "sh"] + SERVER + ["--log", str(tmp_path / "server.jsonl")])
    s.request("ping", mid=1)
    s.recv()
    s.call("crash", code=3)
    s.recv()
    first = int(pids.read_text().split()[0])
    end = time.time() + 5
    while process_running(first) and time.time() < end:
        time.sleep(0.02)
    assert not process_running(first), "the crashed server's helper survived it"
    s.request("ping", mid=2)
    s.recv()
    s.close()
    assert [p for p in map(int, pids.read_text().split()) if process_running(p)] == []


def test_graceful_restarts_wait_the_cooldown(session):
    s = session(harness=True, config={"lifecycle": {"cooldown": 400}})
    for mid in (1, 2):
        s.request("tools/call", {"name": "graceful", "arguments": {}}, mid=mid)
        assert s.recv()["id"] == mid
        s.request("ping", mid=10 + mid)
        assert s.reply()["id"] == 10 + mid
    restarting = s.wait_event("doctor:restarting", count=2)
    starting = s.wait_event("doctor:starting", count=3)
    for before, after in zip(restarting, starting[1:]):
        assert after["ts"] - before["ts"] >= 400
    assert not s.event_list("doctor:crashed")
    s.close()


def test_restart_limit_is_fatal_on_the_crash_after_max(session):
    s = session(["--exit-at-start", "4"], config={"lifecycle": {"maxRestarts": 3, "restartWindow": 60, "cooldown": 10}})
    assert s.proc.wait(20) == 1
    err = s.err()
    assert err.count("doctor:crashed {") == 4 and err.count("doctor:fatal {") == 1
    assert len(s.pids()) == 4
    s.close(expect=1)


def test_max_restarts_crashes_in_the_window_are_survived(session):
    s = session(["--exit-first", "3"], config={"lifecycle": {"maxRestarts": 3, "restartWindow": 60, "cooldown": 10}})
    assert len(s.wait_pids(4)) == 4
    s.request("ping", mid=1)
    assert s.recv(timeout=20) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert len(s.pids()) == 4 and s.proc.poll() is None and s.err().count("doctor:crashed {") == 3, s.err()
    s.close()


def test_sliding_window_forgets_old_crashes(session):
    # The cooldown keeps crashes >= 0.65 s apart, so never 3 fall within 1 s. Waiting for the 4th
    # start (rather than for a fixed time, which a loaded machine may not fit 4 starts in) proves
    # the 3rd crash, fatal to a counter that never forgets, was survived.
    s = session(["--exit-at-start", "4"], config={"lifecycle": {"maxRestarts": 2, "restartWindow": 1.0,
                                                                 "cooldown": 650}})
    assert len(s.wait_pids(4, timeout=60)) >= 4, s.err()
    assert s.proc.poll() is None, s.err()
    assert s.err().count("doctor:crashed {") >= 3
    s.close()


def test_command_that_cannot_start_gives_up(session):
    s = session(command=["/nonexistent/server"], config={"lifecycle": {"maxRestarts": 2, "cooldown": 10}})
    assert s.proc.wait(20) == 1
    assert "cannot start /nonexistent/server" in s.err() and "doctor:fatal" in s.err()


# ---- health check and state replay ------------------------------------------------------------

HEALTH = {"proxy": {"health_check_sec": 0.3, "health_timeout_sec": 0.5}}


@pytest.mark.parametrize("tool", ["hang", "stop"])
def test_hung_server_is_killed_answered_and_restarted(session, tool):
    s = session(["--grandchild"], harness=True, config=HEALTH)
    s.initialize()
    s.call("slow", sec=1.0)                  # it answers ping while busy: its silence will mean stuck
    assert s.reply()["result"]["content"][0]["text"] == "ok"
    mid = s.call(tool)
    reply = s.reply()
    assert reply["id"] == mid and reply["error"]["code"] == -32000
    assert reply["error"]["data"]["reason"] == "hung" and reply["error"]["data"]["exit"] == {"signal": "SIGKILL"}
    hung = s.wait_event("doctor:hung")[0]["data"]
    assert hung["generation"] == 1 and hung["pending"] == 1
    restarting = s.wait_event("doctor:restarting")[0]["data"]
    assert restarting["reason"] == "hung" and restarting["crashesInWindow"] == 1   # counted as a crash
    first, second = s.wait_pids(2)[:2]
    assert not process_running(first)
    after = s.call("echo", text="after")
    assert s.reply()["result"]["content"][0]["text"] == "after"
    assert json.loads(s.received(second)[0])["method"] == "initialize"   # the handshake replayed
    s.close()


def test_busy_server_that_answers_ping_is_not_hung(session):
    s = session(harness=True, config=HEALTH)
    s.initialize()
    mid = s.call("slow", sec=2.0)
    reply = s.reply()
    assert reply == {"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "ok"}]}}
    pings = [json.loads(line) for line in s.received() if '"method":"ping"' in line]
    assert len(pings) >= 2 and all(re.match(r"bridge\.py-[0-9a-f]{16}-ping-\d+$", p["id"]) for p in pings)
    s.settled()                                                          # the pings' answers swallowed
    assert len(s.pids()) == 1 and not s.event_list("doctor:hung") and not s.event_list("doctor:crashed")
    s.close()


def test_server_busy_one_request_at_a_time_is_never_killed(session):
    """A synchronous server (FastMCP runs a plain `def` tool on its event loop) cannot answer ping
    while busy: without proof that it could, its silence is not taken for a hang."""
    s = session(harness=True, config=HEALTH)
    s.initialize()
    mid = s.call("sleep", sec=2.5)                                       # 2.5 x (ping + timeout)
    assert s.reply(timeout=15) == {"jsonrpc": "2.0", "id": mid,
                                   "result": {"content": [{"type": "text", "text": "ok"}]}}
    assert len(s.pids()) == 1 and not s.event_list("doctor:hung") and not s.event_list("doctor:crashed")
    deadline = time.time() + 5                                           # it reads the ping after answering
    while not any('"method":"ping"' in line for line in s.received()) and time.time() < deadline:
        time.sleep(0.02)
    assert sum('"method":"ping"' in line for line in s.received()) == 1  # one ping, no pile-up
    assert "may handle one request at a time, so it is not treated as hung" in s.err()
    s.settled()                                                          # its late answer swallowed
    s.close()


def test_an_ignored_request_is_no_proof_of_concurrency(session):
    """A sequential server that never answers one request and answers a ping while idle has not
    shown it answers pings while busy: a long call afterwards is not a hang."""
    s = session(harness=True, config=HEALTH)
    s.initialize()
    s.request("ignore", mid="never")                                      # never answered
    assert wait_for(lambda: any('"method":"ping"' in line for line in s.received()), 10)  # while idle
    mid = s.call("sleep", sec=2.5)
    assert s.reply(timeout=15)["id"] == mid
    assert not s.event_list("doctor:hung") and len(s.pids()) == 1
    s.close()


def test_an_older_servers_unanswered_discover_is_asked_once_and_its_late_answer_swallowed(session):
    """Without a handshake a health check asks server/discover and ping; an older server that
    never answers a method it does not know answers only ping. Its server/discover is not asked
    again at each later check (each would leave an id of bridge.py's own unanswered for ever),
    and its answer, should it come at last, never reaches the client."""
    s = session(["--ignore-unknown"], config=HEALTH)
    s.settled()                                                          # it answered: ready
    s.request("ignore", mid="never")                                     # owed for ever: checked
    assert wait_for(lambda: sum('"method":"ping"' in line for line in s.received()) >= 5, 20)
    discover = [json.loads(line) for line in s.received() if '"method":"server/discover"' in line]
    assert len(discover) == 1, discover
    late = {"jsonrpc": "2.0", "id": discover[0]["id"], "result": {"supportedVersions": ["2026-07-28"]}}
    mid = s.call("raw", line=json.dumps(late) + "\n")                  # the server answers it now
    ok = {"content": [{"type": "text", "text": "ok"}]}
    assert s.recv() == {"jsonrpc": "2.0", "id": mid, "result": ok}      # the late answer swallowed
    s.settled()
    s.close()


def test_a_slow_first_call_on_a_restarted_server_is_not_a_stuck_start(session):
    """Without a replayed initialize (MCP 2026-07-28 clients send none) there is no start to
    time: a restarted server's slow answer is only slow."""
    s = session(harness=True, config={"proxy": {"start_timeout_sec": 1.0}})
    s.call("crash", code=3)
    s.reply()
    mid = s.call("sleep", sec=2.0)
    assert "result" in s.reply(timeout=15) and not s.event_list("doctor:hung") and mid
    s.close()


def test_shutdown_after_doctor_kill_spares_a_process_that_took_its_pid(session, tmp_path):
    """A Doctor reaped long ago (doctor:kill) leaves a pid the system may give to any process:
    bridge.py must not signal it at exit."""
    s = session(harness=True)
    s.request("ping", mid=1)
    s.recv()
    s.ctl("doctor:kill")
    s.wait_event("doctor:stopped")
    old = s.pids()[0]
    try:
        with open("/proc/sys/kernel/ns_last_pid", "w") as handle:
            handle.write(str(old - 1))
        bystander = subprocess.Popen(["setsid", "sleep", "300"])
    except OSError:
        pytest.skip("cannot choose the next pid here (needs root and /proc/sys/kernel/ns_last_pid)")
    try:
        if bystander.pid != old:
            pytest.skip("another process took pid %d first" % old)
        s.proc.stdin.close()
        assert s.proc.wait(15) == 0
        # a signal bridge.py sent before it exited is still pending, or has ended the bystander
        with open("/proc/%d/status" % old) as handle:
            pending = [line.split()[1] for line in handle if line.startswith(("SigPnd:", "ShdPnd:"))]
        assert bystander.poll() is None and set("".join(pending)) == {"0"}, \
            "bridge.py signalled the process that now has pid %d" % old
    finally:
        bystander.kill()
        bystander.wait()


def test_restarted_server_stuck_before_answering_initialize_is_killed(session, tmp_path):
    """start_timeout_sec: a restarted server that never answers the replayed initialize is killed
    and restarted like a crash (counted), instead of holding the client's requests forever."""
    count, log = tmp_path / "starts", tmp_path / "server.jsonl"
    wrapper = ('n=$(($(cat "$0" 2>/dev/null || echo 0) + 1)); echo $n > "$0"; echo $$ >> "$0.pids"; '
               '[ $n = 2 ] && exec sleep 300; exec "$@"')
    s = session(command=["sh", "-c", wrapper, str(count)] + SERVER + ["--log", str(log)], harness=True,
                config={"proxy": {"start_timeout_sec": 1.0}, "lifecycle": {"cooldown": 10}})
    s.initialize()
    s.call("crash", code=3)
    assert s.reply()["error"]["data"]["reason"] == "crashed"
    mid = s.call("echo", text="held")                                    # held while generation 2 is stuck
    reply = s.reply(timeout=15)
    assert reply["id"] == mid and reply["result"]["content"][0]["text"] == "held"
    hung = s.wait_event("doctor:hung")[0]["data"]
    assert hung["generation"] == 2 and hung["reason"] == "start_timeout"
    crashes = s.wait_event("doctor:crashed", count=2)
    assert crashes[1]["data"]["reason"] == "start_timeout" and crashes[1]["data"]["exit"] == {"signal": "SIGKILL"}
    assert count.read_text().strip() == "3"
    s.close()
    assert not any(process_running(int(pid)) for pid in (tmp_path / "starts.pids").read_text().split())


def test_no_ping_where_the_protocol_has_none(session):
    """A session that negotiated 2026-07-28 is never pinged (its check is server/discover:
    tests/test_proxy_modern.py); a server never seen answering a check while busy is not killed
    for its silence."""
    s = session(harness=True, config=HEALTH)
    s.request("initialize", dict(INIT, protocolVersion="2026-07-28"))
    assert s.reply()["result"]["protocolVersion"] == "2026-07-28"        # the fixture agrees to it
    stop = s.call("stop")                                                # wedged and silent
    # the health check went unanswered for health_timeout_sec
    assert wait_for(lambda: "so it is not treated as hung" in s.err(), 10), s.err()
    os.kill(s.pids()[0], signal.SIGCONT)
    assert s.reply()["id"] == stop                         # then it reads what it was sent meanwhile
    s.settled()
    checks = [json.loads(line)["method"] for line in s.received() if '"id":"bridge.py-' in line]
    assert checks == ["server/discover"] and not s.event_list("doctor:hung") and len(s.pids()) == 1
    s.close()


def test_log_level_and_subscriptions_replayed_after_restart(session):
    s = session(harness=True)
    s.initialize()
    for method, params in [("logging/setLevel", {"level": "warning"}), ("logging/setLevel", {"level": "bogus"}),
                           ("logging/setLevel", {"level": "debug"}), ("resources/subscribe", {"uri": "file:///a"}),
                           ("resources/subscribe", {"uri": "file:///b"}),
                           ("resources/subscribe", {"uri": "fixture://first-only/c"}),
                           ("resources/unsubscribe", {"uri": "file:///a"})]:
        mid = s.request(method, params)
        assert s.reply()["id"] == mid
    s.call("state")
    before = json.loads(s.reply()["result"]["content"][0]["text"])
    assert before == {"level": "debug", "subscriptions": ["file:///b", "fixture://first-only/c"]}
    s.call("crash", code=3)
    assert s.reply()["error"]["data"]["reason"] == "crashed"
    s.call("state")
    got = s.reply()
    assert json.loads(got["result"]["content"][0]["text"]) == {"level": "debug", "subscriptions": ["file:///b"]}
    s.settled()                                                          # no bridge-owned answer leaked
    *new, barrier = [json.loads(line) for line in s.received(s.pids()[1])]
    assert barrier["method"] == "ping"                                   # settled's own
    assert [m.get("method") for m in new] == ["initialize", "notifications/initialized", "logging/setLevel",
                                              "resources/subscribe", "resources/subscribe", "tools/call"]
    assert new[2]["params"] == {"level": "debug"} and [m["params"]["uri"] for m in new[3:5]] == [
        "file:///b", "fixture://first-only/c"]
    assert all(m["id"].startswith("bridge.py-") for m in new[:5] if "id" in m)
    failed = s.wait_event("bridge:replay_failed")
    assert len(failed) == 1 and failed[0]["data"]["method"] == "resources/subscribe"
    assert failed[0]["data"]["error"]["code"] == -32002
    s.close()


def test_no_state_replay_without_initialize(session):
    s = session()
    mid = s.request("logging/setLevel", {"level": "error"})
    assert s.reply()["id"] == mid
    s.call("crash", code=3)
    s.reply()
    s.call("state")
    assert json.loads(s.reply()["result"]["content"][0]["text"])["level"] is None
    assert [json.loads(line)["method"] for line in s.received(s.pids()[1])] == ["server/discover", "ping",
                                                                             "tools/call"]
    s.close()


# ---- control and events -------------------------------------------------------------------

def test_pause_holds_then_resume_flushes_in_order(session):
    s = session(harness=True, config={"proxy": {"pause_buffer_messages": 3, "pause_timeout_sec": 30}})
    s.initialize()
    assert s.ctl("bridge:pause")[0]["data"]["ok"] is True
    time.sleep(0.1)
    for i in (1, 2, 3):
        s.request("ping", mid=i)
    s.request("ping", mid=4)                                              # buffer full: answered at once
    full = s.recv()
    assert full["id"] == 4 and full["error"]["data"]["reason"] == "paused_buffer_full"
    s.nothing()
    s.ctl("bridge:resume")
    assert [s.recv()["id"] for _ in range(3)] == [1, 2, 3]
    s.close()


def test_pause_bounds_held_bytes_and_reports_dropped_notifications(session):
    s = session(harness=True, config={"proxy": {"pause_buffer_bytes": 1000, "pause_timeout_sec": 30}})
    s.ctl("bridge:pause")
    time.sleep(0.1)
    s.request("echo", {"t": "a" * 600}, mid=1)
    s.request("echo", {"t": "b" * 600}, mid=2)                            # 1,200 bytes held now
    s.request("echo", {"t": "c"}, mid=3)
    full = s.recv()
    assert full["id"] == 3 and full["error"]["data"]["reason"] == "paused_buffer_full"
    s.send({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})
    dropped = s.wait_event("bridge:dropped")[0]["data"]
    assert dropped["from"] == "client" and dropped["method"] == "notifications/roots/list_changed"
    assert "buffer" in dropped["reason"]
    s.ctl("bridge:resume")
    assert [s.recv()["id"] for _ in range(2)] == [1, 2]
    s.close()


def test_held_answers_outlive_the_pause_timeout(session):
    """Nobody waits on a held answer or notification: the timeout expires requests only, and the
    client's answer still reaches the server that asked."""
    s = session(harness=True, config={"proxy": {"pause_timeout_sec": 0.3}})
    s.initialize()
    s.request("tools/call", {"name": "ask", "arguments": {}}, mid=1)
    ask = s.recv()
    s.ctl("bridge:pause")
    time.sleep(0.1)
    s.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"ok": True}})
    s.send([{"jsonrpc": "2.0", "id": "b1", "method": "ping"}, {"jsonrpc": "2.0", "method": "notifications/x"}])
    expired = s.recv(timeout=3)
    # b1, held after the answer, has expired: the answer would have been by now
    assert expired["id"] == "b1" and expired["error"]["data"]["reason"] == "held_too_long"
    s.ctl("bridge:resume")
    reply = s.recv()
    assert reply["id"] == 1 and json.loads(reply["result"]["content"][0]["text"]) == {"ok": True}
    s.close()


def test_batches_refused_are_answered_once(session):
    s = session(harness=True, config={"proxy": {"pause_buffer_messages": 1, "pause_timeout_sec": 30}})
    s.ctl("bridge:pause")
    time.sleep(0.1)
    s.send([{"jsonrpc": "2.0", "id": "b1", "method": "ping"}, {"jsonrpc": "2.0", "id": "b2", "method": "ping"}])
    s.send([{"jsonrpc": "2.0", "id": "b3", "method": "ping"}, {"jsonrpc": "2.0", "id": "b4", "method": "ping"}])
    refused = {m["id"]: m["error"]["data"]["reason"] for m in (s.recv(), s.recv())}
    assert refused == {"b3": "paused_buffer_full", "b4": "paused_buffer_full"}
    s.ctl("bridge:resume")                     # b1, b2 go to the server (which ignores batches)
    mid = s.call("crash", code=3)
    crashed = {m["id"]: m["error"]["data"]["reason"] for m in (s.recv(), s.recv(), s.recv())}
    assert crashed == {"b1": "crashed", "b2": "crashed", mid: "crashed"}
    s.settled()                                # b3 and b4 are not answered a second time
    s.close()


def test_pause_timeout_answers_held_requests(session):
    s = session(harness=True, config={"proxy": {"pause_timeout_sec": 0.3}})
    s.ctl("bridge:pause")
    time.sleep(0.1)
    s.request("ping", mid=1)
    reply = s.recv(timeout=3)
    assert reply["id"] == 1 and reply["error"]["data"]["reason"] == "held_too_long"
    s.close()


def test_kill_restart_stats_and_unknown_control(session):
    s = session(["--grandchild"], harness=True)
    s.initialize()
    s.ctl("doctor:kill")
    s.wait_event("doctor:stopped")
    s.request("ping", mid=1)
    assert s.recv()["error"]["data"]["reason"] == "kill"
    gen1 = s.pids()[0]
    assert not process_running(gen1)
    s.ctl("doctor:restart")
    s.wait_event("doctor:ready", 2)
    s.request("ping", mid=2)
    assert s.reply()["id"] == 2
    stats = s.ctl("bridge:stats")[0]["data"]["result"]
    for key in ("uptime", "doctorRestarts", "doctorUptime", "messagesIn", "messagesOut", "bytesIn",
                "bytesOut", "dashboardClients"):
        assert key in stats
    assert stats["doctorRestarts"] == 1 and stats["messagesIn"] >= 3
    bad = s.ctl("doctor:explode")[0]["data"]
    assert bad["ok"] is False and bad["error"] == "unknown action"
    s.ctl("doctor:restart")                                              # restart a running child
    s.wait_event("doctor:ready", 3)
    s.ctl("bridge:shutdown")
    assert s.proc.wait(10) == 0
    s.close()


def test_mcp_events_carry_method_id_size_latency_and_redacted_params(session):
    secret = "sk-ant-api03-" + "Q" * 40
    s = session(harness=True, config={"proxy": {"event_params_max": 64, "stats_interval_sec": 0.2}})
    s.call("echo", text=secret + " and a long tail " * 20)
    s.recv()
    end = time.time() + 10                                                # periodic, without asking
    while not [e for e in s.event_list("bridge:stats") if e["data"]["messagesOut"] == 1]:
        assert time.time() < end, s.event_list("bridge:stats")
        time.sleep(0.05)
    stats = [e for e in s.event_list("bridge:stats") if e["data"]["messagesOut"] == 1][0]["data"]
    assert stats["messagesIn"] == 1 and stats["state"] == "ready"
    req = [e["data"] for e in s.wait_event("mcp:request") if e["data"]["method"] == "tools/call"][0]
    resp = s.wait_event("mcp:response")[0]["data"]
    assert req["id"] == 101 and req["size"] > 300 and secret not in req["params"]
    assert req["params"].endswith("[truncated]")
    assert resp["id"] == 101 and resp["method"] == "tools/call" and resp["latencyMs"] >= 0
    assert secret not in s.events.read_text()
    s.close()


# ---- shutdown and orphans ------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_shut_down_cleanly_with_grandchildren(session, sig):
    s = session(["--grandchild"])
    s.request("ping", mid=1)
    s.recv()
    s.proc.send_signal(sig)
    assert s.proc.wait(10) == 0
    s.close()


def test_sh_wrapper_and_its_children_are_killed(session, tmp_path):
    inner = " ".join(SERVER + ["--log", str(tmp_path / "server.jsonl"), "--grandchild"])
    s = session(command=["sh", "-c", inner + "; echo after >&2"])
    s.request("ping", mid=1)
    s.recv()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(10) == 0
    s.close()


def test_child_ignoring_eof_and_term_is_killed(session):
    s = session(["--ignore-term", "--ignore-eof", "--grandchild"],
                config={"proxy": {"close_grace_sec": 0.2, "kill_after_sec": 0.5}})
    s.request("ping", mid=1)
    s.recv()
    started = time.time()
    s.close()
    assert time.time() - started < 5


def test_sigterm_then_sigkill_after_the_default_five_seconds(session):
    """The seed's shutdown: SIGTERM, wait up to 5 s, SIGKILL (here after the default 2 s grace
    with stdin closed), then exit 0."""
    s = session(["--ignore-term", "--ignore-eof"])
    s.request("ping", mid=1)
    s.recv()
    started = time.time()
    s.close(timeout=20)
    took = time.time() - started
    assert 7.0 <= took < 15, took                                        # 2 s grace + 5 s after SIGTERM


def test_stdin_eof_lets_in_flight_requests_finish(session):
    s = session()
    s.call("sleep", sec=0.3)
    s.proc.stdin.close()
    assert s.recv()["result"]["content"][0]["text"] == "ok"
    s.close()


def test_broken_client_pipe_shuts_down(session):
    s = session(["--grandchild"], reader=False)
    s.request("ping", mid=1)
    assert json.loads(s.proc.stdout.readline())["id"] == 1
    s.proc.stdout.close()
    s.call("huge", bytes=1 << 20)
    assert s.proc.wait(10) == 0
    s.assert_no_leftovers()


# ---- configuration ---------------------------------------------------------------------------

def test_server_from_env_or_config_and_missing_command(session, tmp_path):
    s = session(command=[], env={"BRIDGE_DOCTOR_CMD": " ".join(SERVER + ["--log", str(tmp_path / "server.jsonl")])})
    s.request("ping", mid=1)
    assert s.recv()["id"] == 1
    s.close()
    (tmp_path / "server.jsonl").unlink()
    s = session(command=[], config={"doctor": {"command": PYTHON, "args": SERVER[1:] + ["--log", str(s.log)],
                                               "cwd": str(tmp_path)}})
    s.request("ping", mid=1)
    assert s.recv()["id"] == 1
    s.close()
    out = subprocess.run([PYTHON, str(BRIDGE), "proxy"], capture_output=True, text=True, cwd=str(tmp_path),
                         env=clean_env(BRIDGE_OBS_ENABLED="false"), stdin=subprocess.DEVNULL, timeout=30)
    assert out.returncode == 2 and "no server command" in out.stderr


def test_the_dashboard_token_is_not_handed_to_the_server(session, tmp_path):
    seen = tmp_path / "seen.txt"
    s = session(command=["sh", "-c", 'printf %s "${BRIDGE_OBS_TOKEN-unset}" > "$0"; exec "$@"', str(seen)] + SERVER,
                env={"BRIDGE_OBS_TOKEN": "tok-Zq81mXv0Lw93Kd7"})
    s.request("ping", mid=1)
    assert s.recv()["id"] == 1
    s.close()
    assert seen.read_text() == "unset"


# ---- end to end with the real observability server (5b) ------------------------------------

def _ws_events(port, timeout=10):
    """A raw RFC 6455 client on /events yielding each text frame's JSON."""
    import base64
    import socket
    import struct
    end = time.time() + timeout
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
            break
        except OSError:
            if time.time() > end:
                raise
            time.sleep(0.05)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(("GET /events HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (port, key)).encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(4096)
    assert b" 101 " in buf.split(b"\r\n")[0]
    buf = buf.split(b"\r\n\r\n", 1)[1]

    def need(n):
        nonlocal buf
        while len(buf) < n:
            chunk = sock.recv(65536)
            assert chunk, "connection closed"
            buf += chunk
        out, buf = buf[:n], buf[n:]
        return out
    while True:
        b0, b1 = need(2)
        size = b1 & 0x7F
        if size == 126:
            size = struct.unpack(">H", need(2))[0]
        elif size == 127:
            size = struct.unpack(">Q", need(8))[0]
        payload = need(size)
        if b0 & 0x0F == 1:
            yield json.loads(payload)


def test_events_stream_receives_doctor_crashed(session):
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    s = session(env={"BRIDGE_OBS_ENABLED": "true", "BRIDGE_OBS_PORT": str(port), "BRIDGE_OBS_TOKEN": ""})
    s.request("ping", mid=1)
    s.recv()
    events = _ws_events(port)
    next(events)                                # connected: the stream's first event came
    s.call("crash", code=9)
    for event in events:
        if event["type"] == "doctor:crashed":
            assert event["data"]["exit"] == {"code": 9} and isinstance(event["ts"], int)
            break
    s.close()


def test_server_requests_answered_and_batches_tracked(session):
    s = session()
    mid = s.call("ask")
    ask = s.recv()
    s.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"model": "m"}})  # the client answers the server
    done = s.recv()
    assert done["id"] == mid and json.loads(done["result"]["content"][0]["text"]) == {"model": "m"}
    s.send([{"jsonrpc": "2.0", "id": "b1", "method": "ping"}, {"jsonrpc": "2.0", "method": "notifications/x"}])
    s.call("crash", code=2)                                               # the fixture ignores batches:
    answered = {s.recv()["id"], s.recv()["id"]}                           # b1 is answered by the proxy
    assert answered == {"b1", mid + 1}
    assert '[{"jsonrpc": "2.0", "id": "b1"' in s.received()[-2]           # passed through unchanged
    s.close()


def test_secrets_are_redacted_before_long_lines_are_cut(session):
    """A token straddling a cut point must not survive in part (stderr and bridge:dropped)."""
    token = "ghp_" + "Q" * 36
    s = session()
    s.call("stderr", text="x" * 3989 + " " + token + "\n")                 # crosses the 4000 cut
    s.recv()
    s.send_raw(b"{not json " + b"y" * 99 + b" " + token.encode() + b"\n")  # crosses the 120 sample
    s.call("after")
    s.recv()
    s.close()
    err = s.err()
    assert "ghp_QQQ" not in err and "[REDACTED]" in err


# ---- a server that goes mute, lines that are not UTF-8 ------------------------------------

def test_a_server_that_closes_stdout_is_stopped_answered_and_restarted(session):
    """Alive but with its stdout closed, a server can answer nothing more: its requests are
    answered with an error, its group stopped and a new generation started."""
    s = session(harness=True)
    s.initialize()
    s.request("ignore", mid=8)
    s.request("tools/call", {"name": "closeout", "arguments": {}}, mid=9)
    got = {s.recv()["id"]: None, s.recv()["id"]: None}
    assert set(got) == {8, 9}
    crashed = s.wait_event("doctor:crashed")[0]["data"]
    assert crashed["reason"] == "stdout_closed" and crashed["generation"] == 1
    assert s.wait_event("doctor:ready", count=2)[1]["data"]["generation"] == 2
    s.request("ping", mid=10)
    assert s.reply()["id"] == 10
    assert not process_running(s.pids()[0])
    s.close()


def test_a_server_that_closes_stdin_is_stopped_answered_and_restarted(session):
    """Alive but with its stdin closed, a server can take no request: what is sent to it gets
    an error answer (not a wait forever), its group is stopped and a new generation started."""
    s = session(harness=True)
    s.initialize()
    s.request("ignore", mid=8)
    s.request("tools/call", {"name": "closein", "arguments": {}}, mid=9)
    assert s.reply()["id"] == 9
    s.request("tools/list", mid=10)                         # written before or after it closed
    got = {s.reply(timeout=15)["id"]: None, s.reply(timeout=15)["id"]: None}
    assert set(got) == {8, 10}
    crashed = s.wait_event("doctor:crashed")[0]["data"]
    assert crashed["reason"] == "stdin_closed" and crashed["generation"] == 1
    assert s.wait_event("doctor:ready", count=2)[1]["data"]["generation"] == 2
    s.request("ping", mid=11)
    assert s.reply()["id"] == 11
    assert not process_running(s.pids()[0])
    s.close()


@pytest.mark.parametrize("encode", [
    lambda text: text.encode("utf-16-be"),                     # json.loads(bytes) detects UTF-16
    lambda text: b"\xef\xbb\xbf" + text.encode(),              # a UTF-8 byte order mark
    lambda text: text.replace("RESULT", "\\ud800").encode().replace(b"\\ud800", b"\xed\xa0\x80"),
], ids=["utf-16", "bom", "encoded-surrogate"])
def test_lines_that_are_not_utf8_are_dropped_and_answer_nothing(session, encode):
    s = session(harness=True)
    s.request("ignore", mid=8)
    bad = encode('{"jsonrpc":"2.0","id":8,"result":{"text":"RESULT"}}\n')
    s.request("tools/call", {"name": "raw", "arguments": {"hex": bad.hex()}}, mid=9)
    assert s.recv()["id"] == 9                                # the bad line is not relayed
    dropped = s.wait_event("bridge:dropped")[0]["data"]
    assert dropped["from"] == "doctor" and "malformed" in dropped["reason"]
    s.call("crash", code=3)
    assert {s.recv()["id"], s.recv()["id"]} == {8, s.next_id}   # 8 was still owed: answered now
    s.close()


def test_the_command_line_is_redacted_as_a_whole(session):
    s = session(["--api-key", "Xq7kP2mZ9vLw4", "--password", "Yh8nT3rB6cQs1"], harness=True)
    s.request("ping", mid=1)
    s.recv()
    s.close()
    starting = s.wait_event("doctor:starting")[0]["data"]
    text = json.dumps(starting) + s.err()
    assert "Xq7kP2mZ9vLw4" not in text and "Yh8nT3rB6cQs1" not in text
    assert "--api-key [REDACTED]" in starting["command"] and "mcp_server.py" in starting["command"]


# ---- ids: bridge.py's own never collide with the client's; 1 is not 1.0 ------------------------

def test_a_client_id_shaped_like_bridge_owned_ones_gets_its_own_answer(session):
    """The health ping goes out while the client's request with the id bridge.py used to give its
    first ping is in progress; the server answers the client's request first."""
    s = session(config={"proxy": {"health_check_sec": 0.2}})
    s.initialize()
    s.request("tools/call", {"name": "slow", "arguments": {"sec": 1.0}}, mid="bridge.py-ping-1")
    s.request("tools/call", {"name": "sleep", "arguments": {"sec": 2.0}}, mid=7)   # the ping waits behind it
    first = s.reply(timeout=10)
    assert first["id"] == "bridge.py-ping-1" and first["result"]["content"][0]["text"] == "ok", first
    assert s.reply(timeout=10)["id"] == 7
    s.settled()                                                # and the ping's answer is not relayed
    s.close()


def test_ids_1_and_1_0_and_a_4500_digit_id_are_three_requests(session):
    s = session()
    big = "9" * 4500
    s.send_raw(b'{"jsonrpc":"2.0","id":1,"method":"ignore"}\n{"jsonrpc":"2.0","id":1.0,"method":"ignore"}\n'
               b'{"jsonrpc":"2.0","id":%s,"method":"ignore"}\n' % big.encode())
    s.request("tools/call", {"name": "crash", "arguments": {"code": 3}}, mid=2)
    raw = [s.recv_raw() for _ in range(4)]
    ids = sorted(line.split(b',"error"')[0] for line in raw)
    assert ids == sorted([b'{"jsonrpc":"2.0","id":1', b'{"jsonrpc":"2.0","id":1.0', b'{"jsonrpc":"2.0","id":2',
                          b'{"jsonrpc":"2.0","id":' + big.encode()]), raw
    s.settled()
    s.close()


def test_an_id_beyond_a_doubles_range_is_answered_as_written_never_as_infinity(session):
    s = session()
    s.send_raw(b'{"jsonrpc":"2.0","id":1e400,"method":"ignore"}\n{"jsonrpc":"2.0","id":-1E999,"method":"ignore"}\n')
    s.request("tools/call", {"name": "crash", "arguments": {"code": 3}}, mid=2)
    raw = sorted(s.recv_raw().split(b',"error"')[0] for _ in range(3))
    assert raw == [b'{"jsonrpc":"2.0","id":-1E999', b'{"jsonrpc":"2.0","id":1e400', b'{"jsonrpc":"2.0","id":2'], raw
    s.close()


def test_events_show_long_ids_and_methods_cut(session):
    """A method or id is whatever the other side chose, up to max_line_bytes: the history keeps
    200 events and every dashboard gets each one, so neither may carry a MiB line whole."""
    s = session(harness=True)
    long = "m" * (1 << 20)
    s.request(long, mid="i" * (1 << 20))                      # the fixture: method not found
    assert s.reply()["id"] == "i" * (1 << 20)
    line = json.dumps({"jsonrpc": "2.0", "id": "j" * (1 << 20), "method": long})
    s.call("raw", line=line + "\n")                         # the server asks the client the same
    assert s.recv()["method"] == long
    s.reply()
    s.close()
    events = [e for e in s.event_list() if e["type"].startswith("mcp:")]
    assert len(events) >= 4 and all(len(json.dumps(e)) < 2000 for e in events), [
        len(json.dumps(e)) for e in events]
    assert any(str(e["data"]["method"]).startswith("mmm") and "chars]" in e["data"]["method"]
               for e in events)


def test_control_characters_from_the_server_never_reach_the_terminal(session):
    s = session(harness=True)
    s.call("stderr", text="plain \x1b[2J\x1b]0;pwned\x07 and \u009b31m red\n")
    s.recv()
    s.call("crash", code=3)
    s.recv()
    s.close()
    err = (s.tmp / "stderr.txt").read_bytes()
    assert b"\x1b" not in err and b"\x07" not in err and "\u009b".encode() not in err, err
    assert b"[doctor] plain \\x1b[2J\\x1b]0;pwned\\x07 and \\x9b31m red\n" in err
    tail = s.wait_event("doctor:crashed")[0]["data"]["stderrTail"]
    assert "plain \\x1b[2J\\x1b]0;pwned\\x07 and \\x9b31m red" in tail


def test_bridge_replies_are_published_past_the_events_cap(session):
    """The cap on mcp:* events is for relayed traffic: bridge.py's own error replies (what a
    dashboard most needs after a crash) are always published."""
    s = session(harness=True, config={"proxy": {"events_per_sec_max": 1}})
    for mid in range(1, 6):
        s.request("ignore", mid=mid)
    s.request("tools/call", {"name": "crash", "arguments": {"code": 3}}, mid=6)
    assert {s.recv()["id"] for _ in range(6)} == set(range(1, 7))
    s.close()
    replies = [e["data"] for e in s.event_list("mcp:response") if e["data"].get("from") == "bridge"]
    assert sorted(r["id"] for r in replies) == [1, 2, 3, 4, 5, 6]


# ---- sessions without initialize: probed after a restart ---------------------------------------

DISCOVER = {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {"roots": {}}}}


@pytest.mark.parametrize("server_args,first", [((), "server/discover"), (("--legacy",), "tools/list"),
                                               (("--ignore-unknown",), "tools/list")],
                         ids=["2026-07-28", "raw-client-older-server", "older-server-silent-on-unknown"])
def test_a_session_without_initialize_is_ready_after_a_restart_without_a_request(session, server_args, first):
    """Without a handshake the era is unknown when the client named no protocol version: the
    restarted server is asked with server/discover and ping (the request an older server must
    answer even before initialize), as some older servers never answer a method they do not know."""
    s = session(server_args, harness=True, config={"proxy": {"start_timeout_sec": 3.0}})
    s.request(first, DISCOVER if first == "server/discover" else None, mid=1)
    s.reply()
    s.call("crash", code=3)
    assert s.reply()["error"]["data"]["reason"] == "crashed"
    ready = s.wait_event("doctor:ready", count=2, timeout=5)[1]["data"]   # no client message since
    assert ready["generation"] == 2 and ready["signal"] == "answered %s" % (
        "ping" if "--ignore-unknown" in server_args else "server/discover")
    assert ready["startMs"] < 3000 and not s.event_list("doctor:hung")
    assert s.ctl("bridge:stats")[0]["data"]["result"]["state"] == "ready"
    probe = [json.loads(line) for line in s.received(s.wait_pids(2)[1])]
    assert [m["method"] for m in probe][:2] == (["server/discover", "ping"] if first == "tools/list"
                                                 else ["server/discover"])
    assert not any(m.get("method") == "initialize" for m in probe)
    # the per-request fields the client last sent (its capabilities), else bridge.py's defaults
    meta = probe[0]["params"]["_meta"]
    assert meta["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
    assert meta["io.modelcontextprotocol/clientCapabilities"] == ({"roots": {}} if first == "server/discover" else {})
    assert meta["io.modelcontextprotocol/clientInfo"]["name"] == "bridge.py proxy"
    s.nothing()                                                   # the probe's answer is swallowed
    s.request("tools/list", mid=5)
    assert s.reply()["id"] == 5
    s.close()


def test_stats_rates_are_over_a_fixed_window_not_since_the_last_stats(session):
    """Stats published on every state change must not turn a few messages into a huge rate: the
    rates are taken over a fixed window, whenever they are asked for."""
    s = session(harness=True)
    for mid in range(1, 41):
        s.request("ping", mid=mid)
    assert {s.reply()["id"] for _ in range(40)} == set(range(1, 41))
    first = s.ctl("bridge:stats", cid="a")[0]["data"]["result"]
    second = s.ctl("bridge:stats", cid="b")[0]["data"]["result"]       # right after: same window
    for stats in (first, second):
        assert stats["messagesIn"] == 40 and 0 < stats["rateWindowSec"] <= 5.5
        assert stats["messagesInPerSec"] == pytest.approx(40 / stats["rateWindowSec"], rel=0.1)
    assert second["messagesInPerSec"] == pytest.approx(first["messagesInPerSec"], rel=0.5)
    s.close()


def test_dashboard_token_file_inside_the_repository_is_refused(tmp_path):
    """XDG_CONFIG_HOME inside the repository would put this run's dashboard token where an agent
    reads it: the proxy refuses to start (exit 2, naming the folder) and writes nothing."""
    repo = make_git_repo(tmp_path / "repo")
    config = repo / ".config"
    out = subprocess.run([PYTHON, str(BRIDGE), "proxy", "--"] + SERVER, cwd=repo, input="",
                         env=clean_env(BRIDGE_OBS_PORT=0, XDG_CONFIG_HOME=config),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and str(config / "bridge") in out.stderr, out.stderr
    assert "inside the repository" in out.stderr and "Traceback" not in out.stderr
    assert not config.exists()
    # --root a subfolder of the repository: the whole repository is the agent's, not just the subfolder
    (repo / "sub").mkdir()
    out = subprocess.run([PYTHON, str(BRIDGE), "proxy", "--root", "sub", "--"] + SERVER, cwd=repo,
                         input="", env=clean_env(BRIDGE_OBS_PORT=0, XDG_CONFIG_HOME=config),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "inside the repository" in out.stderr, out.stderr
    assert not config.exists()


def test_readme_proxy_quick_start_runs_as_written(tmp_path):
    """The README's proxy quick start, run with sh from the clone: the fixture server's answers to
    initialize and tools/list come out on stdout, the dashboard URL with this run's token on
    stderr, and the proxy exits by itself at the end of its input, removing its URL file."""
    out = subprocess.run(["sh", "-ec", readme_quickstart("quickstart proxy")], cwd=BRIDGE.parent,
                         env=clean_env(BRIDGE_OBS_PORT=0, XDG_CONFIG_HOME=tmp_path),
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    answers = [json.loads(line) for line in out.stdout.splitlines()]
    assert [a["id"] for a in answers] == [1, 2], out.stdout
    assert answers[0]["result"]["serverInfo"]["name"] == "fixture"
    assert "echo" in [tool["name"] for tool in answers[1]["result"]["tools"]]
    url = re.search(r"dashboard with this run's token: (http://127\.0\.0\.1:\d+/\?token=\S+)", out.stderr)
    assert url, out.stderr
    assert list((tmp_path / "bridge").glob("proxy-*.url")) == []


def test_an_answer_to_a_stopping_servers_request_never_reaches_the_next_one(session):
    """The client answers a request of the server while bridge.py stops that server (here one
    that ignores SIGTERM and stdin EOF, so it lives on until SIGKILL): the answer is for that server, never
    held for the next one, which did not ask."""
    s = session(["--ignore-term", "--ignore-eof"], harness=True, config={"lifecycle": {"cooldown": 20},
                                                         "proxy": {"kill_after_sec": 1.0}})
    s.initialize()
    s.call("ask", id="q-old")
    assert s.recv()["id"] == "q-old"
    s.ctl("doctor:restart")
    s.send({"jsonrpc": "2.0", "id": "q-old", "result": {"late": True}})
    assert s.reply()["error"]["data"]["reason"] == "restart"
    s.wait_event("doctor:ready", count=2)
    mid = s.request("ping")
    assert s.reply()["id"] == mid
    assert not [line for line in s.received(s.pids()[1]) if "q-old" in line]
    s.close()
