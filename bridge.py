#!/usr/bin/env python3
"""bridge.py - connect AI coding agents to each other and to their tools, safely.

One file, standard library only, Python 3.9+. Copy it into a repository as
`scripts/bridge.py` and read it before you trust it: this docstring is the manual,
the sections below are in the order they depend on each other.

Subcommands
-----------
  init, submit, watch, status, approve, unlock
        The Bridge Protocol task queue in `.ai-handoff/`: a planner drops task JSON
        files, the watcher locks, validates, gates, branches, runs the editing agent,
        verifies, audits, redacts and always writes a result.
  egress emit, inbox drain|ack|commit|check, initiate, alert, feed, wake
        The `_bridge/` seam: agents' hooks report activity to a captain's Bridge UI
        and the captain's intent reaches the agents, through JSONL files.
  relay down|up
        The queue relay between Agent Teams and a YAML work queue, without a YAML
        library.
  proxy -- SERVER COMMAND...
        A stdio MCP proxy that supervises and restarts the real server, with an
        observability WebSocket and a dashboard.
  changes id|new|validate|run|status|approve
        Deterministic change sets, validated and executed through an MCP server.
  redact
        Filters stdin to stdout with the redaction every part of bridge.py uses.

Run `python3 bridge.py COMMAND --help` for each command's options and an example.

Exit codes: 0 done, 1 the work stopped on a failure, 2 usage or configuration
error, 3 another process holds the lock. Errors are one line on stderr; set
BRIDGE_DEBUG=1 to get a traceback instead.

Configuration: defaults < ROOT/bridge.config.json (or --config FILE) < environment
variables < command-line flags. Every key is listed in CONFIG_DEFAULTS below and
documented in bridge.config.example.json.

Table of contents
-----------------
  1. KERNEL    errors, time, atomic files, JSONL, locks, config, redaction,
               subprocesses, git, JSON-RPC framing
  2. WATCH     the .ai-handoff/ task queue (Bridge Protocol)
  3. SEAM      the _bridge/ verbs (Spacedock formats)
  4. RELAY     Agent Teams <-> YAML queue relay
  5. PROXY     stdio MCP supervisor, WebSocket observability, dashboard
  6. CHANGES   change sets and their MCP executor
  7. CLI       argparse wiring: one thin cmd_* function per subcommand, main()
"""

# Only cheap modules are imported at the top: hooks start bridge.py on every tool
# call, so subprocess, socket, threading, hashlib and friends are imported inside
# the functions that need them. (json imports re, so re costs nothing extra.)
import json
import os
import re
import sys
import time

__version__ = "0.1.0"


# =============================================================================
# 1. KERNEL
# =============================================================================

# ---- errors -----------------------------------------------------------------

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_LOCKED = 3


class BridgeError(Exception):
    """An error with a message meant for the user and the exit code to leave with.

    The CLI prints `bridge: error: MESSAGE` and exits with `code`; nothing else in
    bridge.py prints tracebacks unless BRIDGE_DEBUG=1.
    """

    def __init__(self, message, code=EXIT_USAGE):
        super().__init__(message)
        self.message = message
        self.code = code


def debug_enabled():
    return os.environ.get("BRIDGE_DEBUG", "") not in ("", "0", "false")


def warn(message):
    """One line on stderr, prefixed so it is clear who is talking."""
    try:
        sys.stderr.write("bridge: %s\n" % message)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr closed: there is nowhere left to say it


# ---- time and ids -----------------------------------------------------------

