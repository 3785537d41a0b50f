"""ObservabilityServer (bridge.py section 5b): RFC 6455 conformance over raw sockets, modelled
on the Autobahn|Testsuite case groups (1 framing, 2 ping/pong, 3 reserved bits, 4 opcodes,
5 fragmentation, 6 UTF-8, 7 close, 9 limits), the /events and /control contracts, the security
rules (token, Origin, loopback), slow clients, and the dashboard page in headless Chromium."""
import base64
import hashlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import obs_harness  # noqa: E402

BRIDGE_MODULE = obs_harness.load_bridge()


@pytest.fixture
def make_harness():
    made = []

    def make(**kwargs):
        harness = obs_harness.Harness(bridge=BRIDGE_MODULE, **kwargs)
        assert harness.start(), harness.logs
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.stop()


@pytest.fixture
def harness(make_harness):
    return make_harness()


# ---- a tiny raw WebSocket client: every byte on the wire is chosen by the test ----

def http_request(port, path="/", method="GET", headers=None, timeout=5):
    """Send one request, return (status, headers dict, body bytes) of the answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    headers = dict({"Host": "127.0.0.1:%d" % port}, **(headers or {}))
    lines = ["%s %s HTTP/1.1" % (method, path)] + ["%s: %s" % kv for kv in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    data = b""
    while True:  # to EOF, to Content-Length, or only the head of an upgrade
        head, sep, body = data.partition(b"\r\n\r\n")
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        if sep and (data.startswith(b"HTTP/1.1 101 ") or length and
                    len(body) >= int(length.group(1))):
            break
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), hdrs, body


def upgrade_headers(key="dGhlIHNhbXBsZSBub25jZQ==", **extra):
    headers = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Key": key,
               "Sec-WebSocket-Version": "13"}
    headers.update(extra)
    return headers


class WsClient:
    def __init__(self, port, path="/events", headers=None, query=""):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = ["GET %s%s HTTP/1.1" % (path, query), "Host: 127.0.0.1:%d" % port]
        lines += ["%s: %s" % kv for kv in upgrade_headers(key, **(headers or {})).items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            assert chunk, "connection closed during handshake"
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        self.status = int(head.split()[1])
        assert self.status == 101, head
        expect = base64.b64encode(hashlib.sha1((key + obs_harness_guid()).encode()).digest())
        assert b"Sec-WebSocket-Accept: " + expect in head

    def recv_exact(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("connection closed")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def send_frame(self, opcode, payload=b"", fin=True, mask=True, rsv=0):
        if isinstance(payload, str):
            payload = payload.encode()
        head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
        n = len(payload)
        m = 0x80 if mask else 0
        if n < 126:
            head += bytes([m | n])
        elif n < 65536:
            head += bytes([m | 126]) + struct.pack("!H", n)
        else:
            head += bytes([m | 127]) + struct.pack("!Q", n)
        if mask:
            key = os.urandom(4)
            head += key
            payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload)) if n < 4096 else \
                BRIDGE_MODULE.ws_unmask(payload, key)
        self.sock.sendall(head + payload)

    def recv_frame(self):
        b0, b1 = self.recv_exact(2)
        assert not b1 & 0x80, "server frames must not be masked"
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self.recv_exact(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self.recv_exact(8))[0]
        return bool(b0 & 0x80), b0 & 0x0F, self.recv_exact(n)

    def recv_json(self, skip_types=()):
        while True:
            fin, opcode, payload = self.recv_frame()
            assert fin and opcode == 1, (opcode, payload)
            msg = json.loads(payload)
            if msg.get("type") not in skip_types:
                return msg

    def expect_close(self, code):
        """Read until a close frame, check its code, then check the server closes TCP."""
        while True:
            fin, opcode, payload = self.recv_frame()
            if opcode == 8:
                break
        got = struct.unpack("!H", payload[:2])[0] if payload else None
        assert got == code, (got, payload)
        self.sock.settimeout(5)
        try:
            while self.sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        return payload[2:].decode()

    def command(self, action, id="c1", params=None):
        msg = {"id": id, "action": action}
        if params is not None:
            msg["params"] = params
        self.send_frame(1, json.dumps(msg))
        return self.recv_json()

    def close(self):
        self.sock.close()


def obs_harness_guid():
    return BRIDGE_MODULE.WS_GUID


# ---- handshake (RFC 6455 section 4) ----

def test_accept_key_matches_rfc_vector_and_extensions_are_declined(harness):
    status, headers, _ = http_request(harness.port, "/events", headers=upgrade_headers(
        **{"Sec-WebSocket-Extensions": "permessage-deflate; client_max_window_bits",
           "Sec-WebSocket-Protocol": "chat"}))
    assert status == 101
    assert headers["sec-websocket-accept"] == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    assert "sec-websocket-extensions" not in headers
    assert "sec-websocket-protocol" not in headers


@pytest.mark.parametrize("path,method,headers,status", [
    ("/events", "GET", upgrade_headers(key="c2hvcnQ="), 400),             # key is not 16 bytes
    ("/events", "GET", upgrade_headers(key="not base64!!"), 400),
    ("/events", "GET", {"Upgrade": "websocket", "Connection": "Upgrade",
                        "Sec-WebSocket-Version": "13"}, 400),              # no key
    ("/control", "GET", {}, 400),                                          # plain GET
    ("/events", "GET", upgrade_headers(**{"Connection": "keep-alive"}), 400),
    ("/events", "GET", upgrade_headers(**{"Sec-WebSocket-Version": "8"}), 426),
    ("/events", "POST", upgrade_headers(), 405),
    ("/nope", "GET", upgrade_headers(), 404),
])
def test_bad_handshakes_get_http_errors(harness, path, method, headers, status):
    got, hdrs, body = http_request(harness.port, path, method, headers)
    assert got == status, body
    if status == 426:
        assert hdrs["sec-websocket-version"] == "13"


def test_malformed_request_and_endless_head(harness):
    sock = socket.create_connection(("127.0.0.1", harness.port), timeout=5)
    sock.sendall(b"garbage\r\n\r\n")
    assert sock.recv(100).startswith(b"HTTP/1.1 400")
    sock.close()
    sock = socket.create_connection(("127.0.0.1", harness.port), timeout=5)
    sock.sendall(b"GET / HTTP/1.1\r\nno colon here\r\n\r\n")
    assert sock.recv(100).startswith(b"HTTP/1.1 400")
    sock.close()
    sock = socket.create_connection(("127.0.0.1", harness.port), timeout=5)
    try:
        sock.sendall(b"GET / HTTP/1.1\r\nX: " + b"a" * 20000)
    except OSError:
        pass
    assert sock.recv(100).startswith(b"HTTP/1.1 431")
    sock.close()


def test_frame_sent_right_behind_the_handshake_is_read(harness):
    key = base64.b64encode(os.urandom(16)).decode()
    sock = socket.create_connection(("127.0.0.1", harness.port), timeout=5)
    req = "GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(
        "%s: %s\r\n" % kv for kv in upgrade_headers(key).items()) + "\r\n"
    mask = b"\x00\x00\x00\x00"
    sock.sendall(req.encode() + b"\x89\x82" + mask + b"hi")   # ping "hi" in the same packet
    data = b""
    while b"\x8a\x02hi" not in data:
        chunk = sock.recv(4096)
        assert chunk
        data += chunk
    sock.close()


# ---- /events and /control ----

def test_events_stream_history_then_live_events(harness):
    ws = WsClient(harness.port, "/events")
    first = ws.recv_json()
    assert first["type"] == "doctor:starting" and first["data"] == {"generation": 1}
    assert isinstance(first["ts"], int) and abs(first["ts"] / 1000 - time.time()) < 60
    assert ws.recv_json()["type"] == "doctor:ready"
    deadline = time.time() + 5
    while harness.server.client_count != 1 and time.time() < deadline:
        time.sleep(0.01)
    assert harness.server.client_count == 1
    harness.server.publish("mcp:request", {"method": "tools/call", "id": 7, "text": "naïve ✓"})
    harness.server.publish("odd", {"when": object()})       # unserialisable -> str(), no crash
    ev = ws.recv_json()
    assert ev["type"] == "mcp:request" and ev["data"]["text"] == "naïve ✓"
    assert ws.recv_json()["data"]["when"].startswith("<object")
    # text sent on /events is ignored, the stream goes on
    ws.send_frame(1, "hello")
    harness.server.publish("doctor:crashed", {"generation": 1})
    assert ws.recv_json()["type"] == "doctor:crashed"
    ws.send_frame(8, struct.pack("!H", 1000))
    ws.expect_close(1000)
    deadline = time.time() + 5
    while harness.server.client_count and time.time() < deadline:
        time.sleep(0.01)
    assert harness.server.client_count == 0


def test_control_acks_name_the_id_and_the_outcome(harness):
    ws = WsClient(harness.port, "/control")
    ack = ws.command("doctor:restart", id="r-1", params={})
    assert ack == {"type": "ack", "id": "r-1", "action": "doctor:restart", "ok": True,
                   "result": {"generation": 2}}
    ack = ws.command("bridge:stats", id=42)
    assert ack["id"] == 42 and ack["ok"] and ack["result"]["doctorRestarts"] == 1
    ack = ws.command("doctor:explode", id="x")
    assert ack == {"type": "ack", "id": "x", "action": "doctor:explode", "ok": False,
                   "error": "unknown action"}
    assert ws.command("boom", id="b")["error"].startswith("internal error")
    assert ws.command("bridge:pause", id=None)["error"] == "missing id"
    assert ws.command("", id="e")["error"] == "missing action"
    assert ws.command("bridge:pause", id="p", params=[1])["error"] == "params must be an object"
    ws.send_frame(1, "{not json")
    ack = ws.recv_json()
    assert ack["id"] is None and not ack["ok"] and ack["error"].startswith("invalid JSON")
    ws.send_frame(1, "[1,2]")
    assert ws.recv_json()["error"] == "command must be an object"
    ws.send_frame(1, '"abc"')              # a JSON string is no command either: never echoed back
    assert ws.recv_json()["error"] == "command must be an object"
    assert [a for a, _ in harness.actions] == ["doctor:restart", "bridge:stats",
                                               "doctor:explode", "boom"]
    assert ws.command("bridge:resume", id="still-alive")["ok"]   # the connection survived all that
    ws.send_frame(2, b"\x00binary")
    ws.expect_close(1003)


def test_control_without_a_handler(make_harness):
    server = BRIDGE_MODULE.ObservabilityServer("127.0.0.1", 0, log=lambda text: None)
    assert server.start()
    try:
        ws = WsClient(server.port, "/control")
        ack = ws.command("doctor:restart", id="1")
        assert not ack["ok"] and "not available" in ack["error"]
    finally:
        server.stop()


def test_dashboard_page_is_served(harness):
    status, headers, body = http_request(harness.port, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    page = body.decode()
    for needle in ("/events", "/control", "doctor:restart", "bridge:shutdown", "token"):
        assert needle in page
    assert "http://" not in page.split("<script>")[1]    # self-contained: no external assets


# ---- framing: masking, reserved bits, opcodes (Autobahn 1.x, 3.x, 4.x) ----

@pytest.mark.parametrize("frame", [
    dict(opcode=1, payload="hi", mask=False),                     # unmasked client frame
    dict(opcode=1, payload="hi", rsv=1),                          # 3.1 .. 3.7
    dict(opcode=1, payload="hi", rsv=2),
    dict(opcode=9, payload="", rsv=4),
    dict(opcode=3, payload=""), dict(opcode=7, payload="x"),      # 4.1.x reserved data opcodes
    dict(opcode=0xB, payload=""), dict(opcode=0xF, payload="x"),  # 4.2.x reserved control opcodes
    dict(opcode=0, payload="orphan"),                             # 5.9 continuation w/o message
])
def test_protocol_violations_close_1002_and_others_carry_on(harness, frame):
    bystander = WsClient(harness.port, "/control")
    ws = WsClient(harness.port, "/events")
    ws.send_frame(**frame)
    ws.expect_close(1002)
    assert bystander.command("bridge:stats", id="after")["ok"]


# ---- ping/pong and control frames (Autobahn 2.x) ----

def test_ping_pong_and_control_frame_limits(harness):
    ws = WsClient(harness.port, "/control")
    ws.send_frame(9, b"")
    assert ws.recv_frame() == (True, 0xA, b"")
    ws.send_frame(9, b"\x00\xffbinary" + b"p" * 117)          # 125 bytes, the maximum (2.4)
    assert ws.recv_frame() == (True, 0xA, b"\x00\xffbinary" + b"p" * 117)
    ws.send_frame(0xA, b"unsolicited")                        # 2.7: ignored
    assert ws.command("bridge:stats", id="s")["ok"]
    ws.send_frame(9, b"x" * 126)                              # 2.5: too long
    ws.expect_close(1002)
    ws = WsClient(harness.port, "/control")
    ws.send_frame(9, b"frag", fin=False)                      # control frames never fragmented
    ws.expect_close(1002)


# ---- fragmentation (Autobahn 5.x) ----

def test_fragmented_message_with_ping_in_between(harness):
    ws = WsClient(harness.port, "/control")
    text = json.dumps({"id": "frag", "action": "bridge:pause", "params": {}})
    ws.send_frame(1, text[:5], fin=False)
    ws.send_frame(9, b"mid")                                  # 5.19: answered at once
    assert ws.recv_frame() == (True, 0xA, b"mid")
    ws.send_frame(0, text[5:20], fin=False)
    ws.send_frame(0, text[20:], fin=True)
    assert ws.recv_json() == {"type": "ack", "id": "frag", "action": "bridge:pause", "ok": True,
                              "result": {"generation": 1}}


def test_new_message_inside_a_fragmented_one_is_refused(harness):
    ws = WsClient(harness.port, "/control")
    ws.send_frame(1, "{", fin=False)
    ws.send_frame(1, "{}", fin=True)
    ws.expect_close(1002)


# ---- UTF-8 (Autobahn 6.x) ----

def test_utf8_valid_split_inside_a_code_point(harness):
    ws = WsClient(harness.port, "/control")
    data = json.dumps({"id": "κόσμε-𝄞", "action": "bridge:stats"}, ensure_ascii=False).encode()
    cut = data.index("𝄞".encode()) + 2                        # split a 4-byte sequence
    ws.send_frame(1, data[:cut], fin=False)
    ws.send_frame(0, data[cut:cut + 1], fin=False)
    ws.send_frame(0, data[cut + 1:])
    assert ws.recv_json()["id"] == "κόσμε-𝄞"


@pytest.mark.parametrize("fragments", [
    [b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80edited"],   # 6.3.1 surrogate
    [b"\xff"],
    [b"\xce\xba\xe1", b"\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xf4\x90\x80\x80"],  # > U+10FFFF, split
    [b"ok\xe2\x82", b""],                                                   # truncated at the end
])
def test_utf8_invalid_closes_1007(harness, fragments):
    ws = WsClient(harness.port, "/events")
    for i, part in enumerate(fragments):
        ws.send_frame(1 if i == 0 else 0, part, fin=i == len(fragments) - 1)
    ws.expect_close(1007)


def test_utf8_fails_fast_before_the_message_ends(harness):
    ws = WsClient(harness.port, "/events")
    ws.send_frame(1, b"\xce\xba\xed\xa0\x80", fin=False)     # 6.4.x: no FIN ever sent
    ws.expect_close(1007)


# ---- close handling (Autobahn 7.x) ----

@pytest.mark.parametrize("code", [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000,
                                  3999, 4000, 4999])
def test_valid_close_codes_are_echoed(harness, code):
    ws = WsClient(harness.port, "/events")
    ws.send_frame(8, struct.pack("!H", code) + "bye ✓".encode())
    ws.expect_close(code)


@pytest.mark.parametrize("code", [0, 999, 1004, 1005, 1006, 1016, 1100, 2000, 2999, 5000])
def test_invalid_close_codes_are_protocol_errors(harness, code):
    ws = WsClient(harness.port, "/events")
    ws.send_frame(8, struct.pack("!H", code))
    ws.expect_close(1002)


def test_close_payload_edge_cases(harness):
    ws = WsClient(harness.port, "/events")
    ws.send_frame(8, b"")                                     # 7.3.1: clean close
    ws.expect_close(1000)
    ws = WsClient(harness.port, "/events")
    ws.send_frame(8, b"\x03")                                 # 7.3.2: one byte
    ws.expect_close(1002)
    ws = WsClient(harness.port, "/events")
    ws.send_frame(8, struct.pack("!H", 1000) + b"\xce\xba\xed\xa0\x80")   # 7.5.1
    ws.expect_close(1007)


def test_stop_sends_going_away(make_harness):
    harness = make_harness()
    ws = WsClient(harness.port, "/events")
    ws.recv_json()
    harness.server.stop()
    assert ws.expect_close(1001) == "bridge stopping"


# ---- limits (Autobahn 9.x) ----

def test_message_size_limit(harness):
    limit = BRIDGE_MODULE.OBS_MAX_MESSAGE
    ws = WsClient(harness.port, "/control")
    ws.send_frame(2, b"\x00" * limit, fin=False)              # exactly at the limit: fine so far
    ws.send_frame(0, b"\x00", fin=True)                       # one byte more: 1009
    ws.expect_close(1009)
    ws = WsClient(harness.port, "/events")
    ws.sock.sendall(bytes([0x81, 0xFF]) + struct.pack("!Q", 1 << 62) + b"mask")  # claims 4 EiB
    ws.expect_close(1009)
    ws = WsClient(harness.port, "/events")
    ws.send_frame(1, "é" * (limit // 2))                       # a 1 MiB text message is accepted
    ws.send_frame(9, b"after")
    while True:
        fin, opcode, payload = ws.recv_frame()
        if opcode == 0xA:
            assert payload == b"after"
            break


# ---- security ----

def test_token_required_everywhere_when_set(make_harness):
    harness = make_harness(token="s3cret-token")
    for path in ("/", "/events", "/control"):
        assert http_request(harness.port, path, headers=upgrade_headers())[0] == 401
        assert http_request(harness.port, path + "?token=wrong",
                            headers=upgrade_headers())[0] == 401
        assert http_request(harness.port, path, headers=upgrade_headers(
            Authorization="Bearer nope"))[0] == 401
    assert http_request(harness.port, "/?token=s3cret-token")[0] == 200
    assert http_request(harness.port, "/", headers={"Authorization": "Bearer s3cret-token"})[0] == 200
    ws = WsClient(harness.port, "/control", query="?token=s3cret-token")
    assert ws.command("bridge:stats")["ok"]
    ws = WsClient(harness.port, "/events", headers={"Authorization": "Bearer s3cret-token"})
    assert ws.recv_json()["type"] == "doctor:starting"
    assert not any("s3cret" in line for line in harness.logs)


def test_non_loopback_needs_a_token():
    logs = []
    server = BRIDGE_MODULE.ObservabilityServer("0.0.0.0", 0, log=logs.append)
    assert server.start() is False
    assert "refusing" in logs[0] and "BRIDGE_OBS_TOKEN" in logs[0]
    assert BRIDGE_MODULE.ObservabilityServer("dashboard.example", 0, log=logs.append).start() is False
    assert "refusing" in logs[1]
    localhost = BRIDGE_MODULE.ObservabilityServer("localhost", 0, log=logs.append)
    assert localhost.start() is True
    localhost.stop()
    server = BRIDGE_MODULE.ObservabilityServer("0.0.0.0", 0, token="t" * 20, log=logs.append)
    assert server.start() is True
    try:
        assert http_request(server.port, "/?token=" + "t" * 20)[0] == 200
        # with a token, the page's own origin is whatever host name the browser used
        ws = WsClient(server.port, "/events", query="?token=" + "t" * 20,
                      headers={"Origin": "http://127.0.0.1:%d" % server.port})
        ws.close()
    finally:
        server.stop()


def test_foreign_origins_are_refused(make_harness):
    harness = make_harness(allowed_origins=["https://dash.example.org"])
    port = harness.port
    for origin in ("https://evil.example", "null", "http://127.0.0.1:1", "http://localhost.evil:%d"
                   % port, "http://attacker.example:%d" % port):
        for path in ("/", "/events", "/control"):
            status = http_request(port, path, headers=upgrade_headers(Origin=origin))[0]
            assert status == 403, (origin, path)
    for origin in ("http://127.0.0.1:%d" % port, "http://localhost:%d" % port,
                   "http://[::1]:%d" % port, "https://dash.example.org", "HTTP://LOCALHOST:%d" % port):
        ws = WsClient(port, "/control", headers={"Origin": origin})
        assert ws.command("bridge:stats")["ok"]
    assert harness.actions and all(a == "bridge:stats" for a, _ in harness.actions)


def raw_events_client(port, rcvbuf=4096):
    """An /events client that completes the handshake and then never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(("GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(
        "%s: %s\r\n" % kv for kv in upgrade_headers(key).items()) + "\r\n").encode())
    return sock


