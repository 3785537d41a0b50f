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
    "relay": {
        "queue_file": "captain_to_vice_captain.yaml",   # or captain_queue.yaml (newer repos)
        "nudge": True,                 # wake the vice captain after `down`
        "nudge_command": None,         # argv list or string, e.g. "bash scripts/inbox_write.sh";
                                       # gets TARGET CONTENT cmd_new CAPTAIN_ID; None = native
        "nudge_target": "vice_captain",  # "@cluster_captain": captain: of clusters/<s>/config.yaml
        "nudge_timeout_sec": 30.0,
        "lock_timeout_sec": 5.0,       # flock -w 5
        "lock_attempts": 3,
        "lock_retry_sleep_sec": 1.0,
    },
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
#
# A captain hands commands down to the tmux work layer through a YAML queue
# (`queue/captain_to_vice_captain.yaml`) that PyYAML readers, `grep`-based
# hooks (`source: agent_teams`, `id: cmd_[0-9]+`, `read: false`) and LLM
# agents editing by hand all share. bridge.py has no YAML library and never
# rebuilds that file from a model: it reads the few facts it needs from the
# text (the layout of the command list, the highest id, one entry's fields)
# and splices a new block-style entry in after the last one, in the layout
# the file already uses. Everything else - comments, key order, quoting
# styles, other keys - stays byte for byte. A file whose top level it cannot
# follow is refused with the line named, and left untouched.

RELAY_DEFAULT_CRITERIA = "No acceptance criteria provided"
RELAY_PRIORITIES = ("high", "medium", "low")
RELAY_NO_RELAY_STATUSES = ("pending", "in_progress", "reassigned")
RELAY_NUDGE_TEXT = "新規指令 {cmd_id} を受信。処理されたし。"

# YAML 1.1 words PyYAML resolves to bool or null when they are plain.
_YAML_SPECIAL_WORDS = frozenset(
    "y Y yes Yes YES n N no No NO true True TRUE false False FALSE "
    "on On ON off Off OFF null Null NULL ~".split())
# A conservative plain scalar: no indicator first, none of the characters
# that end or change a plain scalar, no first character that any PyYAML
# implicit resolver (int, float, timestamp, merge, value, null) keys on.
_YAML_PLAIN_OK = None        # compiled lazily (see _yaml_plain_re)


def _yaml_plain_re():
    global _YAML_PLAIN_OK
    if _YAML_PLAIN_OK is None:
        # Non-ASCII is allowed except what PyYAML treats as a line break or
        # space (U+0085, U+2028, U+2029), the BOM, and non-printables.
        other = "\u00a0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff"
        first = "A-Za-z_/(" + other
        rest = "\\-A-Za-z0-9_./()+=$^~<>;!?%@*&'\"" + other
        _YAML_PLAIN_OK = re.compile(
            "[%s](?:[%s ]*[%s])?\\Z" % (first, rest, rest))
    return _YAML_PLAIN_OK


def yaml_quote_double(text):
    """Return `text` as a one-line double-quoted YAML scalar.

    Uses only escapes that YAML 1.1 (PyYAML) and 1.2 both read; characters
    PyYAML's reader rejects or folds (C0/C1 controls, DEL, U+2028/9, BOM,
    U+FFFE/F) are escaped; everything else, astral characters included, is
    written raw so a reader never sees surrogate pairs.
    """
    out = ['"']
    for ch in text:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif o < 0x20 or 0x7f <= o <= 0x9f:
            out.append("\\x%02x" % o)
        elif o in (0x2028, 0x2029, 0xfeff, 0xfffe, 0xffff):
            out.append("\\u%04x" % o)
        elif 0xd800 <= o <= 0xdfff:
            raise BridgeError("text contains a lone surrogate (U+%04X); "
                              "it is not valid UTF-8" % o, EXIT_USAGE)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _yaml_is_printable(text):
    """True when every character may appear raw in a PyYAML-read file and
    none of them is a line break other than \\n (tabs are allowed)."""
    for ch in text:
        o = ord(ch)
        if o < 0x20 and ch not in "\n\t":
            return False
        if 0x7f <= o <= 0x9f or o in (0x2028, 0x2029, 0xfeff, 0xfffe, 0xffff) \
                or 0xd800 <= o <= 0xdfff:
            return False
    return True


