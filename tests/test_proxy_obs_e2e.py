"""Observability end to end: `bridge.py proxy` with the fixture MCP server, watched and driven
over the real /events and /control WebSockets (the server class itself is covered in
test_proxy_obs.py)."""
import json
import os
import re
import subprocess
import threading
import time

import pytest

from conftest import BRIDGE, FIXTURES, PYTHON, clean_env, process_running
from test_proxy_obs import BRIDGE_MODULE, WsClient, http_request, upgrade_headers

pytestmark = pytest.mark.skipif(
    not hasattr(BRIDGE_MODULE, "Proxy") or not (FIXTURES / "mcp_server.py").exists(),
    reason="the proxy core (section 5a) and fixtures/mcp_server.py are not in this tree yet")


class ProxyRun:
    """`bridge.py proxy -- fixture` with pipes; stderr collected by a thread. The dashboard
    token is off (BRIDGE_OBS_TOKEN=""), unless a test passes BRIDGE_OBS_TOKEN=None for the
    default (a token drawn per run)."""

    def __init__(self, tmp_path, config=None, server_args=(), argv_extra=(), **env):
        options = []
        if config is not None:
            (tmp_path / "cfg.json").write_text(json.dumps(config))
            options = ["--config", str(tmp_path / "cfg.json")]
        self.proc = subprocess.Popen(
            [PYTHON, str(BRIDGE), "proxy", "--root", str(tmp_path)] + options + ["--", PYTHON,
             str(FIXTURES / "mcp_server.py"), "--log", str(tmp_path / "server.jsonl")]
            + list(server_args) + list(argv_extra),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
            env=clean_env(**{k: v for k, v in dict({
                "BRIDGE_OBS_PORT": "0", "BRIDGE_RESTART_COOLDOWN": "100", "BRIDGE_OBS_TOKEN": "",
                "XDG_CONFIG_HOME": str(tmp_path / "config")}, **env).items() if v is not None}))
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


def wait_dashboards(control, count=1):
    """Until `count` /events clients are attached: each handshake finishes on a thread of its
    own, and the proxy builds mcp:* events only while a dashboard watches."""
    deadline = time.time() + 10
    while control.command("bridge:stats", id="wait")["result"]["dashboardClients"] != count:
        assert time.time() < deadline
        time.sleep(0.05)


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


# ---- review findings, through the real proxy ----

def test_acks_report_the_outcome(tmp_path):
    run = ProxyRun(tmp_path, server_args=["--ignore-term", "--ignore-eof"],
                   config={"proxy": {"close_grace_sec": 0.2, "kill_after_sec": 3}})
    try:
        control = WsClient(run.port(), "/control")
        first = control.command("bridge:pause", id="p1")
        assert first["ok"] and first["result"]["paused"] is True and first["result"]["changed"] is True
        again = control.command("bridge:pause", id="p2")
        assert again["ok"] and again["result"]["changed"] is False
        assert control.command("bridge:resume", id="r")["result"]["changed"] is True
        killed = control.command("doctor:kill", id="k1")
        assert killed["ok"] and killed["result"] == {"changed": True, "generation": 1, "state": "killed"}
        assert control.command("doctor:kill", id="k2")["result"]["changed"] is False
        started = control.command("doctor:restart", id="s")
        assert started["ok"] and started["result"]["generation"] == 2
        run.request(1, "ping")
        assert run.response()["id"] == 1
        restarted = control.command("doctor:restart", id="s2")
        assert restarted["result"]["restarting"] == 2 and restarted["result"]["generation"] == 3
        assert control.command("bridge:shutdown", id="bye")["ok"]
        late = control.command("doctor:restart", id="late")   # the Doctor ignores TERM: still stopping
        assert late["ok"] is False and "shutting down" in late["error"]
    finally:
        assert run.close() == 0, "".join(run.err)


def test_bridge_replies_are_counted_and_published(tmp_path):
    run = ProxyRun(tmp_path)
    try:
        port = run.port()
        events, control = WsClient(port, "/events"), WsClient(port, "/control")
        wait_dashboards(control)
        run.request(1, "tools/call", {"name": "echo", "arguments": {"text": "hi"}})
        run.request(2, "tools/call", {"name": "slow", "arguments": {"sec": 30}})   # still owed at the crash
        assert run.response()["id"] == 1
        run.request(3, "tools/call", {"name": "crash", "arguments": {"code": 3}})
        got = sorted(run.response()["id"] for _ in range(2))
        assert got == [2, 3]
        stats = control.command("bridge:stats", id="s")["result"]
        assert stats["messagesOut"] == 3, stats                # the relayed answer and two of bridge.py's
        answered = {}
        while len(answered) < 3:
            event = next_event(events, "mcp:response")
            answered[event["data"]["id"]] = event["data"]
        assert answered[2].get("from") == "bridge" and answered[2]["reason"] == "crashed" and answered[2]["error"], answered
    finally:
        assert run.close() == 0, "".join(run.err)