def wait_clients(harness, n):
    deadline = time.time() + 5
    while harness.server.client_count != n and time.time() < deadline:
        time.sleep(0.01)
    assert harness.server.client_count == n


def test_slow_client_is_dropped_without_slowing_publish(make_harness):
    harness = make_harness(max_queue=50)
    slow = raw_events_client(harness.port)
    control = WsClient(harness.port, "/control")
    wait_clients(harness, 1)
    # 2000 events of 10 KB from the control thread: far more than the slow client's socket
    # buffers and queue hold. A blocking publish would never ack (the socket times out).
    ack = control.command("burst", id="burst", params={"count": 2000, "size": 10000})
    assert ack["ok"] and ack["id"] == "burst"
    wait_clients(harness, 0)
    assert any("slow client" in line for line in harness.logs)
    slow.settimeout(5)
    with pytest.raises((ConnectionResetError, EOFError)):
        while slow.recv(65536):
            pass
        raise EOFError
    # nobody else noticed: control still answers, a new dashboard gets events
    assert control.command("bridge:stats", id="after")["ok"]
    fresh = WsClient(harness.port, "/events")
    harness.server.publish("doctor:crashed", {"generation": 1})
    assert fresh.recv_json(skip_types=("doctor:starting", "doctor:ready", "mcp:response",
                                       "bridge:stats"))["type"] == "doctor:crashed"