def yaml_scalar_lines(text, indent):
    """Render string `text` as the value of a block-map key.

    Returns (head, extra_lines): `head` goes after `key: ` on the key's line,
    `extra_lines` (for literal blocks) are the following lines, already
    indented by `indent` spaces. The choice, most readable first:
    plain when the text cannot be mistaken for anything else, a literal
    block `|` for multi-line text, single quotes when printable, else
    double quotes with escapes. PyYAML safe_load returns `text` exactly.
    """
    if not isinstance(text, str):
        raise TypeError("yaml_scalar_lines wants str")
    if "\n" not in text:
        if text not in _YAML_SPECIAL_WORDS and _yaml_plain_re().match(text) \
                and ": " not in text and " #" not in text:
            return text, []
        if _yaml_is_printable(text) and "\t" not in text:
            return "'" + text.replace("'", "''") + "'", []
        return yaml_quote_double(text), []
    lines = text.split("\n")
    literal_ok = _yaml_is_printable(text) and all(
        not ln or ln.strip(" ") for ln in lines[:-1])
    if literal_ok:
        # Chomping: strip (no final newline), clip (one), keep (more).
        if not text.endswith("\n"):
            chomp, body = "-", lines
        elif text.endswith("\n\n"):
            chomp, body = "+", lines[:-1]
        else:
            chomp, body = "", lines[:-1]
        if not any(ln.strip(" \t") for ln in body):
            literal_ok = False
    if not literal_ok:
        return yaml_quote_double(text), []
    # An explicit indentation indicator when the first non-empty line starts
    # with a space (or tab: PyYAML would take it as the indentation's end).
    first = next(ln for ln in body if ln)
    # The indicator counts from the parent node's column, which is
    # indent - 2 for a key (or a dash) at indent - 2.
    indicator = "2" if first[:1] in (" ", "\t") else ""
    pad = " " * indent
    extra = [(pad + ln) if ln else "" for ln in body]
    return "|" + indicator + chomp, extra


def yaml_entry_lines(fields, key_col, first_prefix, list_indent):
    """Render an ordered list of (key, value) as block-map lines.

    `first_prefix` replaces the first line's indentation (e.g. "- " for a list
    item; then key_col counts the dash). Values are str or list of str.
    `list_indent` is the extra indentation of a nested list's dashes
    (0 = PyYAML's indentless style, 2 = indented).
    """
    out = []
    pad = " " * key_col
    for i, (key, value) in enumerate(fields):
        lead = first_prefix if i == 0 else pad
        if isinstance(value, YamlPlain):
            out.append("%s%s: %s" % (lead, key, value))
        elif isinstance(value, list):
            out.append("%s%s:" % (lead, key))
            dash = " " * (key_col + list_indent) + "- "
            for item in value:
                head, extra = yaml_scalar_lines(item, key_col + list_indent + 2)
                out.append(dash + head)
                out.extend(extra)
        else:
            head, extra = yaml_scalar_lines(value, key_col + 2)
            out.append("%s%s: %s" % (lead, key, head))
            out.extend(extra)
    return out


class YamlPlain(str):
    """A value written as-is (for `read: false`, which must stay a boolean)."""


# ---- reading the queue text ---------------------------------------------------

class QueueLayout:
    """Where and how `down` splices a new entry into a queue file's text.

    kind: "list" (block list under `key:`), "map" (block mapping keyed by id
    under `key:`), "toplist" (the whole document is a list, as in the seed's
    section 1.3 example) or "new" (no `key:` yet: one is added at the end).
    Columns are those of the first existing entry, so a new entry looks like
    its neighbours: indentless (PyYAML) or indented lists, 2 or 4 spaces.
    """

    def __init__(self, text, key):
        self.text = text
        self.key = key               # "commands", "queue" or "messages"
        self.kind = "new"
        self.key_line = None         # 1-based line of `key:`
        self.rewrite = None          # (start, end) of a flow-empty value to drop
        self.dash_col = 0            # column of list dashes / id keys
        self.key_col = 2             # column of an entry's keys
        self.nested_indent = 0       # extra indent of a nested list's dashes
        self.region = (len(text), len(text))
        self.insert_at = len(text)
        # The text behind one "\n", so regexes can start with a literal "\n"
        # (which the re module searches for fast) instead of a slow ^ anchor;
        # offset p in `text` is the "\n" before that line in `scan`.
        self.scan = None             # "\n" + text, set by relay_layout


def _line_no(text, offset):
    return text.count("\n", 0, offset) + 1


def _line_at(text, offset):
    end = text.find("\n", offset)
    return text[offset:len(text) if end < 0 else end]


def _refuse(path, text, offset, why):
    raise BridgeError("%s line %d: %s; the file was not changed" % (
        path, _line_no(text, offset), why), EXIT_FAILED)


