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
    "stop_on_failure": True,
    "continue_on_failure": False,
    "worker_lock_ttl_sec": 7200,
    "log_size_cap_kb": 10,
    "redaction_patterns": [],
    "protected_branches": ["main", "master"],
    "commit_on_success": True,
    "return_to_base": True,
    "poll_sec": 1.0,
    "progress_sec": 10.0,
    "executor": {"command": ["opencode", "run", "{prompt}"], "env": {}},
    "bead": {"command": None, "timeout_sec": 30},
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
        # A leading global flag such as (?i) is an error inside an alternation on
        # Python 3.11+: scope it to its own alternative instead.
        self.regex = re.compile("|".join(
            "(?%s:%s)" % (m.group(1), p[m.end():]) if m else "(?:%s)" % p
            for p, m in ((p, re.match(r"\(\?([aiLmsux]+)\)", p)) for p in patterns)))

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
                cap_bytes=64 << 20, on_tick=None, tick_sec=10.0, kill_grace=5.0,
                on_start=None):
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
    - on_start(proc) is called once the child runs (to record or signal its group).
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

    if on_start:
        on_start(proc)
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
    # First wait on the output readers: Thread.join blocks on a lock, while
    # Popen.wait(timeout) polls with sleeps, which costs milliseconds on every
    # short command (git). The readers end when the child closes its pipes.
    while any(reader.is_alive() for reader in readers) and proc.poll() is None:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            break
        if on_tick and now >= next_tick:
            next_tick = now + tick_sec
            on_tick(now - started)
        wait = 0.5
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - now))
        for reader in readers:
            if reader.is_alive():
                reader.join(wait)
                break
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
        self._git_dir = None

    def run(self, *args, check=True, env=None, stdin_data=None, timeout=None):
        cmd = ["git", "-c", "core.hooksPath=/dev/null", *args]
        merged_env = dict(self.env, **env) if env else self.env
        result = run_command(cmd, cwd=self.root, env=merged_env, stdin_data=stdin_data,
                             timeout=timeout or self.timeout)
        if check and not result.ok:
            raise BridgeError("git %s failed (%s): %s" % (
                " ".join(args[:3]), result.describe(), result.stderr.strip()[-500:]), EXIT_FAILED)
        return result

    def git_dir(self):
        """The absolute .git directory (asked once per Git object)."""
        if self._git_dir is None:
            self._git_dir = self.run("rev-parse", "--absolute-git-dir").stdout.strip()
        return self._git_dir

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
        git_dir = self.git_dir()
        temp_index = os.path.join(git_dir, "bridge-index.%d.%s" % (os.getpid(), random_hex()))
        real_index = os.path.join(git_dir, "index")
        try:
            if os.path.exists(real_index):
                shutil.copyfile(real_index, temp_index)  # keeps git's stat cache: fast add -A
            env = {"GIT_INDEX_FILE": temp_index}
            # Exclusions go on the diff only: an exclude pathspec naming an ignored
            # path (e.g. .ai-handoff/ in info/exclude) makes `git add` exit 1.
            self.run("add", "-A", "--", ".", env=env)
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
# The Bridge Protocol: a planner drops task JSON into .ai-handoff/tasks/, one
# watcher (worker lock) takes each task through validate -> idempotency -> task
# lock -> running/ -> confirmation gate -> dirty check -> branch -> bead ->
# editing agent -> audit -> verify -> audit -> commit/return -> result. Every
# exit path writes results/{id}.json, redacted. The holes of the seed's sequence
# are closed as issue 2 decides (see the README's "Decisions").

HANDOFF_DIR = ".ai-handoff"
HANDOFF_SUBDIRS = ("tasks", "running", "results", "patches", "locks", "logs", "meta",
                   "pending", "failed")
WORKER_LOCK = "__worker__.lock"
TASK_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
CANONICAL_REASONS = ("schema_invalid", "dirty_repo", "branch_checkout_failed",
                     "requires_confirmation", "opencode_failed", "verify_failed",
                     "stale_lock_recovered", "internal_error")
TRUNCATED_MARKER = "[TRUNCATED - see logs/%s.log]"
TASK_MAX_BYTES = 1 << 20
RISK_LEVELS = ("low", "medium", "high")

# field -> (type(s), required, default). Unknown fields are kept (planners add
# their own) but never interpreted.
TASK_FIELDS = {
    "id": (str, True, None),
    "bead_title": (str, True, None),
    "goal": (str, False, ""),
    "done_condition": (str, False, ""),
    "prompt": (str, True, None),
    "scope": (list, False, []),
    "constraints": (list, False, []),
    "commands_to_run": (list, True, None),
    "requires_confirmation": (bool, False, False),
    "allow_dirty": (bool, False, False),
    "timeout_sec": (int, False, 1800),
    "risk_level": (str, False, "low"),
    "retry_policy": (dict, False, None),
    "attempt": (int, False, 1),
    "approved_at": (str, False, None),
}


class Handoff:
    """Paths of one repository's .ai-handoff/ directory."""

    def __init__(self, root):
        self.root = os.path.abspath(os.fspath(root))
        self.base = os.path.join(self.root, HANDOFF_DIR)

    def dir(self, name):
        return os.path.join(self.base, name)

    def path(self, name, filename):
        return os.path.join(self.base, name, filename)

    def rel(self, path):
        """A path relative to .ai-handoff/, as results name their artifacts."""
        return os.path.relpath(path, self.base)

    def exists(self):
        return os.path.isdir(self.dir("tasks"))

    def require(self):
        if not self.exists():
            raise BridgeError("%s has no %s/ (run `bridge.py init --root %s` first)" % (
                self.root, HANDOFF_DIR, self.root))

    def history_path(self, task_id):
        return self.path("meta", "%s.results.jsonl" % task_id)