def test_client_that_keeps_up_loses_nothing_beside_a_stuck_one(make_harness):
    harness = make_harness(max_queue=200)
    stuck = raw_events_client(harness.port)
    fast = WsClient(harness.port, "/events")
    wait_clients(harness, 2)
    got = []

    def reader():
        while len(got) < 2 + 2000:
            got.append(fast.recv_json())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    for batch in range(40):           # paced like a busy relay: 50 events of 4 KB per 10 ms
        for i in range(50):
            harness.server.publish("mcp:response", {"i": batch * 50 + i, "blob": "x" * 4000})
        time.sleep(0.01)
    thread.join(30)
    assert [m["data"]["i"] for m in got[2:]] == list(range(2000))
    wait_clients(harness, 1)          # the stuck one was dropped along the way
    stuck.close()


def test_port_in_use_returns_false(harness):
    logs = []
    server = BRIDGE_MODULE.ObservabilityServer("127.0.0.1", harness.port, log=logs.append)
    assert server.start() is False
    assert "cannot listen" in logs[0] and str(harness.port) in logs[0]
    idle = BRIDGE_MODULE.ObservabilityServer("127.0.0.1", 0, log=logs.append)   # never started
    idle.publish("doctor:ready", {})                      # a no-op, never an error
    assert idle.client_count == 0
    idle.stop()


