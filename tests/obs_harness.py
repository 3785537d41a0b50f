"""Test harness for bridge.py's ObservabilityServer (section 5b), without the proxy core.

It loads bridge.py by path, starts the server with a control callback that records every
action and answers the way the proxy core does, and publishes the events the core would
(doctor:*, mcp:*, bridge:stats). The tests use it in-process; as a script it serves until
killed, for trying the dashboard by hand:

    python3 tests/obs_harness.py [--port 3334] [--host 127.0.0.1] [--token T] [--interval 1]

It prints `PORT n` once listening and `ACTION {json}` for every control command received.
"""
import argparse
import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

BRIDGE = Path(__file__).resolve().parent.parent / "bridge.py"
KNOWN_ACTIONS = ("doctor:restart", "doctor:kill", "bridge:pause", "bridge:resume",
                 "bridge:stats", "bridge:shutdown")


def load_bridge():
    spec = importlib.util.spec_from_file_location("bridge_under_test", str(BRIDGE))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Harness:
    """A stand-in for the proxy core: a doctor state, generation and counters that the
    control actions change, publishing the events the core publishes."""

    def __init__(self, bridge=None, host="127.0.0.1", port=0, token=None, allowed_origins=(),
                 max_queue=1000, interval=None, on_action=None, **server_options):
        self.bridge = bridge or load_bridge()
        self.actions, self.logs = [], []
        self.generation, self.restarts, self.messages, self.paused = 1, 0, 0, False
        self.started = time.time()
        self.interval, self.on_action = interval, on_action
        self.stopped = threading.Event()
        self.server = self.bridge.ObservabilityServer(
            host, port, token=token, allowed_origins=allowed_origins, control=self.control,
            log=self.logs.append, max_queue=max_queue, **server_options)

    @property
    def port(self):
        return self.server.port

    def start(self):
        ok = self.server.start()
        if ok:
            self.server.publish("doctor:starting", {"generation": self.generation})
            self.server.publish("doctor:ready", {"generation": self.generation})
            if self.interval:
                threading.Thread(target=self.tick, daemon=True).start()
        return ok

    def stop(self):
        self.stopped.set()
        self.server.stop()

    def tick(self):
        while not self.stopped.wait(self.interval):
            self.messages += 7
            self.server.publish("mcp:request", {"method": "tools/call", "id": self.messages,
                                                "size": 120})
            self.server.publish("bridge:stats", self.stats())

    def stats(self):
        uptime = time.time() - self.started
        rate = round(self.messages / max(min(uptime, 5.0), 1e-3), 1)   # the core's fixed window, roughly
        return {"uptime": uptime, "doctorRestarts": self.restarts,
                "messagesInPerSec": rate, "messagesOutPerSec": rate, "rateWindowSec": min(uptime, 5.0),
                "doctorUptime": 1.0, "messagesIn": self.messages, "messagesOut": self.messages,
                "bytesIn": 100 * self.messages, "bytesOut": 90 * self.messages,
                "dashboardClients": self.server.client_count, "generation": self.generation,
                "state": "ready", "paused": self.paused}

    def control(self, action, params):
        self.actions.append((action, params))
        if self.on_action:
            self.on_action(action, params)
        if action == "boom":
            raise RuntimeError("handler bug")
        if action == "burst":  # publish many events at once: the caller must never block
            began = time.monotonic()
            blob = "x" * params.get("size", 1000)
            for i in range(params.get("count", 1000)):
                self.server.publish("mcp:response", {"i": i, "blob": blob})
            return {"ok": True, "result": {"seconds": time.monotonic() - began}}
        if action not in KNOWN_ACTIONS:
            return {"ok": False, "error": "unknown action"}
        if action == "doctor:restart":
            self.server.publish("doctor:crashed", {"generation": self.generation,
                                                   "signal": "SIGTERM", "stderrTail": []})
            self.restarts += 1
            self.generation += 1
            self.server.publish("doctor:restarting", {"generation": self.generation})
            self.server.publish("doctor:ready", {"generation": self.generation})
        elif action in ("bridge:pause", "bridge:resume"):
            self.paused = action == "bridge:pause"
        elif action == "bridge:stats":
            stats = self.stats()
            self.server.publish("bridge:stats", stats)
            return {"ok": True, "result": stats}
        return {"ok": True, "result": {"generation": self.generation}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token")
    parser.add_argument("--origin", action="append", default=[])
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()

    def report(action, params):
        print("ACTION " + json.dumps({"action": action, "params": params}), flush=True)

    harness = Harness(host=args.host, port=args.port, token=args.token,
                      allowed_origins=args.origin, interval=args.interval, on_action=report)
    if not harness.start():
        print("START-FAILED " + " | ".join(harness.logs), flush=True)
        return 1
    print("PORT %d" % harness.port, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        harness.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
