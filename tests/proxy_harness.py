"""Test-only: run `bridge.py proxy` with a recording stand-in for the observability server.

Usage: python3 tests/proxy_harness.py EVENTS.jsonl CONTROL.jsonl proxy [options] -- SERVER...

The stand-in has ObservabilityServer's interface (start/publish/client_count/stop and the
`control` callback): every published event is appended to EVENTS.jsonl, and every line appended
to CONTROL.jsonl ({"id", "action", "params"}) is handed to the core's control callback, with the
outcome appended to EVENTS.jsonl as {"type": "ack", ...}. It lets the core's events and /control
handling be tested through a real process before (and independently of) the WebSocket server.
"""
import importlib.util
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# TEST_BRIDGE_PY: another copy, as for every test (tests/conftest.py)
spec = importlib.util.spec_from_file_location(
    "bridge", os.environ.get("TEST_BRIDGE_PY") or os.path.join(HERE, "..", "bridge.py"))
bridge = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bridge)


class RecordingServer:
    def __init__(self, host, port, token=None, allowed_origins=(), control=None, log=None, max_queue=1000):
        self.control, self.lock, self.running = control, threading.Lock(), False
        self.host, self.port, self.token = host, port, token
        self.events = open(EVENTS, "a")

    def start(self):
        self.running = True
        threading.Thread(target=self.read_control, daemon=True).start()
        return True

    def read_control(self):
        done = 0
        while self.running:
            with open(CONTROL) as handle:
                lines = handle.read().splitlines()
            for line in lines[done:]:
                cmd = json.loads(line)
                outcome = self.control(cmd["action"], cmd.get("params"))
                self.publish("ack", dict(outcome, id=cmd.get("id"), action=cmd["action"]))
            done = len(lines)
            time.sleep(0.02)

    def publish(self, event_type, data=None):
        with self.lock:
            self.events.write(json.dumps({"ts": int(time.time() * 1000), "type": event_type, "data": data}) + "\n")
            self.events.flush()

    @property
    def client_count(self):
        return 1

    def stop(self):
        self.running = False


if __name__ == "__main__":
    EVENTS, CONTROL = sys.argv[1], sys.argv[2]
    open(CONTROL, "a").close()
    bridge.ObservabilityServer = RecordingServer
    sys.exit(bridge.main(sys.argv[3:]))