def test_harness_script_serves_until_killed():
    proc = subprocess.Popen([sys.executable, str(Path(obs_harness.__file__)), "--interval", "0.1"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        ws = WsClient(int(line.split()[1]), "/control")
        assert ws.command("doctor:kill", id="k")["ok"]
        assert json.loads(proc.stdout.readline().split(" ", 1)[1])["action"] == "doctor:kill"
    finally:
        proc.terminate()
        proc.wait(10)


# ---- the dashboard in a real headless browser ----

def find_browser():
    for name in (os.environ.get("BRIDGE_TEST_CHROMIUM"), "chromium", "chromium-browser",
                 "google-chrome", "google-chrome-stable"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class Browser:
    """Headless Chromium driven over the DevTools protocol with the raw client above."""

    def __init__(self, exe, url, tmp):
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", "--user-data-dir=%s" % tmp, "--remote-debugging-port=0",
             url], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        active, deadline = Path(tmp) / "DevToolsActivePort", time.time() + 30
        while not (active.exists() and active.read_text().count("\n") >= 1):
            assert self.proc.poll() is None, self.proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = int(active.read_text().split()[0])
        while True:
            _, _, body = http_request(port, "/json/list", headers={"Connection": "close"})
            pages = [t for t in json.loads(body) if t["type"] == "page"]
            if pages:
                break
            assert time.time() < deadline, "no page target"
            time.sleep(0.1)
        self.ws = WsClient(port, pages[0]["webSocketDebuggerUrl"].split(str(port), 1)[1])
        self.seq = 0

    def call(self, method, **params):
        """One DevTools command; its result."""
        self.seq += 1
        self.ws.send_frame(1, json.dumps({"id": self.seq, "method": method, "params": params}))
        while True:
            data, fin = b"", False
            while not fin:
                fin, _, part = self.ws.recv_frame()
                data += part
            msg = json.loads(data)
            if msg.get("id") == self.seq:
                assert "error" not in msg, msg
                return msg["result"]

    def evaluate(self, expression):
        return self.call("Runtime.evaluate", expression=expression,
                         returnByValue=True)["result"].get("value")

    def screenshot(self, path, width, height):
        """A PNG of the page in a width x height viewport, saved to path; (width, height, rows
        of RGB tuples) decoded with zlib alone (8-bit RGB or RGBA, as Chromium writes them)."""
        import zlib
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        Path(path).write_bytes(png)
        pos, chunks, idat = 8, {}, b""
        while pos < len(png):
            size = int.from_bytes(png[pos:pos + 4], "big")
            kind, body = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + size]
            idat += body if kind == b"IDAT" else b""
            chunks.setdefault(kind, body)
            pos += 12 + size
        w, h = int.from_bytes(chunks[b"IHDR"][:4], "big"), int.from_bytes(chunks[b"IHDR"][4:8], "big")
        depth, color = chunks[b"IHDR"][8], chunks[b"IHDR"][9]
        assert depth == 8 and color in (2, 6), (depth, color)
        bpp = 3 if color == 2 else 4
        raw, stride, rows, prior = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
        for y in range(h):
            kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
            for i in range(stride):
                a, b = line[i - bpp] if i >= bpp else 0, prior[i]
                c = prior[i - bpp] if i >= bpp else 0
                if kind == 1:
                    line[i] = (line[i] + a) & 255
                elif kind == 2:
                    line[i] = (line[i] + b) & 255
                elif kind == 3:
                    line[i] = (line[i] + (a + b) // 2) & 255
                elif kind == 4:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(w)])
            prior = line
        return w, h, rows

    def wait_for(self, expression, what, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError("dashboard never showed %s; page: %s" % (what, self.evaluate(
            "document.body.innerText")))

    def close(self):
        import signal
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


def test_dashboard_in_headless_chromium(make_harness, tmp_path):
    exe = find_browser()
    if not exe:
        pytest.skip("no Chromium found (apt-get install chromium, or set BRIDGE_TEST_CHROMIUM)")
    harness = make_harness(token="dash-token-123", interval=0.2)
    browser = Browser(exe, "http://127.0.0.1:%d/?token=dash-token-123" % harness.port, tmp_path)
    try:
        text = "document.getElementById(%r).textContent"
        browser.wait_for(text % "conn" + " === 'events live, control live'", "both sockets live")
        browser.wait_for(text % "state" + " === 'ready'", "the doctor state")
        browser.wait_for(text % "generation" + " === '1'", "the generation")
        browser.wait_for(text % "log" + ".includes('doctor:ready')", "the event log")
        browser.wait_for(text % "rateIn" + " !== '-'", "message rates")   # from the first stats event
        browser.wait_for(text % "messages" + ".includes(' / ')", "message counts")
        assert ("bridge:stats", {}) in harness.actions          # asked for stats on connect
        browser.evaluate("document.querySelector('button[data-action=\"doctor:restart\"]').click()")
        browser.wait_for(text % "ack" + ".includes('doctor:restart: ok')", "the ack")
        browser.wait_for(text % "generation" + " === '2'", "the new generation")
        browser.wait_for(text % "log" + ".includes('doctor:crashed')", "the crash event")
        browser.wait_for(text % "restarts" + " === '1'", "the restart count")
        assert ("doctor:restart", {}) in harness.actions
        browser.evaluate("document.querySelector('button[data-action=\"bridge:pause\"]').click()")
        browser.wait_for(text % "ack" + ".includes('bridge:pause: ok')", "the pause ack")
        browser.wait_for(text % "state" + " === 'paused'", "the paused state")
    finally:
        browser.close()


def test_connection_limit_drops_the_quietest_to_make_room(harness):
    """64 idle connections cannot lock the dashboard out: a new one takes the slot of the
    connection quiet the longest, and the cap holds."""
    held = [WsClient(harness.port, "/events") for _ in range(BRIDGE_MODULE.OBS_MAX_CONNECTIONS)]
    held[0].send_frame(9, b"alive")                        # the oldest, but not the quietest
    while held[0].recv_frame()[1] != 0xA:
        pass
    status, _, body = http_request(harness.port, "/")
    assert status == 200, body
    held[1].sock.settimeout(5)
    with pytest.raises((EOFError, ConnectionResetError)):
        while True:
            held[1].recv_frame()                           # history, then the end
    assert len(harness.server.conns) <= BRIDGE_MODULE.OBS_MAX_CONNECTIONS
    held[0].send_frame(9, b"still")
    while held[0].recv_frame()[1] != 0xA:
        pass
    assert any("quiet the longest" in line for line in harness.logs)
    for ws in held:
        ws.close()


# ---- review findings: hostile clients ----

def test_absurdly_deep_json_on_control_gets_an_ack(harness):
    ws = WsClient(harness.port, "/control")
    ws.send_frame(1, "[" * 100000 + "]" * 100000)
    ack = ws.recv_json()
    assert ack["ok"] is False and ack["error"].startswith("invalid JSON")
    assert ws.command("bridge:stats", id="after")["ok"]                  # the connection stays usable


def test_request_heads_have_one_deadline_and_unfinished_ones_make_room(make_harness):
    harness = make_harness(head_timeout=1.0)
    dribbler = socket.create_connection(("127.0.0.1", harness.port), timeout=10)
    began = time.time()
    dribbler.sendall(b"GET / HTTP/1.1\r\n")
    while time.time() - began < 8:             # one byte every 0.3 s: each recv alone is quick
        time.sleep(0.3)
        try:
            dribbler.sendall(b"X")
        except OSError:                        # the server gave up on the head and closed
            break
    assert time.time() - began < 5
    dribbler.close()
    # 64 unfinished heads cannot lock a dashboard out: the oldest makes room for a new client
    harness.server.head_timeout = 60
    hogs = [socket.create_connection(("127.0.0.1", harness.port)) for _ in range(64)]
    for hog in hogs:
        hog.sendall(b"GET / HTTP/1.1\r\n")
    time.sleep(0.2)
    assert http_request(harness.port, "/")[0] == 200
    for hog in hogs:
        hog.close()


def test_a_client_that_floods_is_slowed_down(harness):
    """Frames cost the reader thread CPU the relay needs: past 2 MiB (or 1000 frames) a second,
    the reader sleeps out the second, so a flooding client waits, not the relay."""
    ws = WsClient(harness.port, "/events")
    began = time.time()
    for _ in range(5):
        ws.send_frame(2, b"x" * (1 << 20))                               # 5 MiB, ignored on /events
    ws.send_frame(9, b"are you there")
    while True:
        fin, opcode, payload = ws.recv_frame()
        if opcode == 10:
            break
    assert payload == b"are you there" and time.time() - began >= 1.5


def test_handshake_needs_http11_and_a_host(harness):
    for request in (b"GET /events HTTP/1.0\r\nHost: x\r\n", b"GET /events HTTP/1.1\r\n"):
        sock = socket.create_connection(("127.0.0.1", harness.port), timeout=5)
        sock.sendall(request + b"".join(b"%s: %s\r\n" % (k.encode(), v.encode())
                                        for k, v in upgrade_headers().items()) + b"\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 400 "), request
        sock.close()


def test_64_bit_length_with_the_top_bit_set_is_a_protocol_error(harness):
    ws = WsClient(harness.port, "/events")
    ws.sock.sendall(bytes([0x81, 0x80 | 127]) + struct.pack("!Q", 1 << 63) + os.urandom(4))
    ws.expect_close(1002)


def test_utf8_surrogate_prefix_fails_at_once(harness):
    ws = WsClient(harness.port, "/control")
    ws.send_frame(1, b"ok\xed\xa0", fin=False)                          # U+D800..: never valid UTF-8
    ws.sock.settimeout(3)
    ws.expect_close(1007)


def test_origin_is_checked_with_a_token_too_and_rebinding_is_refused(make_harness):
    harness = make_harness(token="tok-" + "k" * 20)
    port, query = harness.port, "?token=tok-" + "k" * 20
    assert http_request(port, "/events" + query, headers=upgrade_headers(
        Origin="https://evil.example"))[0] == 403
    loopback = make_harness()                  # no token: the Host header proves nothing
    assert http_request(loopback.port, "/control", headers=upgrade_headers(
        Origin="http://evil.example:%d" % loopback.port, Host="evil.example:%d" % loopback.port))[0] == 403


def test_the_connection_cap_holds_while_unfinished_heads_are_dropped(make_harness):
    harness = make_harness(head_timeout=60)
    hogs = []
    for _ in range(200):
        hog = socket.create_connection(("127.0.0.1", harness.port))
        hog.sendall(b"GET / HTTP/1.1\r\n")
        hogs.append(hog)
    # the server accepts in order: once this later client is served, it has taken all the hogs
    assert http_request(harness.port, "/")[0] == 200
    assert len(harness.server.conns) <= BRIDGE_MODULE.OBS_MAX_CONNECTIONS
    for hog in hogs:
        hog.close()


# ---- a rebinding Host, ambiguous heads, values JSON lacks ----

def test_a_host_that_is_not_ours_is_refused_everywhere(make_harness):
    for harness in (make_harness(), make_harness(token="t" * 24, allowed_origins=["http://dash.example:1"])):
        port, q = harness.port, "?token=" + "t" * 24 if harness.server.token else ""
        for host in ("evil.example:%d" % port, "evil.example", "127.0.0.1.evil.example:%d" % port):
            for path in ("/", "/events", "/control"):
                status, _, body = http_request(port, path + q, headers=upgrade_headers(Host=host))
                assert status == 403 and b"DNS rebinding" in body, (host, path, status, body)
        for host in ("127.0.0.1:%d" % port, "localhost:%d" % port, "[::1]:%d" % port, "LOCALHOST", "127.0.0.2"):
            assert http_request(port, "/" + q, headers={"Host": host})[0] == 200, host
        if q:
            assert http_request(port, "/" + q, headers={"Host": "dash.example:%d" % port})[0] == 200


def raw_request(port, data):
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(data)
    got = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    sock.close()
    return int(got.split()[1]), got


def test_duplicate_origin_or_host_headers_are_refused(harness):
    port = harness.port
    base = "GET /events HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % port + "".join(
        "%s: %s\r\n" % kv for kv in upgrade_headers().items())
    for extra in ("Origin: https://evil.example\r\nOrigin: http://127.0.0.1:%d\r\n" % port,
                  "Host: evil.example\r\n"):
        status, got = raw_request(port, (base + extra + "\r\n").encode())
        assert status == 400 and b"more than one" in got, got