def now_iso(ts=None):
    """Local time with its UTC offset, to the second: 2026-11-22T05:30:00+08:00."""
    ts = time.time() if ts is None else ts
    local = time.localtime(ts)
    offset = local.tm_gmtoff or 0
    sign = "+" if offset >= 0 else "-"
    offset = abs(offset)
    return time.strftime("%Y-%m-%dT%H:%M:%S", local) + "%s%02d:%02d" % (
        sign, offset // 3600, (offset % 3600) // 60)


def utc_iso(ts=None):
    """UTC time to the second with a Z suffix: 2026-11-22T05:30:00Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if ts is None else ts))


def monotonic():
    return time.monotonic()


def random_hex(nbytes=4):
    return os.urandom(nbytes).hex()


# ---- atomic files -------------------------------------------------------------

def _fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename is still atomic
    finally:
        os.close(fd)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def atomic_write(path, data, mode=None):
    """Replace `path` with `data` so a reader sees the old file or the new one, never half.

    Writes a temporary file in the same directory, fsyncs it, renames it over the
    target and fsyncs the directory. A symlink at `path` is replaced, not followed.
    The new file keeps the old file's permissions unless `mode` is given.
    """
    path = os.fspath(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    if mode is None:
        try:
            mode = os.lstat(path).st_mode & 0o7777 if not os.path.islink(path) else None
        except FileNotFoundError:
            mode = None
    tmp = os.path.join(directory, ".%s.%s.tmp" % (os.path.basename(path)[:80], random_hex()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        try:
            _write_all(fd, data)
            if mode is not None:
                os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def json_compact(obj):
    """One-line UTF-8 JSON, as every JSONL record bridge.py writes."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def atomic_write_json(path, obj, indent=2):
    atomic_write(path, json.dumps(obj, ensure_ascii=False, indent=indent) + "\n")


def read_json_file(path, what="file"):
    """Parse a JSON file, turning every failure into a BridgeError naming the place."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise BridgeError("%s %s does not exist" % (what, path))
    except OSError as exc:
        raise BridgeError("cannot read %s %s: %s" % (what, path, exc.strerror or exc))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BridgeError("%s %s is not UTF-8 (byte %d)" % (what, path, exc.start))
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BridgeError("%s %s: line %d column %d: %s" % (what, path, exc.lineno, exc.colno, exc.msg))


_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+\Z")


def safe_name(text, what="name"):
    """Return `text` if it is safe as one path component (and an argv word), else raise."""
    if not isinstance(text, str) or not _SAFE_NAME.match(text) or text in (".", ".."):
        raise BridgeError("%s %r must match [A-Za-z0-9._-]+ and not be . or .." % (what, text))
    return text


# ---- JSONL append and scan ---------------------------------------------------

def append_text(path, text, follow_symlinks=False):
    """Append `text` with a single write() under O_APPEND.

    POSIX appends of one write() to a regular file are not interleaved with other
    appenders, which is what lets many hook processes share one JSONL file without
    a lock. A symlink at `path` is refused (ELOOP) unless follow_symlinks is set.
    """
    path = os.fspath(path)
    data = text.encode("utf-8") if isinstance(text, str) else text
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path, flags, 0o644)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def append_jsonl(path, record, follow_symlinks=False):
    append_text(path, json_compact(record) + "\n", follow_symlinks)


class JsonlLine(tuple):
    """One complete line of a JSONL file: (number, record, error, raw).

    `number` is 1-based and counts every complete line, malformed ones included,
    so it can serve as a cursor. `record` is None and `error` says why when the
    line is not JSON.
    """
    __slots__ = ()

    def __new__(cls, number, record, error, raw):
        return tuple.__new__(cls, (number, record, error, raw))

    number = property(lambda self: self[0])
    record = property(lambda self: self[1])
    error = property(lambda self: self[2])
    raw = property(lambda self: self[3])


def scan_jsonl(path, start=0):
    """Yield JsonlLine for each complete line after the first `start` lines.

    A last line without its newline is still being written: it is neither counted
    nor yielded (the `wc -l` rule). Lines of any length are read. A missing file
    yields nothing.
    """
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return
    with handle:
        number = 0
        for raw in handle:
            if not raw.endswith(b"\n"):
                break
            number += 1
            if number <= start:
                continue
            try:
                yield JsonlLine(number, json.loads(raw), None, raw)
            except ValueError as exc:
                yield JsonlLine(number, None, "line %d: %s" % (number, exc), raw)


def count_complete_lines(path):
    """Number of newline-terminated lines in `path` (0 when it does not exist)."""
    count = 0
    try:
        with open(path, "rb") as handle:
            while True:
                block = handle.read(1 << 20)
                if not block:
                    return count
                count += block.count(b"\n")
    except FileNotFoundError:
        return 0


# ---- locks ------------------------------------------------------------------

def _read_small(path):
    try:
        with open(path, "rb") as handle:
            return handle.read(65536).decode("utf-8", "replace").strip()
    except OSError:
        return None


def _start_ticks(pid):
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot."""
    stat = _read_small("/proc/%d/stat" % pid)
    if not stat or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else None


def process_identity(pid=None):
    """What identifies a process across PID reuse: pid, host, boot id, start time."""
    pid = os.getpid() if pid is None else pid
    return {
        "pid": pid,
        "host": os.uname().nodename,
        "boot_id": _read_small("/proc/sys/kernel/random/boot_id"),
        "start_ticks": _start_ticks(pid),
    }


def holder_is_dead(meta):
    """True only when the process described by `meta` provably no longer runs.

    Provable means: it ran on this host, and either the host has rebooted since,
    or its PID is gone, or the PID now belongs to a process that started at
    another time. On another host nothing is provable and the answer is False.
    """
    if not isinstance(meta, dict):
        return False
    me = process_identity()
    if meta.get("host") != me["host"]:
        return False
    if meta.get("boot_id") and me["boot_id"] and meta["boot_id"] != me["boot_id"]:
        return True
    pid = meta.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, owned by someone else
    except OSError:
        return False
    ticks = _start_ticks(pid)
    return bool(meta.get("start_ticks") and ticks and ticks != meta["start_ticks"])


def _parse_lock_meta(text):
    if not text:
        return None
    try:
        meta = json.loads(text)
    except ValueError:
        return {"unreadable": text[:200]}
    return meta if isinstance(meta, dict) else {"unreadable": text[:200]}


class FileLock:
    """An exclusive lock on a file that says who holds it.

    The holder keeps an OS lock (flock) on the file for as long as it runs, so a
    crashed holder releases it automatically, and writes JSON metadata into the
    file: its identity, when it took the lock and a heartbeat. The file is never
    deleted while held (deleting an flock'd file breaks mutual exclusion); release
    records `released_at` instead.

    Where the filesystem has no flock (some NFS setups), the lock falls back to
    creating the file with O_EXCL; a leftover file is then broken only when its
    holder is provably dead or its heartbeat is older than `ttl_sec`.

    After a successful acquire(), `recovered` holds the metadata of a previous
    holder that never released (it crashed); after a failed one, `holder` holds
    the current holder's metadata.
    """

    def __init__(self, path, ttl_sec=7200, meta=None):
        self.path = os.fspath(path)
        self.ttl_sec = ttl_sec
        self.extra = dict(meta or {})
        self.fd = None
        self.mode = None
        self.meta = None
        self.holder = None
        self.recovered = None

    # -- reading a lock from outside --

    @staticmethod
    def read(path):
        """The metadata in a lock file, or None when there is none."""
        return _parse_lock_meta(_read_small(path))

    @staticmethod
    def probe(path):
        """('free'|'held'|'unknown', metadata) for a lock file, without taking it."""
        import fcntl
        meta = FileLock.read(path)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return "free", None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return "held", meta
        except OSError:
            return "unknown", meta
        finally:
            os.close(fd)
        if meta and not meta.get("released_at") and meta.get("mode") == "exclusive-create":
            return ("free" if holder_is_dead(meta) else "unknown"), meta
        return "free", meta

    # -- holding a lock --

    def acquire(self):
        """Take the lock without waiting. True on success, False when someone holds it."""
        import errno
        import fcntl
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        for _ in range(5):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
                         | getattr(os, "O_NOFOLLOW", 0), 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self.holder = self.read(self.path)
                return False
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                    return self._acquire_exclusive_create()
                raise
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same_file = False
            if not same_file:  # replaced between open and flock: lock the new one
                os.close(fd)
                continue
            previous = _parse_lock_meta(os.pread(fd, 65536, 0).decode("utf-8", "replace").strip())
            self.recovered = previous if previous and not previous.get("released_at") else None
            self.fd, self.mode = fd, "flock"
            self._write_meta(fresh=True)
            return True
        raise BridgeError("lock %s keeps being replaced; giving up" % self.path, EXIT_LOCKED)

    def _acquire_exclusive_create(self):
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL
                             | getattr(os, "O_CLOEXEC", 0), 0o644)
            except FileExistsError:
                meta = self.read(self.path)
                if not self._breakable(meta):
                    self.holder = meta
                    return False
                self._break(meta)
                continue
            self.fd, self.mode = fd, "exclusive-create"
            self._write_meta(fresh=True)
            return True
        self.holder = self.read(self.path)
        return False

    def _breakable(self, meta):
        if not meta or meta.get("released_at"):
            return True
        if holder_is_dead(meta):
            self.recovered = meta
            return True
        beat = meta.get("heartbeat_ts") or meta.get("created_ts")
        if isinstance(beat, (int, float)) and time.time() - beat > self.ttl_sec:
            self.recovered = meta
            return True
        return False

    def _break(self, meta):
        """Rename the stale file aside, and delete it only if it did not change meanwhile."""
        aside = "%s.stale.%s" % (self.path, random_hex())
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        if self.read(aside) == meta:
            os.unlink(aside)
        else:  # someone else re-took it between our read and rename: put it back
            try:
                os.link(aside, self.path)
            except OSError:
                pass
            os.unlink(aside)

    def _write_meta(self, fresh=False):
        now = time.time()
        if fresh:
            self.meta = dict(self.extra)
            self.meta.update(process_identity())
            self.meta.update({"created_at": now_iso(now), "created_ts": round(now, 3),
                              "mode": self.mode, "version": __version__})
        self.meta["heartbeat_at"] = now_iso(now)
        self.meta["heartbeat_ts"] = round(now, 3)
        data = (json.dumps(self.meta, ensure_ascii=False) + "\n").encode("utf-8")
        # pwrite then truncate: a reader never sees an empty file mid-update.
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))

    def heartbeat(self):
        """Refresh the heartbeat so a long healthy run is never taken for stale."""
        if self.fd is not None:
            self._write_meta()

    def release(self):
        if self.fd is None:
            return
        import fcntl
        try:
            if self.mode == "exclusive-create":
                os.close(self.fd)
                if self.read(self.path) == self.meta:
                    os.unlink(self.path)
            else:
                self.meta["released_at"] = now_iso()
                self._write_meta()
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
        finally:
            self.fd = None

    def __enter__(self):
        if not self.acquire():
            raise BridgeError("%s is held by %s" % (self.path, describe_holder(self.holder)), EXIT_LOCKED)
        return self

    def __exit__(self, *exc):
        self.release()