def handoff_init(root):
    """Create .ai-handoff/ and make git ignore it locally. Returns what was done."""
    handoff = Handoff(root)
    done = []
    for name in HANDOFF_SUBDIRS:
        if os.path.lexists(handoff.dir(name)) and not os.path.isdir(handoff.dir(name)):
            raise BridgeError("%s exists but is not a directory" % handoff.dir(name), EXIT_FAILED)
        if not os.path.isdir(handoff.dir(name)):
            os.makedirs(handoff.dir(name), exist_ok=True)
            done.append("created %s/%s/" % (HANDOFF_DIR, name))
    git = Git(root)
    result = git.run("rev-parse", "--git-common-dir", check=False)
    if not result.ok:
        done.append("not a git repository: nothing to exclude (the watcher needs git)")
        return done
    common = result.stdout.strip()
    exclude = os.path.join(common if os.path.isabs(common) else os.path.join(root, common),
                           "info", "exclude")
    try:
        with open(exclude, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        lines = []
    if not any(line.strip() in ("/%s/" % HANDOFF_DIR, "%s/" % HANDOFF_DIR, "/" + HANDOFF_DIR,
                                HANDOFF_DIR) for line in lines):
        text = "\n".join(lines + ["# bridge.py watcher state (local, never committed)",
                                  "/%s/" % HANDOFF_DIR]) + "\n"
        atomic_write(exclude, text)
        done.append("added /%s/ to %s" % (HANDOFF_DIR, os.path.relpath(exclude, root)))
    return done


# ---- task files -----------------------------------------------------------------

def _type_label(kind):
    return {str: "a string", list: "a list", bool: "true or false", int: "an integer",
            dict: "an object"}[kind]


def validate_task(task, stem=None):
    """Every schema error of a task object, as a list of messages naming the field."""
    if not isinstance(task, dict):
        return ["the task must be a JSON object, got %s" % type(task).__name__]
    errors = []
    for name, (kind, required, _default) in TASK_FIELDS.items():
        if name not in task:
            if required:
                errors.append("%s: required field is missing" % name)
            continue
        value = task[name]
        if value is None and not required and name in ("approved_at", "retry_policy"):
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            errors.append("%s: must be %s, got %s" % (name, _type_label(kind), json.dumps(value)[:60]))
    task_id = task.get("id")
    if isinstance(task_id, str):
        if not TASK_ID_RE.match(task_id):
            errors.append("id: %r must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$" % task_id[:120])
        elif task_id.endswith(".lock") or task_id.endswith(".") or ".." in task_id:
            errors.append("id: %r is not a valid branch name under feat/ai/ "
                          "(no '..', no trailing '.' or '.lock')" % task_id)
        if stem is not None and task_id != stem:
            errors.append("id: %r must equal the file name's stem %r" % (task_id, stem))
    for name in ("scope", "constraints", "commands_to_run"):
        value = task.get(name)
        if isinstance(value, list):
            for index, item in enumerate(value):
                if not isinstance(item, str) or (name == "commands_to_run" and not item.strip()):
                    errors.append("%s[%d]: must be a non-empty string, got %s" % (
                        name, index, json.dumps(item)[:60]))
    if isinstance(task.get("commands_to_run"), list) and not task["commands_to_run"]:
        errors.append("commands_to_run: needs at least one verification command "
                      "(the watcher is the judge)")
    for name in ("bead_title", "prompt"):
        if isinstance(task.get(name), str) and not task[name].strip():
            errors.append("%s: must not be empty" % name)
    timeout = task.get("timeout_sec")
    if isinstance(timeout, int) and not isinstance(timeout, bool) and not 1 <= timeout <= 7 * 86400:
        errors.append("timeout_sec: must be between 1 and 604800, got %d" % timeout)
    attempt = task.get("attempt")
    if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt < 1:
        errors.append("attempt: must be 1 or more, got %d" % attempt)
    if isinstance(task.get("risk_level"), str) and task["risk_level"] not in RISK_LEVELS:
        errors.append("risk_level: must be one of %s, got %r" % ("/".join(RISK_LEVELS), task["risk_level"]))
    policy = task.get("retry_policy")
    if isinstance(policy, dict):
        most = policy.get("max_attempts", 1)
        if not isinstance(most, int) or isinstance(most, bool) or most < 1:
            errors.append("retry_policy.max_attempts: must be an integer of 1 or more, got %s"
                          % json.dumps(most)[:60])
    return errors


def task_defaults(task):
    """The task with every optional field filled in (a copy)."""
    full = dict(task)
    for name, (_kind, _required, default) in TASK_FIELDS.items():
        if name not in full or (full[name] is None and name == "retry_policy"):
            full[name] = json.loads(json.dumps(default)) if default is not None else default
    if not isinstance(full.get("retry_policy"), dict):
        full["retry_policy"] = {"max_attempts": 1}
    full["retry_policy"].setdefault("max_attempts", 1)
    return full


class TaskFileError(Exception):
    """A task file that cannot be used: `errors` lists why; `defer` means try later."""

    def __init__(self, errors, defer=False, raw=None):
        super().__init__("; ".join(errors))
        self.errors = errors
        self.defer = defer
        self.raw = raw


def read_task_file(path, check_stem=True, fresh_sec=2.0):
    """Load and validate a task file (never following a symlink). Raises TaskFileError."""
    path = os.fspath(path)
    name = os.path.basename(path)
    stem = name[:-5] if name.endswith(".json") else name
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise TaskFileError(["%s disappeared" % name], defer=True)
    import stat
    if stat.S_ISLNK(info.st_mode):
        raise TaskFileError(["%s is a symlink; task files must be regular files "
                             "(its target was not read)" % name])
    if not stat.S_ISREG(info.st_mode):
        raise TaskFileError(["%s is not a regular file" % name])
    if info.st_size > TASK_MAX_BYTES:
        raise TaskFileError(["%s is %d bytes; the limit is %d" % (name, info.st_size, TASK_MAX_BYTES)])
    fresh = time.time() - info.st_mtime < fresh_sec
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise TaskFileError(["cannot open %s: %s" % (name, exc.strerror or exc)])
    with os.fdopen(fd, "rb") as handle:
        raw = handle.read(TASK_MAX_BYTES + 1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskFileError(["%s is not UTF-8 (byte %d)" % (name, exc.start)], raw=raw)
    try:
        task = json.loads(text)
    except ValueError as exc:
        # A producer that does not rename atomically may still be writing it.
        raise TaskFileError(["%s is not JSON: %s" % (name, exc)], defer=fresh, raw=text)
    errors = validate_task(task, stem if check_stem else None)
    if errors:
        raise TaskFileError(errors, raw=task)
    return task


def list_task_files(directory):
    """Queued task files in FIFO order: *.json, not dot-prefixed, not .tmp."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    # ids of the form YYYY-MM-DD_NN_slug sort chronologically by name
    return sorted(name for name in names
                  if name.endswith(".json") and not name.startswith(".") and ".tmp" not in name)


def build_prompt(task):
    """The full prompt for the editing agent: goal, instructions, scope, constraints, done."""
    parts = ["# Task %s: %s" % (task["id"], task["bead_title"])]
    if task.get("goal"):
        parts.append("## Goal\n%s" % task["goal"])
    parts.append("## Instructions\n%s" % task["prompt"])
    if task.get("scope"):
        parts.append("## Scope (edit only these paths)\n" + "\n".join("- %s" % s for s in task["scope"]))
    if task.get("constraints"):
        parts.append("## Constraints\n" + "\n".join("- %s" % c for c in task["constraints"]))
    if task.get("done_condition"):
        parts.append("## Done when\n%s" % task["done_condition"])
    parts.append("## Rules\nEdit files only. Do not run the verification yourself: the watcher "
                 "runs these commands afterwards and decides the outcome:\n"
                 + "\n".join("- `%s`" % c for c in task["commands_to_run"]))
    return "\n\n".join(parts) + "\n"


def cap_text(text, cap_bytes, task_id):
    """Text kept in a result: at most cap_bytes, the tail, behind the TRUNCATED marker."""
    data = text.encode("utf-8")
    if len(data) <= cap_bytes:
        return text
    tail = data[-cap_bytes:].decode("utf-8", "ignore")
    return TRUNCATED_MARKER % task_id + "\n" + tail


def dropped_note(result):
    """Log note for output beyond run_command's in-memory cap (never silently lost)."""
    if not result.dropped_bytes:
        return ""
    return " (%d more bytes of output were not kept: over the capture cap)" % result.dropped_bytes


def result_history(handoff, task_id):
    """Archived results of earlier attempts/gates of a task, oldest first."""
    return [line.record for line in scan_jsonl(handoff.history_path(task_id)) if line.record]


def archive_result(handoff, task_id, why):
    """Move results/{id}.json into meta/{id}.results.jsonl. True when there was one.

    The record is appended before the result is removed, so a crash in between
    leaves a duplicate, never a loss.
    """
    path = handoff.path("results", task_id + ".json")
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return False
    try:
        record = json.loads(raw.decode("utf-8"))
    except ValueError:
        record = {"unparseable_result": raw.decode("utf-8", "replace")}
    if not isinstance(record, dict):
        record = {"unparseable_result": record}
    record["archived_at"] = now_iso()
    record["archived_because"] = why
    append_jsonl(handoff.history_path(task_id), record)
    os.unlink(path)
    return True


def move_no_clobber(src, directory, name):
    """Rename src into directory/name, adding a suffix instead of replacing a file."""
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, name)
    if os.path.lexists(target):
        stem, ext = os.path.splitext(name)
        target = os.path.join(directory, "%s.%s-%s%s" % (stem, time.strftime("%Y%m%dT%H%M%S"),
                                                         random_hex(2), ext))
    os.rename(src, target)
    return target


def read_result(handoff, task_id):
    try:
        return read_json_file(handoff.path("results", task_id + ".json"), "result")
    except BridgeError:
        return None


# ---- beads ----------------------------------------------------------------------

class Beads:
    """The optional beads tracker through the real `bd` CLI, always by explicit id.

    bead.command null: use `bd` when it is on PATH and the repo has .beads/;
    otherwise every bead step is skipped (and the result says so). A configured
    bead.command is mandatory: if it fails, the task fails (reason bead_failed).
    """

    def __init__(self, root, config):
        import shutil
        self.root = root
        self.timeout = float(config_get(config, "bead.timeout_sec", 30) or 30)
        command = config_get(config, "bead.command")
        self.required = command is not None
        self.skip_reason = None
        if isinstance(command, str):
            command = [command]
        if command:
            self.argv = list(command)
        elif shutil.which("bd") and os.path.isdir(os.path.join(root, ".beads")):
            self.argv = ["bd"]
            self.required = True
        else:
            self.argv = None
            self.skip_reason = ("bd is not on PATH" if not shutil.which("bd")
                                else "no .beads/ in the repository (run `bd init`)")

    def call(self, *args):
        return run_command(self.argv + list(args), cwd=self.root, timeout=self.timeout)

    def create(self, title):
        """(bead_id, raw_output, error)."""
        result = self.call("create", title, "--silent")
        raw = result.stdout + (("\n" + result.stderr) if result.stderr.strip() else "")
        if not result.ok:
            return None, raw, "bd create %s: %s" % (result.describe(), result.stderr.strip()[-300:])
        bead_id = parse_bead_id(result.stdout)
        if not bead_id:
            return None, raw, "bd create printed no issue id"
        return bead_id, raw, None

    def block(self, bead_id, reason):
        result = self.call("update", bead_id, "--status", "blocked", "--append-notes", reason)
        return None if result.ok else "bd update %s: %s %s" % (
            bead_id, result.describe(), result.stderr.strip()[-300:])

    def close(self, bead_id, reason):
        result = self.call("close", bead_id, "--reason", reason)
        return None if result.ok else "bd close %s: %s %s" % (
            bead_id, result.describe(), result.stderr.strip()[-300:])


def parse_bead_id(output):
    """The issue id from `bd create --silent` (one token), `--json` or the human line."""
    text = (output or "").strip()
    if not text:
        return None
    if text.startswith("{"):
        try:
            value = json.loads(text).get("id")
            return value if isinstance(value, str) and _SAFE_NAME.match(value) else None
        except (ValueError, AttributeError):
            return None
    match = re.search(r"Created issue:\s*(\S+)", text)
    token = match.group(1) if match else text.split()[-1] if len(text.split()) == 1 else None
    if token is None:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        token = lines[-1] if lines and " " not in lines[-1] else None
    return token.rstrip(":,") if token and _SAFE_NAME.match(token.rstrip(":,")) else None


def bead_id_from_meta(handoff, task_id):
    path = handoff.path("meta", task_id + ".bead")
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return parse_bead_id(handle.read())
    except FileNotFoundError:
        return None


# ---- the watcher ----------------------------------------------------------------

class Stop(Exception):
    """Raised inside a task run to end it with a given outcome (always with a result)."""

    def __init__(self, status, reason, detail):
        super().__init__(detail)
        self.status, self.reason, self.detail = status, reason, detail


class Watcher:
    """One watcher process: the worker lock, the startup sweep and the task loop."""

    def __init__(self, root, config, poll=None, once=False, out=None):
        self.root = os.path.abspath(root)
        self.config = config
        self.handoff = Handoff(self.root)
        self.git = Git(self.root)
        self.redactor = get_redactor(config)
        self.once = once
        self.poll = float(poll if poll is not None else config.get("poll_sec", 1.0))
        if not 0.05 <= self.poll <= 3600:
            raise BridgeError("poll interval must be between 0.05 and 3600 seconds, got %s" % self.poll)
        self.cap = int(config.get("log_size_cap_kb", 10)) * 1024
        self.stop_on_failure = bool(config.get("stop_on_failure", True)) and not bool(
            config.get("continue_on_failure", False))
        self.continue_on_failure = bool(config.get("continue_on_failure", False))
        self.protected = list(config.get("protected_branches") or [])
        self.exclude = [HANDOFF_DIR]
        self.progress_sec = float(config.get("progress_sec", 10) or 10)
        command = config_get(config, "executor.command") or []
        if isinstance(command, str) or not command or not all(isinstance(a, str) for a in command):
            raise BridgeError("executor.command must be a non-empty list of strings (an argv "
                              "template), got %s" % json.dumps(command))
        self.executor = list(command)
        self.out = out or sys.stdout
        self.worker = None
        self.task_lock = None
        self.child = None
        self.stopping = None
        self.stopped_on_failure = False
        self.warned = set()
        self.git_dir = None
        self.beads = None
        self.counts = {}
        self.beat_lock = None  # serialises heartbeats with lock releases (fd reuse)

    # -- small helpers --

    def say(self, message):
        warn("watch: " + message)

    def redact(self, text):
        return self.redactor.redact(text) if text else text

    def write_redacted(self, path, text):
        """Redacted text to a file under .ai-handoff/; True when redaction changed it."""
        clean = self.redact(text)
        atomic_write(path, clean or "")
        return clean != text

    def log(self, task_id, text):
        append_text(self.handoff.path("logs", task_id + ".log"), self.redact(text))

    # -- lifecycle --

    def run(self):
        """The whole watcher: lock, sweep, loop. Returns the exit code."""
        self.handoff.require()
        if not self.git.run("rev-parse", "--is-inside-work-tree", check=False).ok:
            raise BridgeError("%s is not a git work tree; the watcher needs git" % self.root)
        ttl = int(self.config.get("worker_lock_ttl_sec", 7200))
        self.worker = FileLock(self.handoff.path("locks", WORKER_LOCK), ttl_sec=ttl,
                               meta={"role": "worker", "root": self.root})
        if not self.worker.acquire():
            raise BridgeError("another watcher holds %s: %s" % (
                self.worker.path, describe_holder(self.worker.holder)), EXIT_LOCKED)
        if self.worker.recovered:
            self.say("took over the worker lock of %s (it no longer runs)" % describe_holder(
                self.worker.recovered))
        self.git_dir = self.git.git_dir()
        for line in handoff_init(self.root):  # idempotent: makes sure git ignores .ai-handoff/
            self.say(line)
        self.beads = Beads(self.root, self.config)
        import threading
        self.beat_lock = threading.Lock()
        previous = self.install_signals()
        beat = self.start_heartbeat(ttl)
        try:
            self.sweep()
            self.loop()
        finally:
            with self.beat_lock:
                beat.set()
                self.worker.release()
            self.restore_signals(previous)
        if self.counts:
            self.say("done: %s" % ", ".join("%s %d" % item for item in sorted(self.counts.items())))
        if self.stopped_on_failure:
            return EXIT_FAILED
        return EXIT_OK

    def install_signals(self):
        import signal

        def handler(signum, _frame):
            self.stopping = signal.Signals(signum).name
            child = self.child
            if child is not None:
                try:
                    os.killpg(child.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[sig] = signal.signal(sig, handler)
            except ValueError:
                pass  # not the main thread
        return previous

    @staticmethod
    def restore_signals(previous):
        import signal
        for sig, old in previous.items():
            signal.signal(sig, old)

    def start_heartbeat(self, ttl):
        """A daemon thread refreshing the worker (and current task) lock heartbeat."""
        import threading
        done = threading.Event()
        interval = max(1.0, min(60.0, ttl / 4.0))

        def beat():
            while not done.wait(interval):
                with self.beat_lock:
                    if done.is_set():
                        return
                    try:
                        self.worker.heartbeat()
                        lock = self.task_lock
                        if lock is not None:
                            lock.heartbeat()
                    except OSError as exc:
                        self.say("heartbeat failed: %s" % exc)
        threading.Thread(target=beat, name="bridge-heartbeat", daemon=True).start()
        return done

    def loop(self):
        tasks_dir = self.handoff.dir("tasks")
        last_mtime, last_scan = None, 0.0
        while not self.stopping:
            try:
                mtime = os.stat(tasks_dir).st_mtime_ns
            except FileNotFoundError:
                raise BridgeError("%s disappeared" % tasks_dir, EXIT_FAILED)
            now = time.monotonic()
            worked = deferred = False
            if mtime != last_mtime or now - last_scan >= 10.0 or self.once:
                last_mtime, last_scan = mtime, now
                for name in list_task_files(tasks_dir):
                    if self.stopping:
                        break
                    outcome = self.process(os.path.join(tasks_dir, name))
                    if outcome == "deferred":
                        deferred = True
                        last_mtime = None
                    elif outcome:
                        worked = True
                    if outcome == "failed" and self.stop_on_failure:
                        self.stopped_on_failure = True
                        self.say("the queue stopped on the failure of %s (set continue_on_failure "
                                 "to go on); fix it, then run the watcher again" % name[:-5])
                        return
            if self.once and not worked and not deferred:
                return
            if self.once and deferred and not worked:
                time.sleep(0.25)
            elif not self.once or not worked:
                time.sleep(self.poll)
        self.say("stopping on %s" % self.stopping)

    # -- startup sweep (crash recovery) --

    def sweep(self):
        """Recover tasks left in running/ by a watcher that died, before new work."""
        for name in os.listdir(self.git_dir):  # throwaway indexes of a crashed watcher
            if name.startswith("bridge-index."):
                pid = name.split(".")[1]
                if pid.isdigit() and holder_is_dead({"pid": int(pid), "host": os.uname().nodename}):
                    try:
                        os.unlink(os.path.join(self.git_dir, name))
                    except OSError:
                        pass
        running = self.handoff.dir("running")
        for name in list_task_files(running):
            task_id = name[:-5]
            path = os.path.join(running, name)
            lock_path = self.handoff.path("locks", task_id + ".lock")
            state, meta = FileLock.probe(lock_path)
            if state == "held":
                self.say("%s is in running/ and its lock is held by %s; leaving it" % (
                    task_id, describe_holder(meta)))
                continue
            result = read_result(self.handoff, task_id)
            try:
                task = task_defaults(read_task_file(path, fresh_sec=0))
            except TaskFileError:
                task = None
            if result and task and result.get("attempt") == task.get("attempt"):
                # finished, crashed before tidying up: the result is the truth
                os.unlink(path)
                self.drop_lock_file(lock_path)
                continue
            if meta and not meta.get("released_at") and not holder_is_dead(meta):
                timeout = (task or {}).get("timeout_sec", 1800)
                limit = max(timeout * 2, 7200)
                beat = meta.get("heartbeat_ts") or meta.get("created_ts") or 0
                if time.time() - beat <= limit:
                    self.say("%s is in running/; its lock (%s) is not provably stale yet "
                             "(limit %ds); leaving it" % (task_id, describe_holder(meta), limit))
                    continue
                why = "lock older than %ds" % limit
            else:
                why = ("its watcher (%s) no longer runs" % describe_holder(meta) if meta
                       else "no lock held for it")
            self.recover(task_id, path, task, meta, why)

    def recover(self, task_id, path, task, meta, why):
        """Seed step 4 stale recovery: result, bead blocked, re-queue or failed/."""
        import signal
        lock = FileLock(self.handoff.path("locks", task_id + ".lock"))
        if not lock.acquire():
            return
        try:
            meta = meta or {}
            agent = meta.get("agent")
            killed = False
            if isinstance(agent, dict) and isinstance(agent.get("pid"), int):
                ident = process_identity(agent["pid"])
                if ident["start_ticks"] and ident["start_ticks"] == agent.get("start_ticks"):
                    try:
                        os.killpg(agent["pid"], signal.SIGKILL)
                        killed = True
                    except (ProcessLookupError, PermissionError):
                        pass
            if task is None:
                safe = task_id if TASK_ID_RE.match(task_id) else "invalid-" + random_hex()
                target = move_no_clobber(path, self.handoff.dir("failed"), os.path.basename(path))
                result = self.new_result(None, safe)
                result.update(status="failed", exit_path="failed", reason="stale_lock_recovered",
                              detail="stale (%s) and its task file is unreadable; moved to %s"
                              % (why, self.handoff.rel(target)))
                self.write_result(safe, result)
                return
            result = self.new_result(task)
            result["lock"] = {"recovered_from": meta, "why": why, "orphan_agent_killed": killed}
            git_state = result["git"]
            snap = self.git_snapshot()
            base_branch, branch = meta.get("base_branch"), meta.get("branch")
            git_state.update(base_branch=base_branch, branch=snap["current_branch"],
                             head_commit=snap["head"], status_after_verify=snap["status"],
                             dirty_after_verify=snap["dirty"])
            parking = ""
            if branch and snap["current_branch"] == branch and branch != base_branch:
                # Park the interrupted work on its branch so the next task (or the
                # retry) starts clean; nothing is reverted.
                try:
                    if snap["dirty"]:
                        git_state["wip_commit"] = self.commit_all(
                            "WIP(bridge): %s interrupted (stale_lock_recovered, attempt %s) - "
                            "NOT verified" % (task_id, task["attempt"]))
                    if base_branch and self.config.get("return_to_base", True):
                        back = self.git.run("checkout", "-q", base_branch, check=False)
                        git_state["returned_to_base"] = back.ok
                except BridgeError as exc:
                    parking = "; parking the interrupted work failed: %s" % exc.message
            retry = task["attempt"] < task["retry_policy"]["max_attempts"]
            detail = "task lock was stale (%s); %s" % (
                why, "re-queued as attempt %d" % (task["attempt"] + 1) if retry
                else "attempts exhausted (%d of %d); moved to failed/" % (
                    task["attempt"], task["retry_policy"]["max_attempts"]))
            result.update(status="failed", exit_path="failed", reason="stale_lock_recovered",
                          detail=detail + parking)
            bead_id = bead_id_from_meta(self.handoff, task_id)
            if bead_id and self.beads.argv:
                error = self.beads.block(bead_id, "stale lock recovered: " + why)
                result["bead"].update(id=bead_id, error=error)
            self.write_result(task_id, result)
            self.say("%s: %s" % (task_id, detail))
            if retry:
                archive_result(self.handoff, task_id, "re-queued for attempt %d" % (task["attempt"] + 1))
                requeued = dict(read_task_file(path, fresh_sec=0))
                requeued["attempt"] = task["attempt"] + 1
                atomic_write_json(self.handoff.path("tasks", task_id + ".json"), requeued)
                os.unlink(path)
            else:
                move_no_clobber(path, self.handoff.dir("failed"), task_id + ".json")
        finally:
            lock.release()
            self.drop_lock_file(lock.path)

    @staticmethod
    def drop_lock_file(path):
        # Safe: only the holder of the worker lock ever takes task locks.
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    # -- one task --

    def process(self, path):
        """Take one queued task file through the protocol. Returns its outcome or None."""
        name = os.path.basename(path)
        stem = name[:-5]
        try:
            task = read_task_file(path)
        except TaskFileError as exc:
            if exc.defer:
                return "deferred"
            return self.refuse(path, stem, exc)
        task = task_defaults(task)
        task_id = task["id"]
        existing = read_result(self.handoff, task_id)
        if os.path.exists(self.handoff.path("results", task_id + ".json")):
            done_attempt = (existing or {}).get("attempt", 1)
            if existing is None or not isinstance(done_attempt, int) or done_attempt >= task["attempt"]:
                if task_id not in self.warned:
                    self.warned.add(task_id)
                    self.say("%s already has a result for attempt %s: skipped (idempotency); use "
                             "`submit --retry` to run it again" % (task_id, task["attempt"]))
                return None
            archive_result(self.handoff, task_id, "superseded by attempt %d" % task["attempt"])
        running = self.handoff.path("running", name)
        if os.path.lexists(running):
            if task_id not in self.warned:
                self.warned.add(task_id)
                self.say("%s is queued but also in running/; skipped until that one is recovered"
                         % task_id)
            return None
        lock = FileLock(self.handoff.path("locks", task_id + ".lock"),
                        meta={"task_id": task_id, "timeout_sec": task["timeout_sec"],
                              "attempt": task["attempt"]})
        if not lock.acquire():
            self.say("%s: task lock held by %s; skipped" % (task_id, describe_holder(lock.holder)))
            return None
        self.task_lock = lock
        try:
            os.rename(path, running)
            return self.execute(task, running)
        finally:
            with self.beat_lock:
                self.task_lock = None
                lock.release()
            self.child = None
            self.drop_lock_file(lock.path)

    def refuse(self, path, stem, exc):
        """schema_invalid: result (exit_path skipped), file moved to failed/."""
        task_id = stem if TASK_ID_RE.match(stem) else "invalid-%s" % random_hex()
        target = move_no_clobber(path, self.handoff.dir("failed"), os.path.basename(path))
        snapshot = exc.raw if isinstance(exc.raw, dict) else None
        result = self.new_result(snapshot, task_id)
        result.update(status="failed", exit_path="skipped", reason="schema_invalid",
                      detail="the task file was refused; moved to %s" % self.handoff.rel(target),
                      errors=exc.errors, task_file=self.handoff.rel(target), task_snapshot=snapshot)
        result["bead"]["skipped"] = "the task was refused"
        if os.path.exists(self.handoff.path("results", task_id + ".json")):
            archive_result(self.handoff, task_id, "superseded by a schema_invalid refusal")
        self.write_result(task_id, result)
        self.say("%s: schema_invalid: %s" % (task_id, "; ".join(exc.errors)[:400]))
        return "skipped"

    def new_result(self, task, task_id=None):
        """Every field of the result schema, so each exit path writes them all.

        `task` may be a refused (partial) task or None.
        """
        task = task if isinstance(task, dict) else {}
        attempt = task.get("attempt", 1)
        policy = task.get("retry_policy") if isinstance(task.get("retry_policy"), dict) else {}
        title = task.get("bead_title")
        return {
            "id": task_id or task.get("id"), "status": None, "exit_path": None, "reason": None,
            "detail": "",
            "attempt": attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
            "max_attempts": policy.get("max_attempts", 1),
            "approved_at": task.get("approved_at"),
            "started_at": now_iso(),
            "bead": {"title": title if isinstance(title, str) else None, "id": None, "raw_output": None,
                     "skipped": None, "error": None},
            "git": {"base_branch": None, "branch": None, "branch_created": False,
                    "base_commit": None, "head_commit": None, "dirty_before": None,
                    "dirty_after_verify": None, "status_before": None,
                    "status_after_verify": None, "diff_stat_pre": None, "diff_stat_post": None,
                    "commit": None, "wip_commit": None, "returned_to_base": None},
            "executor": None,
            "commands": [],
            "artifacts": {"patch_pre": None, "patch_post": None, "logs": None,
                          "prompt": None, "history": None},
            "patch_redacted": {"pre": False, "post": False},
            "previous_results": [],
            "task_snapshot": task,
            "watcher": {"pid": os.getpid(), "host": os.uname().nodename, "version": __version__},
        }

    def write_result(self, task_id, result):
        """The single source of truth: redacted, atomic, always written."""
        result = dict(result)
        result.setdefault("id", task_id)
        result["timestamp"] = now_iso()
        history = self.handoff.history_path(task_id)
        if os.path.exists(history):
            result["previous_results"] = [
                {k: r.get(k) for k in ("attempt", "status", "reason", "exit_path", "timestamp",
                                       "archived_because")}
                for r in result_history(self.handoff, task_id)]
            result.setdefault("artifacts", {})["history"] = self.handoff.rel(history)
        atomic_write_json(self.handoff.path("results", task_id + ".json"),
                          self.redactor.redact_obj(result))
        self.counts[result.get("exit_path")] = self.counts.get(result.get("exit_path"), 0) + 1

    def git_snapshot(self):
        """HEAD, branch and porcelain status (.ai-handoff/ excluded) in ONE git call.

        `status --porcelain=v2 --branch` carries the HEAD commit and branch in its
        header; entries are rendered back to the familiar v1 `XY path` lines.
        """
        result = self.git.run("status", "--porcelain=v2", "-z", "--branch", "--untracked-files=all",
                              "--", ".", *[":(exclude)%s" % p for p in self.exclude], check=False)
        if not result.ok:
            return {"head": self.git.head(), "current_branch": self.git.current_branch(),
                    "status": "git status failed: %s" % result.stderr.strip()[-300:],
                    "dirty": True}  # fail closed
        state = {"head": None, "current_branch": None}
        lines, fields, index = [], result.stdout.split("\0"), 0
        while index < len(fields):
            field = fields[index]
            index += 1
            if field.startswith("# branch.oid "):
                oid = field[13:]
                state["head"] = None if oid == "(initial)" else oid
            elif field.startswith("# branch.head "):
                name = field[14:]
                state["current_branch"] = None if name == "(detached)" else name
            elif field[:2] in ("1 ", "u "):
                parts = field.split(" ", 8 if field[0] == "1" else 10)
                lines.append("%s %s" % (parts[1].replace(".", " "), parts[-1]))
            elif field[:2] == "2 ":
                parts = field.split(" ", 9)
                origin = fields[index] if index < len(fields) else ""
                index += 1
                lines.append("%s %s -> %s" % (parts[1].replace(".", " "), origin, parts[-1]))
            elif field[:2] in ("? ", "! "):
                lines.append("%s %s" % (field[0] * 2, field[2:]))
        state["status"] = "".join(line + "\n" for line in lines)
        state["dirty"] = bool(lines)
        return state

    def in_progress_operation(self):
        for name in ("MERGE_HEAD", "rebase-merge", "rebase-apply", "CHERRY_PICK_HEAD", "REVERT_HEAD"):
            if os.path.exists(os.path.join(self.git_dir, name)):
                return name
        return None

    def audit(self, base):
        """(patch, shortstat) from base to the work tree: one temp-index diff (kernel)."""
        out = self.git.worktree_diff(base, self.exclude, "--binary", "--shortstat", "-p")
        if not out:
            return "", ""
        stat, _, patch = out.partition("\n\n")
        return patch, stat.strip()

    def commit_all(self, message):
        """Commit everything but .ai-handoff/ on the current branch; the new sha or None."""
        self.git.run("add", "-A")  # .ai-handoff/ is in info/exclude (see run())
        result = self.git.run("commit", "-q", "--no-verify", "-m", message, check=False)
        if not result.ok and "tell me who you are" in (result.stderr + result.stdout).lower():
            result = self.git.run("-c", "user.name=bridge.py", "-c", "user.email=bridge@localhost",
                                  "commit", "-q", "--no-verify", "-m", message, check=False)
        if not result.ok:
            if "nothing to commit" in result.stdout + result.stderr:
                return None
            raise BridgeError("git commit failed: %s" % (result.stderr or result.stdout).strip()[-300:],
                              EXIT_FAILED)
        return self.git.head()

    def note_in_task_lock(self, **fields):
        """Record fields in the task lock's metadata (read by a later crash recovery)."""
        with self.beat_lock:
            lock = self.task_lock
            if lock is not None:
                lock.extra.update(fields)
                lock.meta.update(fields)
                lock.heartbeat()

    def progress(self, task_id, step):
        def tick(elapsed):
            self.say("%s: %s still running (%ds)" % (task_id, step, int(elapsed)))
        return tick

    def run_child(self, cmd, task, step, shell=False, env=None):
        """An agent or verify command with the task timeout, group kill and progress."""
        def started(proc):
            self.child = proc
            if step == "agent" and self.task_lock is not None:
                agent = {"pid": proc.pid, "start_ticks": _start_ticks(proc.pid)}
                self.note_in_task_lock(agent=agent)
        try:
            return run_command(cmd, cwd=self.root, env=env, timeout=task["timeout_sec"],
                               shell=shell, on_tick=self.progress(task["id"], step),
                               tick_sec=self.progress_sec, on_start=started,
                               cap_bytes=max(self.cap * 64, 8 << 20))
        finally:
            self.child = None

    def execute(self, task, running):
        """Steps 6-14 for a task already in running/ under its lock."""
        task_id = task["id"]
        result = self.new_result(task)
        started = monotonic()
        outcome = None
        try:
            outcome = self.steps(task, running, result)
        except Stop as stop:
            result.update(status=stop.status, exit_path=stop.status, reason=stop.reason,
                          detail=stop.detail)
        except Exception as exc:  # the result is still written: no silent failure
            if debug_enabled():
                import traceback
                traceback.print_exc()
            result.update(status="failed", exit_path="failed", reason="internal_error",
                          detail="%s: %s" % (type(exc).__name__, getattr(exc, "message", exc)))
        if outcome != "pending":
            if result["status"] != "success":
                self.after_failure(task, result)
            result["duration_ms"] = int((monotonic() - started) * 1000)
            result["finished_at"] = now_iso()
            self.write_result(task_id, result)
            # the result is written first: a crash now leaves a result, never a lost task
            if result["status"] == "success":
                os.unlink(running)
            else:
                move_no_clobber(running, self.handoff.dir("failed"), task_id + ".json")
            self.say("%s: %s (%s)%s" % (task_id, result["status"], result["reason"],
                                        (": " + result["detail"]) if result["detail"] else ""))
        return result["exit_path"]

    def steps(self, task, running, result):
        task_id = task["id"]
        git_state = result["git"]
        # 6. confirmation gate: before any git change
        if task["requires_confirmation"] and not task.get("approved_at"):
            snap = self.git_snapshot()
            git_state.update(branch=snap["current_branch"], base_branch=snap["current_branch"],
                             base_commit=snap["head"],
                             dirty_before=snap["dirty"], status_before=snap["status"],
                             status_porcelain=snap["status"])
            result["bead"]["skipped"] = "not created before approval"
            result.update(status="needs_confirmation", exit_path="needs_confirmation",
                          reason="requires_confirmation",
                          detail="waiting in pending/; run `bridge.py approve %s`" % task_id)
            self.write_result(task_id, result)
            move_no_clobber(running, self.handoff.dir("pending"), task_id + ".json")
            self.say("%s: needs confirmation (bridge.py approve %s)" % (task_id, task_id))
            return "pending"
        # 3. safety: dirty check and git state, captured before the agent runs
        snap = self.git_snapshot()
        base_branch = snap["current_branch"]
        git_state.update(base_branch=base_branch, base_commit=snap["head"],
                         dirty_before=snap["dirty"], status_before=snap["status"])
        operation = self.in_progress_operation()
        if operation:
            raise Stop("blocked", "dirty_repo", "a git operation is in progress (%s); finish or "
                       "abort it first" % operation)
        if snap["dirty"] and not task["allow_dirty"]:
            raise Stop("blocked", "dirty_repo", "the work tree has uncommitted changes "
                       "(see git.status_before); commit or stash them, or set allow_dirty")
        if snap["head"] is None:
            raise Stop("blocked", "branch_checkout_failed", "the repository has no commit yet "
                       "(unborn branch); commit something first")
        # 3b. branch: off protected branches (and detached HEAD) onto feat/ai/{id}
        branch = base_branch
        if base_branch is None or base_branch in self.protected:
            branch = "feat/ai/" + task_id
            made = self.git.run("checkout", "-q", "-b", branch, check=False)
            if made.ok:
                git_state["branch_created"] = True
            elif "already exists" in made.stderr and task["attempt"] > 1:
                switched = self.git.run("checkout", "-q", branch, check=False)
                if not switched.ok:
                    raise Stop("blocked", "branch_checkout_failed", "cannot switch to the existing "
                               "%s for retry: %s" % (branch, switched.stderr.strip()[-300:]))
                git_state["base_commit"] = self.git.head()
            elif "already exists" in made.stderr:
                raise Stop("blocked", "branch_checkout_failed", "branch %s already exists and this "
                           "is attempt 1, not a retry of the same task; rename the task or delete "
                           "the branch" % branch)
            else:
                raise Stop("blocked", "branch_checkout_failed", "git checkout -b %s failed: %s" % (
                    branch, made.stderr.strip()[-300:]))
        git_state["branch"] = branch
        self.note_in_task_lock(branch=branch, base_branch=base_branch)  # for crash recovery
        # 7. bead
        self.bead_create(task, result)
        # 8. the editing agent
        prompt = build_prompt(task)
        prompt_path = self.handoff.path("meta", task_id + ".prompt.md")
        self.write_redacted(prompt_path, prompt)
        result["artifacts"]["prompt"] = self.handoff.rel(prompt_path)
        log_path = self.handoff.path("logs", task_id + ".log")
        result["artifacts"]["logs"] = self.handoff.rel(log_path)
        self.log(task_id, "=== %s attempt %d started %s on %s (base %s)\n" % (
            task_id, task["attempt"], now_iso(), branch, git_state["base_commit"]))
        values = {"{prompt}": prompt, "{prompt_file}": prompt_path, "{task_file}": running,
                  "{id}": task_id, "{root}": self.root}
        argv = []
        for word in self.executor:
            for key, value in values.items():
                word = word.replace(key, value)
            argv.append(word)
        env = dict(os.environ)
        extra_env = config_get(self.config, "executor.env") or {}
        env.update({str(k): str(v) for k, v in extra_env.items()})
        env.update(BRIDGE_TASK_ID=task_id, BRIDGE_TASK_FILE=running, BRIDGE_PROMPT_FILE=prompt_path,
                   BRIDGE_ROOT=self.root)
        self.say("%s: running the editing agent (%s)" % (task_id, self.executor[0]))
        ran = self.run_child(argv, task, "agent", env=env)
        self.log(task_id, "--- agent: %s\n--- stdout\n%s\n--- stderr\n%s\n--- agent %s%s\n" % (
            " ".join(self.executor), ran.stdout, ran.stderr, ran.describe(), dropped_note(ran)))
        result["executor"] = {
            "argv": [self.redact(a)[:500] for a in self.executor],
            "exit_code": ran.exit_code, "timed_out": ran.timed_out, "signal": ran.signal,
            "duration_ms": int(ran.duration * 1000),
            "stdout": cap_text(self.redact(ran.stdout), self.cap, task_id),
            "stderr": cap_text(self.redact(ran.stderr), self.cap, task_id),
            "error": ran.error,
        }
        # 9. audit 1 (also the partial evidence when the agent failed)
        self.audit_into(task_id, result, "pre")
        if self.stopping:
            raise Stop("failed", "opencode_failed", "the watcher received %s while the agent ran; "
                       "the agent was stopped" % self.stopping)
        if not ran.ok:
            self.post_state(result)
            raise Stop("failed", "opencode_failed", "the editing agent %s" % ran.describe())
        # 10. verify
        failed = None
        for index, command in enumerate(task["commands_to_run"]):
            if failed is not None or self.stopping:
                result["commands"].append({"cmd": command, "exit_code": None, "skipped": True,
                                           "stdout": "", "stderr": ""})
                continue
            self.say("%s: verify %d/%d: %s" % (task_id, index + 1, len(task["commands_to_run"]),
                                                self.redact(command)[:200]))
            done = self.run_child(command, task, "verify %d" % (index + 1), shell=True)
            self.log(task_id, "--- verify: %s\n--- stdout\n%s\n--- stderr\n%s\n--- %s%s\n" % (
                command, done.stdout, done.stderr, done.describe(), dropped_note(done)))
            result["commands"].append({
                "cmd": command, "exit_code": done.exit_code, "timed_out": done.timed_out,
                "duration_ms": int(done.duration * 1000),
                "stdout": cap_text(self.redact(done.stdout), self.cap, task_id),
                "stderr": cap_text(self.redact(done.stderr), self.cap, task_id),
            })
            if not done.ok:
                failed = (command, done)
        # 11. audit 2
        self.audit_into(task_id, result, "post")
        self.post_state(result)
        if self.stopping:
            raise Stop("failed", "verify_failed", "the watcher received %s during verification; "
                       "the verification was stopped" % self.stopping)
        if failed is not None:
            raise Stop("failed", "verify_failed", "`%s` %s" % (failed[0][:200], failed[1].describe()))
        # 12-13. success: commit on the task branch, return to base, close the bead
        if self.config.get("commit_on_success", True) and git_state["dirty_after_verify"]:
            git_state["commit"] = self.commit_all("bridge: %s: %s\n\nTask %s (attempt %d) passed: %s\n" % (
                task_id, task["bead_title"], task_id, task["attempt"],
                "; ".join(task["commands_to_run"])))
        self.return_to_base(result)
        result.update(status="success", exit_path="success", reason="verified",
                      detail="all %d verification command(s) passed" % len(task["commands_to_run"]))
        bead_id = result["bead"]["id"]
        if bead_id:
            error = self.beads.close(bead_id, "verified by bridge.py (%s)" % task_id)
            if error:
                result["bead"]["error"] = error
                raise Stop("failed", "bead_failed", "verified, but closing the bead failed: " + error)
        return "success"

    def bead_create(self, task, result):
        bead = result["bead"]
        if not self.beads.argv:
            bead["skipped"] = self.beads.skip_reason
            return
        existing = bead_id_from_meta(self.handoff, task["id"])
        if existing:  # a retry or an approved task keeps its bead
            bead.update(id=existing, raw_output=self.read_meta(task["id"] + ".bead"), reused=True)
            return
        bead_id, raw, error = self.beads.create(task["bead_title"])
        self.write_redacted(self.handoff.path("meta", task["id"] + ".bead"), raw)
        bead.update(id=bead_id, raw_output=self.redact(raw), error=error)
        if error:
            raise Stop("failed", "bead_failed", error)

    def read_meta(self, name):
        try:
            with open(self.handoff.path("meta", name), encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def audit_into(self, task_id, result, which):
        base = result["git"]["base_commit"]
        patch, stat = self.audit(base)
        path = self.handoff.path("patches", "%s_%s.patch" % (task_id, which))
        result["patch_redacted"][which] = self.write_redacted(path, patch)
        result["artifacts"]["patch_" + which] = self.handoff.rel(path)
        result["git"]["diff_stat_" + which] = stat

    def post_state(self, result):
        snap = self.git_snapshot()
        result["git"].update(head_commit=snap["head"], status_after_verify=snap["status"],
                             dirty_after_verify=snap["dirty"])

    def return_to_base(self, result):
        git_state = result["git"]
        base_branch, branch = git_state.get("base_branch"), git_state.get("branch")
        if not self.config.get("return_to_base", True) or branch == base_branch:
            return
        target = base_branch or git_state.get("base_commit")
        args = ("checkout", "-q", target) if base_branch else ("checkout", "-q", "--detach", target)
        back = self.git.run(*args, check=False)
        git_state["returned_to_base"] = back.ok
        if not back.ok:
            raise Stop("failed", "internal_error", "could not return to %s: %s" % (
                target, back.stderr.strip()[-300:]))

    def after_failure(self, task, result):
        """Bead blocked; with continue_on_failure park the work as a WIP commit and go back."""
        bead_id = result["bead"].get("id")
        if bead_id and result["reason"] != "bead_failed":
            error = self.beads.block(bead_id, "%s: %s" % (result["reason"], result["detail"])[:500])
            if error:
                result["bead"]["error"] = error
        if result["status"] == "blocked":
            return
        git_state = result["git"]
        if result.get("executor") is None and git_state.get("branch_created"):
            # Failed before the agent ran (e.g. bead_failed): nothing to inspect, so
            # leave no trace in git: back to base and the empty branch removed.
            try:
                self.return_to_base(result)
                if git_state.get("returned_to_base"):
                    self.git.run("branch", "-d", git_state["branch"], check=False)
                    git_state["branch_created"] = False
            except (BridgeError, Stop) as exc:
                result["detail"] += "; and returning to base failed: %s" % exc
            return
        if not self.continue_on_failure or git_state.get("branch") is None:
            return
        try:
            dirty = self.git_snapshot()["dirty"]
            if git_state.get("branch") != git_state.get("base_branch") or dirty:
                if dirty:
                    git_state["wip_commit"] = self.commit_all(
                        "WIP(bridge): %s FAILED (%s) - NOT verified, kept for inspection\n\n%s\n" % (
                            task["id"], result["reason"], result["detail"][:500]))
                self.return_to_base(result)
        except (BridgeError, Stop) as exc:
            result["detail"] += "; and parking the work failed: %s" % exc


# ---- queue commands (init, submit, status, approve, unlock) ----------------------

def submit_task(root, source, retry=False):
    """Validate a task file (or '-' for stdin) and enqueue it atomically. Returns its id."""
    handoff = Handoff(root)
    handoff.require()
    if source == "-":
        raw = sys.stdin.buffer.read(TASK_MAX_BYTES + 1)
        try:
            task = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise BridgeError("stdin: not a UTF-8 JSON task: %s" % exc)
        errors = validate_task(task)
    else:
        try:
            task = read_task_file(source, check_stem=False, fresh_sec=0)
            errors = []
        except TaskFileError as exc:
            task, errors = exc.raw, exc.errors
    if errors:
        raise BridgeError("task %s refused, %d error(s):\n  %s" % (
            source, len(errors), "\n  ".join(errors)))
    task_id = task["id"]
    for state in ("tasks", "running", "pending"):
        if os.path.lexists(handoff.path(state, task_id + ".json")):
            raise BridgeError("task %s is already in %s/" % (task_id, state), EXIT_FAILED)
    previous = read_result(handoff, task_id)
    if os.path.exists(handoff.path("results", task_id + ".json")):
        if not retry:
            raise BridgeError("task %s already has a result (%s, %s); use `submit --retry` to run "
                              "it again as the next attempt" % (
                                  task_id, (previous or {}).get("status"), (previous or {}).get("reason")),
                              EXIT_FAILED)
        last = (previous or {}).get("attempt")
        task = dict(task)
        task["attempt"] = max(task.get("attempt", 1), (last if isinstance(last, int) else 0) + 1)
        policy = dict(task.get("retry_policy") or {"max_attempts": 1})
        policy["max_attempts"] = max(policy.get("max_attempts", 1), task["attempt"])
        task["retry_policy"] = policy
        archive_result(handoff, task_id, "manual retry as attempt %d" % task["attempt"])
    atomic_write_json(handoff.path("tasks", task_id + ".json"), task)
    return task_id, task.get("attempt", 1)


def approve_task(root, task_id):
    """Release a task from pending/: archive its gate result, mark it approved, re-queue."""
    handoff = Handoff(root)
    handoff.require()
    safe_name(task_id, "task id")
    pending = handoff.path("pending", task_id + ".json")
    if not os.path.lexists(pending):
        where = [s for s in ("tasks", "running", "failed") if os.path.lexists(handoff.path(s, task_id + ".json"))]
        raise BridgeError("task %s is not waiting in pending/%s" % (
            task_id, " (it is in %s/)" % where[0] if where else ""), EXIT_FAILED)
    try:
        task = read_task_file(pending, fresh_sec=0)
    except TaskFileError as exc:
        raise BridgeError("pending/%s.json is not a valid task: %s" % (task_id, "; ".join(exc.errors)))
    task["approved_at"] = now_iso()
    # Order matters for crashes: history first, then the gate result goes, then the
    # task appears in tasks/, then it leaves pending/.
    archive_result(handoff, task_id, "approved at %s" % task["approved_at"])
    atomic_write_json(handoff.path("tasks", task_id + ".json"), task)
    os.unlink(pending)
    return task


def queue_status(root, recent=5):
    handoff = Handoff(root)
    handoff.require()
    counts = {state: len(list_task_files(handoff.dir(state)))
              for state in ("tasks", "running", "pending", "failed")}
    by_status, failures = {}, []
    for name in list_task_files(handoff.dir("results")):
        path = handoff.path("results", name)
        try:
            record = read_json_file(path, "result")
        except BridgeError as exc:
            failures.append({"id": name[:-5], "reason": "unreadable result", "detail": exc.message,
                             "mtime": 0})
            continue
        if not isinstance(record, dict):
            continue
        status = record.get("status") or "?"
        by_status[status] = by_status.get(status, 0) + 1
        if record.get("exit_path") in ("failed", "blocked", "skipped"):
            failures.append({"id": record.get("id"), "status": status,
                             "exit_path": record.get("exit_path"), "reason": record.get("reason"),
                             "detail": record.get("detail"), "timestamp": record.get("timestamp"),
                             "mtime": os.stat(path).st_mtime})
    failures.sort(key=lambda item: item.pop("mtime"), reverse=True)
    state, meta = FileLock.probe(handoff.path("locks", WORKER_LOCK))
    worker = None
    if state == "held" or (state == "unknown" and meta and not meta.get("released_at")):
        worker = {k: meta.get(k) for k in ("pid", "host", "created_at", "heartbeat_at")} if meta else {}
    return {"queued": counts["tasks"], "running": counts["running"], "pending": counts["pending"],
            "failed": counts["failed"], "results": by_status, "worker": worker,
            "recent_failures": failures[:recent]}


def unlock_worker(root, force=False):
    """Clear the worker lock when provably stale (or forced). Returns a message."""
    handoff = Handoff(root)
    path = handoff.path("locks", WORKER_LOCK)
    state, meta = FileLock.probe(path)
    if state == "free" and (not meta or meta.get("released_at")):
        return "no worker lock is held%s" % (
            " (last released by %s)" % describe_holder(meta) if meta else "")
    who = describe_holder(meta)
    if state == "held" or (state == "unknown" and not holder_is_dead(meta)):
        if not force:
            raise BridgeError("the worker lock is held by %s, which %s; not clearing it "
                              "(--force to clear anyway)" % (
                                  who, "is alive" if state == "held" else "is not provably dead"),
                              EXIT_LOCKED)
        os.unlink(path)
        return "forced: removed the worker lock of %s (if it still runs, two watchers may now " \
               "run at once)" % who
    lock = FileLock(path)
    if not lock.acquire():
        raise BridgeError("the worker lock was just taken by %s" % describe_holder(lock.holder),
                          EXIT_LOCKED)
    lock.release()
    return "cleared the stale worker lock of %s (%s)" % (
        who, "its process no longer runs" if holder_is_dead(meta) else "nobody holds it")


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
    add_command(subparsers, "init", cmd_init,
                "create .ai-handoff/ and make git ignore it locally",
                "python3 scripts/bridge.py init            # in the repository")
    parser = add_command(subparsers, "submit", cmd_submit,
                         "validate a task and queue it atomically in .ai-handoff/tasks/",
                         "python3 scripts/bridge.py submit task.json\n"
                         "python3 scripts/bridge.py submit --retry .ai-handoff/failed/ID.json")
    parser.add_argument("task", metavar="TASK.json", help="the task file ('-' reads stdin)")
    parser.add_argument("--retry", action="store_true",
                        help="the task already has a result: archive it and queue the next attempt")
    parser = add_command(subparsers, "watch", cmd_watch,
                         "run the watcher: take queued tasks through the Bridge Protocol",
                         "python3 scripts/bridge.py watch --once     # process the queue, then exit\n"
                         "python3 scripts/bridge.py watch --poll 2   # keep watching")
    parser.add_argument("--once", action="store_true", help="process what is queued, then exit")
    parser.add_argument("--poll", type=float, metavar="SECONDS",
                        help="polling interval when idle (default: poll_sec, 1 s)")
    parser = add_command(subparsers, "status", cmd_status,
                         "counts per state and the most recent failures with their reasons",
                         "python3 scripts/bridge.py status --json")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser = add_command(subparsers, "approve", cmd_approve,
                         "release a task waiting in pending/ so the next watcher run executes it",
                         "python3 scripts/bridge.py approve 2026-11-22_01_add-greeting")
    parser.add_argument("id", help="the task id")
    parser = add_command(subparsers, "unlock", cmd_unlock,
                         "clear the worker lock when it is provably stale (or --force)",
                         "python3 scripts/bridge.py unlock")
    parser.add_argument("--force", action="store_true",
                        help="clear it even when its holder may still run (dangerous)")


def cmd_init(args):
    root = find_root(args.root)
    for line in handoff_init(root) or ["%s/ already set up" % HANDOFF_DIR]:
        print(line)
    return EXIT_OK


def cmd_submit(args):
    root, _config = load_args_config(args)
    task_id, attempt = submit_task(root, args.task, retry=args.retry)
    print("queued %s (attempt %s) in %s/tasks/" % (task_id, attempt, HANDOFF_DIR))
    return EXIT_OK


def cmd_watch(args):
    root, config = load_args_config(args)
    watcher = Watcher(root, config, poll=args.poll, once=args.once)
    return watcher.run()


def cmd_status(args):
    root, _config = load_args_config(args)
    report = queue_status(root)
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return EXIT_OK
    print("queued %(queued)d  running %(running)d  pending %(pending)d  failed/ %(failed)d" % report)
    print("results: " + (", ".join("%s %d" % item for item in sorted(report["results"].items()))
                         or "none"))
    worker = report["worker"]
    print("watcher: " + ("running, %s" % describe_holder(worker) if worker else "not running"))
    if report["recent_failures"]:
        print("recent failures:")
        for item in report["recent_failures"]:
            print("  %s  %s/%s  %s" % (item.get("id"), item.get("exit_path"), item.get("reason"),
                                       (item.get("detail") or "")[:160]))
    return EXIT_OK


def cmd_approve(args):
    root, _config = load_args_config(args)
    task = approve_task(root, args.id)
    print("approved %s at %s; the next `bridge.py watch` runs it" % (task["id"], task["approved_at"]))
    return EXIT_OK


def cmd_unlock(args):
    root, _config = load_args_config(args)
    print(unlock_worker(root, force=args.force))
    return EXIT_OK
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