def test_an_unparsable_request_target_is_a_400_not_an_internal_error(harness):
    status, got = raw_request(harness.port, b"GET http://[ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert status == 400 and b"malformed request target" in got
    assert not any("internal error" in line for line in harness.logs), harness.logs


def test_the_head_limit_is_16_kib_even_when_the_end_comes_in_the_last_read(harness):
    head = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: %s\r\n\r\n" % ("p" * 20000)
    status, _ = raw_request(harness.port, head.encode())
    assert status == 431
    head = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: %s\r\n\r\n" % ("p" * 16000)
    assert raw_request(harness.port, head.encode())[0] == 200


def test_acks_never_echo_nan_or_infinity(harness):
    ws = WsClient(harness.port, "/control")
    for text in ('{"id": NaN, "action": "bridge:stats"}', '{"id": "x", "action": "bridge:stats", "n": -Infinity}'):
        ws.send_frame(1, text)
        fin, opcode, payload = ws.recv_frame()
        ack = json.loads(payload, parse_constant=lambda name: pytest.fail("%s in %s" % (name, payload)))
        assert ack["ok"] is False and "invalid JSON" in ack["error"] and "is not JSON" in ack["error"]


def test_lifecycle_events_outlive_a_flood_of_relayed_ones_in_the_history(harness):
    harness.server.publish("doctor:crashed", {"generation": 1, "stderrTail": ["boom"]})
    harness.server.publish("mcp:response", {"id": 5, "from": "bridge", "reason": "crashed"})
    for i in range(3 * BRIDGE_MODULE.OBS_HISTORY):
        harness.server.publish("mcp:request", {"id": i, "method": "tools/call"})
    ws = WsClient(harness.port, "/events")
    seen = [ws.recv_json() for _ in range(BRIDGE_MODULE.OBS_HISTORY + 4)]
    kinds = [(e["type"], e["data"].get("from")) for e in seen]
    assert kinds.index(("doctor:crashed", None)) < kinds.index(("mcp:response", "bridge")) < \
        kinds.index(("mcp:request", None))                 # in the order they happened
    assert seen[-1]["data"]["id"] == 3 * BRIDGE_MODULE.OBS_HISTORY - 1


def test_the_last_crash_outlives_stats_and_dropped_lines_in_the_history(harness):
    # bridge:stats comes every 5 s and on every state change (200 of them: 17 idle minutes), and a
    # server that prints its banner to stdout makes a bridge:dropped per line: neither may push the
    # last crash out of what a dashboard opened later is shown.
    harness.server.publish("doctor:crashed", {"generation": 1, "stderrTail": ["boom"]})
    for i in range(2 * BRIDGE_MODULE.OBS_HISTORY):
        harness.server.publish("bridge:stats", {"uptime": i})
        harness.server.publish("bridge:dropped", {"from": "doctor", "reason": "malformed JSON", "n": i})
    ws = WsClient(harness.port, "/events")
    seen = [ws.recv_json()]
    while seen[-1]["data"].get("n") != 2 * BRIDGE_MODULE.OBS_HISTORY - 1:   # the last event published
        seen.append(ws.recv_json())
    kinds = [e["type"] for e in seen]
    assert "doctor:crashed" in kinds
    assert [e["data"]["uptime"] for e in seen if e["type"] == "bridge:stats"] == [
        2 * BRIDGE_MODULE.OBS_HISTORY - 1]                 # the newest stats are all that count