def describe_holder(meta):
    """A short human description of a lock holder's metadata."""
    if not meta:
        return "an unknown process"
    if "unreadable" in meta:
        return "an unknown process (unreadable lock content)"
    return "pid %s on %s since %s (last heartbeat %s)" % (
        meta.get("pid", "?"), meta.get("host", "?"), meta.get("created_at", "?"),
        meta.get("heartbeat_at", "?"))


def acquire_flock(path, timeout=5.0, interval=0.05):
    """Open `path` and take flock(LOCK_EX) on it, waiting up to `timeout` seconds.

    Returns the open fd (release with release_flock) or None on timeout. Compatible
    with `flock(1)` users of the same file. For short critical sections; long-held
    locks with metadata use FileLock.
    """
    import fcntl
    os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def release_flock(fd):
    import fcntl
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# ---- config -------------------------------------------------------------------

# Every configuration key bridge.py knows, with its default. A key whose default
# is an empty dict is free-form (its contents are not checked). Sections are in
# the order of the bridges below; bridge.config.example.json documents each key.
CONFIG_DEFAULTS = {
    # ---- watch (seed 000): top-level keys, as the seed's bridge.config.json ----
    "redaction_patterns": [],
    # ---- end watch ----

    # ---- seam (seed 001) ----
    "seam": {},
    # ---- end seam ----

    # ---- relay (seed 002) ----
    "relay": {},
    # ---- end relay ----

    # ---- proxy (seed 003): the seed's doctor / observability / lifecycle ----
    "doctor": {},
    "observability": {},
    "lifecycle": {},
    # ---- end proxy ----

    # ---- changes (seed 004) ----
    "changes": {},
    # ---- end changes ----
}