def test_secrets_given_to_the_server_in_doctor_env_are_redacted(tmp_path):
    secret = "cfgS3cretValue0912ab"
    run = ProxyRun(tmp_path, config={"doctor": {"env": {"UPSTREAM_API_TOKEN": secret}}})
    try:
        events = WsClient(run.port(), "/events")
        wait_dashboards(WsClient(run.port(), "/control"))
        run.request(1, "tools/call", {"name": "stderr", "arguments": {"text": "token %s\n" % secret}})
        assert run.response()["id"] == 1
        run.request(2, "tools/call", {"name": "echo", "arguments": {"text": secret}})
        assert run.response()["result"]["content"][0]["text"] == secret    # the relay is untouched
        request = next_event(events, "mcp:request")
        while request["data"]["id"] != 2:
            request = next_event(events, "mcp:request")
        assert secret not in json.dumps(request) and "[REDACTED]" in request["data"]["params"]
    finally:
        assert run.close() == 0
    err = "".join(run.err)
    assert "[doctor] token [REDACTED]" in err and secret not in err


def test_lifecycle_events_are_redacted_and_fatal_is_published(tmp_path):
    secret = "ghp_" + "Z" * 36
    run = ProxyRun(tmp_path, argv_extra=["--exit-at-start", "4", "--token", secret],
                   config={"lifecycle": {"maxRestarts": 1, "cooldown": 10}})
    events = WsClient(run.port(), "/events")
    seen = []
    try:
        while not seen or seen[-1]["type"] != "doctor:fatal":
            seen.append(events.recv_json())
    except EOFError:
        pass
    assert run.proc.wait(20) == 1
    assert [e for e in seen if e["type"] == "doctor:fatal"], seen
    starting = [e for e in seen if e["type"] == "doctor:starting"]
    assert starting and all(secret not in json.dumps(e) for e in seen)
    assert "--token [REDACTED]" in starting[0]["data"]["command"]


def test_observability_disabled_leaves_the_relay(tmp_path):
    run = ProxyRun(tmp_path, BRIDGE_OBS_ENABLED="false")
    try:
        run.request(1, "ping")
        assert run.response()["id"] == 1
    finally:
        assert run.close() == 0
    err = "".join(run.err)
    assert "observability: disabled" in err and "dashboard on" not in err


def test_stats_every_five_seconds_by_default(tmp_path):
    run = ProxyRun(tmp_path)
    try:
        events = WsClient(run.port(), "/events")
        first = next_event(events, "bridge:stats")
        second = next_event(events, "bridge:stats")
        assert 4500 <= second["ts"] - first["ts"] <= 7000
        assert set(second["data"]) >= {"uptime", "doctorRestarts", "doctorUptime", "messagesIn",
                                       "messagesOut", "bytesIn", "bytesOut", "dashboardClients"}
    finally:
        assert run.close() == 0


def test_a_dashboard_that_never_reads_is_dropped_and_the_relay_goes_on(tmp_path):
    from test_proxy_obs import raw_events_client
    run = ProxyRun(tmp_path, config={"proxy": {"events_per_sec_max": 1000000, "event_params_max": 8192}})
    try:
        port = run.port()
        stuck = raw_events_client(port)
        control = WsClient(port, "/control")
        wait_dashboards(control)
        blob = "y" * 4000
        for start in range(0, 3000, 500):      # 3,000 events of 4 KB for a client that reads none
            for i in range(start, start + 500):
                run.request(i, "tools/call", {"name": "echo", "arguments": {"text": blob}})
            for _ in range(500):
                assert "result" in run.response()
        deadline = time.time() + 10
        while time.time() < deadline and control.command("bridge:stats", id="t")["result"]["dashboardClients"]:
            time.sleep(0.1)
        assert control.command("bridge:stats", id="u")["result"]["dashboardClients"] == 0
        assert any("slow client" in line for line in run.err)
        stuck.close()
    finally:
        assert run.close() == 0, "".join(run.err)


def chromium_on_dashboard(tmp_path):
    """A ProxyRun and a headless Chromium on its dashboard (the test is skipped without one);
    close both with close_dashboard."""
    from test_proxy_obs import Browser, find_browser
    exe = find_browser()
    if not exe:
        pytest.skip("no Chromium found (apt-get install chromium, or set BRIDGE_TEST_CHROMIUM)")
    run = ProxyRun(tmp_path)
    (tmp_path / "chromium").mkdir()
    return run, Browser(exe, "http://127.0.0.1:%d/" % run.port(), tmp_path / "chromium")


