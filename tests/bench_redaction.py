#!/usr/bin/env python3
"""Redaction throughput (not collected by pytest; `make bench` runs it).

Prints, side by side in one run (medians of 3, wall time and CPU time, with the load
average, since on a shared busy machine wall time mostly measures the other processes):
  - recall and false-positive rate on the generated corpus (tests/redaction_corpus.py:
    targets recall >= 0.99, false positives <= 0.01), ours against the seed's patterns;
  - MB/s of Redactor.redact on a 50 MB ordinary log (target >= 40 MB/s), with no secret
    environment variables and with 3 of them (each adds its encoded forms to the search);
  - the same log through the CLI, `bridge.py redact < log > /dev/null` (process start included);
  - the seed's six minimum patterns as one `re.sub` on the same log, for reference;
  - seconds for each 1 MB adversarial shape (target: well under 1 s each).
Usage: bench_redaction.py [BRIDGE.py]: another bridge.py (`git show main:bridge.py > /tmp/m.py`)
to time instead of this checkout's, e.g. two runs side by side on a busy machine.
"""
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import redaction_corpus  # noqa: E402
from redaction_corpus import ordinary_log  # noqa: E402
BRIDGE = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(os.path.dirname(HERE), "bridge.py")
spec = importlib.util.spec_from_file_location("bridge_bench", BRIDGE)
bridge = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bridge)

SEED_PATTERNS = [r"Bearer\s+[A-Za-z0-9\-_\.]+", r"sk-[A-Za-z0-9]{10,}", r"AIza[0-9A-Za-z\-_]{20,}",
                 r"anthropic[_-]?(api)?[_-]?key[:=]\s*\S+", r"x-api-key[:=]\s*\S+",
                 r"Authorization[:=]\s*\S+"]


CPU = {}


def _cpu():
    """CPU seconds used by this process and its finished children."""
    import resource
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def median_time(func, runs=3, label=None):
    """Median wall time of `runs` runs; the median CPU time goes to CPU[label]. On a shared,
    busy machine wall time mostly measures the other processes; CPU time measures ours."""
    times, cpus = [], []
    for _ in range(runs):
        start, cpu = time.perf_counter(), _cpu()
        func()
        times.append(time.perf_counter() - start)
        cpus.append(_cpu() - cpu)
    if label:
        CPU[label] = statistics.median(cpus)
    return statistics.median(times)


def corpus_figures(seed):
    """Recall and false positives, ours against the seed's six patterns."""
    from test_redaction import KNOWN, corpus_scores
    ours = bridge.Redactor((), env={}, known=KNOWN)
    print("corpus: %d positives of %d kinds, %d negatives (targets: recall >= 0.99, "
          "false positives <= 0.01)" % (
              len(redaction_corpus.positives()) + len(redaction_corpus.config_secret_positives(KNOWN)),
              len({k for k, _, _ in redaction_corpus.positives()}), len(redaction_corpus.negatives())))
    for name, redact in (("bridge.py Redactor", ours.redact),
                         ("seed's 6 patterns", lambda text: seed.sub("[REDACTED]", text))):
        recall, fp_rate, misses, changed = corpus_scores(redact)
        print("  %-38s recall %.4f   false positives %.4f" % (name, recall, fp_rate))
        for kind, text in misses[:5] if redact == ours.redact else ():
            print("    missed %s: %r" % (kind, text[:100]))


def main():
    seed = re.compile("|".join("(?:%s)" % p for p in SEED_PATTERNS))
    corpus_figures(seed)
    print()
    size = 50 * 1024 * 1024
    mb = size / (1024 * 1024)
    text = ordinary_log(size)
    plain = bridge.Redactor((), env={})
    with_env = bridge.Redactor((), env={"GITHUB_TOKEN": "ghx_Zk29dLq81xWmAbCdEf123456",
                                        "DB_PASSWORD": "Tr0ub4dor&3-horse", "API_SECRET": "s3cr3t-Value-99"})
    assert plain.redact(text) == text, "the ordinary log must come out unchanged"
    t_plain = median_time(lambda: plain.redact(text), label="plain")
    t_env = median_time(lambda: with_env.redact(text), label="env")
    t_seed = median_time(lambda: seed.sub("[REDACTED]", text), label="seed")
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as handle:
        handle.write(text)
    try:
        def cli():
            with open(handle.name, "rb") as src, open(os.devnull, "wb") as dst:
                subprocess.run([sys.executable, BRIDGE, "redact", "--root", tempfile.gettempdir()],
                               stdin=src, stdout=dst, check=True, env={"PATH": os.environ.get("PATH", "")})
        t_cli = median_time(cli, label="cli")
    finally:
        os.unlink(handle.name)

    print("redaction throughput, %.0f MB ordinary log (target >= 40 MB/s); load average %.1f"
          % (mb, os.getloadavg()[0]))
    print("  %-38s %11s %11s %8s" % ("", "wall", "CPU", "wall s"))
    for label, name, t in (("plain", "Redactor.redact, no secret env vars", t_plain),
                           ("env", "Redactor.redact, 3 secret env vars", t_env),
                           ("cli", "bridge.py redact (CLI, whole process)", t_cli),
                           ("seed", "seed's 6 patterns as one re.sub", t_seed)):
        print("  %-38s %6.1f MB/s %6.1f MB/s %8.2f" % (name, mb / t, mb / CPU[label], t))
    print("  ratio ours/seed (time, medians): %.2f" % (t_plain / t_seed))

    from test_redaction import adversarial_inputs
    print("adversarial 1 MB inputs, median of 3 (target: well under 1 s each); load average %.1f"
          % os.getloadavg()[0])
    worst = worst_cpu = 0.0
    for name, data in adversarial_inputs().items():
        t = median_time(lambda: with_env.redact(data), label=name)
        worst = max(worst, t)
        print("  %-32s %6.3f s wall  %6.3f s CPU" % (name, t, CPU[name]))
        worst_cpu = max(worst_cpu, CPU[name])
    print("  worst                            %6.3f s wall  %6.3f s CPU" % (worst, worst_cpu))


if __name__ == "__main__":
    main()