# Environment variables that override config keys: NAME -> (key path, type).
ENV_OVERRIDES = {
    # ---- proxy ----
    # ---- end proxy ----
}

CONFIG_FILE_NAME = "bridge.config.json"


def _parse_bool(text):
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false, got %r" % text)


def _coerce(value, kind):
    if kind is bool:
        return _parse_bool(value)
    if kind is list:
        return json.loads(value) if value.strip().startswith("[") else value.split()
    return kind(value)


def _type_name(value):
    return {bool: "true/false", int: "a number", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _merge_config(defaults, given, prefix, source, unknown):
    merged = dict(defaults)
    for key, value in given.items():
        name = prefix + key
        if key not in defaults:
            if defaults or not prefix:  # an empty default dict is free-form
                unknown.append(name)
            merged[key] = value
            continue
        default = defaults[key]
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise BridgeError("%s: %s must be an object" % (source, name))
            merged[key] = _merge_config(default, value, name + ".", source, unknown)
        elif default is None or value is None:
            merged[key] = value
        elif isinstance(default, bool) != isinstance(value, bool) or (
                not isinstance(value, type(default))
                and not (isinstance(default, float) and isinstance(value, int))):
            raise BridgeError("%s: %s must be %s, got %s" % (
                source, name, _type_name(default), json.dumps(value)))
        else:
            merged[key] = value
    return merged


def load_config(root=None, path=None, env=None):
    """The effective configuration: defaults < config file < environment.

    `path` (from --config) must exist; otherwise ROOT/bridge.config.json is used
    when present. Unknown keys are kept but warned about (a typo should not pass
    silently); a value of the wrong type is an error naming the key.
    """
    env = os.environ if env is None else env
    given, source = {}, "defaults"
    if path is None and root is not None:
        candidate = os.path.join(os.fspath(root), CONFIG_FILE_NAME)
        path = candidate if os.path.exists(candidate) else None
    if path is not None:
        source = os.fspath(path)
        given = read_json_file(source, "config file")
        if not isinstance(given, dict):
            raise BridgeError("config file %s must hold a JSON object" % source)
    unknown = []
    config = _merge_config(CONFIG_DEFAULTS, given, "", source, unknown)
    for name in unknown:
        warn("%s: unknown config key %r (kept, but nothing reads it)" % (source, name))
    for var, (keys, kind) in ENV_OVERRIDES.items():
        if var not in env:
            continue
        try:
            value = _coerce(env[var], kind)
        except ValueError as exc:
            raise BridgeError("environment variable %s: %s" % (var, exc))
        node = config
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    config["_source"] = source
    return config


def config_get(config, dotted, default=None):
    """config_get(cfg, "observability.port") -> the value, or `default` when absent."""
    node = config
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


# ---- redaction ----------------------------------------------------------------

REDACTED = "[REDACTED]"

# The seed's minimum patterns. (Placeholder: the redaction branch replaces this
# with the full set of real-world formats.)
_BASE_PATTERNS = [
    r"Bearer\s+[A-Za-z0-9\-_\.]+",
    r"sk-[A-Za-z0-9_-]{10,}",
    r"AIza[0-9A-Za-z\-_]{20,}",
    r"(?i)anthropic[_-]?(?:api)?[_-]?key[:=]\s*\S+",
    r"(?i)x-api-key[:=]\s*\S+",
    r"(?i)authorization[:=]\s*\S+",
]
_SECRET_ENV_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.I)