def relay_decode(path, raw):
    """Bytes of a queue file -> (bom, text), refusing what a splice cannot keep intact."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BridgeError("%s line %d: not valid UTF-8 (byte offset %d); the file was not "
                          "changed" % (path, raw.count(b"\n", 0, exc.start) + 1, exc.start),
                          EXIT_FAILED)
    bom = ""
    if text.startswith("\ufeff"):
        bom, text = "\ufeff", text[1:]
    cr = text.find("\r")
    if cr >= 0:
        _refuse(path, text, cr, "carriage return (CRLF line endings are not supported; "
                                "convert the file to LF)")
    return bom, text


def _strip_comment(value):
    """A one-line value without its trailing comment (only ` #` starts one)."""
    if value.startswith("#"):
        return ""
    cut = value.find(" #")
    return (value[:cut] if cut >= 0 else value).strip()


# A simple block-mapping key followed by `:` and a space or the line's end.
_YAML_KEY = (r"(?:[^\s\-?:,\[\]{}#&*!|>'\"%@`][^\n]*?|-[^\s][^\n]*?"
             r"|\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\n]|'')*')[ \t]*:(?=[ \t]|$)")


def _key_name(line):
    """The key of a `key: ...` line (quotes removed)."""
    name = re.match(r"[ ]*(?:-[ ]+)?(" + _YAML_KEY + ")", line).group(1)
    name = name[:name.rfind(":")].rstrip(" \t")
    if name[:1] == "'":
        return name[1:-1].replace("''", "'")
    if name[:1] == '"':
        return name[1:-1]
    return name


def relay_layout(path, text, keys):
    """Find the list (or id-keyed mapping) under the first of `keys` present.

    Looks only at the lines that start in column 0 and are not list items (a
    handful in any real queue) and at the first entry, so the cost does not
    grow with the number of entries. Raises BridgeError (exit 1) naming the
    line when the top level is not a block mapping or list it can follow.
    """
    key_re = re.compile(_YAML_KEY + r"[ \t]*(.*)\Z")
    found = {}                     # key -> (line offset, value offset)
    tops = []                      # offsets of the top-level non-item lines
    scan = "\n" + text
    for match in re.finditer(r"\n((?:[^ \n#\-]|-[^ \n])[^\n]*)", scan):
        line, offset = match.group(1), match.start()
        if line.rstrip() == "---" or line.startswith("--- "):
            if re.search(r"^[^#\s]", text[:offset], re.M):
                _refuse(path, text, offset, "a second YAML document (---) is not supported")
            continue
        km = key_re.match(line)
        if km is None:
            _refuse(path, text, offset, "not a `key:` line or list item at the top level "
                                        "(flow style, tab indentation, a bare scalar or a "
                                        "directive are not supported)")
        tops.append(offset)
        name = _key_name(line)
        if name in keys:
            if name in found:
                _refuse(path, text, offset, "`%s:` appears twice" % name)
            found[name] = (offset, offset + km.start(1))
    key = next((k for k in keys if k in found), None)
    layout = QueueLayout(text, key or keys[0])
    layout.scan = scan
    if key is None:
        first_item = re.search(r"^-(?:[ \n]|\Z)", text, re.M)
        if first_item is not None:
            if tops:
                _refuse(path, text, max(tops[0], first_item.start()),
                        "a top-level list mixed with mapping keys")
            layout.kind = "toplist"
            layout.region = (first_item.start(), len(text))
            _relay_list_columns(path, text, layout, first_item.start())
            _relay_insert_point(layout)
        return layout
    line_at, value_at = found[key]
    layout.key_line = _line_no(text, line_at)
    eol = text.find("\n", line_at)
    eol = len(text) if eol < 0 else eol
    value = _strip_comment(text[value_at:eol])
    later = [t for t in tops if t > line_at]
    layout.region = (min(eol + 1, len(text)), later[0] if later else len(text))
    body = re.compile(r"^(?![ \t]*(?:#|$))", re.M).search(text, *layout.region)
    body_at = None if body is None else body.start()
    if value in ("[]", "{}", "null", "Null", "NULL", "~"):
        if body_at is not None:
            _refuse(path, text, body_at, "`%s: %s` followed by more content" % (key, value))
        layout.rewrite = (value_at, value_at + len(text[value_at:eol]) -
                          len(text[value_at:eol].lstrip(" \t")) + len(value))
        layout.kind = "map" if value == "{}" else "list"
    elif value:
        _refuse(path, text, line_at, "`%s:` holds %r; only a block list or a block mapping "
                                     "can be appended to (flow style, anchors, tags and "
                                     "scalars are not supported)" % (key, value[:40]))
    elif body_at is None:
        layout.kind = "list"
    else:
        line = _line_at(text, body_at)
        stripped = line.lstrip(" ")
        if line[:1] == "\t" or stripped[:1] == "\t":
            _refuse(path, text, body_at, "tab indentation")
        if stripped[:1] == "-" and stripped[1:2] in (" ", ""):
            layout.kind = "list"
            _relay_list_columns(path, text, layout, body_at)
        elif stripped is not line and len(stripped) < len(line) and re.match(_YAML_KEY, stripped):
            layout.kind = "map"
            layout.dash_col = len(line) - len(stripped)
            inner = re.compile(r"^( *)\S", re.M).search(text, body_at + len(line) + 1,
                                                         layout.region[1])
            col = len(inner.group(1)) if inner else 0
            layout.key_col = col if col > layout.dash_col else layout.dash_col + 2
        else:
            _refuse(path, text, body_at, "the value of `%s:` is neither a block list nor a "
                                         "block mapping" % key)
    if body_at is None and layout.kind == "map":
        layout.dash_col, layout.key_col = 2, 4
    _relay_insert_point(layout)
    return layout


def _relay_list_columns(path, text, layout, item_at):
    """Columns of a block list from its first item (`- key: value` or `-` alone)."""
    line = _line_at(text, item_at)
    m = re.match(r"( *)-(?:( +)(\S.*))?[ \t]*\Z", line)
    layout.dash_col = len(m.group(1))
    if m.group(3):
        if not re.match(_YAML_KEY, m.group(3)):
            _refuse(path, text, item_at, "list entries are not mappings (`- key: value`)")
        layout.key_col = layout.dash_col + 1 + len(m.group(2))
    else:
        nxt = re.compile(r"^( *)\S", re.M).search(text, item_at + len(line) + 1)
        col = len(nxt.group(1)) if nxt else 0
        layout.key_col = col if col > layout.dash_col else layout.dash_col + 2
    # How the first entry indents a nested list (PyYAML: not at all).
    sample = text[item_at:item_at + 4000]
    nested = re.search(r"^( +)[^\s#:][^:\n]*:[ \t]*\n( *)- ", sample, re.M)
    if nested is not None and len(nested.group(2)) >= len(nested.group(1)):
        layout.nested_indent = len(nested.group(2)) - len(nested.group(1))
    else:
        layout.nested_indent = 0 if layout.dash_col == layout.key_col - 2 and \
            layout.key_col == 2 else 2


def _relay_insert_point(layout):
    """After the region's last content line, before trailing column-0 comments.

    Blank lines right after the last entry stay with it (they may be the kept
    newlines of a `|+` block); comments that follow them stay after the new
    entry, so a footer comment remains the footer.
    """
    text = layout.text
    start, end = layout.region
    pos = end
    while pos > start:
        prev = text.rfind("\n", start, pos - 1) + 1
        prev = max(prev, start)
        line = text[prev:pos].rstrip("\n")
        if line.strip(" ") == "" or line.startswith("#"):
            pos = prev
            continue
        break
    # keep blank lines that directly follow the content
    while pos < end:
        nl = text.find("\n", pos, end)
        line = text[pos:end if nl < 0 else nl]
        if line.strip(" ") != "" or nl < 0:
            break
        pos = nl + 1
    layout.insert_at = pos


def relay_max_id(layout):
    """The highest numeric `cmd_N` id of the entries, by one regex over the region.

    Only ids at an entry's own key column count (a `cmd_999` inside a message's
    text block is indented further and is ignored); ids such as `cmd_T10_x`
    are not numeric and are skipped, as the original script skips them.
    """
    d, k = layout.dash_col, layout.key_col
    tail = r"[ \t]*(?:[ \t]#[^\n]*)?(?=\n|\Z)"
    value = r"id:[ \t]*(['\"]?)cmd_(\d+)\1" + tail
    if layout.kind == "map":
        pattern = (r"\n(?: {%d}(['\"]?)cmd_(\d+)\1[ \t]*:(?=[ \t\n]|\Z)|"
                   r" {%d}id:[ \t]*(['\"]?)cmd_(\d+)\3%s)" % (d, k, tail))
    else:
        pattern = r"\n(?: {%d}-[ ]+| {%d,%d})" % (d, d + 1, k) + value
    best = 0
    start, end = layout.region
    for m in re.compile(pattern).finditer(layout.scan, start, end):
        digits = m.group(2) if layout.kind != "map" else (m.group(2) or m.group(4))
        best = max(best, int(digits))
    return best


def relay_splice(layout, entry_lines):
    """The new file text: the entry appended at the layout's insertion point."""
    text = layout.text
    block = "\n".join(entry_lines) + "\n"
    at = layout.insert_at
    if layout.kind == "new":
        head = "" if not text or text.endswith("\n") else "\n"
        return text + head + layout.key + ":\n" + block
    if at > 0 and text[at - 1] != "\n":
        block = "\n" + block
    if layout.rewrite is not None:
        a, b = layout.rewrite
        rest = text[b:at].lstrip(" \t") if text[b:at].lstrip(" \t").startswith("#") else text[b:at]
        sep = " " if rest.startswith("#") else ""
        return text[:a].rstrip(" \t") + sep + rest + block + text[at:]
    return text[:at] + block + text[at:]


