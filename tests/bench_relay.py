"""Benchmark `relay down`: history must not slow it down, and concurrent writers.

1. `relay down` on a queue of 10,000 entries vs a queue of 10 (target ratio <= 1.5),
   whole process wall time, runs interleaved, medians.
2. 20 `relay down` processes started at once on one queue: total wall time
   (median of rounds), next to 20 sequential runs' median single time.
Not collected by pytest; `make bench` runs it.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BRIDGE = os.path.join(os.path.dirname(HERE), "bridge.py")
PYTHON = sys.executable
RUNS = int(os.environ.get("BENCH_RUNS", "15"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))


def entry(n):
    return ("- id: cmd_%03d\n"
            "  timestamp: '2026-02-16T01:23:45'\n"
            "  purpose: GuP-v2 の inbox_watcher.sh を改修して self-watch 機能を追加せよ\n"
            "  acceptance_criteria:\n"
            "  - 'inbox_watcher.sh に self-watch が実装されること\n\n"
            "    vice_captain.md に self-watch 説明が追記されること'\n"
            "  command: 'Agent Teams からのテスト指示をブリッジ経由で実行。\n\n"
            "    完了後、Agent Teams に結果を返却せよ。'\n"
            "  project: gup-v2-self-watch\n"
            "  priority: high\n"
            "  status: done\n"
            "  source: agent_teams\n" % n)


def make_root(base, name, entries, nudge=False):
    root = os.path.join(base, name)
    os.makedirs(os.path.join(root, "queue"))
    with open(os.path.join(root, "queue", "captain_to_vice_captain.yaml"), "w",
              encoding="utf-8") as handle:
        handle.write("commands:\n" + "".join(entry(n) for n in range(1, entries + 1)))
    with open(os.path.join(root, "bridge.config.json"), "w") as handle:
        json.dump({"relay": {"nudge": nudge}}, handle)
    return root


def down_cmd(root, n):
    return [PYTHON, BRIDGE, "relay", "down", "--root", root, "miho", "main",
            "ベンチマーク %d。 benchmark message" % n, "bench", "medium", "one\ntwo"]


def timed_down(root, n):
    started = time.perf_counter()
    proc = subprocess.run(down_cmd(root, n), capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit("relay down failed: %s" % proc.stderr)
    return elapsed


def concurrent_round(base, round_no):
    root = make_root(base, "conc%d" % round_no, 10, nudge=True)
    started = time.perf_counter()
    procs = [subprocess.Popen(down_cmd(root, n), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for n in range(20)]
    outs = [p.communicate()[0].strip() for p in procs]
    elapsed = time.perf_counter() - started
    ids = sorted(int(out[4:]) for out in outs)
    if ids != list(range(11, 31)) or any(p.returncode for p in procs):
        raise SystemExit("concurrent round produced %r" % outs)
    return elapsed


def main():
    with tempfile.TemporaryDirectory() as base:
        small = make_root(base, "small", 10)
        large = make_root(base, "large", 10000)
        size = os.path.getsize(os.path.join(large, "queue", "captain_to_vice_captain.yaml"))
        timed_down(small, 0)
        timed_down(large, 0)  # warm caches
        t_small, t_large = [], []
        for n in range(RUNS):
            t_small.append(timed_down(small, n))
            t_large.append(timed_down(large, n))
        m_small, m_large = statistics.median(t_small), statistics.median(t_large)
        print("relay down, queue of 10 entries:      median %.1f ms (%d runs)"
              % (m_small * 1000, RUNS))
        print("relay down, queue of 10,000 entries:  median %.1f ms (%d runs, %.1f MB)"
              % (m_large * 1000, RUNS, size / 1e6))
        ratio = m_large / m_small
        print("ratio 10,000 / 10: %.2f  (target <= 1.5: %s)" % (ratio, "ok" if ratio <= 1.5
                                                              else "MISSED"))
        rounds = [concurrent_round(base, r) for r in range(ROUNDS)]
        print("20 concurrent relay down (with native nudge): total wall time median %.0f ms "
              "(%d rounds; min %.0f, max %.0f), 20 distinct consecutive ids each round"
              % (statistics.median(rounds) * 1000, ROUNDS, min(rounds) * 1000,
                 max(rounds) * 1000))
        print("  for scale: one relay down alone takes %.0f ms, 20 in sequence ~%.0f ms"
              % (m_small * 1000, m_small * 20000))
    return 0 if ratio <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