def close_dashboard(run, browser):
    browser.close()
    assert run.close() == 0, "".join(run.err)


def test_dashboard_drives_the_real_proxy_in_headless_chromium(tmp_path):
    run, browser = chromium_on_dashboard(tmp_path)
    try:
        text = "document.getElementById(%r).textContent"
        click = "document.querySelector('button[data-action=\"%s\"]').click()"
        browser.wait_for(text % "conn" + " === 'events live, control live'", "both sockets live")
        browser.wait_for(text % "generation" + " === '1'", "the generation")
        run.request(0, "ping")                  # its first answer makes the server ready
        assert run.response()["id"] == 0
        browser.wait_for(text % "state" + " === 'ready'", "the ready state")
        browser.evaluate(click % "bridge:pause")     # shown at once: the proxy publishes stats after a command
        browser.wait_for(text % "state" + " === 'paused'", "the paused state", timeout=4)
        browser.evaluate(click % "bridge:resume")
        browser.wait_for(text % "state" + " === 'ready'", "the ready state", timeout=4)
        browser.evaluate(click % "doctor:restart")
        browser.wait_for(text % "ack" + ".includes('doctor:restart: ok')", "the ack")
        browser.wait_for(text % "generation" + " === '2'", "the new generation")
        browser.wait_for(text % "restarts" + " === '1'", "the restart count", timeout=4)
        run.request(1, "tools/call", {"name": "echo", "arguments": {"text": "after the click"}})
        assert run.response()["result"]["content"][0]["text"] == "after the click"
    finally:
        close_dashboard(run, browser)


def test_request_headers_are_logged_without_control_characters(tmp_path):
    run = ProxyRun(tmp_path)
    try:
        port = run.port()
        status = http_request(port, "/events", headers=upgrade_headers(
            Origin="https://e\x1b]0;pwned\x07vil.example\x1b[2J"))[0]
        assert status == 403
    finally:
        assert run.close() == 0
    err = "".join(run.err)
    assert "\x1b" not in err and "\x07" not in err
    assert "origin https://e\\x1b]0;pwned\\x07vil.example\\x1b[2J is not allowed" in err, err