def relay_splice_bytes(layout, raw, bom, entry_lines):
    """relay_splice as bytes: the original bytes around the entry are copied,
    not re-encoded, so a large queue costs one copy (the tail after the
    insertion point, usually empty, is the only text encoded)."""
    text, at = layout.text, layout.insert_at
    if raw is None or layout.kind == "new" or layout.rewrite is not None:
        return (bom + relay_splice(layout, entry_lines)).encode("utf-8")
    block = "\n".join(entry_lines) + "\n"
    if at > 0 and text[at - 1] != "\n":
        block = "\n" + block
    cut = len(raw) - len(text[at:].encode("utf-8"))
    return raw[:cut] + block.encode("utf-8") + raw[cut:]


def relay_entry_text(layout, cmd_id, fields):
    """Block lines for one entry in the layout's style (`fields`: ordered pairs)."""
    d, k = layout.dash_col, layout.key_col
    if layout.kind == "map":
        return [" " * d + cmd_id + ":"] + yaml_entry_lines(
            fields, k, " " * k, layout.nested_indent)
    if layout.kind == "new":
        d, k = 0, 2
    prefix = " " * d + "-" + " " * (k - d - 1)
    return yaml_entry_lines(fields, k, prefix, layout.nested_indent)


# ---- reading one entry (for `up`) ---------------------------------------------

