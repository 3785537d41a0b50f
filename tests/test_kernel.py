"""The kernel pieces every bridge shares, exercised through real files and processes.

Most behaviour is tested through the CLI in the bridge test files; these tests
pin the kernel's own promises (atomic writes, JSONL, locks, subprocess timeouts,
git safety, config errors) by importing bridge.py as a module.
"""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import (BRIDGE, IMPORT_BRIDGE, PYTHON, clean_env, load_bridge, process_running,
                      run_bridge, wait_for)

bridge = load_bridge()


def test_version_and_help():
    out = run_bridge("--version")
    assert out.returncode == 0 and out.stdout.startswith("bridge.py ")
    out = run_bridge("--help")
    assert out.returncode == 0 and "COMMAND" in out.stdout


def test_no_command_is_usage_error():
    out = run_bridge()
    assert out.returncode == 2


def test_atomic_write_replaces_and_keeps_mode(tmp_path):
    target = tmp_path / "sub" / "file.txt"
    bridge.atomic_write(target, "one")
    os.chmod(target, 0o600)
    bridge.atomic_write(target, b"two")
    assert target.read_text() == "two"
    assert (target.stat().st_mode & 0o777) == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["file.txt"]  # no temp left


def test_atomic_write_replaces_symlink_not_target(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(victim)
    bridge.atomic_write(link, "new")
    assert victim.read_text() == "keep"
    assert not link.is_symlink() and link.read_text() == "new"


def test_read_json_file_names_line_and_column(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "a": 1,\n  "b": }\n')
    with pytest.raises(bridge.BridgeError) as err:
        bridge.read_json_file(bad, "task")
    assert "line 3 column" in err.value.message and "task" in err.value.message


def test_scan_jsonl_counts_complete_lines_only(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a":1}\nnot json\n' + b'{"big":"' + b"x" * 3_000_000 + b'"}\n{"torn":')
    lines = list(bridge.scan_jsonl(path))
    assert [number for number, _, _ in lines] == [1, 2, 3]
    assert lines[0][1:] == ({"a": 1}, b'{"a":1}\n')
    assert lines[1][1:] == (None, b"not json\n")
    assert len(lines[2][1]["big"]) == 3_000_000
    assert bridge.count_complete_lines(path) == 3
    assert [number for number, _, _ in bridge.scan_jsonl(path, start=2)] == [3]
    assert list(bridge.scan_jsonl(tmp_path / "missing")) == []


def test_append_jsonl_concurrent_processes_never_interleave(tmp_path):
    path = tmp_path / "log.jsonl"
    script = IMPORT_BRIDGE + textwrap.dedent("""
        import sys
        for i in range(200):
            b.append_jsonl(sys.argv[1], {"w": sys.argv[2], "i": i, "pad": "p" * 5000})
    """)
    procs = [subprocess.Popen([PYTHON, "-c", script, str(path), str(w)]) for w in range(6)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    records = [record for _, record, _ in bridge.scan_jsonl(path)]
    assert len(records) == 1200 and all(r is not None for r in records)
    for w in range(6):
        assert [r["i"] for r in records if r["w"] == str(w)] == list(range(200))


def test_append_refuses_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("")
    (tmp_path / "link.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        bridge.append_jsonl(tmp_path / "link.jsonl", {"a": 1})
    assert victim.read_text() == ""


def test_safe_name():
    assert bridge.safe_name("fo-1.a_b") == "fo-1.a_b"
    for bad in ("..", ".", "a/b", "", "a b", "x\n"):
        with pytest.raises(bridge.BridgeError):
            bridge.safe_name(bad)


HOLD = IMPORT_BRIDGE + textwrap.dedent("""
    import sys, time
    lock = b.FileLock(sys.argv[1], meta={"role": "test"})
    print("acquired" if lock.acquire() else "busy", flush=True)
    time.sleep(float(sys.argv[2]))
""")


def test_filelock_excludes_other_process_and_recovers_after_kill(tmp_path):
    path = tmp_path / "locks" / "w.lock"
    holder = subprocess.Popen([PYTHON, "-c", HOLD, str(path), "30"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "acquired"
    lock = bridge.FileLock(path)
    assert lock.acquire() is False
    assert lock.holder["pid"] == holder.pid and lock.holder["role"] == "test"
    assert bridge.FileLock.probe(path)[0] == "held"
    assert bridge.holder_is_dead(lock.holder) is False
    holder.kill()
    holder.wait()
    assert bridge.holder_is_dead(bridge.FileLock.probe(path)[1]) is True
    assert bridge.FileLock.probe(path)[0] == "free"
    assert lock.acquire() is True
    assert lock.recovered["pid"] == holder.pid  # the crashed holder is reported
    lock.heartbeat()
    lock.release()
    assert path.exists()  # never deleted: deleting an flock'd file breaks exclusion
    assert bridge.FileLock.probe(path)[1]["released_at"]
    again = bridge.FileLock(path)
    assert again.acquire() and again.recovered is None
    again.release()


def test_holder_is_dead_only_when_provable():
    me = bridge.process_identity()
    assert bridge.holder_is_dead(me) is False
    assert bridge.holder_is_dead(dict(me, host="elsewhere", pid=999999)) is False
    assert bridge.holder_is_dead(dict(me, start_ticks="1")) is True  # pid reused
    assert bridge.holder_is_dead(dict(me, boot_id="other-boot")) is True


def test_acquire_flock_times_out_against_flock1_style_holder(tmp_path):
    path = tmp_path / "q.lock"
    fd = bridge.acquire_flock(path, timeout=1)
    script = IMPORT_BRIDGE + "; import sys; print(b.acquire_flock(sys.argv[1], timeout=0.3))"
    out = subprocess.run([PYTHON, "-c", script, str(path)], capture_output=True, text=True)
    assert out.stdout.strip() == "None"
    bridge.release_flock(fd)
    out = subprocess.run([PYTHON, "-c", script, str(path)], capture_output=True, text=True)
    assert out.stdout.strip().isdigit()


def test_run_command_captures_and_reports(tmp_path):
    res = bridge.run_command([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
    assert (res.exit_code, res.stdout, res.stderr, res.timed_out) == (3, "out\n", "err\n", False)
    assert res.describe() == "exit 3"
    res = bridge.run_command(["definitely-not-a-command-xyz"])
    assert res.exit_code == 127 and "cannot start" in res.error
    res = bridge.run_command("cat", shell=True, stdin_data="piped")
    assert res.stdout == "piped"
    res = bridge.run_command([sys.executable, "-c", "import sys; sys.stdout.write('word ' * 20000)"], cap_bytes=1000)
    assert res.stdout.startswith("word " * 100 + "\n[... 99004 bytes cut here")
    assert res.stdout.endswith("...]\n " + "word " * 99) and res.dropped_bytes == 99004
    # no character between tokens near the cut (minified JSON, base64): never half a token
    res = bridge.run_command([sys.executable, "-c", "import sys; sys.stdout.write('x' * 100000)"], cap_bytes=1000)
    assert res.stdout == "\n[... 100000 bytes cut here: over the capture cap ...]\n"


def test_run_command_stdin_is_closed():
    res = bridge.run_command([sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"], timeout=10)
    assert res.stdout.strip() == "''"


def test_run_command_timeout_kills_grandchildren(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    script = ("sh -c 'echo $$ > %s; trap \"\" TERM; sleep 60' & sleep 60" % pidfile)
    started = time.monotonic()
    res = bridge.run_command(script, shell=True, timeout=1, kill_grace=0.5)
    assert res.timed_out and res.exit_code is None and "timed out" in res.describe()
    assert time.monotonic() - started < 15
    grandchild = int(pidfile.read_text())
    assert wait_for(lambda: not process_running(grandchild), 10)      # killed: it goes at once


def test_run_command_does_not_hang_on_grandchild_holding_pipes():
    started = time.monotonic()
    res = bridge.run_command("sleep 30 & echo parent-done", shell=True, timeout=60)
    assert res.exit_code == 0 and "parent-done" in res.stdout
    assert time.monotonic() - started < 15


@pytest.mark.parametrize("pidfd", [True, False])
def test_run_command_without_a_pidfd_behaves_the_same(monkeypatch, pidfd):
    """Where os.pidfd_open is missing (not Linux) the exit is polled: the same results."""
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    res = bridge.run_command([sys.executable, "-c", "import os, sys, time; os.close(1); "
                              "time.sleep(0.2); sys.stderr.write('late'); sys.exit(3)"])
    assert (res.exit_code, res.stdout, res.stderr, res.held) == (3, "", "late", False)
    res = bridge.run_command("cat; echo parent-done; sleep 30 &", shell=True, stdin_data="x" * 200000)
    assert res.exit_code == 0 and res.stdout == "x" * 200000 + "parent-done\n" and not res.held
    res = bridge.run_command("trap '' TERM; echo up; sleep 30", shell=True, timeout=0.5, kill_grace=0.2)
    assert (res.timed_out, res.signal, res.stdout) == (True, 9, "up\n")
    assert bridge.run_command(["echo", "hello"], cap_bytes=1).dropped_bytes == 6


def test_run_command_where_the_kernel_refuses_a_pidfd_kills_soon_after_the_exit(tmp_path):
    """A container whose seccomp profile predates pidfd_open (Docker's default before 20.10)
    refuses it: the exit is polled. A command stopped for its timeout that exits on SIGTERM,
    leaving a grandchild that ignores it holding the pipes, has its group killed within half a
    second of that exit, not at the end of kill_grace."""
    pidfile = tmp_path / "grandchild.pid"
    script = IMPORT_BRIDGE + textwrap.dedent("""
        import ctypes, os, struct, sys
        # seccomp filter: pidfd_open (434 on every Linux architecture but alpha) fails with EPERM
        code = [(0x20, 0, 0, 0), (0x15, 0, 1, 434), (0x06, 0, 0, 0x50001), (0x06, 0, 0, 0x7fff0000)]
        insns = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in code))
        prog = struct.pack("HP", len(code), ctypes.addressof(insns))
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.c_char_p(prog), 0, 0):
            sys.exit("no seccomp here: errno %d" % ctypes.get_errno())
        try:
            os.pidfd_open(os.getpid())
            sys.exit("pidfd_open still works")
        except PermissionError:
            pass
        res = b.run_command("sh -c 'echo $$ > %s; trap \\"\\" TERM; exec sleep 60' & wait" % sys.argv[1],
                            shell=True, timeout=0.5, kill_grace=20)
        print(res.timed_out, round(res.duration, 1))
        """)
    out = subprocess.run([PYTHON, "-c", script, str(pidfile)], capture_output=True, text=True,
                         timeout=60)
    if out.stderr.startswith("no seccomp here"):
        pytest.skip(out.stderr)
    timed_out, duration = out.stdout.split()
    assert timed_out == "True" and float(duration) < 10, (out.stdout, out.stderr)
    grandchild = int(pidfile.read_text())
    assert wait_for(lambda: not process_running(grandchild), 10)


@pytest.mark.parametrize("how", ["ctrl-c", "on_start"])
def test_run_command_ends_the_group_when_it_raises(tmp_path, how):
    """Ctrl-C in a CLI command (KeyboardInterrupt) or a callback's error while a command runs:
    the command, in a session of its own that no terminal signal reaches, ends with it."""
    pidfile = tmp_path / "child.pid"
    script = IMPORT_BRIDGE + textwrap.dedent("""
        import os, signal, sys, threading, time
        pidfile = sys.argv[1]
        def interrupt():
            while not os.path.exists(pidfile):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)
        def on_start(proc):
            if sys.argv[2] == "on_start":
                while not os.path.exists(pidfile):
                    time.sleep(0.01)
                raise OSError("cannot write the task lock")
            threading.Thread(target=interrupt, daemon=True).start()
        try:
            b.run_command("echo $$ > %s.tmp && mv %s.tmp %s && exec sleep 60" % ((pidfile,) * 3),
                          shell=True, timeout=60, on_start=on_start)
        except (KeyboardInterrupt, OSError) as exc:
            print(type(exc).__name__)
        """)
    out = subprocess.run([PYTHON, "-c", script, str(pidfile), how], capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == ("KeyboardInterrupt" if how == "ctrl-c" else "OSError"), out.stderr
    child = int(pidfile.read_text())
    alive = process_running(child)
    if alive:
        os.kill(child, 9)
    assert not alive


def test_git_hooks_never_fire_and_index_untouched(git_repo):
    hook = git_repo / ".git" / "hooks" / "pre-commit"
    marker = git_repo.parent / "hook-fired"
    hook.write_text("#!/bin/sh\ntouch %s\nexit 1\n" % marker)
    hook.chmod(0o755)
    g = bridge.Git(git_repo)
    base = g.head()
    (git_repo / "new.txt").write_text("untracked\n")
    (git_repo / "README.md").write_text("changed\n")
    (git_repo / ".ai-handoff").mkdir()
    (git_repo / ".ai-handoff" / "x").write_text("queue\n")
    index_before = (git_repo / ".git" / "index").read_bytes()
    patch = g.worktree_diff(base, (".ai-handoff",), "--binary")
    assert "new.txt" in patch and "README.md" in patch and ".ai-handoff" not in patch
    assert (git_repo / ".git" / "index").read_bytes() == index_before
    assert "2 files changed" in g.worktree_diff(base, (".ai-handoff",), "--shortstat")
    g.run("add", "-A")
    g.run("commit", "-q", "-m", "agent commit")
    assert not marker.exists()
    assert "new.txt" in g.worktree_diff(base, (".ai-handoff",), "--binary")  # commits since base included
    assert g.current_branch() == "main"
    assert g.run("status", "--porcelain").stdout == ""


def test_git_toplevel_walks_up(tmp_path, git_repo):
    deep = git_repo / "a" / "b"
    deep.mkdir(parents=True)
    assert bridge.git_toplevel(deep) == str(git_repo)
    assert bridge.git_toplevel(tmp_path) is None


def test_config_layers_and_errors(tmp_path, monkeypatch):
    cfg_path = tmp_path / "bridge.config.json"
    cfg_path.write_text(json.dumps({"redaction_patterns": ["abc"], "nonsense": 1}))
    config = bridge.load_config(tmp_path, env={})
    assert config["redaction_patterns"] == ["abc"] and config["nonsense"] == 1
    cfg_path.write_text(json.dumps({"redaction_patterns": "abc"}))
    with pytest.raises(bridge.BridgeError) as err:
        bridge.load_config(tmp_path, env={})
    assert "redaction_patterns must be a list" in err.value.message
    cfg_path.write_text("{\n oops\n}")
    with pytest.raises(bridge.BridgeError) as err:
        bridge.load_config(tmp_path, env={})
    assert "line 2" in err.value.message
    with pytest.raises(bridge.BridgeError):
        bridge.load_config(tmp_path, path=tmp_path / "missing.json", env={})


def test_message_reader_both_framings():
    import io
    stream = io.BytesIO(bridge.frame_message({"id": 1}) + b"\r\n" +
                        bridge.frame_message({"id": 2}, "content-length") +
                        b"Content-Length: 9\r\nContent-Type: x\r\n\r\n{\"id\":3}\n")
    assert json.loads(bridge.read_message(stream)) == {"id": 1}
    assert json.loads(bridge.read_message(stream)) == {"id": 2}
    assert json.loads(bridge.read_message(stream)) == {"id": 3}
    assert bridge.read_message(stream) is None


def test_message_reader_bounds_a_line():
    import io
    stream = io.BytesIO(b'{"id":1}\n' + b"x" * 100)
    assert bridge.read_message(stream, max_bytes=64) == b'{"id":1}'
    with pytest.raises(bridge.BridgeError) as err:
        bridge.read_message(stream, max_bytes=64)
    assert "64 byte limit" in err.value.message
    assert bridge.read_message(io.BytesIO(b"y" * 64 + b"\r\n"), max_bytes=64) == b"y" * 64


def test_example_config_loads_without_warnings(tmp_path):
    """bridge.config.example.json documents every key: it must load cleanly as a config."""
    out = run_bridge("redact", "--root", str(tmp_path), "--config",
                     str(BRIDGE.parent / "bridge.config.example.json"), input="plain text\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "plain text\n" and out.stderr == ""


def test_example_config_documents_every_key():
    example = json.loads((BRIDGE.parent / "bridge.config.example.json").read_text())

    def keys(tree, prefix=""):
        found = set()
        for key, value in tree.items():
            if key.startswith("_comment"):
                continue
            found.add(prefix + key)
            if isinstance(value, dict) and value:
                found |= keys(value, prefix + key + ".")
        return found

    assert keys(bridge.CONFIG_DEFAULTS) == keys(example)
    for key, default, _kind, _limits in bridge.CONFIG_KEYS:  # "the values shown are the defaults"
        value = example
        for part in key.split("."):
            value = value[part]
        assert value == default, key


def test_readme_documents_every_config_key_and_no_other():
    """Each CONFIG_KEYS key is named in README.md: in full (`notify.timeout_sec`), as `.rest`
    after a key of its section in a table row, or in a section's prose `(`relay` in
    `bridge.config.json`): `queue_file`, ...`; and a configuration table names no key that
    is gone (a removed key left in a table is a setting the user sets for nothing)."""
    import re
    readme = (BRIDGE.parent / "README.md").read_text()
    keys = [key for key, _default, _kind, _limits in bridge.CONFIG_KEYS]
    named = set(re.findall(r"`([\w.]+)`", readme))
    for row in re.findall(r"^\| `(\w+)\.\w+`((?:, `\.\w+`)+)", readme, re.M):
        named |= {row[0] + rest for rest in re.findall(r"`(\.\w+)`", row[1])}
    for section, text in re.findall(r"\(`(\w+)` in `bridge\.config\.json`\): (.*?)\n\n", readme, re.S):
        named |= {section + "." + name for name in re.findall(r"`([\w.]+)`", text)}
    assert [key for key in keys if key not in named] == []
    # the Configuration section states the floors every section shares: a key with one is named
    section = readme.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    general = set(re.findall(r"`([\w.]+)`", section))
    floors = (bridge.POLL_RANGE, bridge.TIMEOUT, (1, None))
    assert [key for key, _d, _k, limits in bridge.CONFIG_KEYS
            if limits in floors and key not in general] == []
    for table in re.findall(r"^\| key[^\n]*\n(?:\|[^\n]*\n)+", readme, re.M):
        for row in table.splitlines()[2:]:
            previous = ""
            for name in re.findall(r"`([\w.]+)`", row.split("|")[1]):
                name = previous.rsplit(".", 1)[0] + name if name.startswith(".") else name
                previous = name
                assert name in keys, row


def test_command_lists_name_every_subcommand_and_readme_links_resolve():
    """The README's command table and the module docstring list every subcommand `--help`
    does, and every in-page link of the README names a heading (GitHub's anchors)."""
    import re
    readme = (BRIDGE.parent / "README.md").read_text()
    commands = set(re.findall(r"^    (\w+)\s", run_bridge("--help").stdout, re.M))
    table = readme.split("| command | what it does | spec |", 1)[1].split("\n\n", 1)[0]
    in_table = {word for row in re.findall(r"^\| (.*?) \|", table, re.M)
                for word in re.findall(r"`(\w+)", row)}
    docstring = bridge.__doc__.split("Subcommands", 1)[1].split("Run `", 1)[0]
    in_docstring = {word for line in re.findall(r"^  (\w.*)$", docstring, re.M)
                    for word in re.findall(r"(?:^|, )(\w+)", line)}
    assert sorted(commands - in_table) == [] and sorted(commands - in_docstring) == []
    contents = re.findall(r"^  (\d)\. (\w+) ", bridge.__doc__, re.M)  # the docstring's table of contents
    assert contents == re.findall(r"^# (\d)\. (\w+)", BRIDGE.read_text(), re.M)  # the section banners
    prose = re.sub(r"```.*?```", "", readme, flags=re.S)
    anchors = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.*)$", prose, re.M)}
    assert sorted(set(re.findall(r"\]\(#([^)]+)\)", prose)) - anchors) == []


def test_every_command_help_has_an_example():
    import re as _re
    listing = run_bridge("--help").stdout
    commands = _re.findall(r"^    (\w+)\s", listing, _re.M)
    assert {"init", "watch", "egress", "redact"} <= set(commands)
    for command in commands:
        out = run_bridge(command, "--help")
        assert out.returncode == 0, (command, out.stderr)
        assert "example" in out.stdout.lower(), command


@pytest.mark.parametrize("value, message", [
    (5, "must be a command string or a list of strings"),
    ('"unterminated', "cannot split"),
    ([1.5], "must be a command string or a list of strings"),
])
def test_split_command_names_the_key(value, message):
    with pytest.raises(bridge.BridgeError) as err:
        bridge.split_command(value, "doctor.command")
    assert "doctor.command" in err.value.message and message in err.value.message
    assert bridge.split_command("a 'b c'", "k") == ["a", "b c"]
    assert bridge.split_command(["x", 1], "k") == ["x", "1"]
    assert bridge.split_command(None, "k") is None


def test_bad_doctor_command_is_a_clear_config_error(tmp_path):
    (tmp_path / "bridge.config.json").write_text('{"doctor": {"commandLine": "\\"x"}}')
    out = run_bridge("proxy", "--root", str(tmp_path), cwd=tmp_path)
    assert out.returncode == 2
    assert "doctor.commandLine" in out.stderr and "Traceback" not in out.stderr


def test_negative_numbers_in_config_are_refused(tmp_path):
    (tmp_path / "bridge.config.json").write_text('{"worker_lock_ttl_sec": -5}')
    with pytest.raises(bridge.BridgeError) as err:
        bridge.load_config(tmp_path, env={})
    assert "worker_lock_ttl_sec must be a number >= 1, got -5" in err.value.message


def test_append_short_write_cuts_or_ends_its_fragment(tmp_path):
    """A write cut short (here: a file size limit) leaves no fragment a later record could be
    glued to: cut off when nobody appended since, ended with a newline when someone did."""
    target = tmp_path / "log.jsonl"
    script = textwrap.dedent("""
        import os, resource, signal, sys
        sys.path.insert(0, sys.argv[1])
        import bridge
        path, mode = sys.argv[2], sys.argv[3]
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        real_write = os.write
        def write(fd, data):
            # another appender lands first, then the write is cut short (a disk that
            # filled up then; a size limit would refuse the newline too, so simulated)
            if len(data) > 10:
                other = os.open(path, os.O_WRONLY | os.O_APPEND)
                real_write(other, b'{"other":1}\\n')
                os.close(other)
                return real_write(fd, data[:13])
            return real_write(fd, data)
        if mode == "other-before":
            os.write = write
        else:
            size = os.path.getsize(path)
            resource.setrlimit(resource.RLIMIT_FSIZE, (size + 25, size + 25))
        try:
            bridge.append_jsonl(path, {"record": "x" * 100})
        except OSError as exc:
            print("error:", exc.filename, exc.strerror)
    """)
    for mode, expected in (("alone", b'{"first":1}\n'),
                           ("other-before", b'{"first":1}\n{"other":1}\n{"record":"xx\n')):
        target.write_bytes(b'{"first":1}\n')
        out = subprocess.run([PYTHON, "-c", script, str(BRIDGE.parent), str(target), mode],
                             capture_output=True, text=True, timeout=60,  # no coverage: its
                             env={k: v for k, v in os.environ.items()  # file would hit the limit
                                  if not k.startswith("COVERAGE_")})
        assert out.stdout.startswith("error: %s short write" % target), (out.stdout, out.stderr)
        assert target.read_bytes() == expected, mode
    bridge.append_jsonl(target, {"next": 1})
    assert target.read_bytes().endswith(b'\n{"next":1}\n')


def test_token_rule_literal_prefixes_match_the_regex_parser():
    """The redactor skips (and never compiles) a token rule whose literal prefix is not in a
    short text: that prefix must really start every match of the rule."""
    try:
        import re._parser as sre_parse  # Python 3.11+
    except ImportError:
        import sre_parse
    for pattern, _ in bridge._LITERAL_RULES:
        prefix = bridge._literal_prefix(pattern)
        assert len(prefix) > 1, pattern
        parsed = list(sre_parse.parse(pattern))
        ops = parsed[:len(prefix)]
        assert [(str(op).upper(), chr(arg)) for op, arg in ops] == [("LITERAL", ch) for ch in prefix], pattern
    for index, head in enumerate("AELGS"):     # the upper-case token scans, by first letter
        assert bridge._UPPER_RULES[index].startswith(head)
    assert bridge._literal_prefix("ab?c") == "a" and bridge._literal_prefix("ab{2}") == "a"
    assert bridge._literal_prefix("ab+") == "ab" and bridge._literal_prefix(r"SG\.x") == "SG"
    # the prefilters serve short texts; a long one gets every rule, as before
    token = "ghp_" + "a1B2" * 9
    for text in (token, "id=" + token + " Bearer " + "q7Z" * 9,
                 ("word " * 20000) + token + " Bearer " + "q7Z" * 9):
        redacted = bridge.Redactor((), env={}).redact(text)
        assert token not in redacted and "q7Z" * 9 not in redacted, len(text)
    # a prefix nothing else uses is a token after a word character too
    assert bridge.Redactor((), env={}).redact("x" + token) == "x" + bridge.REDACTED
    # a short one is not: `disk_test_` is no Stripe key
    assert bridge.Redactor((), env={}).redact("disk_test_" + "a1B2" * 5) == "disk_test_" + "a1B2" * 5


def test_redacting_a_short_id_compiles_only_the_rules_its_text_can_match(tmp_path):
    """A hook redacts a few short ids: it must not pay for compiling every rule."""
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        import bridge
        r = bridge.Redactor((), env={"GITHUB_TOKEN": "ghp_" + "a1B2" * 9})
        clean = r.redact("8f1c2d3e-9a0b-4c5d-8e7f-0123456789ab")
        compiled = sorted(str(k) for k in bridge._COMPILED)
        leak = r.redact("id gh" + "p_" + "a1B2" * 9)
        print(clean == "8f1c2d3e-9a0b-4c5d-8e7f-0123456789ab", "[REDACTED]" in leak,
              "kv_gates" in compiled, "kv" in compiled,
              sum(k.startswith(("('literal'", "('upper'", "('b64'", "('prefixed'")) for k in compiled),
              "urllib.parse" in sys.modules, "base64" in sys.modules)
    """)
    out = subprocess.run([PYTHON, "-I", "-S", "-c", code, str(BRIDGE.parent)], capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.split() == ["True", "True", "False", "False", "0", "False", "False"], out


# ---- the file layer: every open goes through the kernel ---------------------------

import ast  # noqa: E402

# Calls that open a file outside the kernel on purpose, as (enclosing function, first
# argument). Each is not a path in a repository.
OPEN_ALLOWED = {
    ("stdout_gone", "os.devnull"),              # stdout redirected after its reader went away
}
# shutil's copies (and a move across filesystems) open both paths themselves and follow a
# symlink (to /dev/zero, say); io.FileIO is open() without the buffer.
_OPENERS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "copyfile", "copy2",
            "copytree", "FileIO"}


def stray_opens(source):
    """(line, call) of every call that opens a file by path outside section 1 (KERNEL):
    open(), os.open(), io.open(), x.open() (pathlib), Path.read_text() and friends."""
    lines = source.splitlines()
    kernel = (lines.index("# 1. KERNEL"), lines.index(next(l for l in lines if l.startswith("# 2. "))))
    found, scope = [], []

    class Visitor(ast.NodeVisitor):
        def visit_FunctionDef(self, node):
            scope.append(node.name)
            self.generic_visit(node)
            scope.pop()

        def visit_Call(self, node):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else \
                func.attr if isinstance(func, ast.Attribute) else None
            if name in ("copy", "move") and getattr(getattr(func, "value", None), "id", None) == "shutil":
                name = "copyfile"  # another object's copy() opens nothing
            if name in _OPENERS and not kernel[0] < node.lineno <= kernel[1]:
                first = ast.unparse(node.args[0]) if node.args else ""
                if (scope[-1] if scope else None, first) not in OPEN_ALLOWED:
                    found.append((node.lineno, ast.unparse(node)[:80]))
            self.generic_visit(node)

    Visitor().visit(ast.parse(source))
    return found


def test_no_open_outside_the_kernel():
    source = BRIDGE.read_text(encoding="utf-8")
    assert stray_opens(source) == []
    # every allowlist entry is still needed (a stale one would hide nothing, but mislead)
    used = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and call.args and (
                        getattr(call.func, "id", None) == "open" or getattr(call.func, "attr", None) == "open"):
                    used.add((node.name, ast.unparse(call.args[0])))
    assert OPEN_ALLOWED <= used


@pytest.mark.parametrize("stray", [
    "    with open(path, 'rb') as handle:\n        return handle.read()\n",
    "    return os.open(path, os.O_RDONLY)\n",
    "    import io\n    return io.open(path).read()\n",
    "    from pathlib import Path\n    return Path(path).open().read()\n",
    "    from pathlib import Path\n    return Path(path).read_text()\n",
    "    import shutil\n    shutil.copyfile(path, path + '.bak')\n",
    "    import shutil\n    shutil.copy(path, path + '.bak')\n",
    "    import shutil\n    shutil.move(path, path + '.bak')\n",
    "    import io\n    return io.FileIO(path).read()\n",
])
def test_a_new_stray_open_is_caught(stray):
    """The detector flags an open added to a bridge section (here, the end of WATCH)."""
    source = BRIDGE.read_text(encoding="utf-8")
    banner = source.index("# 3. SEAM")
    cut = source.rindex("\n# =====", 0, banner)
    patched = source[:cut] + "\n\ndef _stray(path):\n" + stray + "\n" + source[cut:]
    before = stray_opens(source)
    found = [(line, call) for line, call in stray_opens(patched)
             if patched.splitlines()[line - 2].startswith(("def _stray", "    import", "    from"))]
    assert len(found) == 1 and len(stray_opens(patched)) == len(before) + 1


def test_read_input_refuses_fifo_symlink_and_oversize(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    outside = tmp_path / "outside.json"
    outside.write_text('{"secret": 1}')
    link = tmp_path / "link.json"
    link.symlink_to(outside)
    for path, why in ((fifo, "not a regular file"), (link, "symlink")):
        with pytest.raises(bridge.BridgeError) as err:
            bridge.read_json_file(path, "task")  # a FIFO would block a plain open() forever
        assert str(path) in err.value.message and why in err.value.message
    with pytest.raises(bridge.BridgeError) as err:
        bridge.read_input(outside, "plan", limit=5)
    assert "larger than 5 bytes" in err.value.message
    assert bridge.read_input(tmp_path / "missing", missing=None) is None


def test_json_nesting_limit_without_recursion(tmp_path):
    deep = "[" * 100000 + "]" * 100000
    for data in (deep, deep.encode()):
        with pytest.raises(ValueError, match="nested deeper than 256"):
            bridge.parse_json(data)
    # brackets inside strings do not count; the limit itself is fine
    assert bridge.parse_json('["' + "[" * 5000 + '"]') == ["[" * 5000]
    assert bridge.parse_json(b'["\\"' + b"[" * 5000 + b'"]') == ['"' + "[" * 5000]
    ok = "[" * 256 + "]" * 256
    assert bridge.parse_json(ok) is not None
    path = tmp_path / "deep.json"
    path.write_text('{"a":' * 300 + "1" + "}" * 300)
    with pytest.raises(bridge.BridgeError, match="nested deeper"):
        bridge.read_json_file(path, "config file")


def test_append_and_lock_refuse_fifo(tmp_path):
    fifo = tmp_path / "log.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as err:
        bridge.append_jsonl(fifo, {"a": 1})
    assert "not a regular file" in str(err.value) and str(fifo) in str(err.value)
    with pytest.raises(OSError):
        bridge.open_lock(fifo)


def test_fsync_of_a_folder_swapped_for_a_fifo_never_blocks(tmp_path):
    """The folder fsync after a rename opens the folder: a FIFO put in its place meanwhile
    is skipped (O_DIRECTORY), not waited on for a writer that never comes."""
    fifo = tmp_path / "state"
    os.mkfifo(fifo)
    code = IMPORT_BRIDGE + "; import sys; b._fsync_dir(sys.argv[1])"
    done = subprocess.run([sys.executable, "-c", code, str(fifo)], timeout=20)
    assert done.returncode == 0


def test_open_lock_and_create_once_never_follow_a_symlink(tmp_path):
    outside = tmp_path / "outside"
    link = tmp_path / "x.lock"
    link.symlink_to(outside)  # dangling: following it would create the file outside
    with pytest.raises(OSError) as err:
        bridge.open_lock(link)
    assert "symlink" in str(err.value) and str(link) in str(err.value)
    with pytest.raises(FileExistsError):
        bridge.create_once(link)
    assert not outside.exists()


def test_make_dirs_refuses_a_symlinked_folder_on_the_way(tmp_path):
    root, outside = tmp_path / "repo", tmp_path / "outside"
    outside.mkdir()
    (root / "state").mkdir(parents=True)
    assert bridge.make_dirs(root / "state" / "a" / "b", root) == str(root / "state" / "a" / "b")
    (root / "state" / "results").symlink_to(outside)
    with pytest.raises(bridge.BridgeError) as err:
        bridge.make_dirs(root / "state" / "results" / "x", root)
    assert str(root / "state" / "results") in err.value.message and "symlink" in err.value.message
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("config, message", [
    ({"bead": {"timeout_sec": 0}}, "bead.timeout_sec must be a number >= 0.1, got 0"),
    ({"changes": {"mcp": {"timeout_sec": 0}}}, "changes.mcp.timeout_sec must be a number >= 0.1, got 0"),
    ({"progress_sec": 0}, "progress_sec must be a number >= 0.1, got 0"),
    ({"relay": {"lock_attempts": 0}}, "relay.lock_attempts must be a number >= 1, got 0"),
    ({"poll_sec": None}, "poll_sec must be a number, got null"),
    ({"log_size_cap_kb": None}, "log_size_cap_kb must be a whole number, got null"),
    ({"worker_lock_ttl_sec": None}, "worker_lock_ttl_sec must be a whole number, got null"),
    ({"relay": {"lock_attempts": None}}, "relay.lock_attempts must be a whole number, got null"),
    ({"seam": {"command": None}}, "seam.command must be a non-empty string, got null"),
    ({"poll_sec": 5000}, "poll_sec must be a number between 0.05 and 3600, got 5000"),
    ({"workers": 10 ** 400}, "workers must be a number between 1 and 64, got 1" + "0" * 400),  # no OverflowError
    ({"changes": {"poll_sec": 0.01}}, "changes.poll_sec must be a number between 0.05 and 3600, got 0.01"),
    ({"observability": {"port": 70000}}, "observability.port must be a number between 0 and 65535, got 70000"),
    ({"changes": {"dir": ""}}, "changes.dir must be a non-empty string, got \"\""),
    ({"seam": {"wake_command": ["codex", 5]}},
     "seam.wake_command must be a non-empty list of strings (an argv template), got [\"codex\", 5]"),
    ({"doctor": {"cwd": 5}}, "doctor.cwd must be a string or null, got 5"),
    # a key with a set of values is checked when read too, by every command (not where used)
    ({"isolation": "container"}, 'isolation must be one of checkout, worktree, got "container"'),
    ({"changes": {"mcp": {"framing": "lsp"}}},
     'changes.mcp.framing must be one of content-length, line, got "lsp"'),
    ({"proxy": {"log_level": "verbose"}},  # was silently "info"
     'proxy.log_level must be one of debug, info, warn, error, got "verbose"'),
    ({"notify": {"on": ["failed", "needs_approval"]}}, "notify.on must be a list of success, failed, "
     'blocked, needs_confirmation, queue_stopped, got ["failed", "needs_approval"]'),
    # every list holds strings (branches, globs, origins, argv words, feature ids): not checked
    # before, [5] was turned into "5" (doctor.args), never matched (critical_features) or crashed
    ({"protected_branches": ["main", 5]}, 'protected_branches must be a list of strings, got ["main", 5]'),
    ({"doctor": {"args": [5]}}, "doctor.args must be a list of strings, got [5]"),
    ({"changes": {"critical_features": [None]}}, "changes.critical_features must be a list of strings, got [null]"),
    ({"relay": {"queue_file": "../q.yaml"}},
     'relay.queue_file must be a file name ([A-Za-z0-9._-]+, not . or ..), got "../q.yaml"'),
])
def test_config_value_errors_name_the_key_and_file(tmp_path, config, message):
    """Every value of the wrong type or out of range (0 where it means nothing, null for a
    number) is refused when the config is read, exit 2, naming the file and the key, whatever
    command reads it; none is replaced by a default or left to fail later."""
    path = tmp_path / "bridge.config.json"
    path.write_text(json.dumps(config))
    out = run_bridge("status", "--root", tmp_path, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr == "bridge: error: %s: %s\n" % (path, message)


def test_config_error_from_the_environment_names_the_variable(tmp_path):
    env = clean_env(BRIDGE_OBS_PORT="70000")
    out = run_bridge("status", "--root", tmp_path, cwd=tmp_path, env=env)
    assert out.returncode == 2 and out.stderr == (
        "bridge: error: environment variable BRIDGE_OBS_PORT: observability.port must be a number "
        "between 0 and 65535, got 70000\n")


def test_a_config_choice_is_read_in_any_case(tmp_path):
    assert bridge.load_config(tmp_path, env={"BRIDGE_LOG_LEVEL": "DEBUG"})["proxy"]["log_level"] == "debug"


def test_config_defaults_and_ranges_are_one_table():
    """CONFIG_DEFAULTS is built from CONFIG_KEYS, and every default passes its own check."""
    for key, default, _kind, _limits in bridge.CONFIG_KEYS:
        node = bridge.CONFIG_DEFAULTS
        for name in key.split("."):
            node = node[name]
        assert node == default
        assert bridge.config_value(key, default, "defaults") == default


def test_poll_flag_range_is_the_config_range(tmp_path):
    for argv in (["watch", "--poll", "0"], ["changes", "run", "--poll", "nan"]):
        out = run_bridge(*argv, "--root", tmp_path, cwd=tmp_path)
        assert out.returncode == 2 and "argument --poll: SECONDS must be a number between 0.05 and 3600" \
            in out.stderr, out.stderr


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_config_file_fifo_or_symlink_is_an_error_naming_it(tmp_path, kind):
    root = tmp_path / "repo"
    root.mkdir()
    config = root / "bridge.config.json"
    if kind == "fifo":
        os.mkfifo(config)  # a plain open() waits for a writer forever
    else:
        outside = tmp_path / "outside.json"
        outside.write_text('{"poll_sec": 5}')
        config.symlink_to(outside)
    for args in (("redact", "--root", root), ("redact", "--config", config)):
        out = run_bridge(*args, input="x", timeout=20)
        assert out.returncode == 2 and str(config) in out.stderr, out.stderr


@pytest.mark.parametrize("text", ["[" * 100000, "[" * 100000 + "1", '{"a":' * 100000,
                                  "[" * 200 + "[" * 200 + "]" * 200])
def test_unclosed_deep_json_is_a_value_error(tmp_path, text):
    """Brackets left open count towards the nesting limit too: the decoder descends into
    each before it finds the text unterminated (a RecursionError, not a ValueError)."""
    with pytest.raises(ValueError, match="nested deeper than 256"):
        bridge.parse_json(text)
    (tmp_path / "bridge.config.json").write_text(text)
    out = run_bridge("redact", "--root", tmp_path, input="x")
    assert out.returncode == 2 and "bridge.config.json" in out.stderr and "nested deeper" in out.stderr, out.stderr


def test_a_dangling_symlink_config_is_an_error_naming_it(tmp_path):
    """A bridge.config.json that is a link to nowhere is refused like any symlinked config,
    never taken for no config at all (the defaults would silently apply)."""
    (tmp_path / "bridge.config.json").symlink_to(tmp_path / "nowhere.json")
    out = run_bridge("redact", "--root", tmp_path, input="x")
    assert out.returncode == 2 and str(tmp_path / "bridge.config.json") in out.stderr \
        and "symlink" in out.stderr, out.stderr


@pytest.mark.parametrize("text, message", [
    ('{"relay": {"lock_retry_sleep_sec": 1e400}}', "relay.lock_retry_sleep_sec must be a number >= 0, got Infinity"),
    ('{"lifecycle": {"cooldown": Infinity}}', "lifecycle.cooldown must be a number >= 0, got Infinity"),
])
def test_an_infinite_number_in_config_is_refused(tmp_path, text, message):
    """1e400 reads as infinity: no duration or count is infinite (time.sleep(inf) is an
    OverflowError at the first retry), so it is refused with the key and file, exit 2."""
    path = tmp_path / "bridge.config.json"
    path.write_text(text)
    out = run_bridge("status", "--root", tmp_path, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == "bridge: error: %s: %s\n" % (path, message), out.stderr


def test_an_infinite_number_from_the_environment_is_refused(tmp_path):
    out = run_bridge("status", "--root", tmp_path, cwd=tmp_path, env=clean_env(BRIDGE_RESTART_WINDOW="inf"))
    assert out.returncode == 2 and "environment variable BRIDGE_RESTART_WINDOW: lifecycle.restartWindow" \
        in out.stderr and "Infinity" in out.stderr, out.stderr


@pytest.mark.parametrize("planted", ["/dev/zero", "fifo"])
def test_worktree_diff_never_copies_a_planted_index(git_repo, planted):
    """An agent that replaces .git/index with a link to /dev/zero (or a FIFO) must not make
    the watcher's diff copy it: shutil.copyfile followed the link and wrote until the disk
    was full. The index is only a cache for `git add -A`: without a regular one the diff is
    made from an empty index, the same diff. (Run with a 64 MiB file size limit.)"""
    base = bridge.Git(git_repo).head()
    (git_repo / "new.txt").write_text("untracked\n")
    index = git_repo / ".git" / "index"
    index.unlink()
    if planted == "fifo":
        os.mkfifo(index)
    else:
        index.symlink_to(planted)
    script = ("import resource, signal, sys; sys.path.insert(0, %r); import bridge\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))\n"
              "print(bridge.Git(%r).worktree_diff(%r, (), '--stat'))\n"
              % (str(BRIDGE.parent), str(git_repo), base))
    out = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "new.txt" in out.stdout, out.stderr[-2000:]
    assert [p.name for p in (git_repo / ".git").iterdir() if p.name.startswith("bridge-index")] == []


def test_every_readme_quick_start_is_run_by_a_test_and_linked_from_the_top():
    """A quick start no test runs drifts from the code unnoticed: each `<!-- quickstart NAME -->`
    block in the README must be run by a test, and the five-minute start links each one's heading."""
    import re
    readme = (BRIDGE.parent / "README.md").read_text()
    names = re.findall(r"^<!-- quickstart (\w+) -->$", readme, re.M)
    assert sorted(names) == ["changes", "proxy", "relay", "seam", "watch"]
    tests = "".join(p.read_text() for p in BRIDGE.parent.joinpath("tests").glob("test_*.py"))
    assert [n for n in names if 'readme_quickstart("quickstart %s")' % n not in tests] == []
    # GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens
    anchors = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.*)$", readme, re.M)}
    top = readme.split("## Five-minute start\n", 1)[1].split("\n## ", 1)[0]
    links = re.findall(r"\[Quick start\]\(#([^)]+)\)", top)
    assert len(links) == 5 and [a for a in links if a not in anchors] == []
    for name in names:  # each linked heading is the one right above its quick start
        heading = readme.split("<!-- quickstart %s -->" % name, 1)[0].rsplit("\n### ", 1)[1].split("\n", 1)[0]
        assert re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") in links, (name, heading)


def test_error_messages_quoting_a_name_never_drive_the_terminal(tmp_path):
    """An error names the path it is about, and an agent may choose that path: escape
    sequences in it are spelled out, so they cannot retitle, clear or rewrite the terminal."""
    name = tmp_path / "cfg\x1b]0;pwned\x07\x1b[2J.json"
    out = run_bridge("status", "--root", tmp_path, "--config", name)
    assert out.returncode == 2, out.stderr
    assert "\x1b" not in out.stderr and "\x07" not in out.stderr
    assert "cfg\\x1b]0;pwned\\x07\\x1b[2J.json" in out.stderr, out.stderr
    # a right-to-left override shows "cfg.json" for a name ending "nosj.gfc": spelled out too
    name = tmp_path / "x\u202enosj.gfc\u2028"
    out = run_bridge("status", "--root", tmp_path, "--config", name)
    assert out.returncode == 2 and "x\\u202enosj.gfc\\u2028" in out.stderr, out.stderr


@pytest.mark.parametrize("command", [["status", "--json"], ["status"], ["redact"], ["egress", "--help"],
                                     ["inbox", "drain", "--json"]])
def test_a_reader_that_went_away_is_no_internal_error(git_repo, command):
    """`bridge.py status | head -1`: once the reader has gone, writing stdout fails (EPIPE);
    bridge.py stops as cat(1) does, without an 'internal error' line blaming itself, while a
    broken pipe to anything else (a server, an agent) is still reported."""
    assert run_bridge("init", "--root", git_repo).returncode == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before bridge.py writes a byte
    try:
        out = subprocess.run([PYTHON, str(BRIDGE), *command], cwd=git_repo, env=clean_env(),
                             input="x" * 100000, stdout=write_end, stderr=subprocess.PIPE,
                             text=True, timeout=60)
    finally:
        os.close(write_end)
    assert out.returncode == 1 and out.stderr == "", out.stderr
    # stdout's reader still there: a broken pipe is another one's, and is reported
    code = ("import sys; sys.path[:0] = [sys.argv[1]]; import bridge\n"
            "def broken(args): raise BrokenPipeError(32, 'Broken pipe')\n"
            "bridge.cmd_status = broken; sys.exit(bridge.main(['status']))")
    out = subprocess.run([PYTHON, "-c", code, str(BRIDGE.parent)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and "internal error: BrokenPipeError" in out.stderr, out.stderr