class Redactor:
    """Replaces secrets in text with [REDACTED]. Built once, used everywhere."""

    def __init__(self, extra_patterns=(), env=None):
        env = os.environ if env is None else env
        patterns = list(_BASE_PATTERNS)
        for pattern in extra_patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise BridgeError("redaction_patterns: %r is not a valid regex: %s" % (pattern, exc))
            patterns.append(pattern)
        values = sorted({v for k, v in env.items() if _SECRET_ENV_NAME.search(k) and len(v) >= 8},
                        key=len, reverse=True)
        patterns.extend(re.escape(v) for v in values)
        # A leading global flag such as (?i) is an error inside an alternation since
        # Python 3.11: scope it to its own pattern, (?i:...).
        self.regex = re.compile("|".join(
            "(?%s:%s)" % (p[2:p.index(")")], p[p.index(")") + 1:])
            if re.match(r"\(\?[aiLmsux]+\)", p) else "(?:%s)" % p for p in patterns))

    def redact(self, text):
        if not text:
            return text
        return self.regex.sub(REDACTED, text)

    def redact_obj(self, obj):
        if isinstance(obj, str):
            return self.redact(obj)
        if isinstance(obj, dict):
            return {key: self.redact_obj(value) for key, value in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.redact_obj(value) for value in obj]
        return obj


_REDACTORS = {}


def get_redactor(config=None):
    """The process-wide Redactor for `config`'s redaction_patterns (compiled once)."""
    patterns = tuple((config or {}).get("redaction_patterns") or ())
    redactor = _REDACTORS.get(patterns)
    if redactor is None:
        redactor = _REDACTORS[patterns] = Redactor(patterns)
    return redactor


# ---- subprocesses -------------------------------------------------------------

class CommandResult:
    """What a finished command did. exit_code is None when it was killed for a timeout."""

    __slots__ = ("cmd", "exit_code", "stdout", "stderr", "timed_out", "duration",
                 "signal", "dropped_bytes", "error")

    def __init__(self, cmd, exit_code=None, stdout="", stderr="", timed_out=False,
                 duration=0.0, signal=None, dropped_bytes=0, error=None):
        self.cmd = cmd
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out
        self.duration = duration
        self.signal = signal
        self.dropped_bytes = dropped_bytes
        self.error = error

    @property
    def ok(self):
        return self.exit_code == 0 and not self.timed_out

    def describe(self):
        """'exit 1', 'timed out after 30.0s', 'killed by signal 9' or the start error."""
        if self.error:
            return self.error
        if self.timed_out:
            return "timed out after %.1fs" % self.duration
        if self.signal:
            return "killed by signal %d" % self.signal
        return "exit %s" % self.exit_code