def _yaml_unquote(value):
    """A one-line scalar's text: plain (comment dropped), 'single' or "double"."""
    value = value.strip()
    if value[:1] == "'" and value.endswith("'") and len(value) > 1:
        return value[1:-1].replace("''", "'")
    if value[:1] == '"' and value.endswith('"') and len(value) > 1:
        try:
            return json.loads(value)
        except ValueError:
            return value[1:-1]
    return _strip_comment(value)


def relay_find_entry(layout, cmd_id):
    """The top-level fields {key: text} of the (last) entry whose id is cmd_id, or None.

    Values are read for one-line scalars; a block or multi-line value is
    recorded as "" (present, content not needed for the relay decision).
    """
    text = layout.text
    start, end = layout.region
    d, k = layout.dash_col, layout.key_col
    idq = r"(['\"]?)%s\1" % re.escape(cmd_id)
    if layout.kind == "map":
        head = re.compile(r"^ {%d}%s[ \t]*:[ \t]*(?:#[^\n]*)?$" % (d, idq), re.M)
    else:
        head = re.compile(r"^(?: {%d}-[ ]+| {%d,%d})id:[ \t]*%s[ \t]*(?:#[^\n]*)?$"
                          % (d, d + 1, k, idq), re.M)
    hits = list(head.finditer(text, start, end))
    if not hits:
        return None
    at = hits[-1].start()
    if layout.kind == "map":
        entry_start = min(end, text.find("\n", at) + 1 or end)
    else:
        # back to the line with this entry's dash (the id need not be first)
        entry_start = start
        for m in re.compile(r"^ {%d}-(?: |$)" % d, re.M).finditer(text, start, at + d + 2):
            entry_start = m.start()
    # the entry ends at the next line indented no further than its dash / key
    body_from = min(end, text.find("\n", entry_start) + 1 or end)
    stop = re.compile(r"^ {0,%d}\S" % d, re.M).search(text, body_from, end)
    chunk = text[entry_start:stop.start() if stop else end]
    fields = {}
    field = re.compile(r"^(?: {%d}-[ ]+| {%d})(%s)[ \t]*(.*)$" % (d, k, _YAML_KEY), re.M)
    for m in field.finditer(chunk):
        name = _key_name(m.group(1))
        raw = m.group(2)
        fields.setdefault(name, "" if raw[:1] in ("|", ">") else _yaml_unquote(raw))
    return fields


# ---- logging, locking, paths ----------------------------------------------------

class RelayLog:
    """The seed's log: `[YYYY-MM-DDTHH:MM:SS] [bridge_relay/DIR] MESSAGE`.

    Each line goes to logs/bridge/<captain_id>_<YYYYMMDD>.log (one append) and
    to stderr, like the script's `tee -a`. Lines are redacted first.
    """

    def __init__(self, root, captain_id, direction, config=None):
        self.path = os.path.join(root, "logs", "bridge", "%s_%s.log" % (
            captain_id, time.strftime("%Y%m%d")))
        self.direction = direction
        self.redactor = get_redactor(config)

    def __call__(self, message):
        line = "[%s] [bridge_relay/%s] %s\n" % (
            time.strftime("%Y-%m-%dT%H:%M:%S"), self.direction,
            self.redactor.redact(message))
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        try:
            append_text(self.path, line)
        except OSError as exc:
            warn("cannot write relay log %s: %s" % (self.path, exc.strerror or exc))


