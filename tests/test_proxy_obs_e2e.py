"""Observability end to end: `bridge.py proxy` with the fixture MCP server, watched and driven
over the real /events and /control WebSockets (the server class itself is covered in
test_proxy_obs.py)."""
import json
import re
import subprocess
import threading
import time

import pytest

from conftest import BRIDGE, FIXTURES, PYTHON, clean_env, process_running
from test_proxy_obs import BRIDGE_MODULE, WsClient, http_request

pytestmark = pytest.mark.skipif(
    not hasattr(BRIDGE_MODULE, "Proxy") or not (FIXTURES / "mcp_server.py").exists(),
    reason="the proxy core (section 5a) and fixtures/mcp_server.py are not in this tree yet")


class ProxyRun:
    """`bridge.py proxy -- fixture` with pipes; stderr collected by a thread."""

    def __init__(self, tmp_path, **env):
        self.proc = subprocess.Popen(
            [PYTHON, str(BRIDGE), "proxy", "--root", str(tmp_path), "--", PYTHON,
             str(FIXTURES / "mcp_server.py"), "--log", str(tmp_path / "server.jsonl")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
            env=clean_env(**dict({"BRIDGE_OBS_PORT": "0", "BRIDGE_RESTART_COOLDOWN": "100"},
                                 **env)))
        self.err = []
        threading.Thread(target=lambda: self.err.extend(
            line.decode("utf-8", "replace") for line in self.proc.stderr), daemon=True).start()

    def port(self):
        deadline = time.time() + 20
        while time.time() < deadline:
            for line in list(self.err):
                found = re.search(r"dashboard on http://127\.0\.0\.1:(\d+)/", line)
                if found:
                    return int(found.group(1))
            assert self.proc.poll() is None, "".join(self.err)
            time.sleep(0.05)
        raise AssertionError("no dashboard line on stderr:\n" + "".join(self.err))

    def request(self, id, method, params=None):
        msg = {"jsonrpc": "2.0", "id": id, "method": method, "params": params or {}}
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def notify(self, method):
        self.proc.stdin.write((json.dumps({"jsonrpc": "2.0", "method": method}) + "\n").encode())
        self.proc.stdin.flush()

    def response(self):
        """The next response, skipping notifications (e.g. list_changed after a restart)."""
        while True:
            line = self.proc.stdout.readline()
            assert line, "".join(self.err)
            msg = json.loads(line)
            if "id" in msg:
                return msg

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                return self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise
        return self.proc.returncode


def next_event(ws, wanted):
    while True:
        event = ws.recv_json()
        if event["type"] == wanted:
            return event


def test_crash_is_seen_on_events_and_restart_is_acked_on_control(tmp_path):
    run = ProxyRun(tmp_path)
    try:
        port = run.port()
        events = WsClient(port, "/events")
        assert next_event(events, "doctor:starting")["data"]["generation"] == 1
        run.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                      "clientInfo": {"name": "e2e", "version": "1"}})
        assert run.response()["id"] == 1
        run.notify("notifications/initialized")
        run.request(2, "tools/call", {"name": "crash", "arguments": {"code": 3}})
        crashed = next_event(events, "doctor:crashed")
        assert crashed["data"]["generation"] == 1
        assert run.response()["id"] == 2                        # answered with an error, not lost
        assert next_event(events, "doctor:ready")["data"]["generation"] == 2

        control = WsClient(port, "/control")
        ack = control.command("doctor:restart", id="dash-1")
        assert ack["type"] == "ack" and ack["id"] == "dash-1" and ack["ok"], ack
        assert next_event(events, "doctor:ready")["data"]["generation"] == 3
        stats = control.command("bridge:stats", id=7)
        assert stats["ok"] and stats["id"] == 7
        assert stats["result"]["generation"] == 3 and stats["result"]["dashboardClients"] == 1
        assert next_event(events, "bridge:stats")["data"]["generation"] == 3
        assert not control.command("doctor:explode", id="x")["ok"]

        run.request(3, "tools/call", {"name": "echo", "arguments": {"text": "after restarts"}})
        assert run.response()["id"] == 3                        # the relay never noticed
        assert http_request(port, "/")[0] == 200
        # a browser page elsewhere cannot drive /control
        assert http_request(port, "/control", headers={
            "Origin": "https://evil.example", "Upgrade": "websocket", "Connection": "Upgrade",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13"})[0] == 403
        # a client breaking the protocol is closed alone
        bad = WsClient(port, "/control")
        bad.send_frame(1, "unmasked", mask=False)
        bad.expect_close(1002)
        run.request(4, "tools/call", {"name": "echo", "arguments": {"text": "still here"}})
        assert run.response()["id"] == 4
    finally:
        assert run.close() == 0, "".join(run.err)
    for line in (tmp_path / "server.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("event") == "start":
            assert not process_running(record["pid"])


def test_port_in_use_leaves_the_proxy_working(tmp_path):
    import socket
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    run = ProxyRun(tmp_path, BRIDGE_OBS_PORT=str(busy.getsockname()[1]))
    try:
        run.request(1, "tools/call", {"name": "echo", "arguments": {"text": "hi"}})
        assert run.response()["id"] == 1
    finally:
        assert run.close() == 0
        busy.close()
    assert any("cannot listen" in line for line in run.err), "".join(run.err)


def test_non_loopback_without_token_is_refused_but_relay_works(tmp_path):
    run = ProxyRun(tmp_path, BRIDGE_OBS_HOST="0.0.0.0")
    try:
        run.request(1, "tools/call", {"name": "echo", "arguments": {"text": "hi"}})
        assert run.response()["id"] == 1
    finally:
        assert run.close() == 0
    assert any("refusing to listen" in line and "BRIDGE_OBS_TOKEN" in line for line in run.err)