def kill_process_group(proc, grace=5.0):
    """SIGTERM the process group of `proc`, then SIGKILL it after `grace` seconds.

    Grandchildren die too: bridge.py starts every child in its own session, so the
    group holds everything the child spawned that did not leave it on purpose.
    """
    import signal
    import subprocess
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait)
            if sig == signal.SIGTERM:
                # The leader is gone; members that ignore SIGTERM must not linger.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            return
        except subprocess.TimeoutExpired:
            continue


def run_command(cmd, cwd=None, env=None, timeout=None, shell=False, stdin_data=None,
                cap_bytes=64 << 20, on_tick=None, tick_sec=10.0, kill_grace=5.0):
    """Run a command to completion and return a CommandResult. Never raises for the child.

    - `cmd` is an argv list, or a string run by /bin/sh when shell=True.
    - The child gets its own process group and a closed stdin (headless agents hang
      on an open one) unless `stdin_data` is given.
    - stdout and stderr are read by threads as they come, so the child never blocks
      on a full pipe; each keeps at most `cap_bytes` (the rest is counted in
      dropped_bytes).
    - On timeout the whole group gets SIGTERM, then SIGKILL after kill_grace.
    - When the child exits but a grandchild still holds its pipes open, the group
      is killed after a short wait instead of hanging.
    - on_tick(elapsed_seconds) is called every tick_sec while it runs (progress lines).
    """
    import subprocess
    import threading

    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            cmd, shell=shell, cwd=cwd, env=env,
            stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        name = cmd if isinstance(cmd, str) else (cmd[0] if cmd else "")
        return CommandResult(cmd, exit_code=127, stderr="cannot start %s: %s" % (
            name, exc.strerror or exc), error="cannot start %s: %s" % (name, exc.strerror or exc))

    chunks = {"stdout": [], "stderr": []}
    dropped = [0]

    def drain(stream, name):
        kept, fd = 0, stream.fileno()
        while True:
            try:
                block = os.read(fd, 65536)
            except OSError:
                break
            if not block:
                break
            room = cap_bytes - kept
            if room > 0:
                chunks[name].append(block[:room])
                kept += min(room, len(block))
            if len(block) > room:
                dropped[0] += len(block) - max(room, 0)
        stream.close()

    readers = [threading.Thread(target=drain, args=(proc.stdout, "stdout"), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, "stderr"), daemon=True)]
    for reader in readers:
        reader.start()
    if stdin_data is not None:
        def feed():
            try:
                proc.stdin.write(stdin_data.encode() if isinstance(stdin_data, str) else stdin_data)
            except OSError:
                pass
            finally:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        threading.Thread(target=feed, daemon=True).start()

    timed_out = False
    deadline = None if timeout is None else started + timeout
    next_tick = started + tick_sec
    while True:
        now = time.monotonic()
        wait = 0.5 if on_tick else 3600.0
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - now))
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                timed_out = True
                kill_process_group(proc, kill_grace)
                break
            if on_tick and now >= next_tick:
                next_tick = now + tick_sec
                on_tick(now - started)
    for reader in readers:
        reader.join(timeout=2.0)
    if any(reader.is_alive() for reader in readers):
        # A grandchild kept the pipes open after the child left: end the group.
        import signal
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for reader in readers:
            reader.join(timeout=2.0)
    code = proc.returncode
    return CommandResult(
        cmd,
        exit_code=None if timed_out else code,
        stdout=b"".join(chunks["stdout"]).decode("utf-8", "replace"),
        stderr=b"".join(chunks["stderr"]).decode("utf-8", "replace"),
        timed_out=timed_out,
        duration=time.monotonic() - started,
        signal=-code if (code is not None and code < 0) else None,
        dropped_bytes=dropped[0])


# ---- git ----------------------------------------------------------------------

def git_toplevel(path="."):
    """The top of the git work tree containing `path`, or None.

    Walks up looking for `.git` (a directory, or a file in linked worktrees and
    submodules, which are therefore their own roots) without starting git: hooks
    call this on every tool call.
    """
    current = os.path.abspath(os.fspath(path))
    while True:
        if os.path.exists(os.path.join(current, ".git")):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