def relay_lock(lock_path, config, log, what="queue"):
    """flock on `lock_path` like `flock -w 5`: 3 attempts 1 s apart -> fd.

    Logs the seed's `Lock timeout (attempt N/3), retrying...` lines and, when
    every attempt failed, `ERROR: Failed to acquire lock after 3 attempts`
    and raises (exit 1, the script's code).
    """
    timeout = float(config_get(config, "relay.lock_timeout_sec", 5.0))
    attempts = max(1, int(config_get(config, "relay.lock_attempts", 3)))
    pause = float(config_get(config, "relay.lock_retry_sleep_sec", 1.0))
    for attempt in range(1, attempts + 1):
        fd = acquire_flock(lock_path, timeout=timeout)
        if fd is not None:
            return fd
        if attempt < attempts:
            log("Lock timeout (attempt %d/%d), retrying..." % (attempt, attempts))
            time.sleep(pause)
    log("ERROR: Failed to acquire lock after %d attempts" % attempts)
    raise BridgeError("could not lock %s (%s) after %d attempts of %gs; another process "
                      "holds it" % (lock_path, what, attempts, timeout), EXIT_FAILED)


def relay_queue_path(root, session, config):
    """clusters/<session>/queue/<file> when that directory exists, else queue/<file>."""
    name = config_get(config, "relay.queue_file", "captain_to_vice_captain.yaml")
    clustered = os.path.join(root, "clusters", session, "queue")
    if os.path.isdir(clustered):
        return os.path.join(clustered, name), True
    plain = os.path.join(root, "queue")
    if not os.path.isdir(plain):
        raise BridgeError("no queue directory: neither %s nor %s exists (run from the "
                          "repository root or pass --root)" % (clustered, plain))
    return os.path.join(plain, name), False


def _relay_read(path):
    """(raw bytes, bom, text) of a queue file; a missing file reads as `commands: []`."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return None, "", ""
    except OSError as exc:
        raise BridgeError("cannot read %s: %s" % (path, exc.strerror or exc), EXIT_FAILED)
    bom, text = relay_decode(path, raw)
    return raw, bom, text


# ---- down ---------------------------------------------------------------------

def relay_purpose(message):
    """The first sentence or line of the message (。！？ end a sentence, and
    . ! ? when followed by a space), as the spec's field mapping says."""
    for line in message.split("\n"):
        line = line.strip()
        if line:
            m = re.search(r"[。！？]|[.!?](?=\s)", line)
            return line[:m.end()] if m else line
    return message.strip()


def relay_criteria(text):
    """Acceptance criteria split on newlines, blank lines dropped."""
    items = [line.strip() for line in (text or "").split("\n")]
    items = [item for item in items if item]
    return items or [RELAY_DEFAULT_CRITERIA]


def _require_text(value, what):
    for ch in value:
        if 0xd800 <= ord(ch) <= 0xdfff:
            raise BridgeError("%s is not valid UTF-8 text (undecodable byte)" % what)
    return value


def relay_down(root, config, captain_id, session, message, project, priority="",
               criteria=""):
    """Append a new cmd to the queue; returns its id. The seed's `down`."""
    log = RelayLog(root, captain_id, "down", config)
    if not message.strip() or not project.strip():
        log("ERROR: down mode requires message_content and project")
        raise BridgeError("down requires a non-empty message and project")
    for value, what in ((message, "message"), (project, "project"), (criteria, "acceptance_criteria")):
        _require_text(value, what)
    priority = priority or "medium"
    if priority not in RELAY_PRIORITIES:
        raise BridgeError("priority must be one of %s, got %r" % (", ".join(RELAY_PRIORITIES), priority))
    queue, clustered = relay_queue_path(root, session, config)
    # Lock the path the shell scripts lock; write where a symlinked queue points.
    fd = relay_lock(queue + ".lock", config, log)
    queue = os.path.realpath(queue)
    try:
        raw, bom, text = _relay_read(queue)
        try:
            layout = relay_layout(queue, text, ("commands", "queue"))
        except BridgeError as exc:
            log("ERROR: " + exc.message)
            raise
        cmd_id = "cmd_%03d" % (relay_max_id(layout) + 1)
        fields = [
            ("id", cmd_id),
            ("timestamp", time.strftime("%Y-%m-%dT%H:%M:%S")),
            ("purpose", relay_purpose(message)),
            ("acceptance_criteria", relay_criteria(criteria)),
            ("command", message),
            ("project", project),
            ("priority", priority),
            ("status", "pending"),
            ("source", "agent_teams"),
        ]
        new = relay_splice_bytes(layout, raw, bom, relay_entry_text(layout, cmd_id, fields))
        try:
            atomic_write(queue, new)
        except OSError as exc:
            log("ERROR: cannot write %s: %s" % (queue, exc.strerror or exc))
            raise BridgeError("cannot write %s: %s" % (queue, exc.strerror or exc), EXIT_FAILED)
    finally:
        release_flock(fd)
    relay_nudge(root, config, log, captain_id, session if clustered else "", cmd_id, session)
    log("DOWN SUCCESS: %s created (project=%s, priority=%s)" % (cmd_id, project, priority))
    return cmd_id