def test_dashboard_keeps_the_last_crash_pinned_under_load_in_headless_chromium(tmp_path):
    """40 calls a second, a crash in the middle, 5 s more of traffic: the crash and its stderr
    stay pinned (and in the log), kinds can be filtered, nothing makes a 1280 px page scroll
    sideways, and the screenshot shows the pinned crash."""
    run, browser = chromium_on_dashboard(tmp_path)
    answered = []
    reader = threading.Thread(target=lambda: answered.extend(
        run.response()["id"] for _ in range(262)), daemon=True)
    try:
        text = "document.getElementById(%r).textContent"
        browser.call("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                     deviceScaleFactor=1, mobile=False)
        browser.wait_for(text % "conn" + " === 'events live, control live'", "both sockets live")
        browser.wait_for(text % "ack" + ".includes('bridge:stats: ok')", "the stats ack")
        no_sideways = ("document.documentElement.scrollWidth <= "
                       "document.documentElement.clientWidth")
        assert browser.evaluate(no_sideways), browser.evaluate(text % "ack")
        reader.start()
        started = time.time()
        for n in range(260):                                     # 40 a second for 6.5 s
            if n == 60:
                run.request("s", "tools/call", {"name": "stderr", "arguments": {
                    "text": "<b>disk on fire</b> & <img src=x onerror=alert(1)>\n"}})
                run.request("c", "tools/call", {"name": "crash", "arguments": {"code": 3}})
            run.request(n, "tools/call", {"name": "echo", "arguments": {"text": "load %d" % n}})
            time.sleep(max(0, started + (n + 1) / 40 - time.time()))
        reader.join(60)
        assert len(answered) == 262, answered                   # every call answered
        browser.wait_for("!document.getElementById('crash').hidden", "the pinned crash")
        title, tail = browser.evaluate(text % "crashTitle"), browser.evaluate(text % "crashTail")
        assert "crashed: exit code 3" in title and "generation 1" in title, title
        assert "<b>disk on fire</b> & <img src=x onerror=alert(1)>" in tail, tail   # as text
        assert "fixture: crashing with 3" in tail, tail
        assert browser.evaluate("document.querySelectorAll('#crash img, #log img').length") == 0
        log = browser.evaluate(text % "log")
        assert "doctor:crashed" in log and "doctor:ready" in log   # lifecycle outlives traffic
        assert "client asks tools/call #259" in log and "answer to #259 tools/call" in log, log[:500]
        browser.evaluate("document.getElementById('kind-request').click();"
                         "document.getElementById('kind-response').click()")
        visible = ("[...document.querySelectorAll('#log div')].filter(d => !d.hidden)"
                   ".map(d => d.dataset.kind)")
        kinds = set(browser.evaluate(visible))
        assert "doctor" in kinds and not kinds & {"request", "response"}, kinds
        assert browser.evaluate(no_sideways)
        browser.evaluate("window.scrollTo(0, 0)")
        box = browser.evaluate("JSON.stringify(document.getElementById('crash')"
                               ".getBoundingClientRect())")
        box = json.loads(box)
        assert 0 <= box["top"] and box["bottom"] <= 900, box    # on the first screen
        width, height, rows = browser.screenshot(tmp_path / "pinned-crash.png", 1280, 900)
        assert (width, height) == (1280, 900)
        inside = [rows[y][x] for y in range(int(box["top"]) + 2, int(box["bottom"]) - 2)
                  for x in range(int(box["left"]) + 2, int(box["right"]) - 2)]
        panel = sum(1 for p in inside if abs(p[0] - 0xfd) + abs(p[1] - 0xec) + abs(p[2] - 0xea) < 12)
        ink = sum(1 for p in inside if sum(p) < 300)
        assert panel > 0.6 * len(inside), (panel, len(inside))  # the panel is painted there
        assert ink > 500, ink                                   # with its text on it
    finally:
        close_dashboard(run, browser)


def test_a_token_is_drawn_per_run_unless_one_is_set_or_turned_off(tmp_path):
    run = ProxyRun(tmp_path, BRIDGE_OBS_TOKEN=None)
    try:
        port = run.port()
        deadline = time.time() + 10
        while not any("this run's token" in line for line in run.err):
            assert time.time() < deadline, "".join(run.err)
            time.sleep(0.05)
        line = next(line for line in run.err if "this run's token" in line)
        url, token, path = re.search(r"(http://127\.0\.0\.1:%d/\?token=([\w-]+)); also in (\S+)" % port,
                                     line).groups()
        assert len(token) >= 32 and path == str(tmp_path / "config" / "bridge" / ("proxy-%d.url" % port))
        assert (tmp_path / "config" / "bridge" / ("proxy-%d.url" % port)).read_text() == url + "\n"
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
        for target in ("/", "/control", "/events"):     # another local user cannot get in
            assert http_request(port, target, headers=upgrade_headers())[0] == 401
        assert http_request(port, "/?token=" + token)[0] == 200
        control = WsClient(port, "/control", query="?token=" + token)
        assert control.command("bridge:stats", id=1)["ok"]
    finally:
        assert run.close() == 0, "".join(run.err)
    assert not os.path.exists(path)                     # the run is over: so is its token
    run = ProxyRun(tmp_path / "config")                 # turned off (BRIDGE_OBS_TOKEN="")
    try:
        assert WsClient(run.port(), "/control").command("bridge:stats", id=1)["ok"]
        assert not any("this run's token" in line for line in run.err)
    finally:
        assert run.close() == 0


AUDIT_CHMOD = r"""
import atexit, os, runpy, sys
seen = []
def hook(event, args):   # the mode a file had before bridge.py set its final one
    if event == "os.chmod" and isinstance(args[0], int):
        seen.append((os.readlink("/proc/self/fd/%d" % args[0]), oct(os.fstat(args[0]).st_mode & 0o777)))
sys.addaudithook(hook)
out, sys.argv = sys.argv[1], sys.argv[2:]
atexit.register(lambda: open(out, "w").write(repr(seen)))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_the_token_file_is_never_readable_by_others_not_even_while_written(tmp_path):
    # ~/.config/bridge made by hand (mkdir -p: 0755): the file's temporary copy must not be
    # born 0644 and narrowed after the token is in it, when another user could open it.
    (tmp_path / "config" / "bridge").mkdir(parents=True, mode=0o755)
    seen_file = tmp_path / "seen.txt"
    proc = subprocess.run(
        [PYTHON, "-c", AUDIT_CHMOD, str(seen_file), str(BRIDGE), "proxy", "--root", str(tmp_path), "--",
         PYTHON, str(FIXTURES / "mcp_server.py")], stdin=subprocess.DEVNULL, capture_output=True,
        cwd=tmp_path, timeout=60, env=clean_env(BRIDGE_OBS_PORT="0", XDG_CONFIG_HOME=str(tmp_path / "config")))
    assert proc.returncode == 0, proc.stderr
    assert b"this run's token" in proc.stderr
    seen = [(path, mode) for path, mode in eval(seen_file.read_text()) if "proxy-" in path]
    assert seen and all(mode == "0o600" for _path, mode in seen), seen
    assert list((tmp_path / "config" / "bridge").glob("proxy-*.url")) == []  # removed at the end