class Git:
    """git in one work tree, safely: hooks off, no prompts, no optional locks, timeouts.

    Every call goes through run(), so a hook planted in the repository (or a
    global core.hooksPath) never fires from bridge.py, and a git that hangs on a
    credential prompt or a lock is stopped.
    """

    def __init__(self, root, timeout=120.0):
        self.root = os.fspath(root)
        self.timeout = timeout
        self.env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0")

    def run(self, *args, check=True, env=None, stdin_data=None, timeout=None):
        cmd = ["git", "-c", "core.hooksPath=/dev/null", *args]
        merged_env = dict(self.env, **env) if env else self.env
        result = run_command(cmd, cwd=self.root, env=merged_env, stdin_data=stdin_data,
                             timeout=timeout or self.timeout)
        if check and not result.ok:
            raise BridgeError("git %s failed (%s): %s" % (
                " ".join(args[:3]), result.describe(), result.stderr.strip()[-500:]), EXIT_FAILED)
        return result

    def head(self):
        """The commit HEAD points at, or None on an unborn branch."""
        result = self.run("rev-parse", "--verify", "-q", "HEAD", check=False)
        return result.stdout.strip() or None

    def current_branch(self):
        """The checked-out branch name, or None when HEAD is detached."""
        result = self.run("symbolic-ref", "-q", "--short", "HEAD", check=False)
        return result.stdout.strip() or None

    @staticmethod
    def _pathspec(exclude):
        return ["--", "."] + [":(exclude)%s" % path for path in exclude] if exclude else []

    def status_porcelain(self, exclude=()):
        """[(XY, path)] from `status --porcelain=v1 -z`, untracked files included.

        For renames and copies the entry is (XY, new_path, old_path).
        """
        out = self.run("status", "--porcelain=v1", "-z", "--untracked-files=all",
                       *self._pathspec(exclude)).stdout
        fields, entries, index = out.split("\0"), [], 0
        while index < len(fields):
            field = fields[index]
            index += 1
            if len(field) < 4:
                continue
            xy, path = field[:2], field[3:]
            if xy[0] in "RC":
                entries.append((xy, path, fields[index] if index < len(fields) else ""))
                index += 1
            else:
                entries.append((xy, path))
        return entries

    def status_text(self, exclude=()):
        """The porcelain status as text, one `XY path` line each (empty when clean)."""
        return "".join("%s %s\n" % (entry[0], entry[1] if len(entry) == 2 else
                                    "%s -> %s" % (entry[2], entry[1]))
                       for entry in self.status_porcelain(exclude))

    def worktree_diff(self, base, exclude=(), *diff_args):
        """`git diff --cached BASE` of the whole work tree through a throwaway index.

        Covers modifications, deletions, untracked files (honouring .gitignore) and
        commits made since BASE, and leaves the user's real index untouched.
        BASE None means the empty tree (an unborn branch).
        """
        import shutil
        git_dir = self.run("rev-parse", "--absolute-git-dir").stdout.strip()
        temp_index = os.path.join(git_dir, "bridge-index.%d.%s" % (os.getpid(), random_hex()))
        real_index = os.path.join(git_dir, "index")
        try:
            if os.path.exists(real_index):
                shutil.copyfile(real_index, temp_index)  # keeps git's stat cache: fast add -A
            env = {"GIT_INDEX_FILE": temp_index}
            self.run("add", "-A", *(self._pathspec(exclude) or ["--", "."]), env=env)
            return self.run("diff", "--cached", *diff_args, base or EMPTY_TREE,
                            *self._pathspec(exclude), env=env).stdout
        finally:
            try:
                os.unlink(temp_index)
            except OSError:
                pass

    def diff_from(self, base, exclude=()):
        """A binary-safe patch from BASE to the current work tree (see worktree_diff)."""
        return self.worktree_diff(base, exclude, "--binary")

    def shortstat_from(self, base, exclude=()):
        """'N files changed, ...' from BASE to the current work tree ('' when none)."""
        return self.worktree_diff(base, exclude, "--shortstat").strip()


# ---- JSON-RPC framing -----------------------------------------------------------

class MessageReader:
    """Reads JSON-RPC messages from a binary stream in either framing.

    MCP's stdio transport is newline-delimited JSON; some servers (and LSP-style
    tools) use `Content-Length: N` headers instead. The framing is detected per
    message, so one reader serves both; `framing` records the last one seen.
    read() returns the message bytes, or None at end of stream.
    """

    def __init__(self, stream, max_bytes=16 << 20):
        self.stream = stream
        self.max_bytes = max_bytes
        self.framing = None

    def read(self):
        while True:
            line = self.stream.readline()
            if not line:
                return None
            stripped = line.strip()
            if not stripped:
                continue
            if stripped[:15].lower() != b"content-length:":
                self.framing = "line"
                return stripped
            try:
                length = int(stripped[15:].strip())
            except ValueError:
                raise BridgeError("bad Content-Length header: %r" % stripped[:80], EXIT_FAILED)
            if not 0 <= length <= self.max_bytes:
                raise BridgeError("Content-Length %d exceeds the %d byte limit" % (
                    length, self.max_bytes), EXIT_FAILED)
            while True:  # further headers (Content-Type) until the blank line
                header = self.stream.readline()
                if not header:
                    return None
                if not header.strip():
                    break
            body = self.stream.read(length)
            if body is None or len(body) < length:
                return None
            self.framing = "content-length"
            return body