# ---- the nudge ------------------------------------------------------------------

def relay_nudge_target(root, config, log, captain_id, session):
    """relay.nudge_target, or with "@cluster_captain" (the newer script) the
    `captain:` of clusters/<session>/config.yaml, falling back to captain_id."""
    target = config_get(config, "relay.nudge_target", "vice_captain")
    if target != "@cluster_captain":
        return target
    cfg = os.path.join(root, "clusters", session, "config.yaml")
    try:
        with open(cfg, encoding="utf-8") as handle:
            m = re.search(r"^captain:[ \t]*(['\"]?)([A-Za-z0-9._-]+)\1[ \t]*(?:#.*)?$",
                          handle.read(), re.M)
    except (OSError, UnicodeDecodeError):
        m = None
    if m is None:
        log("WARNING: captain not found in %s — falling back to '%s'" % (cfg, captain_id))
        return captain_id
    return m.group(2)


def relay_nudge(root, config, log, captain_id, cluster_id, cmd_id, session=""):
    """Wake the vice captain; a failure is a WARN line, never an error (seed 3.2)."""
    if not config_get(config, "relay.nudge", True):
        return
    target = relay_nudge_target(root, config, log, captain_id, session)
    content = RELAY_NUDGE_TEXT.format(cmd_id=cmd_id)
    command = config_get(config, "relay.nudge_command")
    try:
        if command:
            import shlex
            argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
            env = dict(os.environ)
            if cluster_id:
                env["CLUSTER_ID"] = cluster_id
            result = run_command(argv + [target, content, "cmd_new", captain_id], cwd=root,
                                 env=env, timeout=float(config_get(
                                     config, "relay.nudge_timeout_sec", 30)))
            if not result.ok:
                tail = (result.stderr or result.stdout or "").strip().splitlines()[-1:]
                log("WARN: inbox nudge failed (%s)%s; %s is queued, the vice captain's "
                    "self-watch will pick it up" % (
                        result.describe(), ": " + tail[0] if tail else "", cmd_id))
            return
        safe_name(target, "relay.nudge_target")
        inbox_write(root, config, log, target, content, "cmd_new", captain_id)
    except (BridgeError, OSError) as exc:
        log("WARN: inbox nudge failed: %s; %s is queued, the vice captain's self-watch "
            "will pick it up" % (getattr(exc, "message", None) or exc, cmd_id))


def inbox_write(root, config, log, target, content, msg_type, sender):
    """Append a message to queue/inbox/<target>.yaml as inbox_write.sh does.

    Same file, same `<inbox>.lock` flock discipline, same message shape with
    keys in PyYAML's sorted order (content, from, id, read, timestamp, type);
    existing messages are kept byte for byte (bridge.py never trims an inbox).
    """
    inbox_dir = os.path.join(root, "queue", "inbox")
    os.makedirs(inbox_dir, exist_ok=True)
    path = os.path.join(inbox_dir, target + ".yaml")
    fd = relay_lock(path + ".lock", config, log, "inbox")
    path = os.path.realpath(path)
    try:
        raw, bom, text = _relay_read(path)
        layout = relay_layout(path, text, ("messages",))
        msg_id = "msg_%s_%s" % (time.strftime("%Y%m%d_%H%M%S"), random_hex(4))
        fields = [("content", content), ("from", sender), ("id", msg_id),
                  ("read", YamlPlain("false")),
                  ("timestamp", time.strftime("%Y-%m-%dT%H:%M:%S")), ("type", msg_type)]
        atomic_write(path, relay_splice_bytes(layout, raw, bom,
                                              relay_entry_text(layout, msg_id, fields)))
    finally:
        release_flock(fd)
    log("NUDGE: %s → %s (type=%s) %s" % (sender, target, msg_type, msg_id))


