"""Benchmark: cost of ObservabilityServer.publish() for the caller (the proxy's relay loop).

Side by side in one run, median of 5 rounds of 5000 mcp:request-sized events:
  floor       json.dumps of the same event (what any event bus pays at least)
  0 clients   publish() with nobody connected (the common case)
  1, 4 clients publish() fanning out to dashboards that read as fast as they can
plus the delivery rate the dashboards saw. Not a pass/fail test.
"""
import base64
import json
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import obs_harness  # noqa: E402

N, ROUNDS = 5000, 5
EVENT = {"from": "client", "method": "tools/call", "id": 12345, "size": 1024,
         "params": '{"name":"run_tests","arguments":{"path":"tests/unit","verbose":true}}'}


def reader(port, counts, index, stop):
    sock = socket.create_connection(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(("GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade"
                  "\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % key).encode())
    sock.settimeout(0.5)
    while not stop.is_set():
        try:
            data = sock.recv(1 << 20)
        except socket.timeout:
            continue
        if not data:
            break
        counts[index] += data.count(b'"type":"mcp:request"')
    sock.close()


def timed(fn):
    began = time.perf_counter()
    for _ in range(N):
        fn()
    return (time.perf_counter() - began) / N * 1e6


def main():
    bridge = obs_harness.load_bridge()
    server = bridge.ObservabilityServer("127.0.0.1", 0, log=lambda text: None, max_queue=100000)
    assert server.start()
    floor = statistics.median(timed(lambda: json.dumps(
        {"ts": 0, "type": "mcp:request", "data": EVENT}, ensure_ascii=False)) for _ in range(ROUNDS))
    rows = [("floor: json.dumps", floor, None)]
    for clients in (0, 1, 4):
        counts, stop, threads = [0] * clients, threading.Event(), []
        for i in range(clients):
            threads.append(threading.Thread(target=reader, args=(server.port, counts, i, stop)))
            threads[-1].start()
        while server.client_count < clients:
            time.sleep(0.01)
        began = time.perf_counter()
        cost = statistics.median(timed(lambda: server.publish("mcp:request", EVENT))
                                 for _ in range(ROUNDS))
        deadline = time.time() + 30
        while clients and min(counts) < N * ROUNDS and time.time() < deadline:
            time.sleep(0.01)
        elapsed = time.perf_counter() - began
        stop.set()
        for thread in threads:
            thread.join()
        rate = (sum(counts) / elapsed) if clients else None
        rows.append(("publish, %d client%s" % (clients, "" if clients == 1 else "s"), cost, rate))
        while server.client_count:
            time.sleep(0.01)
    server.stop()
    print("%-24s %12s %8s %22s" % ("case", "us/event", "x floor", "frames/s delivered"))
    for name, cost, rate in rows:
        print("%-24s %12.1f %8.2f %22s" % (name, cost, cost / floor,
                                           "-" if rate is None else "%.0f" % rate))
    print("(%d rounds of %d events, medians.) At the seed's 1000 msg/s (2000 mcp:* events/s) "
          "publishing costs the relay thread %.1f%% of a core with 4 dashboards, %.2f%% with none."
          % (ROUNDS, N, rows[-1][1] * 2000 / 1e4, rows[1][1] * 2000 / 1e4))


if __name__ == "__main__":
    main()
