#!/usr/bin/env python3
"""Benchmark of `changes` (issue 5 names no target; this keeps an eye on the idle cost).

An idle `changes run --once` pass (nothing to do, every change set already terminal) and
`changes status` over 1,000 processed change sets against 10, run as a user runs them (a
subprocess), medians of interleaved runs in this one process. The executor loop repeats that
pass every `poll_sec`, so it should stay a small multiple of the 10-set pass.
Usage: bench_changes.py [RUNS]
"""
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 11
SERVER = str(REPO / "fixtures" / "mcp_axiomregent.py")


def load_bridge():
    spec = importlib.util.spec_from_file_location("bridge_bench", str(REPO / "bridge.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


B = load_bridge()


def make_repo(root, count):
    """A git repository with `count` completed change sets (valid meta, plan and status)."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    changes = root / "changes"
    for i in range(count):
        base = {"kind": "snapshot", "id": "sha256:%064x" % i}
        ident = B.changeset_identity("change number %d" % i, "github.com/o/r", base)
        cs_id = B.changeset_id(ident)
        plan = {"version": "plan_v1", "change_set_id": cs_id, "tasks": [{
            "id": "t1", "type": "mcp_call", "tool": "gov.drift", "params": {},
            "risk_profile": {"impact_score": "low", "touched_features": [],
                             "destructive": False}}]}
        meta = dict(ident, plan_sha256=B.canonical_sha256(plan))
        status = {"schema_version": "changeset_status_v1", "change_set_id": cs_id,
                  "state": "completed", "decision": "auto", "reason": "applied 1 task(s)",
                  "validated_against": {"base_state": base, "plan_sha256":
                                        meta["plan_sha256"]},
                  "execution": {"started_task_id": None, "completed_task_ids": ["t1"],
                                "last_error": None}}
        d = changes / cs_id
        d.mkdir(parents=True)
        (d / "00-meta.json").write_bytes(B.canonical_json(meta))
        (d / "02-implementation-plan.json").write_bytes(B.canonical_json(plan))
        (d / "05-status.json").write_bytes(B.canonical_json(status))
    cfg = root.parent / ("cfg-%d.json" % count)
    cfg.write_text(json.dumps({"changes": {"mcp": {"command": [PY, SERVER]}}}))
    return cfg


def timed(args):
    started = time.perf_counter()
    proc = subprocess.run([PY, str(REPO / "bridge.py")] + args, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit("failed: %s\n%s" % (" ".join(args), proc.stderr.decode()))
    return elapsed


def main():
    tmp = Path(tempfile.mkdtemp(prefix="bench-changes-"))
    try:
        sizes = (10, 1000)
        setups = {}
        for n in sizes:
            root = tmp / ("repo-%d" % n)
            setups[n] = (root, make_repo(root, n))
        results = {(cmd, n): [] for cmd in ("run", "status") for n in sizes}
        for _ in range(RUNS):
            for n in sizes:  # interleaved, so load affects both sides alike
                root, cfg = setups[n]
                common = ["--root", str(root), "--config", str(cfg)]
                results[("run", n)].append(timed(["changes", "run", "--once"] + common))
                results[("status", n)].append(timed(["changes", "status"] + common))
        print("changes, median of %d runs (ms)" % RUNS)
        for cmd in ("run", "status"):
            small = statistics.median(results[(cmd, 10)]) * 1000
            big = statistics.median(results[(cmd, 1000)]) * 1000
            label = "run --once (idle)" if cmd == "run" else "status"
            print("  %-18s 10 sets %7.1f   1,000 sets %7.1f   ratio %.2f   (%.2f ms/set)" % (
                label, small, big, big / small, (big - small) / 990))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