def frame_message(message, framing="line"):
    """Encode a message (dict or bytes) for the wire in the given framing."""
    data = message if isinstance(message, (bytes, bytearray)) else json_compact(message).encode("utf-8")
    if framing == "content-length":
        return b"Content-Length: %d\r\n\r\n" % len(data) + bytes(data)
    return bytes(data) + b"\n"


# ---- roots --------------------------------------------------------------------

def find_root(root=None):
    """--root if given, else the git top level of the working directory, else it."""
    if root:
        if not os.path.isdir(root):
            raise BridgeError("--root %s is not a directory" % root)
        return os.path.abspath(root)
    return git_toplevel(os.getcwd()) or os.getcwd()


# =============================================================================
# 2. WATCH - the .ai-handoff/ task queue (seed 000)
# =============================================================================
# (built on the `watch` branch)


# =============================================================================
# 3. SEAM - the _bridge/ verbs (seed 001)
# =============================================================================
# (built on the `seam` branch)


# =============================================================================
# 4. RELAY - Agent Teams <-> YAML queue relay (seed 002)
# =============================================================================
# (built on the `relay` branch)


# =============================================================================
# 5. PROXY - stdio MCP supervisor with observability (seed 003)
# =============================================================================

# ---- 5a. supervisor and relay ----
# (built on the `proxy` branch)
# ---- end 5a ----


# ---- 5b. observability: WebSocket server and dashboard ----
# (built on the `proxyobs` branch)
# ---- end 5b ----


# =============================================================================
# 6. CHANGES - change sets and their MCP executor (seed 004)
# =============================================================================
# (built on the `changes` branch)


# =============================================================================
# 7. CLI
# =============================================================================

def add_command(subparsers, name, func, help, example, description=None):
    """Register a subcommand with the options every command takes and an example."""
    import argparse
    parser = subparsers.add_parser(
        name, help=help, description=description or help,
        epilog="example:\n  " + example.strip().replace("\n", "\n  "),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", metavar="DIR",
                        help="repository root (default: git top level of the current directory)")
    parser.add_argument("--config", metavar="FILE",
                        help="config file (default: ROOT/bridge.config.json)")
    parser.set_defaults(func=func)
    return parser


def load_args_config(args):
    """(root, config) for a parsed command line: the common start of every cmd_*."""
    root = find_root(getattr(args, "root", None))
    return root, load_config(root, getattr(args, "config", None))


# ---- kernel commands ----
def add_kernel_parsers(subparsers):
    """Commands that expose kernel pieces directly (redact)."""
# ---- end kernel commands ----


# ---- watch commands ----
def add_watch_parsers(subparsers):
    """init, submit, watch, status, approve, unlock."""
# ---- end watch commands ----


# ---- seam commands ----
def add_seam_parsers(subparsers):
    """egress, inbox, initiate, alert, feed, wake."""
# ---- end seam commands ----


# ---- relay commands ----
def add_relay_parsers(subparsers):
    """relay down|up."""
# ---- end relay commands ----


# ---- proxy commands ----
def add_proxy_parsers(subparsers):
    """proxy -- SERVER COMMAND."""
# ---- end proxy commands ----


# ---- changes commands ----
def add_changes_parsers(subparsers):
    """changes id|new|validate|run|status|approve."""
# ---- end changes commands ----


def build_parser():
    import argparse
    parser = argparse.ArgumentParser(
        prog="bridge.py",
        description="Connect AI coding agents to each other and to their tools, safely.",
        epilog="Run `bridge.py COMMAND --help` for a command's options and an example.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version="bridge.py " + __version__)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (add_kernel_parsers, add_watch_parsers, add_seam_parsers, add_relay_parsers,
                add_proxy_parsers, add_changes_parsers):
        add(subparsers)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return args.func(args) or EXIT_OK
    except BridgeError as exc:
        warn("error: " + exc.message)
        return exc.code
    except KeyboardInterrupt:
        warn("interrupted")
        return 130
    except Exception as exc:  # the last line of defence: one clear line, no traceback
        if debug_enabled():
            raise
        warn("internal error: %s: %s (set BRIDGE_DEBUG=1 for a traceback)" % (
            type(exc).__name__, exc))
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