# ---- up -------------------------------------------------------------------------

def relay_up(root, config, captain_id, session, cmd_id, status, summary, force=False):
    """The report line for Agent Teams, or None when the seed says not to relay."""
    log = RelayLog(root, captain_id, "up", config)
    if not cmd_id.strip() or not status.strip() or not summary.strip():
        log("ERROR: up mode requires cmd_id, status, and summary")
        raise BridgeError("up requires a non-empty cmd_id, status and summary")
    for value, what in ((cmd_id, "cmd_id"), (status, "status"), (summary, "summary")):
        _require_text(value, what)
    queue, _clustered = relay_queue_path(root, session, config)
    raw, _bom, text = _relay_read(queue)
    if raw is None:
        raise BridgeError("%s does not exist, so %s is unknown" % (queue, cmd_id), EXIT_FAILED)
    layout = relay_layout(queue, text, ("commands", "queue"))
    entry = relay_find_entry(layout, cmd_id)
    if entry is None:
        log("ERROR: %s not found in %s" % (cmd_id, queue))
        raise BridgeError("%s: no entry with id %s" % (queue, cmd_id), EXIT_FAILED)
    reasons = []
    if entry.get("source") != "agent_teams":
        reasons.append("no source: agent_teams (Lord-originated, internal only)")
    for where, value in (("queue", entry.get("status", "")), ("argument", status)):
        if value in RELAY_NO_RELAY_STATUSES:
            reasons.append("status %s in the %s (%s)" % (
                value, where, "delegated" if value == "reassigned" else "not finished"))
    if entry.get("redo_of", "") not in ("", "null", "~", "Null", "NULL"):
        reasons.append("redo_of %s (reported when the original completes)" % entry["redo_of"])
    report = "%s隊報告: %s [%s] — %s" % (captain_id, cmd_id, status, summary)
    if reasons and not force:
        log("NO RELAY: %s — %s" % (cmd_id, "; ".join(reasons)))
        return None
    if reasons:
        log("FORCED RELAY: %s despite %s" % (cmd_id, "; ".join(reasons)))
    log("UP SUCCESS: %s [%s] — %s" % (cmd_id, status, summary))
    return report


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
    relay = subparsers.add_parser(
        "relay", help="the Agent Teams <-> YAML queue relay (down|up)",
        description="Hand commands down to the YAML work queue and report results up.")
    verbs = relay.add_subparsers(dest="relay_verb", metavar="VERB")
    down = add_command(
        verbs, "down", cmd_relay_down,
        help="append a command to the queue as cmd_NNN and nudge the vice captain",
        example="python3 scripts/bridge.py relay down miho main-cluster \\\n"
                "    \"GuP-v2 の inbox_watcher.sh を改修せよ。\" gup-v2-self-watch high \\\n"
                "    \"self-watch が実装されること\ntestで確認されること\"\n"
                "# a message starting with '-': put -- before the arguments")
    down.add_argument("captain_id")
    down.add_argument("cluster_session")
    down.add_argument("message")
    down.add_argument("project")
    down.add_argument("priority", nargs="?", default="", help="high, medium (default) or low")
    down.add_argument("acceptance_criteria", nargs="?", default="",
                      help="one criterion per line")
    up = add_command(
        verbs, "up", cmd_relay_up,
        help="print the report line for Agent Teams (unless the entry must not be relayed)",
        example="python3 scripts/bridge.py relay up miho main-cluster cmd_049 done \\\n"
                "    \"self-watch 機能実装完了。\"")
    up.add_argument("captain_id")
    up.add_argument("cluster_session")
    up.add_argument("cmd_id")
    up.add_argument("status")
    up.add_argument("summary")
    up.add_argument("--force", action="store_true",
                    help="relay even when a no-relay condition holds")
    relay.set_defaults(func=lambda args: (relay.print_help(sys.stderr), EXIT_USAGE)[1])


def _relay_ids(args):
    for value, what in ((args.captain_id, "captain_id"), (args.cluster_session, "cluster_session")):
        if not value:
            raise BridgeError("%s must not be empty" % what)
        safe_name(value, what)


def cmd_relay_down(args):
    _relay_ids(args)
    root, config = load_args_config(args)
    cmd_id = relay_down(root, config, args.captain_id, args.cluster_session, args.message,
                        args.project, args.priority, args.acceptance_criteria)
    print(cmd_id)
    return EXIT_OK


def cmd_relay_up(args):
    _relay_ids(args)
    root, config = load_args_config(args)
    report = relay_up(root, config, args.captain_id, args.cluster_session, args.cmd_id,
                      args.status, args.summary, force=args.force)
    if report is not None:
        print(report)
    return EXIT_OK
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
