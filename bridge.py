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
  egress emit, inbox drain|ack|commit|check, initiate, alert, feed, wake,
  hooks install|uninstall|doctor
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
error, 3 another process holds the lock; `watch` also exits 4 when its run ended
but a task needs a person (blocked, refused, failed, waiting for approval or
for its dependencies) and
128+N when signal N interrupted a task (re-queued). Errors are one line on
stderr; set BRIDGE_DEBUG=1 to get a traceback instead.

Configuration: defaults < ROOT/bridge.config.json (or --config FILE) < environment
variables < command-line flags. Every key is listed in CONFIG_KEYS below (default,
type, range) and in bridge.config.example.json.

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
# the functions that need them. (json imports re and os imports stat: both are free.)
import json
import os
import re
import stat
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
EXIT_ATTENTION = 4  # watch: the run ended, but a task needs a person (see Watcher.exit_code)


class BridgeError(Exception):
    """An error with a message meant for the user and the exit code to leave with.

    The CLI prints `bridge: error: MESSAGE` and exits with `code`; nothing else in
    bridge.py prints tracebacks unless BRIDGE_DEBUG=1.
    """

    def __init__(self, message, code=EXIT_USAGE):
        super().__init__(message)
        self.message = message
        self.code = code


class Stop(Exception):
    """Ends one unit of work (a watch task, a change set's task) with an outcome that is
    recorded, not a crash: `status` (failed, blocked), `reason` (the code a result records)
    and `detail` (the sentence)."""

    def __init__(self, status, reason, detail):
        super().__init__(detail)
        self.status, self.reason, self.detail = status, reason, detail


def os_error_message(exc):
    """`cannot write PATH: why` for an OSError that names a path (what is left unhandled is
    a write: reads go through read_input), else None. For the CLI's last line."""
    if not getattr(exc, "filename", None):
        return None
    if getattr(exc, "filename2", None):  # a rename: the target's folder refused it
        return "cannot write %s: %s (moving %s)" % (exc.filename2, exc.strerror or exc, exc.filename)
    return "cannot write %s: %s" % (exc.filename, exc.strerror or exc)


def unexpected_error(exc):
    """The CLI's last line of defence, in its `except Exception`: one clear line, no traceback
    (with BRIDGE_DEBUG set, the exception goes on with its traceback); the exit code."""
    if debug_enabled():
        raise
    message = isinstance(exc, OSError) and os_error_message(exc)
    if message:
        warn("error: " + message)
    else:
        warn("internal error: %s: %s (set BRIDGE_DEBUG=1 for a traceback)" % (
            type(exc).__name__, exc))
    return EXIT_FAILED


def debug_enabled():
    return os.environ.get("BRIDGE_DEBUG", "") not in ("", "0", "false")


def check_text(value, what):
    """`value` (None passes) if it is encodable UTF-8 text, else a usage error naming `what`:
    argv bytes that are not UTF-8 arrive as lone surrogates (surrogateescape) and could not be
    written."""
    if value is None:
        return value
    try:
        str(value).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BridgeError("%s is not valid UTF-8 text (undecodable byte or lone surrogate at "
                          "character %d)" % (what, exc.start + 1), EXIT_USAGE)
    return value


def printable(text):
    """`text` with every control character but tab (C0, DEL, C1) spelled `\\xNN`, and a lone
    surrogate (JSON's `\\ud800` has no UTF-8 form: printing it would raise), a line or
    paragraph separator and a bidirectional override (text shown in another order than it
    is) `\\uNNNN`: what another program wrote (a server's stderr, a request header) reaches
    the user's terminal inert, on one line, in its order. (A pattern string that re caches:
    not compiled by every hook's import.)"""
    return re.sub("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069\ud800-\udfff]", lambda m: (
        "\\x%02x" if m.group() <= "\xff" else "\\u%04x") % ord(m.group()), text)


def user_config_file(name):
    """`name` in bridge.py's folder of the user's configuration, outside every repository:
    $XDG_CONFIG_HOME/bridge, else ~/.config/bridge (keys and tokens that agents must not read)."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "bridge", name)


def outside_repository(path, root, what, fix):
    """`path`, or a BridgeError (exit 2) naming it when it is (or resolves to a place) inside
    the repository at `root`, where an agent can read it: keys and tokens live outside."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    if real == top or real.startswith(top.rstrip(os.sep) + os.sep):
        raise BridgeError("%s %s is inside the repository, where an agent can read it: %s"
                          % (what, path, fix), EXIT_USAGE)
    return path


def warn(message):
    """One line on stderr, prefixed so it is clear who is talking. Control characters but
    the newlines of a multi-line message are spelled out: a message may quote a name an agent
    chose, and that must not drive the user's terminal."""
    try:
        sys.stderr.write("bridge: %s\n" % "\n".join(map(printable, str(message).split("\n"))))
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr closed: there is nowhere left to say it


# ---- time and ids -----------------------------------------------------------

def now_iso(ts=None):
    """Local time with its UTC offset, to the second: 2026-11-22T05:30:00+08:00."""
    local = time.localtime(time.time() if ts is None else ts)
    return time.strftime("%Y-%m-%dT%H:%M:%S", local) + utc_offset(local.tm_gmtoff or 0)


def utc_offset(seconds):
    """+HH:MM (or -HH:MM) of an offset from UTC in seconds."""
    return "%s%02d:%02d" % ("-" if seconds < 0 else "+", abs(seconds) // 3600,
                            abs(seconds) % 3600 // 60)


def utc_iso():
    """UTC time now, to the second with a Z suffix: 2026-11-22T05:30:00Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def random_hex(nbytes=4):
    return os.urandom(nbytes).hex()


# ---- files ----------------------------------------------------------------------
#
# Every file bridge.py opens goes through the functions below, named by what they are
# for: read a file another process or an agent may have written, append a record,
# replace state atomically, create once, open a lock. The folders bridge.py works in
# (.ai-handoff/, _bridge/, queue/, changes/) are writable by the agents it serves, so:
#   - a symlink in place of a file is never followed: reading it or locking it is an
#     error naming it, and replacing it replaces the link itself;
#   - opening never blocks: a FIFO, socket or device in place of a file is an error
#     naming it, never a reader (or the watcher, holding its lock) stuck forever;
#   - reads are bounded in size and JSON in nesting depth.
# tests/test_kernel.py walks this file's syntax tree and fails on an open() or os.open()
# outside this section.

INPUT_MAX_BYTES = 64 << 20  # the largest file bridge.py reads whole (task, result, plan...)
JSON_MAX_DEPTH = 256        # nesting no file bridge.py reads needs; far below the recursion limit


def _open_regular(path, flags):
    """os.open(path) that never follows a symlink at `path` and never blocks, and an OSError
    naming `path` unless what it opened is a regular file (one it creates is mode 0644)."""
    import errno
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(exc.errno, "is a symlink (never followed)", path) from None
        if exc.errno == errno.ENXIO:  # O_WRONLY|O_NONBLOCK on a FIFO without a reader
            raise OSError(errno.EINVAL, "not a regular file", path) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fd


def open_input(path):
    """Open for reading (binary) a file another process or an agent may have written.

    Never blocks and never follows a symlink at `path`: a FIFO, socket, device or
    symlink there is an OSError naming it (a missing file is FileNotFoundError)."""
    return os.fdopen(_open_regular(os.fspath(path), os.O_RDONLY), "rb")


_Missing = object()  # read_input's default for `missing`: a missing file is an error


def read_input(path, what="file", limit=INPUT_MAX_BYTES, missing=_Missing):
    """The bytes of a file another process or an agent may have written (open_input's
    rules), at most `limit` of them. Every failure is a BridgeError naming `what` and the
    path; a missing file returns `missing` when it is given."""
    path = os.fspath(path)
    try:
        with open_input(path) as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        if missing is not _Missing:
            return missing
        raise BridgeError("%s %s does not exist" % (what, path))
    except OSError as exc:
        raise BridgeError("cannot read %s %s: %s" % (what, path, exc.strerror or exc))
    if len(data) > limit:
        raise BridgeError("%s %s is larger than %d bytes" % (what, path, limit))
    return data


def read_json_file(path, what="file", missing=_Missing):
    """read_input, decoded as UTF-8 JSON (parse_json's limits): every failure is a
    BridgeError naming the place."""
    raw = read_input(path, what, missing=missing)
    if raw is missing:
        return missing
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BridgeError("%s %s is not UTF-8 (byte %d)" % (what, path, exc.start))
    try:
        return parse_json(text)
    except json.JSONDecodeError as exc:
        raise BridgeError("%s %s: line %d column %d: %s" % (what, path, exc.lineno, exc.colno, exc.msg))
    except ValueError as exc:
        raise BridgeError("%s %s: %s" % (what, path, exc))


def parse_json(data, **hooks):
    """json.loads for input bridge.py did not write (str or bytes): every failure is a
    ValueError, and a document nested deeper than JSON_MAX_DEPTH is one (it would exhaust
    the recursion limit inside the decoder). `hooks` go to json.loads.

    The depth is counted without recursion, in one pass: strings and everything but brackets
    are dropped, and the depth after each bracket is the running sum of +1 for an opening one
    and -1 for a closing one (so brackets never closed count too: the decoder descends into
    each before it finds the text unterminated). Text with fewer opening brackets than the
    limit (every ordinary record) is not scanned at all."""
    b = isinstance(data, bytes)
    if data.count(b"[" if b else "[") + data.count(b"{" if b else "{") > JSON_MAX_DEPTH:
        from itertools import accumulate, count
        from operator import sub
        string, other = (rb'"[^"\\]*(?:\\.[^"\\]*)*"?', rb"[^][{}]+") if b else \
            (r'"[^"\\]*(?:\\.[^"\\]*)*"?', r"[^][{}]+")
        rest = re.sub(other, data[:0], re.sub(string, data[:0], data, flags=re.S))
        steps = (rest if b else rest.encode("ascii")).translate(
            bytes.maketrans(b"[{]}", b"\2\2\0\0"))
        if max(map(sub, accumulate(steps), count(1)), default=0) > JSON_MAX_DEPTH:  # sum(step - 1)
            raise ValueError("JSON nested deeper than %d levels" % JSON_MAX_DEPTH)
    return json.loads(data, **hooks)


def _fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)  # never a FIFO swapped in: no block
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename is still atomic
    finally:
        os.close(fd)


def unlink_quietly(path, dir_fd=None):
    """Remove `path` if it can be: for clean-up that must never fail what it cleans up after."""
    try:
        os.unlink(path, dir_fd=dir_fd)
    except OSError:
        pass


def write_all(fd, data):
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def create_once(path, mode=0o644):
    """Create `path` for writing only when nothing is there (not even a dangling symlink):
    FileExistsError otherwise. Returns the fd; the caller closes it."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)


def write_once(path, data, mode=0o644):
    """Create `path` holding `data`, whole (its data fsynced), or FileExistsError when anything
    is there: a second process, or a reader, never sees it empty or half written (link_once)."""
    if not create_once_within(os.path.dirname(path) or ".", os.path.basename(path), data, mode):
        raise FileExistsError(17, "File exists", path)


def link_once(folder_fd, name, data, mode=0o644):
    """Write `data` to a temporary file in the open folder, fsync it and hard-link it to
    `name`: True, or False when anything is there already (a link never replaces, a rename
    would). Nobody sees the file before it is whole."""
    tmp = ".%s.%s.tmp" % (name[:80], random_hex())
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=folder_fd)
    try:
        try:
            write_all(out, data)
            os.fsync(out)
        finally:
            os.close(out)
        os.link(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        return True
    except FileExistsError:
        return False
    finally:
        unlink_quietly(tmp, dir_fd=folder_fd)


def create_once_within(base, rel, data, mode=0o644):
    """Create the file BASE/REL holding `data` unless anything is there (False then: the first
    write wins), in a tree agents can write to. Each folder below `base` is opened with
    O_NOFOLLOW (made when missing) and the file is written to a temporary name and hard-linked
    into place relative to that open folder: a folder swapped for a symlink at any moment is
    refused at open (an OSError naming it), never written through, and no reader sees half a
    file. (A rename would replace what is there; link never does.)"""
    import errno
    *folders, name = rel.split("/")
    fd, where = os.open(base, os.O_RDONLY | os.O_DIRECTORY), base
    try:
        for part in folders:
            where = os.path.join(where, part)
            try:
                os.mkdir(part, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise OSError(exc.errno, "is a symlink or a file, not a folder (never followed)",
                                  where) from None
                raise
            os.close(fd)
            fd = sub
        return link_once(fd, name, data, mode)
    finally:
        os.close(fd)


def atomic_write(path, data, mode=None, durable=True):
    """Replace `path` with `data` so a reader sees the old file or the new one, never half.

    Writes a temporary file in the same directory, fsyncs it, renames it over the
    target and fsyncs the directory. A symlink at `path` is replaced, not followed.
    The new file keeps the old file's permissions unless `mode` is given.
    durable=False skips both fsyncs: still atomic, but may be lost in a power cut (for caches
    that can be rebuilt, on hot paths where an fsync costs more than the work). durable=a set:
    the file is fsynced and its folder added to the set, for the caller to fsync once for all
    the files it wrote there before the record that names them.
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
    fd = create_once(tmp, 0o666 if mode is None else 0o600)   # never readable by others meanwhile
    try:
        try:
            write_all(fd, data)
            if mode is not None:
                os.fchmod(fd, mode)
            if durable is not False:  # True, or a set (of folders left to sync)
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    if isinstance(durable, set):
        durable.add(directory)
    elif durable:
        _fsync_dir(directory)


def json_compact(obj):
    """One-line UTF-8 JSON, as every JSONL record bridge.py writes."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def atomic_write_json(path, obj):
    atomic_write(path, json.dumps(obj, ensure_ascii=False, indent=2) + "\n")


def make_dirs(path, root, create=True):
    """Create the folder `path` inside `root` and the folders on the way, following no
    symlink below `root`: a symlink or a file where a folder should be is a BridgeError
    naming it, so nothing is ever written through it to a place outside. Returns `path`.
    create=False only checks the folders that exist."""
    root, path = os.path.abspath(os.fspath(root)), os.path.abspath(os.fspath(path))
    if create and not os.path.isdir(root):
        os.makedirs(root, exist_ok=True)  # `root` itself is trusted
    rel = os.path.relpath(path, root)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        raise BridgeError("%s is outside %s" % (path, root))
    current = root
    for part in rel.split(os.sep):
        if part in ("", os.curdir):
            continue
        current = os.path.join(current, part)
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            if not create:
                break
            try:
                os.mkdir(current)
                continue
            except FileExistsError:
                info = os.lstat(current)
        if not stat.S_ISDIR(info.st_mode):
            raise BridgeError("%s is %s, not a folder; refusing to write through it" % (
                current, "a symlink" if stat.S_ISLNK(info.st_mode) else "a file"))
    return path


_SAFE_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def is_safe_name(text):
    """True if `text` is [A-Za-z0-9._-]+ and not . or ..: safe as one path component.

    (A set of characters, not a regex: a hook checks a name or two, and compiling the
    pattern would cost it more than all its checks.)"""
    return (isinstance(text, str) and text not in ("", ".", "..")
            and _SAFE_NAME_CHARS.issuperset(text))


def safe_name(text, what="name"):
    """Return `text` if it is safe as one path component (and an argv word), else raise."""
    if not is_safe_name(text):
        raise BridgeError("%s %r must match [A-Za-z0-9._-]+ and not be . or .." % (what, text))
    return text


# ---- JSONL append and scan ---------------------------------------------------

def append_text(path, data, wait=2.0):
    """Append a record (`data`, str or bytes of whole lines) with a single write().

    POSIX appends of one write() under O_APPEND to a regular file are not interleaved
    with other appenders, which is what lets many hook processes share one JSONL file
    without a lock. Appenders also hold a shared flock while they write and check they
    still hold the file at `path`; a trim (seam_trim) holds it exclusively while it
    reads and renames. So no record is lost to a concurrent trim, and appenders never
    wait for each other (nor more than `wait` seconds for a trim). A symlink, FIFO or
    anything but a regular file at `path` is an OSError naming it.
    """
    import fcntl
    path = os.fspath(path)
    data = data.encode("utf-8") if isinstance(data, str) else data
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    for _ in range(50):
        try:
            fd = _open_regular(path, flags)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            fd = _open_regular(path, flags)
        try:
            if not flock_within(fd, fcntl.LOCK_SH, wait):
                raise OSError("%s stayed locked for %.1fs" % (path, wait))
            try:
                current = os.lstat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                _append_whole(fd, data, path)
                return
        finally:
            os.close(fd)
    raise OSError("%s keeps being replaced while appending" % path)


def _append_whole(fd, data, path):
    """Append `data` to `fd` with one write(); raise an OSError naming `path` when not all
    of it was written, leaving no torn fragment.

    A write cut short (a full disk, a file size limit) leaves part of a record without
    its newline, and the next record appended would be glued onto it: both lost to every
    reader. So the fragment is cut off again (ftruncate) when the file is still what it
    was plus the fragment; when another appender has written since and the fragment is
    still the file's last line, it is ended with a newline (one malformed line). The
    rest is never written by a second write(): another appender's record could land
    between the two halves.
    """
    before = os.fstat(fd).st_size
    try:
        written = os.write(fd, data)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, path) from None
    if written == len(data):
        return
    try:  # undo the fragment, as well as can be: the OSError below reports the failed write
        size = os.fstat(fd).st_size
        if size == before + written:
            os.ftruncate(fd, before)
        else:
            # Someone appended too. Our fragment is the last line only if the file does not
            # end with a newline (every other writer appends whole lines); fd is write-only.
            last = b""
            with open_input(path) as check:
                if os.fstat(check.fileno()).st_ino == os.fstat(fd).st_ino:
                    last = os.pread(check.fileno(), 1, size - 1)
            if last != b"\n":
                os.write(fd, b"\n")
    except OSError:
        pass
    import errno
    raise OSError(errno.EIO, "short write, %d of %d bytes (is the disk full?); the part written "
                  "was removed" % (written, len(data)), path)


def append_jsonl(path, record):
    append_text(path, json_compact(record) + "\n")


def scan_jsonl(path, start=0):
    """Yield (number, record, raw bytes) for each complete line after the first `start`
    lines. `number` is 1-based and counts every complete line, malformed ones included, so it
    can serve as a cursor; `record` is None when the line is not JSON.

    A last line without its newline is still being written: it is neither counted
    nor yielded (the `wc -l` rule). Lines of any length are read. A missing file
    yields nothing; anything but a regular file is an OSError (open_input).
    """
    try:
        handle = open_input(path)
    except FileNotFoundError:
        return
    with handle:
        number = _skip_lines(handle, start) if start > 0 else 0
        for raw in handle:
            if not raw.endswith(b"\n"):
                break
            number += 1
            try:
                record = parse_json(raw)
            except ValueError:
                record = None
            yield number, record, raw


def _skip_lines(handle, count):
    """Position a binary `handle` just after its `count`-th newline; return lines skipped.

    Counts newlines in 1 MiB blocks with bytes.count instead of iterating lines in
    Python, so resuming from a cursor deep into a 100,000-line file stays cheap.
    Stops at the last complete line when the file has fewer than `count`.
    """
    skipped, offset = 0, handle.tell()
    while skipped < count:
        block = handle.read(1 << 20)
        if not block:
            break
        found = block.count(b"\n")
        if skipped + found >= count:
            position = -1
            for _ in range(count - skipped):
                position = block.index(b"\n", position + 1)
            handle.seek(offset + position + 1)
            return count
        skipped += found
        offset += len(block)
    return skipped


def count_complete_lines(path):
    """Number of newline-terminated lines in `path` (0 when it does not exist)."""
    try:
        with open_input(path) as handle:
            return _skip_lines(handle, float("inf"))
    except FileNotFoundError:
        return 0


# ---- locks ------------------------------------------------------------------

def _read_small(path):
    """The first 64 KiB of a small file (open_input's rules), decoded and stripped; None when
    it cannot be read: a symlink, or anything but a regular file, reads as None."""
    try:
        with open_input(path) as handle:
            return handle.read(65536).decode("utf-8", "replace").strip()
    except OSError:
        return None


def read_json_quiet(path, limit=65536):
    """The JSON value in a small file an agent could have changed (a cache, a heartbeat), or
    None when it is missing, unreadable or not JSON (open_input's rules): its reader starts
    afresh."""
    try:
        with open_input(path) as handle:
            return parse_json(handle.read(limit))
    except (OSError, ValueError):
        return None


def open_lock(path, create=True):
    """An fd (read-write) of the lock file `path`, created when missing (and `create`). A
    symlink or anything but a regular file at `path` is an OSError naming it: a planted
    symlink would make us create or lock a file elsewhere."""
    return _open_regular(os.fspath(path), os.O_RDWR | (os.O_CREAT if create else 0))


def _proc_stat(pid):
    """The fields of /proc/PID/stat after the command name ([] when unreadable): [0] the
    state (Z: exited, not reaped yet), [19] when it started, in clock ticks since boot."""
    line = _read_small("/proc/%d/stat" % pid)
    return line.rsplit(")", 1)[1].split() if line and ")" in line else []


def _start_ticks(pid, fields=None):
    fields = _proc_stat(pid) if fields is None else fields
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
    fields = _proc_stat(pid)
    if fields[:1] == ["Z"]:  # killed, its parent has not reaped it yet: it runs nothing
        return True
    ticks = _start_ticks(pid, fields)
    return bool(meta.get("start_ticks") and ticks and ticks != meta["start_ticks"])


def kill_recorded_groups(meta):
    """SIGKILL the process groups a dead lock holder recorded (meta["groups"]).

    Only on the holder's host and boot. A group whose leader's pid now belongs to a
    process that started at another time was reused, and is left alone; a leader that
    is gone leaves its group id to its group while any member lives. Returns the
    group ids signalled.
    """
    import signal
    me = process_identity()
    if meta.get("host") != me["host"] or meta.get("boot_id") not in (None, me["boot_id"]):
        return []
    killed = []
    for group in meta.get("groups") or []:
        pid = group.get("pid") if isinstance(group, dict) else None
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
            continue
        ticks = _start_ticks(pid)
        if ticks is not None and ticks != group.get("start_ticks"):
            continue
        if signal_group(pid, signal.SIGKILL):
            killed.append(pid)
    return killed


def _parse_lock_meta(text):
    """The metadata in a lock file's text, or None when there is none."""
    if not text:
        return None
    try:
        meta = parse_json(text)
    except ValueError:
        meta = None
    return meta if isinstance(meta, dict) else {"unreadable": text[:200]}


class FileLock:
    """An exclusive lock on a file that says who holds it.

    The holder keeps an OS lock (flock) on the file for as long as it runs, so a
    crashed holder releases it automatically, and writes JSON metadata into the
    file: its identity, when it took the lock and a heartbeat. The file is never
    deleted while held (deleting an flock'd file breaks mutual exclusion); release
    records `released_at` instead. A filesystem without flock (some NFS setups) is an
    error: every append in bridge.py takes flock too, so there is nothing to fall back to.

    After a successful acquire(), `recovered` holds the metadata of a previous
    holder that never released (it crashed); after a failed one, `holder` holds
    the current holder's metadata.
    """

    def __init__(self, path, meta=None):
        self.path = os.fspath(path)
        self.extra = dict(meta or {})
        self.fd = None
        self.meta = None
        self.holder = None
        self.recovered = None

    # -- reading a lock from outside --

    @staticmethod
    def probe(path):
        """('free'|'held'|'unknown', metadata) for a lock file, without taking it."""
        import fcntl
        meta = _parse_lock_meta(_read_small(path))
        try:
            fd = open_lock(path, create=False)
        except FileNotFoundError:
            return "free", None
        except OSError:
            return "unknown", meta
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return "held", meta
        except OSError:
            return "unknown", meta
        finally:
            os.close(fd)
        return "free", meta

    # -- holding a lock --

    def acquire(self):
        """Take the lock without waiting. True on success, False when someone holds it."""
        import fcntl
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        for _ in range(5):
            try:
                fd = open_lock(self.path)
            except OSError as exc:
                raise BridgeError("cannot lock %s: %s" % (self.path, exc.strerror or exc))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if isinstance(exc, BlockingIOError):
                    self.holder = _parse_lock_meta(_read_small(self.path))
                    return False
                raise BridgeError("cannot lock %s: %s" % (self.path, exc.strerror or exc))
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same_file = False
            if not same_file:  # replaced between open and flock: lock the new one
                os.close(fd)
                continue
            previous = _parse_lock_meta(os.pread(fd, 65536, 0).decode("utf-8", "replace").strip())
            self.recovered = previous if previous and not previous.get("released_at") else None
            self.fd = fd
            self._write_meta(fresh=True)
            return True
        raise BridgeError("lock %s keeps being replaced; giving up" % self.path, EXIT_LOCKED)

    def _write_meta(self, fresh=False):
        now = time.time()
        if fresh:
            self.meta = {**self.extra, **process_identity(), "created_at": now_iso(now),
                         "created_ts": round(now, 3), "mode": "flock", "version": __version__}
        self.meta.update(heartbeat_at=now_iso(now), heartbeat_ts=round(now, 3))
        data = (json.dumps(self.meta, ensure_ascii=False) + "\n").encode("utf-8")
        # pwrite then truncate: a reader never sees an empty file mid-update.
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))

    def heartbeat(self):
        """Refresh the heartbeat so a long healthy run is never taken for stale."""
        if self.fd is not None:
            self._write_meta()

    def release(self):
        """Only after a successful acquire(), once (every caller's pattern)."""
        import fcntl
        try:
            self.meta["released_at"] = now_iso()
            self._write_meta()
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
        finally:
            self.fd = None


def describe_holder(meta):
    """A short human description of a lock holder's metadata (the lock file is agent-writable:
    its control characters spelled out)."""
    if not meta:
        return "an unknown process"
    if "unreadable" in meta:
        return "an unknown process (unreadable lock content)"
    return printable("pid %s on %s since %s (last heartbeat %s)" % (
        meta.get("pid", "?"), meta.get("host", "?"), meta.get("created_at", "?"),
        meta.get("heartbeat_at", "?")))


def flock_within(fd, operation, seconds, interval=0.002):
    """flock(fd, operation) polling for at most `seconds`; False when it stayed busy.

    Bounded, so a stopped or wedged process holding a file can never make a hook (and with
    it the agent) wait forever.
    """
    import fcntl
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def acquire_flock(path, timeout=5.0, interval=0.05):
    """Open `path` and take flock(LOCK_EX) on it, waiting up to `timeout` seconds.

    Returns the open fd (release with release_flock) or None on timeout. Compatible
    with `flock(1)` users of the same file. For short critical sections; long-held
    locks with metadata use FileLock. A symlink at `path` is an OSError naming it.
    """
    import fcntl
    os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
    fd = open_lock(path)
    if flock_within(fd, fcntl.LOCK_EX, timeout, interval):
        return fd
    os.close(fd)
    return None


def release_flock(fd):
    import fcntl
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# ---- config -------------------------------------------------------------------

# Every configuration key bridge.py knows: dotted key, default, type, and for a number the
# least and greatest value it may take (None: no upper bound), for a string or a list the values
# it (each item) may take, a string's read in any case. A float key takes whole numbers too; a
# key whose default is null also takes null; a string whose default is not empty may not be
# empty; a key whose default is {} is free-form (its contents are not checked). Every value is
# checked when the config is loaded (load_config), so the rest of bridge.py reads `config[...]`
# and never restates a default. Sections are in the order of the bridges below;
# bridge.config.example.json documents each key.
ARGV = "argv"                   # a non-empty list of strings
COMMAND = "command"             # a string split like a shell would, or an argv list: checked by
                                # split_command where it is used (a bad relay.nudge_command is a
                                # warning that must not keep `relay down` from queueing)
NAME = "name"                   # one path component: [A-Za-z0-9._-]+, not . or ..
POLL_RANGE = (0.05, 3600)       # seconds between two looks at a queue
TIMEOUT = (0.1, None)           # seconds a step may take
CONFIG_KEYS = (
    # watch: top-level keys, as the Bridge Protocol's bridge.config.json
    ("stop_on_failure", True, bool, None),
    ("continue_on_failure", False, bool, None),
    ("worker_lock_ttl_sec", 7200, int, (1, None)),
    ("log_size_cap_kb", 10, int, (1, None)),
    ("redaction_patterns", [], list, None),
    ("protected_branches", ["main", "master"], list, None),
    ("commit_on_success", True, bool, None),
    ("return_to_base", True, bool, None),
    ("poll_sec", 1.0, float, POLL_RANGE),
    ("progress_sec", 10.0, float, (0.1, None)),
    ("executor.command", ["opencode", "run", "{prompt}"], ARGV, None),
    ("executor.env", {}, dict, None),
    ("executors", {}, dict, None),                 # name -> argv template; a task's "executor"
    ("agent_idle_timeout_sec", 0, float, (0, None)),            # 0: off
    ("retry_context", True, bool, None),           # tell a retried task what failed last time
    ("retry_context_bytes", 2048, int, (256, 65536)),
    ("notify.command", None, ARGV, None),          # argv template run when a task ends
    ("notify.on", ["failed", "blocked", "needs_confirmation", "queue_stopped"], list,
     ("success", "failed", "blocked", "needs_confirmation", "queue_stopped")),
    ("notify.timeout_sec", 30, float, TIMEOUT),
    ("bead.command", None, COMMAND, None),
    ("bead.timeout_sec", 30, float, TIMEOUT),
    # where a task runs: "checkout" (the user's own, switching its branch) or "worktree" (a git
    # worktree of its own under worktree_dir, null: GIT-COMMON-DIR/bridge-worktrees); workers
    # > 1 runs that many tasks at once (worktree isolation only)
    ("isolation", "checkout", str, ("checkout", "worktree")),
    ("worktree_dir", None, str, None),
    ("workers", 1, int, (1, 64)),
    # seam: how the Stop-hook reason and the wake prompt tell an agent to run bridge.py;
    # `wake --host codex` starts wake_command per parked session ({session_id} replaced),
    # the prompt on stdin, and does not wait for it
    ("seam.command", "python3 scripts/bridge.py", str, None),
    ("seam.wake_command", ["codex", "exec", "resume", "{session_id}", "-"], ARGV, None),
    # relay: queue_file is captain_queue.yaml in newer repos; nudge wakes the vice captain
    # after `down`: nudge_command (argv list or string, e.g. "bash scripts/inbox_write.sh",
    # gets TARGET CONTENT cmd_new CAPTAIN_ID) or, when null, natively; nudge_target
    # "@cluster_captain" is the captain: of clusters/<s>/config.yaml; the queue lock is
    # lock_attempts tries of `flock -w lock_timeout_sec`, lock_retry_sleep_sec apart
    ("relay.queue_file", "captain_to_vice_captain.yaml", NAME, None),
    ("relay.nudge", True, bool, None),
    ("relay.nudge_command", None, COMMAND, None),
    ("relay.nudge_target", "vice_captain", str, None),
    ("relay.nudge_timeout_sec", 30.0, float, TIMEOUT),
    ("relay.lock_timeout_sec", 5.0, float, (0, None)),
    ("relay.lock_attempts", 3, int, (1, None)),
    ("relay.lock_retry_sleep_sec", 1.0, float, (0, None)),
    # proxy: the Doctor (the real MCP server), observability and lifecycle
    ("doctor.command", None, COMMAND, None),
    ("doctor.args", [], list, None),
    ("doctor.commandLine", None, str, None),
    ("doctor.cwd", None, str, None),
    ("doctor.env", {}, dict, None),
    ("observability.enabled", True, bool, None),
    ("observability.port", 3334, int, (0, 65535)),
    ("observability.host", "127.0.0.1", str, None),
    ("observability.token", None, str, None),
    ("observability.allowed_origins", [], list, None),
    ("lifecycle.maxRestarts", 10, int, (0, None)),
    ("lifecycle.restartWindow", 60.0, float, (0, None)),
    ("lifecycle.cooldown", 1000.0, float, (0, None)),          # milliseconds
    ("proxy.max_line_bytes", 16 << 20, int, (0, None)),
    ("proxy.pause_buffer_messages", 1000, int, (0, None)),
    ("proxy.pause_buffer_bytes", 64 << 20, int, (0, None)),
    ("proxy.pause_timeout_sec", 30.0, float, (0, None)),
    ("proxy.close_grace_sec", 2.0, float, (0, None)),
    ("proxy.kill_after_sec", 5.0, float, (0, None)),
    ("proxy.stats_interval_sec", 5.0, float, (0, None)),
    ("proxy.event_params_max", 512, int, (0, None)),
    ("proxy.events_per_sec_max", 200, int, (0, None)),
    ("proxy.log_level", "info", str, ("debug", "info", "warn", "error")),
    ("proxy.health_check_sec", 60.0, float, (0, None)),        # 0: off
    ("proxy.health_timeout_sec", 30.0, float, (0, None)),
    ("proxy.start_timeout_sec", 60.0, float, (0, None)),       # 0: off
    # proxy --watch: restart the Doctor when one of these files or folders changes
    ("doctor.watch", [], list, None),
    # what tools write while the server is developed (a test run, a type check, pip), not its code
    ("doctor.watch_exclude", [".git", "__pycache__", "node_modules", ".venv", "*.pyc", ".pytest_cache",
                              ".mypy_cache", ".ruff_cache", ".tox", "*.swp", "*.swx", "*~", ".#*", "4913"],
     list, None),                                               # 4913: vim's write test file
    ("doctor.watch_debounce_ms", 300.0, float, (0, None)),
    ("doctor.restart_tool", False, bool, None),                # offer bridge_restart_server
    # changes
    ("changes.dir", "changes", str, None),                     # relative to the root
    ("changes.mcp.command", None, COMMAND, None),              # the MCP server, e.g. axiomregent
    ("changes.mcp.framing", "content-length", str, ("content-length", "line")),
    ("changes.mcp.timeout_sec", 30, float, TIMEOUT),           # every request
    ("changes.mcp.apply_timeout_sec", 120, float, TIMEOUT),    # workspace.apply_patch
    ("changes.mcp.env", {}, dict, None),                       # extra environment for the server
    ("changes.critical_features", [], list, None),             # their impact always asks for review
    ("changes.poll_sec", 2.0, float, POLL_RANGE),              # `changes run` without --once
    ("changes.approval_key", None, str, None),                 # null: ~/.config/bridge/approval.key
)
CONFIG_SPEC = {key: (default, kind, limits) for key, default, kind, limits in CONFIG_KEYS}
CONFIG_DEFAULTS = {}
for _key, _default, _kind, _limits in CONFIG_KEYS:
    _node = CONFIG_DEFAULTS
    for _name in _key.split(".")[:-1]:
        _node = _node.setdefault(_name, {})
    _node[_key.rsplit(".", 1)[-1]] = _default

# Environment variables that override config keys (their type is the key's).
ENV_OVERRIDES = {
    "BRIDGE_DOCTOR_CMD": "doctor.commandLine",
    "BRIDGE_DOCTOR_CWD": "doctor.cwd",
    "BRIDGE_OBS_ENABLED": "observability.enabled",
    "BRIDGE_OBS_PORT": "observability.port",
    "BRIDGE_OBS_HOST": "observability.host",
    "BRIDGE_OBS_TOKEN": "observability.token",
    "BRIDGE_MAX_RESTARTS": "lifecycle.maxRestarts",
    "BRIDGE_RESTART_WINDOW": "lifecycle.restartWindow",
    "BRIDGE_RESTART_COOLDOWN": "lifecycle.cooldown",
    "BRIDGE_LOG_LEVEL": "proxy.log_level",
    "BRIDGE_APPROVAL_KEY": "changes.approval_key",
}

CONFIG_FILE_NAME = "bridge.config.json"


def _parse_bool(text):
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false, got %r" % text)


def check_number(name, value, limits, source=None):
    """`value` when it lies within `limits` (least, greatest or None); else a BridgeError
    (exit 2) naming `name` and, when given, where the value came from. Refuses nan and
    infinity (JSON's 1e400): no duration or count is infinite, and time.sleep(inf) fails."""
    import math
    low, high = limits
    if not (-math.inf < value < math.inf and low <= value and (high is None or value <= high)):
        where = "between %s and %s" % (low, high) if high is not None else ">= %s" % low
        raise BridgeError("%s%s must be a number %s, got %s" % (
            source + ": " if source else "", name, where, json.dumps(value)))
    return value


def config_value(name, value, source):
    """`value` for config key `name` when it has the key's type and range (CONFIG_KEYS); else
    a BridgeError (exit 2) naming the key and `source`, the file or environment variable."""
    default, kind, limits = CONFIG_SPEC[name]
    if value is None and default is None or kind is COMMAND:
        return value
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is bool:
        ok, what = isinstance(value, bool), "true or false"
    elif kind in (int, float):
        ok = number and (kind is float or isinstance(value, int))
        what = "a whole number" if kind is int else "a number"
    elif kind is ARGV:
        ok, what = isinstance(value, list) and value and all(isinstance(a, str) for a in value), \
            "a non-empty list of strings (an argv template)"
    elif kind is NAME:
        ok, what = is_safe_name(value), "a file name ([A-Za-z0-9._-]+, not . or ..)"
    elif limits:  # one of the values in `limits` (a list: each of its items)
        choice = value.lower() if isinstance(value, str) else value
        ok = isinstance(value, kind) and all(v in limits for v in (choice if kind is list else [choice]))
        what = ("a list of " if kind is list else "one of ") + ", ".join(limits)
        value = choice if ok else value
    else:  # every list holds strings (branches, globs, origins, argv words, feature ids)
        ok = isinstance(value, kind) and (value != "" or default in ("", None)) and (
            kind is not list or all(isinstance(item, str) for item in value))
        what = {str: "a non-empty string" if default else "a string", list: "a list of strings",
                dict: "an object"}[kind]
    if not ok:
        raise BridgeError("%s: %s must be %s%s, got %s" % (
            source, name, what, " or null" if default is None else "", json.dumps(value)))
    return check_number(name, value, limits, source) if limits and kind in (int, float) else value


def _merge_config(defaults, given, prefix, source, unknown):
    merged = dict(defaults)
    for key, value in given.items():
        name = prefix + key
        if key.startswith("_comment"):  # documentation inside the file, as in the example
            continue
        if key not in defaults:
            unknown.append(name)
            merged[key] = value
        elif name in CONFIG_SPEC:
            merged[key] = config_value(name, value, source)
        elif not isinstance(value, dict):
            raise BridgeError("%s: %s must be an object, got %s" % (source, name, json.dumps(value)))
        else:
            merged[key] = _merge_config(defaults[key], value, name + ".", source, unknown)
    return merged


def load_config(root=None, path=None, env=None):
    """The effective configuration: defaults < config file < environment.

    `path` (from --config) must exist; otherwise ROOT/bridge.config.json is used
    when present. Unknown keys are kept but warned about (a typo should not pass
    silently); a value of the wrong type or out of range is an error naming the key.
    """
    env = os.environ if env is None else env
    given, source = {}, "defaults"
    if path is None and root is not None:
        candidate = os.path.join(os.fspath(root), CONFIG_FILE_NAME)
        path = candidate if os.path.lexists(candidate) else None  # a dangling link is refused
    if path is not None:
        source = os.fspath(path)
        given = read_json_file(source, "config file")
        if not isinstance(given, dict):
            raise BridgeError("config file %s must hold a JSON object" % source)
    unknown = []
    defaults = json.loads(json.dumps(CONFIG_DEFAULTS))   # a copy: the caller may change it
    config = _merge_config(defaults, given, "", source, unknown)
    for name in unknown:
        warn("%s: unknown config key %r (kept, but nothing reads it)" % (source, name))
    for var, name in ENV_OVERRIDES.items():
        if var not in env:
            continue
        kind = CONFIG_SPEC[name][1]
        try:
            value = _parse_bool(env[var]) if kind is bool else kind(env[var])
        except ValueError as exc:
            raise BridgeError("environment variable %s: %s" % (var, exc))
        *parents, leaf = name.split(".")
        node = config
        for key in parents:
            node = node[key]
        node[leaf] = config_value(name, value, "environment variable %s" % var)
    config["_source"] = source
    return config


def split_command(value, what):
    """A configured command as an argv list: a list is used as given, a string is split the way
    a shell would split it (no shell runs it). None or empty gives None. Anything else, or a
    string with an unterminated quote, is a BridgeError naming `what` (the config key)."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        import shlex
        try:
            return shlex.split(value) or None
        except ValueError as exc:
            raise BridgeError("%s: cannot split %r: %s" % (what, value, exc))
    if isinstance(value, list) and all(isinstance(a, (str, int)) and not isinstance(a, bool)
                                       for a in value):
        return [str(a) for a in value]
    raise BridgeError("%s must be a command string or a list of strings, got %s" % (
        what, json.dumps(value)))


# ---- redaction ----------------------------------------------------------------
#
# Four layers, all reporting (start, end) spans of the ORIGINAL text, which are merged
# and replaced with REDACTED at the end (so layers never see each other's output and a
# second pass changes nothing):
#   1. self-identifying token formats (ghp_..., sk-ant-..., AKIA..., PEM blocks, JWTs,
#      URL userinfo, webhooks), and base64 blobs that decode to one: the whole token goes;
#   2. context rules: the VALUE after a secret-named key (`password=`, `"api_key": "..."`,
#      `<password>...</password>`, `Authorization: Bearer ...`, `--token X`), credentials
#      given to commands (`curl -u`, `mysql -p`, `sshpass -p`, `openssl -pass pass:`...),
#      and a lone value printed right after a command whose job is to print a secret;
#      the key, flag and auth scheme stay so logs remain readable;
#   3. the same rules once more on a percent- or \u-escaped stretch, decoded;
#   4. known values: secret-named environment variables, the values of the config's env
#      maps and credentials, and their base64, URL-, JSON- and \u-escaped forms; plus
#      `redaction_patterns` from the config (whole match).
#
# Python's `re` backtracks and has no timeout, so every pattern starts with a literal
# (CPython then scans at GB/s with a fast prefix search), bounds every repeat and never
# nests one. Matching resumes after each match, so each adversarial shape (BEGIN floods,
# `eyJ` runs, `api_key=` x 100 000) stays linear. Most token formats are a prefix ending
# in `_`, `-`, `.` or `~` and a random body: one scan per separator finds it after the
# last two characters of some known prefix, and a dict lookup of the text before it
# names the format, so a hundred formats cost four scans. Context rules are found by
# keyword on an ASCII-lowercased bytes copy, then matched at that position only.

REDACTED = "[REDACTED]"

# Prefixed token formats: prefix -> (body regex, left boundary). Left boundary: "" = anything may come before (the shape alone says token, so
# `notes_xoxb-...` is one), "w" = no letter or digit before, "t" = no letter, digit, `_`
# or `-` before (short prefixes that occur inside words: `task-`, `disk_test_`).
_AN = "[A-Za-z0-9]"
_URLSAFE = "[A-Za-z0-9_-]"
_PREFIXED = {}
for _names, _body, _edge in (
        # GitHub, GitLab, npm, Slack: vendor prefixes that nothing else uses
        ("ghp_ gho_ ghu_ ghs_ ghr_", _AN + "{36,251}", ""),
        ("github_pat_", "[A-Za-z0-9_]{22,255}", ""),
        ("glpat- glrt- gldt- glptt- glcbt- glimt- glagent- gloas- glsoat- glffct- glft-",
         "[A-Za-z0-9_.-]{20,300}", ""),
        ("glsa_ glc_", "[A-Za-z0-9_=+/-]{32,400}", ""),
        ("npm_", _AN + "{36}(?![A-Za-z0-9])", ""),
        ("xoxb- xoxp- xoxe- xoxa- xoxr- xoxs- xoxo-", "[A-Za-z0-9.-]{10,400}", ""),
        ("xoxe.", "xox[bp]-[A-Za-z0-9.-]{10,400}", ""),
        ("xapp-", "\\d-[A-Za-z0-9-]{10,300}", ""),
        # AI providers: OpenAI, Anthropic, OpenRouter, xAI, Groq, Perplexity, NVIDIA, HF
        ("sk-proj- sk-svcacct- sk-admin- sk-service- sk-ant-api03- sk-ant-admin01- "
         "sk-ant-oat01- sk-ant-ort01- sk-or-v1-", _URLSAFE + "{20,400}", "w"),
        ("sk-", _AN + "{20,400}(?![A-Za-z0-9_-])", "t"),      # a digit too, checked in code
        ("xai-", "[A-Za-z0-9_]{60,120}", "w"), ("gsk_", _AN + "{48,56}", "w"),
        ("pplx-", _AN + "{40,60}", "w"), ("nvapi-", _URLSAFE + "{60,70}", "w"),
        ("hf_", _AN + "{30,40}(?![A-Za-z0-9])", "w"), ("api_org_", "[A-Za-z]{34}", "w"),
        ("r8_", _URLSAFE + "{36,40}", "w"), ("pypi-", "AgE" + _URLSAFE + "{50,1000}", "w"),
        # payments and commerce: Stripe, Square, Shopify, Shippo, Duffel, Flutterwave
        ("sk_live_ sk_test_ sk_prod_ rk_live_ rk_test_ rk_prod_", _AN + "{10,255}", "w"),
        ("whsec_", "[A-Za-z0-9+/=]{24,100}", "w"),
        ("sq0atp- sq0csp-", _URLSAFE + "{22,60}", "w"),
        ("shpat_ shpca_ shppa_ shpss_", "[a-fA-F0-9]{32}", ""),
        ("shippo_live_ shippo_test_", "[a-fA-F0-9]{40}", ""),
        ("duffel_live_ duffel_test_", "[A-Za-z0-9_=-]{43}", ""),
        ("FLWSECK_TEST- FLWSECK-", "[a-hA-H0-9]{12,32}(?:-X)?", ""),
        # clouds, hosting and infrastructure
        ("dop_v1_ doo_v1_ dor_v1_", "[a-f0-9]{64}", ""),
        ("dckr_pat_ dckr_oat_", _URLSAFE + "{20,40}", ""),
        ("fo1_", _URLSAFE + "{43}", "w"), ("fm1a_ fm1r_ fm2_", "[A-Za-z0-9+/]{100,4096}={0,3}", "w"),
        ("pscale_tkn_ pscale_pw_ pscale_oauth_", "[A-Za-z0-9_=.-]{32,64}", ""),
        ("sbp_", "[a-f0-9]{40}", "w"), ("sb_secret_", _URLSAFE + "{20,64}", "w"),
        ("hvs. hvb.", _URLSAFE + "{24,300}", "w"),
        ("dp.pt. dp.st. dp.sa. dp.ct. dp.scim. dp.audit.", _AN + "{40,50}", "w"),
        ("pul-", "[a-f0-9]{40}", "w"), ("tk-us-", _URLSAFE + "{48}", "w"),
        ("v1.0-", "[a-f0-9]{24}-[a-f0-9]{146}", "w"), ("sha256~", _URLSAFE + "{43}", "w"),
        (".atlasv1.", "[A-Za-z0-9_=-]{60,70}", ""),             # Terraform Cloud, see _BACK
        ("bedrock-api-key-", "YmVkcm9jay5hbWF6b25hd3MuY29t[A-Za-z0-9+/=%&._-]{0,2048}", "w"),
        ("AGE-SECRET-KEY-", "1[0-9A-Z]{58}", ""),
        ("HRKU-", _URLSAFE + "{60}", ""), ("PMAK-", "[a-fA-F0-9]{24}-[a-fA-F0-9]{34}", ""),
        ("ops_", "eyJ[A-Za-z0-9+/]{250,4096}={0,3}", "w"),        # 1Password
        ("dt0c01.", _AN + "{24}\\." + _AN + "{64}", "w"),         # Dynatrace
        ("NRAK-", "[A-Z0-9]{27}", "w"), ("NRII-", "[A-Za-z0-9-]{32}", "w"),
        ("NRJS-", "[a-f0-9]{19}", "w"),                          # New Relic
        ("sntryu_", "[a-f0-9]{64}", ""), ("sntrys_", "eyJpYXQiO[A-Za-z0-9+/=_]{50,600}", ""),
        ("ya29.", _URLSAFE + "{20,2048}", "w"),                   # Google OAuth
        ("SG.", _URLSAFE + "{22}\\." + _URLSAFE + "{43}", "w"),   # SendGrid
        ("key-", "[a-f0-9]{32}(?![A-Za-z0-9])", "t"),            # Mailgun
        ("xkeysib-", "[a-f0-9]{64}-" + _AN + "{16}", ""),         # Brevo
        # developer services
        ("lin_api_", _AN + "{40}", ""), ("ntn_", _AN + "{40,50}", "w"),
        ("pnu_", _AN + "{36}", "w"), ("rdme_", "[a-z0-9]{70}", "w"),
        ("tfp_", "[A-Za-z0-9_.=-]{59}", "w"), ("rubygems_", "[a-f0-9]{48}", ""),
        ("CLOJARS_", _AN + "{60}", ""), ("fio-u-", "[A-Za-z0-9_=-]{64}", "w"),
        ("ico-", _AN + "{32}(?![A-Za-z0-9])", "t"), ("p8e-", _AN + "{32}(?![A-Za-z0-9])", "w"),
        ("dnkey-", "[a-z0-9=_-]{26}-[a-z0-9=_-]{52}", "w"),
        ("API-", "[A-Z0-9]{26}(?![A-Za-z0-9])", "w"),            # Octopus Deploy
        ("sm_pat_ sm_aat_ sm_sat_", _AN + "{16}", "w"),           # SettleMint
        ("sgp_", "(?:[a-fA-F0-9]{16}_|local_)?[a-fA-F0-9]{40}", "w"),   # Sourcegraph
        ("sqp_ squ_ sqa_", "[a-f0-9]{40}", "w"),                  # SonarQube
        ("s-s4t2ud- s-s4t2af-", "[a-f0-9]{64}", "w"),             # 42 intra
        ("pat. sat.", _URLSAFE + "{22}\\." + _AN + "{24}\\." + _AN + "{20}", "w"),   # Harness
        ("sk.", "eyJ" + _URLSAFE + "{20,300}\\." + _URLSAFE + "{20,64}", "w"),       # Mapbox
        ("sc_ ext_ scauth_ authress_", "[a-z0-9]{5,30}\\.[a-z0-9]{4,6}\\.acc[_-][a-z0-9-]{10,32}"
         "\\.[A-Za-z0-9+/_=-]{30,120}", "w"),                       # Authress
):
    for _name in _names.split():
        _PREFIXED[_name] = (_body, _edge)
del _names, _body, _edge, _name
# Prefixes whose token starts before them: Terraform Cloud is 14 characters, ".atlasv1.".
_BACK = {".atlasv1.": "[A-Za-z0-9]{14}"}
# Formats whose separator is inside: separator -> (lookaround after it, characters of the
# token before it, its length): MaxMind license keys (6, "_", 29, "_mmk"), Airtable
# personal access tokens ("pat", 14, ".", 64 hex).
_SEP_INSIDE = {"_": (r"(?=[A-Za-z0-9]{29}_mmk(?![A-Za-z0-9]))(?<=[A-Za-z0-9]{6}_)", 6, 40, "_mmk", 30),
               ".": (r"(?=[a-f0-9]{64}(?![A-Za-z0-9]))(?<=pat[A-Za-z0-9]{14}\.)", 17, 82, "pat", -17)}

# Token formats without a separator, one scan per first letter (a scan led by one literal
# character is fast; one led by a set of them is not). AWS key ids need one of base32's
# digits: real ones have them, words shaped like them (ASIAPACIFICSOUTHEAST) do not
# (checked in code).
_UPPER_RULES = (
    r"A(?:(?:KIA|SIA|BIA|CCA|3T[A-Z0-9])[A-Z2-7]{16}(?![A-Za-z0-9])"
    r"|Iza[A-Za-z0-9_-]{35}|KCp[A-Za-z0-9]{69}|BSK[A-Za-z0-9+/]{109,269}={0,2}"
    r"|TATT3[A-Za-z0-9_=-]{100,300}|3-[A-Z0-9]{6}-(?:[A-Z0-9]{11}|[A-Z0-9]{6}-[A-Z0-9]{5})"
    r"(?:-[A-Z0-9]{5}){3}|C[a-f0-9]{32}(?![A-Za-z0-9]))",
    r"E(?:AA[AMC][A-Za-z0-9_-]{22,400}|Z[AT]K[A-Za-z0-9]{54})",
    r"LTAI[A-Za-z0-9]{20}(?![A-Za-z0-9])",
    r"GR1348941[A-Za-z0-9_-]{20,40}",
    r"SK[a-fA-F0-9]{32}(?![A-Za-z0-9])",
)

# Token formats with a literal of their own, each scanned alone: (regex, back) - `back`
# is how many characters before the match the token really starts (the regex starts
# inside it to keep a literal first, and a rare one: yJ, not the e of eyJ).
_LITERAL_RULES = (
    # Telegram bot tokens: digits ":AA" 33 chars (the digits are found in code)
    (r"AA(?<=\d:AA)[A-Za-z0-9_-]{33}(?![A-Za-z0-9_-])", 1),
    # Azure AD client secrets: 3 chars, a digit, "Q~", 31-34 chars
    (r"Q~(?<=[A-Za-z0-9_~.]{3}\dQ~)[A-Za-z0-9_~.-]{31,34}", 4),
    # JWTs (header and payload base64url JSON, optional signature); Grafana API keys
    (r"yJ(?<=eyJ)(?<![A-Za-z0-9-]eyJ)(?:[A-Za-z0-9_-]{8,4096}\.[A-Za-z0-9_-]{8,8192}\.[A-Za-z0-9_-]{0,4096}"
     r"|rIjoi[A-Za-z0-9]{70,400}={0,3})", 1),
    # Databricks, ClickHouse Cloud, Artifactory reference tokens
    (r"dapi(?<![A-Za-z0-9]dapi)[a-f0-9]{32}(?:-\d)?(?![A-Za-z0-9])", 0),
    (r"4b1d(?<![A-Za-z0-9]4b1d)[A-Za-z0-9]{38}(?![A-Za-z0-9])", 0),
    (r"Vmd(?<=cmVmd)(?<![A-Za-z0-9]cmVmd)[A-Za-z0-9]{59}(?![A-Za-z0-9])", 2),
    # GitHub Actions' command that declares a secret (negative back: the value follows)
    (r"::add-mask::(?=[^\s$%{<\"'])[^\s\"']{1,4096}", -12),
)
# Base64 blobs that start with the encoding of a private key header or a token prefix
# (ghp_, github_pat_, glpat-, AKIA, ASIA, eyJ): decoded, and redacted whole when the
# decoded text holds a secret. (Upper-case first letters only: a scan led by a lower-case
# letter stops at a third of all characters.)
_B64_RULES = tuple(head + r"[A-Za-z0-9+/]{16,65536}={0,2}" for head in (
    r"LS0tLS1CRUdJT", r"Z(?:2h[wv1zy]X|2l0aHViX3BhdF|2xwYXQt|XlK)", r"Q(?:UtJQ|VNJQ)"))
# Discord bot tokens have no literal prefix: searched only where "discord" is (any case).
_DISCORD_RULE = (r"\.(?:(?<=[MNO][A-Za-z0-9_-]{23}\.)|(?<=[MNO][A-Za-z0-9_-]{24}\.)"
                 r"|(?<=[MNO][A-Za-z0-9_-]{25}\.))[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,40}")

# URLs: the text after "://" up to a space or quote; its userinfo runs to the last "@"
# (passwords hold "#", "/", "?", "@" in practice, whatever RFC 3986 says). Webhook URLs
# (Slack, Discord, Teams) carry their secret in the path.
_URL_RULE = r"://([^\s\"'<>\\`]{0,1024})"
_URL_HOST = r"[A-Za-z0-9\[]"
_URL_PORT = r"\d{1,5}(?:[/?#]|$)"
_HOOK_RULE = (r"(?:[A-Za-z0-9.-]{0,64}\.)?(?:hooks\.slack\.com/(?:services|workflows|triggers)/"
              r"|(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/|webhook\.office\.com/webhookb2/)"
              r"([A-Za-z0-9+/_@.-]{8,512})")

# Private keys: the header by regex, the END line by str.find within 64 KiB; the body
# between them goes. Without an END, everything that looks like PEM body goes.
_PEM_HEADER = r"-----BEGIN[ A-Z0-9_-]{0,64}PRIVATE KEY(?: BLOCK)?-----"
_PEM_TAIL = (r"(?:(?:\r?\n|\\r?\\n)[A-Za-z-]{1,40}:[^\r\n\\]{0,200}){0,6}"
             r"[A-Za-z0-9+/=\r\n\\]{0,65536}")
_PEM_WINDOW = 65536

# Context rules. A secret-named key ends in one of these words; each gate finds the word
# followed by an assignment operator on the lowercased copy (one literal-led scan each),
# and only those hits reach Python. `--password VALUE` flags have their own gate. A gate
# starts at a rare letter of its words (a scan costs per occurrence of its first letter),
# then tries letters before lookbehinds: password is w, "ord", (?<=password).
_STRONG_KEY_PREFIXES = (b"api", b"access", b"secret", b"private", b"account", b"sharedaccess",
                        b"master", b"auth", b"client", b"signing", b"encryption", b"license",
                        b"subscription", b"storage", b"service", b"app", b"consumer", b"admin",
                        b"session", b"webhook", b"hmac", b"jwt", b"csrf", b"x-api")
# ... and a value must start right after (a quick C-level reject for `"password": ""`).
# `%3d` is "=" percent-encoded (a form body or query inside a URL).
_KV_OP = (rb"(\\{0,2}[\"']?[ \t]{0,8}(?::=|=>|=|:|%3d))"
          rb"(?=[ \t]{0,8}(?:\"[^\"\\\r\n]|'[^'\r\n]|\\{1,3}\"[^\"\\]|[^\s\"'`,;&<>(){}\[\]\\]))")
_KV_GATES = (   # grouped by that letter: one scan per group
    rb"w(?:ord(?<=password)|d(?:(?<=passwd)|(?<=pwd)))", rb"h(?:rase(?<=passphrase)|(?<=auth)(?:orization)?)",
    rb"c(?:ret(?<=secret)(?:[-_.]?key[-_.]?base)?|redentials?)", rb"s(?:ig(?:nature)?|ession)",
    rb"k(?:e(?:n(?<=token)|y(?=\\{0,2}[\"']?[ \t]{0,8}[:=%])(?:" + b"|".join(
        b"(?<=(?:%s)%skey)" % (b"|".join(p for p in _STRONG_KEY_PREFIXES if len(p) == size), sep)
        for size in sorted({len(p) for p in _STRONG_KEY_PREFIXES}) for sep in (b"", b"[-_.]"))
        + b"))|ie(?<=cookie))")
_UPPER_KEY_GATE = rb"KEY(?<=_KEY)([ \t]{0,8}[:=])"   # STRIPE_KEY=..., searched on the text itself
_FLAG_GATE = rb"--(?:[a-z0-9]{1,20}-){0,3}(?:passw(?:or)?d|passphrase|secret|token|api-?key|auth)([ \t])"
_KV_RULE = (r"(?P<q>\\{0,2}[\"']?)"
            r"(?P<op>[ \t]{0,8}(?::=|=>|=|:|%3[dD])[ \t]{0,8}|[ \t]{1,8})"
            r"(?P<scheme>(?:bearer|basic|token|bot|apikey|sso-key|digest|negotiate|ntlm)[ \t]{1,8})?"
            r"(?:\"(?P<dq>(?:[^\"\\\r\n]|\\.){1,2048})"
            r"|'(?P<sq>[^'\r\n]{1,2048})"
            r"|\\{1,3}\"(?P<eq>[^\"\\\r\n]{1,2048})"
            r"|(?P<bare>[^\s\"'`,;&<>(){}\[\]\\]{1,2048}))")
# A bare value runs on over "&" unless a query parameter follows (`&next=`).
_KV_AMP = r"&(?![A-Za-z_][A-Za-z0-9_.\[\]-]{0,60}=)[^\s\"'`,;<>(){}\[\]\\]{1,2048}"
_SECRET_NAME = (r"(?:passw(?:or)?d|passphrase|(?:^|[-_.])pwd|secret|token|credentials?"
                r"|authorization|(?:^|[-_.o])auth|cookie|signature|(?:^|[-_.])sig"
                r"|[-_]session|(?:client|private)[-_.]?key[-_.]?data|secret[-_.]?key[-_.]?base"
                r"|(?:%s)[-_.]?key)$"
                % "|".join(p.decode() for p in _STRONG_KEY_PREFIXES))
# Keys that end like a secret's name without holding one (pagination and progress tokens).
_NOT_SECRET_NAME = r"(?:progress|page|next|continuation|sync|resume|cursor|cancellation)[-_.]?token$"
_NAME_MASK = bytes(110 if chr(c) in "abcdefghijklmnopqrstuvwxyz0123456789_.-" else 32
                   for c in range(256))
# Values that are clearly not secrets (types, booleans, prose after a colon).
_NOT_SECRET = frozenset(
    "true false null none nil undefined yes no on off required optional str string int "
    "bool bytes any object dict list hidden masked redacted empty unset default missing "
    "invalid expired denied failed ok n/a na tbd todo example placeholder secretstr "
    "number boolean char varchar text".split())
_PLACEHOLDER = (r"(?i:your[-_ ][\w -]{0,40}[-_ ]here|x{4,}|x{3,}(?:[-_. ]x{3,}){1,8}|•+|\*+|\.\.\.+"
                r"|v?\d+(?:\.\d+){1,3}(?:[-+.][\w.]{1,20})?)")
_PROSE = r" [A-Za-z]"
_LINE_REST = r"[^\r\n\"'\\]{0,4096}"
_AUTH_SCHEMES = frozenset("bearer basic token bot apikey sso-key digest negotiate ntlm".split())
# An identifier or dotted name: `api_key = args.api_key` assigns a variable, not a secret.
_CODE_VALUE = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+|[A-Za-z_][A-Za-z0-9_]*"
_SECRET_WORDS = ("pass", "passwd", "password", "passwords", "passphrase", "pwd", "secret", "secrets",
                 "token", "tokens", "key", "keys", "auth", "credential", "credentials", "creds",
                 "signature", "session", "cookie")

# XML: <password>...</password> (Maven settings.xml, any element with a secret's name),
# <add key="ClearTextPassword" value="..."/> (NuGet, .NET appSettings),
_XML_ELEMENT = r"<([A-Za-z][\w.:-]{0,63})>([^<\r\n]{1,2048})</\1>"

# <entry key="password">...</entry>, <property name="token">...</property>
_XML_NAMED = (r"=(?:(?<=key=)|(?<=name=))([\"'])([^\"'\r\n]{1,64})\1(?:[ \t]{1,8}value=([\"'])([^\"'\r\n]{1,2048})\3"
              r"|[^<>\r\n]{0,200}?>([^<\r\n]{1,2048})</)")

# Credentials given to commands as flags, found from " -" on the lowercased copy and
# checked against the command earlier on the line: flag as typed -> (the words that must
# come before it on the line, one tuple per command), and what separates a user name from
# the password in the value ("" for none): curl -u/--user user:PASS, docker/az login -p
# PASS, mysql -pPASS, sshpass -p PASS, smbclient -U user%PASS, redis-cli -a PASS,
# ldapsearch -w PASS, ssh-keygen -N/-P PASS; htpasswd -b FILE USER PASS and openssl ...
# -pass pass:PASS apart; .netrc's `password PASS` (no operator at all).
_CLI_GATE = (rb" -(?:-user[ \t=]|pass(?:in|out|word)?[ \t]{1,8}pass:|[puawn](?=[^\s-])|[puawn][ \t]"
             rb"|[a-z]{0,4}b[a-z]{0,4}[ \t])")
_CLI_VALUE = r"[ \t=]{0,8}(?:'([^'\r\n]{1,512})'|\"([^\"\r\n]{1,512})\"|([^\s'\"]{1,512}))"
# one shell word, quotes and all (curl -u user:'pass')
_CLI_WORD = r"[ \t=]{0,8}((?:'[^'\r\n]{0,512}'|\"[^\"\r\n]{0,512}\"|[^\s'\"]){1,1024})"
# what `curl -u user:PASS` examples put as PASS
_PLACEHOLDER_PASSWORDS = frozenset("test pass password passwd secret token changeme example pw pwd "
                                   "apikey api_key key".split())
_CLI_FLAGS = {
    "p": (((b"docker", b"login"), (b"az", b"login"), (b"sshpass",), (b"mysql",), (b"mariadb",)), ""),
    "u": (((b"curl",),), ":"), "-user": (((b"curl",), (b"wget",)), ":"),
    "U": (((b"smbclient",), (b"rpcclient",)), "%"), "a": (((b"redis-cli",),), ""),
    "w": (((b"ldapsearch",), (b"ldapmodify",), (b"ldapadd",), (b"ldapdelete",), (b"ldapwhoami",),
           (b"ldappasswd",)), ""),
    "N": (((b"ssh-keygen",),), ""), "P": (((b"ssh-keygen",),), ""),
}
_NETRC_GATE = rb"word(?<=password)[ \t]{1,8}(?=[^\s:=])"     # led by its rare w
# A secret piped or fed to a login that reads it from stdin: `echo X | docker login
# --password-stdin`, `gh auth login --with-token <<< X`, `echo X | sudo -S`.
_STDIN_GATE = r"-(?:-password-stdin|-with-token|S\b(?<=sudo -S))"
_STDIN_VALUE = (r"(?:\b(?:echo|printf)(?:[ \t]+-[a-z]{1,3})*[ \t]+(?:'([^'\n]{1,512})'|\"([^\"\n]{1,512})\""
                r"|([^\s|'\"]{1,512}))[ \t]*\||<<<[ \t]*(?:'([^'\n]{1,512})'|\"([^\"\n]{1,512})\"|([^\s'\"]{1,512})))")
# `npm config set //registry/:_authToken VALUE`, `git config [--global] x.token VALUE`: a
# space is the operator after `config set`, `config --...` or a dotted or colon name.
_CONFIG_SET = rb"g(?<=config)((?:[ \t]+(?:set|--[a-z-]{1,20}))*)[ \t]+([^\s=]{1,200})[ \t]+(?=\S)"

# A lone value printed right after a command that prints a secret: the line holding one
# random-looking word, then the line before it checked for such a command.
_LONE_LINE = r"\n(?=([A-Za-z0-9+/=_.~-]{12,4096}))\1[ \t]{0,8}\r?(?:\n|$)"   # (?=(..))\1: no backtracking
_SECRET_COMMAND_WORDS = ("base64", "secret", "vault", "configure", "op ", "print-", "cat ")
_SECRET_COMMAND = (r"(?i:base64 +(?:-d|--decode|-D)\b|kubectl\b.{0,200}\bsecrets?\b"
                   r"|vault +(?:kv +get|read)\b|aws +configure +get +\S*(?:secret|key|token)"
                   r"|\bop +read\b|print-(?:access|identity)-token|secrets +versions +access"
                   r"|keyvault +secret +show|\bcat +\S*(?:secret|token|passw|cred|\.key\b|_key\b|apikey))")

_SCHEME_GATE = rb"b(?:earer[ \t]{1,8}[a-z0-9._~+/-]{8}|asic[ \t]{1,8}[a-z0-9+/]{6})"
_SCHEME_RULE = (r"(?i:bearer)[ \t]{1,8}(?P<bearer>[A-Za-z0-9._~+/-]{8,4096}={0,8})"
                r"|(?i:basic)[ \t]{1,8}(?P<basic>[A-Za-z0-9+/]{6,4096}={0,2})(?![A-Za-z0-9+/=])")

# Percent- and \u-escapes of "=", ":", "@", quotes: a stretch holding one is decoded and
# its rules run on the decoded text (spans mapped back).
_ESCAPE_GATES = (r"%(?:3[DdAa]|40)", r"\\u00(?:22|27|3[DdAa]|40)")
_ESCAPE = r"%[0-9A-Fa-f]{2}|\\u[0-9A-Fa-f]{4}"

# Environment variables whose values are redacted wherever they appear.
_ENV_SECRET_NAME = (r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE"
                    r"|(?:^|_)PWD$|(?:^|_)AUTH(?:$|_)|COOKIE|SIGNING|(?:^|_)DSN$|WEBHOOK")
_ENV_NOT_SECRET_NAME = (r"^TOKENIZERS?_|TOKENS$|_TOKENS_|KEYBOARD|KEYRING|_KEY_?(?:PATH|FILE|ID|NAME)$"
                        r"|_(?:PATH|FILE|DIR|URL|ENDPOINT|HOST|PORT|USER|USERNAME|TYPE|ID|NAME|SOCK)$"
                        r"|^SSH_AUTH_SOCK$|^GPG_KEY$")
_ENV_MIN_LEN = 8


class _Regexes(dict):
    """The built-in rules, each compiled on first use, once per process.

    Compiling all of them costs several ms, a third of a hook's whole run; a hook that
    redacts a few short ids needs the few rules whose literal occurs in its text (see
    _tokens and _context), so each is compiled only when a text first calls for it.
    ("literal", i) is _LITERAL_RULES[i], ("sep", c) the scan for separator c,
    ("prefixed", p) the body of _PREFIXED[p].
    """

    def __missing__(self, key):
        if isinstance(key, tuple):
            kind, name = key
            value = re.compile({"literal": lambda: _LITERAL_RULES[name][0],
                                "upper": lambda: _UPPER_RULES[name],
                                "b64": lambda: _B64_RULES[name],
                                "sep": lambda: _sep_scan(name),
                                "prefixed": lambda: _PREFIXED[name][0],
                                "back": lambda: _BACK[name]}[kind]())
        else:
            value = {
                "literals": lambda: [_literal_prefix(rx) for rx, _ in _LITERAL_RULES],
                "prefix_tails": lambda: _group_by(sorted(_PREFIXED, key=len, reverse=True),
                                                  lambda p: p[-3:]),
                "discord": lambda: re.compile(_DISCORD_RULE),
                "url": lambda: re.compile(_URL_RULE),
                "url_host": lambda: re.compile(_URL_HOST),
                "url_port": lambda: re.compile(_URL_PORT),
                "hook": lambda: re.compile(_HOOK_RULE),
                "token_run": lambda: re.compile(r"[A-Za-z0-9+/=_-]{0,4096}"),
                "pem_header": lambda: re.compile(_PEM_HEADER),
                "pem_tail": lambda: re.compile(_PEM_TAIL),
                "kv_gates": lambda: [re.compile(gate + _KV_OP) for gate in _KV_GATES]
                + [re.compile(_FLAG_GATE), re.compile(_UPPER_KEY_GATE.decode())],
                "kv": lambda: re.compile(_KV_RULE, re.I),
                "kv_amp": lambda: re.compile(_KV_AMP),
                "secret_name": lambda: re.compile(_SECRET_NAME),
                "not_secret_name": lambda: re.compile(_NOT_SECRET_NAME),
                "placeholder": lambda: re.compile(_PLACEHOLDER),
                "code_value": lambda: re.compile(_CODE_VALUE),
                "prose": lambda: re.compile(_PROSE),
                "line_rest": lambda: re.compile(_LINE_REST),
                "xml_element": lambda: re.compile(_XML_ELEMENT),
                "cli_gate": lambda: re.compile(_CLI_GATE),
                "stdin_gate": lambda: re.compile(_STDIN_GATE),
                "stdin_value": lambda: re.compile(_STDIN_VALUE),
                "config_set": lambda: re.compile(_CONFIG_SET),
                "xml_named": lambda: re.compile(_XML_NAMED),
                "cli_value": lambda: re.compile(_CLI_VALUE),
                "cli_word": lambda: re.compile(_CLI_WORD),
                "netrc": lambda: re.compile(_NETRC_GATE),
                "lone_line": lambda: re.compile(_LONE_LINE),
                "secret_command": lambda: re.compile(_SECRET_COMMAND),
                "scheme": lambda: (re.compile(_SCHEME_GATE), re.compile(_SCHEME_RULE)),
                "escape_gates": lambda: [re.compile(gate) for gate in _ESCAPE_GATES],
                "escape": lambda: re.compile(_ESCAPE),
                "env_name": lambda: re.compile(_ENV_SECRET_NAME, re.I),
                "env_not_name": lambda: re.compile(_ENV_NOT_SECRET_NAME, re.I),
                "env_plain": lambda: re.compile(
                    r"[a-z]+|[A-Z]+|[0-9.,:_-]+|(?:\.{0,2}|~)/.*|[A-Za-z]:\\.*", re.S),
            }[key]()
        self[key] = value
        return value


_COMPILED = _Regexes()


def _sep_scan(sep):
    """The scan for the tokens of _PREFIXED whose prefix ends in `sep`: `sep` and 8 token
    characters (base64 ones after "_": Fly.io, Grafana Cloud), after the last two characters
    of a prefix (a quick filter), then after a whole prefix and its left boundary (`risk-`,
    `::test_` never reach Python); or a shape of _SEP_INSIDE."""
    prefixes = sorted(p for p in _PREFIXED if p[-1] == sep)
    edges = {"": "", "w": "(?<![A-Za-z0-9])", "t": "(?<![A-Za-z0-9_-])"}
    whole = ["(?<=%s)" % "|".join(edges[_PREFIXED[p][1]] + re.escape(p) for p in group)
             for group in _group_by(prefixes, len).values()]
    if sep == "-":
        whole.append("(?<=sk-)(?=[A-Za-z0-9]{0,392}T3BlbkFJ)")    # OpenAI's marker, see _prefix_at
    return r"%s(?=%s{8})(?:(?<=(?:%s)%s)(?:%s)%s)" % (
        re.escape(sep), "[A-Za-z0-9+/_-]" if sep == "_" else "[A-Za-z0-9_-]",
        "|".join(sorted({re.escape(p[-3:-1]) for p in prefixes})), re.escape(sep),
        "|".join(whole), "|" + _SEP_INSIDE[sep][0] if sep in _SEP_INSIDE else "")


def _literal_prefix(pattern):
    """The literal text every match of a token rule starts with: its characters up to the
    first metacharacter (tests/test_kernel.py checks this against the regex parser)."""
    for index, ch in enumerate(pattern):
        if ch in "\\.^$*+?{}[]()|":
            return pattern[:index - 1] if ch in "*?{" else pattern[:index]
    return pattern


def _is_placeholder(value):
    """True for values that stand for a secret rather than being one: `${VAR}`, `$VAR`,
    `%VAR%`, `{{ var }}`, `<...>`, `your-...-here`, runs of `*`, `x`, `•`, masks such as
    `[REDACTED]` or `gho_****`, documentation examples (AWS's `...EXAMPLEKEY`), versions,
    the empty string."""
    low = value.lower()
    return (not value or value[0] in "$%<{*[" or "redacted" in low or "{{" in value
            or "****" in value or "EXAMPLE" in value or low in _NOT_SECRET or value.strip(value[0]) == ""
            or value.startswith("...") or _COMPILED["placeholder"].fullmatch(value) is not None
            or value.isupper() and value.replace("_", "").isalpha())   # --token TOKEN


def _names_a_variable(value):
    """True if `value` reads as a variable (`token=access_token`, `apiKey: userApiKey`,
    `password=password`, `key = aws_access_key_id`): an identifier without digits that ends
    in a secret's word, or a snake_case one that holds one."""
    low = value.lower()
    return not any(c.isdigit() for c in value) and (low.endswith(_SECRET_WORDS) or (
        "_" in value and value == low and any(word in low for word in _SECRET_WORDS)))


def _looks_random(value):
    """True for a value that reads like a generated secret rather than a word, a path,
    a number or a version: letters and digits mixed, or both cases."""
    if value[0] in "/.~" or "://" in value or value.isdigit():
        return False
    digits = any(c.isdigit() for c in value)
    letters = [c for c in value if c.isalpha()]
    if not letters:
        return False
    mixed = value.lower() != value != value.upper()
    return (digits and (mixed or len(value) >= 16)) or (mixed and len(value) >= 16)


def _env_value_forms(value):
    """The strings that reveal `value`: itself, its lines, base64 (three alignments, so it
    is found inside base64("user:" + value) too), URL-, JSON- and \\u-escaped forms."""
    import binascii  # built in; the base64 module and urllib.parse cost a hook ~2 ms to import
    forms = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1],
             "".join("\\u%04x" % ord(c) for c in value if ord(c) < 0x10000),
             "".join("\\u%04X" % ord(c) for c in value if ord(c) < 0x10000)}
    if not re.fullmatch(r"[A-Za-z0-9_.~-]*", value):  # else both quotes are the value itself
        from urllib.parse import quote, quote_plus
        forms.update((quote(value, safe=""), quote_plus(value)))
    forms.update(line.strip() for line in value.splitlines() if len(line.strip()) >= _ENV_MIN_LEN)
    raw = value.encode("utf-8", "surrogateescape")
    for lead in (0, 1, 2):
        encoded = binascii.b2a_base64(b"\0" * lead + raw, newline=False).decode("ascii")
        encoded = encoded[(0, 2, 3)[lead]:]       # chars that depend on the prefix
        rest = (lead + len(raw)) % 3
        if rest:                                  # last char depends on what follows
            encoded = encoded[:-(4 - rest)]
        forms.add(encoded)
        if not lead:                              # base64url (JWT payloads, URLs)
            forms.add(encoded.replace("+", "-").replace("/", "_"))
    return [form for form in forms if len(form) >= _ENV_MIN_LEN]


def config_secrets(config):
    """The values the config hands to other programs as secrets: the values of every `env`
    map (executor.env, doctor.env, changes.mcp.env, ...) under a secret's name or that look
    generated (not a model name, path or URL), and every string under a secret-named key
    (observability.token, ...). An agent given one may print it back."""
    found = []

    def walk(node, in_env):
        if isinstance(node, dict):
            for key, value in node.items():
                name = str(key).lower()
                if not isinstance(value, str):
                    walk(value, name == "env")
                elif any(word in name for word in _SECRET_WORDS) and _COMPILED["secret_name"].search(
                        name) or in_env and (
                        _COMPILED["env_name"].search(name) and not _COMPILED["env_not_name"].search(name)
                        or "/" not in value and _looks_random(value.strip() or "/")):
                    found.append(value)
        elif isinstance(node, list):
            for value in node:
                walk(value, False)
    walk(config or {}, False)
    return found


def _matches_at(low, gates, text):
    """For each hit of gates[0] (a bytes regex) in the lowercased copy, gates[1].match(text)
    at that position; the search resumes after each match, so the work stays linear."""
    gate, regex = gates
    pos = 0
    while True:
        g = gate.search(low, pos)
        if g is None:
            return
        m = regex.match(text, g.start())
        if m:
            yield m
        pos = max(m.end() if m else 0, g.end())


def _unescape_one(m):
    """The character a %XX or \\uXXXX escape stands for."""
    code = m.group()
    return chr(int(code[1:] if code[0] == "%" else code[2:], 16))


def _unescape_offsets(text, start, end, escapes):
    """For text[start:end] decoded (_unescape_one): where each decoded character starts in
    `text`, plus one entry for `end`."""
    offsets, at = [], start
    for m in escapes.finditer(text, start, end):
        offsets.extend(range(at, m.start()))
        offsets.append(m.start())
        at = m.end()
    offsets.extend(range(at, end + 1))
    return offsets


class Redactor:
    """Replaces secrets in text with REDACTED; see the comment above for what and how.

    Redactor(extra_patterns=(), env=None, known=()): `extra_patterns` are regexes whose
    whole match is redacted (a bad one raises BridgeError naming it); `env` (default
    os.environ) gives the secret-named variables whose values are redacted in every form;
    `known` more such values, whatever their name (the config's env maps, see
    config_secrets).
    """

    def __init__(self, extra_patterns=(), env=None, known=()):
        rx = self._rx = _COMPILED
        self.extra = []
        for pattern in extra_patterns:
            if not isinstance(pattern, str) or not pattern:
                raise BridgeError("redaction_patterns: %r is not a regex string" % (pattern,))
            try:
                self.extra.append(re.compile(pattern))
            except re.error as exc:
                raise BridgeError("redaction_patterns: %r is not a valid regex: %s"
                                  % (pattern, exc))
        env = os.environ if env is None else env
        values = set()
        candidates = [value for name, value in env.items() if rx["env_name"].search(name)
                      and not rx["env_not_name"].search(name)] + list(known)
        for value in candidates:
            value = value.strip()
            if (len(value) >= _ENV_MIN_LEN and not rx["env_plain"].fullmatch(value)
                    and not _is_placeholder(value)):
                values.update(_env_value_forms(value))
        self.values = sorted(values, key=len, reverse=True)   # longest first

    # -- public API --

    def redact(self, text):
        """`text` with every secret span replaced by REDACTED; everything else unchanged.
        Bytes are redacted too (as UTF-8, undecodable bytes kept as they are)."""
        if not text:
            return text
        if isinstance(text, (bytes, bytearray)):
            decoded = bytes(text).decode("utf-8", "surrogateescape")
            return self.redact(decoded).encode("utf-8", "surrogateescape")
        if not isinstance(text, str):
            raise TypeError("redact() takes str or bytes, not %s" % type(text).__name__)
        return _replace_spans(text, self.spans(text))

    def stream(self):
        """A RedactStream: redacts text that arrives in pieces (see there)."""
        return RedactStream(self)

    def redact_obj(self, obj):
        """A copy of a JSON-like object with every string (keys included) redacted, and the
        string values of secret-named keys ("password", "api_key", "Authorization", ...)
        replaced whole (an auth scheme word is kept), since a bare value carries no context."""
        if isinstance(obj, str):
            return self.redact(obj)
        if isinstance(obj, dict):
            out = {}
            for key, value in obj.items():
                if isinstance(value, str) and isinstance(key, str) and self._secret_key(key):
                    value = self._secret_value(value)
                out[self.redact(key) if isinstance(key, str) else key] = self.redact_obj(value)
            return out
        if isinstance(obj, (list, tuple)):
            return [self.redact_obj(value) for value in obj]
        return obj

    def _secret_key(self, key):
        name = key.lower().rstrip(".-_")
        return bool(self._rx["secret_name"].search(name, max(0, len(name) - 24))
                    and not self._rx["not_secret_name"].search(name))

    @staticmethod
    def _secret_value(value):
        word, _, rest = value.partition(" ")
        scheme = word.lower() in _AUTH_SCHEMES and rest.strip()
        secret = rest.strip() if scheme else value
        if not secret or _is_placeholder(secret) or secret.lower() in _AUTH_SCHEMES:
            return value
        return word + " " + REDACTED if scheme else REDACTED

    # -- the layers --

    def spans(self, text, decoded=False):
        """The (start, end) spans of `text` to redact (unsorted, may overlap)."""
        spans = []
        backslash = "\\" in text                 # (one memchr: "\\u" in text is a slow search)
        for value in self.values:
            if value[0] == "\\" and not backslash:
                continue                          # the \uXXXX forms
            find, size, at = text.find, len(value), 0
            while True:
                at = find(value, at)
                if at < 0:
                    break
                spans.append((at, at + size))
                at += size
        low = text.encode("ascii", "replace").lower()    # same offsets: one byte a character
        self._tokens(text, low, spans)
        self._context(text, low, spans)
        self._commands(text, low, spans)
        if not decoded:
            self._escaped(text, spans)
        for regex in self.extra:
            for m in regex.finditer(text):
                if m.end() > m.start():
                    spans.append(m.span())
        return spans

    def _tokens(self, text, low, spans):
        rx = self._rx
        short = len(text) <= 65536
        self._prefixed(text, spans, short)
        for index, head in enumerate("AELGS"):
            if head not in text:
                continue
            for m in rx["upper", index].finditer(text):
                start, token = m.start(), m.group()
                if start and (text[start - 1].isalnum() or text[start - 1] in "+/") \
                        or _placeholder_body(token[4:]):
                    continue                       # inside base64; AKCpXXXX... placeholders
                if token[1] in "KSBC3" and token[:2] != "AC" and len(token) == 20 and (
                        not any(c.isdigit() for c in token[4:]) or token.endswith("EXAMPLE")):
                    continue                       # AWS-shaped word (no digit), AWS's doc example
                if token[:2] in ("SK", "AC") and (token[2:].isdigit() or token[2:].isalpha()):
                    continue
                spans.append((start, _token_end(text, m.end())))
        # Prefilters: a rule whose literal is not in a short text (a hook's ids, one log line)
        # is not even compiled; a long text is looked up for its first character only (one
        # memchr: a search for several costs as much as the rule's own literal-led scan).
        for index, literal in enumerate(rx["literals"]):
            if (literal if short else literal[0]) not in text:
                continue
            back = _LITERAL_RULES[index][1]
            for m in rx["literal", index].finditer(text):
                start, end = m.start() - back, _token_end(text, m.end())
                if _placeholder_body(m.group()[len(literal):]):
                    continue
                if literal == "AA":                # Telegram: the bot id digits before ":"
                    colon = start
                    while start > 0 and start > colon - 12 and text[start - 1].isdigit():
                        start -= 1
                    if colon - start < 6 or (start and text[start - 1].isalnum()
                                                 and not text.startswith("bot", start - 3)):
                        continue
                spans.append((start, end))
        for index, heads in enumerate((("LS0tLS1",), ("Z2", "ZXlK"), ("QUtJQ", "QVNJQ"))):
            if not any((head if short else head[0]) in text for head in heads):
                continue
            for m in rx["b64", index].finditer(text):
                if (m.start() and (text[m.start() - 1].isalnum() or text[m.start() - 1] in "+/")) \
                        or not self._b64_secret(m.group()):
                    continue
                spans.append(m.span())
        if b"discord" in low:
            for m in rx["discord"].finditer(text):
                seg = m.start()                        # back over the 24-26 char id part
                while seg > max(0, m.start() - 26) and (text[seg - 1].isalnum()
                                                        or text[seg - 1] in "_-"):
                    seg -= 1
                spans.append((seg, m.end()))
        if "://" in text:
            self._urls(text, spans)
        self._pem(text, spans)

    def _prefixed(self, text, spans, short):
        """Tokens of _PREFIXED: a scan per separator, a dict lookup of the prefix before it."""
        rx = self._rx
        tails = rx["prefix_tails"]
        for sep in "_-.~":
            if sep not in text or short and not any(
                    text[at - 2:at + 1] in tails for at in _positions(text, sep)) \
                    and not (sep in _SEP_INSIDE and _SEP_INSIDE[sep][3] in text):
                continue                          # (no scan to compile for a hook's ids)
            pos = 0
            for m in rx["sep", sep].finditer(text):
                at = m.start()
                if at < pos:
                    continue
                end = self._prefix_at(text, at, tails.get(text[at - 2:at + 1], ()), spans)
                if end is None and sep in _SEP_INSIDE:   # the scan's other branch?
                    _, before, size, literal, offset = _SEP_INSIDE[sep]
                    start = at - before
                    if start >= 0 and text.startswith(literal, at + offset) and (
                            not start or not text[start - 1].isalnum()):
                        end = start + size
                        spans.append((start, end))
                pos = end or pos

    def _prefix_at(self, text, end, prefixes, spans):
        """If one of `prefixes` (longest first) ends at text[end] and its body follows,
        record the token's span and return where it ends (else None)."""
        rx = self._rx
        for prefix in prefixes:
            start = end + 1 - len(prefix)
            if start < 0 or not text.startswith(prefix, start):
                continue
            m = rx["prefixed", prefix].match(text, end + 1)
            if not m:
                continue
            if prefix in _BACK:
                back = rx["back", prefix]
                begin = start - 14
                if begin < 0 or not back.fullmatch(text, begin, start):
                    continue
                start = begin
            edge = _PREFIXED[prefix][1]
            before = text[start - 1] if start else " "
            if prefix == "sk-" and "T3BlbkFJ" in m.group():
                edge = ""                          # OpenAI's marker: a key wherever it is
            if (edge == "w" and before.isalnum()) or (edge == "t" and (before.isalnum() or before in "_-")):
                continue
            if prefix == "sk-" and not any(c.isdigit() for c in m.group()):
                continue                           # bare sk-: 20+ chars AND a digit
            if _placeholder_body(m.group()):
                continue
            end = _token_end(text, m.end())
            spans.append((start, end))
            return end
        return None

    def _b64_secret(self, blob):
        """True if base64 `blob` decodes to a private key or text holding a token."""
        import binascii
        try:
            raw = binascii.a2b_base64(blob + "=" * (-len(blob) % 4))
        except (binascii.Error, ValueError):
            return False
        decoded = raw.decode("latin-1")
        if "PRIVATE KEY" in decoded[:200]:
            return True
        spans = []
        self._tokens(decoded, raw.lower(), spans)
        return bool(spans)

    def _urls(self, text, spans):
        """URL userinfo passwords (to the last "@" before the host) and webhook paths."""
        rx = self._rx
        hook = rx["hook"]
        for m in rx["url"].finditer(text):
            region, base = m.group(1), m.start(1)
            if "@" not in region and "hook" not in region and "discord" not in region:
                continue                               # neither userinfo nor a webhook path
            # the region may hold several URLs (`a=https://u:p@h,b=https://...`): one per "://"
            firsts = [0] + [at + 3 for at in _positions(region, "://")]
            for index, first in enumerate(firsts):
                stop = firsts[index + 1] - 3 if index + 1 < len(firsts) else len(region)
                h = hook.match(text, base + first, base + stop)
                if h:
                    spans.append(h.span(1))
                at = region.rfind("@", first, stop)
                colon = region.find(":", first, at)
                if colon < 0 or not rx["url_host"].match(region, at + 1):
                    continue
                user, password = region[first:colon], region[colon + 1:at]
                if any(c in user for c in "/?#") or rx["url_port"].match(password) \
                        or _is_placeholder(password):
                    continue
                spans.append((base + colon + 1, base + at))

    def _pem(self, text, spans):
        rx = self._rx
        at, next_end = 0, -1
        while True:
            at = text.find("-----BEGIN", at)
            if at < 0:
                break
            m = rx["pem_header"].match(text, at)
            if not m:
                at += 10
                continue
            body = m.end()
            if next_end < body:                  # one search serves a flood of headers
                next_end = text.find("-----END", body)
                if next_end < 0:
                    next_end = sys.maxsize       # none anywhere: never in the window
            end = next_end if next_end - body <= _PEM_WINDOW else -1
            if end < 0:
                end = rx["pem_tail"].match(text, body).end()
            if text[body:end].strip():
                spans.append((body, end))
            at = max(end, body)

    def _context(self, text, low, spans):
        rx = self._rx
        mask = None
        short = len(text) <= 65536  # see _tokens
        # Every key=value gate needs an assignment operator (":", "=" or "%3d") after the
        # key, the --flag gate a "--": without them no gate can match (nor needs compiling).
        gates = rx["kv_gates"] if ":" in text or "=" in text or "--" in text or "%3" in text else ()
        for gate in gates:
            haystack = text if isinstance(gate.pattern, str) else low    # _KEY: case matters
            search, pos = gate.search, 0
            while True:
                g = search(haystack, pos)
                if g is None:
                    break
                pos, at = g.end(), g.start(1)      # at: where the name ends
                m = rx["kv"].match(text, at)
                if not m:
                    continue
                pos = m.end()              # rejected or not, never rescan this value
                if mask is None:   # name characters -> "n", others -> " " (one C pass)
                    mask = low.translate(_NAME_MASK)
                start = mask.rfind(b" ", max(0, at - 64), at) + 1 or max(0, at - 64)
                name = low[start:at].decode("ascii").rstrip(".-_")
                weak = False
                if not self._secret_key(name):
                    # UPPER_CASE_KEY=<random> (env-style names) counts too
                    if not (name.endswith("_key") and text[start:at].isupper()):
                        continue
                    weak = True
                if start >= 3 and text.startswith("://", start - 3):
                    continue               # URL userinfo: the URL rule handles it
                if start and text[start - 1] == ":" and m.group("op").strip() == ":":
                    continue               # arn:aws:secretsmanager:...:secret:NAME
                group = m.lastgroup
                value = m.group(group)
                if not m.group("op").strip() and not name.startswith("-"):
                    continue               # `token count`: a space only counts after --flag
                begin = m.start(group)
                if group != "bare" and not m.group("scheme"):    # "Bearer xyz" inside quotes
                    word, _, rest = value.partition(" ")
                    if word.lower() in _AUTH_SCHEMES:
                        stripped = rest.lstrip(" ")
                        begin += len(value) - len(stripped)
                        value = stripped
                if (not value or value[0] in ":=" or _is_placeholder(value) or group != "bare"
                        and value[0] in " \t" or value.lstrip("-").isdigit() and len(value) < 6
                        or value.lower() in _AUTH_SCHEMES):
                    if group != "bare":        # look inside: "${X} password=hunter2"
                        pos = min(pos, begin + (value.find(" ") + 1 or len(value)) + 1)
                    continue
                if m.group("scheme") and value.isalpha() and value.islower():
                    continue               # "Auth: token from the header" is prose
                if m.group("op") == ":" and value.isalpha() and not value.islower():
                    continue               # "eks-auth:AssumeRole": a name, not a secret
                if group != "bare" and rx["code_value"].fullmatch(value) and (
                        value.count(".") > 1 or _names_a_variable(value)):
                    continue               # "next_token", "serverAuth", "pkg.mod.func" quoted
                end = m.end(group)
                if group == "bare" and not m.group("scheme"):
                    after = text[end:end + 1]
                    if value.isalpha() and rx["prose"].match(text, end):
                        continue           # `Password: Enter your password` is prose
                    if after in ("(", "[") or "||" in value or "&&" in value or rx["code_value"].fullmatch(value) and (
                            "." not in value or not any(_looks_random(part) for part in value.split("."))) and (
                            value[0].isupper() and value.isalpha() and (
                                text[end:end + 1] in (",", "=", ")", "]") or text[end:end + 2] in (" |", " =")) or
                            "." in value or _names_a_variable(value)
                            or len(value) < 8 and value.islower() and not any(c.isdigit() for c in value)):
                        continue           # code: `password = getpass()`, `token=token`, `key: str`, `a||b`
                    if m.group("op").lower().strip() == "%3d":
                        cut = value.lower().find("%26")     # percent-encoded "&": the next field
                        if cut >= 0:
                            end = begin + cut
                    elif after == "&":
                        amp = rx["kv_amp"].match(text, end)
                        if amp:
                            end = amp.end()
                if weak and not (len(value) >= 16 and any(c.isdigit() for c in value)):
                    continue
                if name.endswith(("sig", "signature")) and not _looks_random(value):
                    continue               # sig='ii->i': a ufunc's, a function's signature
                if name.endswith("cookie"):    # every cookie in the header, not just the first
                    end = rx["line_rest"].match(text, begin).end()
                spans.append((begin, end))
                pos = max(pos, end)
        schemes = not short or b"bearer" in low or b"basic" in low
        for m in _matches_at(low, rx["scheme"], text) if schemes else ():
            value = m.group(m.lastgroup)
            if m.lastgroup == "bearer":
                if any(c.isdigit() for c in value) or (value.lower() != value and value.upper() != value):
                    spans.append(m.span("bearer"))
                continue
            import binascii
            try:
                decoded = binascii.a2b_base64(value + "=" * (-len(value) % 4))
            except (binascii.Error, ValueError):
                continue
            if b":" in decoded and decoded.isascii() and decoded.decode("ascii").isprintable():
                spans.append(m.span("basic"))  # "user:password" ("Basic Options" is prose)
        if not short or "</" in text:
            for m in rx["xml_element"].finditer(text):
                name = m.group(1).lower().rpartition(":")[2]
                if self._secret_key(name) and not _is_placeholder(m.group(2).strip()):
                    spans.append(m.span(2))
        if not short or "key=" in text or "name=" in text:
            for m in rx["xml_named"].finditer(text):
                group = 4 if m.group(4) is not None else 5
                if self._secret_key(m.group(2)) and not _is_placeholder(m.group(group).strip()):
                    spans.append(m.span(group))

    def _commands(self, text, low, spans):
        """Credentials given to commands as flags, .netrc passwords, and a lone value
        printed by a command whose job is to print a secret."""
        rx = self._rx
        short = len(text) <= 65536
        if not short or b" -" in low:
            for g in rx["cli_gate"].finditer(low):
                flag = low[g.start() + 2:g.end()].rstrip(b" \t=").decode("ascii")
                start = _line_start(low, g.start(), b"\n", 512)
                if low[max(0, start - 3):start].rstrip(b"\r\n").endswith(b"\\"):
                    start = _line_start(low, start - 2, b"\n", 512)      # `curl ... \` above
                line = low[start:g.start()]
                if flag.startswith("pass") and b"pass:" in low[g.start():g.end()]:
                    value = rx["cli_value"].match(text, g.end())      # openssl pass:VALUE
                    if value:
                        spans.append(value.span(value.lastindex))
                    continue
                word = low[g.start() + 2:g.start() + 12].split(None, 1)[0].decode("ascii")
                if "b" in word and word.isalpha() and b"htpasswd" in line:
                    self._htpasswd(text, g.start() + 2 + len(word), word, spans)
                    continue
                if len(flag) > 1 and flag != "-user":
                    continue
                if len(flag) == 1:
                    flag = text[g.start() + 2]          # as typed: -P3306 is mysql's port
                commands, separator = _CLI_FLAGS.get(flag, ((), ""))
                if not any(all(word in line for word in words) for words in commands):
                    continue
                if flag == "p" and text[g.start() + 3] in " \t" and not any(
                        word in line for word in (b"docker", b"az", b"sshpass")):
                    continue                        # mysql -p DB: -p alone asks for it
                value = rx["cli_word" if separator else "cli_value"].match(text, g.start() + 2 + len(flag))
                if not value:
                    continue
                begin, end = value.span(value.lastindex)
                if separator:                       # user:password, the password goes
                    word = text[begin:end]
                    cut = word.find(separator)
                    user, password = word[:cut].strip("'\""), word[cut + 1:].strip("'\"")
                    if cut < 0 or _is_placeholder(word.strip("'\"")) or user == password \
                            or password.lower() in _PLACEHOLDER_PASSWORDS:
                        continue
                    if password:
                        begin += cut + 1
                        begin += text[begin] in "'\""           # user:'password'
                        end -= text[end - 1] in "'\""            # 'user:password'
                    else:                           # -u "sk_test_...:": the key is the user
                        end = begin + cut
                        begin += text[begin] in "'\""
                if begin < end and not _is_placeholder(text[begin:end].strip("'\"")):
                    spans.append((begin, end))
        if not short or b"config" in low:
            for g in rx["config_set"].finditer(low):
                name = g.group(2).decode("ascii").rstrip(".-_")
                if (g.group(1) or "." in name or ":" in name) and self._secret_key(name):
                    value = rx["cli_value"].match(text, g.end())
                    if value and not _is_placeholder(value.group(value.lastindex)):
                        spans.append(value.span(value.lastindex))
        done = 0
        for g in rx["stdin_gate"].finditer(text) if not short or "--" in text or "sudo" in text else ():
            if g.start() < done:
                continue                                # its line was looked at
            start = max(_line_start(text, g.start(), "\n"), done)
            done = text.find("\n", g.end(), g.end() + 4096)
            done = g.end() + 4096 if done < 0 else done
            for m in rx["stdin_value"].finditer(text, start, done):
                if not _is_placeholder(m.group(m.lastindex)):
                    spans.append(m.span(m.lastindex))
        if not short or b"password" in low:
            for g in rx["netrc"].finditer(low):
                line = low[_line_start(low, g.start(), b"\n", 512):g.start() - 4]    # before "password"
                if line.strip() and b"machine " not in line and b"login " not in line:
                    continue
                value = rx["cli_value"].match(text, g.end())
                if not value or _is_placeholder(value.group(value.lastindex)):
                    continue
                rest = low[value.end():value.end() + 12].lstrip(b" \t")
                if not line.strip() and rest[:1] not in (b"", b"\n", b"\r") and not rest.startswith(
                        (b"machine", b"login", b"account", b"macdef", b"default")):
                    continue                       # "password used to unlock ..." is prose
                spans.append(value.span(value.lastindex))
        lone = not short or "\n" in text and any(word in text.lower() for word in _SECRET_COMMAND_WORDS)
        for m in rx["lone_line"].finditer(text) if lone else ():
            value = m.group(1)
            if not _looks_random(value) or _is_placeholder(value):
                continue
            line_end = m.start()
            if line_end and text[line_end - 1] == "\r":
                line_end -= 1
            before = text[_line_start(text, line_end, "\n"):line_end]
            if any(word in before.lower() for word in _SECRET_COMMAND_WORDS) \
                    and rx["secret_command"].search(before):
                spans.append(m.span(1))

    @staticmethod
    def _htpasswd(text, pos, flag, spans):
        """htpasswd -b[...] FILE USER PASSWORD (-n: no FILE): the password goes."""
        wanted, words = 2 if "n" in flag else 3, text[pos:pos + 600].split("\n", 1)[0].split(None, 6)
        args = [word for word in words[:6] if not word.startswith("-")]
        if len(args) >= wanted:
            at = pos
            for word in args[:wanted]:                 # where the password word is
                at = text.find(word, at) + len(word)
            spans.append((at - len(args[wanted - 1]), at))

    def _escaped(self, text, spans):
        """The rules again on stretches holding a percent- or \\u-escaped "=", ":", "@" or
        quote, decoded; found spans are mapped back onto the escaped text."""
        rx = self._rx
        if "%" not in text and "\\" not in text:
            return
        for lead, gate in zip("%\\", rx["escape_gates"]):
            if lead not in text:
                continue
            done = 0
            while True:                           # one pass per line (8 KiB at most)
                g = gate.search(text, done)
                if g is None:
                    break
                start = max(_line_start(text, g.start(), "\n"), done - 256)   # overlap: a value cut
                end = text.find("\n", g.end(), g.end() + 4096)
                end = min(len(text), g.end() + 4096) if end < 0 else end
                found = self.spans(rx["escape"].sub(_unescape_one, text[start:end]), decoded=True)
                if found:                         # map back only what was found
                    offsets = _unescape_offsets(text, start, end, rx["escape"])
                    spans.extend((offsets[a], offsets[b]) for a, b in found)
                done = end


def _token_end(text, end):
    """Where a token that ends at `end` really ends: a format's upper bound is not the
    end of the run of token characters after it (no raw tail left behind)."""
    if end < len(text) and (text[end].isalnum() or text[end] in "+/=_-"):
        end = _COMPILED["token_run"].match(text, end).end()
    return end


def _placeholder_body(body):
    """True for a token body that is a placeholder: `x`, `X`, `*` or `•` make up 80% of it
    (`ops_eyJxxxx…`, `AKCpXXXX…`, `A3-XXXXXX-XXXXX…`, `fo1_xxxxxxxx`)."""
    body = body.rstrip("=")
    return len(body) >= 8 and max(body.count(c) for c in "xX*•") >= 0.8 * len(body)


def _positions(text, sub):
    """The positions of `sub` (a character, or "://": never overlapping itself) in `text`
    (a short one), in order."""
    at = text.find(sub)
    while at >= 0:
        yield at
        at = text.find(sub, at + 1)


def _group_by(items, key):
    """{key(item): [items with that key, in order]}."""
    groups = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups


def _line_start(text, at, newline, limit=4096):
    """Where the line holding `at` starts, looking back `limit` characters at most."""
    low = max(0, at - limit)
    return text.rfind(newline, low, at) + 1 or low


def _replace_spans(text, spans):
    """`text` with each span (merged where they overlap or touch) replaced by REDACTED."""
    if not spans:
        return text
    spans.sort()
    out, last = [], 0
    for start, end in spans:
        if end <= last:
            continue
        while end - start >= 2048:         # a rule's bound, not the value's end: no raw tail
            more = re.match(r"[^\s\"'<>]{1,4096}", text[end:end + 4096])
            if not more or text.startswith("-----", end):      # a PEM block's END line
                break
            end += more.end()
        start = max(start, last)
        if start > last or not out:
            out.append(text[last:start])
            out.append(REDACTED)
        elif out[-1] != REDACTED:          # adjacent spans: one marker
            out.append(REDACTED)
        last = end
    out.append(text[last:])
    return "".join(out)


def _last_word(text):
    """[the span of the word `text` ends with] (at most 4096 characters), or [] when it ends
    with none or with REDACTED."""
    m = re.match(r"[^\s\"'<>]{1,4096}", text[-4096:][::-1])  # reversed: a search for \Z is quadratic
    return [(len(text) - m.end(), len(text))] if m and m.group() != REDACTED[::-1] else []


class RedactStream:
    """Redacts text that arrives in pieces (a child's output, a pipe): feed() returns the
    redacted text that is safe to pass on now, close() the rest.

    A piece is held back until its line is complete, so a secret split across pieces is
    seen whole; a private key block is held until its END line (64 KiB at most), and a
    line without end is passed on in 64 KiB steps, cut between words. The line before each
    piece stays as context (a lone secret after a command that prints one).
    Works on str, or on bytes (UTF-8, undecodable bytes kept).
    """

    HOLD = 65536

    def __init__(self, redactor):
        self.redactor = redactor
        self.pending = ""
        self.context = ""
        self.binary = None

    def feed(self, data):
        if self.binary is None:
            self.binary = isinstance(data, (bytes, bytearray))
        if self.binary:
            data = bytes(data).decode("utf-8", "surrogateescape")
        self.pending += data
        return self._emit(*self._cut())

    def close(self):
        return self._emit(len(self.pending))

    def _cut(self):
        """Where the text safe to pass on ends, and whether that cuts a word."""
        text = self.pending
        cut = text.rfind("\n") + 1
        begin = text.rfind("-----BEGIN", 0, cut)
        if begin >= 0 and text.find("-----END", begin, cut) < 0 and len(text) - begin < self.HOLD:
            cut = text.rfind("\n", 0, begin) + 1
        if not cut and len(text) >= self.HOLD:
            # A line without end is cut between words: after a space, quote or comma (no
            # token holds one; minified JSON has no spaces). A run with none is cut hard,
            # and the word at the cut goes: it may be the start of a token.
            limit = len(text) - 4096
            cut = max(text.rfind(c, 0, limit) for c in " \t\"',") + 1
            return (cut, False) if cut else (limit, True)
        return cut, False

    def _emit(self, cut, cut_end=False):
        if not cut:
            return b"" if self.binary else ""
        piece, self.pending = self.pending[:cut], self.pending[cut:]
        context = self.context
        whole = context + piece
        spans = [(max(a - len(context), 0), b - len(context))
                 for a, b in self.redactor.spans(whole) if b > len(context)]
        if cut_end:  # a hard cut (see _cut): the word there may start a token
            spans.extend(_last_word(piece))
        out = _replace_spans(piece, spans)
        self.context = piece[piece.rfind("\n", 0, len(piece) - 1) + 1:][-4096:]
        return out.encode("utf-8", "surrogateescape") if self.binary else out


_REDACTORS = {}


def get_redactor(config=None, env=None):
    """The process-wide Redactor for `config`'s redaction_patterns and the secrets it
    hands out (config_secrets; built once per process, with the secret-named environment
    variables of that moment). With `env`, a Redactor of its own for that environment: a
    child given secrets of its own (proxy doctor.env) echoes them."""
    patterns = tuple((config or {}).get("redaction_patterns") or ())
    known = tuple(config_secrets(config))
    if env is not None:
        return Redactor(patterns, env=env, known=known)
    redactor = _REDACTORS.get((patterns, known))
    if redactor is None:
        redactor = _REDACTORS[patterns, known] = Redactor(patterns, known=known)
    return redactor


# ---- subprocesses -------------------------------------------------------------

class CommandResult:
    """What a finished command did. exit_code is None when it was killed for a timeout or
    for printing nothing for `idle` seconds."""

    __slots__ = ("cmd", "exit_code", "stdout", "stderr", "timed_out", "duration",
                 "signal", "dropped_bytes", "error", "idle", "held")

    def __init__(self, cmd, exit_code=None, stdout="", stderr="", timed_out=False,
                 duration=0.0, signal=None, dropped_bytes=0, error=None, idle=None, held=False):
        self.cmd = cmd
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out
        self.duration = duration
        self.signal = signal
        self.dropped_bytes = dropped_bytes
        self.error = error
        self.idle = idle
        self.held = held  # its output pipes were still open 2 s after its group was killed

    @property
    def ok(self):
        return self.exit_code == 0 and not self.timed_out

    def describe(self):
        """'exit 1', 'timed out after 30.0s', 'killed by signal 9' or the start error."""
        if self.error:
            return self.error
        if self.timed_out:
            return "timed out after %.1fs" % self.duration
        if self.idle:
            return "printed nothing for %gs and was stopped" % self.idle
        if self.signal:
            return "killed by signal %d" % self.signal
        return "exit %s" % self.exit_code


def wait_exited(pid, timeout):
    """Wait at most `timeout` seconds for child `pid` to exit; True once it has.

    The child is not reaped: until it is, its pid (and so its process group id)
    cannot be reused, so the group can still be signalled safely after its leader
    exited.
    """
    deadline, delay = time.monotonic() + timeout, 0.0005
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:  # already reaped
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.05)


def signal_group(pgid, sig):
    """Send `sig` to process group `pgid`; False when the group is gone or is not ours to
    signal (not an error: every caller is making sure something ends)."""
    try:
        os.killpg(pgid, sig)
        return True
    except OSError:
        return False


def kill_process_group(proc, grace=5.0):
    """End the process group of `proc`: SIGTERM, `grace` seconds for the leader to
    exit, then SIGKILL to whatever of the group is left, then reap the leader.

    Grandchildren die too: bridge.py starts every child in its own session, so the
    group holds everything the child spawned that did not leave it on purpose.
    grace=0 is for a leader that already exited: its group is killed at once.
    """
    import signal
    import subprocess
    if grace and not wait_exited(proc.pid, 0):
        signal_group(proc.pid, signal.SIGTERM)
        wait_exited(proc.pid, grace)
    signal_group(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass


def cut_middle(head, tail, cut):
    """(head + a line saying `cut` bytes were cut here + tail, bytes cut) for output
    whose middle was not kept. Each side is trimmed to the nearest character that
    cannot be part of a token (whitespace, a quote, a comma...), looked for within 4 KiB
    of the cut, and by those 4 KiB when there is none (minified JSON, base64): so no
    token is split, as a secret's prefix alone would escape redaction."""
    if cut <= 0:
        return head + tail, 0
    window = head[-4096:]
    end = re.search(rb"[^A-Za-z0-9+/=_.~-][A-Za-z0-9+/=_.~-]*\Z", window)
    keep = len(head) - len(window) + (end.start() + 1 if end else 0)
    cut, head = cut + len(head) - keep, head[:keep]
    start = re.search(rb"[^A-Za-z0-9+/=_.~-]", tail[:4096])
    skip = start.start() if start else min(len(tail), 4096)
    cut, tail = cut + skip, tail[skip:]
    return head + b"\n[... %d bytes cut here: over the capture cap ...]\n" % cut + tail, cut


class _Output:
    """What run_command keeps of one output stream: at most `cap` bytes, the first half and
    the last half (the end is usually the summary); the middle is cut (see cut_middle)."""

    def __init__(self, cap):
        import collections
        self.half, self.room = cap // 2, cap - cap // 2
        self.head, self.tail, self.tail_len, self.total = bytearray(), collections.deque(), 0, 0

    def add(self, block):
        self.total += len(block)
        room = self.room - len(self.head)
        if room > 0:
            self.head += block[:room]
            block = block[room:]
        if block:  # the tail: whole blocks, the oldest let go once half is still held
            self.tail.append(block)
            self.tail_len += len(block)
            while self.tail and self.tail_len - len(self.tail[0]) >= self.half:
                self.tail_len -= len(self.tail.popleft())

    def kept(self):
        """(the text kept, the bytes cut)."""
        end = b"".join(self.tail)[-self.half:] if self.half else b""
        data, cut = cut_middle(bytes(self.head), end, self.total - len(self.head) - len(end))
        return data.decode("utf-8", "replace"), cut


def run_command(cmd, cwd=None, env=None, timeout=None, shell=False, stdin_data=None,
                cap_bytes=64 << 20, on_tick=None, tick_sec=10.0, kill_grace=5.0,
                on_start=None, stop=None, idle_timeout=None):
    """Run a command to completion and return a CommandResult. Never raises for the child.

    - `cmd` is an argv list, or a string run by /bin/sh when shell=True.
    - The child gets its own process group and a closed stdin (headless agents hang
      on an open one) unless `stdin_data` is given.
    - stdout and stderr are read as they come, so the child never blocks on a full pipe
      (not even while it is being stopped); each keeps at most `cap_bytes` (see _Output;
      dropped_bytes counts what was cut).
    - On timeout the whole group gets SIGTERM, then SIGKILL after kill_grace.
    - When the child exits, its whole group is killed: a grandchild that holds the
      pipes open (or let go of them but stayed in the group) never outlives it.
    - on_tick(elapsed_seconds) is called every tick_sec while it runs (progress lines).
    - on_start(proc) is called once the child runs (to record or signal its group).
    - stop() is asked every half second: when true, the group is killed at once (SIGTERM,
      SIGKILL a second later) and the result says it was killed.
    - idle_timeout: when the child prints nothing on stdout or stderr for that many seconds
      (a headless agent waiting for an answer nobody will give), its group is stopped as on
      a timeout and the result's `idle` says so.
    """
    import contextlib
    import select
    import signal
    import subprocess
    import threading

    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            cmd, shell=shell, cwd=cwd, env=env,
            stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        error = "cannot start %s: %s" % (cmd if isinstance(cmd, str) else (cmd[0] if cmd else ""),
                                          exc.strerror or exc)
        return CommandResult(cmd, exit_code=127, stderr=error, error=error)

    # One loop reads both pipes and waits for the child's exit without reaping it (until it
    # is reaped, its pid, and so its group id, cannot be reused): on Linux a pidfd turns
    # readable the moment it exits; elsewhere the exit is polled, at least every half second.
    # (No thread per pipe: a short command, git's, costs a few hundred microseconds less.)
    outputs = {proc.stdout.fileno(): _Output(cap_bytes), proc.stderr.fileno(): _Output(cap_bytes)}
    poller = select.poll()
    for fd in outputs:
        poller.register(fd, select.POLLIN)
    try:
        exit_fd = os.pidfd_open(proc.pid)
        poller.register(exit_fd, select.POLLIN)
    except (AttributeError, OSError):
        exit_fd = None
    reading, exited, heard = set(outputs), False, started

    def pump(seconds):
        """Read what the pipes hold, waiting at most `seconds` for output or the exit."""
        nonlocal exited, heard
        if exit_fd is None:  # the exit is looked at between waits: at least every 0.5 s
            seconds = min(seconds, 0.5)
        if not reading and exit_fd is None:
            exited = wait_exited(proc.pid, max(0.0, seconds))
            return
        for fd, _ in poller.poll(max(0.0, seconds) * 1000):
            if fd == exit_fd:
                exited = True
                poller.unregister(fd)  # it stays readable
                continue
            try:
                block = os.read(fd, 65536)
            except OSError:
                block = b""
            if block:
                heard = time.monotonic()
                outputs[fd].add(block)
            else:
                poller.unregister(fd)
                reading.discard(fd)
        if exit_fd is None and not exited:
            exited = wait_exited(proc.pid, 0)

    def pump_while(busy, seconds):
        """pump() while busy() and `seconds` are not up."""
        end = time.monotonic() + seconds
        while busy() and time.monotonic() < end:
            pump(end - time.monotonic())

    timed_out = stopped = idle = False
    deadline = None if timeout is None else started + timeout
    next_tick = started + tick_sec
    try:
        if on_start:
            on_start(proc)
        if stdin_data is not None:
            def feed():  # a child may exit or close its stdin before it read it all: EPIPE
                with contextlib.suppress(OSError), proc.stdin:
                    proc.stdin.write(stdin_data.encode() if isinstance(stdin_data, str) else stdin_data)
            threading.Thread(target=feed, daemon=True).start()
        while not exited:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                timed_out = True
                break
            if stop is not None and stop():
                stopped = True
                break
            if idle_timeout and now - heard >= idle_timeout:
                idle = True
                break
            if on_tick and now >= next_tick:
                next_tick = now + tick_sec
                on_tick(now - started)
            wait = min(0.5, next_tick - now) if on_tick else 0.5
            if deadline is not None:
                wait = min(wait, deadline - now)
            if idle_timeout:
                wait = min(wait, heard + idle_timeout - now)
            pump(wait)
        # The child is gone (or is stopped now, SIGTERM then SIGKILL): nothing of its group
        # outlives it, not even a grandchild that let go of the pipes but stayed in the group
        # to write later. What the group writes meanwhile is read, for at most 2 s more once
        # it is killed (a process that left the group may hold the pipes).
        grace = kill_grace if timed_out or idle else 1.0 if stopped else 0
        if grace and not exited:
            signal_group(proc.pid, signal.SIGTERM)
            pump_while(lambda: not exited, grace)
        signal_group(proc.pid, signal.SIGKILL)  # the child is reaped only below
        pump_while(lambda: reading, 2.0)
    finally:  # every way out ends the group, also a callback that raised or Ctrl-C in a CLI
        kill_process_group(proc, 0)
        if exit_fd is not None:
            os.close(exit_fd)
        proc.stdout.close()
        proc.stderr.close()
    (out, out_cut), (err, err_cut) = [output.kept() for output in outputs.values()]
    code = proc.returncode
    return CommandResult(
        cmd,
        exit_code=None if timed_out or idle else code,
        stdout=out, stderr=err, timed_out=timed_out,
        duration=time.monotonic() - started,
        signal=-code if (code is not None and code < 0) else None,
        dropped_bytes=out_cut + err_cut, idle=idle_timeout if idle else None, held=bool(reading))


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
    """git in one work tree, safely: nothing in any git config runs a program from
    bridge.py's calls, no prompts, no optional locks, timeouts.

    Every call goes through run(), which pins off each config key that makes git
    start a program or rewrite content (SAFE_CONFIG, plus every filter driver the
    config defines), so a hook, fsmonitor, filter or signing program planted in
    the repository's config (or set in your global one) never runs from bridge.py,
    and a git that hangs on a credential prompt or a lock is stopped. Diffs are
    taken with --no-ext-diff --no-textconv: patches are always git's own.
    """

    # Keys that make git run a program: pinned for every call (bridge.py never
    # talks to a remote, so every transport is refused; that also rules out
    # core.sshCommand and askpass; submodule.recurse would run git inside each submodule,
    # with its config). filter.<driver>.* cannot be pinned by a wildcard: see filter_config().
    SAFE_CONFIG = ("core.hooksPath=/dev/null", "core.fsmonitor=false", "core.pager=cat",
                   "core.editor=:", "sequence.editor=:", "core.askPass=", "credential.helper=",
                   "protocol.allow=never", "commit.gpgSign=false", "tag.gpgSign=false",
                   "gc.auto=0", "maintenance.auto=false", "submodule.recurse=false")
    # Environment that outranks config, set or dropped the same way.
    SAFE_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "GIT_PAGER": "cat",
                "GIT_EDITOR": ":", "GIT_SEQUENCE_EDITOR": ":", "GIT_ASKPASS": ""}
    UNSAFE_ENV = ("GIT_EXTERNAL_DIFF", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_PROXY_COMMAND")

    def __init__(self, root, timeout=120.0):
        self.root = os.fspath(root)
        self.timeout = timeout
        self.env = {k: v for k, v in os.environ.items() if k not in self.UNSAFE_ENV}
        self.env.update(self.SAFE_ENV)
        self._git_dir = None
        # (files, their stat signatures, the -c pairs) when the filter drivers were listed: one
        # tuple, so a thread reading it never pairs one listing's files with another's pairs
        self._config_seen = None
        self.stop = None  # run_command's stop(): the watcher's "killed if still running"

    def _base(self):
        return ["git", "--no-pager"] + [word for pair in self.SAFE_CONFIG for word in ("-c", pair)]

    def run(self, *args, check=True, env=None, stdin_data=None):
        cmd = self._base() + self.filter_config() + list(args)
        merged_env = dict(self.env, **env) if env else self.env
        result = run_command(cmd, cwd=self.root, env=merged_env, stdin_data=stdin_data,
                             timeout=self.timeout, stop=self.stop)
        if check and not result.ok:
            raise BridgeError("git %s failed (%s): %s" % (
                " ".join(args[:3]), result.describe(), result.stderr.strip()[-500:]), EXIT_FAILED)
        return result

    def _config_files(self, origins=()):
        """The config files git reads here (and those it was last seen including)."""
        env = os.environ
        home = os.path.expanduser("~")
        xdg = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
        files = [env.get("GIT_CONFIG_SYSTEM") or "/etc/gitconfig",
                 env.get("GIT_CONFIG_GLOBAL") or os.path.join(home, ".gitconfig"),
                 os.path.join(xdg, "git", "config")]
        dotgit = os.path.join(self.root, ".git")
        git_dir = self._git_dir or dotgit
        files += [os.path.join(git_dir, "config"), os.path.join(git_dir, "config.worktree"),
                  os.path.join(git_dir, "commondir"), dotgit]
        return tuple(files) + tuple(sorted(set(origins) - set(files)))

    @staticmethod
    def _contents(files):
        """What tells a change of these files: stat's size, times and inode (a write always
        moves ctime), or the errno of a missing one. One stat each: run() asks every call."""
        signature = []
        for path in files:
            try:
                st = os.stat(path)  # a folder (.git itself) is one: git writes in it all the time
                signature.append("dir" if stat.S_ISDIR(st.st_mode) else
                                 (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
            except OSError as exc:
                signature.append(exc.errno)
        return signature

    def filter_config(self):
        """-c pairs that switch off every filter driver (clean, smudge, process) git's
        config defines. git has no wildcard for filter.<driver>.*, so the drivers are
        listed with one `git config` call, again only when a config file git reads (or
        includes) has changed since (by stat): .git/config can be edited by anyone who can
        write the work tree."""
        seen = self._config_seen
        files = seen[0] if seen else self._config_files()
        contents = self._contents(files)
        if seen and seen[1] == contents:
            return seen[2]
        listed = run_command(self._base() + ["config", "-z", "--show-origin", "--list"],
                             cwd=self.root, env=self.env, timeout=self.timeout)
        drivers, origins, records = set(), [], listed.stdout.split("\0")
        conditional = False  # an includeIf: what another work tree reads may differ (worktree())
        for origin, entry in zip(records[0::2], records[1::2]):
            key, _, value = entry.partition("\n")
            origin = os.path.join(self.root, origin[5:]) if origin.startswith("file:") else None
            low = key.lower()
            if low.startswith("filter.") and low.count(".") >= 2:
                drivers.add(key[7:key.rindex(".")])
            elif low.endswith(".path") and low.startswith(("include.", "includeif.")) and origin:
                conditional = conditional or low.startswith("includeif.")
                # an include (conditional or not) is watched even while it is not in effect;
                # one on the branch makes HEAD part of the config
                origins.append(os.path.join(os.path.dirname(origin), os.path.expanduser(value)))
                if low.startswith("includeif.onbranch:"):
                    origins.append(os.path.join(self._git_dir or os.path.join(self.root, ".git"),
                                                "HEAD"))
            if origin:
                origins.append(origin)
        args = []
        for driver in sorted(drivers):
            if "=" in driver or "\n" in driver:
                raise BridgeError("git config defines a filter driver named %r, which cannot be "
                                  "switched off with -c; bridge.py will not run git with it" % driver,
                                  EXIT_FAILED)
            for key in ("clean=", "smudge=", "process=", "required=false"):
                args += ["-c", "filter.%s.%s" % (driver, key)]
        files = self._config_files(origins)
        self._config_seen = (files, self._contents(files), args, conditional)
        return args

    def config_files(self):
        """Every config file git reads here, included ones too (and .git, a folder or a file)."""
        self.filter_config()
        return self._config_seen[0]

    def git_dir(self):
        """The absolute .git directory (asked once per Git object)."""
        if self._git_dir is None:
            self._git_dir = self.run("rev-parse", "--absolute-git-dir").stdout.strip()
        return self._git_dir

    def head(self):
        """The commit HEAD points at, or None on an unborn branch."""
        return self.run("rev-parse", "--verify", "-q", "HEAD", check=False).stdout.strip() or None

    def current_branch(self):
        """The checked-out branch name, or None when HEAD is detached."""
        return self.run("symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip() or None

    def commit_all(self, message):
        """Commit everything in the work tree (`add -A`: what info/exclude and .gitignore
        leave out stays out) on the current branch, hooks off; the new sha, or None when
        there was nothing to commit. Without a configured identity, as bridge.py."""
        self.add_all(os.path.join(self.git_dir(), "index"))
        result = self.run("commit", "-q", "--no-verify", "-m", message, check=False)
        if not result.ok and "tell me who you are" in (result.stderr + result.stdout).lower():
            result = self.run("-c", "user.name=bridge.py", "-c", "user.email=bridge@localhost",
                              "commit", "-q", "--no-verify", "-m", message, check=False)
        if not result.ok:
            if "nothing to commit" in result.stdout + result.stderr:
                return None
            raise BridgeError("git commit failed: %s" % (result.stderr or result.stdout).strip()[-300:],
                              EXIT_FAILED)
        return self.head()

    def add_all(self, index, env=None, *pathspec):
        """`git add -A` into `index` (its path), git never entering a nested repository. For
        each gitlink whose folder holds a .git (a submodule checked out, or a repository the
        agent made inside the work tree), git looks for changes with a `git status` inside it,
        which reads that repository's config: its filter drivers are not among those run()
        pins off. So those entries leave the index first, and the add records them again as
        it records a new nested repository: its HEAD commit, read without running anything.
        Should the add fail (it then writes no index), they go back as they were."""
        nested = [entry + "\0" for entry in self.run("ls-files", "-s", "-z", env=env).stdout.split(
            "\0") if entry.startswith("160000 ") and os.path.lexists(os.path.join(
                self.root, entry.split("\t", 1)[1], ".git"))] if may_hold_gitlinks(index) else []
        if nested:
            self.run("update-index", "--force-remove", "-z", "--stdin", env=env,
                     stdin_data="".join(entry.split("\t", 1)[1] for entry in nested))
        try:
            self.run("add", "-A", *pathspec, env=env)
        except BridgeError:
            if nested:  # ls-files -s writes what --index-info reads
                self.run("update-index", "-z", "--index-info", env=env, stdin_data="".join(nested))
            raise

    def worktree(self, path, fresh=False):
        """(Git, git directory) for the linked worktree at `path`, once git confirms it is the
        top of a work tree of this repository: its git directory one of this repository's
        worktrees/ and its common directory this one's (else a BridgeError). A `.git` file or
        `commondir` rewritten to name your own git directory would have git there commit on
        your branch with your index. It keeps this Git's list of filter drivers (one `git
        config` call less per task) unless the worktree reads config of its own
        (config.worktree; an includeIf, whose condition may hold there and not here).
        `fresh`: `git worktree add` made it a moment ago, so its `.git` file and that
        directory's `commondir` are read as git reads them (`gitdir: DIR`, relative to the
        worktree) instead of asking git; the same checks follow. Anything that could rewrite
        them in between could as well right after the check: the tamper check's fingerprint
        covers them from then on."""
        common = os.path.realpath(common_git_dir(self.git_dir()))
        self.filter_config()
        git, seen = Git(path, self.timeout), self._config_seen
        git._config_seen = seen  # rev-parse (unless fresh) runs no filter
        if fresh:
            link = read_input(os.path.join(path, ".git"), "file", 4096, missing=b"")
            link = link.decode("utf-8", "replace").rstrip("\r\n")
            admin = os.path.join(path, link[8:])
            ok = link.startswith("gitdir: ") and "\0" not in link
            back = (ok and _read_small(os.path.join(admin, "commondir"))) or ""
            ok, lines = ok and "\0" not in back, [path, admin, os.path.join(admin, back)]
        else:
            top = git.run("rev-parse", "--show-toplevel", "--absolute-git-dir", "--git-common-dir",
                          check=False)
            ok, lines = top.ok, top.stdout.splitlines()
        if not ok or len(lines) != 3 or os.path.realpath(lines[0]) != os.path.realpath(path) \
                or os.path.dirname(os.path.realpath(lines[1])) != os.path.join(common, "worktrees") \
                or os.path.realpath(os.path.join(path, lines[2])) != common:
            raise BridgeError("%s exists but is no worktree of this repository; remove it or "
                              "rename the task" % path, EXIT_FAILED)
        git._git_dir = lines[1] = os.path.realpath(lines[1])
        # from now on git there uses what was checked, whatever its .git file says later
        git.env = dict(git.env, GIT_DIR=lines[1], GIT_WORK_TREE=os.path.realpath(path))
        # the same config files, stat-checked on every call as ever, plus its own
        own = (os.path.join(path, ".git"), os.path.join(lines[1], "config.worktree"),
               os.path.join(lines[1], "commondir"))
        git._config_seen = None if seen[3] or os.path.lexists(own[1]) else (
            seen[0] + own, seen[1] + self._contents(own), seen[2], False)
        return git, lines[1]

    def add_worktree(self, path, branch):
        """`git worktree add -q PATH BRANCH` for a branch nothing has checked out (one made a
        moment ago), done as git does it in one git process instead of four (git runs branch,
        symbolic-ref and reset --hard as children; they were a third of a worktree task's git
        time): PATH/.git and the files gitrepository-layout(5) describes (worktrees/ID/gitdir
        first, so `worktree prune` never finds it naming nothing, then commondir and HEAD) are
        written, and `read-tree -u --reset` checks the branch out. git's own command does it
        when a new worktree would get more than that (refs kept in a reftable; sparse-checkout
        patterns or per-worktree config to copy) or when a worktree of that name is registered
        already (git then picks another name). A BridgeError, what was made removed again (as
        git does), when it cannot; what a crash between its steps leaves, the recovery removes
        (drop_unmade_worktree)."""
        mine = self.git_dir()
        common = common_git_dir(mine)
        admin = os.path.join(common, "worktrees", os.path.basename(path))
        if any(os.path.lexists(os.path.join(*parts)) for parts in (
                (common, "reftable"), (mine, "info", "sparse-checkout"), (mine, "config.worktree"),
                (admin,))):
            self.run("worktree", "add", "-q", path, branch)
            return
        made = []
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.makedirs(os.path.dirname(admin), exist_ok=True)
            path, admin = (os.path.join(os.path.realpath(os.path.dirname(name)),
                                        os.path.basename(name)) for name in (path, admin))
            os.mkdir(path)
            made.append(path)
            atomic_write(os.path.join(path, ".git"), ("gitdir: %s\n" % admin).encode(), durable=False)
            if os.path.islink(path):  # swapped for a symlink meanwhile: never checked out there
                raise BridgeError("%s was replaced by a symlink while it was made" % path)
            os.mkdir(admin)
            made.append(admin)
            for name, text in (("gitdir", path + "/.git"), ("commondir", "../.."),
                               ("HEAD", "ref: refs/heads/" + branch)):
                atomic_write(os.path.join(admin, name), (text + "\n").encode(), durable=False)
            self.run("read-tree", "-u", "--reset", "HEAD",
                     env={"GIT_DIR": admin, "GIT_WORK_TREE": path})
        except (OSError, BridgeError) as exc:
            import shutil
            for folder in made:  # what this call made, and nothing else ran there yet
                shutil.rmtree(folder, ignore_errors=True)
            raise exc if isinstance(exc, BridgeError) else BridgeError(
                "cannot make the worktree %s: %s" % (exc.filename or path, exc.strerror))

    def drop_unmade_worktree(self, path):
        """Remove what add_worktree left at `path` when cut short (the watcher killed between
        its steps; `git worktree add` runs on, a process of its own): a folder holding at most
        the .git file (or the temporary file it is written through), and a worktrees/ID
        directory naming that folder or nothing yet, unlocked and without an index (the
        checkout writes it last). Nothing ran there, so nothing is lost; a WIP commit of it
        would delete every file the checkout never wrote. True when it was such a folder."""
        import shutil
        worktrees = os.path.join(os.path.realpath(common_git_dir(self.git_dir())), "worktrees")
        admin = os.path.join(worktrees, os.path.basename(path))
        try:  # a symlinked worktrees/ (git's own add refuses one) would lead anywhere
            names = None if os.path.islink(path) or os.path.realpath(
                os.path.dirname(admin)) != worktrees else os.listdir(path)
        except OSError:
            return False
        other = [name for name in names or () if name != ".git" and not (  # or its temporary
            name.startswith("..git.") and name.endswith(".tmp"))]
        if names is None or other or os.path.islink(admin) \
                or os.path.lexists(os.path.join(admin, "index")) \
                or os.path.lexists(os.path.join(admin, "locked")) or _read_small(
                    os.path.join(admin, "gitdir")) not in (None, os.path.realpath(path) + "/.git"):
            return False
        shutil.rmtree(admin, ignore_errors=True)
        shutil.rmtree(path, ignore_errors=True)
        return not os.path.lexists(path)

    def remove_worktree(self, git, checked=False):
        """`git worktree remove` of the worktree `git` (from worktree()) works in. git checks
        first that it holds no changes and no submodule with a `git status` there, which
        reads that worktree's config: its filter drivers are pinned off too. A worktree
        holding changes stays. `checked`: the caller made that check itself, after the last
        program that could write there ended, so git is not asked to again (--force; a
        locked worktree still stays)."""
        if checked:  # git then looks at nothing there: no filter to pin
            return self.run("worktree", "remove", "--force", git.root, check=False)
        return self.run(*git.filter_config(), "worktree", "remove", git.root, check=False)

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
            # A copy of the index keeps git's stat cache (a fast add -A). It is only a cache:
            # anything but a regular file there (a link to /dev/zero an agent planted would
            # be copied until the disk is full), or one mostly holes, is not copied, and
            # add -A starts empty.
            try:
                with open_input(real_index) as source:
                    if not mostly_holes(source):
                        with os.fdopen(create_once(temp_index), "wb") as copy:
                            shutil.copyfileobj(source, copy)
            except OSError:
                unlink_quietly(temp_index)
            env = {"GIT_INDEX_FILE": temp_index}
            # Exclusions go on the diff only: an exclude pathspec naming an ignored
            # path (e.g. .ai-handoff/ in info/exclude) makes `git add` exit 1.
            self.add_all(temp_index, env, "--", ".")
            pathspec = ["--", "."] + [":(exclude)%s" % path for path in exclude] if exclude else []
            # git's plain patch whatever your color.ui, diff.noprefix, diff.mnemonicPrefix or
            # diff.submodule (=diff runs `git diff` inside a nested repository, its config's)
            return self.run("diff", "--cached", "--no-ext-diff", "--no-textconv", "--no-color",
                            "--src-prefix=a/", "--dst-prefix=b/", "--submodule=short", *diff_args,
                            base or EMPTY_TREE, *pathspec, env=env).stdout
        finally:
            unlink_quietly(temp_index)


def mostly_holes(handle):
    """True for a large file that is mostly holes (`truncate -s 4G`, never written): no
    index git writes is; copying or reading it would be gigabytes of nothing."""
    st = os.fstat(handle.fileno())
    return st.st_size > 64 << 20 and st.st_blocks * 512 < st.st_size // 2


def common_git_dir(git_dir):
    """The git directory holding the refs, objects and config `git_dir` shares: the one its
    `commondir` file names (a linked worktree's), else `git_dir` itself."""
    common = _read_small(os.path.join(git_dir, "commondir"))
    return os.path.normpath(os.path.join(git_dir, common)) if common else git_dir


def may_hold_gitlinks(index):
    """False when the git index file `index` surely holds no gitlink (mode 160000, stored as
    the bytes 00 00 e0 00); True when it may (rarely by chance), or cannot be read. A split
    index (core.splitIndex, `update-index --split-index`) keeps most entries in the
    sharedindex.HASH file beside it its `link` extension names: those files are read too."""
    files = [index]
    try:
        for path in files:
            with open_input(path) as handle:
                if mostly_holes(handle):
                    return True
                tail = b""
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    if b"\x00\x00\xe0\x00" in tail + chunk:
                        return True
                    if path == index and b"link" in tail + chunk and len(files) == 1:
                        folder = os.path.dirname(index)
                        files += [os.path.join(folder, name) for name in os.listdir(folder)
                                  if name.startswith("sharedindex.")]
                    tail = chunk[-3:]
    except FileNotFoundError:
        return len(files) > 1  # no index; a shared one git removed meanwhile: ask git
    except OSError:
        return True
    return False


def git_exclude(root, pattern, comment=None):
    """Make git ignore `pattern` locally via info/exclude (shared by linked worktrees).

    Returns None outside a git repository, False when the pattern (with or without its
    leading/trailing slash) is already listed, else the exclude file's path. Works on
    bytes, so a non-UTF-8 exclude file is kept as it is, and appends under O_APPEND after
    a newline when the file does not end with one (else the last pattern is corrupted).
    """
    res = Git(root).run("rev-parse", "--git-path", "info/exclude", check=False)
    if not res.ok or not res.stdout.strip():
        return None
    path = os.path.join(os.fspath(root), res.stdout.strip())   # relative to root, or absolute
    bare = pattern.strip("/")
    variants = {v.encode("utf-8") for v in (bare, "/" + bare, bare + "/", "/" + bare + "/")}
    existing = read_input(path, "git exclude file", missing=b"")
    if any(line.strip() in variants for line in existing.split(b"\n")):
        return False
    data = b"\n" if existing and not existing.endswith(b"\n") else b""
    if comment:
        data += ("# %s\n" % comment).encode("utf-8")
    append_text(path, data + pattern.encode("utf-8") + b"\n")
    return path


# ---- JSON-RPC framing -----------------------------------------------------------

def read_message(stream, max_bytes=16 << 20):
    """The next JSON-RPC message's bytes from a binary stream in either framing, or None at
    end of stream. MCP's stdio transport is newline-delimited JSON; some servers (and
    LSP-style tools) use `Content-Length: N` headers instead. The framing is detected per
    message, so one reader serves both."""
    while True:
        # Bounded: a server that streams without newlines must not grow one line forever.
        line = stream.readline(max_bytes + 3)
        if not line:
            return None
        if len(line.rstrip(b"\r\n")) > max_bytes:
            raise BridgeError("a message line exceeds the %d byte limit" % max_bytes, EXIT_FAILED)
        stripped = line.strip()
        if not stripped:
            continue
        if stripped[:15].lower() != b"content-length:":
            return stripped
        try:
            length = int(stripped[15:].strip())
        except ValueError:
            raise BridgeError("bad Content-Length header: %r" % stripped[:80], EXIT_FAILED)
        if not 0 <= length <= max_bytes:
            raise BridgeError("Content-Length %d exceeds the %d byte limit" % (
                length, max_bytes), EXIT_FAILED)
        for _ in range(32):  # further headers (Content-Type) until the blank line
            header = stream.readline(1024)
            if not header:
                return None
            if not header.strip():
                break
            if not header.endswith(b"\n"):
                raise BridgeError("a header line exceeds 1024 bytes", EXIT_FAILED)
        else:
            raise BridgeError("more than 32 header lines", EXIT_FAILED)
        body = stream.read(length)
        if body is None or len(body) < length:
            return None
        return body


def frame_message(message, framing="line"):
    """Encode a message (a dict) for the wire in the given framing."""
    data = json_compact(message).encode("utf-8")
    if framing == "content-length":
        return b"Content-Length: %d\r\n\r\n" % len(data) + data
    return data + b"\n"


# ---- roots --------------------------------------------------------------------

def find_root(root=None):
    """--root if given, else the git top level of the working directory, else it."""
    if root:
        if not os.path.isdir(root):
            raise BridgeError("--root %s is not a directory" % root)
        return os.path.abspath(root)
    return git_toplevel(os.getcwd()) or os.getcwd()


# =============================================================================
# 2. WATCH - the .ai-handoff/ task queue
# =============================================================================
# The Bridge Protocol: a planner drops task JSON into .ai-handoff/tasks/, one
# watcher (worker lock) takes each task through validate -> idempotency -> task
# lock -> running/ -> confirmation gate -> dirty check -> branch -> bead ->
# editing agent -> audit -> verify -> audit -> commit/return -> result. Every
# exit path writes results/{id}.json, redacted. The README's "Decisions" lists where
# this goes beyond the Bridge Protocol's own sequence.

HANDOFF_DIR = ".ai-handoff"
HANDOFF_SUBDIRS = ("tasks", "running", "results", "patches", "locks", "logs", "meta",
                   "pending", "failed")
WORKER_LOCK = "__worker__.lock"
TASK_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"
TRUNCATED_MARKER = "[TRUNCATED - see logs/%s.log]"
TASK_MAX_BYTES = 1 << 20
TASK_MAX_DEPTH = 32  # nesting of objects and lists in a task (the result holds a copy of it)
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
    "depends_on": (list, False, []),
    "executor": (str, False, None),
}
DEPENDS_MAX = 16  # dependencies of one task (each is looked up on every scan of the queue)


class Handoff:
    """Paths of one repository's .ai-handoff/ directory."""

    def __init__(self, root):
        self.root = os.path.abspath(os.fspath(root))
        self.base = os.path.join(self.root, HANDOFF_DIR)

    def dir(self, name):
        """.ai-handoff/NAME, made when missing: a symlink (or a file) in place of it or of
        .ai-handoff/ is a BridgeError naming it, never a read or write outside."""
        return make_dirs(os.path.join(self.base, name), self.root)

    def path(self, name, filename):
        return os.path.join(self.dir(name), filename)

    def rel(self, path):
        """A path relative to .ai-handoff/, as results name their artifacts."""
        return os.path.relpath(path, self.base)

    def require(self):
        if not os.path.isdir(os.path.join(self.base, "tasks")):
            raise BridgeError("%s has no %s/ (run `bridge.py init --root %s` first)" % (
                self.root, HANDOFF_DIR, self.root))
        for name in HANDOFF_SUBDIRS:
            self.dir(name)
        return self

    def history_path(self, task_id):
        return self.path("meta", "%s.results.jsonl" % task_id)


def handoff_init(root):
    """Create .ai-handoff/ and make git ignore it locally. Returns what was done."""
    handoff = Handoff(root)
    done = []
    for name in HANDOFF_SUBDIRS:
        if not os.path.lexists(os.path.join(handoff.base, name)):
            done.append("created %s/%s/" % (HANDOFF_DIR, name))
        handoff.dir(name)
    exclude = git_exclude(root, "/%s/" % HANDOFF_DIR,
                          "bridge.py watcher state (local, never committed)")
    if exclude is None:
        done.append("not a git repository: nothing to exclude (the watcher needs git)")
    elif exclude:
        done.append("added /%s/ to %s" % (HANDOFF_DIR, os.path.relpath(exclude, root)))
    return done


# ---- task files -----------------------------------------------------------------

def too_deep(value, limit):
    """The path of the first list or object nested deeper than `limit` in `value`, or
    None. A loop, not recursion: the depth it guards against is the recursion limit's."""
    stack = [(value, "", 1)]
    while stack:
        node, here, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > limit:
                return here or "(top level)"
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend((child, ("%s.%s" % (here, key) if here else str(key))
                          if isinstance(node, dict) else "%s[%d]" % (here, key), depth + 1)
                         for key, child in items)
    return None


def task_id_problem(text):
    """Why `text` is not a valid task id (a file stem and a branch name under feat/ai/),
    or None."""
    if not re.fullmatch(TASK_ID_PATTERN, text):
        return "%r must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$" % text[:120]
    if text.endswith(".lock") or text.endswith(".") or ".." in text:
        return "%r is not a valid branch name under feat/ai/ (no '..', no trailing '.' or " \
            "'.lock')" % text
    return None


def validate_task(task, stem=None):
    """Every schema error of a task object, as a list of messages naming the field."""
    if not isinstance(task, dict):
        return ["the task must be a JSON object, got %s" % type(task).__name__]
    deep = too_deep(task, TASK_MAX_DEPTH)
    if deep:
        return ["%s: nested deeper than %d levels" % (deep[:200], TASK_MAX_DEPTH)]
    errors = []
    for name, value in task.items():  # JSON's "\ud800" alone: no UTF-8 form, nothing could record it
        try:
            json.dumps({name: value}, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return ["%s: holds a lone surrogate (a \\ud800-\\udfff escape with no pair), which is not "
                    "text" % printable(name)]
    for name, (kind, required, _default) in TASK_FIELDS.items():
        if name not in task:
            if required:
                errors.append("%s: required field is missing" % name)
            continue
        value = task[name]
        if value is None and not required and name in ("approved_at", "retry_policy", "executor"):
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            label = {str: "a string", list: "a list", bool: "true or false", int: "an integer",
                     dict: "an object"}[kind]
            errors.append("%s: must be %s, got %s" % (name, label, json.dumps(value)[:60]))
    task_id = task.get("id")
    if isinstance(task_id, str):
        problem = task_id_problem(task_id)
        if problem:
            errors.append("id: " + problem)
        if stem is not None and task_id != stem:
            errors.append("id: %r must equal the file name's stem %r" % (task_id, stem))
    deps = task.get("depends_on")
    if isinstance(deps, list):
        if len(deps) > DEPENDS_MAX:
            errors.append("depends_on: at most %d dependencies, got %d" % (DEPENDS_MAX, len(deps)))
        for index, dep in enumerate(deps[:DEPENDS_MAX]):
            problem = task_id_problem(dep) if isinstance(dep, str) else "must be a task id, got %s" \
                % json.dumps(dep)[:60]
            if not problem and dep == task_id:
                problem = "%r is the task itself (a task cannot wait for itself)" % dep
            elif not problem and dep in deps[:index]:
                problem = "%r is listed twice" % dep
            if problem:
                errors.append("depends_on[%d]: %s" % (index, problem))
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
    for name in ("bead_title", "goal", "done_condition", "prompt", "scope", "constraints",
                 "commands_to_run"):  # each reaches an argv: the agent's prompt, sh -c
        value = task.get(name)
        for index, item in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(item, str) and "\0" in item:
                errors.append("%s%s: contains a NUL character, which no command line can carry"
                              % (name, "[%d]" % index if isinstance(value, list) else ""))
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
        if name not in full:
            full[name] = json.loads(json.dumps(default))  # a list of its own
    if not isinstance(full["retry_policy"], dict):
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
    fresh = time.time() - info.st_mtime < fresh_sec
    try:  # a symlink's target is never read; a FIFO never blocks
        raw = read_input(path, "task file", TASK_MAX_BYTES)
    except BridgeError as exc:
        raise TaskFileError([exc.message])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskFileError(["%s is not UTF-8 (byte %d)" % (name, exc.start)], raw=raw)
    try:
        task = parse_json(text)
    except ValueError as exc:
        # A producer that does not rename atomically may still be writing it.
        raise TaskFileError(["%s is not JSON: %s" % (name, exc)], defer=fresh, raw=text)
    errors = validate_task(task, stem if check_stem else None)
    if errors:
        raise TaskFileError(errors, raw=task)
    return task


def list_task_files(directory):
    """Queued task files in FIFO order: *.json, not dot-prefixed (a writer's temporary
    file). Every id `submit` accepts names such a file (ids never start with a dot)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    # ids of the form YYYY-MM-DD_NN_slug sort chronologically by name
    return sorted(name for name in names if name.endswith(".json") and not name.startswith("."))


def skipped_task_files(handoff):
    """[{name, reason}] for what sits in tasks/ but is never run (reported by `status`): a
    dot file, a file not named *.json, a copy of a task that already has its result."""
    try:
        names = sorted(os.listdir(handoff.dir("tasks")))
    except FileNotFoundError:
        return []
    skipped = []
    for name in names:
        reason = "a dot file: a writer's temporary file, never run" if name.startswith(".") \
            else None if name.endswith(".json") else "not a .json file, never run"
        try:  # a copy is read only when its id has a result
            if reason is None and os.path.exists(handoff.path("results", name)) and duplicate_of(
                    handoff, read_task_file(handoff.path("tasks", name), fresh_sec=0)) is not None:
                reason = "already has a result for its attempt: never run again (`submit " \
                    "--retry` queues the next attempt)"
        except (TaskFileError, BridgeError):
            pass  # refused when its turn comes
        if reason:
            skipped.append({"name": name, "reason": reason})
    return skipped


def build_prompt(task, retry=None):
    """The full prompt for the editing agent: goal, instructions, scope, constraints, done,
    and for a retry `retry`, what went wrong last time (see Watcher.retry_context)."""
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
    if retry:
        parts.append(retry)
    parts.append("## Rules\nEdit files only. Do not run the verification yourself: the watcher "
                 "runs these commands afterwards and decides the outcome:\n"
                 + "\n".join("- `%s`" % c for c in task["commands_to_run"]))
    return "\n\n".join(parts) + "\n"


def fill_template(template, values):
    """An argv template with each {name} of `values` replaced, in one pass (a prompt that
    holds the text "{id}" stays as written); every word stays one argument: no shell."""
    pattern = re.compile(r"\{(%s)\}" % "|".join(map(re.escape, values)))
    return [pattern.sub(lambda m: values[m.group(1)], word) for word in template]


def executor_templates(config):
    """{name: argv template} of config `executors`, each a non-empty list of strings, or a
    BridgeError naming the bad one (exit 2)."""
    for name, template in config["executors"].items():
        if not (isinstance(template, list) and template and all(isinstance(a, str) for a in template)):
            raise BridgeError("%s: executors.%s must be a non-empty list of strings (an argv "
                              "template), got %s" % (config["_source"], name,
                                                     json.dumps(template)[:120]))
    return config["executors"]


def unknown_executor(task, config):
    """The schema error of a task naming an executor the config does not define, or None."""
    name = task.get("executor")
    if name is None or name in config["executors"]:
        return None
    return "executor: %r is not in the config's executors (%s)" % (
        name[:100], ", ".join(sorted(config["executors"])) or "none are defined")


def last_lines(text):
    """The last 20 non-empty lines of `text`."""
    return [line for line in text.splitlines() if line.strip()][-20:]


def cap_text(text, cap_bytes, task_id):
    """Text kept in a result: at most cap_bytes, the tail, behind the TRUNCATED marker."""
    data = text.encode("utf-8")
    if len(data) <= cap_bytes:
        return text
    return TRUNCATED_MARKER % task_id + "\n" + data[-cap_bytes:].decode("utf-8", "ignore")


def dropped_note(result):
    """Log note for output beyond run_command's in-memory cap (never silently lost), or not
    read because a process outside the command's group held its pipes."""
    note = ""
    if result.dropped_bytes:
        note += " (%d bytes were cut from the middle of the output: over the capture cap)" % (
            result.dropped_bytes)
    if result.held:
        note += " (its output pipes were still held open 2 s after it ended, by a process that " \
                "left its process group (a daemon started with setsid?) and still runs: what " \
                "it writes later is not recorded)"
    return note


def result_history(handoff, task_id):
    """Archived results of earlier attempts/gates of a task, oldest first."""
    path = handoff.history_path(task_id)
    try:
        return [record for _, record, _ in scan_jsonl(path) if record and record.__class__ is dict]
    except OSError as exc:
        raise BridgeError("cannot read result history %s: %s" % (path, exc.strerror or exc))


def archive_result(handoff, task_id, why):
    """Move results/{id}.json into meta/{id}.results.jsonl. True when there was one. The
    record is appended before the result is removed: a crash in between leaves a duplicate,
    never a loss."""
    path = handoff.path("results", task_id + ".json")
    raw = read_input(path, "result", missing=None)
    if raw is None:
        return False
    try:
        record = parse_json(raw.decode("utf-8"))
    except ValueError:
        record = {"unparseable_result": raw.decode("utf-8", "replace")}
    if not isinstance(record, dict):
        record = {"unparseable_result": record}
    record["archived_at"] = now_iso()
    record["archived_because"] = why
    history = handoff.history_path(task_id)
    try:
        append_jsonl(history, record)
    except OSError as exc:
        raise BridgeError("cannot write result history %s: %s" % (history, exc.strerror or exc))
    os.unlink(path)
    return True


def move_no_clobber(src, directory, name):
    """Rename src into directory/name (an existing folder), adding a suffix instead of
    replacing a file."""
    target = os.path.join(directory, name)
    if os.path.lexists(target):
        stem, ext = os.path.splitext(name)
        target = os.path.join(directory, "%s.%s-%s%s" % (stem, time.strftime("%Y%m%dT%H%M%S"),
                                                         random_hex(2), ext))
    os.rename(src, target)
    return target


def duplicate_of(handoff, task):
    """The result that makes the queued `task` a copy the watcher skips (idempotency): one
    for its attempt or a later one ({} when it is not a JSON object); None: it is to run."""
    if not os.path.exists(handoff.path("results", task["id"] + ".json")):
        return None
    existing = read_result(handoff, task["id"])
    existing = existing if isinstance(existing, dict) else {}
    attempt = existing.get("attempt", 1)
    if not isinstance(attempt, int) or attempt >= task.get("attempt", 1):
        return existing
    return None


def read_result(handoff, task_id):
    """The result of a task, or None when there is none or it is not JSON. Anything but a
    regular file in its place is a BridgeError naming it."""
    raw = read_input(handoff.path("results", task_id + ".json"), "result", missing=None)
    try:
        return parse_json(raw.decode("utf-8")) if raw is not None else None
    except ValueError:
        return None


# ---- dependencies between tasks (`depends_on`) ---------------------------------

QUEUED_STATES = ("running", "tasks", "pending")


def task_place(handoff, task_id, states=QUEUED_STATES):
    """The first of `states` whose folder holds the task's file, or None."""
    return next((state for state in states
                 if os.path.lexists(handoff.path(state, task_id + ".json"))), None)


def latest_result(handoff, task_id):
    """The task's result, else the last record of its result history, else None."""
    record = read_result(handoff, task_id)
    if record is None:
        history = result_history(handoff, task_id)
        record = history[-1] if history else None
    return record if isinstance(record, dict) else None


def dependency_state(handoff, task, git=None, graph=None):
    """How far a task's `depends_on` lets it start: {state, reason, detail, deps, start}.

    "ready": the latest result of every dependency is a success. "waiting": none failed,
    and one is queued, running or waiting for approval (it may still succeed: a retry
    puts a failed dependency back in the queue). "failed", reason dependency_failed: one
    ended failed, blocked or refused, or is unknown (not queued, running or pending, and
    without a result or history); reason dependency_cycle: the queued tasks wait for each
    other. `deps` is [{id, status, reason, commit}] for the result, where `commit` holds a
    successful dependency's verified work. Given `git`, a ready task's `start` commit is
    asked of task_start_ref (from HEAD, the base it would start from otherwise): it may
    still wait for a merge, or fail on a commit git lost. `graph`: see dependency_cycle."""
    deps, waiting, failed = [], [], []
    for dep in task.get("depends_on") or ():
        place = task_place(handoff, dep)
        try:
            if place == "tasks" and duplicate_of(handoff, read_task_file(
                    handoff.path("tasks", dep + ".json"), fresh_sec=0)) is not None:
                place = None  # a copy the watcher skips: its result stands
        except (TaskFileError, BridgeError):
            pass  # refused (a result) when its turn comes
        try:
            record = (latest_result(handoff, dep) if place is None else None) or {}
        except BridgeError as exc:
            record = {"status": "unreadable", "reason": exc.message}
        git_state = record.get("git") if isinstance(record.get("git"), dict) else {}
        status = {"tasks": "queued", "pending": "pending approval"}.get(place, place) \
            or record.get("status") or "unknown"
        commit = git_state.get("commit") or git_state.get("head_commit")
        deps.append({"id": dep, "status": status, "reason": record.get("reason"),
                     "commit": commit if status == "success" else None})
        if place:
            waiting.append("%s (%s)" % (dep, status))
        elif status == "unknown":
            failed.append("%s is unknown (not queued, running or pending, and it has no "
                          "result)" % dep)
        elif status != "success":
            failed.append("%s ended %s (%s)" % (dep, status, record.get("reason")))
    found = {"state": "ready", "reason": None, "detail": "", "deps": deps, "start": None}
    if failed:
        found.update(state="failed", reason="dependency_failed", detail="dependency " + "; ".join(failed))
    elif waiting:
        found.update(state="waiting", detail="waiting for " + ", ".join(waiting))
        cycle = dependency_cycle(handoff, task, graph)
        if cycle:
            found.update(state="failed", reason="dependency_cycle", detail="depends_on forms a "
                         "cycle (%s): none of its tasks can ever start; fix depends_on and "
                         "submit again" % " -> ".join(cycle))
    elif git is not None:
        try:
            found["start"], wait = task_start_ref(git, deps, git.head())
            if wait:
                found.update(state="waiting", detail=wait)
        except BridgeError as exc:
            found.update(state="failed", reason="dependency_failed", detail=exc.message)
    return found


def dependency_cycle(handoff, task, graph=None):
    """[id, ..., id] of a cycle of `depends_on` through `task` among the tasks waiting in
    tasks/ and pending/, or None. `graph` keeps {id: its depends_on, None when it is not
    waiting or not readable} across the calls of one look at the queue: each task file is
    read once, not once per task whose walk reaches it (a long chain: quadratic)."""
    graph = {} if graph is None else graph
    start = task["id"]
    graph[start] = task.get("depends_on") or []
    parent, stack = {start: None}, [start]
    while stack:
        here = stack.pop()
        for dep in graph[here]:
            if dep == start:
                path = []
                while here is not None:
                    path.append(here)
                    here = parent[here]
                return path[::-1] + [start]
            if dep not in graph:
                place = task_place(handoff, dep, ("tasks", "pending"))
                try:
                    graph[dep] = (read_task_file(handoff.path(place, dep + ".json"), fresh_sec=0)
                                  .get("depends_on") or []) if place else None
                except TaskFileError:
                    graph[dep] = None  # refused when its turn comes
            if dep not in parent and graph[dep] is not None:
                parent[dep] = here
                stack.append(dep)
    return None


def task_start_ref(git, deps, base_commit):
    """Where a ready task's branch starts: (commit, None), or (None, why it must wait).

    Every successful dependency's work already in base_commit (merged, or done on the base
    branch itself): the base. Else the one dependency commit that contains all the others
    (with one dependency its commit on feat/ai/<dep>; several in a chain, the last): the
    task builds on that work as it was verified. Else their work lies on separate branches:
    the watcher merges nothing, so the task waits until they are merged into the base. A
    commit git does not know (its branch deleted and collected) is a BridgeError."""
    commits = []
    for dep in deps:
        commit = dep.get("commit")
        if commit and commit not in commits:
            if not re.fullmatch(r"[0-9a-f]{7,64}", str(commit)):
                raise BridgeError("dependency %s: its result names no commit (%r)" % (
                    dep["id"], str(commit)[:80]))
            commits.append(commit)

    def contains(tip, commit):
        run = git.run("merge-base", "--is-ancestor", commit, tip, check=False)
        if run.exit_code not in (0, 1):
            raise BridgeError("the commit %s of a dependency is not usable: %s" % (
                commit, (run.stderr.strip() or run.describe())[-200:]))
        return run.exit_code == 0
    outside = [commit for commit in commits
               if not (base_commit and contains(base_commit, commit))]
    if not outside:
        return base_commit, None
    for tip in outside:
        if all(contains(tip, commit) for commit in commits if commit != tip):
            return tip, None
    return None, "the work of %s is on separate branches: merge it into the base branch " \
        "(the watcher merges nothing), then the task starts from there" % ", ".join(
            "%s (%s)" % (dep["id"], dep["commit"][:12]) for dep in deps if dep.get("commit") in outside)


# ---- beads ----------------------------------------------------------------------

class Beads:
    """The optional beads tracker through the real `bd` CLI, always by explicit id.

    bead.command null: use `bd` when it is on PATH and the repo has .beads/;
    otherwise every bead step is skipped (and the result says so). A configured
    bead.command is mandatory: if it fails, the task fails (reason bead_failed)."""

    def __init__(self, root, config):
        import shutil
        self.root = root
        self.stop = None  # run_command's stop()
        self.timeout = config["bead"]["timeout_sec"]
        command = split_command(config["bead"]["command"], "bead.command")
        self.skip_reason = None
        if command:
            self.argv = command
        elif shutil.which("bd") and os.path.isdir(os.path.join(root, ".beads")):
            self.argv = ["bd"]
        else:
            self.argv = None
            self.skip_reason = ("bd is not on PATH" if not shutil.which("bd")
                                else "no .beads/ in the repository (run `bd init`)")

    def call(self, *args):
        return run_command(self.argv + list(args), cwd=self.root, timeout=self.timeout,
                           stop=self.stop)

    def create(self, title):
        """(bead_id, raw_output, error)."""
        result = self.call("create", title, "--silent")
        raw = result.stdout + (("\n" + result.stderr) if result.stderr.strip() else "")
        if not result.ok:
            return None, raw, "bd create %s: %s" % (result.describe(), result.stderr.strip()[-300:])
        bead_id = parse_bead_id(result.stdout)
        return bead_id, raw, None if bead_id else "bd create printed no issue id"

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
            value = parse_json(text).get("id")
            return value if is_safe_name(value) else None
        except (ValueError, AttributeError):
            return None
    match = re.search(r"Created issue:\s*(\S+)", text)
    last = [line.strip() for line in text.splitlines() if line.strip()][-1]  # text is not blank
    token = (match.group(1) if match else last if " " not in last else "").rstrip(":,")
    return token if is_safe_name(token) else None


def bead_output(handoff, task_id):
    """What `bd create` printed for the task (meta/ID.bead, redacted), "" when it never ran."""
    return read_input(handoff.path("meta", task_id + ".bead"), "bead output",
                      missing=b"").decode("utf-8", "replace")


# ---- the watcher ----------------------------------------------------------------

class Fingerprint:
    """What the editing agent and its verification commands must not change, recorded
    before the agent runs and compared after it and after each verification command.

    - git's own configuration: `config`, `config.worktree`, `hooks/` and `info/` in the
      git directory and every file the config includes from the work tree or the git
      directory (`config_files`; HEAD, which an onBranch include names, is the agent's
      to move). Their bytes are kept, so a change is undone: the agent's
      version is moved to meta/{id}.tampered/ and the original written back.
    - .ai-handoff/ outside this task's own files (its log, patches and prompt, which
      the watcher writes meanwhile), tasks/ (planners add tasks at any time: a task file
      that appears is simply run after this one) and locks/ (heartbeats). Compared by
      lstat signature (type, mode, size, mtime, ctime, inode); a change is named, and
      what was added or changed is moved to meta/{id}.tampered/ (a forged result never
      stands; its original is lost, the agent wrote over it).
    Cheap: no git call, one lstat per entry, small reads of .git files only."""

    KEEP_MAX = 1 << 20  # .git files larger than this are compared, not restored

    def __init__(self, handoff, git_dir, task_id, config_files, branches, work, others):
        self.handoff, self.task_id = handoff, task_id
        common = common_git_dir(git_dir)
        self.git_paths = [os.path.join(common, "config"), os.path.join(git_dir, "config.worktree"),
                          os.path.join(common, "hooks"), os.path.join(common, "info")]
        self.work = work if work != handoff.root else None
        if self.work:  # a worktree: what ties it to its git directory
            self.git_paths += [os.path.join(work, ".git"), os.path.join(git_dir, "commondir"),
                               os.path.join(git_dir, "gitdir")]
        self.others = others  # ids of tasks running alongside: the watcher writes their files
        inside = tuple(os.path.join(top, "") for top in (handoff.root, git_dir, common, work))
        for path in map(os.path.normpath, config_files):
            if path.startswith(inside) and path not in self.git_paths \
                    and os.path.basename(path) != "HEAD" and not os.path.isdir(path):
                self.git_paths.append(path)
        own = {handoff.path("logs", task_id + ".log"),
               handoff.path("patches", task_id + "_pre.patch"),
               handoff.path("patches", task_id + "_post.patch"),
               handoff.path("meta", task_id + ".prompt.md")}
        self.skip = own | {handoff.dir("tasks"), handoff.dir("locks")}
        self.aside = handoff.path("meta", task_id + ".tampered")
        self.running = os.path.join(handoff.base, "running", task_id + ".json")
        self.base_tip = None  # the base branch's commit (the watcher checks the branches)
        self.ref_paths = self.refs(git_dir, branches, common)
        self.refs_before = self.ref_signatures(self.ref_paths)
        self.before = self.signatures()
        self.kept = {}
        for path, sig in self.before.items():
            if sig[0] == "file" and sig[2] <= self.KEEP_MAX and not path.startswith(handoff.base):
                try:
                    self.kept[path] = read_input(path, "file", self.KEEP_MAX)
                except BridgeError:
                    pass

    def signatures(self):
        import stat
        found, folders, replaced = {}, [], ()
        # a worktree's folder itself (not what is in it: the agent's work); once it is a link
        # nothing is read through it (WORKTREE/.git would be your checkout's .git)
        for path in ([self.work] if self.work else []) + self.git_paths + [self.handoff.base]:
            if path.startswith(replaced):
                continue
            try:
                st = os.lstat(path)
            except OSError as exc:
                if not isinstance(exc, FileNotFoundError):
                    found[path] = ("error", exc.errno)
                continue
            if path == self.work:
                replaced = () if stat.S_ISDIR(st.st_mode) else (path + os.sep,)
            elif stat.S_ISDIR(st.st_mode):
                folders.append(path)
            found[path] = self._signature(st)
        while folders:  # one scandir per folder, one lstat per entry
            folder = folders.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError as exc:
                found[folder] = ("error", exc.errno)
                continue
            for entry in entries:
                if entry.path in self.skip or entry.path == self.aside:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile: missing from this record
                found[entry.path] = self._signature(st)
                if stat.S_ISDIR(st.st_mode):
                    folders.append(entry.path)
        return found

    @staticmethod
    def refs(git_dir, branches, common=None):
        """Where git keeps HEAD and the `branches`: git moves a ref by writing a new file and
        renaming it into place (or a new reftable), so while none of these changed signature
        no branch moved and nothing need ask git."""
        common = common or common_git_dir(git_dir)
        return [os.path.join(git_dir, "HEAD"), os.path.join(common, "packed-refs"),
                os.path.join(common, "reftable", "tables.list")] + [
            os.path.join(common, "refs", "heads", *name.split("/")) for name in branches if name]

    @classmethod
    def ref_signatures(cls, paths):
        found = {}
        for path in paths:
            try:
                found[path] = cls._signature(os.lstat(path))
            except OSError as exc:
                found[path] = ("error", exc.errno)
        return found

    @staticmethod
    def _signature(st):
        import stat
        if stat.S_ISDIR(st.st_mode):
            return ("dir", st.st_mode)
        kind = ("file" if stat.S_ISREG(st.st_mode) else
                "symlink" if stat.S_ISLNK(st.st_mode) else "special")
        return (kind, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def changes(self):
        """[(path, 'changed'|'added'|'removed')] since the record, sorted."""
        now = self.signatures()
        changed = [(path, "removed") for path in self.before if path not in now]
        changed += [(path, "added") for path in now if path not in self.before]
        changed += [(path, "changed") for path, sig in now.items()
                    if path in self.before and self.before[path] != sig
                    and not (sig[0] == "dir" == self.before[path][0])]
        # a folder that became something else: what was in it is not looked at (nor restored
        # through a link)
        replaced = tuple(path + os.sep for path, change in changed if change == "changed")
        return sorted(item for item in changed
                      if not self.of_others(item[0]) and not item[0].startswith(replaced))

    def of_others(self, path):
        """True for a file under .ai-handoff/ of a task running alongside (its result,
        log, patches, its file moving between folders, a writer's temporary file)."""
        if not self.others or not path.startswith(self.handoff.base + os.sep):
            return False
        parts = os.path.relpath(path, self.handoff.base).split(os.sep)
        name = parts[1].lstrip(".") if len(parts) > 1 else ""
        # only the names the watcher gives them (and their temporary ones): task a_b's
        # result is no file of task a's
        return any(name == other or re.match(re.escape(other) + self.OWN_NAMES, name)
                   for other in self.others)

    OWN_NAMES = r"(\.json|\.log|\.lock|\.bead|\.prompt\.md|\.results\.jsonl|\.result-unreadable" \
        r"|\.tampered|_pre\.patch|_post\.patch)(\.|$)"

    def restore(self, changes):
        """Undo what can be undone; one line per change saying what was done."""
        notes = []
        for path, change in changes:
            if any(path.startswith(p + os.sep) for p, c in changes if c == "added" and p != path):
                continue  # inside an added folder: moved with it
            done = []
            try:
                # a changed file under .ai-handoff/ (a result, a history) goes too: the
                # agent's version must not stand as the watcher's record (this task's own
                # file in running/ stays: it is filed away with the result)
                if change != "removed" and (change == "added" or path in self.kept or (
                        path.startswith(self.handoff.base + os.sep) and path != self.running)):
                    where = self.move_aside(path)
                    done.append("the new version moved to %s" % self.handoff.rel(where))
                if change != "added" and path in self.kept:
                    atomic_write(path, self.kept[path], mode=self.before[path][1] & 0o7777)
                    done.append("the original restored")
            except OSError as exc:
                done.append("could not be restored: %s" % (exc.strerror or exc))
            notes.append("%s %s%s" % (self.display(path), change,
                                      (": " + ", ".join(done)) if done else " (not restorable)"))
        return notes

    def move_aside(self, path):
        rel = self.display(path)  # .git/... or .ai-handoff/... (else outside the work tree)
        target = os.path.join(self.aside, os.path.basename(path) if os.path.isabs(rel) else rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.lexists(target):
            target += "." + random_hex(2)
        os.rename(path, target)
        return target

    def display(self, path):
        root = os.path.dirname(self.handoff.base)
        return os.path.relpath(path, root) if path.startswith(root + os.sep) else path


def attribute_filter_lines(patch):
    """{(file, line)} of .gitattributes lines that set or unset a filter, added or removed
    in `patch` (a git diff): how an agent would point files at a filter driver."""
    found, current = set(), None
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            name = line.rsplit(" b/", 1)[-1]
            current = name if os.path.basename(name) == ".gitattributes" else None
        elif current and line[:1] in "+-" and not line.startswith(("+++", "---")) \
                and re.search(r"(^|\s)[-!]?filter(=|\s|$)", line[1:]):
            found.add((current, line))
    return found


class TaskRun:
    """What belongs to one task while the watcher runs it (several at once with `workers`):
    its file, lock, result so far, the child process running now, and where it runs: the
    user's checkout, or its own git worktree once made (`git`, `git_dir`, `work`)."""

    def __init__(self, name, git, git_dir, work):
        self.name = name              # the task file's name in tasks/ and running/
        self.task_id = name[:-5]
        self.git, self.git_dir, self.work = git, git_dir, work
        self.lock = None              # the task lock (FileLock)
        self.child = None             # the agent or verification command running now
        self.result = None            # the result being built (see internal_error)
        self.start = None             # the ref it starts from (start_point)
        self.owned = False            # its worktree is the task's own (made or checked by us)
        self.others = set()           # ids of the tasks the watcher wrote for alongside it
        # folders holding its patches and prompt, renamed into place but not yet fsynced: the
        # result fsyncs them first (a crash before it re-runs the task, which writes them anew)
        self.unsynced = set()
        self.since = time.time_ns()   # before its agent starts (see Watcher.doubted)


def worktree_root(root, config, git):
    """The folder holding the task worktrees (isolation "worktree"): worktree_dir (relative
    to the repository's top), else GIT-COMMON-DIR/bridge-worktrees. Refused (exit 2) inside
    the work tree: git would see each worktree as untracked files of yours, and `add -A`."""
    common = os.path.join(root, git.run("rev-parse", "--git-common-dir").stdout.strip())
    common = os.path.realpath(common)
    where = config["worktree_dir"]
    path = os.path.realpath(os.path.join(root, where) if where else
                            os.path.join(common, "bridge-worktrees"))
    top = os.path.realpath(root)
    if (path + os.sep).startswith(top + os.sep) and not (path + os.sep).startswith(common + os.sep):
        raise BridgeError("%s: worktree_dir %s is inside the work tree %s; choose a folder "
                          "outside it (the default is under the git directory)" % (
                              config["_source"], path, top), EXIT_USAGE)
    return path


def worktree_state(handoff, task_id, queued_only=False):
    """Why the worktree of task `task_id` stays; None when nothing needs it any more (its task
    succeeded and its work is committed on its branch; with `queued_only`, its task is not
    queued or running)."""
    place = task_place(handoff, task_id, ("running", "tasks"))
    if place or queued_only:
        return place and "its task is in %s/" % place
    try:
        result = read_result(handoff, task_id)
    except BridgeError as exc:
        return exc.message
    if not isinstance(result, dict):
        return "no result names it"
    git_state = result.get("git") if isinstance(result.get("git"), dict) else {}
    if result.get("status") == "success" and not git_state.get("worktree_kept"):
        return None
    return git_state.get("worktree_kept") or "%s (%s)" % (result.get("status"), result.get("reason"))


class Watcher:
    """One watcher process: the worker lock, the startup sweep and the task loop.

    Per-task state lives in a TaskRun, the calling thread's (`current`): with workers > 1
    each task runs in a thread of its own; `git`, `git_dir` and `work` answer for the
    current task (its worktree) and else for the repository."""

    def __init__(self, root, config, poll=None, once=False):
        import threading
        self.root = os.path.abspath(root)
        self.config = config
        self.handoff = Handoff(self.root)
        self.repo_git = Git(self.root)
        self.head_seen = None  # (ref signatures, checkout_head()) when git was last asked
        self.isolated = config["isolation"] == "worktree"
        self.workers = config["workers"]
        if self.workers > 1 and not self.isolated:
            raise BridgeError("%s: workers %d needs isolation \"worktree\" (tasks running at once "
                              "cannot share your checkout)" % (config["_source"], self.workers))
        self.local = threading.local()  # .run: this thread's TaskRun
        self.runs = {}                  # task id -> TaskRun of every task running now
        self.git_lock = threading.Lock()  # worktree add/remove, branch create/delete, commits
        self.wake = threading.Event()   # a task thread finished: the loop looks again
        self.finished = []              # (file name, outcome) of task threads, for the loop
        self.writers = set()            # ids of the tasks the watcher handles now (writes_for)
        self.wrote = {}                 # result path -> (inode, ctime) of our last write of it
        self.graph = {}                 # the depends_on of the queue, this scan's (dependency_cycle)
        self.ended = {}                 # task id -> (reason, result JSON) until settle (notify)
        self.worktrees = None           # the folder of the task worktrees (worktree_root)
        self.redactor = get_redactor(config)
        self.once = once
        self.poll = poll if poll is not None else config["poll_sec"]
        self.cap = config["log_size_cap_kb"] * 1024
        self.continue_on_failure = config["continue_on_failure"]
        self.stop_on_failure = config["stop_on_failure"] and not self.continue_on_failure
        self.protected = list(config["protected_branches"])
        self.exclude = [HANDOFF_DIR]
        self.executors = executor_templates(config)
        self.worker = None
        self.stopping = None
        self.stopped_on_failure = False
        self.warned = set()
        self.repo_git_dir = None
        self.beads = None
        self.counts = {}
        self.outcomes = {}  # task id -> exit_path of its last result in this run
        self.interrupted = False
        # serialises heartbeats with lock releases (fd reuse), and what task threads share
        self.beat_lock = threading.Lock()
        self.tamper_stop = False  # an agent changed what it must not: the queue stops
        self.failing = False  # a task failed that stops the queue: no other task starts
        self.stop_at = None  # when SIGTERM/SIGINT came (see overdue)

    @property
    def current(self):
        """The TaskRun of the task this thread works on, or None."""
        return getattr(self.local, "run", None)

    @property
    def git(self):
        run = self.current
        return run.git if run else self.repo_git

    @property
    def git_dir(self):
        run = self.current
        return run.git_dir if run else self.repo_git_dir

    @property
    def work(self):
        """Where the agent and the verification run: the checkout, or the task's worktree."""
        run = self.current
        return run.work if run else self.root

    # -- small helpers --

    def say(self, message):
        """One line on stderr. It names files and quotes output the agent chose: control
        characters are spelled out, so no escape sequence reaches the terminal."""
        warn("watch: " + printable(message))

    def redact(self, text):
        return self.redactor.redact(text) if text else text

    def write_redacted(self, path, text, durable=True):
        """Redacted text to a file under .ai-handoff/; True when redaction changed it."""
        clean = self.redact(text)
        atomic_write(path, clean or "", durable=durable)
        return clean != text

    def log(self, task_id, text):
        append_text(self.handoff.path("logs", task_id + ".log"), self.redact(text))

    # -- lifecycle --

    def run(self):
        """The whole watcher: lock, sweep, loop. Returns the exit code."""
        import signal
        self.handoff.require()
        if not self.git.run("rev-parse", "--is-inside-work-tree", check=False).ok:
            raise BridgeError("%s is not a git work tree; the watcher needs git" % self.root)
        self.worker = FileLock(self.handoff.path("locks", WORKER_LOCK),
                               meta={"role": "worker", "root": self.root})
        if not self.worker.acquire():
            raise BridgeError("another watcher holds %s: %s" % (
                self.worker.path, describe_holder(self.worker.holder)), EXIT_LOCKED)
        if self.worker.recovered:
            self.say("took over the worker lock of %s (it no longer runs)" % describe_holder(
                self.worker.recovered))
        self.repo_git_dir = self.repo_git.git_dir()
        if self.isolated:
            self.worktrees = worktree_root(self.root, self.config, self.repo_git)
            os.makedirs(self.worktrees, exist_ok=True)
        for line in handoff_init(self.root):  # idempotent: makes sure git ignores .ai-handoff/
            self.say(line)
        self.beads = Beads(self.root, self.config)
        self.beads.stop = self.repo_git.stop = self.overdue
        previous = self.install_signals()
        beat = self.start_heartbeat(self.config["worker_lock_ttl_sec"])
        try:
            self.preflight(probe=True)
            self.sweep()
            self.loop()
        finally:
            with self.beat_lock:
                beat.set()
                self.worker.release()
            for sig, old in previous.items():
                signal.signal(sig, old)
        if self.counts:
            self.say("done: %s" % ", ".join("%s %d" % item for item in sorted(self.counts.items())))
        return self.exit_code()

    def exit_code(self):
        """What this run tells CI: 1 the queue stopped on a failure; 128+N a signal N
        interrupted a task (it is re-queued); 4 a task of this run ended in a state that
        needs a person (blocked, refused, failed, waiting for approval) or still waits for
        its dependencies; else 0."""
        if self.stopped_on_failure:
            return EXIT_FAILED
        if self.interrupted:
            import signal
            return 128 + getattr(signal, self.stopping, signal.SIGTERM)
        if any(path not in ("success", "requeued") for path in self.outcomes.values()):
            return EXIT_ATTENTION
        return EXIT_OK

    def preflight(self, probe=False):
        """Every folder the watcher writes must be writable: exit 2 naming the folder,
        before any agent starts, instead of a finished task without a result. At start
        a file is created and removed in each (the truth, also on network mounts); before
        each task access() is asked (cheap; it sees read-only mounts and chattr +i, which
        stop root too)."""
        import errno
        for path in [self.handoff.dir(name) for name in HANDOFF_SUBDIRS] + [
                self.repo_git_dir] + ([self.worktrees] if self.isolated else []):
            try:
                if not probe:
                    if not os.access(path, os.W_OK | os.X_OK):
                        raise OSError(errno.EACCES, "not writable")
                    continue
                name = os.path.join(path, ".bridge-probe.%d.%s" % (os.getpid(), random_hex()))
                os.close(create_once(name))
                os.unlink(name)
            except OSError as exc:
                raise BridgeError("cannot write %s: %s; nothing was started (fix it, then run "
                                  "the watcher again)" % (path, exc.strerror or exc), EXIT_USAGE)

    STOP_GRACE = 4.0  # after SIGTERM/SIGINT, seconds any child may take before it is killed

    def overdue(self):
        """True once a stop was asked for more than STOP_GRACE seconds ago: every command
        still running then (agent, verification, git, bd) is killed, so the watcher is
        gone within 10 s in every state."""
        return self.stop_at is not None and time.monotonic() - self.stop_at > self.STOP_GRACE

    def nap(self, seconds):
        """Sleep, but wake for a stop at once (poll_sec may be an hour)."""
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end and not self.wake.is_set():
            self.wake.wait(min(0.2, max(0.0, end - time.monotonic())))
        self.wake.clear()

    def install_signals(self):
        import signal

        def handler(signum, _frame):
            self.stopping = signal.Signals(signum).name
            self.stop_at = self.stop_at or time.monotonic()
            for run in list(self.runs.values()):
                if run.child is not None:
                    signal_group(run.child.pid, signal.SIGTERM)
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[sig] = signal.signal(sig, handler)
            except ValueError:
                pass  # not the main thread
        return previous

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
                        for run in self.runs.values():  # each holds its lock (claim)
                            run.lock.heartbeat()
                    except OSError as exc:
                        self.say("heartbeat failed: %s" % exc)
        threading.Thread(target=beat, name="bridge-heartbeat", daemon=True).start()
        return done

    def loop(self):
        tasks_dir = self.handoff.dir("tasks")
        last_mtime, last_scan = None, 0.0
        try:
            while not self.stopping:
                try:
                    mtime = os.stat(tasks_dir).st_mtime_ns
                except FileNotFoundError:
                    raise BridgeError("%s disappeared" % tasks_dir, EXIT_FAILED)
                now = time.monotonic()
                worked = deferred = False
                if (mtime != last_mtime or now - last_scan >= 10.0 or self.once) \
                        and len(self.runs) < self.workers:
                    last_mtime, last_scan, self.graph = mtime, now, {}
                    for name in list_task_files(tasks_dir):
                        if self.stopping or len(self.runs) >= self.workers or self.failing:
                            last_mtime = None  # full: look again when a task ends
                            break
                        self.preflight()  # a task never runs to find it cannot write its result
                        outcome = self.start(name)
                        if outcome == "deferred":
                            deferred = True
                            last_mtime = None
                        elif outcome and outcome != "started":
                            worked = True
                        if self.settle(name, outcome):
                            return
                        if worked:  # re-read the queue: a task file that appeared during the run
                            last_mtime = None  # was held until now, and may sort first
                            break
                with self.beat_lock:
                    ended, self.finished = self.finished, []
                for name, outcome in ended:  # tasks that ran in threads of their own
                    worked, last_mtime = True, None
                    if self.settle(name, outcome):
                        return
                if worked:
                    continue
                if self.once and not deferred and not self.runs:
                    return
                self.nap(0.25 if self.once else self.poll)
            self.say("stopping on %s" % self.stopping)
        finally:
            self.join_tasks()

    def settle(self, name, outcome):
        """Note a task's outcome; True when the queue stops on it (stop_on_failure)."""
        self.interrupted = self.interrupted or outcome == "interrupted"
        if outcome == "failed" and (self.stop_on_failure or self.tamper_stop) \
                and not self.stopped_on_failure:
            self.stopped_on_failure = True
            self.say("the queue stopped on the failure of %s (set continue_on_failure "
                     "to go on); fix it, then run the watcher again%s" % (
                         name[:-5], " (once the %d running task(s) end)" % len(self.runs)
                         if self.runs else ""))
            self.notify("queue_stopped", name[:-5], *self.ended.get(name[:-5], (None, "null")))
        with self.beat_lock:
            self.ended.pop(name[:-5], None)
        return self.stopped_on_failure

    def start(self, name):
        """Take one queued task: with one worker it runs here, to its end; with more it is
        claimed here (so tasks start in queue order) and runs in a thread of its own
        ("started"). Returns its outcome."""
        import threading
        run = TaskRun(name, self.repo_git, self.repo_git_dir, self.root)
        self.local.run = run
        task = None
        try:
            task = self.claim(run)
            if isinstance(task, dict) and self.workers > 1:
                threading.Thread(target=self.task_thread, args=(run, task), daemon=True,
                                 name="bridge-task-" + run.task_id).start()
                return "started"
            return self.finish(run, task) if isinstance(task, dict) else task
        except Exception as exc:  # the last line of defence: see internal_error
            return self.internal_error(name, exc)
        finally:
            self.local.run = None
            if not isinstance(task, dict) or self.workers == 1:
                self.writes_for(run.task_id, done=True)

    def task_thread(self, run, task):
        """A task thread (workers > 1): the task to its end, its outcome for the loop."""
        self.local.run = run
        try:
            outcome = self.finish(run, task)
        except Exception as exc:
            outcome = self.internal_error(run.name, exc)
        self.writes_for(run.task_id, done=True)
        with self.beat_lock:
            self.finished.append((run.name, outcome))
        self.wake.set()

    def writes_for(self, task_id, done=False):
        """The watcher is about to write the files of `task_id` under .ai-handoff/ (until
        `done`): for the tasks running alongside, that is no agent tampering."""
        with self.beat_lock:
            if done:
                self.writers.discard(task_id)
                return
            self.writers.add(task_id)
            for run in self.runs.values():
                if run.task_id != task_id:
                    run.others.add(task_id)

    def join_tasks(self):
        """Wait for the task threads: each ends by itself (a stop ends its commands)."""
        import threading
        for thread in threading.enumerate():
            if thread.name.startswith("bridge-task-"):
                thread.join()
        for name, outcome in self.finished:
            self.settle(name, outcome)
        self.finished = []

    # -- startup sweep (crash recovery) --

    def sweep(self):
        """Recover tasks left in running/ by a watcher that died, before new work; then remove
        the task worktrees nothing needs (a re-queued task makes its own again)."""
        for name in os.listdir(self.git_dir):  # throwaway indexes of a crashed watcher
            if name.startswith("bridge-index."):
                pid = name.split(".")[1]
                if pid.isdigit() and holder_is_dead({"pid": int(pid), "host": os.uname().nodename}):
                    unlink_quietly(os.path.join(self.git_dir, name))
        results = self.handoff.dir("results")
        for name in os.listdir(results):  # a crashed watcher's half-written results
            if name.startswith(".") and name.endswith(".tmp"):  # (only watchers write here)
                os.unlink(os.path.join(results, name))
        running = self.handoff.dir("running")
        for name in list_task_files(running):
            self.local.run = TaskRun(name, self.repo_git, self.repo_git_dir, self.root)
            try:
                self.sweep_task(running, name)
            except Exception as exc:  # one task it cannot recover never stops every start
                self.internal_error(name, exc, quarantine=True)
            finally:
                self.local.run = None
        for name in os.listdir(self.handoff.dir("locks")):  # a task that ended, its lock not
            path = self.handoff.path("locks", name)         # dropped yet when the watcher died
            if name.endswith(".lock") and name != WORKER_LOCK and not os.path.islink(path) \
                    and os.path.isfile(path) and not os.path.lexists(
                        self.handoff.path("running", name[:-5] + ".json")) \
                    and FileLock.probe(path)[0] != "held":
                self.drop_lock_file(path)
        if self.worktrees:
            clear_worktrees(self.handoff, self.repo_git, task_worktrees(self.worktrees), self.say,
                            self.git_lock)

    def sweep_task(self, running, name):
        """Recover one task file left in running/ (see sweep)."""
        task_id = name[:-5]
        path = os.path.join(running, name)
        lock_path = self.handoff.path("locks", task_id + ".lock")
        state, meta = FileLock.probe(lock_path)
        if state == "held":
            self.say("%s is in running/ and its lock is held by %s; leaving it" % (
                task_id, describe_holder(meta)))
            return
        result = read_result(self.handoff, task_id)
        try:
            task = task_defaults(read_task_file(path, fresh_sec=0))
        except TaskFileError:
            task = None
        if result and task and result.get("attempt") == task.get("attempt"):
            # finished, crashed before tidying up: the result is the truth
            self.file_away(path, result)
            self.drop_lock_file(lock_path)
            return
        if meta and not meta.get("released_at") and not holder_is_dead(meta):
            limit = max((task or {}).get("timeout_sec", 1800) * 2, 7200)
            beat = meta.get("heartbeat_ts") or meta.get("created_ts") or 0
            if time.time() - beat <= limit:
                self.say("%s is in running/; its lock (%s) is not provably stale yet "
                         "(limit %ds); leaving it" % (task_id, describe_holder(meta), limit))
                return
            why = "lock older than %ds" % limit
        else:
            why = ("its watcher (%s) no longer runs" % describe_holder(meta) if meta
                   else "no lock held for it")
        self.recover(task_id, path, task, meta, why)

    def recover(self, task_id, path, task, meta, why):
        """Recovery of a stale run: every process group of the run killed, the work
        parked and the base checked out again, result, bead blocked, re-queue or failed/.
        The new lock carries what the run recorded, so a crash during the recovery is
        recovered the same way."""
        meta = meta or {}
        lock = FileLock(self.handoff.path("locks", task_id + ".lock"), meta={
            key: meta[key] for key in ("task_id", "timeout_sec", "attempt", "base_branch",
                                       "base_commit", "base_head", "branch", "dirty_before",
                                       "worktree")
            if key in meta})
        if not lock.acquire():
            return
        try:
            killed = kill_recorded_groups(meta)
            if task is None:
                safe = task_id if re.fullmatch(TASK_ID_PATTERN, task_id) else "invalid-" + random_hex()
                target = move_no_clobber(path, self.handoff.dir("failed"), os.path.basename(path))
                result = self.new_result(None, safe)
                result.update(status="failed", exit_path="failed", reason="stale_lock_recovered",
                              detail="stale (%s) and its task file is unreadable; moved to %s"
                              % (why, self.handoff.rel(target)))
                self.write_result(safe, result)
                return
            prompt_path = self.handoff.path("meta", task_id + ".prompt.md")
            if os.path.lexists(prompt_path):  # the agent's copy, as written: keep it redacted
                self.write_redacted(prompt_path, build_prompt(task, self.retry_context(task_id)))
            result = self.new_result(task)
            result["lock"] = {"recovered_from": meta, "why": why, "groups_killed": killed}
            result["git"].update({key: meta.get(key) for key in (
                "base_branch", "base_commit", "base_head", "branch", "dirty_before", "worktree")})
            parking = self.reenter_worktree(result) or self.park_interrupted(
                task_id, result, "stale_lock_recovered")
            retry = task["attempt"] < task["retry_policy"]["max_attempts"]
            detail = "task lock was stale (%s); %s" % (
                why, "re-queued as attempt %d" % (task["attempt"] + 1) if retry
                else "attempts exhausted (%d of %d); moved to failed/" % (
                    task["attempt"], task["retry_policy"]["max_attempts"]))
            result.update(status="failed", exit_path="failed", reason="stale_lock_recovered",
                          detail=detail + parking)
            bead_id = parse_bead_id(bead_output(self.handoff, task_id))
            if bead_id and self.beads.argv:
                error = self.beads.block(bead_id, "stale lock recovered: " + why)
                result["bead"].update(id=bead_id, error=error)
            self.say("%s: %s" % (task_id, detail))
            self.keeps_worktree(result)
            if retry:
                self.requeue(task_id, path, result, task["attempt"] + 1)
            else:
                self.write_result(task_id, result)
                move_no_clobber(path, self.handoff.dir("failed"), task_id + ".json")
            self.remove_worktree(result)
        finally:
            lock.release()
            self.drop_lock_file(lock.path)

    def reenter_worktree(self, result):
        """Crash recovery of a task that ran in a worktree: its git pointed there again ('');
        else why there is nothing to park."""
        path, branch = result["git"].get("worktree"), "feat/ai/" + result["id"]
        if not path:
            return ""
        if self.worktrees is None or path != os.path.join(self.worktrees, result["id"]) or \
                result["git"]["branch"] != branch:
            # locks/ is the agent's to write: a lock naming another worktree (one of yours) or
            # branch is never parked (WIP-committed) or removed
            return "; its lock names the worktree %s on %s, not this task's: left as it is" % (
                json_compact(path), json_compact(result["git"]["branch"]))
        if not os.path.lexists(path):
            return "; its worktree %s was not there (never made, or already removed)" % path
        with self.git_lock:
            if self.repo_git.drop_unmade_worktree(path):
                return "; its worktree %s was made only in part: removed" % path
        try:
            self.use_worktree(path)
        except Stop as exc:
            return "; " + exc.detail
        self.current.owned = self.git.current_branch() == result["git"]["branch"]
        return "" if self.current.owned else "; its worktree %s is not on %s: left as it is" % (
            path, result["git"]["branch"])

    def park_interrupted(self, task_id, result, why):
        """park() for a run that was interrupted (crash or stop); '' or a note saying
        why the work could not be parked."""
        try:
            self.park(task_id, result, why, "interrupted")
        except (BridgeError, Stop) as exc:
            return "; parking the interrupted work failed: %s" % getattr(exc, "message", exc)
        return ""

    def requeue(self, task_id, path, result, attempt):
        """Write the result, archive it in the history and queue the task file again as
        `attempt`. A crash on the way leaves a duplicate history record, never a loss."""
        self.write_result(task_id, result, final=False)
        archive_result(self.handoff, task_id, "re-queued for attempt %d" % attempt)
        self.outcomes[task_id] = "requeued"
        requeued = dict(read_task_file(path, fresh_sec=0))
        requeued["attempt"] = attempt
        atomic_write_json(self.handoff.path("tasks", task_id + ".json"), requeued)
        os.unlink(path)

    def file_away(self, running, result):
        """Where a task file goes once its result is written: gone after a success,
        pending/ to wait for approval, else failed/ (kept, never overwritten)."""
        state = {"success": None, "needs_confirmation": "pending"}.get(result.get("exit_path"),
                                                                       "failed")
        if state is None:
            os.unlink(running)
        else:
            move_no_clobber(running, self.handoff.dir(state), os.path.basename(running))

    @staticmethod
    def drop_lock_file(path):
        # Safe: only the holder of the worker lock ever takes task locks.
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    # -- one task --

    def claim(self, run):
        """A queued task file validated, locked and moved to running/: the task (a dict);
        else what became of it (an outcome, or None: not now)."""
        name, stem = run.name, run.task_id
        path = self.handoff.path("tasks", name)
        try:
            task = read_task_file(path)
        except TaskFileError as exc:
            if exc.defer:
                return "deferred"
            return self.refuse(path, stem, exc)
        unknown = unknown_executor(task, self.config)
        if unknown:
            return self.refuse(path, stem, TaskFileError([unknown], raw=task))
        task = task_defaults(task)
        task_id = task["id"]
        result_history(self.handoff, task_id)  # unreadable: stop now, not after the agent ran
        existing = duplicate_of(self.handoff, task)
        if existing is not None:
            if existing.get("attempt") == task["attempt"] and existing.get("reason") in (
                    "dependency_failed", "dependency_cycle"):  # blocked from tasks/, the
                self.writes_for(task_id)
                self.file_away(path, existing)  # watcher died before the move: finish it
                self.say("%s: blocked (%s) by an earlier run; its task file is now in "
                         "failed/" % (task_id, existing["reason"]))
                self.outcomes[task_id] = "blocked"
                return "blocked"
            if task_id not in self.warned:
                self.warned.add(task_id)
                self.say("%s already has a result for attempt %s: skipped (idempotency); use "
                         "`submit --retry` to run it again" % (task_id, task["attempt"]))
            return None
        if os.path.exists(self.handoff.path("results", task_id + ".json")):
            self.writes_for(task_id)
            archive_result(self.handoff, task_id, "superseded by attempt %d" % task["attempt"])
        running = self.handoff.path("running", name)
        if os.path.lexists(running):
            if task_id not in self.warned:
                self.warned.add(task_id)
                self.say("%s is queued but also in running/; skipped until that one is recovered"
                         % task_id)
            return None
        run.start = self.start_point(path, task)
        if not isinstance(run.start, tuple):
            return run.start
        self.writes_for(task_id)  # only now: a task that waits is no reason to look away
        lock = FileLock(self.handoff.path("locks", task_id + ".lock"),
                        meta={"task_id": task_id, "timeout_sec": task["timeout_sec"],
                              "attempt": task["attempt"]})
        if not lock.acquire():
            self.say("%s: task lock held by %s; skipped" % (task_id, describe_holder(lock.holder)))
            return None
        with self.beat_lock:
            run.lock, self.runs[task_id] = lock, run
        try:
            os.rename(path, running)
        except BaseException:
            self.release(run)
            raise
        return task

    def finish(self, run, task):
        """A claimed task from the confirmation gate to its result; its lock released."""
        try:
            return self.execute(task, self.handoff.path("running", run.name), run.start)
        finally:
            self.release(run)

    def release(self, run):
        with self.beat_lock:
            run.lock.release()
            self.runs.pop(run.task_id, None)
        run.child = None
        self.drop_lock_file(run.lock.path)

    def start_point(self, path, task):
        """May `task` start now, and from where: the one place the scheduler asks. A tuple
        (start commit, dependencies) when it may (commit None: what your checkout has checked
        out, as for a task with no `depends_on`); None while it waits (said once; the queue goes
        on with the next task); else the outcome of blocking it (dependency_failed, ...)."""
        if not task["depends_on"]:
            return None, []
        found = dependency_state(self.handoff, task, self.git, graph=self.graph)
        doubted = self.doubted(found["deps"]) if found["state"] != "waiting" else []
        if doubted:
            found.update(state="waiting", detail="waiting: the result of %s was written while "
                         "other agents ran; it counts once their checks passed" % ", ".join(doubted))
        state, detail = found["state"], found["detail"]
        if state == "ready":
            return found["start"], found["deps"]
        if state == "waiting":
            self.outcomes[task["id"]] = "waiting"  # until it runs in this run (exit_code)
            if (task["id"], detail) not in self.warned:
                self.warned.add((task["id"], detail))
                self.say("%s: %s" % (task["id"], detail))
            return None
        self.writes_for(task["id"])
        result = self.new_result(task)
        result.update(status="blocked", exit_path="blocked", reason=found["reason"], detail=detail,
                      dependencies=found["deps"], finished_at=now_iso())
        result["bead"]["skipped"] = "the task never started"
        self.write_result(task["id"], result)
        move_no_clobber(path, self.handoff.dir("failed"), os.path.basename(path))
        self.say("%s: blocked (%s): %s" % (task["id"], found["reason"], detail))
        return "blocked"

    def doubted(self, deps):
        """Ids of `deps` whose record (result, else history) an agent running now may have
        forged: not this watcher's own write, and changed since the first running task
        started (ctime, which no agent can set back). Its tamper check moves a forgery away
        when it ends; until then the record decides nothing."""
        with self.beat_lock:
            since = min((run.since for run in self.runs.values()), default=None)
        doubted = []
        for dep in deps if since is not None else ():
            for path in (self.handoff.path("results", dep["id"] + ".json"),
                         self.handoff.history_path(dep["id"])):
                try:
                    info = os.lstat(path)
                except FileNotFoundError:
                    continue
                if info.st_ctime_ns >= since and self.wrote.get(path) != (info.st_ino,
                                                                           info.st_ctime_ns):
                    doubted.append(dep["id"])
                break
        return doubted

    def refuse(self, path, stem, exc):
        """schema_invalid: result (exit_path skipped), file moved to failed/."""
        task_id = stem if re.fullmatch(TASK_ID_PATTERN, stem) else "invalid-%s" % random_hex()
        self.writes_for(task_id)
        target = move_no_clobber(path, self.handoff.dir("failed"), os.path.basename(path))
        # a lone surrogate (refused) kept as "?": the result must be writable as UTF-8
        snapshot = parse_json(json.dumps(exc.raw, ensure_ascii=False).encode("utf-8", "replace")) \
            if isinstance(exc.raw, dict) else None
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
        """Every field of the result schema, so each exit path writes them all. `task` may be
        a refused (partial) task or None."""
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
                    "commit": None, "wip_commit": None, "returned_to_base": None,
                    "base_head": None, "worktree": None, "worktree_kept": None},
            "dependencies": [],
            "executor": None,
            "commands": [],
            "artifacts": {"patch_pre": None, "patch_post": None, "logs": None,
                          "prompt": None, "history": None},
            "patch_redacted": {"pre": False, "post": False},
            "previous_results": [],
            "retry_context": None,
            "task_snapshot": task,
            "watcher": {"pid": os.getpid(), "host": os.uname().nodename, "version": __version__},
        }

    def write_result(self, task_id, result, final=True):
        """The single source of truth: redacted, atomic, always written. A `final` result
        (the task ended, it is not re-queued) is then told to notify.command."""
        result = dict(result)
        result.setdefault("id", task_id)
        result["timestamp"] = now_iso()
        history = self.handoff.history_path(task_id)
        if os.path.lexists(history):
            try:
                result["previous_results"] = [
                    {k: r.get(k) for k in ("attempt", "status", "reason", "exit_path",
                                           "timestamp", "archived_because")}
                    for r in result_history(self.handoff, task_id)]
            except BridgeError as exc:  # e.g. a FIFO there: the result is written all the same
                result["history_error"] = exc.message
            result.setdefault("artifacts", {})["history"] = self.handoff.rel(history)
        try:
            data = json.dumps(self.redactor.redact_obj(result), ensure_ascii=False, indent=2)
        except Exception as exc:  # e.g. a snapshot nested too deeply to redact or encode
            result = {key: result.get(key) for key in ("id", "status", "exit_path", "reason",
                                                       "detail", "attempt", "timestamp")}
            result["result_error"] = "the full result could not be encoded (%s: %s); only its " \
                "outcome is kept" % (type(exc).__name__, str(exc)[:200])
            data = json.dumps(self.redactor.redact_obj(result), ensure_ascii=False, indent=2)
        path = self.handoff.path("results", task_id + ".json")
        while self.current and self.current.unsynced:  # the patches and prompt it names first
            _fsync_dir(self.current.unsynced.pop())
        atomic_write(path, data + "\n")
        info = os.lstat(path)
        with self.beat_lock:  # task threads write results at once
            self.wrote[path] = (info.st_ino, info.st_ctime_ns)
            key = result.get("exit_path") if final else "requeued"  # the done: line
            self.counts[key] = self.counts.get(key, 0) + 1
            self.outcomes[task_id] = result.get("exit_path")
            if final:  # settle tells queue_stopped what we wrote, not what the file holds then
                self.ended[task_id] = (result.get("reason"), data)
        if final:
            self.notify(result.get("status"), task_id, result.get("reason"), data)

    def notify(self, event, task_id, reason, data):
        """Run notify.command when notify.on names `event` (a task's status, or
        queue_stopped): no shell, its own group, notify.timeout_sec, the redacted result
        JSON `data` on stdin, its output in the task's log. A notifier that fails or hangs is
        logged and said, and changes nothing else."""
        template = self.config["notify"]["command"]
        if not template or event not in self.config["notify"]["on"]:
            return
        try:  # nothing here may reach the caller: the result is written, the outcome stands
            argv = fill_template(template, {
                "id": task_id, "status": str(event), "reason": str(reason),
                "result_file": self.handoff.path("results", task_id + ".json")})
            done = run_command(argv, cwd=self.root, timeout=self.config["notify"]["timeout_sec"],
                               stdin_data=data, stop=self.overdue, kill_grace=1.0)
            self.log(task_id, "--- notify (%s): %s\n--- stdout\n%s\n--- stderr\n%s\n--- notify %s\n"
                     % (event, " ".join(argv), done.stdout, done.stderr, done.describe()))
            problem = None if done.ok else done.describe()
        except Exception as exc:  # e.g. an unwritable log
            problem = "%s: %s" % (type(exc).__name__, getattr(exc, "message", exc))
        if problem:
            self.say("%s: warning: notify.command %s (logged; the task's outcome stands)" % (
                task_id, problem))

    def git_snapshot(self):
        """HEAD, branch and porcelain status (.ai-handoff/ excluded) in ONE git call:
        `status --porcelain=v2 --branch` carries the HEAD commit and branch in its header;
        entries are rendered back to the familiar v1 `XY path` lines."""
        # --ignore-submodules=dirty: git would run `git status` inside each nested repository
        # (see Git.add_all); a gitlink's own change still shows
        result = self.git.run("status", "--porcelain=v2", "-z", "--branch", "--untracked-files=all",
                              "--ignore-submodules=dirty", "--", ".",
                              *[":(exclude)%s" % p for p in self.exclude], check=False)
        if not result.ok:
            return {"head": self.git.head(), "current_branch": self.git.current_branch(),
                    "status": "git status failed: %s" % result.stderr.strip()[-300:],
                    "dirty": True}  # fail closed
        state, moved = {"head": None, "current_branch": None}, {}
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
                if parts[1] == ".M" and parts[2][0] == "S":  # a submodule at another commit
                    moved[lines[-1]] = parts[-1]
            elif field[:2] == "2 ":
                parts = field.split(" ", 9)
                origin = fields[index] if index < len(fields) else ""
                index += 1
                lines.append("%s %s -> %s" % (parts[1].replace(".", " "), origin, parts[-1]))
            elif field[:2] in ("? ", "! "):
                lines.append("%s %s" % (field[0] * 2, field[2:]))
        if moved:  # one your submodule.<name>.ignore=all hides, as git's own status does
            keys = {}  # (--ignore-submodules overrides it): .git/config's, else .gitmodules'
            for where in (("-f", ".gitmodules"), ()):
                for entry in self.git.run("config", "-z", *where, "--get-regexp", r"^submodule\..*\."
                                          r"(path|ignore)$", check=False).stdout.split("\0"):
                    key, _, value = entry.partition("\n")
                    name, _, field = key[10:].rpartition(".")
                    keys.setdefault(name, {})[field] = value
            ignored = {sub.get("path") for sub in keys.values() if sub.get("ignore") == "all"}
            lines = [line for line in lines if line not in moved or moved[line] not in ignored]
        state["status"] = "".join(line + "\n" for line in lines)
        state["dirty"] = bool(lines)
        return state

    def audit(self, base):
        """(patch, shortstat, raw) from base to the work tree: one temp-index diff (kernel);
        raw is git's --raw lines (the modes of each path, which a pure rename's patch lacks)."""
        try:
            out = self.git.worktree_diff(base, self.exclude, "--raw", "--binary", "--shortstat", "-p")
        except BridgeError:  # e.g. git cannot add a nested repository without a commit
            listed = self.git.run("ls-files", "-z", "-o", "--exclude-standard", check=False)
            # a folder it lists is a repository (it lists the files of any other)
            nested = [path[:-1] for path in listed.stdout.split("\0") if path.endswith("/")]
            if nested:
                self.nested_repositories(nested)
            raise
        head, _, patch = out.partition("\n\n")  # no change: "", "", ""
        raw, _, stat = head.rpartition("\n")
        return patch, stat.strip(), raw

    def commit_all(self, message):
        """Commit everything but .ai-handoff/ on the current branch; the new sha or None."""
        with self.git_lock:  # a ref update: one at a time across the task threads
            return self.git.commit_all(message)

    def note_in_task_lock(self, **fields):
        """Record fields in the held task lock's metadata (read by a later crash recovery)."""
        with self.beat_lock:
            lock = self.current.lock
            lock.extra.update(fields)
            lock.meta.update(fields)
            lock.heartbeat()

    def run_child(self, cmd, task, step, shell=False, env=None, idle_timeout=None):
        """An agent or verify command with the task timeout, group kill and progress."""
        run = self.current

        def started(proc):
            run.child = proc
            if self.stopping:  # the signal came between two steps: stop this one at once
                import signal
                signal_group(proc.pid, signal.SIGTERM)
            # every group, so a crash recovery can end them all
            group = {"pid": proc.pid, "start_ticks": _start_ticks(proc.pid), "step": step}
            self.note_in_task_lock(groups=run.lock.meta.get("groups", []) + [group])

        def tick(elapsed):
            self.say("%s: %s still running (%ds)" % (task["id"], step, int(elapsed)))
        try:
            return run_command(cmd, cwd=run.work, env=env, timeout=task["timeout_sec"],
                               shell=shell, on_tick=tick, tick_sec=self.config["progress_sec"],
                               on_start=started, stop=self.overdue,
                               cap_bytes=max(self.cap * 64, 8 << 20), idle_timeout=idle_timeout)
        finally:
            run.child = None

    def execute(self, task, running, start=None):
        """A task already in running/ under its lock, from the confirmation gate to its
        result. `start`: (commit, deps) of a task with dependencies (see dependencies)."""
        task_id = task["id"]
        result = self.current.result = self.new_result(task)
        started = time.monotonic()
        outcome = None
        if start:
            result["dependencies"] = start[1]
        try:
            outcome = self.steps(task, running, result, start and start[0])
        except Stop as stop:
            result.update(status=stop.status, exit_path=stop.status, reason=stop.reason,
                          detail=stop.detail)
        except Exception as exc:  # the result is still written: no silent failure
            result.update(status="failed", exit_path="failed", reason="internal_error",
                          detail=self.log_exception(task_id, exc))
        if outcome != "pending":
            interrupted = result["reason"] == "interrupted"
            if interrupted:  # ends like a crash recovery, but the attempt does not count
                result["detail"] += self.park_interrupted(task_id, result, "interrupted") + (
                    "; re-queued as attempt %d (an interrupted run is not an attempt)"
                    % task["attempt"])
            if result["status"] != "success":
                self.after_failure(task, result)
            result["duration_ms"] = int((time.monotonic() - started) * 1000)
            result["finished_at"] = now_iso()
            self.keeps_worktree(result)
            # the queue stops on a failure: no task starts once its result can be seen
            self.failing = self.failing or result["exit_path"] == "failed" and (
                self.stop_on_failure or self.tamper_stop)
            if interrupted:
                self.say("%s: interrupted: %s" % (task_id, result["detail"]))
                self.requeue(task_id, running, result, task["attempt"])
                self.remove_worktree(result)
                return "interrupted"
            self.write_result(task_id, result)
            # the result is written first: a crash now leaves a result, never a lost task
            self.file_away(running, result)
            self.remove_worktree(result)
            self.say("%s: %s (%s)%s" % (task_id, result["status"], result["reason"],
                                        (": " + result["detail"]) if result["detail"] else ""))
        return result["exit_path"]

    def log_exception(self, task_id, exc):
        """Put an unexpected exception's traceback in the task's log; its one-line summary."""
        import traceback
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        if debug_enabled():
            sys.stderr.write(trace)
        summary = (isinstance(exc, OSError) and os_error_message(exc)) or "%s: %s" % (
            type(exc).__name__, getattr(exc, "message", exc))
        try:
            self.log(task_id, "--- internal error (a bug in bridge.py or a broken .ai-handoff/)\n"
                     + trace)
        except Exception as again:
            summary += " (and the traceback could not be logged: %s)" % again
        return summary

    def internal_error(self, name, exc, quarantine=False):
        """The last line of defence: an exception no step expected while one task was
        processed (or recovered, when quarantine=True). That task alone fails: a result
        with reason internal_error and the traceback in its log, its file moved from
        running/ (or tasks/) to failed/, the repository back on the base branch; then the
        queue goes on, or stops per stop_on_failure. Each step is tried on its own: what
        cannot be done is said, never raised."""
        stem = name[:-5] if name.endswith(".json") else name
        task_id = stem if re.fullmatch(TASK_ID_PATTERN, stem) else "invalid-" + random_hex()
        self.writes_for(task_id)
        run = self.current
        result = (run and run.result) or self.new_result(None, task_id)
        if run:
            run.result = None
        detail = self.log_exception(task_id, exc)
        problems = []
        git_state = result["git"]
        if git_state.get("branch") and not git_state.get("returned_to_base") and (
                git_state["branch"] != git_state.get("base_branch") or self.continue_on_failure):
            try:
                self.park(task_id, result, "internal_error")
            except Exception as again:
                problems.append("returning to base failed: %s" % again)
        for state in ("running", "tasks"):
            path = self.handoff.path(state, name)
            if os.path.lexists(path):
                try:
                    where = move_no_clobber(path, self.handoff.dir("failed"), name)
                    detail += "; moved from %s/ to %s" % (state, self.handoff.rel(where))
                except OSError as again:
                    problems.append("moving %s/%s to failed/ failed: %s" % (state, name, again))
                break
        result.update(status="failed", exit_path="failed", reason="internal_error",
                      detail=detail + "".join("; " + p for p in problems),
                      finished_at=now_iso())
        result["artifacts"]["logs"] = self.handoff.rel(self.handoff.path("logs", task_id + ".log"))
        try:
            try:
                archive_result(self.handoff, task_id, "superseded by an internal_error")
            except (BridgeError, OSError) as again:  # e.g. a FIFO there: moved, never opened
                where = move_no_clobber(self.handoff.path("results", task_id + ".json"),
                                        self.handoff.dir("meta"), task_id + ".result-unreadable")
                result["detail"] += "; the previous result could not be archived (%s): moved " \
                    "to %s" % (getattr(again, "message", again), self.handoff.rel(where))
            self.write_result(task_id, result)
        except Exception as again:
            problems.append("its result could not be written: %s" % again)
        self.say("%s: %s (internal_error): %s%s" % (
            task_id, "quarantined" if quarantine else "failed", detail[:400],
            "".join("; " + p for p in problems)))
        return "failed"

    def steps(self, task, running, result, start=None):
        task_id = task["id"]
        git_state = result["git"]
        # confirmation gate: before any git change
        if task["requires_confirmation"] and not task.get("approved_at"):
            snap = self.git_snapshot()
            git_state.update(branch=snap["current_branch"], base_branch=snap["current_branch"],
                             base_commit=snap["head"], dirty_before=snap["dirty"],
                             status_before=snap["status"], status_porcelain=snap["status"])
            result["bead"]["skipped"] = "not created before approval"
            result.update(status="needs_confirmation", exit_path="needs_confirmation",
                          reason="requires_confirmation",
                          detail="waiting in pending/; run `bridge.py approve %s`" % task_id)
            self.write_result(task_id, result)
            self.file_away(running, result)
            self.say("%s: needs confirmation (bridge.py approve %s)" % (task_id, task_id))
            return "pending"
        snap = (self.enter_worktree if self.isolated else self.enter_checkout)(task, result, start)
        self.bead_create(task, result)
        # the editing agent
        result["retry_context"] = self.retry_context(task_id)
        prompt = build_prompt(task, result["retry_context"])
        prompt_path = self.handoff.path("meta", task_id + ".prompt.md")
        result["artifacts"]["logs"] = self.handoff.rel(self.handoff.path("logs", task_id + ".log"))
        self.log(task_id, "=== %s attempt %d started %s on %s (base %s)%s\n" % (
            task_id, task["attempt"], now_iso(), git_state["branch"], git_state["base_commit"],
            " in the worktree %s" % self.work if git_state["worktree"] else ""))
        name = task.get("executor")
        template = self.executors[name] if name else self.config["executor"]["command"]
        argv = fill_template(template, {"prompt": prompt, "prompt_file": prompt_path,
                                        "task_file": running, "id": task_id, "root": self.work})
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in self.config["executor"]["env"].items()})
        env.update(BRIDGE_TASK_ID=task_id, BRIDGE_TASK_FILE=running, BRIDGE_PROMPT_FILE=prompt_path,
                   BRIDGE_ROOT=self.work)
        self.say("%s: running the editing agent (%s)" % (task_id, name or template[0]))
        with self.beat_lock:  # the watcher's writes for tasks running alongside are not the agent's
            self.current.others.update(self.writers - {task_id})
        guard = Fingerprint(self.handoff, self.git_dir, task_id, self.git.config_files(),
                            (git_state["branch"], git_state["base_branch"]), self.work,
                            self.current.others)
        # the base branch's tip, taken before the checkout; in a worktree the base branch is
        # yours to commit on meanwhile
        guard.base_tip = None if git_state["worktree"] else snap["head"]
        attributes = attribute_filter_lines(self.audit(git_state["base_commit"])[0]) \
            if snap["dirty"] else set()
        # The agent reads the task as written (like the task file in running/, stored as
        # given), written only now (a step failing before would leave it so); the copy kept
        # once the agent is done is redacted.
        kept = self.redact(prompt)
        atomic_write(prompt_path, prompt, durable=self.current.unsynced if kept == prompt else False)
        result["artifacts"]["prompt"] = self.handoff.rel(prompt_path)
        try:
            ran = self.run_child(argv, task, "agent", env=env,
                                 idle_timeout=self.config["agent_idle_timeout_sec"])
            self.tamper_check(guard, result, "the editing agent")  # before any further git call
        finally:
            if kept != prompt:
                atomic_write(prompt_path, kept, durable=self.current.unsynced)
        self.log(task_id, "--- agent: %s\n--- stdout\n%s\n--- stderr\n%s\n--- agent %s%s\n" % (
            " ".join(template), ran.stdout, ran.stderr, ran.describe(), dropped_note(ran)))
        result["executor"] = {
            "name": name, "argv": [self.redact(a)[:500] for a in template],
            "exit_code": ran.exit_code, "timed_out": ran.timed_out, "signal": ran.signal,
            "duration_ms": int(ran.duration * 1000), "dropped_bytes": ran.dropped_bytes,
            "stdout": cap_text(self.redact(ran.stdout), self.cap, task_id),
            "stderr": cap_text(self.redact(ran.stderr), self.cap, task_id),
            "error": ran.error,
        }
        # audit 1 (also the partial evidence when the agent failed)
        self.audit_into(task_id, result, "pre", attributes)
        if self.stopping:
            raise Stop("failed", "interrupted", "the watcher received %s while the agent ran; "
                       "the agent was stopped" % self.stopping)
        if ran.idle:  # most likely waiting for an answer nobody will give
            self.post_state(result)
            result["executor"]["last_lines"] = last_lines(self.redact(ran.stdout)) + [
                "stderr: " + line for line in last_lines(self.redact(ran.stderr))]
            raise Stop("blocked", "agent_idle", "the editing agent %s (waiting for an answer?); "
                       "its last output is in executor.last_lines" % ran.describe())
        if not ran.ok:
            self.post_state(result)
            raise Stop("failed", "opencode_failed", "the editing agent %s" % ran.describe())
        # verify
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
                "duration_ms": int(done.duration * 1000), "dropped_bytes": done.dropped_bytes,
                "stdout": cap_text(self.redact(done.stdout), self.cap, task_id),
                "stderr": cap_text(self.redact(done.stderr), self.cap, task_id),
            })
            self.tamper_check(guard, result, "verification command %d" % (index + 1))
            if not done.ok:
                failed = (command, done)
        # audit 2
        self.audit_into(task_id, result, "post", attributes)
        self.post_state(result)
        if self.stopping:
            raise Stop("failed", "interrupted", "the watcher received %s during verification; "
                       "the verification was stopped" % self.stopping)
        if failed is not None:
            raise Stop("failed", "verify_failed", "`%s` %s" % (failed[0][:200], failed[1].describe()))
        # success: commit on the task branch, return to base, close the bead
        if self.config["commit_on_success"] and git_state["dirty_after_verify"]:
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

    def retry_context(self, task_id):
        """The prompt section telling a task what went wrong in its last failed or blocked
        run (before crash recovery, a stop or `submit --retry` queued it again): the reason,
        the failing verification command (or the agent's run) and the end of its output.
        Taken from the redacted result history, each part redacted again (with today's
        patterns) before it is cut, at most retry_context_bytes (the output's tail gives way
        first). None when retry_context is off or no run failed
        (a task refused or held back by its dependencies never ran: nothing to learn)."""
        if not self.config["retry_context"]:
            return None
        last = next((r for r in reversed(result_history(self.handoff, task_id))
                     if r.get("status") in ("failed", "blocked") and r.get("exit_path") != "skipped"
                     and r.get("reason") not in ("dependency_failed", "dependency_cycle")), None)
        if last is None:
            return None
        cap = self.config["retry_context_bytes"]

        def clip(value, size):  # the redacted text's first `size` bytes, whole characters
            return self.redact(str(value or "")).encode()[:size].decode("utf-8", "ignore")
        text = "## What went wrong last time\n%s%s" % (clip("Attempt %s ended %s (%s): " % (
            last.get("attempt"), last.get("status"), last.get("reason")), cap // 4),
            clip(last.get("detail"), cap // 8))
        commands = last.get("commands")
        failing = next((c for c in (commands if commands.__class__ is list else ()) if isinstance(c, dict)
                        and not c.get("skipped") and c.get("exit_code") != 0), None)
        ran = failing or (last.get("executor") if last.get("reason") != "interrupted" else None)
        if isinstance(ran, dict):  # how it ended: a run stopped or killed has no exit code
            ended = clip("timed out" if ran.get("timed_out") else "exit %s" % ran["exit_code"]
                         if ran.get("exit_code") is not None else "killed by signal %s" % ran["signal"]
                         if ran.get("signal") else ran.get("error") or "no exit code", cap // 8)
            text += "\n%s. The end of its output:\n```\n" % (
                "The failing verification command: `%s` (%s)" % (clip(failing.get("cmd"), cap // 8),
                                                                 ended) if failing
                else "The editing agent's run (%s)" % ended)
            output = self.redact("\n".join(str(ran.get(k) or "").strip()
                                           for k in ("stdout", "stderr")).strip())
            room = max(cap - len(text.encode()) - 4, 0)  # 4: the closing "\n```"
            tail = output.encode()[-room:].decode("utf-8", "ignore") if room else ""
            if len(tail) < len(output):
                tail = tail.partition("\n")[2]  # whole lines only
            text += tail.replace("```", "'''") + "\n```"
        return text

    def enter_checkout(self, task, result, start=None):
        """Checkout isolation: the dirty check and git state, captured before the agent runs,
        then the task's branch checked out in your work tree (from `start`, a dependency's
        commit, else HEAD). Returns the snapshot."""
        task_id, git_state = task["id"], result["git"]
        snap = self.git_snapshot()
        base_branch = snap["current_branch"]
        git_state.update(base_branch=base_branch, base_commit=snap["head"],
                         dirty_before=snap["dirty"], status_before=snap["status"])
        operation = next((name for name in ("MERGE_HEAD", "rebase-merge", "rebase-apply",
                                            "CHERRY_PICK_HEAD", "REVERT_HEAD")
                          if os.path.exists(os.path.join(self.git_dir, name))), None)
        if operation:
            raise Stop("blocked", "dirty_repo", "a git operation is in progress (%s); finish or "
                       "abort it first" % operation)
        if snap["dirty"] and not task["allow_dirty"]:
            raise Stop("blocked", "dirty_repo", "the work tree has uncommitted changes "
                       "(see git.status_before); commit or stash them, or set allow_dirty")
        if snap["head"] is None:
            raise Stop("blocked", "branch_checkout_failed", "the repository has no commit yet "
                       "(unborn branch); commit something first")
        # branch: off protected branches (and detached HEAD) onto feat/ai/{id}, and so is
        # a task that starts from a dependency's commit instead of the checkout's HEAD
        start = start or snap["head"]
        branch = base_branch
        if base_branch is None or base_branch in self.protected or start != snap["head"]:
            branch = "feat/ai/" + task_id
        # recorded before any git change: a crash from here on returns to this base
        git_state.update(base_commit=start, base_head=snap["head"], branch=branch)
        self.note_in_task_lock(base_branch=base_branch, base_commit=start, base_head=snap["head"],
                               branch=branch, dirty_before=snap["dirty"])
        if branch != base_branch and self.task_branch(
                task, result, ("checkout", "-q", "-b", branch, start), ("checkout", "-q", branch)):
            git_state["base_commit"] = self.git.head()
        return snap

    def enter_worktree(self, task, result, start=None):
        """Worktree isolation: the task's own worktree WORKTREES/{id} on feat/ai/{id}, made
        from `start` (a dependency's commit), else from what your checkout has checked out (or
        from the branch an earlier run of the task left); your checkout, index and branch are
        never touched, so your uncommitted changes neither block the task nor reach it. A
        worktree left by an earlier run is used again, what it holds committed first (WIP).
        Returns the snapshot of the worktree."""
        task_id, git_state = task["id"], result["git"]
        head, base_branch = self.checkout_head()
        base = start or head
        path, branch = os.path.join(self.worktrees, task_id), "feat/ai/" + task_id
        git_state.update(base_branch=base_branch, base_commit=base, base_head=head, branch=branch,
                         worktree=path)
        # recorded before any git change: a crash from here on finds the worktree
        self.note_in_task_lock(base_branch=base_branch, base_commit=base, base_head=head,
                               branch=branch, worktree=path, dirty_before=False)
        reused, fresh = os.path.lexists(path), False
        if not reused:
            reused = self.task_branch(task, result, ("branch", branch, base),
                                      ("worktree", "add", "-q", path, branch))
            fresh = not reused
            if fresh:
                with self.git_lock:
                    try:
                        self.repo_git.add_worktree(path, branch)
                    except BridgeError as exc:  # nothing is on the branch made a moment ago
                        git_state["branch_created"] = not self.repo_git.run(
                            "update-ref", "-d", "refs/heads/" + branch, base, check=False).ok
                        raise Stop("blocked", "branch_checkout_failed", exc.message)
        self.use_worktree(path, fresh)
        # git has just checked the base out on a new branch there: index and files are that
        # commit's, and nothing else is in the folder (one git status less per task), while
        # its HEAD still names that branch
        fresh = fresh and _read_small(os.path.join(self.current.git_dir, "HEAD")) == \
            "ref: refs/heads/" + branch
        snap = {"head": base, "current_branch": branch, "status": "", "dirty": False} if fresh \
            else self.git_snapshot()
        if snap["current_branch"] != branch:
            raise Stop("blocked", "branch_checkout_failed", "%s is not a worktree on %s; remove it "
                       "(`bridge.py unlock --worktrees`) or rename the task" % (path, branch))
        self.current.owned = True
        if reused and snap["dirty"]:
            wip = self.commit_all("WIP(bridge): %s left by an earlier run - NOT verified\n" % task_id)
            self.log(task_id, "--- the worktree left by an earlier run held changes: committed "
                     "as WIP %s\n" % wip)
            snap = self.git_snapshot()
        git_state.update(base_commit=snap["head"], dirty_before=snap["dirty"],
                         status_before=snap["status"])
        return snap

    def checkout_head(self):
        """(commit, branch or None when detached) your checkout has checked out. git is asked
        again only once a file it keeps HEAD or that branch in changed (Fingerprint.refs),
        their signatures taken before it answers: one process less per task. Only while HEAD
        names that branch itself (not a branch that is a symbolic ref, nor a reftable's stub)."""
        git_dir, seen = self.repo_git.git_dir(), self.head_seen
        named = _read_small(os.path.join(git_dir, "HEAD")) or ""
        refs = Fingerprint.ref_signatures(Fingerprint.refs(git_dir, [named[16:]] if named.startswith(
            "ref: refs/heads/") else ()))
        if seen and seen[0] == refs:
            return seen[1]
        now = self.repo_git.run("rev-parse", "HEAD", "--symbolic-full-name", "HEAD", check=False)
        if not now.ok:
            raise Stop("blocked", "branch_checkout_failed", "the repository has no commit yet "
                       "(unborn branch); commit something first")
        head, full = now.stdout.split()
        branch = full[11:] if full.startswith("refs/heads/") else None  # else detached
        self.head_seen = (refs if named in ("ref: " + full, head) else None), (head, branch)
        return self.head_seen[1]

    def use_worktree(self, path, fresh=False):
        """Point this task's git at its worktree (once git confirms it is one)."""
        try:
            git, git_dir = self.repo_git.worktree(path, fresh)
        except BridgeError as exc:
            raise Stop("blocked", "branch_checkout_failed", exc.message)
        git.stop = self.overdue
        self.current.git, self.current.git_dir, self.current.work = git, git_dir, path

    def task_branch(self, task, result, create, switch):
        """Put the task on its branch with git `create`; when the branch exists from an earlier
        run of this task (attempt > 1, or in its history), with `switch`. True when the branch
        existed; branch_checkout_failed (blocked) when it cannot."""
        git_state, branch = result["git"], result["git"]["branch"]
        with self.git_lock:
            made = self.git.run(*create, check=False)
            if made.ok:
                git_state["branch_created"] = True
                return False
            if "already exists" in made.stderr and (task["attempt"] > 1 or any(
                    isinstance(r.get("git"), dict) and r["git"].get("branch") == branch
                    for r in result_history(self.handoff, task["id"]))):  # an earlier run's: ours
                switched = self.git.run(*switch, check=False)
                if switched.ok:
                    return True
                raise Stop("blocked", "branch_checkout_failed", "cannot switch to the existing "
                           "%s for retry: %s" % (branch, switched.stderr.strip()[-300:]))
        if "already exists" in made.stderr:
            raise Stop("blocked", "branch_checkout_failed", "branch %s already exists and this "
                       "is attempt 1 of a task that never ran; rename the task or delete "
                       "the branch" % branch)
        raise Stop("blocked", "branch_checkout_failed", "git %s failed: %s" % (
            " ".join(create[:4]), made.stderr.strip()[-300:]))

    # -- worktree isolation --

    def keeps_worktree(self, result):
        """Why the task's worktree stays (git.worktree_kept), decided before the result is
        written; null: it is removed right after. It stays when it holds what a person should
        look at: a failure, a block after the agent ran, unverified or uncommitted work."""
        git_state, run = result["git"], self.current
        if not git_state.get("worktree") or not (run and run.owned):
            return
        why = None
        if result["status"] == "success":
            if git_state.get("dirty_after_verify") and not git_state.get("commit"):
                why = "the verified work is uncommitted there (commit_on_success is false)"
        elif result["reason"] not in ("interrupted", "stale_lock_recovered") and (
                result.get("executor") is not None or result["reason"] == "agent_tampered"):
            why = "%s: kept for inspection; `bridge.py unlock --worktrees` removes it (what it " \
                  "holds is committed to %s as WIP first)" % (result["reason"], git_state["branch"])
        git_state["worktree_kept"] = why

    def remove_worktree(self, result):
        """Remove the task's worktree once its result is written, unless keeps_worktree kept it
        (git refuses to remove one holding changes: then it stays, and the log says so). A
        branch made for a task that failed before the agent ran goes too (nothing is on it)."""
        git_state, run = result["git"], self.current
        if not git_state.get("worktree") or not (run and run.owned) or git_state["worktree_kept"]:
            return
        # verified, then committed or found clean once every program that ran there ended,
        # and no submodule (a gitlink in its index, modules/): git's own check, made already
        checked = result["status"] == "success" and (
            git_state.get("commit") or not git_state.get("dirty_after_verify")) and not (
            os.path.lexists(os.path.join(run.work, HANDOFF_DIR))  # not in our status
            or os.path.isdir(os.path.join(run.git_dir, "modules"))
            or may_hold_gitlinks(os.path.join(run.git_dir, "index")))
        with self.git_lock:
            gone = self.repo_git.remove_worktree(run.git, checked)
            if gone.ok and result.get("executor") is None and git_state.get("branch_created"):
                # only while it is where it was made (a dependency's commit is on no branch
                # of yours: `branch -d` would refuse it)
                git_state["branch_created"] = not self.repo_git.run(
                    "update-ref", "-d", "refs/heads/" + git_state["branch"],
                    git_state["base_commit"], check=False).ok
        run.owned = False
        if not gone.ok:
            note = "the worktree %s could not be removed (%s); it stays" % (
                git_state["worktree"], gone.stderr.strip()[-300:])
            self.say("%s: %s" % (result["id"], note))
            self.log(result["id"], "--- %s\n" % note)

    def bead_create(self, task, result):
        bead = result["bead"]
        if not self.beads.argv:
            bead["skipped"] = self.beads.skip_reason
            return
        raw = bead_output(self.handoff, task["id"])
        existing = parse_bead_id(raw)
        if existing:  # a retry or an approved task keeps its bead
            bead.update(id=existing, raw_output=raw, reused=True)
            return
        bead_id, raw, error = self.beads.create(task["bead_title"])
        self.write_redacted(self.handoff.path("meta", task["id"] + ".bead"), raw)
        bead.update(id=bead_id, raw_output=self.redact(raw), error=error)
        if error:
            raise Stop("failed", "bead_failed", error)

    def audit_into(self, task_id, result, which, attributes):
        base = result["git"]["base_commit"]
        patch, stat, raw = self.audit(base)
        # the work tree's .gitattributes is the agent's to edit, except where it points
        # files at a filter (a program the user's own git would then run)
        pointed = attribute_filter_lines(patch) ^ attributes
        if pointed:
            self.tampered(result, ["%s: %s" % item for item in sorted(pointed)],
                          "the work tree's .gitattributes changed which files go "
                          "through a filter")
        path = self.handoff.path("patches", "%s_%s.patch" % (task_id, which))
        result["patch_redacted"][which] = self.write_redacted(path, patch, self.current.unsynced)
        result["artifacts"]["patch_" + which] = self.handoff.rel(path)
        result["git"]["diff_stat_" + which] = stat
        # a gitlink added, its commit changed, or moved (git mv leaves your submodule's
        # checkout an untracked folder back on your branch; mv, .gitmodules naming no url)
        gitlinks = r'^:\d+ 160000 \S+ \S+ [AMTRC]\d*\t(?:[^\t\n]*\t)?"?(.*?)"?$'
        nested = re.findall(gitlinks, raw, re.M)
        if any(re.search(r"^\[\.\.\. \d+ bytes cut here", text, re.M) for text in (raw, patch)):
            # the capture cap cut its middle
            nested += re.findall(gitlinks, self.git.worktree_diff(
                base, self.exclude, "--raw", "--no-renames"), re.M)  # the gitlinks alone
        if nested:
            self.nested_repositories(sorted(set(nested)))

    def nested_repositories(self, paths):
        """nested_repository: git records a repository inside the work tree as its commit id
        only (and cannot record one without a commit), so its files would be in no commit,
        no patch and no clone; they stay where the agent left them."""
        raise Stop("failed", "nested_repository", "the work tree holds a git repository of its "
                   "own at %s, which this task's commit would take in: git records its commit "
                   "id only, never its files, which stay in %s; move them into the work tree "
                   "proper, or commit a submodule change yourself" % (
                       ", ".join(printable(path) for path in paths[:5]), self.work))

    def tamper_check(self, guard, result, who):
        """agent_tampered when `who` changed what it must not (see Fingerprint), or moved
        HEAD off the task's branch or the base branch's tip (one git call, made only when
        the files git keeps refs in changed)."""
        changes = guard.changes()
        if changes:
            self.tampered(result, guard.restore(changes), "%s changed %s" % (
                who, ", ".join(guard.display(path) for path, _ in changes[:5])
                + (" and %d more" % (len(changes) - 5) if len(changes) > 5 else "")))
        if guard.ref_signatures(guard.ref_paths) == guard.refs_before:
            return  # no branch moved: git need not be asked
        git_state = result["git"]
        branch, base = git_state["branch"], git_state["base_branch"]
        tips = {}
        refs = ["refs/heads/" + name for name in (branch, base) if name]
        for line in self.git.run("for-each-ref", "--format=%(HEAD) %(objectname) %(refname)",
                                 *refs).stdout.splitlines():
            tip, ref = line[2:].split(" ", 1)  # %(HEAD) is "*" or " "
            tips[ref[len("refs/heads/"):]] = (line[0] == "*", tip)
        notes = []
        if not tips.get(branch, (False,))[0]:
            notes.append("HEAD left the task's branch %s (for %s)" % (branch, next(
                (name for name, (star, _) in tips.items() if star), "another branch or commit")))
        if base and base != branch and guard.base_tip and \
                tips.get(base, (0, None))[1] != guard.base_tip:
            notes.append("the base branch %s moved from %s to %s" % (
                base, guard.base_tip, tips.get(base, (0, "nowhere"))[1]))
        if notes:  # nothing is reset or force-moved back: named only
            self.tampered(result, notes, "%s %s" % (who, "; ".join(notes)))

    def tampered(self, result, notes, detail):
        result["tampered"] = notes
        self.log(result["id"], "--- agent_tampered: %s\n%s\n" % (detail, "\n".join(notes)))
        self.tamper_stop = True
        raise Stop("failed", "agent_tampered", "%s; the queue stops (see `tampered` in the "
                   "result)" % detail)

    def post_state(self, result):
        snap, git_state = self.git_snapshot(), result["git"]
        git_state.update(head_commit=snap["head"], status_after_verify=snap["status"],
                         dirty_after_verify=snap["dirty"])
        if git_state["worktree"] and snap["current_branch"] != git_state["branch"]:
            # one more look before the commit: a process running alongside (another task's
            # agent) may have pointed this worktree's HEAD elsewhere before its fingerprint
            self.tampered(result, ["HEAD: on %s" % printable(snap["current_branch"] or "no branch")],
                          "the worktree's HEAD is not on %s" % git_state["branch"])

    def return_to_base(self, result):
        git_state = result["git"]
        base_branch, branch = git_state.get("base_branch"), git_state.get("branch")
        if not self.config["return_to_base"] or branch == base_branch or git_state.get("worktree"):
            return
        target = base_branch or git_state.get("base_head") or git_state.get("base_commit")
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
        git_state = result["git"]
        if result["reason"] in ("interrupted", "agent_tampered") or git_state["worktree"] or (
                result["status"] == "blocked" and result.get("executor") is None):
            # a worktree stays as it is (see keeps_worktree); after tampering git itself may
            # point elsewhere (.git swapped): hands off
            return
        if result.get("executor") is None and git_state.get("branch_created"):
            # Failed before the agent ran (e.g. bead_failed): nothing to inspect, so
            # leave no trace in git: back to base and the empty branch removed.
            try:
                self.return_to_base(result)
                if git_state.get("returned_to_base"):  # only while it is where it started
                    git_state["branch_created"] = not self.git.run(
                        "update-ref", "-d", "refs/heads/" + git_state["branch"],
                        git_state["base_commit"], check=False).ok
            except (BridgeError, Stop) as exc:
                result["detail"] += "; and returning to base failed: %s" % exc
            return
        blocked = result["status"] == "blocked"  # the queue goes on: the work is parked
        if not (self.continue_on_failure or blocked) or git_state.get("branch") is None:
            return
        try:
            self.park(task["id"], result, result["reason"], "BLOCKED" if blocked else "FAILED")
        except (BridgeError, Stop) as exc:
            result["detail"] += "; and parking the work failed: %s" % exc

    def park(self, task_id, result, why, label="FAILED"):
        """Commit a task's unfinished work on its branch (WIP, when there is any) and go
        back to the base. Nothing is reverted: the next task (or the re-run) starts from
        a clean base, and the work stays on the branch for inspection. A checkout that is
        not on the task's branch any more is not the task's to commit, nor is a task
        branch that is the base itself when it was dirty before the task (allow_dirty:
        those changes are the user's)."""
        git_state = result["git"]
        snap = self.git_snapshot()
        git_state.update(head_commit=snap["head"], status_after_verify=snap["status"],
                         dirty_after_verify=snap["dirty"])
        branch = git_state.get("branch")
        if not branch or snap["current_branch"] != branch or (
                branch == git_state.get("base_branch") and (
                    not snap["dirty"] or git_state.get("dirty_before"))):
            return
        if snap["dirty"]:
            git_state["wip_commit"] = self.commit_all(
                "WIP(bridge): %s %s (%s) - NOT verified, kept for inspection\n\n%s\n" % (
                    task_id, label, why, result["detail"][:500]))
        self.return_to_base(result)


# ---- queue commands (init, submit, status, approve, unlock) ----------------------

def submit_task(root, source, retry=False, config=None):
    """Validate a task file (or '-' for stdin), against `config` too when given (the
    executor it names), and enqueue it atomically. Returns its id."""
    handoff = Handoff(root).require()
    if source == "-":
        raw = sys.stdin.buffer.read(TASK_MAX_BYTES + 1)
        try:
            task = parse_json(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise BridgeError("stdin: not a UTF-8 JSON task: %s" % exc)
        errors = validate_task(task)
    else:
        try:
            task = read_task_file(source, check_stem=False, fresh_sec=0)
            errors = []
        except TaskFileError as exc:
            task, errors = exc.raw, exc.errors
    if not errors and config is not None:
        errors = [e for e in [unknown_executor(task, config)] if e]
    if errors:
        raise BridgeError("task %s refused, %d error(s):\n  %s" % (
            "from stdin" if source == "-" else source, len(errors), "\n  ".join(errors)))
    task_id = task["id"]
    place = task_place(handoff, task_id)
    if place:
        raise BridgeError("task %s is already in %s/" % (task_id, place), EXIT_FAILED)
    found = dependency_state(handoff, task)
    if found["state"] == "failed":  # the watcher would block it at once
        raise BridgeError("task %s refused: depends_on: %s" % (task_id, found["detail"]))
    previous = read_result(handoff, task_id)
    if os.path.exists(handoff.path("results", task_id + ".json")):
        if not retry:
            raise BridgeError("task %s already has a result (%s, %s); use `submit --retry` to run "
                              "it again as the next attempt" % (
                                  task_id, (previous or {}).get("status"), (previous or {}).get("reason")),
                              EXIT_FAILED)
        refuse_while_running(handoff, "submit --retry", task_id)
        last = (previous or {}).get("attempt")
        task = dict(task)
        task["attempt"] = max(task.get("attempt", 1), (last if isinstance(last, int) else 0) + 1)
        policy = dict(task.get("retry_policy") or {"max_attempts": 1})
        policy["max_attempts"] = max(policy.get("max_attempts", 1), task["attempt"])
        task["retry_policy"] = policy
        archive_result(handoff, task_id, "manual retry as attempt %d" % task["attempt"])
    atomic_write_json(handoff.path("tasks", task_id + ".json"), task)
    return task_id, task.get("attempt", 1)


def refuse_while_running(handoff, verb, task_id):
    """`approve` and `submit --retry` change results/, meta/ and pending/, which the watcher
    guards while an agent runs (an agent writing there is tampering, and a planner cannot
    be told apart from it): while a task runs they refuse, with exit 3, instead."""
    running = list_task_files(handoff.dir("running"))
    if running and FileLock.probe(handoff.path("locks", WORKER_LOCK))[0] == "held":
        raise BridgeError("%s %s: task %s is running; try again when it has finished (a change "
                          "to .ai-handoff/ now would fail it as agent_tampered)" % (
                              verb, task_id, running[0][:-5]), EXIT_LOCKED)


def approve_task(root, task_id):
    """Release a task from pending/: archive its gate result, mark it approved, re-queue."""
    handoff = Handoff(root).require()
    safe_name(task_id, "task id")
    pending = handoff.path("pending", task_id + ".json")
    if not os.path.lexists(pending):
        where = task_place(handoff, task_id, ("tasks", "running", "failed"))
        raise BridgeError("task %s is not waiting in pending/%s" % (
            task_id, " (it is in %s/)" % where if where else ""), EXIT_FAILED)
    try:
        task = read_task_file(pending, fresh_sec=0)
    except TaskFileError as exc:
        raise BridgeError("pending/%s.json is not a valid task: %s" % (task_id, "; ".join(exc.errors)))
    refuse_while_running(handoff, "approve", task_id)
    task["approved_at"] = now_iso()
    # Order matters for crashes: history first, then the gate result goes, then the
    # task appears in tasks/, then it leaves pending/.
    archive_result(handoff, task_id, "approved at %s" % task["approved_at"])
    atomic_write_json(handoff.path("tasks", task_id + ".json"), task)
    os.unlink(pending)
    return task


def queue_status(root, config):
    handoff = Handoff(root).require()
    counts = {key: len(list_task_files(handoff.dir(state))) for key, state in (
        ("queued", "tasks"), ("running", "running"), ("pending", "pending"), ("failed", "failed"))}
    by_status, failures = {}, []
    for name in list_task_files(handoff.dir("results")):
        path = handoff.path("results", name)
        try:
            record = read_json_file(path, "result")
            if not isinstance(record, dict):
                raise BridgeError("%s does not hold a JSON object" % path)
        except BridgeError as exc:
            failures.append({"id": name[:-5], "reason": "unreadable result", "detail": exc.message,
                             "mtime": 0})
            continue
        status = record.get("status") if isinstance(record.get("status"), str) else "?"
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
    worktrees = task_worktrees(worktree_root(root, config, Git(root)))
    return {**counts, "results": by_status, "worker": worker, "recent_failures": failures[:5],
            "waiting": waiting_tasks(handoff), "skipped_in_tasks": skipped_task_files(handoff),
            "worktrees": [{"id": task_id, "path": path, "why": worktree_state(handoff, task_id)
                           or "nothing needs it (removed by the next watcher start in worktree isolation, "
                           "or by `bridge.py unlock --worktrees`)"}
                          for task_id, path in worktrees]}


def task_worktrees(folder):
    """[(task id, path)] of the task worktrees in the worktree folder (see worktree_root)."""
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise BridgeError("cannot list the task worktrees in %s: %s" % (folder, exc.strerror))
    return [(name, os.path.join(folder, name)) for name in names]


def clear_worktrees(handoff, repo, worktrees, say, lock, wip=False):
    """Prune the worktrees git lists whose folder is gone, then remove each task worktree of
    `worktrees` [(task id, path)] nothing needs (worktree_state) or, with `wip`, each whose
    task is not queued or running, after committing what it holds to its branch as WIP.
    `say` is told what was removed, and why each kept one stays."""
    shared = os.path.join(common_git_dir(repo.git_dir()), "worktrees")
    if os.path.islink(shared):  # git's own add refuses one; its prune deletes where it leads
        say("not pruning worktrees: %s is a symlink, not git's; replace it with a folder" % shared)
    else:
        with lock:
            repo.run("worktree", "prune", check=False)
    for task_id, path in worktrees:
        branch, held = "feat/ai/" + task_id, ""
        try:
            why = worktree_state(handoff, task_id, queued_only=wip)
            if why:
                raise BridgeError(why)
            with lock:
                git = repo.worktree(path)[0]
                if wip and git.current_branch() != branch:  # else the commit would land elsewhere
                    raise BridgeError("it is not on %s; look at it yourself" % branch)
                commit = wip and git.commit_all("WIP(bridge): %s worktree removed by unlock "
                                                "--worktrees - NOT verified\n" % task_id)
                held = "; what it held is WIP commit %s on %s" % (commit, branch) if commit else ""
                gone = repo.remove_worktree(git)
            if not gone.ok:
                raise BridgeError("git cannot remove it: %s%s" % (gone.stderr.strip()[-300:], held))
            say("removed the worktree %s%s" % (path, held if wip else " (its task succeeded)"))
        except BridgeError as exc:
            say("kept the worktree %s: %s" % (path, exc.message))


def remove_worktrees(root, config):
    """`unlock --worktrees`, with no watcher running: each task worktree whose task is not
    queued or running is committed to its branch as WIP (when it holds changes) and removed;
    the branch stays. Lines saying what was done."""
    import contextlib
    handoff = Handoff(root).require()
    lock = FileLock(handoff.path("locks", WORKER_LOCK), meta={"role": "unlock --worktrees"})
    if not lock.acquire():
        raise BridgeError("a watcher holds the worker lock (%s): stop it first, its tasks' "
                          "worktrees are in use" % describe_holder(lock.holder), EXIT_LOCKED)
    lines = []
    try:
        repo = Git(root)
        clear_worktrees(handoff, repo, task_worktrees(worktree_root(root, config, repo)),
                        lines.append, contextlib.nullcontext(), wip=True)
    finally:
        lock.release()
    return lines or ["no task worktrees"]


def waiting_tasks(handoff):
    """[{id, state, detail}] of the queued tasks their dependencies hold back: "waiting"
    (and for what) or "failed" (the watcher will block it, and why)."""
    found, git, graph = [], Git(handoff.root), {}
    for name in list_task_files(handoff.dir("tasks")):
        try:
            task = read_task_file(handoff.path("tasks", name), fresh_sec=0)
        except TaskFileError:
            continue  # refused when its turn comes; not a dependency matter
        if task.get("depends_on"):
            state = dependency_state(handoff, task, git, graph=graph)
            if state["state"] != "ready":
                found.append({"id": task["id"], "state": state["state"], "detail": state["detail"]})
    return found


def unlock_worker(root, force=False):
    """Clear the worker lock when provably stale (or forced). Returns a message."""
    path = Handoff(root).path("locks", WORKER_LOCK)
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
# 3. SEAM - the _bridge/ verbs
# =============================================================================
#
# The `_bridge/` directory is a file seam between agents (Claude Code, Codex, Pi)
# and a captain's Bridge UI. The formats are those of Spacedock's Go verbs
# (`spacedock bridge ...`, the generation with `inbox drain/ack/commit`): a Bridge
# reading what this writes, or writing what this reads, cannot tell the
# difference - compact JSON in Go's key order with Go's escaping, one record per
# line. Where Spacedock's Go verbs and its Bridge disagree, bridge.py does this:
#
#   1. A torn last line (no newline yet) is not counted and not delivered.
#      Lines of any length are read; a malformed line consumes its number.
#   2. drain appends an `acting` ack for what it returns, but only a terminal
#      ack (any other status) counts as delivered for drain, check and wake:
#      an agent that crashes between drain and its real ack gets the intent
#      again (at-least-once).
#   3. Every verb resolves one `_bridge/`: --repo-root if given, else the
#      nearest enclosing git root of the payload's cwd or the working directory
#      (a linked worktree is its own root).
#   4. Slugs and ids match [A-Za-z0-9._-]+ and are never . or ..; session ids
#      that reach an argv may not start with "-". (An intent id is not such an
#      id: it is an opaque correlator, only ever compared; see inbox_ack.)
#   5. Records are appended with one write(); whole-file state (cursor,
#      heartbeat, markers) is replaced atomically.
#
# `egress emit` runs on every tool call of every agent, so it imports nothing
# beyond fcntl and never goes through argparse: seam_main() is its entry point.

SEAM_DIR = "_bridge"
SEAM_VERBS = ("egress", "inbox", "initiate", "alert", "feed", "wake")
EVENTS_MAX_LINES, EVENTS_KEEP_LINES = 2000, 1000
INITIATE_MAX_LINES, INITIATE_KEEP_LINES = 2000, 1000
# truncateReplies: Go's tests imply the cap but not how many lines it keeps; events'
# keep is used (README, decisions).
REPLIES_MAX_LINES, REPLIES_KEEP_LINES = 2000, 1000

# Intent kind -> the kind of the reply that acknowledges it (ackKindFor).
ACK_KINDS = {"tell": "reply", "conn": "conn-ack", "decision": "decision-ack",
             "permission-decision": "permission-ack"}
# Ack kind -> the statuses Bridge's reader accepts for it (any other is
# dropped by Bridge, so `inbox ack` refuses it rather than write an invisible ack).
ACK_STATUSES = {
    "reply": ("answered", "rejected", "blocked", "acting"),
    "conn-ack": ("accepted", "released", "rejected", "blocked", "acting"),
    "decision-ack": ("applied", "rejected", "blocked", "acting"),
    "permission-ack": ("accepted", "denied", "rejected", "blocked", "acting"),
}

# Pi's native lifecycle names -> the canonical (Claude) hook names.
PI_EVENTS = {
    "session_start": "SessionStart", "session_shutdown": "Stop", "turn_end": "Stop",
    "agent_start": "SubagentStart", "agent_end": "SubagentStop",
    "turn_start": "UserPromptSubmit", "tool_execution_start": "PostToolUse",
    "tool_execution_end": "PostToolUse", "tool_call": "PostToolUse",
    "tool_result": "PostToolUse",
}

# The session id each host exports to its tools, after the neutral SD_SESSION_ID.
HOST_SESSION_ENV = {"claude": "CLAUDE_CODE_SESSION_ID", "codex": "CODEX_THREAD_ID"}

ZERO_TIME = "0001-01-01T00:00:00Z"


class SeamFailure(Exception):
    """A seam verb cannot go on; the CLI prints `message` inside the verb's JSON
    answer (`answer`, when the verb has already built one)."""

    def __init__(self, message, answer=None):
        super().__init__(message)
        self.message = message
        self.answer = answer


class SeamUsage(SeamFailure):
    """A required flag is missing or a flag's value is malformed: exit 2 (usage)."""


# ---- Go-compatible encoding and time ------------------------------------------

def go_json(obj):
    """JSON as Go's encoding/json writes it: compact, raw UTF-8, but <, >, &,
    U+2028 and U+2029 escaped, and lone surrogates replaced by U+FFFD."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    if "<" in text or ">" in text or "&" in text:
        text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    if "\u2028" in text or "\u2029" in text:
        text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in text)
    return text


def go_line(obj):
    """One JSONL record as bytes, newline included (what Go's json.Encoder emits)."""
    return (go_json(obj) + "\n").encode("utf-8")


# The JSON field names of the Go structs each record is decoded into (reading only:
# bridge.py always writes these canonical names). A name in NULLABLE_FIELDS is a Go
# slice or pointer, which a JSON null resets; for every other field Go ignores a null.
PAYLOAD_FIELDS = frozenset((
    "cwd", "host", "event", "hook_event_name", "session_id", "agent_id", "agent_type",
    "actor_id", "tool_name", "source", "file_path", "entity_path", "timestamp", "ts",
    "detail", "tool_input"))
DETAIL_FIELDS = frozenset(("tool", "source", "file_path"))
TOOL_INPUT_FIELDS = frozenset(("file_path",))
STOP_FIELDS = frozenset(("cwd", "session_id", "stop_hook_active"))
INTENT_FIELDS = frozenset((
    "id", "ts", "kind", "text", "granted", "target", "target_set", "entity", "field", "value",
    "verdict", "directives", "request_id"))
REPLY_FIELDS = frozenset((
    "schema", "ts", "kind", "target", "in_reply_to_id", "in_reply_to_line", "in_reply_to_ts",
    "intent_kind", "status", "text", "granted", "entity", "field", "value", "verdict",
    "request_id", "session_id", "host"))
HEARTBEAT_FIELDS = frozenset(("session_id", "host", "ts", "state"))
MARKER_FIELDS = frozenset(("host", "session_id", "agent_id", "actor_id", "entity", "workflow"))
EVENT_FIELDS = frozenset((
    "timestamp", "ts", "host", "event", "session_id", "agent_id", "agent_type", "actor_id",
    "detail"))
INITIATE_FIELDS = frozenset((
    "schema", "id", "ts", "kind", "workflow", "entity", "ship_id", "host", "session_id",
    "headline", "body", "request_id", "status"))
NULLABLE_FIELDS = frozenset(("target_set", "directives", "granted", "detail", "tool_input"))


def _go_fold(key):
    """A JSON key folded for matching against the (lower-case ASCII) field names.

    Go folds every rune to the smallest of its simple case-folding orbit. Against
    ASCII names that is str.lower() plus U+017F (long s) -> "s": U+212A (Kelvin)
    already lowers to "k", and no other rune folds to an ASCII letter. Not
    casefold(), which would also match "ß" to "ss" where Go does not.
    """
    key = key.lower()
    return key if key.isascii() else key.replace("\u017f", "s")


def go_fields(obj, fields):
    """`obj` (a decoded JSON object) with its keys matched to `fields` as Go's
    encoding/json fills a struct: each key in order goes to the field of that exact
    name, else to the field whose name it equals case-insensitively ("ID" fills
    "id"), else nowhere; when two keys fill one field the later wins. Returns `obj`
    itself when no key needs folding (the common case, and the cheap one), else a
    new dict of the fields only. Read values with .get(); a non-dict is returned as is.

    Python's dict has already merged exact duplicate keys (the last value, at the
    first key's place), so {"id":1,"ID":2,"id":3} gives 2 where Go gives 3.
    """
    if not isinstance(obj, dict):
        return obj
    for key in obj:
        if key not in fields and _go_fold(key) in fields:
            break
    else:
        return obj
    out = {}
    for key, value in obj.items():
        name = key if key in fields else _go_fold(key)
        if name in fields and (value is not None or name in NULLABLE_FIELDS):
            out[name] = value
    return out


_RFC3339 = None


def parse_rfc3339(text):
    """Parse an RFC 3339 time as Go's time.Parse(RFC3339) does, or return None.

    Returns (unix_seconds, nanos_digits, offset_seconds, wall) where `wall` holds
    the original date and clock fields, so the time can be rendered back with
    its own offset (render_rfc3339_nano) or ordered (unix_seconds, nanos).
    """
    global _RFC3339
    if not isinstance(text, str):
        return None
    if _RFC3339 is None:
        _RFC3339 = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?"
                              r"(Z|([+-])(\d\d):(\d\d))\Z")
    match = _RFC3339.match(text)
    if not match:
        return None
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    if not (1 <= month <= 12 and 1 <= day <= _days_in_month(year, month)
            and hour < 24 and minute < 60 and second < 60):
        return None
    offset = 0
    if match.group(8) != "Z":
        oh, om = int(match.group(10)), int(match.group(11))
        if oh >= 24 or om >= 60:
            return None
        offset = (oh * 3600 + om * 60) * (1 if match.group(9) == "+" else -1)
    days = _days_from_civil(year, month, day)
    unix = days * 86400 + hour * 3600 + minute * 60 + second - offset
    frac = (match.group(7) or "").ljust(9, "0")
    return (unix, frac, offset, (year, month, day, hour, minute, second))


def render_rfc3339_nano(parsed):
    """Go's t.Format(time.RFC3339Nano) of a parse_rfc3339 result (None = zero time)."""
    if parsed is None:
        return ZERO_TIME
    _, frac, offset, wall = parsed
    text = "%04d-%02d-%02dT%02d:%02d:%02d" % wall
    frac = frac.rstrip("0")
    if frac:
        text += "." + frac
    return text + ("Z" if offset == 0 else utc_offset(offset))


def _days_in_month(year, month):
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year, month, day):
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = (year if year >= 0 else year - 399) // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


# ---- ids, roots and files -------------------------------------------------------

def is_safe_session_id(text):
    """A session id that may become a `codex exec resume` argv word: safe, no leading -."""
    return is_safe_name(text) and not text.startswith("-")


def id_flag(opts, flag, argv=False, pair=False):
    """The trimmed value of an id-like --flag ("" when absent), checked as decision 4 says:
    [A-Za-z0-9._-]+, never . or .. (and with argv=True, for a session id, no leading -;
    pair=True also allows Go's derived `workflow/entity` form of two such ids). Raises a
    SeamFailure naming the flag and the first character that is not allowed, without
    echoing the value (free text passed by mistake may hold a secret)."""
    value = opts.get(flag, "").strip()
    if not value:
        return value
    parts = value.split("/", 1) if pair else [value]
    for part in parts:
        rule = "[A-Za-z0-9._-]+%s" % (" (or two such ids joined by /)" if pair else "")
        if part in (".", "..", ""):
            raise SeamUsage("--%s must match %s, and no part may be %r" % (flag, rule, part))
        if not is_safe_name(part):
            first_slash = value.find("/") if pair else -1
            at, bad = next((i, ch) for i, ch in enumerate(value) if i != first_slash and not (
                ch.isascii() and (ch.isalnum() or ch in "._-")))
            raise SeamUsage("--%s must match %s: %r at position %d is not allowed" % (
                flag, rule, bad, at + 1))
    if argv and value.startswith("-"):
        raise SeamUsage("--%s may not start with - (a session id can reach an argv)" % flag)
    return value


def clean_slugs(values):
    """Trimmed, safe, de-duplicated and sorted slugs (Go's cleanSlugs)."""
    return sorted({value.strip() for value in values or ()
                   if isinstance(value, str) and is_safe_name(value.strip())})


def seam_root(repo_root=None, start=None):
    """The root whose `_bridge/` a verb uses (decision 3).

    A --repo-root that is not an existing directory is an error naming it: creating
    `_bridge/` there would make the whole path, and a verb would answer success for a
    root nobody reads (a typo, or a checkout that moved)."""
    if repo_root:
        root = os.path.abspath(repo_root)
        if not os.path.isdir(root):
            raise SeamFailure("--repo-root %s %s" % (
                root, "is not a directory" if os.path.lexists(root) else "does not exist"))
        return root
    start = os.path.abspath(start or os.getcwd())
    return git_toplevel(start) or start


def write_failure(action, path, exc):
    """`ACTION PATH: reason` for an OSError, naming the file the verb was writing even when
    the error does not (a full disk mid-write carries no filename; an atomic write's error
    names its temporary file)."""
    return "%s %s: %s" % (action, path, getattr(exc, "strerror", None) or exc)


def bridge_dir(root, create=False):
    """ROOT/_bridge, refusing a `_bridge` that exists but is not a directory."""
    path = os.path.join(root, SEAM_DIR)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise SeamFailure("%s exists and is not a directory" % path)
    if create:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise SeamFailure(write_failure("cannot create", path, exc))
    return path


def seam_trim(path, max_lines, keep_lines, protect=None, seen=None):
    """Keep the last `keep_lines` complete lines of `path` once it has more than `max_lines`.

    `protect(head, tail)` may return lines of `head` (those before the kept
    tail) that must survive (open gate reviews, replies still needed); they are
    kept in order ahead of the tail, and when it keeps them all the file is left
    alone. The new file replaces the old one atomically under an exclusive flock
    (see append_text). Returns True when the file was trimmed. A `seen` dict
    gets "mark" (what _mark_ok checks: the file as read) and "lines" once the
    file has been read.
    """
    import fcntl
    keep_lines = min(keep_lines, max_lines)
    try:
        handle = open_input(path)
    except OSError:
        return False
    fd = handle.fileno()
    try:
        if not flock_within(fd, fcntl.LOCK_EX, 2.0):
            return False  # busy: the next append tries again
        try:
            if os.lstat(path).st_ino != os.fstat(fd).st_ino:
                return False  # another process trimmed it first
        except FileNotFoundError:
            return False
        data = handle.read()
        lines = data.split(b"\n")
        partial = lines.pop()  # b"" when the file ends with a newline
        if seen is not None:
            end = len(data) - len(partial)
            seen.update(mark=[os.fstat(fd).st_ino, end, data[max(0, end - _MARK_BYTES):end].hex()],
                        lines=len(lines))
        if len(lines) <= max_lines:
            return False
        head, tail = lines[:len(lines) - keep_lines], lines[len(lines) - keep_lines:]
        kept = protect(head, tail) if protect else []
        if len(kept) == len(head):
            return False  # nothing to drop: no rewrite
        atomic_write(path, b"".join(line + b"\n" for line in kept + tail) + partial, mode=0o644)
        return True
    finally:
        handle.close()


def go_count(text):
    """`text` read as Go's strconv.Atoi reads a count, or None: ASCII digits only, at most
    2^63-1. (Python's int() also takes other scripts' digits and "_", and refuses to convert
    more than 4,300 digits with a ValueError.)"""
    if not (text.isascii() and text.isdigit()) or len(text.lstrip("0")) > 19:
        return None
    value = int(text)
    return value if value < 1 << 63 else None


def read_cursor(bdir, slug):
    """The committed cursor of `slug`: a decimal count of processed inbox lines.

    Missing, unreadable, negative, non-numeric or past Go's int64 means 0. When the
    slug has no cursor file yet, the legacy shared `.inbox-cursor` is read instead
    (drain and commit then adopt it into the slug's file). A symlink is never followed:
    it reads as missing. `slug` is a safe name (every caller checks it, as for the lock).
    """
    text = _read_small(os.path.join(bdir, ".inbox-cursor." + slug))
    if text is None:
        text = _read_small(os.path.join(bdir, ".inbox-cursor"))
    return go_count(text or "") or 0


def cursor_lock(bdir, slug):
    """Take `slug`'s cursor lock (an fd for release_flock), or None after 10 s.

    Named `.cursor-lock.<slug>`, not `.inbox-cursor.<slug>.lock`: Go collects cursor
    files by the prefix `.inbox-cursor.` (truncateReplies' floor), and would read a lock
    file as the cursor of a slug "<slug>.lock" at 0, which stops its trim for good."""
    return acquire_flock(os.path.join(bdir, ".cursor-lock." + slug), timeout=10.0)


def adopt_cursor(bdir, slug, locked=False):
    """Copy the legacy `.inbox-cursor` into `.inbox-cursor.<slug>` if the latter is missing
    (Go's adoptCursor).

    Under the slug's cursor lock (taken here unless `locked`), so a commit cannot land
    between the check and the write, which would lower the cursor it wrote. Neither file
    is followed if it is a symlink. Without the lock in 10 s (a commit is writing the
    slug's own cursor) nothing is adopted.
    """
    target = os.path.join(bdir, ".inbox-cursor." + slug)
    legacy = os.path.join(bdir, ".inbox-cursor")
    if os.path.lexists(target) or not os.path.lexists(legacy):
        return  # the common case, decided without the lock
    lock = None if locked else cursor_lock(bdir, slug)
    if lock is None and not locked:
        return
    try:
        text = _read_small(legacy)
        if text is not None and not os.path.lexists(target):
            atomic_write(target, text + "\n", mode=0o644)
    finally:
        if lock is not None:
            release_flock(lock)


def one_line_summary(text, limit):
    """Go's oneLineSummary: trim, runs of whitespace/control become one space,
    stop once the UTF-8 length reaches `limit` bytes, trim again."""
    out, size, gap = [], 0, False
    for ch in (text or "").strip():
        code = ord(ch)
        if ch.isspace() or code < 0x20 or 0x7f <= code <= 0x9f:
            gap = True
            continue
        if gap and out:
            out.append(" ")
            size += 1
        gap = False
        if size >= limit:
            break
        out.append(ch)
        size += len(ch.encode("utf-8", "replace"))
    return "".join(out).strip()  # a space added past the limit goes here


def _session_from_env(host):
    name = HOST_SESSION_ENV.get(host)
    return os.environ.get("SD_SESSION_ID") or (os.environ.get(name, "") if name else "")


def seam_config(root):
    """load_config(root), a config error being a usage error of the verb (exit 2). Never
    replaced by the defaults: they lack the user's redaction_patterns, so the verbs that
    write text would write the very secrets those name."""
    try:
        return load_config(root)
    except BridgeError as exc:
        raise SeamUsage(exc.message)


# ---- egress: events.jsonl and session markers --------------------------------------

def _payload_str(obj, key):
    """A string field of a hook payload; a missing, null or wrong-typed one is ""."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, str) else ""


def _actor_id(host, payload):
    """actorIDFor: who the event is about, or "" when no safe id is available.

    `payload` needs only actor_id, session_id and agent_id (egress passes them redacted)."""
    explicit = _payload_str(payload, "actor_id")
    if explicit:
        return explicit if is_safe_name(explicit) else ""
    session = _payload_str(payload, "session_id")
    agent = _payload_str(payload, "agent_id")
    if host == "claude":
        return session if is_safe_name(session) else ""
    if is_safe_name(session) and is_safe_name(agent):
        return session + "." + agent
    if is_safe_name(session):
        return session
    return agent if is_safe_name(agent) else ""


def egress_emit(data, host_flag="", repo_root=None):
    """Record one hook payload (bytes) as an event; returns what was done, for debugging.

    Observe-only: every reason not to write is returned as text, never raised,
    except OSError from writing (the caller swallows it too).
    """
    try:
        payload = parse_json(data.decode("utf-8", "replace"))
    except ValueError as exc:
        return "payload is not JSON: %s" % exc
    if not isinstance(payload, dict):
        return "payload is not a JSON object"
    payload = go_fields(payload, PAYLOAD_FIELDS)
    host = (host_flag or _payload_str(payload, "host")).strip().lower()
    hook_event = _payload_str(payload, "hook_event_name")
    event = _payload_str(payload, "event") or hook_event
    if host == "pi":
        event = PI_EVENTS.get(event.lower(), event)
    cwd = _payload_str(payload, "cwd") or os.getcwd()
    if not host or not event or not cwd:
        return "nothing to record: host, event and cwd are required"
    if not is_safe_name(host):
        return "nothing to record: host %r is not an id" % host
    cwd = os.path.abspath(cwd)
    if not os.path.isdir(cwd):
        return "cwd %s is not a directory" % cwd
    root = seam_root(repo_root, cwd)
    bdir = bridge_dir(root)
    detail = payload.get("detail")
    detail = go_fields(detail, DETAIL_FIELDS) if isinstance(detail, dict) else {}
    ts = _payload_str(payload, "timestamp") or _payload_str(payload, "ts")
    # Every string written from the payload goes through the redactor (a valid RFC 3339
    # time cannot hold a secret, and skipping it keeps ":" out of the common hook's text,
    # so the key=value rules are not even compiled). An id the redactor would change is
    # blanked: "[REDACTED]" is no id (Go blanks an unsafe actor_id alike).
    fields = {"event": event, "session_id": _payload_str(payload, "session_id"),
              "agent_id": _payload_str(payload, "agent_id"),
              "actor_id": _payload_str(payload, "actor_id"),
              "agent_type": _payload_str(payload, "agent_type"),
              "tool": _payload_str(detail, "tool") or _payload_str(payload, "tool_name"),
              "source": _payload_str(detail, "source") or _payload_str(payload, "source"),
              "ts": ts if ts and parse_rfc3339(ts) is None else "", "host": host}
    redactor = get_redactor(seam_config(root))
    clean = redact_fields(redactor, fields)
    for key in ("session_id", "agent_id", "actor_id", "host"):
        if clean[key] != fields[key]:
            clean[key] = ""
    if not clean["host"]:
        return "nothing to record: host %r is redacted" % host
    ts = clean["ts"] or ts or utc_iso()
    actor = _actor_id(host, clean)
    record = {
        "timestamp": ts, "ts": ts, "host": host, "event": clean["event"],
        "session_id": clean["session_id"], "agent_id": clean["agent_id"],
        "agent_type": clean["agent_type"], "actor_id": actor,
        "detail": {"tool": clean["tool"], "source": clean["source"]},
    }
    events = os.path.join(bdir, "events.jsonl")
    append_text(events, go_line(record))
    try:
        size = os.lstat(events).st_size
    except OSError:
        size = 0
    # fewer bytes than lines is impossible: a small file is not even counted
    if size > EVENTS_MAX_LINES and count_complete_lines(events) > EVENTS_MAX_LINES:
        seam_trim(events, EVENTS_MAX_LINES, EVENTS_KEEP_LINES)
    done = "event appended"
    marker = _marker_for(host, hook_event, payload, detail, actor, cwd)
    if marker:
        marker.update(session_id=clean["session_id"], agent_id=clean["agent_id"])
        names = {"entity": marker["entity"], "workflow": marker["workflow"]}
        if redact_fields(redactor, names) != names:
            return done + "; no marker: its entity or workflow name is redacted"
        done += "; " + write_marker(bdir, marker)
    return done


def redact_fields(redactor, fields):
    """`fields` ({name: str}) with every value redacted, in one pass over them all when
    none changes (the common case: one redactor call, not one per field)."""
    joined = "\n".join(fields.values())
    if redactor.redact(joined) == joined:
        return fields
    return {name: redactor.redact(value) for name, value in fields.items()}


def _marker_for(host, hook_event, payload, detail, actor, cwd):
    """The session marker this event calls for (as Spacedock's egress writes it), or None."""
    if not actor:
        return None
    agent_id = _payload_str(payload, "agent_id")
    if not agent_id and "ensign" not in _payload_str(payload, "agent_type").lower():
        return None  # only a child actor (an ensign) has an entity of its own
    path = _payload_str(payload, "entity_path")
    if not path and host == "claude" and hook_event == "PostToolUse" \
            and _payload_str(payload, "tool_name") == "Read":
        path = (_payload_str(go_fields(payload.get("tool_input"), TOOL_INPUT_FIELDS), "file_path")
                or _payload_str(payload, "file_path") or _payload_str(detail, "file_path"))
    if not path:
        return None
    found = derive_entity(cwd, path)
    if not found:
        return None
    workflow, entity = found
    return {"host": host, "session_id": _payload_str(payload, "session_id"),
            "agent_id": agent_id, "actor_id": actor, "entity": entity, "workflow": workflow}


def write_marker(bdir, marker):
    """Create sessions/<actor_id>.json unless anything is there: the first write wins, never
    replaced, never half-written, never through a symlinked sessions/ (create_once_within)."""
    if os.path.lexists(os.path.join(bdir, "sessions", marker["actor_id"] + ".json")):
        return "marker exists (first write wins)"  # the common case, without a temporary file
    try:
        written = create_once_within(bdir, "sessions/%s.json" % marker["actor_id"], go_line(marker))
    except OSError as exc:
        return "no marker written: %s %s" % (exc.filename, exc.strerror)
    return "marker written" if written else "marker exists (first write wins)"


def _entity_slug(rest):
    """The entity slug of the path segments below a workflow's state root, or None."""
    if rest and rest[0] == ".spacedock-state":
        rest = rest[1:]
    if len(rest) == 1 and rest[0].endswith(".md") and rest[0] != "README.md":
        slug = rest[0][:-3]
    elif len(rest) == 2 and rest[1] == "index.md":
        slug = rest[0]
    else:
        return None
    return slug if is_safe_name(slug) else None


def _readme_state(path):
    """The `state:` value of a README.md's YAML front matter, or None."""
    try:
        with open_input(path) as handle:   # a symlink or FIFO is no README
            text = handle.read(65536).decode("utf-8", "replace")
    except OSError:
        return None
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return None
    for line in lines[1:]:
        if line.strip() == "---":
            return None
        if line.startswith("state:"):
            return line[6:].strip().strip("\"'")
    return None


def derive_entity(cwd, path):
    """(workflow, entity) for an entity file path inside `cwd`, or None (DeriveEntity)."""
    if not path.strip() or not cwd:
        return None
    clean = os.path.normpath(path)
    if "_archive" in clean.split(os.sep):
        return None
    cwd = os.path.abspath(cwd)
    full = os.path.abspath(clean if os.path.isabs(clean) else os.path.join(cwd, clean))
    rel = os.path.relpath(full, cwd)
    if rel in (".", "..") or rel.startswith(".." + os.sep):
        return None
    segs = rel.split(os.sep)
    # (a) the legacy layout docs/spacedock/<workflow>/...
    for i in range(len(segs) - 3):
        if segs[i] == "docs" and segs[i + 1] == "spacedock":
            slug = _entity_slug(segs[i + 3:])
            if slug and is_safe_name(segs[i + 2]):
                return segs[i + 2], slug
            break
    # (b) a README.md whose front matter names a split-root state directory
    directory = os.path.dirname(full)
    while True:
        state = _readme_state(os.path.join(directory, "README.md"))
        if state and state != "$inline" and not os.path.isabs(state):
            state_root = os.path.normpath(os.path.join(directory, state))
            inside = os.path.relpath(state_root, directory)
            if inside != ".." and not inside.startswith(".." + os.sep):
                below = os.path.relpath(full, state_root)
                if below != ".." and not below.startswith(".." + os.sep):
                    slug = _entity_slug(below.split(os.sep))
                    workflow = os.path.basename(directory)
                    if slug and is_safe_name(workflow):
                        return workflow, slug
        if directory == cwd or len(directory) <= len(cwd):
            break
        directory = os.path.dirname(directory)
    # (c) a .spacedock-state directory below its workflow directory
    for i, seg in enumerate(segs):
        if seg == ".spacedock-state" and i >= 1:
            slug = _entity_slug(segs[i + 1:])
            if slug and is_safe_name(segs[i - 1]):
                return segs[i - 1], slug
            break
    return None


# ---- inbox: reading intent, routing, replies -----------------------------------------

_INBOX_STRINGS = ("id", "kind", "text", "target", "entity", "field", "value", "verdict",
                  "request_id")


def parse_intent(obj):
    """An inbox record as Go decodes it, or None when Go would reject the line.

    A field of the wrong type, or a `ts` that is present but not RFC 3339, drops
    the record (its line still counts). Returns a dict with the fields, the raw
    `ts` string and the parsed time under "_ts".
    """
    if not isinstance(obj, dict):
        return None
    obj = go_fields(obj, INTENT_FIELDS)
    rec = {}
    for key in _INBOX_STRINGS:
        value = obj.get(key)
        if value is not None and not isinstance(value, str):
            return None
        rec[key] = value or ""
    raw_ts = obj.get("ts")
    rec["ts"], rec["_ts"] = raw_ts or "", parse_rfc3339(raw_ts)
    if raw_ts is not None and rec["_ts"] is None:
        return None
    granted = obj.get("granted")
    if granted is not None and not isinstance(granted, bool):
        return None
    rec["granted"] = granted
    for key in ("target_set", "directives"):
        value = obj.get(key)
        if value is not None and not (isinstance(value, list)
                                      and all(isinstance(v, str) for v in value)):
            return None
        rec[key] = value or []
    return rec


def discover_slugs(bdir):
    """Workflow slugs that have a heartbeat file fo.<slug>.json."""
    try:
        names = os.listdir(bdir)
    except OSError:
        return []
    return clean_slugs(name[3:-5] for name in names
                       if name.startswith("fo.") and name.endswith(".json"))


def intent_targets(rec, members, bdir):
    """targetsFor: the slugs an intent is addressed to."""
    if rec["target_set"]:
        return clean_slugs(rec["target_set"])
    target = rec["target"].strip()
    if target in ("", "all"):
        return clean_slugs(members) if members else discover_slugs(bdir)
    return clean_slugs([target])


def reply_key(line, id_or_ts, kind, target):
    return "%d\0%s\0%s\0%s" % (line, id_or_ts, kind, target)


def intent_key(line, rec, target):
    return reply_key(line, rec["id"] or render_rfc3339_nano(rec["_ts"]), rec["kind"], target)


# The history is append-only, so what a scan learned about its first bytes stays
# true: `.seam-index.json` remembers where line N of inbox.jsonl starts and which
# acks in fo-replies.jsonl answer lines past the lowest cursor. Each entry is
# checked against the file (inode, size, the 32 bytes before the offset) before
# use, so a stale or foreign index only costs a full scan. It is a cache: losing
# it loses nothing, so it is replaced without fsync.
SEAM_INDEX = ".seam-index.json"
_INDEX_MAX_KEYS = 20000


def _load_index(bdir):
    """The cache in .seam-index.json, or {} (a full rescan) when any part of it is not
    what _save_index writes: one wrong-typed entry means the file is not ours to trust."""
    index = read_json_quiet(os.path.join(bdir, SEAM_INDEX), 8 << 20)
    return index if _index_ok(index) else {}


def _is_int(value):
    return type(value) is int  # not bool, which JSON true would give


def _mark_shaped(mark):
    return (isinstance(mark, list) and len(mark) == 3 and _is_int(mark[0]) and _is_int(mark[1])
            and mark[1] >= 0 and isinstance(mark[2], str))


def _index_ok(index):
    """True when every entry of a loaded index has the types its readers use."""
    if not isinstance(index, dict):
        return False
    inbox = index.get("inbox", [])
    if not (isinstance(inbox, list) and all(
            isinstance(p, list) and len(p) == 2 and _is_int(p[0]) and p[0] > 0 and _mark_shaped(p[1])
            for p in inbox)):
        return False
    replies = index.get("replies")
    if replies is not None and not (
            isinstance(replies, dict) and _is_int(replies.get("floor"))
            and _mark_shaped(replies.get("mark")) and isinstance(replies.get("keys"), list)
            and all(isinstance(e, list) and len(e) == 3 and _is_int(e[0]) and isinstance(e[1], str)
                    and isinstance(e[2], bool) for e in replies["keys"])):
        return False
    trim = index.get("replies_trim")
    return trim is None or (
        isinstance(trim, dict) and _mark_shaped(trim.get("mark")) and _is_int(trim.get("floor"))
        and _is_int(trim.get("lines")) and isinstance(trim.get("targets"), list)
        and all(isinstance(t, str) for t in trim["targets"]))


def _save_index(bdir, index):
    # A cache, checked against the files before every use: not worth an fsync per hook.
    try:
        atomic_write(os.path.join(bdir, SEAM_INDEX), json.dumps(index, separators=(",", ":")),
                     durable=False)
    except OSError:
        pass


_MARK_BYTES = 64


def _mark(handle, st, offset):
    """What identifies the first `offset` bytes of an open file: [inode, offset, tail hex].

    The tail is long enough (most of a reply line: its time, line and ids) that a
    file trimmed into a reused inode does not pass for the old one."""
    size = min(offset, _MARK_BYTES)
    handle.seek(offset - size)
    return [st.st_ino, offset, handle.read(size).hex()]


def _mark_ok(handle, st, mark):
    if not (_mark_shaped(mark) and mark[0] == st.st_ino and mark[1] <= st.st_size):
        return False
    return _mark(handle, st, mark[1])[2] == mark[2]


def read_inbox(bdir, start, index):
    """[(line, record or None)] for the complete inbox lines after line `start`, and
    the inbox's complete line count; resumes from the index's nearest checkpoint."""
    try:
        handle = open_input(os.path.join(bdir, "inbox.jsonl"))
    except OSError:
        return [], 0
    with handle:
        st = os.fstat(handle.fileno())
        base_line, base_offset = 0, 0
        points = [p for p in index.get("inbox") or () if p[0] <= start]  # shapes: _index_ok
        for line, mark in sorted(points, key=lambda p: -p[0]):
            if _mark_ok(handle, st, mark):
                base_line, base_offset = line, mark[1]
                break
        handle.seek(base_offset)
        number = base_line + _skip_lines(handle, start - base_line)
        first_line, first_offset = number, handle.tell()
        out, offset = [], first_offset
        for raw in handle:
            if not raw.endswith(b"\n"):
                break
            number += 1
            offset += len(raw)
            try:
                out.append((number, parse_json(raw)))
            except ValueError:
                out.append((number, None))
        new = [[line, mark] for line, mark in points if line not in (first_line, number)]
        for line, at in ((first_line, first_offset), (number, offset)):
            if line > 0:
                new.append([line, _mark(handle, st, at)])
        index["inbox"] = sorted(new, key=lambda p: p[0])[-16:]
    return out, number


def load_reply_keys(bdir, lines, floor, index):
    """(terminal, acting): replyKey sets of the acks in fo-replies.jsonl for inbox `lines`.

    A reply counts only if it is well formed as Go's loadReplies requires
    (schema 1, safe target, line > 0, intent kind); status `acting` goes to the
    second set (decision 2). Acks of lines at or below `floor` (the lowest
    cursor asked about) can never matter again, so the index keeps only the
    rest and later calls read just the bytes appended since.
    """
    terminal, acting = set(), set()
    try:
        handle = open_input(os.path.join(bdir, "fo-replies.jsonl"))
    except OSError:
        return terminal, acting
    with handle:
        st = os.fstat(handle.fileno())
        cache = index.get("replies")
        entries = []
        if cache and cache["floor"] <= floor and _mark_ok(handle, st, cache["mark"]):
            entries = [e for e in cache["keys"] if e[0] > floor]  # shapes checked by _index_ok
            handle.seek(cache["mark"][1])
        else:
            handle.seek(0)
        begin = handle.tell()
        data = handle.read()
        end = data.rfind(b"\n") + 1  # a torn last line is not there yet
        # Any case: Go reads "IN_REPLY_TO_LINE" as in_reply_to_line (go_fields). A line with
        # several spellings is parsed if any is past the floor. A key spelled with \u escapes
        # is not found (no JSON encoder writes one). re caches the compiled pattern.
        reply_line = re.compile(rb'(?i)"in_reply_to_line"[ \t\r\n]*:[ \t\r\n]*([0-9]+)(?![0-9.eE])')
        seen = -1
        for match in reply_line.finditer(data, 0, end):
            if int(match.group(1)) <= floor or match.start() < seen:
                continue
            start = data.rfind(b"\n", 0, match.start()) + 1
            seen = data.find(b"\n", match.end()) + 1
            try:
                entry = _reply_entry(parse_json(data[start:seen]))
            except ValueError:
                continue
            if entry is not None and entry[0] > floor:
                entries.append(entry)
        if len(entries) <= _INDEX_MAX_KEYS:
            index["replies"] = {"floor": floor, "mark": _mark(handle, st, begin + end), "keys": entries}
    for line, key, is_terminal in entries:
        if line in lines:
            (terminal if is_terminal else acting).add(key)
    return terminal, acting


def _reply_entry(reply):
    """[inbox line, replyKey, terminal?] of one fo-replies record, or None when
    loadReplies would skip it."""
    if not isinstance(reply, dict):
        return None
    reply = go_fields(reply, REPLY_FIELDS)
    schema, line = reply.get("schema"), reply.get("in_reply_to_line")
    if type(schema) is not int or schema != 1 or type(line) is not int or line <= 0:
        return None
    target, kind = reply.get("target"), reply.get("intent_kind")
    rid, rts, status = reply.get("in_reply_to_id"), reply.get("in_reply_to_ts"), reply.get("status")
    # (a safe name has no space for Go's TrimSpace to take)
    if not is_safe_name(target) or not (isinstance(kind, str) and kind):
        return None
    if not all(value is None or isinstance(value, str) for value in (rid, status)):
        return None
    parsed = parse_rfc3339(rts)
    if rts is not None and parsed is None:
        return None
    return [line, reply_key(line, rid or render_rfc3339_nano(parsed), kind, target), status != "acting"]


def pending_intents(bdir, slugs, members=None):
    """Undelivered intent per slug: ({slug: [(line, rec)]}, high_water, cursors, acting keys).

    A record is pending for a slug when its line is past the slug's cursor, it
    is addressed to the slug (`members` None means each slug alone; [] means
    the heartbeat slugs), and no terminal ack answers it. Only the lines past
    the lowest cursor are read, so the cost follows what is pending, not the
    history (see read_inbox and load_reply_keys).
    """
    index = _load_index(bdir)
    before = json.dumps(index, sort_keys=True)
    cursors = {slug: read_cursor(bdir, slug) for slug in slugs}
    floor = min(cursors.values()) if cursors else 0
    found = {slug: [] for slug in slugs}
    lines, high_water = read_inbox(bdir, floor, index)
    for number, obj in lines:
        rec = parse_intent(obj) if obj is not None else None
        if rec is None:
            continue
        for slug in slugs:
            if number > cursors[slug] and slug in intent_targets(
                    rec, [slug] if members is None else members, bdir):
                found[slug].append((number, rec))
    wanted = {line for items in found.values() for line, _ in items}
    terminal, acting = load_reply_keys(bdir, wanted, floor, index) if wanted else (set(), set())
    if json.dumps(index, sort_keys=True) != before:
        _save_index(bdir, index)
    pending = {slug: [(line, rec) for line, rec in items
                      if intent_key(line, rec, slug) not in terminal]
               for slug, items in found.items()}
    return pending, high_water, cursors, acting


def reply_record(kind, target, line, intent_kind, status, rid="", rts="", extra=()):
    """An fo-replies.jsonl record in Go's key order; empty optional fields are omitted."""
    rec = {"schema": 1, "ts": utc_iso(), "kind": kind, "target": target}
    if rid:
        rec["in_reply_to_id"] = rid
    rec["in_reply_to_line"] = line
    if rts:
        rec["in_reply_to_ts"] = rts
    rec["intent_kind"] = intent_kind
    rec["status"] = status
    for key, value in extra:
        if value not in ("", None):
            rec[key] = value
    return rec


def trim_replies(bdir):
    """Trim fo-replies.jsonl once it is past REPLIES_MAX_LINES (Go's truncateReplies).

    A line goes only if it is outside the last REPLIES_KEEP_LINES lines and
    answers an inbox line below the floor, the lowest cursor of every slug that
    can still ask about it: each `.inbox-cursor.<slug>` (as Go), and, stricter
    than Go, each slug with a heartbeat and each reply target (a slug that has not
    committed reads the legacy cursor or 0, so its acks stay until it does: a
    dropped terminal ack would deliver its intent again). No cursor file at all
    means no trim. Order is kept; appends during the trim are not lost (seam_trim).

    A look that found nothing to drop is remembered in .seam-index.json and not
    repeated until the floor rises or the file has grown by a tenth, so a floor
    held down by a slow slug does not make every ack re-read a long history.
    Returns True when the file was rewritten.
    """
    path = os.path.join(bdir, "fo-replies.jsonl")
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size <= REPLIES_MAX_LINES:
        return False  # each line is at least its newline: under the cap for sure
    slugs = _floor_slugs(bdir)
    if slugs is None:
        return False
    index = _load_index(bdir)
    note = index.get("replies_trim")  # shapes checked by _index_ok
    if note:
        slugs |= set(t for t in note["targets"] if is_safe_name(t))
    floor = min(read_cursor(bdir, slug) for slug in slugs)
    if floor <= 0:
        return False  # no line is below it
    lines = None
    if note:
        added = _lines_since(path, note.get("mark"))
        if added is not None:
            # Targets that first appear in the added lines can only lower the floor,
            # so leaving them out here can only make the skip more justified.
            if floor <= note["floor"] and added < max(100, note["lines"] // 10):
                return False
            lines = note["lines"] + added
    if lines is None:
        lines = count_complete_lines(path)
    if lines <= REPLIES_MAX_LINES:
        return False
    look = {}
    trimmed = seam_trim(path, REPLIES_MAX_LINES, REPLIES_KEEP_LINES,
                        lambda head, tail: _replies_to_keep(bdir, slugs, floor, head, tail, look), look)
    index.pop("replies_trim", None)
    if trimmed:
        index.pop("replies", None)  # its mark names the old file; the next read rebuilds it
    elif "floor" in look:
        index["replies_trim"] = look  # mark and lines (seam_trim), floor and targets
    _save_index(bdir, index)
    return trimmed


def _floor_slugs(bdir):
    """The slugs whose cursors bound a replies trim, or None without any cursor file."""
    try:
        names = os.listdir(bdir)
    except OSError:
        return None
    slugs = {name[14:] for name in names
             if name.startswith(".inbox-cursor.") and is_safe_name(name[14:])}
    return slugs | set(discover_slugs(bdir)) if slugs else None


def _lines_since(path, mark):
    """Complete lines appended to `path` after `mark` (see _mark), or None when
    `path` is no longer the file the mark was taken of."""
    try:
        handle = open_input(path)
    except OSError:
        return None
    with handle:
        st = os.fstat(handle.fileno())
        if not _mark_ok(handle, st, mark):
            return None
        handle.seek(mark[1])
        return handle.read().count(b"\n")


def _replies_to_keep(bdir, slugs, floor, head, tail, look):
    """The lines of `head` a replies trim keeps: those answering a line at or past
    the floor. Reply targets not in `slugs` lower the floor to their cursor. A line
    that is not a reply record (not JSON, no integer in_reply_to_line) answers
    nothing: it counts as line 0. Notes the floor and targets in `look`."""
    def fields(raw):
        try:
            rec = go_fields(parse_json(raw), REPLY_FIELDS)
        except ValueError:
            return 0, None
        if not isinstance(rec, dict):
            return 0, None
        line, target = rec.get("in_reply_to_line"), rec.get("target")
        return (line if type(line) is int else 0), (target if is_safe_name(target) else None)
    decoded = [fields(raw) for raw in head]
    targets = {target for _, target in decoded if target}
    targets.update(target for _, target in map(fields, tail) if target)
    for target in targets - slugs:
        floor = min(floor, read_cursor(bdir, target))
    look.update(floor=floor, targets=sorted(targets))
    return [raw for raw, (line, _) in zip(head, decoded) if line >= floor]


# ---- inbox verbs ---------------------------------------------------------------

def inbox_drain(root, slug, host="", session_id=None, members=None):
    """Return the intent pending for `slug` (peek: the cursor does not move).

    Stamps the heartbeat fo.<slug>.json first (the roster sees the FO alive even
    with an empty inbox) and appends one `acting` ack per returned record that
    has none yet.
    """
    out = {"status": "ok", "slug": slug}
    if host:
        out["host"] = host
    out.update(cursor=0, high_water=0, count=0, heartbeat=False, records=[])
    if not is_safe_name(slug):
        out.update(status="failed", records=None)
        raise SeamUsage("invalid or missing --slug", out)
    try:
        host = id_flag({"host": host}, "host")
        if session_id is None:
            session_id = _session_from_env(host)
        id_flag({"session-id": session_id}, "session-id", argv=True)
    except SeamUsage as exc:
        out["status"] = "failed"
        raise SeamUsage(exc.message, out)
    bdir = bridge_dir(root, create=True)
    beat = {"session_id": session_id}
    if host:
        beat["host"] = host
    beat.update(ts=utc_iso(), state="idle")
    errors = []  # write failures: reported, and exit 1, but the records still go out
    path = os.path.join(bdir, "fo.%s.json" % slug)
    try:
        atomic_write(path, go_line(beat), mode=0o644)
        out["heartbeat"] = True
    except OSError as exc:
        errors.append(write_failure("heartbeat not written:", path, exc))
        out["error"] = "; ".join(errors)
    if not os.path.exists(os.path.join(bdir, "inbox.jsonl")):
        out["status"] = "no-inbox"
        return out
    adopt_cursor(bdir, slug)
    pending, high_water, cursors, acting = pending_intents(
        bdir, [slug], members if members else [slug])
    out.update(cursor=cursors[slug], high_water=high_water)
    acks = []
    for line, rec in pending[slug]:
        item = {"line": line, "id": rec["id"], "ts": rec["ts"], "kind": rec["kind"]}
        for key in ("text", "granted", "target", "target_set", "entity", "field", "value",
                    "verdict", "directives", "request_id"):
            if rec[key] not in ("", None, []):
                item[key] = rec[key]
        out["records"].append(item)
        ack_kind = ACK_KINDS.get(rec["kind"])
        if ack_kind and intent_key(line, rec, slug) not in acting:
            acks.append(reply_record(ack_kind, slug, line, rec["kind"], "acting", rec["id"],
                                     rec["ts"], (("request_id", rec["request_id"]),
                                                 ("session_id", session_id), ("host", host))))
    out["count"] = len(out["records"])
    if acks:
        path = os.path.join(bdir, "fo-replies.jsonl")
        try:
            append_text(path, b"".join(go_line(ack) for ack in acks))
        except OSError as exc:
            errors.append(write_failure("acting acks not written:", path, exc))
            out["error"] = "; ".join(errors)
        else:
            _trim_replies_after_append(bdir)
    return out


def _trim_replies_after_append(bdir):
    """trim_replies for a verb whose append already succeeded: a failed trim only
    leaves the file longer, so it is reported on stderr, never as the verb's failure."""
    try:
        trim_replies(bdir)
    except OSError as exc:
        warn(write_failure("not trimmed:", os.path.join(bdir, "fo-replies.jsonl"), exc))


def inbox_ack(root, opts):
    """Append one reply to fo-replies.jsonl for an intent, after checking it exists.

    Loud guard: the ack must name the inbox line, its kind and a correlator
    (--id or --ts), and they must match what is on that line; otherwise
    nothing is written and the error says which part disagrees.
    """
    slug = opts.get("slug", "")
    if not is_safe_name(slug):
        raise SeamUsage("invalid or missing --slug")
    host = id_flag(opts, "host").lower()
    line_text = opts.get("line", "")
    line = go_count(line_text)
    if not line:
        raise SeamUsage("--line must be a positive integer, got %r" % line_text)
    kind = opts.get("kind", "")
    if kind not in ACK_KINDS:
        raise SeamUsage("unknown --kind (want tell|conn|decision|permission-decision)")
    status = opts.get("status", "").strip()
    if not status:
        raise SeamUsage("--status is required")
    if status not in ACK_STATUSES[ACK_KINDS[kind]]:
        raise SeamUsage("--status %s is not one Bridge accepts for a %s (want %s)" % (
            status if is_safe_name(status) else "(not a status word)", ACK_KINDS[kind],
            "|".join(ACK_STATUSES[ACK_KINDS[kind]])))
    rid, rts = opts.get("id", ""), opts.get("ts", "")
    if not rid and not rts:
        raise SeamUsage("ack has no correlator: pass --id (from the drained record) or --ts")
    # An intent id is an opaque correlator: Bridge only compares it with the
    # inbox line's id, never used as a path or an argv word, so any id Bridge wrote can be
    # acked. Only a control character is refused: no id is written with one.
    bad = next((ch for ch in rid if ord(ch) < 0x20 or 0x7f <= ord(ch) <= 0x9f), None)
    if bad is not None:
        raise SeamUsage("--id holds a control character (U+%04X); pass the id exactly as "
                          "drain printed it" % ord(bad))
    if rts and parse_rfc3339(rts) is None:
        raise SeamUsage("--ts %r is not an RFC 3339 time" % rts)
    session_id = (opts["session-id"] if "session-id" in opts else _session_from_env(host)).strip()
    id_flag({"session-id": session_id}, "session-id", argv=True)
    request_id = id_flag(opts, "request-id")
    bdir = bridge_dir(root)
    found = next(scan_jsonl(os.path.join(bdir, "inbox.jsonl"), line - 1), None)
    if found is None:
        raise SeamFailure("inbox line %d does not exist (%s has %d complete lines)" % (
            line, os.path.join(SEAM_DIR, "inbox.jsonl"),
            count_complete_lines(os.path.join(bdir, "inbox.jsonl"))))
    rec = parse_intent(found[1])  # None for a line that is not JSON too
    if rec is None:
        raise SeamFailure("inbox line %d is not a valid intent record" % line)
    if rid and rec["id"] != rid:
        raise SeamFailure("--id %r does not match inbox line %d (id %r)" % (rid, line, rec["id"]))
    if rts and render_rfc3339_nano(parse_rfc3339(rts)) != render_rfc3339_nano(rec["_ts"]):
        raise SeamFailure("--ts %s does not match inbox line %d (ts %r)" % (rts, line, rec["ts"]))
    if rec["kind"] != kind:
        raise SeamFailure("--kind %s does not match inbox line %d (kind %r)" % (kind, line, rec["kind"]))
    # Free text is redacted before it is written, and before --text is flattened to one
    # line (a private key pasted without its END line is recognised by its lines). The
    # fields replyKey and Bridge match on (line, id, ts, kind, target, status) and the ids
    # (checked above) are kept byte-identical.
    free = {name: opts.get(name, "") for name in ("text", "entity", "field", "value", "verdict")}
    if any(free.values()):
        free = redact_fields(get_redactor(seam_config(root)), free)
    if free["text"]:
        free["text"] = free["text"].replace("\r", " ").replace("\n", " ").strip()
    granted = opts.get("granted")
    reply = reply_record(ACK_KINDS[kind], slug, line, kind, status, rid, rts, (
        ("text", free["text"]), ("granted", granted), ("entity", free["entity"]),
        ("field", free["field"]), ("value", free["value"]),
        ("verdict", free["verdict"]), ("request_id", request_id),
        ("session_id", session_id), ("host", host)))
    path = os.path.join(bdir, "fo-replies.jsonl")
    try:
        append_text(path, go_line(reply))
    except OSError as exc:
        raise SeamFailure(write_failure("cannot append to", path, exc))
    _trim_replies_after_append(bdir)
    return {"appended": True, "kind": reply["kind"], "target": slug, "line": line}


def inbox_commit(root, slug, cursor_text):
    """Advance `slug`'s cursor to N, never backwards and never past the inbox's end."""
    if not is_safe_name(slug):
        raise SeamUsage("invalid or missing --slug")
    wanted = go_count(cursor_text)
    if wanted is None:
        raise SeamUsage("negative --cursor" if cursor_text.startswith("-") or not cursor_text
                          else "--cursor must be a line count, got %r" % cursor_text)
    bdir = bridge_dir(root, create=True)
    lock = cursor_lock(bdir, slug)
    if lock is None:
        raise SeamFailure("another commit for %s holds its cursor lock %s" % (
            slug, os.path.join(bdir, ".cursor-lock." + slug)))
    try:
        adopt_cursor(bdir, slug, locked=True)
        current = read_cursor(bdir, slug)
        lines = count_complete_lines(os.path.join(bdir, "inbox.jsonl"))
        if wanted > lines:
            raise SeamFailure("--cursor %d is past the inbox's %d complete lines (an over-advanced "
                              "cursor loses intent)" % (wanted, lines))
        new = max(wanted, current)
        path = os.path.join(bdir, ".inbox-cursor." + slug)
        if new != current or not os.path.exists(path):
            try:
                atomic_write(path, "%d\n" % new, mode=0o644)
            except OSError as exc:
                raise SeamFailure(write_failure("cannot write", path, exc), {"cursor": current})
        return {"cursor": new}
    finally:
        release_flock(lock)


def inbox_check(data, host="", repo_root=None, slug=None, session_id=None):
    """The Claude Stop hook: {"decision":"block",...} when intent is queued for this
    session's workflows, else {}. Never blocks twice in a row (stop_hook_active);
    the CLI turns any failure into {} so a broken seam never traps the agent."""
    # Go decodes the payload into a struct, and its check answers {} when that fails:
    # not JSON, not an object, or a field of the wrong type ("true" or 1 for
    # stop_hook_active must not make the hook block a stop it was told to allow).
    try:
        payload = parse_json(data.decode("utf-8", "replace")) if data.strip() else {}
    except ValueError:
        return {}
    if payload is None:
        payload = {}  # Go decodes null into the zero struct
    if not isinstance(payload, dict):
        return {}
    payload = go_fields(payload, STOP_FIELDS)
    active = payload.get("stop_hook_active")
    if any(payload.get(k) is not None and not isinstance(payload.get(k), str) for k in ("cwd", "session_id")) \
            or (active is not None and not isinstance(active, bool)) or active:
        return {}
    host = (host or "claude").strip().lower()
    root = seam_root(repo_root, _payload_str(payload, "cwd") or None)
    bdir = os.path.join(root, SEAM_DIR)
    if not os.path.isfile(os.path.join(bdir, "inbox.jsonl")):
        return {}
    session_id = session_id or _payload_str(payload, "session_id")
    if slug is not None:
        slugs = [slug] if is_safe_name(slug) else []
    elif is_safe_name(session_id):
        slugs = [s for s in discover_slugs(bdir) if _heartbeat_session(bdir, s) == session_id]
        marker_slug = next((marker["workflow"] for _, _, marker in _markers(bdir)
                            if marker.get("session_id") == session_id
                            and is_safe_name(marker.get("workflow"))), None)
        if marker_slug and marker_slug not in slugs:
            slugs.append(marker_slug)
    else:
        slugs = []
    if not slugs:
        return {}
    pending, _, _, _ = pending_intents(bdir, slugs)
    counts = [(s, len(pending[s])) for s in slugs if pending[s]]
    total = sum(n for _, n in counts)
    if not total:
        return {}
    queued = "Bridge has %d queued captain-intent record%s in _bridge/inbox.jsonl for " \
             "workflow(s): %s" % (total, "" if total == 1 else "s", ", ".join(s for s, _ in counts))
    try:
        command = seam_config(root)["seam"]["command"]  # how the user runs bridge.py
    except SeamUsage as exc:  # never guessed: the default may not be how it runs here
        return {"decision": "block", "reason": "%s, and cannot say how to run bridge.py to "
                "drain them: %s. Tell the user." % (queued, exc.message)}
    reason = ("%s. Before stopping, drain them: run `%s inbox drain --host %s --slug %s` "
              "(repeat per slug), act on each record, ack each with `%s inbox ack ...`, then "
              "advance the cursor with `%s inbox commit ...`." % (
                  queued, command, host, counts[0][0], command, command))
    return {"decision": "block", "reason": reason}


def _heartbeat_session(bdir, slug):
    """The session id in the fo.<slug>.json heartbeat, or "" (a malformed ts fails it whole)."""
    beat = go_fields(read_json_quiet(os.path.join(bdir, "fo.%s.json" % slug), 1 << 20),
                     HEARTBEAT_FIELDS)
    if not isinstance(beat, dict) or (beat.get("ts") is not None
                                      and parse_rfc3339(beat["ts"]) is None):
        return ""
    value = beat.get("session_id")
    return value.strip() if isinstance(value, str) else ""


def _markers(bdir):
    """[(mtime, path, marker dict)] of sessions/*.json, in name order. A symlinked sessions/
    is not read, as it is not written (write_marker)."""
    sessions = os.path.join(bdir, "sessions")
    out = []
    try:
        names = [] if os.path.islink(sessions) else sorted(os.listdir(sessions))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = os.path.join(sessions, name)
        try:
            with open_input(path) as handle:
                marker = parse_json(handle.read(65536))
                mtime = os.fstat(handle.fileno()).st_mtime
        except (OSError, ValueError):
            continue
        if isinstance(marker, dict):
            out.append((mtime, path, go_fields(marker, MARKER_FIELDS)))
    return out


# ---- FO -> Bridge: initiate, alert, feed -----------------------------------------------

INITIATE_KINDS = ("status", "reco", "gate-review")
FEED_VERBS = ("dispatch", "advance", "complete")


def append_record(root, name, rec, prefix, answer=None):
    """Append `rec` (Go-encoded) to ROOT/_bridge/NAME, creating `_bridge/` as needed; returns
    the file's path. A failure is a SeamFailure naming the file, in the verb's words (`prefix`),
    carrying the verb's `answer`."""
    try:
        path = os.path.join(bridge_dir(root, create=True), name)
    except SeamFailure as exc:
        raise SeamFailure(prefix + exc.message, answer)
    try:
        append_text(path, go_line(rec))
    except OSError as exc:
        raise SeamFailure(write_failure(prefix + "cannot write", path, exc), answer)
    return path


def id_fields(opts, keys, prefix, answer=None):
    """{key: its --flag's value, "" when absent} for the JSON `keys` (the flag spells _ as -),
    checked by id_flag: a session id may reach an argv, a ship_id may be a workflow/entity
    pair; a host is lower-cased. An error starts with the verb's `prefix`, carrying `answer`."""
    try:
        ids = {key: id_flag(opts, key.replace("_", "-"), argv=key == "session_id",
                            pair=key == "ship_id") for key in keys}
    except SeamFailure as exc:
        raise SeamFailure(prefix + exc.message, answer)
    if "host" in ids:
        ids["host"] = ids["host"].lower()
    return ids


def initiate(root, opts):
    """Append a status / reco / gate-review card to fo-initiate.jsonl (folded by id)."""
    rid, kind = opts.get("id", "").strip(), opts.get("kind", "").strip()
    redactor = get_redactor(seam_config(root))
    headline = one_line_summary(redactor.redact(opts.get("headline", "")), 240)
    body = one_line_summary(redactor.redact(opts.get("body", "")), 2000)
    request_id = opts.get("request-id", "").strip()
    if kind == "gate-review" and not request_id:
        request_id = rid
    out = {"id": rid, "request_id": request_id, "queued": False}
    if not rid:
        raise SeamFailure("initiation: id is required", out)
    if kind not in INITIATE_KINDS:
        raise SeamFailure("initiation: kind must be one of status|reco|gate-review", out)
    if not headline:
        raise SeamFailure("initiation: headline is required", out)
    rec = {"schema": 1, "id": rid, "ts": utc_iso(), "kind": kind}
    ids = id_fields(opts, ("id", "request_id", "workflow", "entity", "ship_id", "host",
                           "session_id"), "initiation: ", out)  # id: the fold key
    rec.update((key, value) for key, value in ids.items()
               if value and key not in ("id", "request_id"))
    rec["headline"] = headline
    if body:
        rec["body"] = body
    if request_id:
        rec["request_id"] = request_id
    rec["status"] = "open"
    path = append_record(root, "fo-initiate.jsonl", rec, "initiation: ", out)
    out["queued"] = True
    try:  # the card is queued: a failed trim only leaves the file longer
        if count_complete_lines(path) > INITIATE_MAX_LINES:
            seam_trim(path, INITIATE_MAX_LINES, INITIATE_KEEP_LINES,
                      lambda head, tail: _open_gates(os.path.dirname(path), head, tail))
    except OSError as exc:
        warn(write_failure("initiation: not trimmed:", path, exc))
    return out


def _open_gates(bdir, head, tail):
    """Lines of `head` to keep through a trim: each undecided open gate's latest line."""
    def ident(raw):
        try:
            rec = go_fields(parse_json(raw), INITIATE_FIELDS)
        except ValueError:
            return None, None
        return (rec.get("id") if isinstance(rec, dict) and isinstance(rec.get("id"), str)
                else None), rec
    in_tail = {ident(raw)[0] for raw in tail}
    latest = {}
    for index, raw in enumerate(head):
        rid, rec = ident(raw)
        if rid and rid not in in_tail:
            latest[rid] = (index, rec)
    decided = _decided_requests(bdir)
    keep = sorted(index for rid, (index, rec) in latest.items()
                  if rec.get("kind") == "gate-review" and rec.get("status") == "open"
                  and (rec.get("request_id") or rid) not in decided)
    return [head[i] for i in keep]


def _decided_requests(bdir):
    """request_ids the captain has decided (inbox `decision` lines), for gate eviction."""
    decided = set()
    for _, record, raw in scan_jsonl(os.path.join(bdir, "inbox.jsonl")):
        if b'"decision"' not in raw:
            continue
        rec = go_fields(record, INTENT_FIELDS)
        if isinstance(rec, dict) and rec.get("kind") == "decision" and isinstance(rec.get("request_id"), str):
            decided.add(rec["request_id"])
    return decided


def alert_permission(root, opts):
    """Append a non-blocking permission interrupt to fo-alerts.jsonl."""
    rid = opts.get("id", "").strip() or "perm_" + random_hex(16)
    out = {"id": rid, "request_id": rid, "queued": False}
    ids = id_fields(opts, ("id", "workflow", "entity", "host", "session_id"),
                    "permission alert: ", out)
    redactor = get_redactor(seam_config(root))
    reason = one_line_summary(redactor.redact(opts.get("reason", "")), 240)
    if not reason:
        raise SeamFailure("permission alert: reason is required", out)
    rec = {"schema": 1, "id": rid, "ts": utc_iso(), "kind": "permission-request",
           "severity": "blocked"}
    rec.update((key, value) for key, value in ids.items() if value and key != "id")
    rec["reason"] = reason
    command = one_line_summary(redactor.redact(opts.get("command", "")), 500)
    if command:
        rec["command"] = command
    # free text: redacted whole, before it is split (a secret may span a comma)
    rule = [part.strip() for part in redactor.redact(opts.get("prefix-rule", "")).split(",")
            if part.strip()]
    if rule:
        rec["prefix_rule"] = rule
    rec["status"] = "open"
    append_record(root, "fo-alerts.jsonl", rec, "permission alert: ", out)
    out["queued"] = True
    return out


def feed(root, opts):
    """Append one line of ambient narration to fo-feed.jsonl (the shape Bridge reads)."""
    verb = opts.get("verb", "").strip()
    if verb not in FEED_VERBS:
        raise SeamFailure("feed: --verb must be one of dispatch|advance|complete")
    text = one_line_summary(get_redactor(seam_config(root)).redact(opts.get("text", "")), 120)
    if not text:
        raise SeamFailure("feed: --text is required")
    rec = {"ts": utc_iso(), "verb": verb}
    rec.update(id_fields(opts, ("entity", "workflow", "stage"), "feed: "))
    rec["text"] = text
    append_record(root, "fo-feed.jsonl", rec, "feed: ")
    return {"appended": True, "verb": verb}


# ---- wake: resume parked Codex sessions --------------------------------------------

WAKE_LOCK = ".wake-lock.codex"
WAKE_LOCK_STALE_SEC = 300
# bridge.py's own record of the resumes it started, so one Codex session is never resumed
# twice at once. No Go glob reads this name (Go's are fo.*.json, sessions/*.json and the
# .inbox-cursor.* files).
WAKE_RESUMES = ".wake-resumes.codex"


def wake_codex(root, members=None, codex_bin=None):
    """Start a resume of each parked Codex FO session that has undelivered intent.

    Go's protocol, so Go's wake and this one exclude each other: the lock is
    `_bridge/.wake-lock.codex`, created exclusively (mode 0600, "<pid>\n") and removed
    when the pass ends; one older than 5 minutes is stale and reclaimed once. Each
    resume is started, not awaited (a Codex turn may take an hour), in its own session
    with its prompt on stdin and its output discarded. The resumes started are
    remembered in .wake-resumes.codex, and a session whose resume still runs is not
    resumed again. Never moves a cursor: delivery is the FO's drain + ack.
    """
    config = seam_config(root)
    bdir = bridge_dir(root)
    if not os.path.isfile(os.path.join(bdir, "inbox.jsonl")):
        return {"status": "noop", "message": "no pending inbox records"}
    lock = _wake_lock(bdir)
    if lock is None:
        return {"status": "locked", "message": "another bridge ingress wake is running"}
    try:
        return _wake_pass(root, bdir, config, members, codex_bin)
    finally:
        _wake_unlock(bdir, lock)


def _wake_lock(bdir):
    """Go's wake lock: an fd of the exclusively created lock file, or None when another
    wake holds it. Raises SeamFailure naming the file when it cannot be created at all."""
    path = os.path.join(bdir, WAKE_LOCK)
    for attempt in range(2):
        try:
            fd = create_once(path, 0o600)
        except FileExistsError:
            try:
                age = time.time() - os.lstat(path).st_mtime
            except OSError:
                return None  # as Go: a lock we cannot stat is held
            if attempt or age <= WAKE_LOCK_STALE_SEC:
                return None
            try:  # stale (its wake died): reclaim it, once
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise SeamFailure(write_failure("cannot remove the stale wake lock", path, exc))
            continue
        except OSError as exc:
            raise SeamFailure(write_failure("cannot create the wake lock", path, exc))
        try:
            write_all(fd, b"%d\n" % os.getpid())
        except OSError as exc:
            _wake_unlock(bdir, fd)
            raise SeamFailure(write_failure("cannot write the wake lock", path, exc))
        return fd
    return None


def _wake_unlock(bdir, fd):
    """Remove the wake lock, unless it is no longer ours (reclaimed as stale meanwhile)."""
    path = os.path.join(bdir, WAKE_LOCK)
    try:
        if os.lstat(path).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)
    except OSError:
        pass
    finally:
        os.close(fd)


def _wake_pass(root, bdir, config, members, codex_bin):
    # Targets are the --members, else the slugs with a heartbeat; broadcasts
    # route to them as in Go's wake.
    targets = clean_slugs(members) if members else discover_slugs(bdir)
    found, _, _, _ = pending_intents(bdir, targets, clean_slugs(members) if members else [])
    pending = {slug: [line for line, _ in items] for slug, items in found.items() if items}
    if not pending:
        return {"status": "noop", "message": "no pending inbox records"}
    inbox = os.path.join(bdir, "inbox.jsonl")
    all_lines = sorted({line for lines in pending.values() for line in lines})
    groups = {}  # session id -> slugs
    for slug in sorted(pending):
        session = _resumable_session(bdir, slug)
        if session:
            groups.setdefault(session, []).append(slug)
    if not groups:
        _wake_event(bdir, "skipped-no-session", all_lines, sorted(pending), "",
                    message="no resumable Codex session id")
        return {"status": "skipped-no-session", "lines": all_lines, "targets": sorted(pending),
                "message": "no resumable Codex session id"}
    template, command = config["seam"]["wake_command"], config["seam"]["command"]
    resumes = _wake_resumes(bdir)
    woke, running, failures = 0, [], []
    for session, slugs in groups.items():
        lines = sorted({line for slug in slugs for line in pending[slug]})
        if session in resumes:
            running.append(session)
            _wake_event(bdir, "skipped-running", lines, slugs, session,
                        message="the resume started by an earlier wake (pid %d) is still running"
                        % resumes[session]["pid"])
            continue
        argv = fill_template(template, {"session_id": session})
        if codex_bin:
            argv[0] = codex_bin
        prompt = ("Bridge has queued captain intent for this Codex session.\n"
                  "Pending physical inbox lines for this session: %s\n"
                  "Addressed workflow slugs: %s\n"
                  "Inbox: %s\n"
                  "For each slug run `%s inbox drain --host codex --slug SLUG`, act on each "
                  "record, ack it with `%s inbox ack ...`, then `%s inbox commit ...`.\n" % (
                      ",".join(map(str, lines)), ",".join(slugs), inbox, command, command, command))
        try:
            pid = _start_resume(argv, root, prompt)
        except OSError as exc:
            where = exc.filename if exc.filename and exc.filename != argv[0] else None
            error = get_redactor(config).redact("cannot start %s: %s%s" % (
                argv[0], "%s: " % where if where else "", exc.strerror or exc))
            failures.append(error)
            _wake_event(bdir, "failed", lines, slugs, session, error=error)
            continue
        woke += 1
        resumes[session] = process_identity(pid)
        _save_wake_resumes(bdir, resumes)  # at once: a wake killed now still guards this resume
        _wake_event(bdir, "woke", lines, slugs, session)
    if failures:
        status = "partial" if woke or running else "failed"
    else:
        status = "woke" if woke else "running"
    out = {"status": status, "lines": all_lines, "sessions": len(groups),
           "targets": sorted(pending),
           "message": {"woke": "resumed Codex FO session",
                       "running": "the Codex FO session's resume started by an earlier wake is still running",
                       "partial": "some Codex sessions failed to resume",
                       "failed": "no Codex session resumed"}[status]}
    if running:
        out["running"] = running
    if failures:
        out["error"] = "; ".join(failures)
    return out


def _start_resume(argv, cwd, prompt):
    """Start `argv` detached, as Go's wake does: its own session, the prompt on stdin
    from a temporary file spacedock-bridge-wake-*.txt (removed once the child holds it
    open), stdout and stderr to /dev/null; not waited for. Returns its pid."""
    import subprocess
    import tempfile
    fd, path = tempfile.mkstemp(prefix="spacedock-bridge-wake-", suffix=".txt")
    try:
        try:
            write_all(fd, prompt.encode("utf-8"))
        except OSError as exc:  # name the prompt file, not the command
            raise OSError(exc.errno, exc.strerror, path) from None
        os.lseek(fd, 0, os.SEEK_SET)
        child = subprocess.Popen(argv, cwd=cwd, stdin=fd, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
    finally:
        os.close(fd)
        os.unlink(path)
    return child.pid  # not awaited: once this short-lived process exits, init reaps it


def _wake_resumes(bdir):
    """{session id: process_identity} of the resumes started by earlier wakes that still
    run (verified: same host and boot, the pid alive and started when it was recorded,
    so a recycled pid does not count, nor a zombie)."""
    saved = read_json_quiet(os.path.join(bdir, WAKE_RESUMES), 1 << 20)
    if not isinstance(saved, dict):
        return {}
    me = os.uname().nodename
    return {session: meta for session, meta in saved.items()  # holder_is_dead: a zombie too
            if isinstance(meta, dict) and meta.get("host") == me and _is_int(meta.get("pid"))
            and meta["pid"] > 0 and meta.get("start_ticks") and not holder_is_dead(meta)}


def _save_wake_resumes(bdir, resumes):
    path = os.path.join(bdir, WAKE_RESUMES)
    try:
        if resumes or os.path.lexists(path):
            atomic_write(path, go_line(resumes), mode=0o644)
    except OSError as exc:  # the resumes are started: losing the record only loses the guard
        warn(write_failure("wake: cannot record the resumes started in", path, exc))


def _resumable_session(bdir, slug):
    """The Codex session to resume for `slug`: heartbeat, else newest marker, else latest codex event."""
    session = _heartbeat_session(bdir, slug)
    if is_safe_session_id(session):
        return session
    markers = [(mtime, path, marker["session_id"]) for mtime, path, marker in _markers(bdir)
               if marker.get("workflow") == slug
               and is_safe_session_id(marker.get("session_id"))]
    if markers:
        return max(markers)[2]  # the newest (no two markers share a path)
    latest = None
    for _, record, _ in scan_jsonl(os.path.join(bdir, "events.jsonl")):
        rec = go_fields(record, EVENT_FIELDS)
        if not isinstance(rec, dict) or rec.get("host") != "codex":
            continue
        sid, when = rec.get("session_id"), parse_rfc3339(rec.get("ts"))
        if is_safe_session_id(sid) and when and (latest is None or when[:2] >= latest[0]):
            latest = (when[:2], sid)
    return latest[1] if latest else None


def _wake_event(bdir, status, lines, targets, session, message="", error=""):
    now = utc_iso()
    rec = {"timestamp": now, "ts": now, "host": "codex", "event": "wake", "status": status,
           "lines": lines, "targets": targets, "session_id": session}
    if message:
        rec["message"] = message
    if error:
        rec["error"] = error
    try:
        append_text(os.path.join(bdir, "wake-events.jsonl"), go_line(rec))
    except OSError as exc:
        warn(write_failure("wake: cannot append to", os.path.join(bdir, "wake-events.jsonl"), exc))


# =============================================================================
# 4. RELAY - Agent Teams <-> YAML queue relay
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
# The statuses a queue entry moves through; `up` reports one of them.
RELAY_STATUSES = ("pending", "in_progress", "done", "failed", "reassigned")
RELAY_NO_RELAY_STATUSES = ("pending", "in_progress", "reassigned")
RELAY_NUDGE_TEXT = "新規指令 {cmd_id} を受信。処理されたし。"

# YAML 1.1 words PyYAML resolves to bool or null when they are plain.
_YAML_SPECIAL_WORDS = frozenset(
    "y Y yes Yes YES n N no No NO true True TRUE false False FALSE "
    "on On ON off Off OFF null Null NULL ~".split())
# The non-ASCII characters YAML text may hold raw: all but what PyYAML treats as a line
# break or space (U+0085, U+2028, U+2029), the BOM, surrogates and non-printables.
_YAML_OTHER = "\u00a0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff"
# What may follow the first character of a plain scalar yaml_scalar_lines writes.
_YAML_PLAIN_REST = "\\-A-Za-z0-9_./()+=$^~<>;!?%@*&'\"" + _YAML_OTHER


_YAML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def yaml_quote_double(text):
    """Return `text` as a one-line double-quoted YAML scalar.

    Uses only escapes that YAML 1.1 (PyYAML) and 1.2 both read; characters
    PyYAML's reader rejects or folds (C0/C1 controls, DEL, U+2028/9, BOM,
    U+FFFE/F) are escaped; everything else, astral characters included, is
    written raw so a reader never sees surrogate pairs.
    """
    lone = re.search("[\ud800-\udfff]", text)
    if lone:
        raise BridgeError("text contains a lone surrogate (U+%04X); it is not valid UTF-8"
                          % ord(lone.group()), EXIT_USAGE)

    def escape(match):
        ch = match.group()
        return _YAML_ESCAPES.get(ch) or ("\\x%02x" if ord(ch) < 0x100 else "\\u%04x") % ord(ch)
    return '"%s"' % re.sub('["\\\\\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]', escape, text)


def yaml_scalar_lines(text, indent):
    """Render string `text` as the value of a block-map key.

    Returns (head, extra_lines): `head` goes after `key: ` on the key's line,
    `extra_lines` (for literal blocks) are the following lines, already
    indented by `indent` spaces. The choice, most readable first:
    plain when the text cannot be mistaken for anything else, a literal
    block `|` for multi-line text, single quotes when printable, else
    double quotes with escapes. PyYAML safe_load returns `text` exactly.
    """
    yaml = YamlSubset.compiled()
    # every character may appear raw in a PyYAML-read file (a tab too), and no line break but \n
    printable = yaml._PRINTABLE.search(text) is None
    if "\n" not in text:
        # Not plain when it starts with a space to Python's `\s` (U+3000, U+00A0):
        # PyYAML reads that, but YamlSubset starts no value at such a character and
        # would refuse the file at the next append.
        if text not in _YAML_SPECIAL_WORDS and yaml._PLAIN_OK.match(text) \
                and not text[0].isspace() and ": " not in text and " #" not in text:
            return text, []
        if printable and "\t" not in text:
            return "'" + text.replace("'", "''") + "'", []
        return yaml_quote_double(text), []
    lines = text.split("\n")
    literal_ok = printable and all(not ln or ln.strip(" ") for ln in lines[:-1])
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
    return "|" + indicator + chomp, [" " * indent + ln if ln else "" for ln in body]


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
    under `key:`), "toplist" (the whole document is a list, as some older queues
    are) or "new" (no `key:` yet: one is added at the end).
    Columns are those of the first existing entry, so a new entry looks like
    its neighbours: indentless (PyYAML) or indented lists, 2 or 4 spaces.
    """

    def __init__(self, text, key):
        self.text = text
        self.key = key               # "commands", "queue" or "messages"
        self.kind = "new"
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


def _line_at(text, offset):
    end = text.find("\n", offset)
    return text[offset:len(text) if end < 0 else end]


def _refuse(path, text, offset, why):
    raise BridgeError("%s line %d: %s; the file was not changed" % (
        path, text.count("\n", 0, offset) + 1, why), EXIT_FAILED)


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


class YamlSubset:
    """Checks that a whole queue file is in the YAML subset bridge.py follows, which
    PyYAML's yaml.safe_load (what every consumer of the queue uses) also reads.

    relay reads and appends to queue files without a YAML library, so before it
    touches one it makes sure every line is accounted for; a file outside the subset
    is refused naming the line, rather than appended to and handed on unreadable.
    The subset: comments, blank lines and one leading `---`; a block mapping or block
    list at the top; block mappings with one-line plain or quoted keys; block lists,
    indented or indentless, with compact `- key: value` entries; every line of a
    collection at that collection's column. Values: plain scalars, continued on lines
    indented past their collection; single- and double-quoted scalars (valid escapes,
    closed, continued likewise); literal and folded blocks (`|`, `>-`, `|2`); one-line
    flow collections of scalars (`[]`, `{}`, `{status: idle, task: null}`). Refused,
    though YAML has them: anchors, aliases, tags, directives, `?` keys, flow
    collections spanning lines or nested, tabs outside quotes, blocks and comments, a
    second document, and plain values PyYAML resolves to a type but cannot build
    (`=`, `<<`, `0x_`, 2026-02-30).
    """

    # Compiled by the first check, not at import: hooks import this module on every tool
    # call, and compiling these (the Unicode class above all) costs them milliseconds.
    _PATTERNS = dict(
        _PLAIN_FIRST=r"[^\s\-?:,\[\]{}#&*!|>'\"%@`]|-[^\s:,\[\]{}]",
        _FLOW_PLAIN=r"(?:[^\s\-?:,\[\]{}#&*!|>'\"%@`]|-[^\s,\[\]{}#:])[^,?\[\]{}#:\t]*",
        _KEY_END=r":(?: |\Z)| #",
        _BLOCK_HEADER=r"[|>](?:([1-9])[+-]?|[+-]([1-9])?)?(?: +(?:#.*)?)?\Z",
        # what YAML holds raw is tab, newline, printable ASCII and _YAML_OTHER: the rest,
        # said as the short class it is (a tenth of the compile time of its negation)
        _PRINTABLE="[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]",
        # A conservative plain scalar (yaml_scalar_lines): no indicator first, none of the
        # characters that end or change a plain scalar, no first character that any PyYAML
        # implicit resolver (int, float, timestamp, merge, value, null) keys on.
        _PLAIN_OK="[A-Za-z_/(%s](?:[%s ]*[%s])?\\Z" % (_YAML_OTHER, _YAML_PLAIN_REST,
                                                       _YAML_PLAIN_REST),
        _SINGLE=r"(?:[^']|'')*",
        _DOUBLE=r'(?:[^"\\]|\\[0abt\tnvfre "/\\N_LP]|\\x[0-9A-Fa-f]{2}'
                r'|\\u[0-9A-Fa-f]{4}|\\U[0-9A-Fa-f]{8})*',
        _TIMESTAMP=r"(\d{4})-(\d\d)-(\d\d)\Z|(\d{4})-(\d\d?)-(\d\d?)(?:[Tt]|[ \t]+)"
                   r"(\d\d?):(\d\d):(\d\d)(?:\.\d*)?(?:[ \t]*(?:Z|[-+](\d\d?)(?::(\d\d))?))?\Z")

    _RUNS = {}                   # (dash column or None, key column) -> compiled run

    @classmethod
    def compiled(cls):
        """The class, with its _PATTERNS compiled (by the first use)."""
        if "_PRINTABLE" not in vars(cls):
            for name, pattern in cls._PATTERNS.items():
                setattr(cls, name, re.compile(pattern))
        return cls

    def __init__(self, path, text):
        import itertools
        self.compiled()
        self.path = path
        self.text = text
        self.depth = 0               # collections open around the node being checked
        self.lines = text.split("\n")
        # where each line starts in text, for the runs below
        self.starts = list(itertools.accumulate(map((1).__add__, map(len, self.lines)),
                                                initial=0))

    @classmethod
    def run(cls, dash, col):
        """A regex for a run of whole, common entries that the line-by-line checks
        below would accept: `key: value` lines of a mapping at column `col` (or list
        items at column `dash` holding such mappings) whose keys are plain words and
        whose values are plain words, quoted text, `[]`/`{}`, or a list of those.
        It only saves time on large queues; whatever it does not match, or the
        moment it stops matching, is checked line by line."""
        if (dash, col) in cls._RUNS:
            return cls._RUNS[dash, col]
        blank = r"[ ]*(?:#[^\n]*)?(?=\n|\Z)"              # a blank or comment line

        def upto(k, no_item=False):   # the next content line is indented at most k
            line = r"[ ]{0,%d}[^ \n#]" % k
            if no_item:  # ... and is not an item of a list at column k
                line = r"[ ]{%d}(?!-(?:[ \n]|\Z))[^ \n#]" % k
                if k:
                    line = r"(?:[ ]{0,%d}[^ \n#]|%s)" % (k - 1, line)
            return r"(?=\n%s|\Z)" % line

        def scalar(k):
            eol = r"[ ]*(?=\n|\Z)"
            more = r"\n(?=[ ]*\n)|\n[ ]{%d}" % (k + 1)       # continuation lines
            return (r"(?:[^\s\-?:,\[\]{}#&*!|>'\"%%@`=<+.~0-9][^\n\t: #]*(?:(?::(?=[^ \n])"
                    r"| +(?![ #])|#)[^\n\t: #]*)*%s|[0-9]+[ ]*%s|\[[ ]*\]%s"
                    r"|\{[ ]*\}%s|'[^'\n]*(?:(?:''|%s)[^'\n]*)*'%s"
                    r"|\"[^\"\\\n]*(?:(?:\\[0abtnvfre \"/\\N_LP]|%s)[^\"\\\n]*)*\"%s)"
                    % (upto(k), upto(k), eol, eol, more, eol, more, eol))

        def items(k):
            return r"(?:\n[ ]{%d}-[ ]+%s)+" % (k, scalar(k))

        pair = (r"[A-Za-z_][A-Za-z0-9_]*:(?:[ ]+%s|[ ]*(?:%s%s|%s%s|%s))" % (
            scalar(col), items(col), upto(col, True), items(col + 2), upto(col),
            upto(col, True)))
        run = r"%s(?:\n(?:[ ]{%d}%s|%s))*" % (pair, col, pair, blank)
        if dash is not None:
            item = r"-[ ]{%d}%s%s" % (col - dash - 1, run, upto(dash))
            run = r"%s(?:\n(?:[ ]{%d}%s|%s))*" % (item, dash, item, blank)
        cls._RUNS[dash, col] = re.compile(run)
        return cls._RUNS[dash, col]

    def fast(self, row, col, dash=None):
        """The row after a run (see run()) starting at (row, col), or None."""
        m = self.run(dash, col).match(self.text, self.starts[row] + (col if dash is None
                                                                     else dash))
        return None if m is None else self.skip(row + m.group().count("\n") + 1)

    def check(self):
        odd = self._PRINTABLE.search(self.text)
        if odd:
            self.fail(self.text.count("\n", 0, odd.start()), "character U+%04X, which YAML "
                      "readers refuse or take as a line break" % ord(odd.group()))
        row = self.skip(0)
        if row < len(self.lines) and re.match(r"---(?: +(?:#.*)?)?\Z", self.lines[row]):
            row = self.skip(row + 1)
        if row < len(self.lines):
            if self.lines[row][:1] == " ":
                self.fail(row, "the top level must start in column 1")
            if not self.is_item(row, 0) and self.key_end(row, 0) is None:
                self.stray(row, "the top level must be a mapping (`key:` lines) or a list "
                                "(`- ` lines)")
            row = self.node(row, 0, -1)
        if row < len(self.lines):
            self.stray(row, "a line that is not a list item after the top-level list")

    def fail(self, row, why):
        _refuse(self.path, self.text, self.starts[row], why)

    def stray(self, row, why):
        if self.lines[row].startswith(("---", "...")):
            why = "a second YAML document (%s) is not supported" % self.lines[row][:3]
        self.fail(row, why)

    # -- lines

    def indent(self, row):
        line = self.lines[row]
        return len(line) - len(line.lstrip(" "))

    def skip(self, row):
        """The first row from `row` on that holds more than spaces or a comment."""
        lines = self.lines
        while row < len(lines):
            rest = lines[row].lstrip(" ")
            if rest and rest[0] != "#":
                if rest[0] == "\t":
                    self.fail(row, "a tab in the indentation (YAML indents with spaces)")
                return row
            row += 1
        return row

    def is_item(self, row, col):
        line = self.lines[row]
        return line[col:col + 1] == "-" and line[col + 1:col + 2] in ("", " ")

    def end_of_line(self, row, col, what):
        """Only spaces and a ` #` comment may follow `what` on its line."""
        rest = self.lines[row][col:]
        stripped = rest.lstrip(" ")
        if stripped and not (stripped[0] == "#" and len(stripped) < len(rest)):
            self.fail(row, "unexpected text after %s: %r" % (what, stripped[:30]))

    # -- collections

    def node(self, row, col, parent):
        """The node starting at (row, col), in a collection at column `parent`."""
        # Each level costs up to four frames of this recursion: a limit far above any
        # queue's nesting and far below Python's recursion limit.
        self.depth += 1
        if self.depth > 100:
            self.fail(row, "nested deeper than 100 levels")
        if self.is_item(row, col):
            row = self.sequence(row, col)
        elif self.key_end(row, col) is not None:
            row = self.mapping(row, col)
        else:
            row = self.scalar(row, col, parent)
        self.depth -= 1
        return row

    def below(self, row, col, indentless):
        """The node after a `key:` or `-` that ends its line: on the next rows,
        indented past `col` (or an indentless list at `col`); else it is null."""
        nxt = self.skip(row + 1)
        if nxt < len(self.lines):
            ind = self.indent(nxt)
            if ind > col:
                return self.node(nxt, ind, col)
            if ind == col and indentless and self.is_item(nxt, col):
                return self.sequence(nxt, col)
        return nxt

    def mapping(self, row, col):
        while True:
            fast = self.fast(row, col)
            if fast is not None:
                row = fast
            else:
                end = self.key_end(row, col)
                if end is None:
                    self.stray(row, "expected a `key: value` line of the mapping at column "
                                    "%d" % (col + 1))
                line = self.lines[row]
                at = len(line) - len(line[end:].lstrip(" "))
                if at == len(line) or line[at] == "#":
                    row = self.below(row, col, True)
                elif self.is_item(row, at):
                    self.fail(row, "a list cannot start on its key's line")
                else:
                    row = self.scalar(row, at, col)
            if row >= len(self.lines) or self.indent(row) < col:
                return row
            if self.indent(row) > col:
                self.fail(row, "indented deeper than the keys of the mapping at column %d"
                          % (col + 1))
            if self.is_item(row, col):
                self.fail(row, "a list item where a key of the mapping at column %d was "
                               "expected" % (col + 1))

    def sequence(self, row, col):
        while True:
            line = self.lines[row]
            at = len(line) - len(line[col + 1:].lstrip(" "))
            if at == len(line) or line[at] == "#":
                row = self.below(row, col, False)
            else:
                fast = self.fast(row, at, col)
                row = self.node(row, at, col) if fast is None else fast
            if row >= len(self.lines) or self.indent(row) < col:
                return row
            if self.indent(row) > col:
                self.fail(row, "indented deeper than the items of the list at column %d"
                          % (col + 1))
            if not self.is_item(row, col):
                return row    # an indentless list ends at its mapping's next key

    def key_end(self, row, col):
        """The column after the `:` of a one-line key starting at col, or None."""
        line = self.lines[row]
        if line[col:col + 1] in ("'", '"'):
            end = self.quoted_end(row, col + 1, line[col])
            if end is None:
                return None
            after = len(line) - len(line[end:].lstrip(" "))
            if line[after:after + 1] == ":" and line[after + 1:after + 2] in ("", " "):
                return after + 1
            return None
        if not self._PLAIN_FIRST.match(line, col) or (
                col == 0 and re.match(r"(?:---|\.\.\.)(?: |\Z)", line)):   # a document marker
            return None
        m = self._KEY_END.search(line, col)
        if m is None or m.group() == " #":
            return None
        key = line[col:m.start()].rstrip(" ")
        if "\t" in key:
            self.fail(row, "a tab in a key")
        if len(key) > 1000:
            self.fail(row, "a key longer than 1000 characters (YAML readers stop at 1024)")
        self.plain_value(row, key)
        return m.start() + 1

    # -- scalars

    def scalar(self, row, col, parent):
        """The scalar or flow value at (row, col); returns the next content row."""
        line = self.lines[row]
        ch = line[col]
        if ch in "'\"":
            end_row, end_col = self.quoted(row, col, parent)
            self.end_of_line(end_row, end_col, "the closing quote")
            return self.skip(end_row + 1)
        if ch in "[{":
            self.end_of_line(row, self.flow(row, col), "the flow collection")
            return self.skip(row + 1)
        if ch in "|>":
            return self.block(row, col, parent)
        if not self._PLAIN_FIRST.match(line, col):
            self.fail(row, "%r cannot start a value here (anchors, aliases, tags, directives "
                           "and `?` keys are not supported; quote the text)" % ch)
        return self.plain(row, col, parent)

    def plain_value(self, row, value):
        """Refuse a plain value PyYAML resolves to a type it then cannot build."""
        if value[:1] not in "0123456789+-=<":
            return
        bad = value in ("=", "<<") or re.match(r"[-+]?0[bx]_+\Z", value)
        m = not bad and value[:1].isdigit() and self._TIMESTAMP.match(value)
        if m:
            import datetime
            g = m.groups()
            try:
                if g[0]:
                    datetime.date(int(g[0]), int(g[1]), int(g[2]))
                else:
                    datetime.datetime(*[int(x) for x in g[3:9]])
                    datetime.timezone(datetime.timedelta(hours=int(g[9] or 0),
                                                         minutes=int(g[10] or 0)))
            except ValueError:
                bad = True
        if bad:
            self.fail(row, "%r unquoted is read as a value YAML readers cannot build; "
                           "quote it" % value)

    def plain(self, row, col, parent):
        parts, blanks = [], 0
        while True:
            line = self.lines[row]
            cut = line.find(" #", col)
            text = line[col:cut if cut >= 0 else len(line)].rstrip(" ")
            if "\t" in text:
                self.fail(row, "a tab in an unquoted value (quote it)")
            if ": " in text or text.endswith(":"):
                self.fail(row, "`: ` in an unquoted value (quote it)")
            parts.append(("\n" * blanks or " ") + text if parts else text)
            nxt, blanks = row + 1, 0
            while nxt < len(self.lines) and not self.lines[nxt].strip(" "):
                nxt, blanks = nxt + 1, blanks + 1
            if cut >= 0 or nxt >= len(self.lines) or self.indent(nxt) <= parent \
                    or self.lines[nxt].lstrip(" ")[0] in "#\t":
                self.plain_value(row, "".join(parts))
                return self.skip(nxt)
            row, col = nxt, self.indent(nxt)

    def quoted_end(self, row, i, quote):
        """The column after the closing `quote` on `row`, scanning from column i
        inside the quotes; None if the value goes on to the next line."""
        line = self.lines[row]
        end = (self._SINGLE if quote == "'" else self._DOUBLE).match(line, i).end()
        if end == len(line) or (line[end] == "\\" and end + 1 == len(line)):
            return None                  # goes on (after an escaped line break)
        if line[end] == "\\":
            self.fail(row, "an unknown escape %r in a double-quoted value" % line[end:end + 2])
        if "\\U" in line[i:end] and max([0] + [int(x, 16) for x in re.findall(
                r"\\(?:U([0-9A-Fa-f]{8})|.)", line[i:end]) if x]) > 0x10FFFF:
            self.fail(row, "a \\U escape past U+10FFFF in a double-quoted value")
        return end + 1

    def quoted(self, row, col, parent):
        """(row, column) after the close of the quoted scalar opened at (row, col)."""
        start, quote = row, self.lines[row][col]
        end = self.quoted_end(row, col + 1, quote)
        while end is None:
            row += 1
            if row >= len(self.lines):
                self.fail(start, "the quote opened here is never closed")
            if self.lines[row].strip(" ") and self.indent(row) <= parent:
                self.fail(start, "the quote opened here is not closed before line %d (the "
                                 "lines of a quoted value are indented past column %d)"
                          % (row + 1, parent + 1))
            end = self.quoted_end(row, 0, quote)
        return row, end

    def flow(self, row, col):
        """A one-line flow collection of scalars; returns the column after it."""
        line = self.lines[row]
        close = "]" if line[col] == "[" else "}"

        def spaces(i):
            return len(line) - len(line[i:].lstrip(" "))

        def item(i):
            if line[i:i + 1] in ("'", '"'):
                end = self.quoted_end(row, i + 1, line[i])
                if end is None:
                    self.fail(row, "a quote in a flow collection not closed on its line")
                return end
            m = self._FLOW_PLAIN.match(line, i)
            if m is None:
                self.fail(row, "only plain or quoted scalars can go in a flow collection "
                               "(`[a, b]`, `{k: v}`), and it must close on its line")
            self.plain_value(row, m.group().rstrip(" "))
            return m.end()

        i = spaces(col + 1)
        while line[i:i + 1] != close:
            i = spaces(item(i))
            if close == "}" and line[i:i + 1] == ":" and line[i + 1:i + 2] in (" ", ",", "}"):
                i = spaces(i + 1)
                if line[i:i + 1] not in (",", "}"):
                    i = spaces(item(i))
            if line[i:i + 1] == ",":
                i = spaces(i + 1)
            elif line[i:i + 1] != close:
                self.fail(row, "a flow collection (`%s`) not closed on its line, or with "
                               "more than scalars in it" % line[col])
        return i + 1

    def block(self, row, col, parent):
        """The literal or folded block whose header (`|`, `>-`, `|2`...) is at (row, col)."""
        header = self._BLOCK_HEADER.match(self.lines[row], col)
        if not header:
            self.fail(row, "a bad block header %r" % self.lines[row][col:col + 10])
        digit = header.group(1) or header.group(2)
        nxt, longest = row + 1, 0
        while nxt < len(self.lines) and not self.lines[nxt].strip(" "):
            longest = max(longest, len(self.lines[nxt]))
            nxt += 1
        if digit:
            ind = parent + int(digit)
        else:
            ind = parent + 1
            if nxt < len(self.lines) and self.indent(nxt) > parent:
                ind = self.indent(nxt)
            if longest > ind:
                self.fail(row + 1, "a blank line with more spaces than the text of its block")
        while nxt < len(self.lines) and (not self.lines[nxt].strip(" ")
                                         or self.indent(nxt) >= ind):
            nxt += 1
        return self.skip(nxt)


def relay_layout(path, text, keys, checked=False):
    """Find the list (or id-keyed mapping) under the first of `keys` present.

    The whole text must pass YamlSubset first (unless `checked`: these are the
    bytes relay wrote last, see relay_wrote_last). Then only the lines that start
    in column 0 and are not list items (a handful in any real queue) and the
    first entry are looked at. Raises BridgeError (exit 1) naming the line
    when the text is outside the subset or `keys` hold no block list or mapping.
    """
    if not checked:
        YamlSubset(path, text).check()
    key_re = re.compile(_YAML_KEY + r"[ \t]*(.*)\Z")
    found = {}                     # key -> (line offset, value offset)
    tops = []                      # offsets of the top-level non-item lines
    scan = "\n" + text
    for match in re.finditer(r"\n((?:[^ \n#\-]|-[^ \n])[^\n]*)", scan):
        line, offset = match.group(1), match.start()
        if line.rstrip(" ") == "---" or line.startswith("--- "):
            continue               # YamlSubset allows one, before the document
        km = key_re.match(line)
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
        # A list at the top (no top-level key at all), else a new key at the end.
        first_item = None if tops else re.search(r"^-(?:[ \n]|\Z)", text, re.M)
        if first_item is not None:
            layout.kind = "toplist"
            layout.region = (first_item.start(), len(text))
            _relay_list_columns(path, text, layout, first_item.start())
            _relay_insert_point(layout)
        return layout
    line_at, value_at = found[key]
    eol = text.find("\n", line_at)
    eol = len(text) if eol < 0 else eol
    value = _strip_comment(text[value_at:eol])
    later = [t for t in tops if t > line_at]
    layout.region = (min(eol + 1, len(text)), later[0] if later else len(text))
    body = re.compile(r"^(?![ \t]*(?:#|$))", re.M).search(text, *layout.region)
    body_at = None if body is None else body.start()
    if value in ("[]", "{}", "null", "Null", "NULL", "~"):
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
        prev = max(text.rfind("\n", start, pos - 1) + 1, start)
        line = text[prev:pos].rstrip("\n")
        if line.strip(" ") and not line.startswith("#"):
            break
        pos = prev
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
    are not numeric and are skipped, as the original script skips them; so are ids in
    other than ASCII digits (its grep's [0-9]) or longer than any counter (19 digits up).
    """
    d, k = layout.dash_col, layout.key_col
    tail = r"[ \t]*(?:[ \t]#[^\n]*)?(?=\n|\Z)"
    value = r"id:[ \t]*(['\"]?)cmd_([0-9]{1,18})\1" + tail
    if layout.kind == "map":
        pattern = (r"\n(?: {%d}(['\"]?)cmd_([0-9]{1,18})\1[ \t]*:(?=[ \t\n]|\Z)|"
                   r" {%d}id:[ \t]*(['\"]?)cmd_([0-9]{1,18})\3%s)" % (d, k, tail))
    else:
        pattern = r"\n(?: {%d}-[ ]+| {%d,%d})" % (d, d + 1, k) + value
    start, end = layout.region
    return max((int(m.group(2) if layout.kind != "map" else m.group(2) or m.group(4))
                for m in re.compile(pattern).finditer(layout.scan, start, end)), default=0)


def relay_splice(layout, raw, bom, entry_lines):
    """The new file's bytes: the entry appended at the layout's insertion point. The file's
    bytes `raw` around the entry are copied, not re-encoded, so a large queue costs one copy
    (the tail after the insertion point, usually empty, is the only text encoded); a new key,
    or a flow-empty value rewritten, is the whole text encoded (behind the `bom`)."""
    text, at = layout.text, layout.insert_at
    block = "\n".join(entry_lines) + "\n"
    if layout.kind == "new":
        head = "" if not text or text.endswith("\n") else "\n"
        return (bom + text + head + layout.key + ":\n" + block).encode("utf-8")
    if at > 0 and text[at - 1] != "\n":
        block = "\n" + block
    if layout.rewrite is not None:
        a, b = layout.rewrite
        rest = text[b:at].lstrip(" \t") if text[b:at].lstrip(" \t").startswith("#") else text[b:at]
        sep = " " if rest.startswith("#") else ""
        return (bom + text[:a].rstrip(" \t") + sep + rest + block + text[at:]).encode("utf-8")
    cut = len(raw) - len(text[at:].encode("utf-8"))
    return raw[:cut] + block.encode("utf-8") + raw[cut:]


def relay_entry_text(layout, cmd_id, fields):
    """Block lines for one entry in the layout's style (`fields`: ordered pairs)."""
    d, k = layout.dash_col, layout.key_col
    if layout.kind == "map":
        return [" " * d + cmd_id + ":"] + yaml_entry_lines(
            fields, k, " " * k, layout.nested_indent)
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
    recorded as "" (present, content not needed for the relay decision). A key
    given twice counts with its last value, as PyYAML reads it.
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
        fields[name] = "" if raw[:1] in ("|", ">") else _yaml_unquote(raw)
    return fields


# ---- logging, locking, paths ----------------------------------------------------

class RelayLog:
    """The relay shell script's log: `[YYYY-MM-DDTHH:MM:SS] [bridge_relay/DIR] MESSAGE`.

    Each line goes to logs/bridge/<captain_id>_<YYYYMMDD>.log (one append) and
    to stderr, like the script's `tee -a`. Lines are redacted first, and control
    characters spelled out, so an argument's newline cannot forge a log line.
    """

    def __init__(self, root, captain_id, direction, config=None):
        self.root = root
        self.path = os.path.join(root, "logs", "bridge", "%s_%s.log" % (
            captain_id, time.strftime("%Y%m%d")))
        self.direction = direction
        self.redactor = get_redactor(config)

    def __call__(self, message):
        line = "[%s] [bridge_relay/%s] %s\n" % (
            time.strftime("%Y-%m-%dT%H:%M:%S"), self.direction,
            printable(self.redactor.redact(message)))
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        try:
            make_dirs(os.path.dirname(self.path), self.root)
            append_text(self.path, line)
        except (OSError, BridgeError) as exc:
            warn("cannot write relay log %s: %s" % (self.path, getattr(exc, "message", None)
                                                    or exc.strerror or exc))


def relay_lock(lock_path, config, log, what):
    """flock on `lock_path` like the shell script's `flock -w 5`: 3 attempts 1 s apart -> fd.
    Logs the script's lines for each timeout and, when every attempt failed, raises (exit 1,
    the script's code)."""
    relay = config["relay"]
    timeout, attempts, pause = relay["lock_timeout_sec"], relay["lock_attempts"], relay["lock_retry_sleep_sec"]
    for attempt in range(1, attempts + 1):
        try:
            fd = acquire_flock(lock_path, timeout=timeout)
        except OSError as exc:
            raise BridgeError("cannot lock %s: %s" % (lock_path, exc.strerror or exc))
        if fd is not None:
            return fd
        if attempt < attempts:
            log("Lock timeout (attempt %d/%d), retrying..." % (attempt, attempts))
            time.sleep(pause)
    log("ERROR: Failed to acquire lock after %d attempts" % attempts)
    raise BridgeError("could not lock %s (%s) after %d attempts of %gs; another process "
                      "holds it" % (lock_path, what, attempts, timeout), EXIT_FAILED)


def relay_queue_path(root, session, config):
    """clusters/<session>/queue/<file> when that directory exists, else queue/<file>.
    A symlink on the way (`queue`, `clusters/<session>`...) is an error naming it: the
    queue, its lock and its temporary file are never read or written through one."""
    name = config["relay"]["queue_file"]
    clustered = os.path.join(root, "clusters", session, "queue")
    if os.path.isdir(clustered):
        return os.path.join(make_dirs(clustered, root, create=False), name), True
    plain = os.path.join(root, "queue")
    if not os.path.isdir(plain):
        raise BridgeError("no queue directory: neither %s nor %s exists (run from the "
                          "repository root or pass --root)" % (clustered, plain))
    return os.path.join(make_dirs(plain, root, create=False), name), False


def _relay_read(path):
    """(raw bytes, bom, text) of a queue file, refusing what a splice cannot keep intact; a
    missing file reads as `commands: []`. A symlink (never followed, so never written through)
    or a FIFO is an error naming it."""
    raw = read_input(path, "queue file", missing=None)
    if raw is None:
        return None, "", ""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BridgeError("%s line %d: not valid UTF-8 (byte offset %d); the file was not "
                          "changed" % (path, raw.count(b"\n", 0, exc.start) + 1, exc.start),
                          EXIT_FAILED)
    bom = "\ufeff" if text.startswith("\ufeff") else ""
    text = text[len(bom):]
    cr = text.find("\r")
    if cr >= 0:
        _refuse(path, text, cr, "carriage return (CRLF line endings are not supported; "
                                "convert the file to LF)")
    return raw, bom, text


# Checking the whole file costs time in proportion to the queue (~0.1 s of CPU for 5 MB).
# A file whose bytes are those relay wrote last time needs no second check: that text
# passed it before the entry was spliced in, and an entry relay writes keeps a file in the
# subset (the tests hold both). So after each write the SHA-256 of the bytes is kept in the
# lock file, which is only ever a flock target (`flock(1)` users that truncate it just cause
# a full check), written and compared under the lock. An agent that can write the repository
# can forge the record, writing a broken queue and its digest; that is acceptable: the
# check is there so that a queue damaged by an edit (an unclosed quote, a bad indent) is not
# appended to and announced as good, and any edit changes the digest. A queue broken on
# purpose can as well be broken right after the append; the check never stopped that.

def _relay_digest(raw):
    import hashlib
    return b"sha256 of the bytes relay wrote last: " + hashlib.sha256(raw).hexdigest().encode()


def relay_wrote_last(lock_fd, raw):
    """True when `raw` is byte for byte what relay wrote last under this lock."""
    if raw is None:
        return False
    record = _relay_digest(raw)
    return os.pread(lock_fd, len(record) + 1, 0) == record


def relay_record_write(lock_fd, raw):
    """Keep the digest of the bytes just written in the lock file (see above). A record
    that cannot be written is no error: the next append checks the whole file. A lock
    file with another name (a hard link planted in its place, perhaps to a file outside
    the repository) is only ever locked, never written."""
    try:
        if os.fstat(lock_fd).st_nlink != 1:
            return
        os.ftruncate(lock_fd, 0)
        os.pwrite(lock_fd, _relay_digest(raw), 0)
    except OSError:
        pass


def relay_append(path, keys, config, log, what, entry, say_errors=True):
    """Splice one entry into the queue file `path` (its list under one of `keys`) under the
    `<path>.lock` flock; `entry(layout)` gives its (id, fields). Returns the id. A file that
    cannot be read or written is a BridgeError (with `say_errors`, logged as an ERROR too)."""
    fd = relay_lock(path + ".lock", config, log, what)
    try:
        raw, bom, text = _relay_read(path)
        try:
            layout = relay_layout(path, text, keys, checked=relay_wrote_last(fd, raw))
            entry_id, fields = entry(layout)
            new = relay_splice(layout, raw, bom, relay_entry_text(layout, entry_id, fields))
            try:
                atomic_write(path, new)
            except OSError as exc:
                raise BridgeError("cannot write %s: %s" % (path, exc.strerror or exc), EXIT_FAILED)
        except BridgeError as exc:
            if say_errors:
                log("ERROR: " + exc.message)
            raise
        relay_record_write(fd, new)
    finally:
        release_flock(fd)
    return entry_id


# ---- down ---------------------------------------------------------------------

def relay_purpose(message):
    """The first sentence or line of the message (。！？ end a sentence, and
    . ! ? when followed by a space): the entry's `purpose`."""
    for line in message.split("\n"):
        line = line.strip()
        if line:
            m = re.search(r"[。！？]|[.!?](?=\s)", line)
            return line[:m.end()] if m else line
    return message.strip()


def relay_down(root, config, captain_id, session, message, project, priority="",
               criteria=""):
    """Append a new cmd to the queue; returns its id (the shell script's `down`)."""
    log = RelayLog(root, captain_id, "down", config)
    if not message.strip() or not project.strip():
        log("ERROR: down mode requires message_content and project")
        raise BridgeError("down requires a non-empty message and project")
    for value, what in ((message, "message"), (project, "project"), (criteria, "acceptance_criteria")):
        check_text(value, what)
    priority = priority or "medium"
    if priority not in RELAY_PRIORITIES:
        raise BridgeError("priority must be one of %s, got %r" % (", ".join(RELAY_PRIORITIES), priority))
    queue, clustered = relay_queue_path(root, session, config)

    def entry(layout):
        cmd_id = "cmd_%03d" % (relay_max_id(layout) + 1)
        return cmd_id, [
            ("id", cmd_id),
            ("timestamp", time.strftime("%Y-%m-%dT%H:%M:%S")),
            ("purpose", relay_purpose(message)),
            ("acceptance_criteria", [line.strip() for line in (criteria or "").split("\n")
                                     if line.strip()] or [RELAY_DEFAULT_CRITERIA]),
            ("command", message),
            ("project", project),
            ("priority", priority),
            ("status", "pending"),
            ("source", "agent_teams"),
        ]
    cmd_id = relay_append(queue, ("commands", "queue"), config, log, "queue", entry)
    relay_nudge(root, config, log, captain_id, session if clustered else "", cmd_id, session)
    log("DOWN SUCCESS: %s created (project=%s, priority=%s)" % (cmd_id, project, priority))
    return cmd_id


# ---- the nudge ------------------------------------------------------------------

def relay_nudge_target(root, config, log, captain_id, session):
    """relay.nudge_target, or with "@cluster_captain" (the newer script) the
    `captain:` of clusters/<session>/config.yaml, falling back to captain_id."""
    target = config["relay"]["nudge_target"]
    if target != "@cluster_captain":
        return target
    cfg = os.path.join(root, "clusters", session, "config.yaml")
    try:
        m = re.search(r"^captain:[ \t]*(['\"]?)([A-Za-z0-9._-]+)\1[ \t]*(?:#.*)?$",
                      read_input(cfg, "cluster config").decode("utf-8"), re.M)
    except (BridgeError, UnicodeDecodeError):
        m = None
    if m is None:
        log("WARNING: captain not found in %s — falling back to '%s'" % (cfg, captain_id))
        return captain_id
    return m.group(2)


def relay_nudge(root, config, log, captain_id, cluster_id, cmd_id, session=""):
    """Wake the vice captain; a failure is a WARN line, never an error: the command is
    queued, and the vice captain's self-watch picks it up."""
    if not config["relay"]["nudge"]:
        return
    target = relay_nudge_target(root, config, log, captain_id, session)
    content = RELAY_NUDGE_TEXT.format(cmd_id=cmd_id)
    command = config["relay"]["nudge_command"]
    try:
        argv = split_command(command, "relay.nudge_command")
        if argv:
            env = dict(os.environ)
            if cluster_id:
                env["CLUSTER_ID"] = cluster_id
            result = run_command(argv + [target, content, "cmd_new", captain_id], cwd=root,
                                 env=env, timeout=config["relay"]["nudge_timeout_sec"])
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
    make_dirs(inbox_dir, root)
    path = os.path.join(inbox_dir, target + ".yaml")

    def entry(_layout):
        msg_id = "msg_%s_%s" % (time.strftime("%Y%m%d_%H%M%S"), random_hex(4))
        return msg_id, [("content", content), ("from", sender), ("id", msg_id),
                        ("read", YamlPlain("false")),
                        ("timestamp", time.strftime("%Y-%m-%dT%H:%M:%S")), ("type", msg_type)]
    msg_id = relay_append(path, ("messages",), config, log, "inbox", entry, say_errors=False)
    log("NUDGE: %s → %s (type=%s) %s" % (sender, target, msg_type, msg_id))


# ---- up -------------------------------------------------------------------------

def relay_up(root, config, captain_id, session, cmd_id, status, summary, force=False):
    """The report line for Agent Teams, or None when it is not to be relayed: the entry did
    not come from Agent Teams, is not finished or was reassigned, or redoes another (unless
    `force`)."""
    log = RelayLog(root, captain_id, "up", config)
    if not cmd_id.strip() or not status.strip() or not summary.strip():
        log("ERROR: up mode requires cmd_id, status, and summary")
        raise BridgeError("up requires a non-empty cmd_id, status and summary")
    for value, what in ((cmd_id, "cmd_id"), (status, "status"), (summary, "summary")):
        check_text(value, what)
    if status not in RELAY_STATUSES:
        raise BridgeError("status must be one of %s, got %r" % (", ".join(RELAY_STATUSES), status))
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
# 5. PROXY - stdio MCP supervisor with observability
# =============================================================================

# ---- 5a. supervisor and relay ----
# One thread and one poll() loop: client stdin, the Doctor's stdout and stderr, a wake-up pipe
# (signals, /control commands) and two non-blocking output buffers (client stdout, Doctor stdin).
# Each output has exactly one writer and only ever receives whole lines, so messages bridge.py
# writes itself (error replies, the replayed handshake) cannot interleave with relayed ones.
# Lines are forwarded as the bytes received; a parsed copy only feeds the bookkeeping.

PROXY_RESTART_TOOL = {"name": "bridge_restart_server",
                      "inputSchema": {"type": "object", "properties": {}},
                      "description": "Restart this MCP server (bridge.py proxy) to load its "
                                     "changed code; answers once the new server is ready, with "
                                     "the tools added, removed and changed."}
PROXY_ERROR_CODE = -32000             # the MCP SDKs' "connection closed": clients already know it
PROXY_HIGH_WATER = 4 << 20            # stop reading a source while its destination holds this much
PROXY_RATE_WINDOW = 5.0               # seconds the message rates in bridge:stats are taken over
PROXY_RELOAD_PACE = 10                # seconds between reloads for files that change after each one
class ProxyNumber:
    """A number as parsed from a relayed line, equal only to one of its own class: as a JSON-RPC
    id a ProxyFloat is never the same id as an integer (`1.0` is not `1`), nor a ProxyDigits the
    same as the string of its text."""
    __slots__ = ()

    def __eq__(self, other):
        return other.__class__ is self.__class__ and super().__eq__(other)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash((self.__class__, super().__hash__()))


class ProxyFloat(ProxyNumber, float):
    """A number written with a fraction or exponent."""
    __slots__ = ()


class ProxyDigits(ProxyNumber, str):
    """A number kept as its text: an integer longer than Python's digit limit (4300 digits on
    3.11), or one beyond a double's range (1e400, which float() makes infinity). Written back
    as the number (reply_error)."""
    __slots__ = ()


def proxy_wire(obj):
    """A JSON-RPC line bridge.py writes itself. ASCII escapes: a lone surrogate a peer sent as
    `\\ud800` (valid JSON, no valid UTF-8) goes back as the escape it came as, never an
    encoding error that would end the relay."""
    return json.dumps(obj, separators=(",", ":")).encode("ascii") + b"\n"


def proxy_float(text):
    """A number written with a fraction or exponent: a ProxyFloat, or as its text when a double
    cannot hold it (JSON has no infinity to write it back as)."""
    number = ProxyFloat(text)
    return number if abs(number) != float("inf") else ProxyDigits(text)


PROXY_IDS = (int, str, ProxyFloat, ProxyDigits)  # the JSON-RPC ids tracked (others: relayed as is)


def proxy_id_json(mid):
    """An id as JSON, written back as it came (a ProxyDigits number stays a number)."""
    return mid if mid.__class__ is ProxyDigits else json.dumps(mid)


def proxy_short(value, cap=200):
    """An id or method as an event shows it: whatever the other side chose, up to a 16 MiB
    line, so a long string is cut (the history holds 200 events and each goes to every
    dashboard)."""
    if isinstance(value, str) and len(value) > cap:
        return "%s...[%d chars]" % (value[:cap], len(value))
    return value


PROXY_LEVELS = {"debug": 0, "info": 1, "warn": 2, "error": 3}
# client requests whose successful answer sets up session state a restarted Doctor is given again
PROXY_STATEFUL = ("initialize", "logging/setLevel", "resources/subscribe", "resources/unsubscribe")
# MCP 2026-07-28 has no handshake: every request names its protocol version and client in _meta,
# under these keys (with the defaults bridge.py's own requests use before the client sent any)
PROXY_META = (("io.modelcontextprotocol/protocolVersion", "2026-07-28"),
              ("io.modelcontextprotocol/clientInfo",
               {"name": "bridge.py proxy", "version": __version__}),
              ("io.modelcontextprotocol/clientCapabilities", {}))
PROXY_SUB_ID = "io.modelcontextprotocol/subscriptionId"   # tags what a listen stream carries
PROXY_FINAL = (None, "kill", "shutdown")  # stop reasons no generation follows (None: not stopped)
PROXY_ACTIONS = ("doctor:restart", "doctor:kill", "bridge:pause", "bridge:resume",
                 "bridge:shutdown", "bridge:stats")
PROXY_REASONS = {
    "crashed": "MCP server exited before answering; the request was not retried",
    "hung": "MCP server stopped answering (health check unanswered) and was killed; the request "
            "was not retried",
    "restart": "MCP server restarted (doctor:restart) before answering",
    "reload": "MCP server reloaded (a watched file changed) and did not answer within "
              "proxy.close_grace_sec; the request was not retried",
    "graceful": "MCP server restarted on its own request before answering",
    "kill": "MCP server stopped by doctor:kill; send doctor:restart to start it",
    "shutdown": "bridge.py proxy is shutting down",
    "start_timeout": "restarted MCP server did not answer within proxy.start_timeout_sec and was "
                     "killed; the request was not retried",
    "held_too_long": "request held longer than proxy.pause_timeout_sec (paused or restarting)",
    "paused_buffer_full": "bridge is paused and its buffer (proxy.pause_buffer_messages or "
                          "proxy.pause_buffer_bytes) is full",
    "too_large": "request longer than proxy.max_line_bytes; it was not relayed",
    "answer_too_large": "answer longer than proxy.max_line_bytes; it was dropped",
    "stdout_closed": "MCP server closed its stdout, so it can answer nothing more, and was "
                     "stopped; the request was not retried",
    "stdin_closed": "MCP server closed its stdin, so it can take no request, and was stopped; the "
                    "request was not retried",
}


def proxy_decoder():
    """A `json.loads` for relayed lines, minus its per-call wrapper work (the relay's main cost
    under load). MCP stdio is UTF-8: a line is decoded strictly first, so UTF-16 JSON, a byte
    order mark or an encoded surrogate (all of which `json.loads(bytes)` accepts) is malformed.
    The text goes straight to the decoder's scanner, which raises the very errors `json.loads`
    would; the result is taken as is only when nothing but the final newline follows the value.
    Anything else goes the full decode way."""
    decoder, loads = json.JSONDecoder(parse_float=proxy_float), json.loads
    scan, decode = decoder.scan_once, decoder.decode

    def fast(line):
        text = line.decode("utf-8")
        if text[:2] != '{"':
            return decode(text)
        try:
            obj, end = scan(text, 0)
        except StopIteration:
            return decode(text)
        if end == len(text) - 1 and text[end] == "\n":
            return obj
        return decode(text)

    def parse(line):
        try:
            return fast(line)
        except ValueError as exc:
            # Valid JSON with an integer longer than Python's digit limit (4300 on 3.11) is still
            # valid JSON: keep such numbers (only those) as text instead of calling it malformed.
            if "integer string conversion" not in str(exc):
                raise
            return loads(line.decode("utf-8"), parse_float=proxy_float, parse_int=lambda digits:
                         int(digits) if len(digits) <= 4000 else ProxyDigits(digits))
    return parse


class ProxyLines:
    """Cuts a byte stream into complete lines (newline kept). A line longer than `cap` bytes is
    dropped and the stream resynchronises at the next newline; `dropped` keeps the first and last
    256 bytes of each dropped line, where proxy_dropped_id() looks for the id it carried."""

    def __init__(self, cap):
        self.cap, self.partial, self.skipping, self.dropped = cap, bytearray(), False, []
        self.head = self.tail = b""                # of the line being skipped

    def feed(self, data):
        lines, start, find, cap = [], 0, data.find, self.cap
        if self.skipping or self.partial:
            nl = find(b"\n")
            if nl < 0:
                if self.skipping:
                    self.tail = (self.tail + data[-256:])[-256:]
                else:
                    self.partial += data
                    if len(self.partial) > cap:
                        self.skip(self.partial)
                return lines
            if self.skipping:
                self.dropped.append((self.head, (self.tail + data[max(0, nl - 256):nl])[-256:]))
            else:
                self.partial += data[:nl + 1]
                if len(self.partial) > cap + 1:
                    self.dropped.append((bytes(self.partial[:256]), bytes(self.partial[-257:-1])))
                else:
                    lines.append(bytes(self.partial))
            self.partial, self.skipping, start = bytearray(), False, nl + 1
        nl = find(b"\n", start)
        while nl >= 0:
            if nl - start > cap:
                self.dropped.append((data[start:min(nl, start + 256)],
                                     data[max(start, nl - 256):nl]))
            else:
                lines.append(data[start:nl + 1])
            start = nl + 1
            nl = find(b"\n", start)
        if start < len(data):
            self.partial += data[start:]
            if len(self.partial) > cap:
                self.skip(self.partial)
        return lines

    def skip(self, part):
        self.skipping, self.partial = True, bytearray()
        self.head, self.tail = bytes(part[:256]), bytes(part[-256:])

    def finish(self):
        """The final line at EOF without a newline, newline-terminated so the peer sees it whole."""
        rest, self.partial = bytes(self.partial), bytearray()
        if self.skipping:
            self.dropped.append((self.head, self.tail))
            return []
        return [rest + b"\n"] if rest.strip() else []


def proxy_dropped_id(head, tail):
    """(id, kind) of a line too long to relay, from its first and last 256 bytes, so whoever
    waits on it can still be answered with an error instead of left to time out. kind is
    "request" or "answer", or None when the ends do not show which. Only top-level members
    count: at the start, those before the first object or array (a `method`, or `params`
    opening, makes a request; `result` or `error` an answer); at the end, an `id` followed by
    nothing but the closing brace. So an "id" nested in params or result is never taken.
    JSON-RPC peers write `id` early (the Python SDK: after "jsonrpc") or last (TypeScript)."""
    text = rb'"(?:[^"\\]|\\.)*"'
    member = re.compile(rb'\s*"((?:[^"\\]|\\.)*)"\s*:\s*(' + text + rb'|[-+.\w]+|[{\[])\s*,?')
    mid = kind = None
    opening = re.match(rb'\s*\{', head)
    pos = opening.end() if opening else len(head)
    while True:
        found = member.match(head, pos)
        if found is None:
            break
        key, value = found.group(1), found.group(2)
        if value in (b"{", b"["):
            kind = "request" if key == b"params" else \
                "answer" if key in (b"result", b"error") else kind
            break
        if key == b"method":
            kind = "request"
        elif key == b"id":
            mid = value
        pos = found.end()
    if mid is None:
        found = re.search(rb'[{,]\s*"id"\s*:\s*(-?\d+|' + text + rb')\s*\}\s*$', tail)
        mid = found.group(1) if found else None
    try:
        mid = json.loads(mid) if mid is not None else None
    except ValueError:
        mid = None
    return (mid if mid.__class__ in (int, str) else None), kind


def proxy_adopt_orphans():
    """Make bridge.py the Linux "child subreaper" of whatever the Doctor starts: a helper that
    left the Doctor's process group (setsid; Playwright starts browsers that way) is re-parented
    to bridge.py instead of PID 1 when its parent dies, so proxy_leftovers() still finds it.
    Elsewhere, or if the kernel refuses, only the process group can be reached."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        PR_SET_CHILD_SUBREAPER = 36
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def proxy_leftovers(pgid):
    """Live processes that must not outlive the Doctor: those in its process group `pgid` (if
    not None), and every descendant of bridge.py (orphans adopted through proxy_adopt_orphans).
    Zombies are not counted: an orphaned grandchild's zombie waits for PID 1, which in
    containers may never reap it. Without /proc (macOS), [pgid] while the group exists."""
    if pgid is None and not os.path.isdir("/proc/self"):
        return []
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    me, parent, live = os.getpid(), {}, []
    for pid in [int(name) for name in os.listdir("/proc") if name.isdigit()]:
        fields = _proc_stat(pid)                   # [] when it ended meanwhile
        if not fields:
            continue
        parent[pid] = int(fields[1])
        if fields[0] != "Z" and pid != me:
            live.append((pid, int(fields[2])))
    found = []
    for pid, group in live:
        up, hops = parent.get(pid), 0
        while up not in (None, 0, 1, me) and hops < 64:
            up, hops = parent.get(up), hops + 1
        if up == me or pgid is not None and group == pgid:
            found.append(pid)
    return found


def proxy_signal(pgid, pids, sig):
    """Signal the Doctor's process group (unless None) and each of `pids`."""
    targets = [(pgid, os.killpg)] if pgid is not None else []
    for target, kill in targets + [(pid, os.kill) for pid in pids]:
        try:
            kill(target, sig)
        except OSError:
            pass


class ProxyChild:
    """One generation of the Doctor: no shell, its own session and process group."""

    def __init__(self, argv, cwd, env, gen, cap):
        import subprocess
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, bufsize=0,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self.gen, self.pid, self.started = gen, self.proc.pid, time.monotonic()
        self.files = {f.fileno(): f for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr)}
        self.fin, self.fout, self.ferr = self.files    # the dict keeps their order
        os.set_blocking(self.fin, False)
        self.lines, self.errbuf = ProxyLines(cap), bytearray()
        self.ready = False
        self.replay_id = None           # id of the replayed initialize (or probe) until answered
        self.probes = ()                # ids of the sign-of-life requests in flight (Proxy.probe)
        self.owned = {}                 # id -> method of bridge.py's own requests not yet answered
        self.heard = self.started       # when stdout last gave anything (health check)
        self.eof_at = None              # when stdout or stdin closed (its exit should follow)
        self.ping_at = None             # when the health check in flight (probe()) was sent
        self.concurrent = False         # it answered a health check while busy: silence is stuck
        self.witness = None             # requests in progress when a ping was answered (answered())
        self.doubted = False            # a health check unanswered, not known to be concurrent
        self.stop_reason = self.term_at = self.kill_at = None
        self.exit = None                # {"code": n} or {"signal": "SIGKILL"} once reaped

    def close(self, name):
        fd = getattr(self, name)
        if fd is not None:
            setattr(self, name, None)
            self.files.pop(fd).close()

    def exited(self):
        """Reap the leader if it has exited. After a crash the rest of its group is killed first,
        while the zombie still pins the group id (so the signal cannot hit a recycled group)."""
        import signal
        if self.exit is not None:
            return True
        try:
            if hasattr(os, "waitid") and os.waitid(os.P_PID, self.pid,
                                                   os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return False
        except ChildProcessError:
            pass
        if self.stop_reason is None:
            signal_group(self.pid, signal.SIGKILL)
        code = self.proc.poll()
        if code is None:
            return False
        self.exit = {"signal": signal.Signals(-code).name} if code < 0 else {"code": code}
        return True


class Outbox(bytearray):
    """What is owed to one non-blocking pipe, in order. send() writes at once when nothing
    waits before it (the usual case) and buffers the rest; flush() writes what the pipe takes
    once poll() says it is writable. A closed pipe raises OSError and what it was owed is
    dropped."""

    def send(self, fd, data):
        if not self:
            try:
                sent = os.write(fd, data)
            except BlockingIOError:
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        self.extend(data)
        self.flush(fd)

    def flush(self, fd):
        try:
            while self:
                del self[:os.write(fd, self)]
        except BlockingIOError:
            pass
        except OSError:
            self.clear()
            raise


# writes, moves, creates, deletes
INOTIFY_EVENTS = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800


class ProxyWatch:
    """`proxy --watch`: watches files and folders from one thread, and calls `notify(files)`
    once a burst of saves has settled for `debounce` seconds. On Linux through inotify (ctypes;
    no cost while nothing changes); elsewhere, or when inotify is refused (the per-user watch
    limit), by polling a snapshot of (mtime, size, inode) per file. A scan is cheap for a source
    tree, but a large one must not cost a core: the next scan waits 100 times the CPU time this one
    took (at least `interval`), so polling costs at most about 1% of one core whatever the tree's
    size. The debounce counts from the newest change's mtime when it is believable (not in the
    future, not older than the scan before), so a slow scan does not add its delay to it."""

    def __init__(self, paths, exclude, debounce, notify, interval=0.25, log=None):
        import fnmatch
        self.paths = [os.path.abspath(p) for p in paths]
        self.exclude, self.debounce, self.notify = tuple(exclude), debounce, notify
        self.interval = interval
        # the globs as one regex (excluded())
        self.exclude_re = re.compile("|".join(map(fnmatch.translate, self.exclude)) or "(?!)")
        self.log = log or (lambda text: None)
        self.stopping = None                       # a threading.Event once started
        self.watching = None                       # one set once changes are seen (start())
        self.how = None                            # then "inotify" or "polling"

    def excluded(self, name):
        """True for a name one of the exclude globs matches (one regex: the scan calls this for
        every entry of a 10,000-file tree, on a thread that shares the GIL with the relay)."""
        return self.exclude_re.match(name) is not None

    def snapshot(self):
        """{path: (mtime_ns, size, inode)} of every watched file not excluded; a folder is
        walked without following symlinks, its excluded entries (`.git`, ...) not entered."""
        files, todo = {}, list(self.paths)
        while todo:
            path = todo.pop()
            try:
                if not os.path.isdir(path) or os.path.islink(path):
                    st = os.stat(path)
                    files[path] = (st.st_mtime_ns, st.st_size, st.st_ino)
                    continue
                with os.scandir(path) as entries:
                    for entry in entries:
                        if self.excluded(entry.name):
                            continue
                        if entry.is_dir(follow_symlinks=False):
                            todo.append(entry.path)
                        else:
                            st = entry.stat(follow_symlinks=False)
                            files[entry.path] = (st.st_mtime_ns, st.st_size, st.st_ino)
            except OSError:                        # gone (deleted mid-scan), unreadable: absent
                continue
        return files

    def start(self):
        import threading
        self.stopping, self.watching = threading.Event(), threading.Event()
        threading.Thread(target=self.run, name="bridge-watch", daemon=True).start()

    def stop(self):
        if self.stopping is not None:
            self.stopping.set()

    def inotify(self):
        """An inotify descriptor watching every folder (and watched file) not excluded, with
        {watch descriptor: path}; None where inotify is missing or refuses (then: polling)."""
        if not sys.platform.startswith("linux"):
            return None, None
        import ctypes
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(0o2004000)     # IN_NONBLOCK | IN_CLOEXEC
        except (OSError, AttributeError):
            return None, None
        if fd < 0:
            return None, None
        wds = {}

        def add(path):
            wd = libc.inotify_add_watch(fd, os.fsencode(path), INOTIFY_EVENTS)
            if wd < 0:
                raise OSError(ctypes.get_errno(), "inotify_add_watch %s: %s" % (
                    path, os.strerror(ctypes.get_errno())))
            wds[wd] = path
        self.add_watch = add
        try:
            for path in self.paths:
                self.watch_tree(path)
        except OSError as exc:
            os.close(fd)
            self.log("watch: polling (%s; see /proc/sys/fs/inotify/max_user_watches)" % (
                exc.strerror))
            return None, None
        return fd, wds

    def watch_tree(self, path):
        """Add inotify watches for `path` and the folders under it not excluded."""
        if not os.path.isdir(path) or os.path.islink(path):
            return self.add_watch(path)
        for top, dirs, _files in os.walk(path):
            dirs[:] = [d for d in dirs
                       if not self.excluded(d) and not os.path.islink(os.path.join(top, d))]
            self.add_watch(top)

    def run(self):
        fd, wds = self.inotify()
        if fd is None:
            return self.run_polling()
        import select
        import struct
        self.how = "inotify"
        self.watching.set()
        self.log("watch: inotify, %d folders and files" % len(wds))
        changed, fire_at, gone = set(), None, None
        try:
            while not self.stopping.is_set():
                wait = 1.0 if fire_at is None else max(0.0, min(1.0, fire_at - time.time()))
                if select.select([fd], [], [], wait)[0]:
                    try:
                        data = os.read(fd, 1 << 16)
                    except BlockingIOError:
                        data = b""
                    pos = 0
                    while pos + 16 <= len(data):
                        wd, mask, _cookie, size = struct.unpack_from("iIII", data, pos)
                        name = data[pos + 16:pos + 16 + size].rstrip(b"\0")
                        pos += 16 + size
                        if mask & 0x4000:          # the queue overflowed: something changed
                            changed.update(self.paths)
                        elif wd in wds and not self.excluded(os.fsdecode(name)):
                            path = os.path.join(wds[wd], os.fsdecode(name)) if name else wds[wd]
                            if mask & 0x8000:      # the watch is gone: its folder deleted, or
                                del wds[wd]        # its file replaced by a rename (a save)
                                if path not in self.paths:
                                    continue
                                if not os.path.exists(path):   # a watched path removed (rm -rf):
                                    gone = path    # no watch is left for its return: polling
                                    changed.add(path)
                                    break
                            if mask & 0x8000 or mask & 0x40000000 and mask & (0x100 | 0x80):
                                try:               # watched again, or a folder created or moved in
                                    self.watch_tree(path)
                                except OSError as exc:
                                    self.log("watch: %s not watched: %s" % (path, exc.strerror))
                            changed.add(path)
                        else:
                            continue
                        fire_at = time.time() + self.debounce
                if gone:
                    self.log("watch: %s was removed: polling from now on" % gone)
                    return self.run_polling(changed, time.time() + self.debounce)
                if fire_at is not None and time.time() >= fire_at:
                    self.notify(sorted(changed))
                    changed, fire_at = set(), None
        finally:
            os.close(fd)

    def run_polling(self, changed=(), fire_at=None):
        """Poll (see the class); `changed` and `fire_at`: a change inotify saw before it gave up."""
        before, changed, last_scan = self.snapshot(), set(changed), time.time()
        self.how = "polling"
        self.watching.set()
        self.log("watch: polling %d files" % len(before))
        wait = self.interval
        while not self.stopping.wait(
                wait if fire_at is None else max(0.0, min(wait, fire_at - time.time()))):
            start, cpu = time.time(), time.thread_time()
            now = self.snapshot()
            if now != before:
                new = {p for p in set(now) | set(before) if now.get(p) != before.get(p)}
                changed |= new
                newest = max([now[p][0] / 1e9 for p in new if p in now] or [start])
                saved = newest if last_scan - 1.0 <= newest <= start else start
                fire_at = max(fire_at or 0.0, saved + self.debounce)
                before = now
            del now                                # no second 10,000-entry dict while waiting
            # the next scan waits for this one's CPU time, not for a busy machine's delays
            last_scan, wait = start, max(self.interval, 100 * (time.thread_time() - cpu))
            if fire_at is not None and time.time() >= fire_at:
                self.notify(sorted(changed))
                changed, fire_at = set(), None


class Proxy:
    """Supervises the Doctor (the real MCP server) and relays stdio both ways. The README
    section "proxy" describes the rules. Everything runs on one thread, the relay loop in
    run(), except control(), which the observability server calls from its own.

    Methods for the caller:
      run()                    relay until shutdown; returns the exit code
      control(action, params)  a /control command from another thread; waits for the outcome
      stats()                  the figures a bridge:stats event carries

    Methods that may be overridden (each one decision, called from the relay loop):
      client_lines(lines)      client -> Doctor: forward, hold or answer each line
      child_lines(lines)       Doctor -> client: forward or swallow each line
      special(msg)             the Doctor's non-JSON-RPC lines (ready, health, shutdown)
      check_health(now)        when a Doctor that owes answers counts as stuck
      crashed(how, gen)        restart after a cooldown, or give up (doctor:fatal)
      reply_error(mid, ...)    the error answer for a request the Doctor will never answer
      start_observability()    start the WebSocket server, or not

    State is set in __init__, one attribute per line, grouped: configuration, the Doctor, the
    client's session (replayed to a restarted Doctor), requests in flight, the flow of bytes,
    control and shutdown, observability.
    """

    def __init__(self, argv, cfg, cwd=None, env=None):
        import collections
        lc, px, doc = cfg["lifecycle"], cfg["proxy"], cfg["doctor"]
        # -- configuration, read once --
        self.argv = argv                                # the Doctor's command line
        self.cfg = cfg                                  # the merged config (observability)
        self.cwd = cwd                                  # the Doctor's working directory
        self.env = env                                  # the Doctor's environment
        self.max_restarts = lc["maxRestarts"]           # crashes within `window` before giving up
        self.window = lc["restartWindow"]               # seconds over which crashes count
        self.cooldown = lc["cooldown"] / 1000.0         # seconds from a crash to the next start
        self.cap = px["max_line_bytes"]                 # a longer line is dropped
        self.hold_max = px["pause_buffer_messages"]     # held client messages at most
        self.hold_bytes = px["pause_buffer_bytes"]      # held bytes at most
        self.hold_sec = px["pause_timeout_sec"]         # a request held longer gets an error
        self.start_timeout = px["start_timeout_sec"]    # a restarted Doctor silent longer is stuck
        self.close_grace = px["close_grace_sec"]        # stopping: stdin closed, TERM after this
        self.kill_after = px["kill_after_sec"]          # and KILL this long after TERM
        self.stats_every = px["stats_interval_sec"]     # seconds between bridge:stats events
        self.params_max = px["event_params_max"]        # characters of params in an mcp:request
        self.events_max = px["events_per_sec_max"]      # mcp:* events published a second at most
        self.health_sec = px["health_check_sec"]        # silence while owing answers before a ping
        self.health_timeout = px["health_timeout_sec"]  # an unanswered ping is a hang after this
        self.watch = ProxyWatch(doc["watch"], doc["watch_exclude"],     # `--watch`, if any
                                doc["watch_debounce_ms"] / 1000.0, self.changed,
                                log=lambda text: self.log("info", text)) if doc["watch"] else None
        self.verbosity = PROXY_LEVELS[px["log_level"]]  # least level logged
        self.redactor = get_redactor(cfg, env=env)      # the Doctor's doctor.env secrets too
        # -- the Doctor --
        self.child = None                               # the current ProxyChild
        self.gen = 0                                    # its generation, 1 for the first
        self.spawn_at = 0.0                             # when the next generation may start
        self.next_check = 0.0                           # when to look for its exit and health
        self.crashes = collections.deque()              # when recent crashes were (within window)
        self.tail = collections.deque(maxlen=20)        # its last stderr lines, for doctor:crashed
        self.own_n = 0                                  # numbers bridge.py's own request ids
        self.own_tag = random_hex(8)                    # in them: no client reuses one by chance
        self.stopped = False                            # doctor:kill: down until doctor:restart
        self.reload = None                              # the reload in flight: {files, gen, ...}
        self.reload_next = None                         # files changed during it: the next reload
        self.reload_last = ([], 0.0, 0)                 # files, when it ended, times in a row
        self.reload_later = None                        # (files, when): a paced reload
        self.tools = None                               # {name: input-schema hash}, last seen
        self.restart_tool = doc["restart_tool"]         # offer and serve bridge_restart_server
        self.remember = PROXY_STATEFUL                  # requests whose answers tried() reads
        if doc["watch"] or self.restart_tool:
            self.remember += ("tools/list",)            # the tool list before a reload
        # -- the client's session, replayed to a restarted Doctor --
        self.init_params = None                         # the client's initialize params
        self.meta = None                                # else: its last versioned request's _meta
        self.init_caps = None                           # the capabilities the Doctor answered
        self.proto = None                               # the protocol version the Doctor chose
        self.level = None                               # the last logging/setLevel params
        self.subs = {}                                  # uri -> resources/subscribe params
        self.listens = {}                               # id -> [line, ack, generation] per listen
        self.tries = {}                                 # id -> (method, params), stateful requests
        # -- requests in flight --
        self.pending = {}                               # id -> (method, sent at): the Doctor owes
        self.srv_pending = set()                        # ids of the Doctor's requests: client owes
        self.dead_srv = collections.deque(maxlen=1000)  # the same for Doctors that have died
        # -- the flow of bytes --
        self.parse = proxy_decoder()                    # one line -> JSON
        self.stdin_lines = ProxyLines(self.cap)         # the client's bytes, split into lines
        self.to_child = Outbox()                        # owed to the Doctor's stdin
        self.to_client = Outbox()                       # owed to our stdout
        self.held = collections.deque()                 # (line, reqs, method, since) not sent yet
        self.held_bytes = 0                             # their size
        self.paused = False                             # bridge:pause: client messages are held
        self.stdin_eof = False                          # the client closed our stdin
        self.client_gone = False                        # our stdout is closed: output is dropped
        # -- control and shutdown --
        self.ctl = collections.deque()                  # (action, params, done) for the loop
        self.wake_r = self.wake_w = None                # self-pipe that wakes the loop (run)
        self.reaping = False                            # SIGCHLD came: look for exits now
        self.adopting = False                           # a subreaper: orphans are ours to reap
        self.shutting = None                            # the reason, once a shutdown began
        self.closed = False                             # run() has ended: control() answers at once
        self.exit_code = 0                              # what run() returns
        # -- observability --
        self.obs = None                                 # the ObservabilityServer, once started
        self.token_file = None                          # where the drawn dashboard token went
        self.events_left = 0                            # mcp:* events still allowed this second
        self.events_reset = 0.0                         # when that allowance starts again
        self.started = time.monotonic()                      # for uptime
        # (when, messagesIn, messagesOut) each second
        self.samples = collections.deque([(self.started, 0, 0)])
        self.st = dict(messagesIn=0, messagesOut=0, bytesIn=0, bytesOut=0, doctorRestarts=0,
                       dropped=0, eventsSkipped=0)      # counters published in bridge:stats

    # ---- logging, events, stats ----
    def log(self, level, text):
        """One line on bridge.py's stderr; never blocks the relay (dropped if stderr is full)."""
        if PROXY_LEVELS[level] >= self.verbosity:
            text = printable(self.redactor.redact("bridge proxy: %s: %s" % (level, text))) + "\n"
            self.write_stderr(text.encode("utf-8", "replace"))

    def write_stderr(self, data):
        """One line to stderr, never blocking: dropped when stderr is not writable. A line over
        4000 bytes is cut on a character boundary and still ends with a newline."""
        import select
        if len(data) > 4000:
            cut = b"...[%d bytes cut]\n" % (len(data) - 4000)
            data = data[:4000].decode("utf-8", "ignore").encode("utf-8") + cut
        try:
            if select.select([], [2], [], 0)[1]:
                os.write(2, data)          # <= PIPE_BUF after a writable poll: cannot block
        except (OSError, ValueError):
            pass

    def emit(self, kind, data):
        """A lifecycle event: logged on stderr and published, redacted, to /events."""
        data = self.redactor.redact_obj(data)
        bad = kind in ("doctor:crashed", "doctor:fatal", "doctor:hung", "bridge:dropped")
        self.log("error" if bad else "info", "%s %s" % (kind, json_compact(data)))
        if self.obs is not None:
            self.obs.publish(kind, data)

    def stats(self):
        child, now = self.child, time.monotonic()
        alive = child is not None and child.exit is None
        # Rates over a fixed window, from the counters a second-by-second sample saw at its start:
        # the same figure whenever stats are asked for (a control command, a new generation).
        t0, in0, out0 = self.samples[0]
        span = max(now - t0, 1e-3)
        return dict(self.st, uptime=round(now - self.started, 3), generation=self.gen,
                    messagesInPerSec=round((self.st["messagesIn"] - in0) / span, 1),
                    messagesOutPerSec=round((self.st["messagesOut"] - out0) / span, 1),
                    rateWindowSec=round(span, 3),
                    doctorUptime=round(now - child.started, 3) if alive else 0,
                    dashboardClients=self.obs.client_count if self.obs is not None else 0,
                    state=self.state(), paused=self.paused, pending=len(self.pending),
                    held=len(self.held), subscriptions=len(self.listens),
                    crashesInWindow=len(self.crashes))

    def sample_counts(self, now):
        """Once a second: the counters now, keeping the newest sample at least PROXY_RATE_WINDOW
        old as the start of the window."""
        samples = self.samples
        samples.append((now, self.st["messagesIn"], self.st["messagesOut"]))
        while len(samples) > 1 and samples[1][0] <= now - PROXY_RATE_WINDOW:
            samples.popleft()

    def publish_stats(self):
        """bridge:stats every stats_interval_sec, and at once when the state changes (a command,
        a new generation, ready), so a dashboard never shows a stale state for 5 s."""
        if self.obs is not None:
            self.obs.publish("bridge:stats", self.stats())

    def state(self):
        child = self.child
        if self.shutting or self.stopped:
            return "stopping" if self.shutting else "killed"
        if child is None or child.exit is not None or child.stop_reason:
            return "waiting" if self.spawn_at == float("inf") else "restarting"
        return "ready" if child.ready else "starting"

    def sample(self):
        """At most events_per_sec_max mcp:* events a second: under load a dashboard cannot show
        more, and building them (redaction, fan-out) would cost more than the relay itself."""
        now = time.monotonic()
        if now >= self.events_reset:
            self.events_reset, self.events_left = now + 1.0, self.events_max
        self.events_left -= 1
        if self.events_left >= 0:
            return True
        self.st["eventsSkipped"] += 1
        return False

    def preview(self, msg):
        """Params for mcp:request events: redacted first (a truncated secret could slip past the
        patterns), then truncated."""
        params = msg.get("params")
        if params is None:
            return None
        text = json_compact(params)
        if len(text) > 65536:
            return "[%d bytes]" % len(text)
        text = self.redactor.redact(text)
        return text if len(text) <= self.params_max else text[:self.params_max] + "...[truncated]"

    # ---- control: called from the observability thread, carried out by the relay loop ----
    def control(self, action, params=None):
        """Hand a /control command to the relay loop and wait for what it did, so the ack
        reports the outcome ("restarting generation 3", "already paused", "shutting down")."""
        import threading
        if action not in PROXY_ACTIONS:
            return {"ok": False, "error": "unknown action"}
        if self.closed:
            return {"ok": False, "error": "bridge.py has stopped"}
        done = threading.Event()
        self.ctl.append((action, params, done))
        self.wake()
        if not done.wait(5.0):
            return {"ok": False, "error": "the relay loop did not carry it out within 5 s"}
        return done.outcome

    def wake(self):
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass

    def on_signal(self, signum, frame):
        import signal
        self.ctl.append(("signal", signal.Signals(signum).name, None))
        self.wake()

    def on_child(self, *_):
        self.reaping = True
        self.wake()

    def reap_adopted(self):
        """Reap exited orphans adopted as subreaper (proxy_adopt_orphans), never the live Doctor:
        its Popen reaps it. True while bridge.py still has a child."""
        if not self.adopting:
            return False
        child = self.child
        keep = child.pid if child is not None and child.exit is None else None
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return False
            if info is None or info.si_pid == keep:
                return True
            try:
                os.waitpid(info.si_pid, 0)
            except ChildProcessError:
                pass

    def run_control(self, action, params, done):
        """Carry out a control command (or a signal) in the relay loop; report the outcome to
        the waiting control() and publish fresh stats so dashboards show the new state at once."""
        if action == "signal":
            return self.shutdown(params)
        if action == "reload":
            return self.start_reload(params)
        self.log("info", "control %s" % action)
        outcome = self.command(action)
        if "result" in outcome:
            outcome["result"].setdefault("state", self.state())
        self.publish_stats()
        if done is not None:
            done.outcome = outcome
            done.set()

    def command(self, action):
        child, gen = self.child, self.gen
        if action == "bridge:stats":
            return {"ok": True, "result": self.stats()}
        if self.shutting:
            return {"ok": False, "error": "bridge.py is shutting down (%s)" % self.shutting}
        if action == "bridge:shutdown":
            self.shutdown("bridge:shutdown")
            return {"ok": True, "result": {}}
        if action in ("bridge:pause", "bridge:resume"):
            pause = action == "bridge:pause"
            changed, self.paused = self.paused != pause, pause
            held = len(self.held)
            self.flush_held()
            return {"ok": True, "result": {"paused": self.paused, "changed": changed, "held": held}}
        if action == "doctor:kill":
            if self.stopped:
                return {"ok": True, "result": {"changed": False}}
            self.stopped = True
            self.stop_child("kill", now=True)
            self.fail_held("kill")
            return {"ok": True, "result": {"changed": True, "generation": gen}}
        self.stopped = False                       # doctor:restart
        if child is not None and child.exit is None and not child.stop_reason:
            self.stop_child("restart", now=True)
            return {"ok": True, "result": {"restarting": gen, "generation": gen + 1}}
        self.spawn_at = 0.0                        # killed, or in a crash's cooldown: start now
        return {"ok": True, "result": {"starting": True, "generation": gen + 1}}

    # ---- the Doctor's life ----
    def spawn(self):
        import shlex
        self.gen += 1
        self.tail.clear()                          # a crash event shows its own generation's stderr
        # redacted as one line, so that a flag meets its value (`--password x`)
        self.emit("doctor:starting", {"generation": self.gen, "command": self.redactor.redact(
            " ".join(shlex.quote(arg) for arg in self.argv))})
        try:
            child = self.child = ProxyChild(self.argv, self.cwd, self.env, self.gen, self.cap)
        except (OSError, ValueError) as exc:
            self.child = None
            return self.crashed({"error": "cannot start %s: %s" % (self.argv[0], exc)}, self.gen)
        self.st["doctorRestarts"] += self.gen > 1
        self.publish_stats()
        if self.init_params is not None:           # the client had initialized: replay it
            child.replay_id = self.own("initialize", self.init_params)
        elif self.gen > 1:                         # no handshake to replay: ask for a sign of life
            child.replay_id = self.probe()
        else:
            self.flush_held()

    def probe(self):
        """Ask the Doctor for a sign of life (any answer, even an error, proves it reads and
        answers); returns the first id. `ping` where the session negotiated a protocol before
        2026-07-28, `server/discover` (the one request every 2026-07-28 server must answer,
        which removed ping) where it negotiated a later one or the client named one in _meta;
        where neither says the era, both: some older servers never answer a method they do not
        know, and ping is the one they must answer, even before initialize."""
        if isinstance(self.proto, str) and self.proto < "2026-07-28":
            methods = ["ping"]
        elif self.proto is not None or self.meta is not None:
            methods = ["server/discover"]
        else:
            methods = ["server/discover", "ping"]
        # one asked before and never answered (an older server ignores server/discover) is
        # not asked again: its id stays owned, so a late answer is still swallowed
        left = {method: mid for mid, method in self.child.owned.items() if method in methods}
        self.child.probes = [left.get(method) or self.own(method) for method in methods]
        return self.child.probes[0]

    def own(self, method, params=None):
        """Send the Doctor a request of bridge.py's own, under an id of its own; the answer is
        swallowed (answered()). Returns the id. Without a handshake (MCP 2026-07-28) the request
        carries the protocol version and client in _meta, as the client's last request named
        them (PROXY_META's defaults before it sent any): a 2026-07-28 server refuses a request
        without them, and an older one ignores _meta."""
        self.own_n += 1
        mid = "bridge.py-%s-%s-%d" % (self.own_tag, method.rsplit("/", 1)[-1], self.own_n)
        self.child.owned[mid] = method
        msg = {"jsonrpc": "2.0", "id": mid, "method": method}
        if self.init_params is None:
            meta = self.meta or {}
            params = dict(params or {},
                          _meta={key: meta.get(key, default) for key, default in PROXY_META})
        if params is not None:
            msg["params"] = params
        self.send_child(proxy_wire(msg))
        return mid

    def check_health(self, now):
        """Kill a Doctor that is stuck, never one that is only slow (README "Hang detection").
        A restarted Doctor that has neither answered the replayed initialize nor said anything
        within start_timeout_sec is stuck starting. A ready one that owes an answer and has been
        silent for health_check_sec is sent a health check (probe()). No answer within
        health_timeout_sec is a hang only if it has answered a health check while busy before
        (`concurrent`): a server that handles one request at a time cannot, and is left alone."""
        child = self.child
        if not child.ready:
            if self.start_timeout and child.replay_id is not None and \
                    now - child.heard >= self.start_timeout:    # heard: started, or its last word
                self.hung("start_timeout", now)
        elif child.ping_at is None:
            if self.pending and self.health_sec and child.replay_id is None and \
                    now - max(child.heard, next(iter(self.pending.values()))[1]) >= self.health_sec:
                child.ping_at = now
                self.probe()
        elif not child.doubted and now - max(child.ping_at, child.heard) >= self.health_timeout:
            if child.concurrent:
                self.hung("hung", now)
            else:
                child.doubted = True
                self.log("warn", "the Doctor (generation %d) has not answered a health check while "
                         "busy for %.0f s; it may handle one request at a time, so it is not "
                         "treated as hung" % (child.gen, now - child.ping_at))

    def hung(self, reason, now):
        """Stuck (check_health): KILL the Doctor's group; its exit takes the crash path."""
        import signal
        child = self.child
        self.emit("doctor:hung", {"generation": child.gen, "pid": child.pid, "reason": reason,
                                  "pending": len(self.pending),
                                  "silentMs": round((now - child.heard) * 1000)})
        self.stop_child(reason, now=True)
        signal_group(child.pid, signal.SIGKILL)

    def mark_ready(self, how):
        child = self.child
        if not child.ready:
            child.ready = True
            start_ms = round((time.monotonic() - child.started) * 1000, 1)
            self.emit("doctor:ready", {"generation": child.gen, "pid": child.pid, "signal": how,
                                       "startMs": start_ms})
            self.publish_stats()                   # dashboards show the new state at once
            if self.reload is not None and child.gen > self.reload["gen"]:
                self.reload["tools"] = {}
                self.own("tools/list")             # what the reload changed: listed()

    def stop_child(self, reason, now=False):
        """Close the Doctor's stdin (once what we owe it is written), TERM its group after the
        grace, KILL after kill_after_sec. `now`: drop the unwritten input and TERM at once."""
        child = self.child
        if child is None or child.exit is not None or child.stop_reason:
            return
        child.stop_reason = reason
        if now:
            self.to_child.clear()
            child.close("fin")
        child.term_at = time.monotonic() + (0 if now else self.close_grace)
        child.kill_at = child.term_at + self.kill_after

    def child_exited(self):
        """The leader is reaped: relay its last words, answer what it owed, then restart, stop or
        give up."""
        import select
        import signal
        child = self.child
        for name in ("fout", "ferr"):              # its last words, already in the pipes
            for _ in range(64):
                fd = getattr(child, name)
                if fd is None or not select.select([fd], [], [], 0)[0]:
                    break
                self.read_child(name)
        self.to_child.clear()
        child.close("fin")
        reason = child.stop_reason or "crashed"
        for mid, (method, _t) in self.pending.items():
            self.reply_error(mid, reason, method, child.exit)
        self.pending.clear()
        self.dead_srv.extend(self.srv_pending)
        self.srv_pending.clear()
        if self.shutting or reason == "kill":      # no next generation to re-establish them on
            self.end_listens(reason, child.exit)
        if self.shutting:
            return
        pgid = None if self.adopting else child.pid  # adopted, every leftover is ours: no group id
        proxy_signal(pgid, proxy_leftovers(pgid), signal.SIGKILL)   # the old generation's leftovers
        self.reap_adopted()
        if reason == "kill":
            self.emit("doctor:stopped", {"generation": child.gen, "exit": child.exit})
        elif reason in ("restart", "reload", "graceful"):
            # not a crash, but a server asking again and again must not respawn in a tight loop
            self.spawn_at = time.monotonic() + self.cooldown if reason == "graceful" else 0.0
            self.emit("doctor:restarting", {"generation": child.gen, "reason": reason,
                                            "exit": child.exit})
        else:
            self.crashed(child.exit, child.gen, reason)

    def crashed(self, how, gen, reason="crashed"):
        now = time.monotonic()
        self.emit("doctor:crashed", {"generation": gen, "exit": how, "reason": reason,
                                     "stderrTail": list(self.tail)})
        reload = self.reload
        if reload is not None and reload.get("callers") and gen > reload["gen"]:
            # the new code died before listing its tools: a bridge_restart_server caller is told
            # now, not after the next save (--watch) or doctor:fatal
            self.reloaded({"error": "the restarted server %s: %s" % (reason, json_compact(how))})
        self.crashes.append(now)
        while self.crashes[0] <= now - self.window:
            self.crashes.popleft()
        if len(self.crashes) > self.max_restarts:
            self.emit("doctor:fatal", {"generation": gen, "crashesInWindow": len(self.crashes),
                                       "restartWindow": self.window,
                                       "maxRestarts": self.max_restarts,
                                       "waitingForChange": self.watch is not None})
            if self.watch is not None:             # a server being written: its fix is a save away
                self.spawn_at = float("inf")
                return self.log("warn", "not restarted until a watched file changes "
                                "(or doctor:restart)")
            self.exit_code = EXIT_FAILED
            return self.shutdown("doctor:fatal")
        self.spawn_at = now + self.cooldown
        self.emit("doctor:restarting", {"generation": gen, "reason": reason,
                                        "crashesInWindow": len(self.crashes),
                                        "cooldownMs": round(self.cooldown * 1000)})

    def shutdown(self, reason):
        if not self.shutting:
            self.shutting = reason
            self.log("info", "shutting down (%s)" % reason)
            self.stop_child("shutdown")
            self.fail_held("shutdown")

    # ---- reload (`--watch`) ----
    def changed(self, files):
        """From the watch thread: watched files changed (a burst, debounced); reload in the loop."""
        self.ctl.append(("reload", files, None))
        self.wake()

    def start_reload(self, files, pace=True):
        """Restart the Doctor as doctor:restart does (not a crash), but first give the requests
        it is working on close_grace_sec to finish, holding new client messages meanwhile. One
        reload at a time: a change during the grace joins it, a later one makes one more reload
        once this one is done (listed()). A Doctor down (crashed: a typo saved?) starts with the
        new code once the last crash's cooldown is over, even after doctor:fatal."""
        child, now = self.child, time.monotonic()
        if self.shutting or self.stopped:
            return self.log("info", "%s changed: not reloaded (%s)" % (
                files[0], "shutting down" if self.shutting else "stopped by doctor:kill"))
        down = child is None or child.exit is not None
        if down:
            cooled = self.crashes[-1] + self.cooldown if self.crashes else 0.0
            self.spawn_at = min(self.spawn_at, cooled)
        if self.reload is not None:
            if self.draining() or down:
                self.reload["files"] = sorted(set(self.reload["files"]) | set(files))
            elif self.listing():                   # a server that never answers stalls no reload
                self.reloaded({"error": "no answer to tools/list before the next change"})
                self.start_reload(files)
            else:
                self.reload_next = sorted(set(self.reload_next or ()) | set(files))
            return
        if pace and self.paced(files, now):
            return
        if self.reload_later is not None:          # a paced reload goes with this one
            files, self.reload_later = sorted(set(files) | set(self.reload_later[0])), None
        self.reload = {"files": files, "gen": self.gen, "at": now, "until": now + self.close_grace,
                       "before": self.tools, "tools": {}}
        self.emit("doctor:reloading", {"generation": self.gen, "file": files[0],
                                       "files": files[:20], "pending": len(self.pending),
                                       "graceSec": self.close_grace})

    def paced(self, files, now):
        """True when this reload waits (run() starts it): the same files changed right after each
        of the last two reloads ended, as a file the server writes as it starts (a log, a database)
        does, which would restart it for ever. Then reloads are PROXY_RELOAD_PACE apart: never a
        save lost (a person saving as often cannot be told apart), but no longer a tight loop."""
        last, ended, repeats = self.reload_last
        # "Right after": what the server (or the client's re-list it answers) writes reaches us
        # within the debounce of the reload's end; a person reading `ready` and saving takes longer.
        soon = files != [PROXY_RESTART_TOOL["name"]] and now - ended <= self.watch.debounce + 0.4
        repeats = repeats + 1 if soon and files == last else 0
        self.reload_last = (files, ended, repeats)
        if repeats < 2:
            return False
        waiting = self.reload_later[0] if self.reload_later else ()
        self.reload_later = (sorted(set(files) | set(waiting)), ended + PROXY_RELOAD_PACE)
        self.log("warn", "watch: %s changed right after each of the last restarts (does the server "
                 "write it? then add it to doctor.watch_exclude): this reload waits until %d s "
                 "after the last" % (", ".join(files[:5]), PROXY_RELOAD_PACE))
        return True

    def restart_call(self, mid):
        """A call of bridge_restart_server: a reload (as a changed file makes) answered once the
        new server has listed its tools (reloaded()); a reload in flight serves it too."""
        if self.shutting or self.stopped:
            return self.reply_error(mid, "shutdown" if self.shutting else "kill", "tools/call")
        if self.reload is None:
            self.start_reload([PROXY_RESTART_TOOL["name"]])
        self.reload["callers"] = self.reload.get("callers", []) + [mid]

    def offer_restart_tool(self, msg, line):
        """The one message bridge.py rewrites (doctor.restart_tool): the last page of a tools/list
        answer gets bridge_restart_server added. Anything unexpected is relayed as it came."""
        result = msg.get("result")
        if result.__class__ is not dict or result.get("tools").__class__ is not list or \
                result.get("nextCursor"):
            return line
        result["tools"] = result["tools"] + [PROXY_RESTART_TOOL]
        return proxy_wire(msg)

    def listing(self):
        """A reload waits only for the new Doctor's tools/list answer (listed())."""
        reload, child = self.reload, self.child
        return reload is not None and child is not None and child.gen > reload["gen"] and \
            child.ready and child.exit is None

    def draining(self):
        """A reload waits for the old Doctor to finish its requests (start_reload)."""
        reload, child = self.reload, self.child
        return reload is not None and child is not None and child.gen == reload["gen"] and \
            child.exit is None and not child.stop_reason

    def listed(self, msg):
        """The reloaded Doctor's tools/list answer (a page of it): on to the next page, or
        publish doctor:reloaded with what changed since the last list seen."""
        reload, result = self.reload, msg.get("result")
        if not self.listing():                     # late: that reload has ended
            return
        if result.__class__ is not dict or result.get("tools").__class__ is not list:
            return self.reloaded({"error": msg.get("error") or "tools/list answer without tools"})
        reload["tools"].update(proxy_tool_hashes(result["tools"]))
        cursor, pages = result.get("nextCursor"), reload.get("pages", 0) + 1
        if cursor.__class__ is not str or not cursor:
            self.reloaded({})
        elif cursor == reload.get("cursor") or pages >= 1000 or len(reload["tools"]) >= 100000:
            # a pagination bug
            self.reloaded({"error": "tools/list pages without end (%d pages, %d tools, "
                           "nextCursor %s)" % (pages, len(reload["tools"]),
                                               json_compact(proxy_short(cursor, 40)))})
        else:
            reload.update(cursor=cursor, pages=pages)
            self.own("tools/list", {"cursor": cursor})

    def reloaded(self, data):
        reload, self.reload = self.reload, None
        self.reload_last = (reload["files"], time.monotonic(), self.reload_last[2])
        before, after = reload["before"], reload["tools"]
        data.update(generation=self.gen, file=reload["files"][0], files=reload["files"][:20],
                    reloadMs=round((time.monotonic() - reload["at"]) * 1000, 1))
        if "error" not in data:                    # new code that started: its crashes count afresh
            self.crashes.clear()
            self.tools = after
            data["tools"] = len(after)
            if before is not None:                 # else nothing to compare with: no diff
                data.update(added=sorted(set(after) - set(before)),
                            removed=sorted(set(before) - set(after)),
                            changed=sorted(n for n in after
                                           if n in before and after[n] != before[n]))
        self.emit("doctor:reloaded", data)
        for mid in reload.get("callers", ()):
            if "error" in data:
                what = "tools/list failed: %s" % json_compact(data["error"])
            else:
                what = "tools added: %s; removed: %s; changed: %s" % tuple(
                    ", ".join(data.get(key) or ["none"]) for key in ("added", "removed", "changed"))
            text = "restarted: generation %d in %d ms; %s" % (self.gen, data["reloadMs"], what)
            self.send_client(proxy_wire({"jsonrpc": "2.0", "id": mid, "result": {
                "content": [{"type": "text", "text": text}], "isError": "error" in data}}))
        if self.reload_next:
            files, self.reload_next = self.reload_next, None
            self.start_reload(files)

    # ---- error replies for requests the Doctor will never answer ----
    def reply_error(self, mid, reason, method, exit=None, to_doctor=False):
        """Answer request `mid` with the error reply (README); to the client, or with to_doctor
        to a request of the Doctor's whose line could not be relayed."""
        data = {"bridge": "bridge.py proxy", "reason": reason, "method": method,
                "generation": self.gen, "retried": False}
        if exit:
            data["exit"] = exit
        error = {"code": PROXY_ERROR_CODE, "message": PROXY_REASONS[reason], "data": data}
        line = ('{"jsonrpc":"2.0","id":%s,"error":%s}\n' % (
            proxy_id_json(mid), json.dumps(error, separators=(",", ":")))).encode("ascii")
        if to_doctor:
            return self.send_child(line)
        self.tries.pop(mid, None)
        self.listens.pop(mid, None)
        self.send_client(line)
        if self.obs is not None:                   # never sampled: the events most worth keeping
            self.obs.publish("mcp:response", {"id": proxy_short(mid), "method": proxy_short(method),
                                              "size": len(line), "error": True,
                                              "from": "bridge", "reason": reason})

    def hold(self, line, reqs, method):
        """A client message the Doctor cannot take now: keep it for flush_held(), or refuse it
        (the Doctor killed, bridge.py stopping, or paused with a full buffer)."""
        if self.stopped or self.shutting:
            self.refuse(line, reqs, method, "kill" if self.stopped else "shutdown")
        elif self.paused and self.held_full():
            self.refuse(line, reqs, method, "paused_buffer_full")
        else:
            self.held.append((line, reqs, method, time.monotonic()))
            self.held_bytes += len(line)

    def held_full(self):
        return len(self.held) >= self.hold_max or self.held_bytes >= self.hold_bytes

    def refuse(self, line, reqs, method, reason):
        """Answer each request in a message that will not be sent with an error; an answer or a
        notification cannot be answered, so its loss is published and logged instead."""
        for rid, rmethod in reqs:
            self.reply_error(rid, reason, rmethod)
        if not reqs:
            self.st["dropped"] += 1
            self.emit("bridge:dropped", {"from": "client", "method": proxy_short(method),
                                         "size": len(line), "reason": PROXY_REASONS[reason]})

    def fail_held(self, reason, older_than=None):
        """Refuse held messages: all, or the requests held longer than `older_than` s (answers and
        notifications wait on: nobody waits on them, and the buffer bounds them)."""
        keep, now = [], time.monotonic()
        for item in self.held:
            line, reqs, method, t = item
            if older_than is not None and (now - t < older_than or not reqs):
                keep.append(item)
            else:
                self.refuse(line, reqs, method, reason)
        self.held.clear()
        self.held.extend(keep)
        self.held_bytes = sum(len(item[0]) for item in keep)
        if older_than is None:                     # no server will follow: nor end the reload
            self.end_listens(reason)
            for mid in self.reload.pop("callers", ()) if self.reload else ():
                self.reply_error(mid, reason, "tools/call")

    def end_listens(self, reason, exit=None):
        """Answer the client's open subscriptions/listen requests with the error reply when no
        generation will follow to re-establish them on (doctor:kill, shutdown), so the client
        knows its subscriptions ended; but those the live Doctor holds: its exit answers them."""
        child = self.child
        live = child.gen if child is not None and child.exit is None else None
        for mid in [mid for mid, listen in self.listens.items() if listen[2] != live]:
            self.reply_error(mid, reason, "subscriptions/listen", exit)

    # ---- relay ----
    def client_lines(self, lines):
        """Client -> Doctor: parse a copy for ids and methods; forward, hold or answer."""
        loads, pending, out, obs, child = self.parse, self.pending, [], self.obs, self.child
        watch = obs is not None and obs.client_count > 0
        gate = self.paused or self.stopped or self.shutting or child is None \
            or child.exit is not None or child.stop_reason or child.replay_id is not None \
            or self.reload is not None and self.draining()
        remember = self.remember
        now, st = time.monotonic(), self.st
        st["messagesIn"] += len(lines)
        st["bytesIn"] += sum(map(len, lines))
        for line in lines:
            try:
                msg = loads(line)
            except (ValueError, RecursionError) as exc:    # RecursionError: absurdly deep nesting
                self.malformed("client", line, exc)
                continue
            reqs, method, answer = (), None, False     # reqs: (id, method) of each request owed
            if msg.__class__ is dict:
                method, mid = msg.get("method"), msg.get("id")
                if mid.__class__ not in PROXY_IDS:
                    mid = None
                if method is None:                 # the client's answer to a Doctor request
                    if mid in self.srv_pending:
                        self.srv_pending.discard(mid)
                        answer = True
                    elif mid is not None and mid in self.dead_srv:
                        self.log("info", "dropped the answer to request %r of a dead Doctor" % (
                            mid,))
                        continue
                elif mid is not None:
                    if self.restart_tool and method == "tools/call" \
                            and msg.get("params").__class__ is dict \
                            and msg["params"].get("name") == PROXY_RESTART_TOOL["name"]:
                        self.restart_call(mid)     # bridge.py's own tool: never relayed
                        continue
                    reqs = ((mid, method),)
                    if method in remember:
                        self.tries[mid] = (method, msg.get("params"))
                    if self.init_params is None:   # no handshake: requests name their version
                        params = msg.get("params")
                        meta = params.get("_meta") if params.__class__ is dict else None
                        if meta.__class__ is dict and PROXY_META[0][0] in meta:
                            self.meta = meta
                elif method == "notifications/cancelled":
                    # A server need not answer a cancelled request (MCP): stop owing it, or a crash
                    # would answer it and the hang check would wait for it. A cancelled
                    # subscriptions/listen is not re-established after a restart.
                    params = msg.get("params")
                    if params.__class__ is dict and params.get("requestId").__class__ in PROXY_IDS:
                        pending.pop(params["requestId"], None)
                        self.listens.pop(params["requestId"], None)
                if watch and self.sample():
                    obs.publish("mcp:request", {"from": "client", "method": proxy_short(method),
                                                "id": proxy_short(mid), "size": len(line),
                                                "params": self.preview(msg)})
            elif msg.__class__ is list:            # a 2025-03-26 batch: its requests are owed
                reqs = tuple((m["id"], m["method"]) for m in msg if m.__class__ is dict and
                             m.get("method").__class__ is str and
                             m.get("id").__class__ in PROXY_IDS)
            if gate and (self.paused or not answer):   # an answer is for the Doctor that asked,
                self.hold(line, reqs, method)          # not the next one: a request of its in
                continue                               # progress (a reload's grace) may wait on it
            if reqs:
                if method.__class__ is str and method != "subscriptions/listen":
                    pending[mid] = (method, now)   # one request (owe(), its common case, inline)
                else:
                    self.owe(reqs, line, now)
            out.append(line)
        if out:
            self.send_child(b"".join(out))

    def owe(self, reqs, line, now):
        """Requests sent to the Doctor: each is owed an answer (pending), but a
        subscriptions/listen, which stays open until the Doctor ends it or the client cancels it
        (MCP 2026-07-28): kept with its line, to be re-established on a restarted Doctor
        (flush_held). Not one inside a batch: re-sending its line would re-send the batch's other
        requests."""
        for rid, rmethod in reqs:
            if rmethod == "subscriptions/listen" and line.lstrip()[:1] != b"[":
                self.listens[rid] = [line, None, self.gen]
            else:
                self.pending[rid] = (rmethod, now)

    def flush_held(self):
        """Once the Doctor can take them: re-send the client's open subscriptions/listen requests
        to a new generation (a restarted server holds no subscription, and the client sees no
        restart that would make it subscribe again), then forward held client messages, in order."""
        child = self.child
        if self.paused or self.stopped or child is None or child.exit is not None or \
                child.stop_reason or child.replay_id is not None or self.draining():
            return
        now = time.monotonic()
        out = [listen[0] for listen in self.listens.values() if listen[2] != child.gen]
        for line, reqs, _method, _t in self.held:
            self.owe(reqs, line, now)
            out.append(line)
        for listen in self.listens.values():
            listen[2] = child.gen
        self.held.clear()
        self.held_bytes = 0
        if out:
            self.send_child(b"".join(out))

    def child_lines(self, lines):
        """Doctor -> client: swallow its special lines (special()) and answers to bridge.py's
        requests."""
        loads, pending, out, child = self.parse, self.pending, [], self.child
        obs, tries = self.obs, self.tries
        watch = obs is not None and obs.client_count > 0
        for line in lines:
            try:
                msg = loads(line)
            except (ValueError, RecursionError) as exc:    # RecursionError: absurdly deep nesting
                self.malformed("doctor", line, exc)
                continue
            if msg.__class__ is dict:
                mid, method = msg.get("id"), msg.get("method")
                if "jsonrpc" not in msg and \
                        ("ready" in msg or "health" in msg or "shutdown" in msg):
                    self.special(msg)
                    continue
                if mid.__class__ not in PROXY_IDS:
                    mid = None
                if method is None and mid is not None:
                    if mid in child.owned:
                        self.answered(child.owned.pop(mid), msg)
                        continue
                    sent = pending.pop(mid, None)
                    if sent is None and mid in self.listens:   # the Doctor ended a listen
                        if child.stop_reason not in PROXY_FINAL:
                            continue               # restarted: the listen is re-sent
                        del self.listens[mid]
                    if child.witness and mid in child.witness:
                        child.concurrent, child.witness = True, None
                    if tries and mid in tries:
                        self.tried(tries.pop(mid), sent, msg)
                    if self.restart_tool and sent and sent[0] == "tools/list":
                        line = self.offer_restart_tool(msg, line)
                    if not child.ready:
                        self.mark_ready("first answer")
                    if watch and self.sample():
                        obs.publish("mcp:response", {
                            "id": proxy_short(mid), "method": sent and proxy_short(sent[0]),
                            "size": len(line), "error": "error" in msg,
                            "latencyMs": round((time.monotonic() - sent[1]) * 1000, 3) if sent
                            else None})
                elif method is not None:
                    if mid is not None:
                        self.srv_pending.add(mid)
                    elif self.listens and method in ("notifications/cancelled",
                                                     "notifications/subscriptions/acknowledged"):
                        line = self.listen_note(method, msg.get("params"), line)   # a listen's own
                    if watch and self.sample():
                        obs.publish("mcp:request", {"from": "doctor", "method": proxy_short(method),
                                                    "id": proxy_short(mid),
                                                    "size": len(line), "params": self.preview(msg)})
            elif msg.__class__ is list:
                for m in msg:
                    if m.__class__ is dict and m.get("id").__class__ in PROXY_IDS:
                        pending.pop(m["id"], None)
            out.append(line)
        if out:
            self.send_client(b"".join(out))

    def listen_note(self, method, params, line):
        """A Doctor notification while subscriptions/listen requests are open: what to relay
        in its place. The Doctor ends one with notifications/cancelled (swallowed, as its
        completion result, while bridge.py restarts it: the subscription goes on). It
        acknowledges each with the filter it honours (notifications/subscriptions/acknowledged,
        the subscription's id in _meta): the first time, relayed; when re-established on a
        restarted Doctor, swallowed if the filter is the one the client was told (relayed if
        not), and followed by the list-changed notifications the filter asks for, as a 2025
        client gets after a restart (replayed()): the new server's lists may differ."""
        meta = params.get("_meta") if params.__class__ is dict else None
        sid = params.get("requestId") if method == "notifications/cancelled" else \
            meta.get(PROXY_SUB_ID) if meta.__class__ is dict else None
        if sid.__class__ not in PROXY_IDS or sid not in self.listens:
            return line
        if method == "notifications/cancelled":
            if self.child.stop_reason not in PROXY_FINAL:
                return b""                         # restarted: the listen is re-sent
            del self.listens[sid]
            return line
        listen = self.listens[sid]
        told, listen[1] = listen[1], params.get("notifications")
        if told is None:
            return line
        honoured = listen[1] if listen[1].__class__ is dict else {}
        kinds = [kind for kind in ("tools", "prompts", "resources")
                 if honoured.get(kind + "ListChanged") is True]
        return (b"" if told == listen[1] else line) + self.list_notes(kinds, sid)

    def list_notes(self, kinds, sub=None):
        """The notifications that tell the client these lists (tools, prompts, resources) may
        have changed: on the stream of subscriptions/listen request `sub` (MCP 2026-07-28), else
        as 2025 clients get them, with no subscription."""
        tag = "" if sub is None else \
            ',"params":{"_meta":{"%s":%s}}' % (PROXY_SUB_ID, proxy_id_json(sub))
        note = '{"jsonrpc":"2.0","method":"notifications/%s/list_changed"%s}\n'
        return "".join(note % (kind, tag) for kind in kinds).encode("utf-8")

    def special(self, msg):
        """The Doctor's non-JSON-RPC lines ({"ready": true}, {"health": ...}, {"shutdown":
        "graceful"}): never forwarded (stdout carries MCP only)."""
        if msg.get("ready") is True:
            self.mark_ready("ready line")
        elif msg.get("shutdown") == "graceful":
            self.log("info", "the Doctor asked for a graceful restart")
            self.stop_child("graceful")
        else:
            self.log("debug", "Doctor health %s" % json_compact(msg))

    def tried(self, req, sent, msg):
        """A stateful client request was answered: remember what it set up on success."""
        method, params = req
        result = msg.get("result")
        if sent is None or sent[0] != method or result.__class__ is not dict:
            return                                 # failed, or a stale entry for a reused id
        if method == "initialize" and params.__class__ is dict:
            caps = result.get("capabilities")
            self.init_params, self.init_caps = params, caps if caps.__class__ is dict else {}
            self.proto = result.get("protocolVersion")
        elif method == "logging/setLevel":
            self.level = params
        elif method == "tools/list":               # a whole list (not a page): a reload's "before"
            if not (params.__class__ is dict and params.get("cursor")) \
                    and not result.get("nextCursor") and result.get("tools").__class__ is list:
                self.tools = proxy_tool_hashes(result["tools"])
        elif params.__class__ is dict and params.get("uri").__class__ is str:
            if method == "resources/subscribe":
                self.subs[params["uri"]] = params
            else:
                self.subs.pop(params["uri"], None)

    def answered(self, method, msg):
        """The Doctor answered a request of bridge.py's own: swallowed, never forwarded."""
        child = self.child
        if method in ("ping", "server/discover"):  # a probe: even an error answer proves life
            if msg.get("id") not in child.probes:
                return                             # the other of a probe already answered
            child.probes = ()
            if child.replay_id is not None:        # a restart's readiness probe
                child.replay_id = None
                self.mark_ready("answered " + method)
                return self.flush_held()
            # A health check. Concurrent only once a request sent before it is answered after
            # it: then it was answered while that request was in progress (not merely ignored).
            older = [mid for mid, (_m, t) in self.pending.items() if t < child.ping_at][:16]
            child.witness = set(older) if older and not child.concurrent else None
            child.ping_at, child.doubted = None, False
            return
        if method == "tools/list":
            return self.listed(msg)
        if "error" in msg:
            self.emit("bridge:replay_failed", {"generation": child.gen, "method": method,
                                               "error": msg["error"]})
        if method == "initialize":
            self.replayed(msg)

    def replayed(self, msg):
        """The restarted Doctor answered the replayed initialize: finish the handshake, give it
        the client's log level and subscriptions, release the held messages, and tell the client
        about lists the server said may change."""
        self.child.replay_id = None
        if "error" not in msg:
            result = msg.get("result")
            got = self.proto = result.get("protocolVersion") if result.__class__ is dict else None
            want = self.init_params.get("protocolVersion")
            if got != want:
                self.log("warn", "restarted server chose protocol %s, the client asked for %s" % (
                    got, want))
        self.send_child(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        if self.level is not None:
            self.own("logging/setLevel", self.level)
        for params in self.subs.values():
            self.own("resources/subscribe", params)
        self.mark_ready("replayed initialize")
        self.flush_held()
        notes = self.list_notes([kind for kind in ("tools", "prompts", "resources") if isinstance(
            self.init_caps.get(kind), dict) and self.init_caps[kind].get("listChanged") is True])
        if notes:
            self.send_client(notes)

    def malformed(self, side, line, exc):
        if line.strip():                           # blank lines are skipped silently
            self.st["dropped"] += 1
            # redacted before it is cut: a cut token is no longer recognisable
            sample = self.redactor.redact(line[:4096].decode("utf-8", "replace"))[:120]
            self.emit("bridge:dropped", {"from": side, "reason": "malformed JSON: %s" % exc,
                                         "size": len(line), "sample": sample})

    def dropped(self, splitter, side):
        """Lines over max_line_bytes were dropped: published, and when their ends show what they
        were (proxy_dropped_id), whoever waits on them gets an error instead of a timeout: the
        sender of a request, or the side whose request a dropped answer was for."""
        for head, tail in splitter.dropped:
            (mid, kind), answered = proxy_dropped_id(head, tail), None
            if mid is not None and kind == "request":
                self.reply_error(mid, "too_large", None, to_doctor=side == "doctor")
                answered = mid
            elif kind == "answer" and side == "doctor" and mid in self.pending:
                self.reply_error(mid, "answer_too_large", self.pending.pop(mid)[0])
                answered = mid
            elif kind == "answer" and side == "client" and mid in self.srv_pending:
                self.srv_pending.discard(mid)
                self.reply_error(mid, "answer_too_large", None, to_doctor=True)
                answered = mid
            self.st["dropped"] += 1
            self.emit("bridge:dropped", {"from": side, "id": mid, "answered": answered, "reason":
                                         "line longer than proxy.max_line_bytes (%d)" % self.cap})
        del splitter.dropped[:]

    # ---- I/O ----
    def send_child(self, data=b""):
        """To the Doctor's stdin; with no data, what is still owed. A closed pipe: deaf()."""
        child = self.child
        if child is not None and child.fin is not None:
            try:
                self.to_child.send(child.fin, data)
            except OSError:
                self.deaf()

    def deaf(self):
        """The Doctor's stdin has no reader: it closed it, or died. What it was owed is lost
        (any request in it is answered when the Doctor is stopped); run() stops a Doctor still
        alive close_grace_sec later."""
        child = self.child
        self.to_child.clear()
        child.close("fin")
        child.eof_at = child.eof_at or time.monotonic()

    def send_client(self, data=b""):
        """Everything the client gets goes through here, relayed or bridge.py's own (each
        message one line): the one place that counts messagesOut and bytesOut. With no data,
        what is still owed."""
        self.st["messagesOut"] += data.count(b"\n")
        self.st["bytesOut"] += len(data)
        if not self.client_gone:
            try:
                self.to_client.send(1, data)
            except OSError:
                self.client_gone = True
                self.shutdown("the client's pipe closed")

    def read_child(self, name):
        """One read of the Doctor's stdout ("fout") or stderr ("ferr"), closed at its end."""
        child = self.child
        try:
            data = os.read(getattr(child, name), 1 << 16)
        except OSError:
            data = b""
        if name == "ferr":
            self.stderr_data(data)
        elif data:
            child.heard = time.monotonic()
            self.child_lines(child.lines.feed(data))
            if child.lines.dropped:
                self.dropped(child.lines, "doctor")
        else:
            self.child_lines(child.lines.finish())
            child.eof_at = time.monotonic()
        if not data:
            child.close(name)

    def stderr_data(self, data):
        """Doctor stderr -> ours, line by line with a prefix, redacted; a line without end is
        forwarded in 64 KiB pieces, a long one cut (write_stderr). The tail feeds crash events."""
        buf = self.child.errbuf
        buf += data
        cut = buf.rfind(b"\n") + 1 if data else len(buf)
        if not cut and len(buf) >= 1 << 16:
            cut = len(buf)
        for line in bytes(buf[:cut]).splitlines():
            # redact before cutting: a cut token is no longer recognisable
            text = printable(self.redactor.redact(line.decode("utf-8", "replace")))
            self.tail.append(text[:500])
            self.write_stderr(b"[doctor] " + text.encode("utf-8") + b"\n")
        del buf[:cut]

    # ---- the loop ----
    def run(self):
        import select
        import signal
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        old = {s: signal.signal(s, self.on_signal)
               for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        old[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, self.on_child)
        self.adopting = proxy_adopt_orphans() and hasattr(os, "waitid")
        blocking = os.get_blocking(1)
        os.set_blocking(1, False)
        poller, registered = select.poll(), {}
        IN, OUT = select.POLLIN | select.POLLPRI, select.POLLOUT
        next_stats, next_sample = time.monotonic() + self.stats_every, time.monotonic() + 1.0
        try:
            self.start_observability()
            self.spawn()
            if self.watch is not None:
                self.watch.start()
            while True:
                now, child = time.monotonic(), self.child
                if child is not None and child.exit is None and (
                        child.fout is None or child.stop_reason or now >= self.next_check):
                    self.next_check = now + 0.25
                    if child.exited():
                        self.child_exited()
                    elif (child.fout is None or child.fin is None) and not child.stop_reason:
                        # Alive with its stdout (stdin) closed, it can answer (take) nothing: its
                        # end.
                        if now - child.eof_at >= self.close_grace:
                            self.stop_child("stdout_closed" if child.fout is None else
                                            "stdin_closed", now=True)
                    elif not child.stop_reason and (self.pending or child.replay_id is not None):
                        self.check_health(now)
                if self.reload is not None and self.draining() and \
                        (not self.pending or now >= self.reload["until"]):
                    self.stop_child("reload", now=True)    # past the grace: the rest get an error
                if self.reload_later is not None and now >= self.reload_later[1]:
                    files, self.reload_later = self.reload_later[0], None
                    self.start_reload(files, pace=False)
                if self.shutting and (self.child is None or self.child.exit is not None):
                    break
                child = self.child
                if (child is None or child.exit is not None) and not self.stopped and \
                        now >= self.spawn_at:
                    self.spawn()
                    continue
                want = {self.wake_r: IN}
                if not (self.stdin_eof or self.shutting or len(self.to_child) > PROXY_HIGH_WATER
                        or not self.paused and self.held_full()):
                    want[0] = IN
                if self.to_client:
                    want[1] = OUT
                if child is not None:
                    if child.fout is not None and len(self.to_client) <= PROXY_HIGH_WATER:
                        want[child.fout] = IN
                    if child.ferr is not None:
                        want[child.ferr] = IN
                    if child.fin is not None:      # with nothing to write, poll still says POLLERR
                        want[child.fin] = OUT if self.to_child else 0   # when its stdin is closed
                if want != registered:
                    for fd in registered.keys() - want.keys():
                        poller.unregister(fd)
                    for fd, mask in want.items():
                        if registered.get(fd) != mask:
                            poller.register(fd, mask)   # of a registered fd: its new mask
                    registered = want
                for fd, ev in poller.poll(self.timers(now) * 1000):
                    self.on_ready(fd, ev)
                now = time.monotonic()
                if now >= next_sample:
                    next_sample = now + 1.0            # the window moves in steps of a second
                    self.sample_counts(now)
                if now >= next_stats:
                    next_stats = now + self.stats_every
                    self.publish_stats()
        finally:
            self.closed = True
            if self.watch is not None:
                self.watch.stop()
            while self.ctl:                            # commands that came too late
                done = self.ctl.popleft()[2]
                if done is not None:
                    done.outcome = {"ok": False, "error": "bridge.py has stopped"}
                    done.set()
            if self.obs is not None:
                self.obs.stop()
            if self.token_file:
                unlink_quietly(self.token_file)
            self.finish()
            os.set_blocking(1, blocking)
            for sig, handler in old.items():
                signal.signal(sig, handler)
        return self.exit_code

    def timers(self, now):
        """Fire due deadlines (close stdin, TERM, KILL, held-message timeouts); seconds to sleep."""
        child = self.child
        if not self.held and child is not None and child.exit is None and not child.stop_reason \
                and child.fout is not None and self.reload is None and self.reload_later is None:
            # the usual state: only the exit check is due
            return max(0.0, min(now + 1.0, self.next_check) - now)
        import signal
        due = [now + 1.0]
        if child is not None and child.exit is None:
            if child.stop_reason:
                if child.fin is not None and (not self.to_child or now >= child.term_at):
                    self.to_child.clear()
                    child.close("fin")
                if child.term_at is not None and now >= child.term_at:
                    signal_group(child.pid, signal.SIGTERM)
                    child.term_at = None
                if now >= child.kill_at:
                    signal_group(child.pid, signal.SIGKILL)
                due.append(now + 0.01)
            elif child.fout is None:               # stdout closed: the exit is imminent, or overdue
                due.append(now + 0.002 if now - child.eof_at < 0.1 else
                           child.eof_at + self.close_grace)
            else:
                due.append(self.reload["until"] if self.draining() else self.next_check)
        elif not self.stopped and not self.shutting:
            due.append(self.spawn_at)
        if self.reload_later is not None:
            due.append(self.reload_later[1])
        if self.held:
            oldest = next((t for _line, reqs, _method, t in self.held if reqs), now)
            if now - oldest >= self.hold_sec:
                self.fail_held("held_too_long", older_than=self.hold_sec)
            due.append(now + 0.1)
        return max(0.0, min(due) - now)

    def on_ready(self, fd, ev=0):
        child = self.child
        if fd == self.wake_r:
            os.read(fd, 4096)
            while self.ctl:
                self.run_control(*self.ctl.popleft())
            if self.reaping:                       # SIGCHLD: the Doctor or an adopted orphan exited
                self.reaping, self.next_check = False, 0.0
                self.reap_adopted()
        elif fd == 0:
            data = os.read(0, 1 << 16)
            self.client_lines(self.stdin_lines.feed(data) if data else self.stdin_lines.finish())
            if self.stdin_lines.dropped:
                self.dropped(self.stdin_lines, "client")
            if not data:
                self.stdin_eof = True
                self.shutdown("stdin EOF")
        elif fd == 1:
            self.send_client()
        elif child is not None and fd == child.fin:
            import select
            if ev & select.POLLERR:                # nobody reads its stdin any more
                self.deaf()
            else:
                self.send_child()
        elif child is not None and fd in (child.fout, child.ferr):
            self.read_child("fout" if fd == child.fout else "ferr")

    def finish(self):
        """Write what the client is still owed (within 2 s), then make sure nothing the last
        Doctor started survives us (its group, and orphans adopted from outside it): TERM, wait up
        to kill_after_sec, KILL, reap."""
        import select
        import signal
        deadline = time.monotonic() + 2.0
        while self.to_client and not self.client_gone and time.monotonic() < deadline:
            select.select([], [1], [], 0.05)
            self.send_client()
        child = self.child
        if child is not None:
            # The group id is used only while it is surely the Doctor's: its leader alive until
            # now. A Doctor reaped earlier (a doctor:kill hours ago) had its leftovers killed then,
            # and its pid may belong to another process by now. Adopted orphans are found as ours.
            pgid = child.pid if not self.adopting and \
                (child.exit is None or child.stop_reason == "shutdown") else None
            if child.exit is None:
                signal_group(child.pid, signal.SIGKILL)
                child.proc.wait()
            for name in ("fin", "fout", "ferr"):
                child.close(name)
            left = proxy_leftovers(pgid)
            proxy_signal(pgid, left, signal.SIGTERM)
            end = time.monotonic() + self.kill_after
            while left and time.monotonic() < end:
                time.sleep(0.02)
                self.reap_adopted()
                left = proxy_leftovers(pgid)
            proxy_signal(pgid, left, signal.SIGKILL)
            end = time.monotonic() + 1.0
            while self.reap_adopted() and time.monotonic() < end:
                time.sleep(0.01)

    def start_observability(self):
        cfg = self.cfg["observability"]
        if not cfg["enabled"]:
            return self.log("info", "observability: disabled (observability.enabled, "
                            "BRIDGE_OBS_ENABLED)")
        # Safe by default (as Jupyter): with no token configured, one is drawn for this run, so
        # another user of the machine cannot drive /control. An empty token turns that off.
        token = cfg["token"]
        if token is None:
            import secrets
            token = secrets.token_urlsafe(24)
        obs = ObservabilityServer(cfg["host"], cfg["port"], token=token or None,
                                  allowed_origins=tuple(cfg["allowed_origins"]),
                                  control=self.control, log=lambda text: self.log("info", text))
        if obs.start():
            self.obs = obs
            if cfg["token"] is None:
                self.share_token(obs, token)

    def share_token(self, obs, token):
        """Tell the user the drawn token: the dashboard URL with it on stderr (never redacted:
        it is the way in) and in a file only they can read, removed when the proxy stops."""
        host = obs.host.strip("[]")
        url = "http://%s:%d/?token=%s" % ("[%s]" % host if ":" in host else host, obs.port, token)
        path = user_config_file("proxy-%d.url" % obs.port)
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            atomic_write(path, url + "\n", mode=0o600)
            self.token_file, where = path, "; also in %s" % path
        except OSError as exc:
            where = "; not written to %s: %s" % (path, exc)
        self.write_stderr(printable("bridge proxy: info: dashboard with this run's token: %s%s" % (
            url, where)).encode("utf-8") + b"\n")


def proxy_tool_hashes(tools):
    """{name: hash of its inputSchema} for a tools/list answer's tools: what a reload compares."""
    import hashlib
    return {tool["name"]: hashlib.sha256(json.dumps(tool.get("inputSchema"), sort_keys=True)
                                         .encode("utf-8")).hexdigest()[:16]
            for tool in tools if tool.__class__ is dict and tool.get("name").__class__ is str}


def proxy_command(cfg, argv=None):
    """The Doctor's argv, cwd and environment: the command after `--`, else doctor.commandLine
    (BRIDGE_DOCTOR_CMD, split like a shell would but run without one), else doctor.command and
    doctor.args."""
    doc = cfg["doctor"]
    if not argv:
        argv = split_command(doc["commandLine"], "doctor.commandLine (BRIDGE_DOCTOR_CMD)")
        command = split_command(doc["command"], "doctor.command")
        if not argv and command:
            argv = command + (split_command(doc["args"], "doctor.args") or [])
    if not argv:
        raise BridgeError("proxy: no server command: give it after `--`, or set doctor.command in "
                          "the config or BRIDGE_DOCTOR_CMD")
    cwd = doc["cwd"] or None
    if cwd and not os.path.isdir(cwd):
        raise BridgeError("proxy: doctor.cwd %s is not a directory" % cwd)
    env = dict(os.environ)
    env.pop("BRIDGE_OBS_TOKEN", None)      # the dashboard's key: the server has no use for it
    env.update({str(k): str(v) for k, v in doc["env"].items()})
    return argv, cwd, env


# ---- 5b. observability: WebSocket server and dashboard ----
#
# RFC 6455 on plain threads: one accept thread, and per connection a reader (HTTP head, then
# frames) plus a writer draining a bounded queue. publish() only appends to those queues, so a
# slow or stuck dashboard is dropped instead of ever slowing the relay.

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OBS_MAX_MESSAGE = 1 << 20  # a larger client message is closed with 1009
OBS_MAX_CONNECTIONS = 64
OBS_HISTORY = 200  # recent events replayed to each new /events client
OBS_HEAD_TIMEOUT = 10.0  # seconds for a whole request head: a client dribbling bytes is dropped
OBS_MAX_HEAD = 16384     # bytes of a request head, its final blank line not counted
# headers whose second copy would be a guess at which one counts: a request repeating one is refused
OBS_SINGLE_HEADERS = ("host", "origin", "authorization", "upgrade", "connection",
                      "sec-websocket-key", "sec-websocket-version")
# What one client may send a second before its reader thread sleeps out the second: reading,
# unmasking and decoding frames is CPU work that would otherwise take the relay thread's turn.
OBS_FRAMES_PER_SEC, OBS_BYTES_PER_SEC = 1000, 2 << 20


def _is_loopback(host):
    """`localhost` or a loopback address (brackets already stripped)."""
    import ipaddress
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ws_frame(opcode, payload=b""):
    """One unmasked, unfragmented server frame (RFC 6455 section 5.2)."""
    n = len(payload)
    size = bytes([n]) if n < 126 else (b"\x7e" + n.to_bytes(2, "big") if n < 65536
                                        else b"\x7f" + n.to_bytes(8, "big"))
    return bytes([0x80 | opcode]) + size + payload


def ws_close_frame(code, reason=""):
    return ws_frame(0x8, code.to_bytes(2, "big") + reason.encode("utf-8")[:123])


def ws_text_frame(obj):
    """obj as compact JSON in a text frame; anything unserialisable becomes its str()."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=str)
    return ws_frame(0x1, text.encode("utf-8", "replace"))


def ws_unmask(data, mask):
    """XOR with the 4-byte key as one big integer: a 1 MiB payload without a Python loop."""
    n = len(data)
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(data, "big") ^ key).to_bytes(n, "big")


class WsFail(Exception):
    """The peer broke the protocol: close with `code` (RFC 6455 section 7.4)."""

    def __init__(self, code, reason):
        Exception.__init__(self, reason)
        self.code, self.reason = code, reason


class ObsConnection:
    """One client socket. Its reader thread owns the socket's life; the writer only sends."""

    def __init__(self, server, sock, addr):
        import collections
        import threading
        self.server, self.sock, self.addr = server, sock, "%s:%s" % addr[:2]
        self.path, self.buf, self.writer = None, bytearray(), None
        self.out, self.cond = collections.deque(), threading.Condition()
        self.closing = False  # a close frame (or the end) is queued: nothing may follow it
        self.accepted = self.heard = time.monotonic()   # heard: when it last sent a frame
        self.in_head = True   # its request head is still coming: it may be dropped to make room

    def push(self, frame, close=False):
        """Queue a frame without blocking; False when the queue is full (the client is slow)."""
        with self.cond:
            if self.closing:
                return True
            if len(self.out) >= self.server.max_queue and not close:
                return False
            self.out.extend((frame, None) if close else (frame,))
            self.closing = close
            self.cond.notify()
        return True

    def kill(self, why):
        """Drop the connection now, never blocking: shutdown() wakes both threads."""
        import socket
        self.server.log("observability: dropping client %s %s: %s" % (self.addr, self.path, why))
        with self.cond:
            self.closing = True
            self.out.clear()
            self.out.append(None)
            self.cond.notify()
        self.shutdown(socket.SHUT_RDWR)

    def shutdown(self, how):
        try:
            self.sock.shutdown(how)
        except OSError:
            pass

    def write_loop(self):
        import socket
        while True:
            with self.cond:
                while not self.out:
                    self.cond.wait()
                frame = self.out.popleft()
            try:
                if frame is None:
                    break
                self.sock.sendall(frame)
            except OSError:
                break
        self.shutdown(socket.SHUT_WR)

    def recv(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buf)))
            if not chunk:
                raise EOFError
            self.buf += chunk
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def run(self):
        import socket
        import threading
        try:
            if self.handshake():
                self.sock.settimeout(None)
                self.writer = threading.Thread(target=self.write_loop, daemon=True)
                self.writer.start()
                self.server.attach(self)
                self.frames()
        except WsFail as e:
            self.server.log("observability: closing %s %s: %d %s" % (
                self.addr, self.path, e.code, e.reason))
            self.push(ws_close_frame(e.code, e.reason), close=True)
        except (OSError, EOFError):
            pass
        except Exception as e:  # a bug here must end this client only, never the proxy, and say so
            self.server.log("observability: internal error on %s %s: %r" % (
                self.addr, self.path, e))
            if self.path is not None:
                self.push(ws_close_frame(1011, "internal error"), close=True)
        finally:
            self.server.detach(self)
            self.push(None, close=True)
            # Linger: read until the peer closes, so our last frame is not lost to a TCP reset.
            if self.writer:
                self.writer.join(2)
            else:
                self.shutdown(socket.SHUT_WR)
            try:
                self.sock.settimeout(0.5)
                deadline = time.monotonic() + 1
                while time.monotonic() < deadline and self.sock.recv(65536):
                    pass
            except OSError:
                pass
            self.sock.close()

    def http(self, status, body, ctype="text/plain; charset=utf-8", extra=""):
        """Answer a plain HTTP request (the page, or a refusal); the connection then ends."""
        from http import HTTPStatus
        if status >= 400:
            self.server.log("observability: %d for %s: %s" % (status, self.addr, body))
        data = body.encode("utf-8")
        self.sock.sendall((
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n"
            "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY"
            "\r\nReferrer-Policy: no-referrer\r\n%s\r\n" % (
                status, HTTPStatus(status).phrase, ctype, len(data), extra)).encode() + data)
        return False

    def handshake(self):
        """Read the request head; serve the page, refuse, or upgrade (True) (RFC 6455 4.2)."""
        import base64
        import binascii
        import hashlib
        import socket
        from urllib.parse import parse_qs, urlsplit
        deadline = self.accepted + self.server.head_timeout
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > OBS_MAX_HEAD:
                return self.http(431, "request head too large")
            left = deadline - time.monotonic()    # one deadline for the whole head, not per recv
            if left <= 0:
                self.sock.settimeout(5)
                return self.http(408, "request head not complete within %g s" % (
                    self.server.head_timeout))
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(4096)
            except socket.timeout:
                continue
            if not chunk:
                return False
            self.buf += chunk
        self.in_head = False
        self.sock.settimeout(10)  # for the answer to the head
        head, _, rest = bytes(self.buf).partition(b"\r\n\r\n")
        self.buf = bytearray(rest)  # a client may send its first frame right behind the head
        if len(head) > OBS_MAX_HEAD:  # the last read may have brought the end of a head too large
            return self.http(431, "request head too large")
        lines = head.decode("latin-1").split("\r\n")
        parts, headers = lines[0].split(" "), {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            name = name.strip().lower()
            if not sep or not name:
                return self.http(400, "malformed header line")
            if name in headers and name in OBS_SINGLE_HEADERS:  # which one would count is a guess
                return self.http(400, "more than one %s header" % name)
            headers[name] = value.strip()
        if len(parts) != 3 or not re.match(r"HTTP/1\.[1-9]$", parts[2]):
            return self.http(400, "malformed request line (HTTP/1.1 required)")
        if not headers.get("host"):
            return self.http(400, "no Host header")
        try:
            url = urlsplit(parts[1])
        except ValueError as e:   # `http://[` and the like
            return self.http(400, "malformed request target: %s" % e)
        refused = self.server.refuse(headers, parse_qs(url.query))
        if refused:
            return self.http(*refused)
        if url.path not in ("/", "/index.html", "/events", "/control"):
            return self.http(404, "no such endpoint; there are /, /events and /control")
        if parts[0] != "GET":
            return self.http(405, "only GET is allowed", extra="Allow: GET\r\n")
        if url.path in ("/", "/index.html"):
            return self.http(200, DASHBOARD_HTML, "text/html; charset=utf-8")
        tokens = [t.strip().lower() for t in headers.get("connection", "").split(",")]
        if headers.get("upgrade", "").lower() != "websocket" or "upgrade" not in tokens:
            return self.http(400, "expected a WebSocket upgrade on " + url.path)
        if headers.get("sec-websocket-version") != "13":
            return self.http(426, "WebSocket version 13 required",
                             extra="Sec-WebSocket-Version: 13\r\n")
        key = headers.get("sec-websocket-key", "")
        try:
            if len(base64.b64decode(key, validate=True)) != 16:
                raise ValueError
        except (ValueError, binascii.Error):
            return self.http(400, "bad Sec-WebSocket-Key")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        # No Sec-WebSocket-Extensions or -Protocol in the reply: compression etc. is declined.
        self.sock.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n" % accept
                           ).encode())
        self.path = url.path
        return True

    def frames(self):
        """Read frames until a close (RFC 6455 sections 5.2-5.5); WsFail on any violation."""
        import codecs
        message, kind, decoder = None, 0, None
        window, frames_in, bytes_in = time.monotonic() + 1.0, 0, 0
        while not self.closing:
            if frames_in >= OBS_FRAMES_PER_SEC or bytes_in >= OBS_BYTES_PER_SEC:
                time.sleep(max(0.0, window - time.monotonic()))   # over budget: TCP slows it
            now = time.monotonic()
            if now >= window:
                window, frames_in, bytes_in = now + 1.0, 0, 0
            b0, b1 = self.recv(2)
            self.heard = time.monotonic()
            fin, opcode, n = b0 & 0x80, b0 & 0x0F, b1 & 0x7F
            if b0 & 0x70:
                raise WsFail(1002, "reserved bits set without an extension")
            if opcode not in (0, 1, 2, 8, 9, 10):
                raise WsFail(1002, "reserved opcode %d" % opcode)
            if not b1 & 0x80:
                raise WsFail(1002, "client frames must be masked")
            if opcode >= 8 and (n > 125 or not fin):
                raise WsFail(1002, "control frames must be unfragmented and at most 125 bytes")
            if n >= 126:
                n = int.from_bytes(self.recv(2 if n == 126 else 8), "big")
                if n >> 63:
                    raise WsFail(1002, "the most significant bit of a 64-bit length must be 0")
            frames_in, bytes_in = frames_in + 1, bytes_in + n
            if opcode < 8 and (opcode == 0) != (message is not None):
                raise WsFail(1002, "continuation frame without a message" if opcode == 0
                             else "new message inside a fragmented one")
            if opcode < 8 and n + len(message or b"") > self.server.max_message:
                raise WsFail(1009, "message larger than %d bytes" % self.server.max_message)
            mask = self.recv(4)
            data = ws_unmask(self.recv(n), mask)
            if opcode == 8:
                return self.on_close(data)
            if opcode == 9 and not self.push(ws_frame(0xA, data)):
                return self.kill("send queue full")
            if opcode >= 8:
                continue  # pongs need no answer
            if opcode:
                message, kind = bytearray(), opcode
                decoder = codecs.getincrementaldecoder("utf-8")() if opcode == 1 else None
            message += data
            try:  # incremental: fails as soon as the prefix can no longer be UTF-8
                if decoder:
                    decoder.decode(data, final=bool(fin))
                    pending = decoder.getstate()[0]
                    if pending[:1] == b"\xed" and pending[1:2] >= b"\xa0":
                        # a surrogate begins: Python's decoder would wait for more bytes
                        raise UnicodeDecodeError("utf-8", pending, 0, 2, "a surrogate")
            except UnicodeDecodeError:
                raise WsFail(1007, "invalid UTF-8 in a text message")
            if fin:
                self.on_message(kind, bytes(message))
                message = None

    def on_close(self, data):
        """Echo the peer's close code; a bad code or reason is itself a protocol error."""
        code = int.from_bytes(data[:2], "big") if len(data) >= 2 else (1000 if not data else 0)
        if not (1000 <= code <= 1014 and code not in (1004, 1005, 1006) or 3000 <= code <= 4999):
            raise WsFail(1002, "invalid close code")
        try:
            data[2:].decode("utf-8")
        except UnicodeDecodeError:
            raise WsFail(1007, "invalid UTF-8 in the close reason")
        self.push(ws_close_frame(code), close=True)

    def on_message(self, kind, payload):
        if self.path != "/control":
            return  # /events is one-way: what a client says there is ignored
        if kind != 1:
            raise WsFail(1003, "/control takes JSON text messages")
        if not self.push(ws_text_frame(self.server.command(payload.decode("utf-8")))):
            self.kill("send queue full")


class ObservabilityServer:
    """Dashboards' WebSocket server: `/events` streams {ts, type, data}, `/control` takes
    {id, action, params} and acks each by id, GET / serves DASHBOARD_HTML. Loopback unless a
    token is set; a foreign browser Origin gets 403 (README: "Observability")."""

    def __init__(self, host, port, token=None, allowed_origins=(), control=None, log=None,
                 max_queue=1000, head_timeout=OBS_HEAD_TIMEOUT):
        import collections
        import threading
        self.host, self.port, self.token = host or "127.0.0.1", int(port), token or None
        self.allowed = {o.lower().rstrip("/") for o in allowed_origins or ()}
        self.control, self.max_queue = control, max(1, int(max_queue))
        self.log, self.max_message, self.head_timeout = log or warn, OBS_MAX_MESSAGE, head_timeout
        self.listener, self.origins = None, ()
        self.names = None     # the Host names served (start); None: any (a wildcard bind)
        self.lock, self.conns, self.events = threading.Lock(), set(), set()
        # recent events for new /events clients, (number, event) by kind, merged in order: so
        # that a flood of one kind (traffic and the lines dropped from it, bridge.py's own
        # replies) never pushes out a crash; of bridge:stats only the newest is worth showing
        self.history = {kind: collections.deque(maxlen=OBS_HISTORY)
                        for kind in ("traffic", "replies", "lifecycle")}
        self.history["stats"] = collections.deque(maxlen=1)
        self.published = 0

    @property
    def client_count(self):
        return len(self.events)

    def start(self):
        """Bind and serve from a daemon thread; False (and a log line why) instead of raising."""
        import socket
        import threading
        from urllib.parse import urlsplit
        host = self.host.strip("[]")
        loopback = _is_loopback(host)
        if not loopback and not self.token:
            self.log("observability: refusing to listen on non-loopback host %s without a token "
                     "(set BRIDGE_OBS_TOKEN); running without the dashboard" % host)
            return False
        try:
            family = socket.getaddrinfo(host, self.port, type=socket.SOCK_STREAM)[0][0]
            listener = socket.create_server((host, self.port), family=family)
        except (OSError, OverflowError, ValueError) as e:
            self.log("observability: cannot listen on %s:%s (%s); running without the "
                     "dashboard" % (host, self.port, e))
            return False
        self.port = listener.getsockname()[1]
        listener.settimeout(0.5)  # lets the accept loop notice stop()
        name = "[%s]" % host if ":" in host else host
        self.origins = {"http://%s:%d" % (h, self.port) for h in
                        ([name, "127.0.0.1", "localhost", "[::1]"] if loopback else [name])}
        if host not in ("0.0.0.0", "::"):   # a wildcard bind answers to names nobody listed
            self.names = {host.lower(), "localhost"} | {urlsplit(o).hostname for o in self.allowed}
        self.listener = listener
        threading.Thread(target=self.accept_loop, args=(listener,), daemon=True).start()
        self.log("observability: dashboard on http://%s:%d/" % (name, self.port))
        return True

    def accept_loop(self, listener):
        import socket
        import threading
        while self.listener is listener:
            try:
                sock, addr = listener.accept()
            except socket.timeout:
                continue
            except OSError:  # closed by stop(), or out of file descriptors: back off
                time.sleep(0.1)
                continue
            conn = ObsConnection(self, sock, addr)
            with self.lock:
                if len(self.conns) >= OBS_MAX_CONNECTIONS:
                    # Make room: drop the oldest unfinished request head (a real client sends its
                    # head at once, a slowloris never), else the connection quiet the longest (a
                    # dashboard that is gone, or one of many opened to lock others out).
                    heads = [c for c in self.conns if c.in_head]
                    oldest = min(heads, key=lambda c: c.accepted) if heads else \
                        min(self.conns, key=lambda c: c.heard)
                    oldest.in_head = False
                    self.conns.discard(oldest)      # its slot is free now, not when its thread ends
                    self.events.discard(oldest)
                    if not heads:
                        self.log("observability: dropping %s %s, quiet the longest, to make "
                                 "room" % (oldest.addr, oldest.path))
                    oldest.shutdown(socket.SHUT_RDWR)
                self.conns.add(conn)
            threading.Thread(target=conn.run, daemon=True).start()

    def refuse(self, headers, query):
        """(status, body, ...) for a request to refuse (foreign Host or Origin, no token), else
        None. The Host check is DNS-rebinding protection: a page under another name that
        resolves to this address must not be served, nor reach the WebSockets."""
        import hmac
        from urllib.parse import urlsplit
        host = headers["host"]
        try:
            name = urlsplit("//" + host).hostname or ""
        except ValueError:
            name = ""
        if self.names is not None and name not in self.names and not _is_loopback(name):
            return 403, "Host %s is not a name of this dashboard (%s); a DNS rebinding page?" % (
                host[:200], ", ".join(sorted(self.names)))
        origin, own = headers.get("origin"), self.allowed.union(self.origins)
        if self.token and headers.get("host"):
            own = own | {"http://" + headers["host"].lower()}  # any name, but only with the token
        if origin is not None and origin.lower().rstrip("/") not in own:
            return 403, "origin %s is not allowed" % origin[:200]
        if self.token:
            auth = headers.get("authorization", "")
            offered = query.get("token", []) + ([auth[7:].strip()] if auth[:7].lower() == "bearer "
                                                else [])
            if not any(hmac.compare_digest(t.encode(), self.token.encode()) for t in offered):
                return 401, "token required", "text/plain", "WWW-Authenticate: Bearer\r\n"
        return None

    def attach(self, conn):
        if conn.path == "/events":
            with self.lock:
                recent = sorted((item for kind in self.history.values() for item in kind),
                                key=lambda item: item[0])
                for _n, event in recent[max(0, len(recent) - self.max_queue // 2):]:
                    conn.push(ws_text_frame(event))
                self.events.add(conn)

    def detach(self, conn):
        with self.lock:
            self.conns.discard(conn)
            self.events.discard(conn)

    def publish(self, event_type, data=None):
        """Fan an event out to /events clients; never blocks; drops clients that fall behind."""
        event = {"ts": int(time.time() * 1000), "type": event_type, "data": data}
        ours = data.__class__ is dict and data.get("from") == "bridge"
        kind = "stats" if event_type == "bridge:stats" else \
            "lifecycle" if event_type[:4] != "mcp:" and event_type != "bridge:dropped" else \
            "replies" if ours else "traffic"
        with self.lock:
            self.published += 1
            self.history[kind].append((self.published, event))
            if not self.events:
                return
            frame = ws_text_frame(event)
            slow = [conn for conn in self.events if not conn.push(frame)]
            self.events.difference_update(slow)
        for conn in slow:
            conn.kill("send queue full (slow client)")

    def command(self, text):
        """Run one /control message through the control callback; always returns an ack."""
        def not_json(name):                           # NaN and Infinity: Python's, not JSON's
            raise ValueError("%s is not JSON" % name)
        try:
            msg = parse_json(text, parse_constant=not_json)
            error = None if isinstance(msg, dict) else "command must be an object"
        except ValueError as e:
            error = "invalid JSON: %s" % e
        if error:
            return {"type": "ack", "id": None, "ok": False, "error": error}
        action, params = msg.get("action"), msg.get("params")
        ack = {"type": "ack", "id": msg.get("id"), "action": action, "ok": False}
        if msg.get("id") in (None, ""):
            ack["error"] = "missing id"
        elif not isinstance(action, str) or not action:
            ack["error"] = "missing action"
        elif params is not None and not isinstance(params, dict):
            ack["error"] = "params must be an object"
        elif self.control is None:
            ack["error"] = "control commands are not available"
        else:
            try:
                outcome = self.control(action, params or {})
            except Exception as e:  # a handler bug must not kill the connection
                self.log("observability: control %s failed: %r" % (action, e))
                outcome = {"ok": False, "error": "internal error: %s" % e}
            ack["ok"] = bool(outcome.get("ok"))
            if ack["ok"]:
                ack["result"] = outcome.get("result", {})
            else:
                ack["error"] = str(outcome.get("error") or "failed")
        return ack

    def stop(self):
        """Close the listener and every client (close 1001); drop those that do not answer."""
        self.listener, listener = None, self.listener
        if listener:
            listener.close()
        with self.lock:
            conns = list(self.conns)
        for conn in conns:
            conn.push(ws_close_frame(1001, "bridge stopping"), close=True)
        deadline = time.monotonic() + 1
        while self.conns and time.monotonic() < deadline:
            time.sleep(0.02)
        for conn in list(self.conns):
            conn.kill("stopping")


DASHBOARD_HTML = r"""<!doctype html>
<html><head><meta charset="utf-8"><title>bridge.py proxy</title>
<meta name="viewport" content="width=device-width,initial-scale=1">
<style>
body{font:14px system-ui,sans-serif;margin:1em 2em;color:#222;background:#f6f6f6;
     overflow-wrap:anywhere}
h1{font-size:1.3em}#conn{font-size:.7em;color:#777}
.cards{display:flex;flex-wrap:wrap;gap:.6em}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.5em .9em;min-width:7em}
.card b{display:block;font-size:1.4em}
.ready,.running{color:#080}.crashed,.fatal,.killed,.hung{color:#b00}
.paused,.restarting,.starting,.stopping,.waiting{color:#a60}
#ack{white-space:pre-wrap}
#crash{background:#fdecea;border:1px solid #d99;border-radius:6px;padding:.5em .9em;margin:.6em 0}
#crash pre{font:12px ui-monospace,monospace;margin:.4em 0 0;white-space:pre-wrap;max-height:14em;
           overflow:auto}
#kinds label{margin-right:1em}
#log{font:12px ui-monospace,monospace;background:#fff;border:1px solid #ddd;height:26em;
overflow:auto;padding:.4em;white-space:pre-wrap}
#log div{padding:1px 0;border-bottom:1px solid #f0f0f0}
button{margin:.6em .3em .6em 0;padding:.3em .8em}
</style></head><body>
<h1>bridge.py proxy <span id="conn">connecting</span></h1>
<div class="cards">
<div class="card">doctor<b id="state">unknown</b></div>
<div class="card">generation<b id="generation">-</b></div>
<div class="card">restarts<b id="restarts">-</b></div>
<div class="card">uptime<b id="uptime">-</b></div>
<div class="card" title="every message the client sent: requests, notifications and its answers to the server">client messages/s<b id="rateIn">-</b></div>
<div class="card" title="every message written to the client: answers, notifications, the server's requests and bridge.py's error replies">messages to client/s<b id="rateOut">-</b></div>
<div class="card">messages from / to client<b id="messages">-</b></div>
<div class="card">dashboards<b id="clients">-</b></div>
</div>
<div id="buttons"></div><div id="ack"></div>
<div id="crash" hidden><b id="crashTitle"></b><pre id="crashTail"></pre></div>
<h2>events</h2><div id="kinds"></div><div id="log"></div>
<script>
"use strict";
const $ = id => document.getElementById(id);
const token = new URLSearchParams(location.search).get("token");
const base = (location.protocol === "https:" ? "wss://" : "ws://") + location.host;
const suffix = token ? "?token=" + encodeURIComponent(token) : "";
const ACTIONS = ["doctor:restart", "doctor:kill", "bridge:pause", "bridge:resume",
                 "bridge:stats", "bridge:shutdown"];
// The log keeps the newest LOG_KEEP lines of each kind, so heavy traffic never pushes the
// server's lifecycle out of it; unticking a kind hides its lines.
const KINDS = {doctor: "server lifecycle", request: "requests", response: "responses",
               stats: "stats", bridge: "other bridge events", ack: "acks"};
const LOG_KEEP = 300, kept = {}, live = {"/events": false, "/control": false};
let control = null, seq = 0;
function set(id, value) { if (value !== undefined && value !== null) $(id).textContent = value; }
function setState(s) { set("state", s); $("state").className = s; }
function kindOf(t) {
  return t.startsWith("doctor:") ? "doctor" : t === "mcp:request" ? "request" :
         t === "mcp:response" ? "response" : t === "bridge:stats" ? "stats" : "bridge";
}
function logLine(kind, text, cls) {
  const d = document.createElement("div"), log = $("log");
  d.className = cls || ""; d.dataset.kind = kind; d.textContent = text;
  d.hidden = !$("kind-" + kind).checked;
  log.insertBefore(d, log.firstChild);
  const lines = kept[kind] = kept[kind] || [];
  lines.push(d);
  if (lines.length > LOG_KEEP) lines.shift().remove();
}
// Event data as `key value` pairs, a few kinds in words: what a person scans the log for.
function show(v) { return v !== null && typeof v === "object" ? JSON.stringify(v) : String(v); }
function pairs(d) {
  return d === null || typeof d !== "object" ? (d === undefined ? "" : show(d)) :
    Object.keys(d).filter(k => d[k] !== null && d[k] !== undefined)
      .map(k => k + " " + show(d[k])).join(", ");
}
function exited(e) { return !e ? "" : e.signal ? "killed by " + e.signal : "exit code " + e.code; }
const SAY = {
  "doctor:crashed": d => "generation " + d.generation + " crashed: " + exited(d.exit) +
                         " (" + d.reason + ")" + (d.stderrTail && d.stderrTail.length ?
                         ", stderr: " + d.stderrTail[d.stderrTail.length - 1] : ""),
  "doctor:stopped": d => "generation " + d.generation + " stopped: " + exited(d.exit),
  "doctor:reloading": d => "reloading generation " + d.generation + ": " + d.file + " changed" +
                           (d.pending ? ", " + d.pending + " requests get " + d.graceSec + " s" :
                            ""),
  "doctor:reloaded": d => "reloaded as generation " + d.generation + " (" + d.file + ", " +
                          d.reloadMs + " ms): " + (d.error ? "tools/list failed: " + show(d.error) :
                          !d.added ? d.tools + " tools, no earlier list to compare" :
                          ["added", "removed", "changed"]
                          .map(k => "tools " + k + " " + (d[k].join(" ") || "none")).join(", ")),
  "bridge:stats": d => "generation " + d.generation + " " + d.state +
                       (d.paused ? " (paused)" : "") +
                       ", messages from / to client " + d.messagesIn + " / " + d.messagesOut +
                       ", pending " + d.pending + ", held " + d.held + ", restarts " +
                       d.doctorRestarts + ", events skipped " + d.eventsSkipped,
  "mcp:request": d => (d.from === "doctor" ? "server asks " : "client asks ") + d.method +
                      (d.id === undefined || d.id === null ? "" : " #" + d.id) + " (" + d.size +
                      " B)" + (d.params ? " " + d.params : ""),
  "mcp:response": d => (d.error ? "error" : "answer") + " to #" + d.id + " " + (d.method || "") +
                       (d.from === "bridge" ? " from bridge.py: " + d.reason :
                        d.latencyMs === undefined || d.latencyMs === null ? "" :
                        " after " + d.latencyMs + " ms") + " (" + d.size + " B)",
};
function pin(ev, d) {
  const when = new Date(ev.ts).toLocaleTimeString();
  if (ev.type === "doctor:crashed") {
    set("crashTitle", "last crash, " + when + ": " + SAY["doctor:crashed"]({...d, stderrTail: []}));
    set("crashTail", (d.stderrTail || []).join("\n") || "(no stderr output)");
  } else {
    set("crashTitle", "gave up, " + when + ": " + pairs(d));
  }
  $("crash").hidden = false;
}
function onEvent(ev) {
  const t = String(ev.type), d = ev.data === undefined ? null : ev.data;
  logLine(kindOf(t), new Date(ev.ts).toLocaleTimeString() + " " + t + "  " +
          (SAY[t] ? SAY[t](d || {}) : pairs(d)).slice(0, 600), t.split(":")[1]);
  if (t === "doctor:crashed" || t === "doctor:fatal") pin(ev, d || {});
  if (t.startsWith("doctor:")) setState(t.slice(7));
  if (d && typeof d === "object") set("generation", d.generation);
  if (t === "bridge:stats" && d) {
    if (d.state) setState(d.paused ? "paused" : d.state);
    set("restarts", d.doctorRestarts);
    if (d.uptime !== undefined) set("uptime", Math.round(d.uptime) + " s");
    set("messages", d.messagesIn + " / " + d.messagesOut);
    set("clients", d.dashboardClients);
    set("rateIn", d.messagesInPerSec);    // over the last rateWindowSec, whenever stats come
    set("rateOut", d.messagesOutPerSec);
  }
}
function onAck(a) {
  const text = "ack " + a.id + " " + (a.action || "") + ": " +
               (a.ok ? "ok " + pairs(a.result === undefined ? {} : a.result) : "error " + a.error);
  $("ack").textContent = text; $("ack").className = a.ok ? "ready" : "crashed";
  logLine("ack", new Date().toLocaleTimeString() + " " + text, a.ok ? "" : "crashed");
}
function send(action) {
  if ((action === "bridge:shutdown" || action === "doctor:kill") &&
      !confirm(action + ": are you sure?")) return;
  if (!control || control.readyState !== 1) {
    $("ack").textContent = "control channel not connected"; return;
  }
  control.send(JSON.stringify({id: "ui-" + (++seq), action: action, params: {}}));
}
function connect(path, onMessage) {
  const ws = new WebSocket(base + path + suffix);
  ws.onopen = () => { live[path] = true; status();
    if (path === "/control") { control = ws; send("bridge:stats"); } };
  ws.onmessage = e => { try { onMessage(JSON.parse(e.data)); } catch (x) { console.error(x); } };
  ws.onclose = () => {
    live[path] = false; status(); setTimeout(() => connect(path, onMessage), 2000);
  };
}
function status() {
  set("conn", Object.keys(live).map(p => p.slice(1) + (live[p] ? " live" : " down")).join(", "));
}
for (const a of ACTIONS) {
  const b = document.createElement("button");
  b.textContent = a; b.dataset.action = a; b.onclick = () => send(a);
  $("buttons").appendChild(b);
}
for (const k of Object.keys(KINDS)) {
  const label = document.createElement("label"), box = document.createElement("input");
  box.type = "checkbox"; box.checked = true; box.id = "kind-" + k;
  box.onchange = () => { for (const d of kept[k] || []) d.hidden = !box.checked; };
  label.append(box, " " + KINDS[k]);
  $("kinds").appendChild(label);
}
connect("/events", onEvent);
connect("/control", onAck);
</script></body></html>
"""



# =============================================================================
# 6. CHANGES - change sets and their MCP executor
# =============================================================================

# Change sets. A planning agent writes reviewable change sets under
# changes/<id>/; the trusted executor (`changes run`) validates each one offline (schema,
# integrity) and against the repository's MCP server (alignment, governance, impact), then
# applies it through the server, gates it for a human (Tier 2) or rejects it. Every decision
# lands in changes/<id>/05-status.json (written only here, atomically and canonically) and in
# the decision log changes/.log/executor.jsonl.

CHANGESET_PROTOCOL = "changeset_id_v1"
CHANGESET_STATUS_SCHEMA = "changeset_status_v1"
PLAN_VERSION = "plan_v1"
CS_META = "00-meta.json"
CS_ARCH = "01-architecture.md"
CS_PLAN = "02-implementation-plan.json"
CS_TASKS = "03-task-list.md"
CS_STATUS = "05-status.json"
CS_STATES = ("draft", "ready", "validating", "pending_review", "executing", "completed",
             "failed", "superseded")
CS_TERMINAL = ("completed", "failed", "superseded")
CS_DECISIONS = ("auto", "review_required", "rejected", "approved")
CS_META_KEYS = ("artifact_manifest", "base_state", "plan_sha256", "protocol", "repo_key",
                "subject", "supersedes", "title")
# Tools a plan may call. Everything else (run.execute, workspace.write_file, shell_command...)
# rejects the whole plan: mutation goes through patches the server checks, nothing else.
CS_READ_TOOLS = ("gov.preflight", "gov.drift", "features.overview", "features.locate",
                 "features.impact", "xray.scan")
# Matched exactly: snapshot.export writes files wherever it is told, so no prefix match.
CS_TOOLS = ("workspace.apply_patch", "snapshot.create", "snapshot.info", "snapshot.list",
            "snapshot.read", "snapshot.grep", "snapshot.diff", "snapshot.changes") + CS_READ_TOOLS
CS_MAX_STRIP = 32  # git apply -pN: no real patch has deeper prefixes to strip
CS_MAX_SAFE_INT = 2 ** 53 - 1


class CanonicalJSONError(BridgeError):
    """A value that canonical JSON (our subset of RFC 8785) cannot represent."""


class _Refused:
    """A value canonical JSON refuses (a float, NaN), kept while parsing so that every one is
    reported with its place instead of only the first."""

    def __init__(self, why):
        self.why = why


def _canonical_check(value, where="$", problems=None):
    """Refuse what canonical JSON may not hold: floats, NaN, out-of-range integers,
    non-string keys, lone surrogates. `where` is a JSONPath-like location for the message.
    Each problem is appended to `problems` when a list is given; else the first raises."""
    def bad(msg):
        if problems is None:
            raise CanonicalJSONError(msg)
        problems.append(msg)

    if value is None or value is True or value is False:
        return
    if isinstance(value, int):
        if not -CS_MAX_SAFE_INT <= value <= CS_MAX_SAFE_INT:
            shown = str(value) if value.bit_length() < 256 else "of %d bits" % value.bit_length()
            bad("%s: integer %s is outside +/-(2^53-1)" % (where, shown))
    elif isinstance(value, float):
        bad("%s: number %r is not an integer (floats are not allowed in canonical JSON)"
            % (where, value))
    elif isinstance(value, _Refused):
        bad("%s: %s" % (where, value.why))
    elif isinstance(value, str):
        if _lone_surrogate(value):
            bad("%s: %s" % (where, _lone_surrogate(value)))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _canonical_check(item, "%s[%d]" % (where, i), problems)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                bad("%s: object key %r is not a string" % (where, key))
                continue
            if _lone_surrogate(key):
                bad("%s (key): %s" % (where, _lone_surrogate(key)))
            _canonical_check(item, "%s.%s" % (where, key), problems)
    else:
        bad("%s: %s is not a JSON value" % (where, type(value).__name__))


def _lone_surrogate(text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return "lone surrogate U+%04X in string" % ord(text[exc.start])
    return None


def canonical_json(value):
    """Canonical JSON bytes: UTF-8, keys sorted by code point (= UTF-8 byte order; RFC 8785
    sorts by UTF-16 code units, which differs only for astral-plane vs U+E000..U+FFFF keys),
    no whitespace, arrays in order, no trailing newline."""
    _canonical_check(value)
    # Python compares str by code point, so sort_keys gives the byte order we want.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def canonical_sha256(value):
    import hashlib
    return hashlib.sha256(canonical_json(value)).hexdigest()


def canonical_loads(data, what="JSON", problems=None):
    """Parse JSON strictly for hashed artifacts: duplicate keys, floats, NaN/Infinity,
    out-of-range integers, lone surrogates and invalid UTF-8 are errors naming `what`, all
    of them at once. With a `problems` list, the value problems (all but undecodable or
    unparseable text) are appended to it instead and the value is returned."""
    found = []

    def pairs(items):
        seen = {}
        for key, val in items:
            if key in seen:
                found.append("duplicate key %s" % json.dumps(key))
            seen[key] = val
        return seen

    def bad_float(text):
        return _Refused("number %s is not an integer (floats are not allowed)" % text)

    def bad_constant(text):
        return _Refused("%s is not valid JSON here" % text)

    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CanonicalJSONError("%s: invalid UTF-8 at byte %d" % (what, exc.start))
    if data.startswith("\ufeff"):
        raise CanonicalJSONError("%s: byte order mark is not allowed" % what)
    try:
        value = parse_json(data, object_pairs_hook=pairs, parse_float=bad_float,
                           parse_constant=bad_constant)
    except json.JSONDecodeError as exc:
        raise CanonicalJSONError("%s: line %d column %d: %s" % (what, exc.lineno, exc.colno,
                                                                exc.msg))
    except ValueError as exc:  # e.g. an integer of 5000 digits, or nested too deeply
        raise CanonicalJSONError("%s: %s" % (what, exc))
    _canonical_check(value, "$", found)
    found = ["%s: %s" % (what, msg) for msg in found]
    if problems is not None:
        problems.extend(found)
    elif found:
        raise CanonicalJSONError("; ".join(found))
    return value


def read_canonical_file(path, what=None, problems=None):
    return canonical_loads(read_input(path), what or str(path), problems)


# ---- slug, repo key, id -------------------------------------------------------------------

_SLUG_EXTRA = {"ß": "ss", "æ": "ae", "Æ": "ae", "ø": "o", "Ø": "o", "œ": "oe", "Œ": "oe",
               "đ": "d", "Đ": "d", "ł": "l", "Ł": "l", "þ": "th", "Þ": "th", "ı": "i"}


def changeset_slug(subject):
    """ASCII slug: accents transliterated (NFKD, combining marks dropped), each run of
    anything but [a-z0-9] one `-`, trimmed, cut to 48 characters, trimmed; `change` if empty."""
    import unicodedata
    text = "".join(_SLUG_EXTRA.get(ch, ch) for ch in str(subject))
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    text = text[:48].strip("-")
    return text or "change"


def normalize_repo_key(url):
    """`host/owner/repo` from a git remote URL (scheme, user, password/token and port removed,
    host lower-cased, `.git` and slashes stripped), or None for local paths and file:// URLs.
    Never raises on odd input and never returns any part of the userinfo."""
    from urllib.parse import urlsplit
    url = (url or "").strip()
    if not url:
        return None
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", url):
        try:
            parts = urlsplit(url)
            host = parts.hostname  # lower-cased, brackets, port and userinfo removed
        except ValueError:
            return None
        if parts.scheme.lower() == "file" or not host:
            return None
        path = parts.path
    else:
        # scp-like [user@]host:path -- only when no '/' comes before the first ':'
        m = re.match(r"^(?:[^@/:]*@)?(\[[^\]/]+\]|[^:/\\]+):(.*)$", url)
        if not m or "/" in url.split(":", 1)[0]:
            return None
        host = m.group(1).strip("[]").lower()
        path = m.group(2)
        if len(host) == 1:  # C:\src\repo is a drive letter, not a host
            return None
    path = re.sub(r"\A/+|(?:/|\.git)+\Z", "", path)  # also repo.git/ and repo.git.git
    if not path or not host:
        return None
    return host + "/" + path


def changeset_repo_key(root):
    """Repo key of `root`: the normalised `origin` URL, else the absolute repository path."""
    res = Git(root).run("remote", "get-url", "origin", check=False)
    key = normalize_repo_key(res.stdout.strip()) if res.exit_code == 0 else None
    return key or os.path.abspath(str(root))


def changeset_identity(subject, repo_key, base_state):
    """The hashed identity payload of changeset_id_v1 (normalised inputs only)."""
    return {"base_state": {"id": str(base_state["id"]), "kind": str(base_state["kind"])},
            "protocol": CHANGESET_PROTOCOL, "repo_key": repo_key,
            "subject": changeset_slug(subject)}


def changeset_id(identity, length=12):
    return identity["subject"] + "--" + canonical_sha256(identity)[:length]


# ---- MCP client -----------------------------------------------------------------------------

class McpError(BridgeError):
    """An error reply from the MCP server; `mcp_code` may be an int or a string (STALE_LEASE)."""

    def __init__(self, message, mcp_code=None, data=None):
        BridgeError.__init__(self, message, EXIT_FAILED)
        self.mcp_code = mcp_code
        self.data = data


class McpServerGone(BridgeError):
    """The server exited, closed its output or did not answer in time."""


class McpClient:
    """JSON-RPC client for one MCP server process over stdio.

    Sends in the configured framing (`content-length`, what axiomregent reads, or `line`, the
    MCP standard) and reads either (kernel read_message). Replies are matched by id; replies
    with a null id (axiomregent answers notifications) and unknown ids are ignored. One process
    lives for a whole change set so the server's in-memory leases stay valid."""

    def __init__(self, command, cwd, framing="content-length", timeout=30.0, env=None,
                 log=None, redactor=None):
        self.command = split_command(command, "changes.mcp.command")
        if not self.command:
            raise BridgeError("changes.mcp.command is empty", EXIT_USAGE)
        self.cwd = str(cwd)
        self.framing = framing
        self.timeout = float(timeout)
        self.env = env
        self.log = log or (lambda msg: None)
        self.redactor = redactor or get_redactor()  # the config's: it knows changes.mcp.env
        self.proc = None
        self._next_id = 0
        self._replies = None
        self._stderr_tail = []
        self._stalled = False
        self.server_info = None

    def start(self):
        import queue
        import subprocess
        import threading
        env = dict(os.environ, **(self.env or {}))
        try:
            self.proc = subprocess.Popen(
                self.command, cwd=self.cwd, env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise McpServerGone("cannot start MCP server %s: %s" % (
                self.command[0], exc.strerror or exc), EXIT_FAILED)
        self._replies = queue.Queue()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()
        init = self.request("initialize", {
            "protocolVersion": "2024-11-05", "capabilities": {},
            "clientInfo": {"name": "bridge.py", "version": __version__}})
        self.server_info = init if isinstance(init, dict) else {}
        self.notify("notifications/initialized", {})
        return self

    def _read_stdout(self):
        while True:
            try:
                raw = read_message(self.proc.stdout)
            except Exception as exc:  # framing error: the stream is unusable
                self._replies.put(("gone", "unreadable server output: %s" % exc))
                return
            if raw is None:
                self._replies.put(("gone", "server closed its output"))
                return
            try:
                msg = parse_json(raw)
            except ValueError:
                self.log("mcp: ignoring unparseable message from server")
                continue
            self._replies.put(("msg", msg))

    def _read_stderr(self):
        """Keep the last 20 lines, each cut to 300 characters, read in bounded pieces: a
        server that writes without newlines must not grow one line forever."""
        for line in iter(lambda: self.proc.stderr.readline(4096), b""):
            text = line.decode("utf-8", "replace").rstrip()
            self._stderr_tail.append(text[:300] + (" ..." if len(text) > 300 else ""))
            del self._stderr_tail[:-20]

    def _send(self, obj, timeout=None):
        """Write one message from a helper thread: a server that stops reading its input
        (alive, the pipe full) is gone after the timeout, never a writer blocked for good."""
        import threading
        data, failed, timeout = frame_message(obj, self.framing), [], timeout or self.timeout

        def write():
            try:
                write_all(self.proc.stdin.fileno(), data)
            except (OSError, ValueError) as exc:
                failed.append(exc)
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        writer.join(timeout)
        if writer.is_alive():
            self._stalled = True
            raise McpServerGone(self._gone_message(
                "did not read its input within %.0f s" % timeout), EXIT_FAILED)
        if failed:
            raise McpServerGone(self._gone_message("cannot write to server"), EXIT_FAILED)

    def _gone_message(self, what):
        try:  # at once when it has exited; None when there is no process or it lives on
            code = self.proc.wait(timeout=1.0)
        except Exception:
            code = None
        if code is not None:  # its last words are on their way: read them before quoting
            self._stderr_reader.join(timeout=2.0)
        msg = "MCP server %s%s" % (what, " (exit code %s)" % code if code is not None else "")
        tail = [t for t in self._stderr_tail if t][-3:]
        if tail:
            msg += "; stderr: " + " | ".join(tail)
        return printable(self.redactor.redact(msg))

    def notify(self, method, params=None):
        self._send({"jsonrpc": "2.0", "method": method, "params": params or {}})

    def request(self, method, params=None, timeout=None):
        import queue
        self._next_id += 1
        rid = self._next_id
        # one deadline for writing the request and for its answer: a server slow to read it
        # leaves less time to answer, never a second timeout
        deadline = time.monotonic() + (timeout or self.timeout)
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}},
                   timeout)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._stalled = True
                hint = " (is changes.mcp.framing %r what it speaks?)" % self.framing \
                    if method == "initialize" else ""
                raise McpServerGone("MCP server did not answer %s within %.0f s%s" % (
                    _mcp_label(method, params), timeout or self.timeout, hint), EXIT_FAILED)
            try:
                kind, msg = self._replies.get(timeout=left)
            except queue.Empty:
                continue
            if kind == "gone":
                self._replies.put((kind, msg))  # later calls fail the same way
                raise McpServerGone(self._gone_message(
                    "exited during %s: %s" % (_mcp_label(method, params), msg)), EXIT_FAILED)
            if isinstance(msg, dict) and "method" in msg:
                if msg.get("id") is not None:  # a request from the server: we offer nothing
                    self._send({"jsonrpc": "2.0", "id": msg["id"], "error": {
                        "code": -32601, "message": "Method not found"}})
                continue
            if not isinstance(msg, dict) or msg.get("id") != rid:
                continue  # null-id replies to notifications, stale ids
            err = msg.get("error")
            if err is not None:
                if not isinstance(err, dict):
                    err = {"message": str(err)}
                raise McpError(printable("%s failed: %s%s" % (
                    _mcp_label(method, params), err.get("message", "error"),
                    " (%s)" % err["code"] if "code" in err else "")),
                    err.get("code"), err.get("data"))
            return msg.get("result")

    def call_tool(self, name, arguments, timeout=None):
        """tools/call, unwrapping the result: structuredContent, else `json` blocks (axiomregent)
        or `text` blocks holding JSON (the standard); several blocks give a list."""
        result = self.request("tools/call", {"name": name, "arguments": arguments},
                              timeout=timeout)
        if not isinstance(result, dict):
            return result
        if result.get("isError"):
            text = " ".join(str(block.get("text")) for block in result.get("content") or []
                            if isinstance(block, dict) and block.get("type") == "text")
            raise McpError(printable("%s failed: %s" % (name, text or "error")), "tool_error")
        if "structuredContent" in result:
            return result["structuredContent"]
        blocks = result.get("content")
        if not isinstance(blocks, list):
            return result
        values = []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "json":
                values.append(block.get("json"))
            elif block.get("type") == "text":
                text = block.get("text", "")
                try:
                    values.append(parse_json(text))
                except ValueError:
                    values.append(text)
        return values[0] if len(values) == 1 else values

    def close(self):
        """EOF on stdin (a polite server exits), then the whole process group goes: a
        server that stalled or spawned helpers must not outlive its change set."""
        import subprocess
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        if not self._stalled:
            try:
                self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
        kill_process_group(self.proc, grace=1.0)
        self.proc = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _mcp_label(method, params):
    if method == "tools/call" and isinstance(params, dict):
        return str(params.get("name"))
    return method


# ---- change sets on disk ------------------------------------------------------------------

def changeset_patch_paths(root, patch, strip=1):
    """Every path `git apply -pSTRIP` in `root` would create, change, delete or rename, and
    every copy source, as git's own parser reads the patch: `git apply --numstat` only
    reports (it touches neither the work tree nor the index), run forwards for the paths
    written and reversed (-R) for the sources of renames and copies. So hunk headers, quoted
    names, renames, copies, mode changes and empty new files are read exactly as the applier
    reads them. A patch git cannot parse, a name that is not UTF-8 text or holds a control
    character, and a patch that makes a symlink raise BridgeError: a patch is judged by the
    paths git will write, or refused, never taken to touch nothing."""
    data = str(patch).encode("utf-8")
    paths = set()
    for extra in (["--summary"], ["-R"]):
        res = Git(root).run("apply", "--numstat", "-z", "-p%d" % strip, *extra,
                            stdin_data=data, check=False)
        if not res.ok:
            why = (res.stderr.strip().splitlines() or [res.describe()])[0]
            raise BridgeError("git apply cannot parse the patch: %s" % why.strip())
        entries, _, summary = res.stdout.rpartition("\0")
        for entry in entries.split("\0") if entries else ():
            fields = entry.split("\t", 2)
            name = fields[-1]
            if len(fields) < 3 or not name or "\ufffd" in name or any(
                    ord(ch) < 32 or ord(ch) == 127 for ch in name):
                raise BridgeError("the patch names a file bridge.py cannot check (%r): names "
                                  "must be UTF-8 text without control characters" % name)
            paths.add(name)
        if re.search(r"^ (?:create mode|mode change \d+ =>) 120000 ", summary, re.M):
            raise BridgeError("the patch makes a symlink; change sets may not create symlinks")
    if not paths:
        raise BridgeError("git apply finds no file in the patch")
    return sorted(paths)


def changeset_strip_ok(strip):
    return isinstance(strip, int) and not isinstance(strip, bool) and 0 <= strip <= CS_MAX_STRIP


def changeset_plan_problems(plan, base_kind=None, folder=None):
    """Schema problems of a plan_v1 document as (code, message) pairs; empty when valid."""
    problems = []

    def bad(code, msg):
        problems.append((code, msg))

    if not isinstance(plan, dict):
        return [("invalid_plan", "the plan must be a JSON object")]
    allowed = ("version", "change_set_id", "generated_from_digest", "prerequisites", "tasks",
               "goal", "description")
    for key in sorted(set(plan) - set(allowed)):
        bad("invalid_plan", "unknown plan field %r" % key)
    if plan.get("version") != PLAN_VERSION:
        bad("invalid_plan", "version must be %r, not %r" % (PLAN_VERSION, plan.get("version")))
    if "change_set_id" in plan and folder is not None and plan["change_set_id"] != folder:
        bad("integrity_mismatch", "plan change_set_id %r is not the folder name %r"
            % (plan["change_set_id"], folder))
    for key in ("generated_from_digest", "goal", "description", "change_set_id"):
        if key in plan and not isinstance(plan[key], str):
            bad("invalid_plan", "%s must be a string" % key)
    pre = plan.get("prerequisites", {})
    if not isinstance(pre, dict):
        bad("invalid_plan", "prerequisites must be an object")
    else:
        if "base_snapshot_id" in pre and not isinstance(pre["base_snapshot_id"], str):
            bad("invalid_plan", "prerequisites.base_snapshot_id must be a string")
        leases = pre.get("required_leases", [])
        if not isinstance(leases, list) or not all(isinstance(x, str) for x in leases):
            bad("invalid_plan", "prerequisites.required_leases must be a list of strings")
    tasks = plan.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        bad("invalid_plan", "tasks must be a non-empty list")
        return problems
    seen = set()
    for i, task in enumerate(tasks):
        where = "tasks[%d]" % i
        if not isinstance(task, dict):
            bad("invalid_plan", "%s must be an object" % where)
            continue
        tid = task.get("id")
        if not isinstance(tid, str) or not tid:
            bad("invalid_plan", "%s.id must be a non-empty string" % where)
        elif tid in seen:
            bad("invalid_plan", "%s.id %r is used twice" % (where, tid))
        else:
            seen.add(tid)
        if task.get("type") != "mcp_call":
            bad("forbidden_task", "%s.type %r: only mcp_call tasks may run (no shell)"
                % (where, task.get("type")))
        tool = task.get("tool")
        if not isinstance(tool, str) or not tool:
            bad("invalid_plan", "%s.tool must be a non-empty string" % where)
        elif tool not in CS_TOOLS:
            bad("forbidden_tool", "%s.tool %r is not allowlisted (%s)"
                % (where, tool, ", ".join(CS_TOOLS)))
        params = task.get("params", {})
        if not isinstance(params, dict):
            bad("invalid_plan", "%s.params must be an object" % where)
            params = {}
        if tool == "workspace.apply_patch":
            if not isinstance(params.get("patch"), str) or not params.get("patch"):
                bad("invalid_plan", "%s.params.patch must be a non-empty string" % where)
            mode = params.get("mode", base_kind)
            if mode is None and base_kind is None:
                pass  # decided by the base state, checked once that is known
            elif mode not in ("worktree", "snapshot"):
                bad("invalid_plan", "%s.params.mode must be worktree or snapshot" % where)
            elif base_kind and mode != base_kind:
                bad("invalid_plan", "%s.params.mode %r does not match base_state.kind %r"
                    % (where, mode, base_kind))
            if not changeset_strip_ok(params.get("strip", 1)):
                bad("invalid_plan", "%s.params.strip must be an integer from 0 to %d"
                    % (where, CS_MAX_STRIP))
        risk = task.get("risk_profile")
        if not isinstance(risk, dict):
            bad("invalid_plan", "%s.risk_profile must be an object" % where)
        else:
            if risk.get("impact_score") not in ("none", "low", "medium", "high"):
                bad("invalid_plan", "%s.risk_profile.impact_score must be none, low, medium or "
                    "high" % where)
            feats = risk.get("touched_features", [])
            if not isinstance(feats, list) or not all(isinstance(x, str) for x in feats):
                bad("invalid_plan", "%s.risk_profile.touched_features must be a list of "
                    "strings" % where)
            if not isinstance(risk.get("destructive", False), bool):
                bad("invalid_plan", "%s.risk_profile.destructive must be a boolean" % where)
    return problems


def changeset_meta_problems(meta):
    problems = []

    def bad(msg):
        problems.append(("invalid_meta", msg))

    if not isinstance(meta, dict):
        return [("invalid_meta", "00-meta.json must be a JSON object")]
    for key in sorted(set(meta) - set(CS_META_KEYS)):
        bad("unknown field %r" % key)
    if meta.get("protocol") != CHANGESET_PROTOCOL:
        bad("protocol must be %r" % CHANGESET_PROTOCOL)
    subject = meta.get("subject")
    if not isinstance(subject, str) or changeset_slug(subject) != subject:
        bad("subject must be a normalised slug, not %r" % (subject,))
    if not isinstance(meta.get("repo_key"), str) or not meta.get("repo_key"):
        bad("repo_key must be a non-empty string")
    base = meta.get("base_state")
    if (not isinstance(base, dict) or sorted(base) != ["id", "kind"]
            or base.get("kind") not in ("snapshot", "worktree")
            or not isinstance(base.get("id"), str) or not base.get("id")):
        bad("base_state must be {\"kind\": \"snapshot\"|\"worktree\", \"id\": \"...\"}")
    if not re.match(r"^[0-9a-f]{64}$", str(meta.get("plan_sha256", ""))):
        bad("plan_sha256 must be 64 lower-case hex digits")
    if "title" in meta and not isinstance(meta["title"], str):
        bad("title must be a string")
    sup = meta.get("supersedes", [])
    if not isinstance(sup, list) or not all(is_safe_name(x) for x in sup):
        bad("supersedes must be a list of change set ids")
    man = meta.get("artifact_manifest", {})
    if not isinstance(man, dict) or not all(isinstance(v, str) for v in man.values()):
        bad("artifact_manifest must map file names to sha256 strings")
    return problems


class ChangeSets:
    """The `changes/` directory of one repository: change sets, their status, the executor."""

    def __init__(self, root, config):
        self.root = str(root)
        self.config = config
        self.cfg = config["changes"]
        self.dir = os.path.join(self.root, self.cfg["dir"])
        # Folders are checked from the repository down, changes/ itself included (an agent
        # can put a link there); a folder configured outside the repository is yours.
        inside = not os.path.relpath(self.dir, self.root).startswith(os.pardir)
        self.top = self.root if inside else self.dir
        self.lock_path = os.path.join(self.dir, ".locks", "worktree.lock")
        self.log_path = os.path.join(self.dir, ".log", "executor.jsonl")
        self.redactor = get_redactor(config)

    # -- plumbing --
    def path(self, cs_id, name=None):
        """changes/<id>/[name]; for a file, a symlinked change-set folder is a BridgeError
        naming it (nothing is read or written through it)."""
        safe_name(cs_id, "change set id")
        base = os.path.join(self.dir, cs_id)
        return os.path.join(make_dirs(base, self.top, create=False), name) if name else base

    def existing(self, cs_id):
        """`cs_id` when changes/<id>/ exists, else a BridgeError saying there is none."""
        if not os.path.isdir(self.path(cs_id)):
            raise BridgeError("no change set %s in %s" % (cs_id, self.dir))
        return cs_id

    def ids(self):
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return []
        return [n for n in names if not n.startswith(".")
                and os.path.isdir(os.path.join(self.dir, n))]

    def mcp_configured(self):
        return bool(self.cfg["mcp"]["command"])

    def client(self):
        mcp = self.cfg["mcp"]
        if not mcp["command"]:
            raise BridgeError("no MCP server configured: set changes.mcp.command in "
                              "bridge.config.json", EXIT_USAGE)
        return McpClient(mcp["command"], self.root, framing=mcp["framing"],
                         timeout=mcp["timeout_sec"],
                         env={str(k): str(v) for k, v in mcp["env"].items()},
                         log=self.say, redactor=self.redactor)

    def say(self, msg):
        sys.stderr.write("bridge changes: %s\n" % printable(self.redactor.redact(msg)))

    def record(self, cs_id, event, **fields):
        rec = dict({"ts": now_iso(), "change_set_id": cs_id, "event": event}, **fields)
        append_jsonl(self.own_file(self.log_path), self.redactor.redact_obj(rec))

    def own_file(self, path):
        """`path` (under changes/.log or .locks), its folder made or checked like a change
        set's: never a symlink to a place outside."""
        return os.path.join(make_dirs(os.path.dirname(path), self.top), os.path.basename(path))

    def ensure_excluded(self):
        """Keep changes/ out of `git status` (and so out of the worktree fingerprint): the
        change sets written after an id is derived must not make their own base stale."""
        git_exclude(self.root,
                    "/%s/" % os.path.relpath(self.dir, self.root).replace(os.sep, "/"))

    # -- status --
    def status_lock(self):
        """A short flock serialising status writes between the executor and `approve`: taken
        here, released when the `with` block this call heads ends."""
        import contextlib
        path = self.own_file(os.path.join(self.dir, ".locks", "status.lock"))
        fd = acquire_flock(path, timeout=10.0)
        if fd is None:
            raise BridgeError("%s stayed locked for 10 s" % path, EXIT_LOCKED)
        held = contextlib.ExitStack()
        held.callback(release_flock, fd)
        return held

    def read_status(self, cs_id):
        path = self.path(cs_id, CS_STATUS)
        raw = read_input(path, missing=None)
        if raw is None:
            return None
        status = canonical_loads(raw, path)
        if (not isinstance(status, dict)
                or status.get("schema_version") != CHANGESET_STATUS_SCHEMA
                or status.get("state") not in CS_STATES
                or status.get("decision") not in CS_DECISIONS):
            raise BridgeError("%s is not a %s document" % (path, CHANGESET_STATUS_SCHEMA))
        return status

    def write_status(self, cs_id, state, decision, reason, meta=None, prev=None, **extra):
        """Replace 05-status.json (canonical, atomic) and log the decision. `meta` may be
        whatever load() read: only a base_state object in it becomes validated_against."""
        status = dict(prev or {})
        status.update({
            "schema_version": CHANGESET_STATUS_SCHEMA, "change_set_id": cs_id,
            "state": state, "decision": decision, "reason": reason,
            "updated_at": now_iso()})
        if isinstance(meta, dict) and isinstance(meta.get("base_state"), dict):
            status["validated_against"] = {"base_state": meta["base_state"],
                                           "plan_sha256": meta.get("plan_sha256")}
        status.setdefault("validated_against", None)
        status.setdefault("execution", {"started_task_id": None, "completed_task_ids": [],
                                        "last_error": None})
        status.update(extra)
        # Server answers (violations...) may hold floats or odd text: store them as strings
        # rather than fail to record a decision. Then redact the whole object: reason,
        # last_error and every extra (problems, validation: server answers) alike.
        status = self.redactor.redact_obj(_canonical_safe(status))
        with self.status_lock():
            atomic_write(self.path(cs_id, CS_STATUS), canonical_json(status))
        self.record(cs_id, "status", state=state, decision=decision, reason=status["reason"])
        return status

    # -- approvals --
    # The planning agent can write anything under changes/, 05-status.json included, so an
    # approval there counts only with a MAC made by `approve` with a key the agent cannot
    # read: outside the repository, mode 0600.
    def approval_key_path(self):
        path = os.path.expanduser(self.cfg["approval_key"] or user_config_file("approval.key"))
        if not os.path.isabs(path):  # relative to what? the repository is the wrong answer
            raise BridgeError("changes.approval_key must be an absolute path (or start with ~), "
                              "not %r" % path, EXIT_USAGE)
        return outside_repository(path, self.root, "the approval key",
                                  "set changes.approval_key to a path outside")

    def approval_key(self, create=False):
        """The key that signs approvals (32 random bytes, hex), or None when there is none.
        `approve` creates it on first use (mode 0600, its folder 0700); the executor only
        reads it. A key others may read or that is not ours is an error naming it."""
        path = self.approval_key_path()
        raw = read_input(path, "approval key", limit=4096, missing=None)
        if raw is None and create:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            try:
                write_once(path, os.urandom(32).hex().encode("ascii") + b"\n", 0o600)
            except FileExistsError:  # another approve made it just now
                pass
            raw = read_input(path, "approval key", limit=4096)
        if raw is None:
            return None
        info = os.stat(path)
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise BridgeError("the approval key %s must belong to you and be readable by you "
                              "alone (chmod 600)" % path, EXIT_USAGE)
        try:
            key = bytes.fromhex(raw.decode("ascii").strip())
        except ValueError:
            key = b""
        if len(key) < 16:
            raise BridgeError("the approval key %s is not 32 bytes of hex; delete it and "
                              "approve again to make a new one" % path, EXIT_USAGE)
        return key

    @staticmethod
    def approval_mac(key, cs_id, approval):
        import hashlib
        import hmac
        signed = {"approved_at": approval.get("approved_at"), "by": approval.get("by"),
                  "change_set_id": cs_id, "plan_sha256": approval.get("plan_sha256"),
                  "purpose": "bridge.py changes approve"}
        return "hmac-sha256:" + hmac.new(key, canonical_json(_canonical_safe(signed)),
                                         hashlib.sha256).hexdigest()

    def approval_problem(self, cs_id, approval):
        """Why `approval` (from 05-status.json) was not made by `approve` for this change set
        and plan, or None when its MAC verifies."""
        import hmac
        if not isinstance(approval, dict) or not isinstance(approval.get("mac"), str):
            return "the status says approved but carries no approval MAC: not made by " \
                   "`bridge.py changes approve`"
        key = self.approval_key()
        if key is None:
            return "no approval key at %s to verify the approval with (approve and run share " \
                   "it: the same user, or changes.approval_key)" % self.approval_key_path()
        expected = self.approval_mac(key, cs_id, approval).encode("ascii")
        if not hmac.compare_digest(approval["mac"].encode("utf-8"), expected):
            return "the approval MAC does not verify: it was not made by `bridge.py changes " \
                   "approve` for this change set and plan"
        return None

    # -- offline checks --
    def load(self, cs_id):
        """(meta, plan, problems) after every offline check: schema, folder name vs the id
        recomputed from 00-meta.json, plan_sha256 vs the plan's canonical bytes."""
        problems = []
        meta = plan = None
        try:
            safe_name(cs_id, "change set id")
        except BridgeError as exc:
            return None, None, [("integrity_mismatch", str(exc))]
        meta_path, plan_path = self.path(cs_id, CS_META), self.path(cs_id, CS_PLAN)
        try:
            meta = read_canonical_file(meta_path, CS_META)
        except BridgeError as exc:
            problems.append(("invalid_meta", str(exc)))
        if meta is not None:
            mp = changeset_meta_problems(meta)
            problems.extend(mp)
            if not mp:
                identity = {k: meta[k] for k in ("base_state", "protocol", "repo_key",
                                                 "subject")}
                ok_names = (changeset_id(identity), changeset_id(identity, 16))
                if cs_id not in ok_names:
                    problems.append(("integrity_mismatch",
                                     "folder name %s does not match the id recomputed from "
                                     "00-meta.json (%s)" % (cs_id, ok_names[0])))
        try:
            plan = read_canonical_file(plan_path, CS_PLAN)
        except BridgeError as exc:
            problems.append(("invalid_plan", str(exc)))
        if plan is not None:
            base = meta.get("base_state") if isinstance(meta, dict) else None
            base_kind = base.get("kind") if isinstance(base, dict) else None
            if (isinstance(meta, dict) and isinstance(meta.get("plan_sha256"), str)):
                actual = canonical_sha256(plan)
                if actual != meta["plan_sha256"]:
                    problems.append(("plan_tampered",
                                     "plan_sha256 in 00-meta.json is %s but the plan hashes "
                                     "to %s" % (meta["plan_sha256"][:16], actual[:16])))
            problems.extend(changeset_plan_problems(plan, base_kind, cs_id))
            problems.extend(self.patch_paths(plan)[1])
            if (base_kind == "snapshot" and isinstance(plan.get("prerequisites"), dict)
                    and plan["prerequisites"].get("base_snapshot_id") not in
                    (None, meta["base_state"]["id"])):
                problems.append(("invalid_plan", "prerequisites.base_snapshot_id is not "
                                 "base_state.id"))
        if isinstance(meta, dict) and isinstance(meta.get("artifact_manifest"), dict):
            import hashlib
            for name, digest in sorted(meta["artifact_manifest"].items()):
                try:
                    data = read_input(self.path(cs_id, safe_name(name, "artifact")), "artifact")
                    actual = hashlib.sha256(data).hexdigest()
                except BridgeError as exc:
                    problems.append(("integrity_mismatch", "artifact %s: %s" % (name, exc)))
                    continue
                if actual != digest.split(":")[-1]:
                    problems.append(("integrity_mismatch", "artifact %s does not match "
                                     "artifact_manifest" % name))
        return meta, plan, problems

    def patch_paths(self, plan):
        """({task index: paths}, problems) for the plan's workspace.apply_patch tasks: the
        paths git will write (changeset_patch_paths), each one checked by forbidden_path."""
        found, problems = {}, []
        tasks = plan.get("tasks") if isinstance(plan, dict) else None
        for i, task in enumerate(tasks if isinstance(tasks, list) else ()):
            if not isinstance(task, dict) or task.get("tool") != "workspace.apply_patch":
                continue
            params = task.get("params") if isinstance(task.get("params"), dict) else {}
            patch, strip = params.get("patch"), params.get("strip", 1)
            if not isinstance(patch, str) or not patch or not changeset_strip_ok(strip):
                continue  # changeset_plan_problems reports these
            try:
                found[i] = changeset_patch_paths(self.root, patch, strip)
            except BridgeError as exc:
                problems.append(("invalid_patch", "tasks[%d]: %s" % (i, exc)))
                continue
            for path in found[i]:
                why = self.forbidden_path(path)
                if why:
                    problems.append(("forbidden_path", "tasks[%d] patches %s: %s"
                                     % (i, path, why)))
        return found, problems

    def rule_files(self):
        """bridge.config.json, the config file in use and bridge.py itself, as case-folded
        paths relative to the root (those inside the repository)."""
        root = os.path.realpath(self.root)
        rel = [os.path.relpath(os.path.realpath(os.path.join(root, p)), root) for p in (
            CONFIG_FILE_NAME, self.config.get("_source") or "", os.path.abspath(__file__))]
        return {_fold_name(p.replace(os.sep, "/")) for p in rel
                if p not in (".", os.pardir) and not p.startswith(os.pardir + os.sep)}

    def forbidden_path(self, path):
        """Why a patch may not touch `path` (relative to the root, as git names it), or None:
        outside the repository, inside .git or changes/ (the executor's records and other
        change sets), or at or through a symlink in the repository. Names are compared as a
        case-insensitive file system (macOS) would resolve them (_fold_name)."""
        parts = path.split("/")
        if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            return "outside the repository"
        folded = [_fold_name(p) for p in parts]
        if ".git" in folded:
            return "inside .git/"
        if "/".join(folded) in self.rule_files():
            return "bridge.py's own code or configuration, which set the rules every change " \
                   "set is judged by"
        own = os.path.relpath(self.dir, self.root).replace(os.sep, "/")
        if folded[:len(own.split("/"))] == _fold_name(own).split("/"):
            return "inside %s/ (change sets and the executor's records)" % own
        current = self.root
        for part in parts:
            current = os.path.join(current, part)
            try:
                if stat.S_ISLNK(os.lstat(current).st_mode):
                    return "through the symlink %s" % os.path.relpath(current, self.root)
            except FileNotFoundError:
                return None
            except OSError as exc:
                return "cannot be checked: %s" % (exc.strerror or exc)
        return None

    def state_of(self, cs_id):
        """(state, decision, reason) for display: the status file, else draft/ready."""
        try:
            status = self.read_status(cs_id)
        except BridgeError as exc:
            return "unknown", None, str(exc)
        if status is not None:
            return status["state"], status.get("decision"), status.get("reason")
        if all(os.path.exists(self.path(cs_id, name)) for name in (CS_META, CS_PLAN)):
            return "ready", None, "waiting for the executor"
        return "draft", None, "00-meta.json or 02-implementation-plan.json missing"

    # -- base state --
    def base_state(self, snapshot=None, worktree=False):
        """{"kind": "snapshot", "id": snapshot} for --snapshot ID; else {"kind": "worktree",
        "id": sha256 of the canonical JSON of snapshot.info's fingerprint}; servers without
        snapshot.info anchor to a new snapshot (unless --worktree: then that is the McpError)."""
        if snapshot:
            return {"kind": "snapshot", "id": str(snapshot)}
        if not self.mcp_configured():
            raise BridgeError("a worktree base state comes from the MCP server's snapshot.info: "
                              "set changes.mcp.command, or pass --snapshot ID", EXIT_USAGE)
        self.ensure_excluded()
        with self.client() as client:
            client.start()
            try:
                return {"kind": "worktree", "id": self.worktree_fingerprint(client)}
            except McpError as exc:
                if exc.mcp_code != -32601 or worktree:
                    raise
            snap = client.call_tool("snapshot.create", {"repo_root": self.root})
        if not isinstance(snap, dict) or not snap.get("snapshot_id"):
            raise BridgeError("snapshot.create returned no snapshot_id", EXIT_FAILED)
        return {"kind": "snapshot", "id": str(snap["snapshot_id"])}

    def worktree_fingerprint(self, client):
        info = client.call_tool("snapshot.info", {"repo_root": self.root})
        fp = info.get("fingerprint") if isinstance(info, dict) else None
        if not isinstance(fp, dict):
            raise BridgeError("snapshot.info returned no fingerprint object", EXIT_FAILED)
        try:
            return canonical_sha256(fp)
        except CanonicalJSONError as exc:  # the id is a hash of canonical JSON: no floats
            raise BridgeError("snapshot.info returned a fingerprint that canonical JSON cannot "
                              "hold, so no worktree base state can be derived from it (%s); "
                              "pass --snapshot ID to anchor to a snapshot" % exc, EXIT_FAILED)

    def stale_base(self, client, base):
        """Why `base` is no longer the repository's state (the worktree fingerprint moved, or
        the snapshot is gone), or None."""
        if base["kind"] == "worktree":
            current = self.worktree_fingerprint(client)
            if current == base["id"]:
                return None
            return "the worktree fingerprint is %s, the plan was made against %s; re-plan " \
                   "under a new id" % (current[:16], base["id"][:16])
        try:
            client.call_tool("snapshot.info", {"repo_root": self.root, "snapshot_id": base["id"]})
        except McpError as exc:
            return "snapshot %s is not available: %s" % (base["id"], exc)
        return None

    # -- validation against the server --
    def check_online(self, client, meta, plan):
        """Alignment, governance, impact. Returns (outcome, code, reason, details):
        outcome is "reject", "review" or "auto"."""
        base = meta["base_state"]
        kind = base["kind"]
        details = {"server": (client.server_info or {}).get("serverInfo")}
        rejects = []  # every reason to reject, so `validate` can print them all
        stale = self.stale_base(client, base)
        if stale and kind == "snapshot":  # nothing else can be checked against it
            return ("reject", "stale_base", stale, details)
        if stale:
            rejects.append(("stale_base", stale))
        found, problems = self.patch_paths(plan)  # again: the worktree may have changed
        rejects.extend(problems)
        paths = sorted(set(p for task_paths in found.values() for p in task_paths))
        details["changed_paths"] = paths
        args = {"repo_root": self.root, "intent": "edit", "mode": kind, "changed_paths": paths}
        if kind == "snapshot":
            args["snapshot_id"] = base["id"]
        pre = client.call_tool("gov.preflight", args)
        if not isinstance(pre, dict):
            raise BridgeError("gov.preflight returned %s, not an object" % type(pre).__name__,
                              EXIT_FAILED)
        tier, violations = pre.get("safety_tier"), pre.get("violations") or []
        details.update(safety_tier=tier, preflight_violations=violations)
        errors = [v for v in violations if not isinstance(v, dict)
                  or v.get("severity") != "warning"]
        if tier == "tier3" or errors:
            rejects.append(("tier3", "gov.preflight: Tier 3 change (never approvable): %s"
                            % _violation_text(violations)))
        elif tier not in ("tier1", "tier2"):
            raise BridgeError("gov.preflight returned an unknown safety_tier %r" % (tier,),
                              EXIT_FAILED)
        drift = client.call_tool("gov.drift", {"repo_root": self.root})
        if isinstance(drift, dict):
            drift = drift.get("violations") or []
        if drift:
            details["drift"] = drift
            rejects.append(("gov_drift", "gov.drift reports %d violation(s): %s"
                            % (len(drift), _violation_text(drift))))
        if rejects:
            details["problems"] = ["%s: %s" % r for r in rejects]
            code, reason = rejects[0]
            if len(rejects) > 1:
                reason += " (+ %s)" % ", ".join(c for c, _ in rejects[1:])
            return ("reject", code, reason, details)
        touched, details["impact_source"] = self.impact(client, paths, base)
        details["touched_features"] = touched
        critical = sorted(set(touched) & set(self.cfg["critical_features"]))
        reasons = []
        if tier == "tier2":
            reasons.append("gov.preflight: Tier 2 change")
        if violations:
            reasons.append("gov.preflight warnings: %s" % _violation_text(violations))
        if critical:
            reasons.append("touches critical feature(s) %s" % ", ".join(critical))
        if reasons:
            return ("review", "review_required", "; ".join(reasons) +
                    " -- approve with `bridge.py changes approve ID`", details)
        return ("auto", "auto", "Tier 1, no drift, no critical feature touched", details)

    def impact(self, client, paths, base):
        """Feature ids touched by `paths`: features.impact, or where the server does not offer
        it (-32601, axiomregent) the same intersection computed from features.overview."""
        args = {"repo_root": self.root, "changed_paths": paths}
        if base["kind"] == "snapshot":
            args["snapshot_id"] = base["id"]
        try:
            res = client.call_tool("features.impact", args)
            if isinstance(res, dict):
                res = res.get("features") or res.get("feature_ids") or []
            return sorted(set(str(x) for x in res)), "features.impact"
        except McpError as exc:
            if exc.mcp_code != -32601:
                raise
        overview = client.call_tool("features.overview", {"repo_root": self.root})
        if not isinstance(overview, dict):
            raise BridgeError("features.overview returned %s, not an object"
                              % type(overview).__name__, EXIT_FAILED)
        touched = set()
        for feat in overview.get("features") or []:
            if not isinstance(feat, dict):
                continue
            files = [feat.get("spec_path")] + list(feat.get("impl_files") or []) + \
                list(feat.get("test_files") or [])
            files = [f.strip("/") for f in files if isinstance(f, str) and f]
            if any(p == f or p.startswith(f + "/") for f in files for p in paths):
                touched.add(str(feat.get("feature_id")))
        return sorted(touched), "features.overview"


def _fold_name(name):
    """`name` as macOS compares file names: case folded, without the code points HFS+
    ignores (U+200C..U+200F, U+202A..U+202E, U+206A..U+206F, U+FEFF: the set git's
    core.protectHFS knows), so `.GIT` and `chan<U+200C>ges` are `.git` and `changes`."""
    return re.sub("[\u200c-\u200f\u202a-\u202e\u206a-\u206f\ufeff]", "", name).casefold()


def _canonical_safe(value):
    """`value` with everything canonical JSON refuses turned into strings."""
    if isinstance(value, dict):
        return {_canonical_safe(str(k)): _canonical_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical_safe(v) for v in value]
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate: "?"
    if value is None or isinstance(value, bool) or (
            isinstance(value, int) and -CS_MAX_SAFE_INT <= value <= CS_MAX_SAFE_INT):
        return value
    if isinstance(value, int) and value.bit_length() >= 256:
        return "<integer of %d bits>" % value.bit_length()
    return str(value)


def _five_of(items, describe):
    """Up to five of a server's `items` on one line (a dict through `describe`)."""
    parts = [describe(item) if isinstance(item, dict) else str(item) for item in items[:5]]
    parts += ["... %d more" % (len(items) - 5)] if len(items) > 5 else []
    return "; ".join(p.strip() for p in parts) or "(none listed)"


def _violation_text(violations):
    return _five_of(violations, lambda v: "%s %s" % (
        v.get("code"), v.get("path") or v.get("feature_id") or ""))


# ---- the executor ---------------------------------------------------------------------------

class ChangeExecutor:
    """The trusted local executor: one change set at a time, under
    changes/.locks/worktree.lock, each with its own MCP server process."""

    def __init__(self, sets):
        self.sets = sets
        self.lock = None
        self.stopping = False
        self.skipped = set()  # unreadable statuses already reported by this process

    def acquire(self):
        self.lock = FileLock(self.sets.own_file(self.sets.lock_path),
                             meta={"command": "changes run", "root": self.sets.root})
        if not self.lock.acquire():
            raise BridgeError("another executor holds %s: %s" % (
                self.sets.lock_path, describe_holder(self.lock.holder)), EXIT_LOCKED)
        if self.lock.recovered:
            self.sets.say("recovered the executor lock from a dead holder: %s"
                          % describe_holder(self.lock.recovered))
            self.sets.record(None, "lock_recovered", holder=self.lock.recovered)
        self.sets.ensure_excluded()

    def run_once(self):
        """One pass over every change set. Returns the list of (id, final state) processed."""
        sets = self.sets
        done = []
        self.apply_supersessions()
        for cs_id in sets.ids():
            if self.stopping:
                break
            self.lock.heartbeat()
            try:
                final = self.process(cs_id)
            except (BridgeError, OSError):
                raise  # configuration, lock or disk: stop before deciding anything
            except Exception as exc:  # one change set that trips a bug must not stop the rest
                import traceback
                reason = "internal_error: %s: %s" % (type(exc).__name__, exc)
                sets.record(cs_id, "internal_error", reason=reason,
                            traceback=traceback.format_exc()[-4000:])
                final = self.fail(cs_id, "rejected", reason)
            if final:
                done.append((cs_id, final))
        return done

    def fail(self, cs_id, decision, reason, **fields):
        """Record the change set as failed (05-status.json, the log, stderr); "failed"."""
        status = self.sets.write_status(cs_id, "failed", decision, reason, **fields)
        self.sets.say("%s: failed: %s" % (cs_id, status["reason"]))
        return "failed"

    def apply_supersessions(self):
        """A valid, unprocessed change set naming `supersedes` retires those ids first."""
        sets = self.sets
        for cs_id in sets.ids():
            try:
                if sets.read_status(cs_id) is not None:
                    continue
            except BridgeError:
                continue
            if not os.path.exists(sets.path(cs_id, CS_PLAN)):
                continue
            meta, plan, problems = sets.load(cs_id)
            if problems or not meta.get("supersedes"):
                continue
            for old in meta["supersedes"]:
                try:
                    if not os.path.isdir(sets.path(old)):
                        continue
                    status = sets.read_status(old)
                except BridgeError:
                    continue
                if status is not None and status["state"] in CS_TERMINAL + ("executing",):
                    continue
                sets.write_status(old, "superseded", "rejected", "superseded by %s" % cs_id,
                                  meta=sets.load(old)[0], prev=status)

    def process(self, cs_id):
        sets = self.sets
        try:
            status = sets.read_status(cs_id)
        except BridgeError as exc:
            if cs_id not in self.skipped:  # once per process, not on every poll
                self.skipped.add(cs_id)
                sets.record(cs_id, "skipped", reason="unreadable status: %s" % exc)
                sets.say("%s: skipped: %s" % (cs_id, exc))
            return None
        if status is None:
            if not all(os.path.exists(sets.path(cs_id, name)) for name in (CS_META, CS_PLAN)):
                return None  # draft: the agent is still writing it
            return self.validate_and_run(cs_id, None)
        state = status["state"]
        if state in ("ready", "draft", "validating"):
            return self.validate_and_run(cs_id, status)
        if state == "pending_review" and status.get("decision") == "approved":
            return self.validate_and_run(cs_id, status, approved=True)
        if state == "executing":
            # We hold the worktree lock, so whoever was executing died mid-way.
            task = (status.get("execution") or {}).get("started_task_id")
            return self.fail(cs_id, status.get("decision") or "auto",
                             "interrupted: the executor stopped during task %s; the worktree "
                             "may hold part of this change set" % task, prev=status)
        return None

    def validate_and_run(self, cs_id, status, approved=False):
        sets = self.sets
        meta, plan, problems = sets.load(cs_id)
        decision = "approved" if approved else "auto"
        if problems:
            code, msg = problems[0]
            more = " (+%d more problem(s); see `changes validate %s`)" % (
                len(problems) - 1, cs_id) if len(problems) > 1 else ""
            return self.fail(cs_id, "rejected", "%s: %s%s" % (code, msg, more), meta=meta,
                             prev=status, problems=["%s: %s" % p for p in problems])
        if approved:
            approval = status.get("approval")
            code, why = "forged_approval", sets.approval_problem(cs_id, approval)
            if not why and approval["plan_sha256"] != meta["plan_sha256"]:
                code, why = "plan_tampered", "the plan changed after it was approved"
            if why:
                sets.record(cs_id, code, reason=why)
                return self.fail(cs_id, "rejected", "%s: %s" % (code, why), meta=meta, prev=status)
        client = sets.client()  # a configuration error stops here, before any status moves
        status = sets.write_status(cs_id, "validating", decision,
                                   "validating against the MCP server", meta=meta, prev=status)
        try:
            client.start()
            outcome, code, reason, details = sets.check_online(client, meta, plan)
            if outcome == "reject":
                return self.fail(cs_id, "rejected", "%s: %s" % (code, reason), meta=meta,
                                 prev=status, validation=details)
            if outcome == "review" and not approved:
                status = sets.write_status(cs_id, "pending_review", "review_required",
                                           reason, meta=meta, prev=status, validation=details)
                sets.say("%s: pending_review: %s" % (cs_id, reason))
                return "pending_review"
            return self.execute(client, cs_id, meta, plan, status, decision, details)
        except Exception as exc:  # nothing may leave a change set silently half-decided
            return self.fail(cs_id, status["decision"], _failure_text(exc), meta=meta, prev=status)
        finally:
            client.close()

    def execute(self, client, cs_id, meta, plan, status, decision, details):
        sets = self.sets
        base = meta["base_state"]
        execution = {"started_task_id": None, "completed_task_ids": [], "last_error": None}
        status = sets.write_status(cs_id, "executing", decision,
                                   "executing %d task(s)" % len(plan["tasks"]), meta=meta,
                                   prev=status, validation=details, execution=execution)
        lease_id = None
        snapshot_id = base["id"] if base["kind"] == "snapshot" else None
        results = []
        try:
            if base["kind"] == "worktree" and any(t["tool"] == "workspace.apply_patch"
                                                  for t in plan["tasks"]):
                # Leases live in the server process; take one now and keep the process.
                listing = client.call_tool("snapshot.list", {"repo_root": sets.root})
                lease_id = listing.get("lease_id") if isinstance(listing, dict) else None
                if not lease_id:  # snapshot.create issues leases too
                    snap = client.call_tool("snapshot.create", {"repo_root": sets.root})
                    lease_id = snap.get("lease_id") if isinstance(snap, dict) else None
            for task in plan["tasks"]:
                self.lock.heartbeat()
                execution["started_task_id"] = task["id"]
                status = sets.write_status(cs_id, "executing", decision, "running task %s (%s)"
                                           % (task["id"], task["tool"]), meta=meta, prev=status,
                                           execution=execution)
                params = dict(task.get("params") or {})
                params["repo_root"] = sets.root  # never a path the plan chose
                timeout = None
                if task["tool"] == "workspace.apply_patch":
                    params["mode"] = base["kind"]
                    params.pop("lease_id", None)
                    params.pop("snapshot_id", None)
                    if lease_id:
                        params["lease_id"] = lease_id
                    if snapshot_id and base["kind"] == "snapshot":
                        params["snapshot_id"] = snapshot_id
                    timeout = sets.cfg["mcp"]["apply_timeout_sec"]
                result = client.call_tool(task["tool"], params, timeout=timeout)
                if task["tool"] == "workspace.apply_patch":
                    rejects = result.get("rejects") if isinstance(result, dict) else None
                    if rejects:
                        raise Stop("failed", "patch_rejected", "task %s: the server rejected %s"
                                   % (task["id"], _rejects_text(rejects)))
                    if not isinstance(result, dict):
                        raise Stop("failed", "mcp_error", "task %s: workspace.apply_patch "
                                   "returned no result object" % task["id"])
                    lease_id = result.get("lease_id") or lease_id
                    if base["kind"] == "snapshot" and result.get("snapshot_id"):
                        snapshot_id = result["snapshot_id"]
                    results.append({"task_id": task["id"], "applied": [
                        a.get("path") for a in result.get("applied") or []
                        if isinstance(a, dict)]})
                else:
                    results.append({"task_id": task["id"], "tool": task["tool"]})
                execution["completed_task_ids"].append(task["id"])
        except (Stop, BridgeError) as exc:
            execution["last_error"] = _failure_text(exc)
            return self.fail(cs_id, decision, execution["last_error"], meta=meta, prev=status,
                             execution=execution)
        execution["started_task_id"] = None
        extra = {"execution": execution, "results": results}
        if base["kind"] == "snapshot":
            extra["result_snapshot_id"] = snapshot_id
        status = sets.write_status(cs_id, "completed", decision, "applied %d task(s)"
                                   % len(plan["tasks"]), meta=meta, prev=status, **extra)
        sets.say("%s: completed (%s)" % (cs_id, decision))
        return "completed"


def _failure_text(exc):
    """`code: message` for what stopped a change set's work: a task's Stop, the MCP server
    gone, a stale lease or any other MCP error, or a bug in bridge.py (internal_error)."""
    if isinstance(exc, Stop):
        return "%s: %s" % (exc.reason, exc.detail)
    if isinstance(exc, McpServerGone):
        return "mcp_server_gone: %s" % exc
    if isinstance(exc, BridgeError):
        return "%s: %s" % ("stale_lease" if getattr(exc, "mcp_code", None) == "STALE_LEASE"
                           else "mcp_error", exc)
    return "internal_error: %s: %s" % (type(exc).__name__, exc)


def _rejects_text(rejects):
    return _five_of(rejects, lambda rej: "%s (%s)" % (rej.get("path"), ", ".join(sorted(
        {str(h.get("reason")) for h in rej.get("hunks") or [] if isinstance(h, dict)}))
        or "rejected"))


# ---- creating and approving change sets ---------------------------------------------------

def changeset_task_list(cs_id, title, plan, paths):
    """03-task-list.md: the human checklist derived from the plan (never edited by hand)."""
    lines = ["# Task list: %s" % (title or cs_id), "",
             "Change set `%s`. Derived from `%s`; regenerate it instead of editing it." % (
                 cs_id, CS_PLAN), ""]
    for i, task in enumerate(plan.get("tasks") or []):
        risk = task.get("risk_profile") or {}
        bits = ["impact %s" % risk.get("impact_score", "?")]
        if risk.get("touched_features"):
            bits.append("features: " + ", ".join(risk["touched_features"]))
        if risk.get("destructive"):
            bits.append("destructive")
        line = "- [ ] `%s` %s (%s)" % (task.get("id"), task.get("tool"), "; ".join(bits))
        if task.get("description"):
            line += " - " + " ".join(str(task["description"]).split())
        if paths.get(i):
            line += "\n  - files: " + ", ".join("`%s`" % p for p in paths[i])
        lines.append(line)
    return "\n".join(lines) + "\n"


def changeset_new(sets, subject, plan_path, arch_path=None, snapshot=None, worktree=False):
    """Create (or idempotently rewrite) changes/<id>/. Returns the id.

    The files are built in a hidden temporary folder inside changes/ and renamed into place,
    so a failure never leaves a half-made change set behind."""
    check_text(subject, "--subject")
    check_text(snapshot, "--snapshot")
    if not str(subject).strip():
        raise BridgeError("--subject must not be empty", EXIT_USAGE)
    json_problems = []  # every problem of the plan is listed at once
    plan = read_canonical_file(plan_path, problems=json_problems)
    arch = None
    if arch_path:
        try:
            arch = read_input(arch_path, "architecture file").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BridgeError("cannot read %s: %s" % (arch_path, exc))
    def check(problems):
        if problems:
            raise BridgeError("%s is not a valid %s plan (%d problem(s)): %s" % (
                plan_path, PLAN_VERSION, len(problems),
                "; ".join("%s: %s" % p for p in problems)), EXIT_USAGE)

    paths, path_problems = sets.patch_paths(plan)
    check([("invalid_plan", p) for p in json_problems] + changeset_plan_problems(plan)
          + path_problems)  # before starting any server
    base = sets.base_state(snapshot, worktree)
    check(changeset_plan_problems(plan, base["kind"]))
    identity = changeset_identity(subject, changeset_repo_key(sets.root), base)
    title = " ".join(str(subject).split())  # for 03-task-list.md; not part of the meta
    supersedes = []
    for length in (12, 16):
        cs_id = changeset_id(identity, length)
        plan = dict(plan, change_set_id=cs_id)
        meta = dict(identity, plan_sha256=canonical_sha256(plan))
        if supersedes:
            meta["supersedes"] = supersedes
        meta_path = sets.path(cs_id, CS_META)
        if not os.path.exists(meta_path) or read_input(meta_path) == canonical_json(meta):
            break
        if length == 16:
            raise BridgeError(
                "change set ids %s and %s are both taken by other plans for the same subject "
                "and base; change the subject or re-plan on a new base"
                % (changeset_id(identity, 12), cs_id), EXIT_FAILED)
        supersedes = [cs_id]  # same identity, different plan: the new plan supersedes it
    try:
        status = sets.read_status(cs_id)
    except BridgeError:
        status = {"state": "unknown", "decision": None}
    if status is not None and (status.get("state") not in ("draft", "ready", "pending_review")
                               or status.get("decision") == "approved"):
        raise BridgeError("change set %s is already %s (%s); it is immutable: an edited plan "
                          "gets a new id" % (cs_id, status.get("state"), status.get("decision")),
                          EXIT_FAILED)
    import shutil
    # Everything that can fail (serialising, encoding, writing) happens in a hidden folder
    # that ids() skips; the set appears complete or not at all.
    files = [(CS_PLAN, canonical_json(plan)),
             (CS_TASKS, changeset_task_list(cs_id, title, plan, paths).encode("utf-8"))]
    if arch is not None:
        files.append((CS_ARCH, arch.encode("utf-8")))
    # The meta goes last: its presence with the plan is what makes the change set READY.
    files.append((CS_META, canonical_json(meta)))
    make_dirs(sets.dir, sets.top)
    tmp = os.path.join(sets.dir, ".new-%s.%s" % (cs_id, random_hex()))
    os.mkdir(tmp)
    try:
        for name, data in files:
            atomic_write(os.path.join(tmp, name), data)
        target = sets.path(cs_id)
        try:
            os.rename(tmp, target)  # a new change set: one rename
        except OSError:
            if not os.path.isdir(target):
                raise
            # An existing draft (or the same set again): each file replaced whole, meta last.
            for name, _ in files:
                os.replace(os.path.join(tmp, name), os.path.join(target, name))
        _fsync_dir(target)
        _fsync_dir(sets.dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sets.record(cs_id, "created", subject=identity["subject"], base_state=base,
                plan_sha256=meta["plan_sha256"], supersedes=supersedes)
    return cs_id


def approver_name(root):
    """Who runs `approve`: $USER, else the name of our uid, else git's user.name (containers
    often have neither a $USER nor a passwd entry), else `uid N`."""
    name = os.environ.get("USER") or os.environ.get("LOGNAME")
    if not name:
        try:
            import pwd
            name = pwd.getpwuid(os.getuid()).pw_name
        except (ImportError, KeyError):
            res = Git(root).run("config", "user.name", check=False)
            name = res.stdout.strip() if res.ok else ""
    return name or "uid %d" % os.getuid()


def changeset_approve(sets, cs_id):
    """Tier-2 human approval: pending_review -> approved; the next run executes it. Returns
    (status, changed, paths): `paths`, the files the plan's patches write as git reads them
    now, is what the approval covers (the task list and status are the agent's to rewrite)."""
    sets.existing(cs_id)
    with sets.status_lock():
        status = sets.read_status(cs_id)
        if status is None:
            raise BridgeError("%s has not been validated yet: run `bridge.py changes run` first"
                              % cs_id, EXIT_FAILED)
        if status["state"] == "pending_review" and status.get("decision") == "approved":
            return status, False, []
        if status["state"] != "pending_review" or status.get("decision") != "review_required":
            never = str(status.get("reason", "")).startswith("tier3")
            raise BridgeError("%s is %s (%s), not waiting for review%s" % (
                cs_id, status["state"], status.get("decision"),
                "; Tier 3 changes can never be approved" if never else ""), EXIT_FAILED)
        meta, plan, problems = sets.load(cs_id)
        if problems:
            raise BridgeError("%s no longer passes its checks (%s: %s); not approved" % (
                cs_id, problems[0][0], problems[0][1]), EXIT_FAILED)
        validated = status.get("validated_against")  # the agent can write it too: any shape
        if not isinstance(validated, dict) or validated.get("plan_sha256") != meta["plan_sha256"]:
            raise BridgeError("%s: the plan changed since it was validated; not approved"
                              % cs_id, EXIT_FAILED)
    paths = sorted(set(p for found in sets.patch_paths(plan)[0].values() for p in found))
    user = approver_name(sets.root)
    approval = {"approved_at": now_iso(), "by": user, "plan_sha256": meta["plan_sha256"]}
    approval["mac"] = sets.approval_mac(sets.approval_key(create=True), cs_id, approval)
    status = sets.write_status(cs_id, "pending_review", "approved",
                               "approved by %s (Tier 2); the next `changes run` executes it"
                               % user, meta=meta, prev=status, approval=approval)
    return status, True, paths


# =============================================================================
# 7. CLI
# =============================================================================

def poll_seconds(text):
    """The type of --poll: seconds, in the range poll_sec and changes.poll_sec have."""
    import argparse
    try:
        return check_number("SECONDS", float(text), POLL_RANGE)
    except BridgeError as exc:
        raise argparse.ArgumentTypeError(exc.message)


def spec(*values, **options):
    """One row of the command table (build_parser): the values and options of a call to
    add_command, or of an argument to argparse's add_argument."""
    return values, options


def add_command(subparsers, name, func, help, example, *arguments, description=None,
                config=True):
    """Register a subcommand: the options every command takes (--root, and --config unless
    config=False), then its `arguments` (spec()s; a list of them is a mutually exclusive
    group), its help and an example."""
    import argparse
    parser = subparsers.add_parser(
        name, help=help, description=description or help,
        epilog="example:\n  " + example.strip().replace("\n", "\n  "),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", metavar="DIR",
                        help="repository root (default: git top level of the current directory)")
    if config:
        parser.add_argument("--config", metavar="FILE",
                            help="config file (default: ROOT/bridge.config.json)")
    for argument in arguments:
        group = parser.add_mutually_exclusive_group() if isinstance(argument, list) else parser
        for names, options in argument if isinstance(argument, list) else [argument]:
            group.add_argument(*names, **options)
    parser.set_defaults(func=func)
    return parser


def add_group(subparsers, name, help, description, examples, metavar, verbs):
    """A command with verbs (`hooks install`): each of `verbs` is a spec() of add_command.
    Without a verb it prints its help and exits 2."""
    import argparse
    top = subparsers.add_parser(
        name, help=help, description=description, epilog="examples:\n  " + "\n  ".join(examples),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest=name + "_verb", metavar=metavar)
    top.set_defaults(func=lambda args: (top.print_help(sys.stderr), EXIT_USAGE)[1])
    for values, options in verbs:
        add_command(sub, *values, **options)


def load_args_config(args):
    """(root, config) for a parsed command line: the common start of every cmd_*."""
    root = find_root(getattr(args, "root", None))
    return root, load_config(root, getattr(args, "config", None))


# ---- kernel commands ----
def cmd_redact(args):
    _root, config = load_args_config(args)
    stream = get_redactor(config).stream()
    fd, out = sys.stdin.fileno(), sys.stdout.buffer
    while True:  # a reader that goes away (`... | head`) ends it in main()
        chunk = os.read(fd, 1 << 20)
        data = stream.feed(chunk) if chunk else stream.close()
        if data:
            out.write(data)
            out.flush()
        if not chunk:
            return EXIT_OK


# ---- watch commands ----
def cmd_init(args):
    root = find_root(args.root)
    for line in handoff_init(root) or ["%s/ already set up" % HANDOFF_DIR]:
        print(line)
    return EXIT_OK


def cmd_submit(args):
    root, config = load_args_config(args)
    task_id, attempt = submit_task(root, args.task, retry=args.retry, config=config)
    print("queued %s (attempt %s) in %s/tasks/" % (task_id, attempt, HANDOFF_DIR))
    return EXIT_OK


def cmd_watch(args):
    root, config = load_args_config(args)
    return Watcher(root, config, poll=args.poll, once=args.once).run()


def cmd_status(args):
    root, config = load_args_config(args)
    report = queue_status(root, config)
    if args.json:  # ASCII only: an agent-written name or reason cannot drive the terminal
        print(json.dumps(report, indent=2))
        return EXIT_OK
    print("queued %(queued)d  running %(running)d  pending %(pending)d  failed/ %(failed)d"
          % report)
    print(printable("results: " + (", ".join(
        "%s %d" % item for item in sorted(report["results"].items())) or "none")))
    worker = report["worker"]
    print("watcher: " + ("running, %s" % describe_holder(worker) if worker else "not running"))
    # results and task names are agent-writable: control characters spelled out (printable)
    if report["recent_failures"]:
        print("recent failures:")
        for item in report["recent_failures"]:
            print(printable("  %s  %s/%s  %s" % (
                item.get("id"), item.get("exit_path"), item.get("reason"),
                str(item.get("detail") or "")[:160])))
    if report["waiting"]:
        print("held back by their dependencies:")
    for item in report["waiting"]:
        print(printable("  %s %s" % (item["id"], item["detail"] if item["state"] == "waiting"
                                     else "will be blocked: " + item["detail"])))
    for item in report["skipped_in_tasks"]:
        print(printable("skipped in tasks/: %s (%s)" % (item["name"], item["reason"])))
    for item in report["worktrees"]:
        print(printable("worktree %s: %s" % (item["path"], item["why"])))
    return EXIT_OK


def cmd_approve(args):
    root, _config = load_args_config(args)
    task = approve_task(root, args.id)
    print("approved %s at %s; the next `bridge.py watch` runs it" % (
        task["id"], task["approved_at"]))
    return EXIT_OK


def cmd_unlock(args):
    root, config = load_args_config(args)
    lines = [unlock_worker(root, force=args.force)] if args.force or not args.worktrees else []
    print("\n".join(lines + (remove_worktrees(root, config) if args.worktrees else [])))
    return EXIT_OK


# ---- seam commands ----
# The seam verbs keep the Go CLI's flag grammar (`--flag value` or `--flag=value`,
# the first occurrence wins) and print one JSON answer, so they are parsed here
# rather than by argparse; argparse only lists them in --help. seam_main() is
# also the fast entry point the hooks use (see the README): `egress emit` must
# start in the time Python takes to import json.

def _seam_drain(root, opts):
    host = opts.get("host", "").strip().lower()
    out = inbox_drain(root, opts.get("slug", ""), host, opts.get("session-id"),
                      _csv(opts.get("members")))
    # a heartbeat or acting acks not written: the records still go out, but the
    # exit says something is wrong with _bridge/ (out["error"] names the file)
    return out, EXIT_FAILED if out["status"] == "failed" or out.get("error") else EXIT_OK


def _seam_wake(root, opts):
    host = opts.get("host", "codex").strip().lower() or "codex"
    if host != "codex":
        return {"status": "failed",
                "error": "bridge ingress wake currently supports host codex only"}, EXIT_USAGE
    out = wake_codex(root, _csv(opts.get("members")), opts.get("codex-bin"))
    return out, {"locked": EXIT_LOCKED, "failed": EXIT_FAILED,
                 "partial": EXIT_FAILED}.get(out["status"], EXIT_OK)


# One row per seam verb: the help `bridge.py --help` shows (on a verb's first row), its
# usage, an example, its flags in the Go CLI's grammar (`tristate`: bare or true/false,
# `strict`: a value may not start with --), the answer it prints when it fails (the error
# is added), whether a failure exits 0 because it must never block the agent (`never_block`),
# and what it does: run(root, opts) -> (answer, exit code). egress emit and inbox check,
# the hooks, have their own paths (_cmd_egress_emit, _cmd_inbox_check).
SEAM_COMMANDS = {
    "egress": dict(
        help="record an agent hook payload in _bridge/events.jsonl (silent, exit 0)",
        usage="egress emit --host claude|codex|pi [--repo-root DIR]  < hook payload",
        example="echo '{\"hook_event_name\":\"PreToolUse\",\"session_id\":\"s1\"}' | "
                "python3 scripts/bridge.py egress emit --host claude",
        flags=("host",)),
    "inbox drain": dict(
        help="drain|ack|commit|check captain intent from _bridge/inbox.jsonl",
        usage="inbox drain --slug SLUG [--host H] [--session-id ID] [--members a,b] "
              "[--repo-root DIR]",
        example="python3 scripts/bridge.py inbox drain --slug fo-main",
        flags=("host", "slug", "session-id", "members"),
        failed={"status": "failed", "slug": "", "cursor": 0, "high_water": 0, "count": 0,
                "heartbeat": False, "records": None},
        run=_seam_drain),
    "inbox ack": dict(
        usage="inbox ack --slug SLUG --line N --kind tell|conn|decision|permission-decision "
              "--status STATUS (--id ID | --ts TS) [--text T] [--granted [true|false]] "
              "[--entity E] [--field F] [--value V] [--verdict V] [--request-id R] "
              "[--session-id ID] [--host H] [--repo-root DIR]",
        example="python3 scripts/bridge.py inbox ack --slug fo-main --line 3 --kind tell "
                "--status answered --id msg-17 --text 'shipped'",
        flags=("host", "slug", "line", "id", "ts", "kind", "status", "text", "entity", "field",
               "value", "verdict", "request-id", "session-id"), tristate=("granted",),
        failed={"appended": False},
        run=lambda root, opts: (inbox_ack(root, opts), EXIT_OK)),
    "inbox commit": dict(
        usage="inbox commit --slug SLUG --cursor N [--repo-root DIR]",
        example="python3 scripts/bridge.py inbox commit --slug fo-main --cursor 3",
        flags=("slug", "cursor"),
        failed={"cursor": 0},
        run=lambda root, opts: (inbox_commit(root, opts.get("slug", ""), opts.get("cursor", "")),
                                EXIT_OK)),
    "inbox check": dict(
        usage="inbox check [--host claude] [--slug SLUG] [--session-id ID] [--repo-root DIR]  "
              "< Stop payload",
        example="echo '{\"stop_hook_active\":false}' | python3 scripts/bridge.py inbox check "
                "--slug fo-main",
        flags=("host", "slug", "session-id")),
    "initiate": dict(
        help="push a status / reco / gate-review card to _bridge/fo-initiate.jsonl",
        usage="initiate --kind status|reco|gate-review --id ID --headline TEXT [--body TEXT] "
              "[--workflow W] [--entity E] [--ship-id S] [--host H] [--session-id ID] "
              "[--request-id R] [--repo-root DIR]",
        example="python3 scripts/bridge.py initiate --kind status --id st-1 "
                "--headline 'tests green on feat/x'",
        flags=("kind", "id", "headline", "workflow", "entity", "ship-id", "host", "session-id",
               "body", "request-id"), strict=True, never_block=True,
        failed={"queued": False},
        run=lambda root, opts: (initiate(root, opts), EXIT_OK)),
    "alert": dict(
        help="raise a permission alert in _bridge/fo-alerts.jsonl",
        usage="alert permission --reason TEXT [--id ID] [--command CMD] [--prefix-rule a,b] "
              "[--workflow W] [--entity E] [--host H] [--session-id ID] [--repo-root DIR]",
        example="python3 scripts/bridge.py alert permission --reason 'wants to run rm -rf build/'",
        flags=("id", "workflow", "entity", "host", "session-id", "reason", "command",
               "prefix-rule"),
        strict=True, never_block=True,
        failed={"queued": False},
        run=lambda root, opts: (alert_permission(root, opts), EXIT_OK)),
    "feed": dict(
        help="append ambient narration to _bridge/fo-feed.jsonl",
        usage="feed --verb dispatch|advance|complete --text TEXT [--entity E] [--workflow W] "
              "[--stage S] [--repo-root DIR]",
        example="python3 scripts/bridge.py feed --verb advance --text 'moved task 4 to review'",
        flags=("verb", "text", "entity", "workflow", "stage"), never_block=True,
        failed={"appended": False},
        run=lambda root, opts: (feed(root, opts), EXIT_OK)),
    "wake": dict(
        help="resume parked Codex sessions that have undelivered intent",
        usage="wake --host codex [--members a,b] [--codex-bin PATH] [--repo-root DIR]",
        example="python3 scripts/bridge.py wake --host codex",
        flags=("host", "members", "codex-bin"),
        failed={"status": "failed"},
        run=_seam_wake),
}


def parse_go_flags(argv, names, strict=False, tristate=()):
    """Parse flags as the Go `spacedock bridge` verbs do.

    `--flag value` or `--flag=value`; the first occurrence wins. Lenient mode
    takes the next word as the value even when it starts with `--`; strict mode
    (initiate, alert) calls that a missing value. Unknown flags and stray words
    are errors in both. A `tristate` flag is absent (not in the result), bare
    (True), or `--flag X` / `--flag=X` (True iff X is "true", case-insensitive).
    """
    names = set(names) | {"repo-root", "root"}
    values, index = {}, 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if not token.startswith("--") or token == "--":
            raise SeamFailure("unexpected positional argument: %s" % token)
        name, has_value, value = token[2:].partition("=")
        if name in tristate:
            if not has_value:
                if index < len(argv) and not argv[index].startswith("--"):
                    value, index = argv[index], index + 1
                else:
                    value = "true"
            values.setdefault(name, value.startswith("--") or value.lower() == "true")
            continue
        if name not in names:
            raise SeamFailure("unknown flag: --%s" % name)
        if not has_value:
            if index >= len(argv) or (strict and argv[index].startswith("--")):
                raise SeamFailure("missing value for --%s" % name)
            value, index = argv[index], index + 1
        values.setdefault(name, value)
    if "root" in values:
        values.setdefault("repo-root", values["root"])
    return values


def _seam_print(obj):
    sys.stdout.write(go_json(obj) + "\n")
    sys.stdout.flush()


def _csv(text):
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def seam_main(argv=None):
    """Run one seam verb; returns the exit code. Never shows a traceback.

    egress emit prints nothing and exits 0 whatever happens (BRIDGE_DEBUG=1 says
    why on stderr); inbox check prints {} on any failure and exits 0; initiate,
    alert and feed answer {"queued"/"appended": false, "error": ...} and exit 0
    (they must never block the agent); drain, ack, commit and wake exit 1 on
    failure (2 for usage), so `ack && commit` never advances past a failed ack.
    """
    import gc  # built in: costs nothing
    # Importing this module allocated thousands of objects that live until exit. Freeze
    # them, so neither a collection nor the one at interpreter exit walks them again (a
    # third of a hook's own cost). The README's hook command also turns the collector
    # off for the import itself; it is back on from here.
    gc.freeze()
    gc.enable()
    argv = sys.argv[1:] if argv is None else list(argv)
    verb = argv[0] if argv else ""
    if verb in ("inbox", "alert", "egress") and len(argv) > 1 and not argv[1].startswith("-"):
        verb, rest = "%s %s" % (argv[0], argv[1]), argv[2:]
    else:
        rest = argv[1:]
    if verb == "egress emit":
        return _cmd_egress_emit(rest)
    if verb == "inbox check":
        return _cmd_inbox_check(rest)
    try:
        key = {"alert permission": "alert"}.get(verb, verb)
        if "-h" in rest or "--help" in rest or key not in SEAM_COMMANDS or verb in (
                "inbox", "egress", "alert"):
            rows = [SEAM_COMMANDS[key]] if key in SEAM_COMMANDS else [
                row for name, row in SEAM_COMMANDS.items() if name.startswith(verb or " ")]
            usage = "\n  ".join(row["usage"] for row in rows)
            if "-h" in rest or "--help" in rest:
                example = "\n  ".join(row["example"] for row in rows)
                sys.stdout.write("usage: bridge.py %s\n\nexample:\n  %s\n" % (usage, example))
                return EXIT_OK
            if verb.startswith("inbox "):
                _seam_print({"error": "unknown inbox subcommand: %s" % verb[6:]})
            else:
                warn("error: usage: bridge.py %s" % (usage or " | ".join(SEAM_VERBS)))
            return EXIT_USAGE
        return _run_seam_verb(key, rest)
    except BrokenPipeError as exc:
        return stdout_gone(exc)
    except Exception as exc:  # the last line of defence: one clear line, no traceback
        return unexpected_error(exc)


def _run_seam_verb(key, rest):
    row = SEAM_COMMANDS[key]
    quiet = row.get("never_block", False)

    def failed(message):
        return dict(row["failed"], error=message)

    try:
        opts = parse_go_flags(rest, row["flags"], row.get("strict", False), row.get("tristate", ()))
    except SeamFailure as exc:
        _seam_print(failed(exc.message))
        return EXIT_OK if quiet else EXIT_USAGE
    root = None
    try:
        root = seam_root(opts.get("repo-root"))
        answer, code = row["run"](root, opts)
        _seam_print(answer)
        return code
    except (SeamFailure, BridgeError, OSError) as exc:
        message = getattr(exc, "message", None)
        if not message:  # an OSError no verb wrapped: name its file, or at least the verb
            message = "%s: %s" % (getattr(exc, "filename", None) or key + " failed",
                                  getattr(exc, "strerror", None) or exc)
        answer = dict(getattr(exc, "answer", None) or failed(message))
        answer["error"] = message
        if key == "inbox drain":
            answer["slug"] = opts.get("slug", "")  # as Go's failed drain answer
        if key == "inbox commit" and root and "cursor" not in (getattr(exc, "answer", None) or {}) \
                and is_safe_name(opts.get("slug")):
            answer["cursor"] = read_cursor(os.path.join(root, SEAM_DIR), opts["slug"])
        _seam_print(answer)
        return EXIT_OK if quiet else EXIT_USAGE if isinstance(exc, SeamUsage) else EXIT_FAILED


def _quiet_stderr():
    """Swap stderr for a sink unless BRIDGE_DEBUG is set; returns what to restore.

    The hook verbs say nothing on stderr, whatever the kernel warns about on the way
    (an unknown key in bridge.config.json would otherwise speak on every tool call)."""
    if debug_enabled():
        return None
    import io  # loaded at interpreter start: free
    saved, sys.stderr = sys.stderr, io.StringIO()
    return saved


def _cmd_egress_emit(rest):
    """Observe-only: read the payload, record it, print nothing, exit 0."""
    if "-h" in rest or "--help" in rest:
        sys.stdout.write("usage: bridge.py %s\n" % SEAM_COMMANDS["egress"]["usage"])
        return EXIT_OK
    saved = _quiet_stderr()
    try:
        opts = parse_go_flags(rest, SEAM_COMMANDS["egress"]["flags"])
        data = sys.stdin.buffer.read()
        done = egress_emit(data, opts.get("host", ""), opts.get("repo-root"))
    except Exception as exc:  # the host must never see us fail
        done = "not recorded: %s: %s" % (type(exc).__name__, exc)
    finally:
        if saved is not None:
            sys.stderr = saved
    if saved is None:
        warn("egress emit: %s" % done)
    return EXIT_OK


def _cmd_inbox_check(rest):
    """The Stop hook: prints {"decision":"block",...} or {}, always exits 0."""
    answer = {}
    saved = _quiet_stderr()
    try:
        opts = parse_go_flags(rest, SEAM_COMMANDS["inbox check"]["flags"])
        data = sys.stdin.buffer.read() if not sys.stdin.isatty() else b""
        answer = inbox_check(data, opts.get("host", ""), opts.get("repo-root"),
                             opts.get("slug"), opts.get("session-id"))
    except Exception as exc:
        if saved is None:
            warn("inbox check: %s: %s" % (type(exc).__name__, exc))
    finally:
        if saved is not None:
            sys.stderr = saved
    try:
        _seam_print(answer)
    except (OSError, ValueError):
        pass
    return EXIT_OK


# ---- hooks commands (install, uninstall, doctor) ----
# `hooks install` writes the hook configuration the README documents, so nobody pastes a
# one-line Python program by hand. Both forms load scripts/bridge.py from its cached
# bytecode and call seam_main() (the README's "The hook command" measures them). Claude
# Code runs a hook through sh with $CLAUDE_PROJECT_DIR set, so its project form changes to
# that folder and imports bridge; Codex has no such variable, and user-wide settings also
# run in projects without bridge.py, so every other form looks for scripts/bridge.py from
# the working directory up to the first folder holding .git and does nothing without one.
HOOK_IMPORT = ('import gc,sys;gc.disable();sys.path[:0]=["scripts"];import bridge;'
               'sys.exit(bridge.seam_main())')
HOOK_WALK = (
    'import gc,os,sys;gc.disable();p=os.getcwd().split("/");a=["/".join(p[:i]) or "/" for i in '
    'range(len(p),0,-1)];g=[d for d in a if os.path.exists(d+"/.git")][:1];a=a[:a.index(g[0])+1] '
    'if g else a[:1];f=[d+"/scripts/bridge.py" for d in a if '
    'os.path.isfile(d+"/scripts/bridge.py")][:1];f or sys.exit(0);'
    'from importlib.machinery import SourceFileLoader as L;m=type(sys)("bridge")'
    ';m.__file__=f[0];L("bridge",f[0]).exec_module(m);sys.exit(m.seam_main())')
# host -> (event, verb) in the order they are written: Claude's are asynchronous but for the
# Stop check, whose answer Claude waits for; Codex's are the reference's codex-hooks.json.
HOOK_PLAN = {
    "claude": (("SessionStart", "egress emit"), ("UserPromptSubmit", "egress emit"),
               ("PostToolUse", "egress emit"), ("Notification", "egress emit"),
               ("SubagentStop", "egress emit"), ("Stop", "egress emit"), ("Stop", "inbox check")),
    "codex": (("SessionStart", "egress emit"), ("UserPromptSubmit", "egress emit"),
              ("PostToolUse", "egress emit"), ("SubagentStart", "egress emit"),
              ("SubagentStop", "egress emit"), ("Stop", "egress emit")),
}
HOOK_VERBS = ("egress emit", "inbox check")
CODEX_TRUST = (
    "Codex runs these hooks only once you trust them: trust the project when Codex asks (or add "
    "[projects.\"%s\"] trust_level = \"trusted\" to ~/.codex/config.toml), then open /hooks in "
    "Codex and trust each bridge.py hook (again after every change to them).")


# Pi has no hook settings: its extension (the README's, which tests/test_seam_pi.py runs
# inside Pi) forwards its lifecycle events to egress emit.
PI_EXTENSION = r'''// .pi/extensions/bridge.ts: Pi's lifecycle -> bridge.py's `_bridge/` seam (egress emit --host pi).
import type { ExtensionAPI, ExtensionContext } from "@mariozechner/pi-coding-agent";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { basename, dirname, extname, join } from "node:path";

// One python at a time, in the order Pi fires events, so events.jsonl keeps that order;
// handlers return at once (Pi never waits on the bridge), except at shutdown (below).
let queue: Promise<void> = Promise.resolve();

// scripts/bridge.py of the git repository Pi works in: from the cwd up to the first directory
// holding .git (a file or a directory); outside any repository, the cwd only. Never one from
// above the repository; none at all: not a bridge.py project, stay silent.
function bridgeScript(cwd: string): string | undefined {
  const dirs: string[] = [];
  for (let dir = cwd; ; dir = dirname(dir)) {
    dirs.push(dir);
    if (existsSync(join(dir, ".git"))) break;
    if (dirname(dir) === dir) { dirs.length = 1; break; }
  }
  return dirs.map((dir) => join(dir, "scripts", "bridge.py")).find((file) => existsSync(file));
}

function run(script: string, cwd: string, payload: object): Promise<void> {
  // loaded by its path (from its cached bytecode), never by a search of sys.path
  const code = "import gc,sys;gc.disable();from importlib.machinery import SourceFileLoader as L;" +
               "f=" + JSON.stringify(script) + ";m=type(sys)('bridge');m.__file__=f;" +
               "L('bridge',f).exec_module(m);sys.exit(m.seam_main())";
  return new Promise((done) => {
    const child = spawn("python3", ["-I", "-S", "-c", code, "egress", "emit", "--host", "pi"],
                        { cwd, stdio: ["pipe", "ignore", process.env.BRIDGE_DEBUG ? "inherit" : "ignore"] });
    const timer = setTimeout(() => child.kill("SIGKILL"), 10000); // a stuck one must not stall the queue
    const finish = () => { clearTimeout(timer); done(); };
    child.on("error", finish);
    child.on("close", finish);
    child.stdin.on("error", () => {}); // EPIPE when python3 is missing or died first
    child.stdin.end(JSON.stringify(payload));
  });
}

function emit(event: string, ctx: ExtensionContext, detail: Record<string, unknown> = {}): Promise<void> {
  try {
    const cwd = ctx.cwd || process.cwd();
    const script = bridgeScript(cwd);
    if (!script) return queue;
    const file = ctx.sessionManager.getSessionFile() ?? "";
    const payload = {
      event, cwd, session_file: file,
      session_id: file ? basename(file, extname(file)) : ctx.sessionManager.getSessionId(),
      agent_id: "", agent_type: "", timestamp: new Date().toISOString().replace(/\.\d+Z$/, "Z"),
      detail: { source: "pi", ...detail },
    };
    queue = queue.then(() => run(script, cwd, payload));
  } catch {
    // observe-only: a bridge problem never becomes a Pi error
  }
  return queue;
}

export default function (pi: ExtensionAPI) {
  pi.on("session_start", (e, ctx) => { emit("session_start", ctx, { reason: e.reason }); });
  pi.on("agent_start", (_e, ctx) => { emit("agent_start", ctx); });
  pi.on("turn_start", (_e, ctx) => { emit("turn_start", ctx); });
  // one PostToolUse per tool call, after it ran (as Claude's); tool_execution_start would double it
  pi.on("tool_execution_end", (e, ctx) => {
    emit("tool_execution_end", ctx, { tool: e.toolName, tool_call_id: e.toolCallId });
  });
  pi.on("turn_end", (_e, ctx) => { emit("turn_end", ctx); });
  pi.on("agent_end", (_e, ctx) => { emit("agent_end", ctx); });
  // Pi exits right after its shutdown handlers: let queued events land first (at most 3 s)
  pi.on("session_shutdown", (e, ctx) => Promise.race([
    emit("session_shutdown", ctx, { reason: e.reason }),
    new Promise<void>((done) => setTimeout(done, 3000).unref()),
  ]));
}
'''


def hook_command(host, verb, walk):
    """The command line of one bridge.py hook, as the README shows it."""
    if walk:
        return "python3 -I -S -c '%s' %s --host %s" % (HOOK_WALK, verb, host)
    return "cd \"$CLAUDE_PROJECT_DIR\" && python3 -I -S -c '%s' %s --host %s" % (
        HOOK_IMPORT, verb, host)


def hook_plan(host, scope):
    """{event: matcher group} of the bridge.py hooks for `host`'s settings at `scope`."""
    walk = host != "claude" or scope == "user"
    plan = {}
    for event, verb in HOOK_PLAN[host]:
        hook = {"type": "command"}
        if host == "codex":
            hook["timeout"] = 10
        elif verb == "egress emit":
            hook["async"] = True  # the agent never waits for its activity report
        hook["command"] = hook_command(host, verb, walk)
        group = plan.setdefault(event, {"matcher": "*"} if event == "PostToolUse"
                                and host == "claude" else {})
        group.setdefault("hooks", []).append(hook)
    return plan


def install_commands(host):
    """{command line: seam verb} of every hook command `hooks install` writes for `host`, at
    either scope. Only these are bridge.py's: install updates, uninstall removes and doctor
    runs a command only when it is one of them byte for byte. Settings files are
    agent-writable, and a command that merely mentions bridge.py may do anything else too."""
    return {hook_command(host, verb, walk): verb for _event, verb in HOOK_PLAN[host]
            for walk in ((False, True) if host == "claude" else (True,))}


def hook_command_of(hook):
    """A hook entry's command (a str), else None."""
    command = hook.get("command") if isinstance(hook, dict) else None
    return command if isinstance(command, str) else None


def looks_like_bridge(command):
    """True for a command that mentions bridge.py (or seam_main) and a seam verb but is not
    one install writes: it is left alone, never run, and named (shown JSON-escaped)."""
    return bool(command) and ("seam_main" in command or "bridge.py" in command) and \
        any(verb in command for verb in HOOK_VERBS)


def not_ours(command):
    return "not a command hooks install writes: %s" % json.dumps(command)


def merge_hooks(config, plan, ours):
    """(new settings, changes, notes): `config` with exactly `plan`'s bridge.py hooks, ours
    being the commands in `ours` (install_commands). Ours already there are updated in place
    (the user's extra keys on them kept), missing ones added to the group that holds ours
    for the event (else a new group), ours the plan has no place for removed; every other
    hook, group, event and key stays as it was, and `notes` names those that look like
    bridge.py's without being ours. plan={} uninstalls."""
    import copy
    config = copy.deepcopy(config)
    table = config.get("hooks", {})
    if not isinstance(table, dict):
        raise BridgeError("\"hooks\" is not a JSON object")
    changes, notes = [], []
    for event in list(table) + [event for event in plan if event not in table]:
        groups = table.get(event, [])
        if not isinstance(groups, list):
            raise BridgeError("\"hooks\".%s is not a JSON array" % event)
        wanted = copy.deepcopy(plan.get(event, {"hooks": []}))
        todo, home, emptied = list(wanted["hooks"]), None, []
        for group in groups:
            if not isinstance(group, dict) or not isinstance(group.get("hooks"), list):
                continue
            kept = []
            for hook in group["hooks"]:
                verb = ours.get(hook_command_of(hook))
                match = next((h for h in todo if verb and ours[h["command"]] == verb), None)
                if verb is None:
                    if looks_like_bridge(hook_command_of(hook)):
                        notes.append("%s: left as it is: %s" % (event, not_ours(hook["command"])))
                    kept.append(hook)
                elif match is not None:
                    todo.remove(match)
                    if any(hook.get(k) != v for k, v in match.items()):
                        changes.append("updated %s: %s" % (event, verb))
                    kept.append(dict(hook, **match))
                    home = home or group
                else:
                    changes.append("removed %s: %s" % (event, verb))
            if group["hooks"] and not kept:
                emptied.append(group)
            group["hooks"] = kept
        if emptied:  # only the groups emptied here: one the user left empty stays
            groups = [g for g in groups if not any(g is e for e in emptied)]
        if todo:
            if home is None:
                home = dict(wanted, hooks=[])
                groups.append(home)
            home["hooks"].extend(todo)
            changes.extend("added %s: %s" % (event, ours[h["command"]]) for h in todo)
        if groups:
            table[event] = groups
        elif event in table and emptied:
            del table[event]
    if table:
        config["hooks"] = table
    elif changes:  # uninstall emptied it
        config.pop("hooks", None)
    return config, changes, notes


def hooks_file(host, scope, root):
    """(settings file, the folder it is written within) for `host` at `scope`. Within the
    repository no folder on the way may be a symlink (agents write there); the user's own
    folder is trusted as it is (a ~/.claude linked by a dotfile manager too)."""
    folder, name = {"claude": (".claude", "settings.json"), "codex": (".codex", "hooks.json"),
                    "pi": (os.path.join(".pi", "extensions"), "bridge.ts")}[host]
    if scope != "user":
        return os.path.join(root, folder, name), root
    home = os.path.expanduser("~")
    folder = {"claude": os.path.join(home, ".claude"),
              "codex": os.environ.get("CODEX_HOME") or os.path.join(home, ".codex"),
              "pi": os.path.join(home, ".pi", "agent", "extensions")}[host]
    return os.path.join(folder, name), folder


def read_settings(path):
    """The JSON object in settings file `path` ({} when it does not exist). A symlink is
    refused (rewriting it would replace the link: a dotfile manager's file would silently
    stop being the one in use), and so is anything that is not one JSON object."""
    if os.path.islink(path):
        raise BridgeError("%s is a symlink (to %s); refusing to replace it: edit the file it "
                          "points to, or run hooks install there" % (path, os.readlink(path)))
    config = read_json_file(path, "settings file", missing={})
    if not isinstance(config, dict):
        raise BridgeError("settings file %s: line 1: not a JSON object" % path)
    return config


def backup_once(path):
    """Copy `path` to PATH.bridge-backup unless one is there already, so the backup stays the
    file as it was before bridge.py first changed it. Returns the backup's path when made now."""
    backup = path + ".bridge-backup"
    if not os.path.lexists(path) or os.path.lexists(backup):
        return None
    write_once(backup, read_input(path, "settings file"))
    return backup


def write_with_backup(path, data, base):
    """Replace `path` atomically with `data` (within folder `base`, see hooks_file), after
    backup_once; returns what backup_once did."""
    make_dirs(os.path.dirname(path), base)
    backup = backup_once(path)
    atomic_write(path, data)
    return backup


def hooks_merged(path, host, plan, real=None):
    """(the settings in `path`, then merge_hooks' new settings, changes and notes for `plan`):
    what install would change; a BridgeError names the file. `real`: the file to read when
    `path` is a link the user trusts (doctor)."""
    try:
        config = read_settings(real or path)
        return (config,) + merge_hooks(config, plan, install_commands(host))
    except BridgeError as exc:
        raise exc if path in exc.message else BridgeError("settings file %s: %s" % (
            path, exc.message))


def hooks_install(host, scope, root, remove=False):
    """Install (or with remove=True uninstall) the bridge.py hooks for `host`; the lines
    to print. Never writes when nothing changes."""
    path, base = hooks_file(host, scope, root)
    if host == "pi":
        return pi_extension_install(path, base, remove)
    try:
        _old, config, changes, notes = hooks_merged(
            path, host, {} if remove else hook_plan(host, scope))
    except BridgeError as exc:
        raise BridgeError(exc.message + "; not changed")
    notes = ["%s %s" % (path, note) for note in notes]
    if not changes:
        return ["%s: unchanged (the bridge.py hooks are %s)" % (
            path, "absent" if remove else "in place")] + notes
    try:
        text = json.dumps(config, ensure_ascii=False, indent=2, allow_nan=False) + "\n"
    except ValueError:  # 1e400 read as infinity: written back as Infinity, which is not JSON
        raise BridgeError("settings file %s holds a number too large for a float (such as 1e400); "
                          "not changed" % path)
    backup = write_with_backup(path, text, base)
    lines = ["%s: %s" % (path, "; ".join(changes))] + notes
    if backup:
        lines.append("the previous file is kept as %s" % backup)
    if host == "codex" and not remove:
        lines.append(CODEX_TRUST % root)
    return lines


def pi_extension_install(path, base, remove):
    """Write (or remove) Pi's extension file; one that is not ours is never touched."""
    ours = PI_EXTENSION.splitlines()[0]
    try:
        current = read_input(path, "Pi extension", missing=None)
    except BridgeError as exc:
        raise BridgeError(exc.message + "; not changed")
    if current is not None and not current.decode("utf-8", "replace").startswith(ours):
        raise BridgeError("%s exists and is not bridge.py's extension; not changed (move it "
                          "away, or merge by hand from the README)" % path)
    if remove:
        if current is None:
            return ["%s: unchanged (absent)" % path]
        edited = current != PI_EXTENSION.encode("utf-8")
        kept = edited and backup_once(path)
        if edited and not kept:  # the backup there is older: removing would lose the edit
            raise BridgeError("%s was edited since it was installed and %s.bridge-backup is never "
                              "overwritten: not removed (move one of them away)" % (path, path))
        os.remove(path)
        return ["%s: removed%s" % (path, " (as it was: %s)" % kept if kept else "")]
    if current == PI_EXTENSION.encode("utf-8"):
        return ["%s: unchanged (the extension is in place)" % path]
    write_with_backup(path, PI_EXTENSION, base)
    return ["%s: %s; Pi loads it at its next start (or /reload)" % (
        path, "written" if current is None else "updated")]


def script_missing(root):
    """What to do when ROOT/scripts/bridge.py, the file the project's hooks run, is not there
    (installed from the clone before copying it, say); else None."""
    script = os.path.join(root, "scripts", "bridge.py")
    return None if os.path.isfile(script) else "%s does not exist: copy bridge.py there" % script


def cmd_hooks(args):
    root = find_root(args.root)
    hosts = [args.host] if args.host else list(HOOK_PLAN) + ["pi"]
    if args.hooks_verb == "doctor":
        return hooks_doctor(root, hosts, args.scope)
    lines = hooks_install(args.host, args.scope or "project", root, args.hooks_verb == "uninstall")
    if args.hooks_verb == "install" and args.scope != "user" and script_missing(root):
        lines.append(script_missing(root) + " (the hooks run it)")
    for line in lines:
        print(printable(line))  # event names are the settings file's, so an agent's too
    return EXIT_OK


def hooks_doctor(root, hosts, scope=None, runs=5):
    """Run each distinct bridge.py hook command in `hosts`' settings (both scopes unless
    `scope`) from `root` with a sample payload: it must exit 0, and egress emit must append
    the sample to ROOT/_bridge/events.jsonl (inbox check must answer a JSON object). Prints
    each one's median time over `runs` next to python3's own start; exit 1 if one is broken
    or looks like bridge.py's without being a command install writes (never run)."""
    import statistics
    sample = {"session_id": "bridge-hooks-doctor", "cwd": root, "hook_event_name": "PostToolUse",
              "tool_name": "Bash", "stop_hook_active": False}
    env = dict(os.environ, CLAUDE_PROJECT_DIR=root, BRIDGE_DEBUG="1")

    def run(command, data=b""):
        return run_command(command, cwd=root, env=env, shell=True, stdin_data=data, timeout=30)

    def lines_in(path):  # -1 for a symlink, FIFO...: egress emit never appends to one either
        try:
            return count_complete_lines(path)
        except OSError:
            return -1

    events, found, broken = os.path.join(root, SEAM_DIR, "events.jsonl"), 0, []
    missing, installed = script_missing(root), {}  # installed: {host: [settings files with ours]}
    for host in hosts:
        for where in ([scope] if scope else ["project", "user"]):
            path, _base = hooks_file(host, where, root)
            # the user's own folder is trusted: a dotfile manager's link there is read through
            real = os.path.realpath(path) if where == "user" else path
            try:
                if host == "pi":
                    if os.path.lexists(real):
                        if read_input(real, "Pi extension") != PI_EXTENSION.encode("utf-8"):
                            raise BridgeError("%s: not this bridge.py's extension: hooks install "
                                              "--host pi" % path)
                        found += 1
                        installed.setdefault(host, []).append(path)
                        print("ok      %s: bridge.py's extension" % path)
                    continue
                plan = hook_plan(host, where)
                current, _new, differs, _notes = hooks_merged(path, host, plan, real)
            except BridgeError as exc:  # named, and the other files are still checked
                found += 1
                broken.append(path)
                print(printable("broken  " + exc.message))
                continue
            # Only the commands install writes for this host, scope and event are run (the
            # settings file is agent-writable); any other bridge.py-looking one is named.
            ours, commands, mark = install_commands(host), {}, found
            for event, groups in current.get("hooks", {}).items():
                wanted = [h["command"] for h in plan.get(event, {}).get("hooks", ())]
                for group in groups:  # a list: hooks_merged checked
                    hooks = group.get("hooks") if isinstance(group, dict) else None
                    for hook in hooks if isinstance(hooks, list) else ():
                        command = hook_command_of(hook)
                        if command in wanted:
                            commands.setdefault(command, []).append(event)
                        elif command in ours or looks_like_bridge(command):
                            found += 1
                            broken.append("%s %s (not run)" % (path, event))
                            print(printable(
                                "not run %s %s: %s: check it is yours (an old bridge.py hook: "
                                "remove it, then run `bridge.py hooks install --host %s`)"
                                % (path, event, not_ours(command), host)))
            if differs and (commands or found > mark):  # ours there, but not all or not as written
                broken.append(path)
                print(printable("broken  %s: not as hooks install writes them (`bridge.py hooks "
                                "install --host %s` would change: %s)"
                                % (path, host, "; ".join(differs))))
            if commands:
                installed.setdefault(host, []).append(path)
            for command, on in commands.items():
                found += 1
                verb = ours[command]
                name = "%s %s (%s)" % (path, verb, ", ".join(on))
                data = json.dumps(dict(sample, hook_event_name=on[0])).encode("utf-8")
                before = lines_in(events)
                first = run(command, data)
                said = printable(first.stderr.strip()[-300:])
                problem = None if first.ok else "%s: %s" % (first.describe(), said)
                if not problem and verb == "egress emit":
                    if lines_in(events) <= before:
                        problem = "wrote nothing to %s%s" % (events, " (%s)" % said if said else "")
                elif not problem:
                    try:
                        if not isinstance(parse_json(first.stdout), dict):
                            raise ValueError("not an object")
                    except ValueError:
                        problem = "answered %s, not a JSON object" % printable(
                            repr(first.stdout[:200]))
                if problem:
                    problem += "; " + missing if missing else ""  # what to do about it
                    broken.append(name)
                    print("broken  %s: %s" % (name, problem))
                    continue
                # interleaved with the interpreter's bare start, so a busy machine slows both alike
                took, base = (statistics.median(times) for times in zip(*[
                    (run(command, data).duration, run('python3 -I -S -c "import json"').duration)
                    for _ in range(runs)]))
                print("ok      %s: %.1f ms median, python3 -I -S -c \"import json\" %.1f ms (x%.2f)"
                      % (name, took * 1000, base * 1000, took / base))
    for host, paths in installed.items():
        if len(paths) > 1:
            print("note    %s hooks in both %s: %s runs both, so every event is recorded twice "
                  "(`bridge.py hooks uninstall --host %s --scope user` removes one)"
                  % (host, " and ".join(paths), host, host))
    if not found:
        print("no bridge.py hooks found for %s: run `bridge.py hooks install --host HOST`"
              % ", ".join(hosts))
        return EXIT_FAILED
    if broken:
        print(printable("%d broken: %s" % (len(broken), "; ".join(broken))))
        return EXIT_FAILED
    return EXIT_OK


# ---- relay commands ----
def _relay_open(args):
    """(root, config) once captain_id and cluster_session are safe names."""
    for value, what in ((args.captain_id, "captain_id"), (args.cluster_session, "cluster_session")):
        if not value:
            raise BridgeError("%s must not be empty" % what)
        safe_name(value, what)
    return load_args_config(args)


def cmd_relay_down(args):
    root, config = _relay_open(args)
    print(relay_down(root, config, args.captain_id, args.cluster_session, args.message,
                     args.project, args.priority, args.acceptance_criteria))
    return EXIT_OK


def cmd_relay_up(args):
    root, config = _relay_open(args)
    report = relay_up(root, config, args.captain_id, args.cluster_session, args.cmd_id,
                      args.status, args.summary, force=args.force)
    if report is not None:
        print(report)
    return EXIT_OK


# ---- proxy commands ----
def cmd_proxy(args):
    root, cfg = load_args_config(args)
    obs = cfg["observability"]
    # share_token writes the drawn token there; outside a git work tree there is no repository
    top = git_toplevel(root)
    if obs["enabled"] and obs["token"] is None and top:
        outside_repository(os.path.dirname(user_config_file("proxy.url")), top,
                           "the dashboard token's folder", "point XDG_CONFIG_HOME outside it")
    server = args.server[1:] if args.server[:1] == ["--"] else args.server
    argv, cwd, env = proxy_command(cfg, server)
    cfg["doctor"]["watch"] = list(cfg["doctor"]["watch"]) + args.watch
    for path in cfg["doctor"]["watch"]:
        if not os.path.exists(path):
            raise BridgeError("proxy: watched path %r (--watch, doctor.watch) does not exist"
                              % (path,))
    return Proxy(argv, cfg, cwd, env).run()


# ---- changes commands ----
def _changes_open(args):
    root, config = load_args_config(args)
    # From a subdirectory git applies a patch relative to the top level (and names its files
    # that way), so every path would be judged one folder off.
    top = git_toplevel(root)
    if top is not None and os.path.realpath(top) != os.path.realpath(root):
        raise BridgeError("--root %s is not the top of its git repository %s, where git applies "
                          "patches from: use --root %s" % (root, top, top), EXIT_USAGE)
    return ChangeSets(root, config)


def cmd_changes_id(args):
    check_text(args.subject, "--subject")
    check_text(args.snapshot, "--snapshot")
    sets = _changes_open(args)
    base = sets.base_state(args.snapshot, args.worktree)
    identity = changeset_identity(args.subject, changeset_repo_key(sets.root), base)
    print(changeset_id(identity))
    return EXIT_OK


def cmd_changes_new(args):
    sets = _changes_open(args)
    print(changeset_new(sets, args.subject, args.plan, args.architecture, args.snapshot,
                        args.worktree))
    return EXIT_OK


def cmd_changes_validate(args):
    sets = _changes_open(args)
    cs_id = sets.existing(args.id)
    meta, plan, problems = sets.load(cs_id)
    for code, msg in problems:
        print(printable("%s: %s: %s" % (cs_id, code, msg)))
    if problems:
        return EXIT_FAILED
    if not sets.mcp_configured():
        print("%s: offline checks passed; repository alignment and governance skipped (no "
              "changes.mcp.command)" % cs_id)
        return EXIT_OK
    try:
        with sets.client() as client:
            client.start()
            outcome, code, reason, details = sets.check_online(client, meta, plan)
    except (McpError, McpServerGone) as exc:
        print(printable("%s: mcp_error: %s" % (cs_id, exc)))
        return EXIT_FAILED
    if outcome == "reject":
        for problem in details.get("problems") or ["%s: %s" % (code, reason)]:
            print(printable("%s: %s" % (cs_id, problem)))
        return EXIT_FAILED
    print(printable("%s: valid; the executor would decide %s: %s" % (cs_id, code, reason)))
    return EXIT_OK


def cmd_changes_run(args):
    import signal
    sets = _changes_open(args)
    if not sets.mcp_configured():
        raise BridgeError("changes run needs an MCP server: set changes.mcp.command", EXIT_USAGE)
    poll = args.poll if args.poll is not None else sets.cfg["poll_sec"]
    executor = ChangeExecutor(sets)
    executor.acquire()

    def stop(signum, frame):
        executor.stopping = True
    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    failed = False
    try:
        while True:
            for cs_id, final in executor.run_once():
                print("%s %s" % (cs_id, final))
                sys.stdout.flush()
                failed = failed or final == "failed"
            if args.once or executor.stopping:
                break
            deadline = time.monotonic() + poll
            while time.monotonic() < deadline and not executor.stopping:
                time.sleep(min(0.2, poll))
            executor.lock.heartbeat()
    finally:
        executor.lock.release()
        for s, h in old.items():
            signal.signal(s, h)
    return EXIT_FAILED if failed else EXIT_OK


def cmd_changes_status(args):
    sets = _changes_open(args)

    def summary(cs_id):
        state, decision, reason = sets.state_of(cs_id)
        return {"change_set_id": cs_id, "state": state, "decision": decision, "reason": reason}
    if args.id:
        cs_id = sets.existing(args.id)
        status = sets.read_status(cs_id) or summary(cs_id)
        if args.json:
            print(json.dumps(status, sort_keys=True, indent=2))  # ASCII: the agent's text inert
        else:  # the status file is the agent's to write too: its text is printed inert
            for key in ("change_set_id", "state", "decision", "reason"):
                print(printable("%-14s %s" % (key + ":", status.get(key))))
            ex = status.get("execution") if isinstance(status.get("execution"), dict) else {}
            if ex.get("completed_task_ids") or ex.get("last_error"):
                done = ex.get("completed_task_ids")
                print(printable("%-14s %s" % ("completed:", ", ".join(map(str, done)) if
                                              isinstance(done, list) and done else "-")))
                print(printable("%-14s %s" % ("last_error:", ex.get("last_error") or "-")))
        return EXIT_OK
    rows = [summary(cs_id) for cs_id in sets.ids()]
    holder = FileLock.probe(sets.lock_path)
    if args.json:
        print(json.dumps({"change_sets": rows, "executor": {
            "lock": holder[0], "holder": holder[1] if holder[0] == "held" else None}},
            sort_keys=True, indent=2))
        return EXIT_OK
    if not rows:
        print("no change sets in %s" % sets.dir)
    for row in rows:
        print(printable("%-16s %-16s %s  %s" % (row["state"], row["decision"] or "-",
                                                row["change_set_id"], row["reason"] or "")))
    if holder[0] == "held":
        print("executor running: %s" % describe_holder(holder[1]))
    return EXIT_OK


def cmd_changes_approve(args):
    sets = _changes_open(args)
    status, changed, paths = changeset_approve(sets, args.id)
    cs_id = status["change_set_id"]
    print("%s %s" % (cs_id, "approved" if changed else "already approved"))
    if changed:  # what was signed, read from the plan itself: check it is what you reviewed
        print(printable("plan sha256 %s; its patches write: %s" % (  # names the agent chose
            status["approval"]["plan_sha256"], ", ".join(paths) or "(no patch)")))
    # Approving a change set the executor can only refuse is a wasted review: say so now.
    try:
        with sets.client() as client:
            client.start()
            stale = sets.stale_base(client, status["validated_against"]["base_state"])
    except BridgeError as exc:
        stale = None
        warn("warning: could not check whether %s's base is still current: %s" % (cs_id, exc))
    if stale:
        warn("warning: %s's base is already stale (%s): the executor will fail it as stale_base. "
             "Re-plan: run `changes new` again with the same subject and plan (it gets a new id "
             "on the current base), have it validated, and approve that one" % (cs_id, stale))
    return EXIT_OK


def build_parser():
    """The argparse tree: one spec() per command (name, function, help, example, arguments).
    The seam verbs parse their own flags (seam_main); argparse only lists them."""
    import argparse
    parser = argparse.ArgumentParser(
        prog="bridge.py",
        description="Connect AI coding agents to each other and to their tools, safely.",
        epilog="Run `bridge.py COMMAND --help` for a command's options and an example.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version="bridge.py " + __version__)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    as_json = spec("--json", action="store_true", help="machine-readable output")
    subject = spec("--subject", required=True, help="brief description of the intent")
    anchor = [spec("--snapshot", metavar="ID", help="anchor to this MCP snapshot id"),
              spec("--worktree", action="store_true",
                  help="anchor to the worktree fingerprint (snapshot.info; the default)")]
    ids = (spec("captain_id"), spec("cluster_session"))
    commands = [
        spec("redact", cmd_redact, "copy stdin to stdout with secrets replaced by [REDACTED]",
            "some-tool 2>&1 | python3 scripts/bridge.py redact > tool.log",
            description="Copy stdin to stdout with the redaction every part of bridge.py uses: "
                        "known token formats, values after secret-named keys, secret-named "
                        "environment variables (and their encoded forms) and the config's "
                        "redaction_patterns. Output is written as input arrives (per read of "
                        "complete lines), so it works in pipelines and hooks."),
        spec("init", cmd_init, "create .ai-handoff/ and make git ignore it locally",
            "python3 scripts/bridge.py init            # in the repository"),
        spec("submit", cmd_submit, "validate a task and queue it atomically in .ai-handoff/tasks/",
            "python3 scripts/bridge.py submit task.json\n"
            "python3 scripts/bridge.py submit --retry .ai-handoff/failed/ID.json",
            spec("task", metavar="TASK.json", help="the task file ('-' reads stdin)"),
            spec("--retry", action="store_true",
                help="the task already has a result: archive it and queue the next attempt")),
        spec("watch", cmd_watch, "run the watcher: take queued tasks through the Bridge Protocol",
            "python3 scripts/bridge.py watch --once     # process the queue, then exit\n"
            "python3 scripts/bridge.py watch --poll 2   # keep watching",
            spec("--once", action="store_true", help="process what is queued, then exit"),
            spec("--poll", type=poll_seconds, metavar="SECONDS",
                help="polling interval when idle (default: poll_sec, 1 s)"),
            description="run the watcher: take queued tasks through the Bridge Protocol\n\n"
                        "exit codes: 0 all done, 1 the queue stopped on a failure, 2 usage or "
                        "configuration,\n3 another watcher holds the lock, 4 a task of this run "
                        "needs a person (blocked,\nrefused, failed, waiting for approval or its "
                        "dependencies), 128+N "
                        "signal N interrupted a task (re-queued)"),
        spec("status", cmd_status,
            "counts per state, recent failures, tasks held back or skipped, task worktrees",
            "python3 scripts/bridge.py status --json", as_json),
        spec("approve", cmd_approve,
            "release a task waiting in pending/ so the next watcher run executes it",
            "python3 scripts/bridge.py approve 2026-11-22_01_add-greeting",
            spec("id", help="the task id")),
        spec("unlock", cmd_unlock,
            "clear a provably stale worker lock (or --force), or kept task worktrees",
            "python3 scripts/bridge.py unlock\npython3 scripts/bridge.py unlock --worktrees",
            spec("--force", action="store_true",
                help="clear it even when its holder may still run (dangerous; with "
                     "--worktrees too, before removing them)"),
            spec("--worktrees", action="store_true",
                help="instead remove the task worktrees kept (isolation \"worktree\"), "
                     "their changes committed to their branches as WIP first")),
        None,  # the seam verbs
        spec("hooks", "install, remove or check the seam's hooks in Claude Code, Codex or Pi",
            "Write the _bridge/ seam's hooks into a host's settings (keeping every hook already "
            "there), remove exactly those, or check and time them.",
            ["python3 scripts/bridge.py hooks install --host claude",
             "python3 scripts/bridge.py hooks doctor"], "VERB", verbs=[
            spec(verb, cmd_hooks, text, "python3 scripts/bridge.py hooks %s%s" % (
                verb, " --host claude" if verb != "doctor" else ""),
                spec("--host", choices=("claude", "codex", "pi"), required=verb != "doctor"),
                spec("--scope", choices=("project", "user"),
                    help="the repository's settings (default) or the user's" +
                         (" (doctor: both)" if verb == "doctor" else "")), config=False)
            for verb, text in (
                ("install", "write the hooks (idempotent; a backup the first time)"),
                ("uninstall", "remove exactly the bridge.py hooks"),
                ("doctor", "run every bridge.py hook once with a sample payload, and time it"))]),
        spec("relay", "the Agent Teams <-> YAML queue relay (down|up)",
            "Hand commands down to the YAML work queue and report results up. Run `bridge.py "
            "relay down --help` or `relay up --help` for the arguments.",
            ["python3 scripts/bridge.py relay down miho main-cluster \"Fix the watcher.\" gup-v2",
             "python3 scripts/bridge.py relay up miho main-cluster cmd_049 done \"Fixed.\""],
            "VERB", verbs=[
            spec("down", cmd_relay_down,
                "append a command to the queue as cmd_NNN and nudge the vice captain",
                "python3 scripts/bridge.py relay down miho main-cluster \\\n"
                "    \"GuP-v2 の inbox_watcher.sh を改修せよ。\" gup-v2-self-watch high \\\n"
                "    \"self-watch が実装されること\ntestで確認されること\"\n"
                "# a message starting with '-': put -- before the arguments",
                *ids, spec("message"), spec("project"),
                spec("priority", nargs="?", default="", help="high, medium (default) or low"),
                spec("acceptance_criteria", nargs="?", default="", help="one criterion per line")),
            spec("up", cmd_relay_up,
                "print the report line for Agent Teams (unless the entry must not be relayed)",
                "python3 scripts/bridge.py relay up miho main-cluster cmd_049 done \\\n"
                "    \"self-watch 機能実装完了。\"",
                *ids, spec("cmd_id"), spec("status", help="one of " + ", ".join(RELAY_STATUSES)),
                spec("summary"),
                spec("--force", action="store_true",
                     help="relay even when a no-relay condition holds"))]),
        spec("proxy", cmd_proxy,
            "run an MCP stdio server under supervision: relay, restart on crash, observe",
            "python3 bridge.py proxy -- npx -y @modelcontextprotocol/server-filesystem .\n"
            "BRIDGE_DOCTOR_CMD='python3 server.py' python3 bridge.py proxy",
            spec("--watch", action="append", default=[], metavar="PATH",
                help="restart the server when a file under PATH changes (repeatable; adds to "
                     "doctor.watch)"),
            spec("server", nargs=argparse.REMAINDER, metavar="-- SERVER COMMAND...",
                help="the server's argv (default: doctor.command/args or BRIDGE_DOCTOR_CMD)")),
        spec("changes", "deterministic change sets, validated and executed through an MCP server",
            "Change sets under changes/<id>/: a planning agent proposes, the executor validates "
            "against the MCP server and applies, or gates for review.",
            ["python3 bridge.py changes new --subject 'Fix login' --plan plan.json",
             "python3 bridge.py changes run --once"], "ACTION", verbs=[
            spec("id", cmd_changes_id, "print the changeset_id_v1 id for a subject",
                "python3 bridge.py changes id --subject 'Refactor login flow' --snapshot snap1",
                subject, anchor),
            spec("new", cmd_changes_new, "create changes/<id>/ from a plan",
                "python3 bridge.py changes new --subject 'Fix typo' --plan plan.json "
                "--architecture notes.md", subject,
                spec("--plan", required=True, metavar="PLAN.json", help="a plan_v1 document"),
                spec("--architecture", metavar="FILE.md", help="copied to 01-architecture.md"),
                anchor),
            spec("validate", cmd_changes_validate,
                "check a change set (offline, then through the MCP server if configured)",
                "python3 bridge.py changes validate fix-typo--0123456789ab",
                spec("id", metavar="ID")),
            spec("run", cmd_changes_run, "the executor: validate, gate and apply",
                "python3 bridge.py changes run --once",
                spec("--once", action="store_true", help="one pass over changes/, then exit"),
                spec("--poll", type=poll_seconds, metavar="SECONDS",
                    help="seconds between passes (default changes.poll_sec)")),
            spec("status", cmd_changes_status, "states and decisions of change sets",
                "python3 bridge.py changes status --json", spec("id", nargs="?", metavar="ID"),
                as_json),
            spec("approve", cmd_changes_approve,
                "Tier-2 human approval of a change set waiting for review",
                "python3 bridge.py changes approve fix-login--0123456789ab",
                spec("id", metavar="ID"))]),
    ]
    for entry in commands:
        if entry is None:  # listed only: main() hands a seam verb to seam_main before argparse
            for verb in SEAM_VERBS:
                subparsers.add_parser(verb, help=next(seam["help"] for name, seam in
                                                      SEAM_COMMANDS.items()
                                                      if name.split()[0] == verb))
        else:
            values, options = entry
            (add_group if "verbs" in options else add_command)(subparsers, *values, **options)
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SEAM_VERBS:
        # Hooks run the seam verbs on every tool call: skip building the argparse
        # tree (it costs more than the verb itself); seam_main parses its own flags.
        return seam_main(argv)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return args.func(args) or EXIT_OK
    except BridgeError as exc:
        warn("error: " + exc.message)
        return exc.code
    except KeyboardInterrupt:
        warn("interrupted")
        return 130
    except BrokenPipeError as exc:
        return stdout_gone(exc)
    except Exception as exc:  # the last line of defence: one clear line, no traceback
        return unexpected_error(exc)


def stdout_gone(exc):
    """A BrokenPipeError: when stdout's reader went (`bridge.py status | head -1`), stop as
    cat(1) does, exit 1 and no error line (none either when Python flushes stdout at exit);
    a pipe to a server or an agent that broke is an error said as such."""
    import select
    poll = select.poll()
    poll.register(sys.stdout.fileno(), 0)  # only POLLERR/POLLHUP: no reader left
    if not poll.poll(0):
        return unexpected_error(exc)
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
