"""relay down|up through the CLI, against queue files in every real shape.

The queue files are checked twice: by a small strict reader of the YAML subset
bridge.py emits (below; PyYAML is not a dependency) and, when PyYAML happens
to be importable, by yaml.safe_load as the real consumers read them.
"""
import datetime
import json
import os
import random
import re
import shutil
import subprocess
import time

import pytest

from conftest import BRIDGE, FIXTURES, PYTHON, clean_env, load_bridge, readme_quickstart, run_bridge

RELAY_FIX = FIXTURES / "relay"
QUEUE = "captain_to_vice_captain.yaml"

try:
    import yaml  # only a cross-check; never required
except ImportError:  # pragma: no cover - depends on the machine
    yaml = None


# ---- a strict reader of the emitted subset ------------------------------------

def _unquote(raw):
    if raw.startswith("'"):
        assert raw.endswith("'") and len(raw) >= 2, raw
        inner = raw[1:-1]
        assert "'" not in inner.replace("''", ""), raw
        return inner.replace("''", "'")
    if raw.startswith('"'):
        assert raw.endswith('"') and len(raw) >= 2, raw
        out, i, inner = [], 0, raw[1:-1]
        simple = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "0": "\0"}
        while i < len(inner):
            ch = inner[i]
            if ch == '"':
                raise AssertionError("unescaped quote in " + raw)
            if ch != "\\":
                out.append(ch)
                i += 1
                continue
            esc = inner[i + 1]
            if esc in simple:
                out.append(simple[esc])
                i += 2
            elif esc in "xu":
                width = 2 if esc == "x" else 4
                out.append(chr(int(inner[i + 2:i + 2 + width], 16)))
                i += 2 + width
            else:
                raise AssertionError("unknown escape in " + raw)
        return "".join(out)
    # plain: must be a conservative token
    assert raw and raw == raw.strip(" \t") and ": " not in raw and " #" not in raw, raw
    assert raw[0] not in "-?:,[]{}#&*!|>'\"%@`0123456789+.~<=", raw
    assert raw not in ("yes", "no", "on", "off", "true", "false", "null", "y", "n"), raw
    return raw


def _literal(header, lines, i, parent_col):
    m = re.fullmatch(r"\|([1-9]?)([-+]?)", header)
    assert m, header
    body = []
    indent = parent_col + int(m.group(1)) if m.group(1) else None
    while i < len(lines):
        line = lines[i]
        if line.strip(" ") == "" and (indent is None or len(line) <= indent):
            body.append("")
            i += 1
            continue
        col = len(line) - len(line.lstrip(" "))
        if indent is None:
            indent = col
            assert indent > parent_col
        if col < indent:
            break
        body.append(line[indent:])
        i += 1
    # trailing empty lines that are not the block's (a separator) are kept only by '+'
    text = "\n".join(body)
    stripped = text.rstrip("\n")
    if m.group(2) == "-":
        value = stripped
    elif m.group(2) == "+":
        value = text + "\n"
    else:
        value = stripped + "\n"
    return value, i


def read_entry(lines, start, first_prefix_re, key_col):
    """Parse one emitted entry starting at lines[start]; return (dict, next index)."""
    entry, i = {}, start
    while i < len(lines):
        line = lines[i]
        if i == start:
            m = re.match(first_prefix_re + r"([A-Za-z_]+): ?(.*)\Z", line)
        else:
            m = re.match(" {%d}([A-Za-z_]+): ?(.*)\\Z" % key_col, line)
        if not m:
            break
        key, raw = m.group(1), m.group(2)
        assert key not in entry, key
        i += 1
        if raw == "":
            items = []
            while i < len(lines):
                im = re.match(r"( *)- (.*)\Z", lines[i])
                if not im or len(im.group(1)) < key_col:
                    break
                if im.group(2).startswith("|"):
                    value, i = _literal(im.group(2), lines, i + 1, len(im.group(1)))
                else:
                    value, i = _unquote(im.group(2)), i + 1
                items.append(value)
            entry[key] = items
        elif raw.startswith("|"):
            entry[key], i = _literal(raw, lines, i, key_col)
        else:
            entry[key] = _unquote(raw)
    return entry, i


def find_entry(text, cmd_id):
    """Locate the emitted entry `cmd_id` in a queue text; (entry, start, end) lines."""
    lines = text.split("\n")
    for n, line in enumerate(lines):
        m = re.match(r"( *)(- +)?id: %s\Z" % cmd_id, line)
        if m and m.group(2):
            key_col = len(m.group(1)) + len(m.group(2))
            entry, end = read_entry(lines, n, re.escape(m.group(1) + m.group(2)), key_col)
            return entry, n, end
        m = re.match(r"( +)%s:\Z" % cmd_id, line)
        if m:
            key_col = len(lines[n + 1]) - len(lines[n + 1].lstrip(" "))
            entry, end = read_entry(lines, n + 1, " {%d}" % key_col, key_col)
            return entry, n, end
    raise AssertionError("%s not found" % cmd_id)


def yaml_entries(text):
    """All entries as PyYAML reads them (None when PyYAML is not installed)."""
    if yaml is None:
        return None
    data = yaml.safe_load(text)
    if isinstance(data, dict):
        data = data.get("commands", data.get("queue"))
    return list(data.values()) if isinstance(data, dict) else data


# ---- helpers ------------------------------------------------------------------

def make_root(tmp_path, fixture=None, text=None, cluster=None, config=None):
    root = tmp_path / "repo"
    qdir = root / ("clusters/%s/queue" % cluster if cluster else "queue")
    qdir.mkdir(parents=True)
    if fixture:
        shutil.copy(RELAY_FIX / fixture, qdir / QUEUE)
    elif text is not None:
        (qdir / QUEUE).write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    if config is not None:
        (root / "bridge.config.json").write_text(json.dumps(config))
    return root, qdir / QUEUE


def down(root, *args, env=None):
    return run_bridge("relay", "down", "--root", root, *args, env=env)


def log_lines(root, captain="miho"):
    path = root / "logs" / "bridge" / ("%s_%s.log" % (captain, time.strftime("%Y%m%d")))
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


LOG_LINE = re.compile(r"\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\] \[bridge_relay/(down|up)\] (.*)\Z")

SHAPES = [
    # fixture, expected new id
    ("pyyaml_indentless.yaml", "cmd_049"),
    ("hand_indented.yaml", "cmd_004"),
    ("dict_keyed.yaml", "cmd_1078"),
    ("legacy_queue.yaml", "cmd_006"),
    ("legacy_queue_empty.yaml", "cmd_001"),
    ("empty_flow.yaml", "cmd_001"),
    ("empty_map.yaml", "cmd_001"),
    ("null_value.yaml", "cmd_001"),
    ("naginata_mixed.yaml", "cmd_1185"),
    ("toplevel_list.yaml", "cmd_049"),
    ("keep_block_last.yaml", "cmd_011"),
]


# ---- down: every queue shape ------------------------------------------------------

@pytest.mark.parametrize("fixture,expected", SHAPES)
def test_down_appends_in_the_files_own_layout(tmp_path, fixture, expected):
    root, queue = make_root(tmp_path, fixture)
    before = queue.read_text(encoding="utf-8")
    message = "GuP-v2 の inbox_watcher.sh を改修せよ。詳細は後述。\n二行目: yes"
    result = down(root, "miho", "main-cluster", message, "gup-v2", "high", "一つ目\n\nsecond: x\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected + "\n"
    after = queue.read_text(encoding="utf-8")
    entry, start, end = find_entry(after, expected)
    assert list(entry) == ["id", "timestamp", "purpose", "acceptance_criteria", "command",
                           "project", "priority", "status", "source"]
    assert entry["id"] == expected
    datetime.datetime.strptime(entry["timestamp"], "%Y-%m-%dT%H:%M:%S")
    assert entry["purpose"] == "GuP-v2 の inbox_watcher.sh を改修せよ。"
    assert entry["acceptance_criteria"] == ["一つ目", "second: x"]
    assert entry["command"] == message
    assert (entry["project"], entry["priority"], entry["status"], entry["source"]) == (
        "gup-v2", "high", "pending", "agent_teams")
    # grep consumers: the three markers are plain text on their own lines
    lines = after.split("\n")
    assert re.search(r"^ *(- +)?id: %s$" % expected, after, re.M)
    assert any(re.fullmatch(r" *status: pending", ln) for ln in lines[start:end])
    assert any(re.fullmatch(r" *source: agent_teams", ln) for ln in lines[start:end])
    # everything that was there is still there, byte for byte (a flow-empty
    # value is the one line rewritten, to open the block)
    def norm(ln):
        return re.sub(r"^(commands|queue):[ ]*(\[\]|\{\})?[ ]*", r"\1: ", ln)
    rest = [norm(ln) for ln in lines[:start] + lines[end:]]
    old = [norm(ln) for ln in before.split("\n")]
    assert rest == old
    if yaml is not None:
        items = yaml_entries(after)
        mine = [it for it in items if it.get("id") == expected]
        assert len(mine) == 1
        assert mine[0] == dict(entry)
        assert len(items) == len(yaml_entries(before) or []) + 1


def test_down_new_file_and_second_entry(tmp_path):
    root, queue = make_root(tmp_path)
    assert not queue.exists()
    first = down(root, "miho", "main", "first task", "p")
    second = down(root, "miho", "main", "second task", "p", "", "")
    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    assert (first.stdout, second.stdout) == ("cmd_001\n", "cmd_002\n")
    text = queue.read_text()
    assert text.startswith("commands:\n- id: cmd_001\n")
    entry, _, _ = find_entry(text, "cmd_002")
    assert entry["priority"] == "medium"
    assert entry["acceptance_criteria"] == ["No acceptance criteria provided"]
    if yaml is not None:
        assert [c["id"] for c in yaml.safe_load(text)["commands"]] == ["cmd_001", "cmd_002"]


def test_down_uses_cluster_queue_and_configured_file_name(tmp_path):
    root, _ = make_root(tmp_path, cluster="alpha",
                        config={"relay": {"queue_file": "captain_queue.yaml", "nudge": False}})
    result = down(root, "miho", "alpha", "clustered", "p")
    assert result.returncode == 0, result.stderr
    assert (root / "clusters/alpha/queue/captain_queue.yaml").exists()
    assert not (root / "queue").exists()


@pytest.mark.parametrize("text,expected,shape", [
    ("---\n# header\ncommands:\n  # a comment first\n\n  - id: cmd_007\n    x: 1\nother: 2\n",
     "cmd_008", "  - id: cmd_008\n    timestamp: "),
    ("commands:\n-\n    id: cmd_003\n    acceptance_criteria:\n        - a\n",
     "cmd_004", "-   id: cmd_004\n    timestamp: "),
    ("commands:\n- id: cmd_001\n  status: done", "cmd_002", "done\n- id: cmd_002\n"),
    ("settings:\n  a: 1\n", "cmd_001", "settings:\n  a: 1\ncommands:\n- id: cmd_001\n"),
    ("commands:\n  \"cmd_001\":\n    status: done\n", "cmd_002", "\n  cmd_002:\n    id: cmd_002\n"),
])
def test_down_other_layouts(tmp_path, text, expected, shape):
    root, queue = make_root(tmp_path, text=text, config={"relay": {"nudge": False}})
    result = down(root, "miho", "main", "m", "p", "", "a\nb")
    assert result.stdout == expected + "\n", result.stderr
    after = queue.read_text()
    assert shape in after
    assert find_entry(after, expected)[0]["acceptance_criteria"] == ["a", "b"]
    if yaml is not None:
        assert yaml_entries(after)[-1]["id"] == expected


@pytest.mark.parametrize("kind", ["outside", "dangling", "fifo"])
def test_symlinked_or_fifo_queue_is_refused_naming_it(tmp_path, kind):
    """A symlink is never followed (neither read nor written through, even to a file
    outside the repository or to nowhere), and a FIFO never blocks: exit 2 naming it."""
    root, queue = make_root(tmp_path, config={"relay": {"nudge": False}})
    real = tmp_path / "shared" / "q.yaml"
    real.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(queue)
    else:
        if kind == "outside":
            shutil.copy(RELAY_FIX / "legacy_queue.yaml", real)
        queue.symlink_to(real)
    before = real.read_bytes() if real.exists() else None
    for result in (run_bridge("relay", "down", "--root", root, "miho", "main", "m", "p", timeout=20),
                   run_bridge("relay", "up", "--root", root, "miho", "main", "cmd_001", "done", "s",
                              timeout=20)):
        assert result.returncode == 2, result.stderr
        assert str(queue) in result.stderr
        assert ("symlink" if kind != "fifo" else "not a regular file") in result.stderr
    assert (real.read_bytes() if real.exists() else None) == before
    assert sorted(p.name for p in real.parent.iterdir()) == (["q.yaml"] if before else [])


def test_symlinked_inbox_folder_is_refused(tmp_path):
    root, _queue = make_root(tmp_path, fixture="legacy_queue.yaml")
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "queue" / "inbox").symlink_to(outside)
    result = down(root, "miho", "main", "m", "p")
    assert result.returncode == 0 and "inbox nudge failed" in result.stderr
    assert str(root / "queue" / "inbox") in result.stderr
    assert list(outside.iterdir()) == []


def test_down_ids_grow_past_999_and_ignore_text_inside_blocks(tmp_path):
    text = ("commands:\n- id: cmd_999\n  command: |\n    id: cmd_5000\n    - id: cmd_6000\n"
            "- id: cmd_T10_7_x\n")
    root, queue = make_root(tmp_path, text=text)
    result = down(root, "miho", "main", "m", "p")
    assert result.stdout == "cmd_1000\n", result.stderr


@pytest.mark.parametrize("text", [
    "commands:\n- id: cmd_\u0663\u0664\n- id: cmd_%s\n- id: cmd_7\n" % ("9" * 5000),
    "commands:\n  cmd_\u0663\u0664:\n    id: cmd_\u0663\u0664\n  big:\n    id: cmd_%s\n"
    "  cmd_7:\n    x: 1\n" % ("9" * 5000),
])
def test_down_counts_ascii_ids_of_at_most_18_digits(tmp_path, text):
    """An id is numbered as `grep -oE 'id: cmd_[0-9]+'` reads it: Arabic-Indic digits (34
    to Python's int) are no number, and a hand-written id too long for any counter is
    skipped as a non-numeric one is (it was an internal error: int() of 5,000 digits)."""
    root, queue = make_root(tmp_path, text=text, config={"relay": {"nudge": False}})
    result = down(root, "miho", "main", "m", "p")
    assert (result.returncode, result.stdout) == (0, "cmd_008\n"), result.stderr


@pytest.mark.parametrize("fixture,line", [
    ("flow_list.yaml", 1), ("tab_indent.yaml", 3), ("scalar.yaml", 1), ("anchor.yaml", 1),
    ("two_documents.yaml", 3), ("latin1.yaml", 3), ("block_scalar.yaml", 1),
    ("duplicate_key.yaml", 3), ("scalar_items.yaml", 2), ("crlf.yaml", 1),
])
def test_down_refuses_files_it_cannot_follow(tmp_path, fixture, line):
    root, queue = make_root(tmp_path)
    shutil.copy(RELAY_FIX / "bad" / fixture, queue)
    before = queue.read_bytes()
    result = down(root, "miho", "main", "m", "p")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "line %d:" % line in result.stderr
    assert "not changed" in result.stderr
    assert "Traceback" not in result.stderr
    assert queue.read_bytes() == before
    assert sorted(os.listdir(queue.parent)) == sorted([QUEUE, QUEUE + ".lock"])


@pytest.mark.parametrize("text,line", [
    ("commands: []\n- id: cmd_001\n", 2),
    ("- id: cmd_001\nkey: value\n", 2),
    ("commands:\n  ? complex key\n  : value\n", 2),
    ("commands:\n  {flow: map}\n", 2),
    ("commands:\n \t- id: cmd_001\n", 2),
])
def test_down_refuses_more_shapes(tmp_path, text, line):
    root, queue = make_root(tmp_path, text=text)
    result = down(root, "miho", "main", "m", "p")
    if result.returncode == 0:   # only allowed when PyYAML agrees the result is sound
        assert yaml is not None and yaml_entries(queue.read_text())
        return
    assert result.returncode == 1 and "line %d:" % line in result.stderr, result.stderr
    assert queue.read_text() == text


def test_down_keeps_a_bom_and_a_missing_final_newline(tmp_path):
    root, queue = make_root(tmp_path, text="\ufeffcommands:\n- id: cmd_004\n  status: done",
                            config={"relay": {"nudge": False}})
    assert down(root, "miho", "main", "m", "p").stdout == "cmd_005\n"
    raw = queue.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbfcommands:\n- id: cmd_004\n  status: done\n- id: cmd_005\n")
    if yaml is not None:
        assert [c["id"] for c in yaml.safe_load(raw.decode("utf-8"))["commands"]] == [
            "cmd_004", "cmd_005"]


@pytest.mark.parametrize("raw, why", [
    (b"commands:\n- id: cmd_001\n  command: caf\xe9\n", "line 3: not valid UTF-8 (byte offset 38)"),
    (b"commands:\n- id: cmd_001\r\n", "line 2: carriage return (CRLF line endings"),
])
def test_down_refuses_a_queue_not_utf8_or_with_crlf_naming_the_line(tmp_path, raw, why):
    root, queue = make_root(tmp_path, text=raw)
    result = down(root, "miho", "main", "m", "p")
    assert result.returncode == 1 and why in result.stderr and "Traceback" not in result.stderr, \
        result.stderr
    assert queue.read_bytes() == raw


def test_undecodable_argument_is_a_usage_error(tmp_path):
    root, queue = make_root(tmp_path, "legacy_queue.yaml")
    before = queue.read_bytes()
    result = subprocess.run([PYTHON, str(BRIDGE), "relay", "down", "--root", str(root), "miho",
                             "main", b"bad \xff byte", "p"], capture_output=True,
                            env=clean_env(), stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    assert b"UTF-8" in result.stderr and b"Traceback" not in result.stderr
    assert queue.read_bytes() == before


@pytest.mark.parametrize("args", [
    ("miho", "main", "", "p"), ("miho", "main", "msg", ""), ("miho", "main", "   ", "p"),
    ("", "main", "m", "p"), ("miho", "", "m", "p"), ("../x", "main", "m", "p"),
    ("miho", "main", "m", "p", "urgent"), ("miho", "main"),
])
def test_down_usage_errors_exit_2_and_write_nothing(tmp_path, args):
    root, queue = make_root(tmp_path, "legacy_queue.yaml")
    before = queue.read_bytes()
    result = down(root, *args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert queue.read_bytes() == before


def test_down_missing_queue_directory_is_a_usage_error(tmp_path):
    result = run_bridge("relay", "down", "--root", tmp_path, "miho", "main", "m", "p")
    assert result.returncode == 2
    assert "no queue directory" in result.stderr
    assert not (tmp_path / "queue").exists()


def test_down_logs_in_the_seeds_format(tmp_path):
    root, _ = make_root(tmp_path, config={"relay": {"nudge": False}})
    missing = down(root, "miho", "main", "", "p")
    result = down(root, "miho", "main", "m", "gup", "low")
    assert result.returncode == 0
    stderr = [LOG_LINE.match(ln) for ln in result.stderr.splitlines()]
    assert [m.group(2) for m in stderr if m] == [
        "DOWN SUCCESS: cmd_001 created (project=gup, priority=low)"]
    logged = [LOG_LINE.match(ln) for ln in log_lines(root)]
    assert all(logged)
    assert [m.group(2) for m in logged] == [
        "ERROR: down mode requires message_content and project",
        "DOWN SUCCESS: cmd_001 created (project=gup, priority=low)"]
    assert missing.returncode == 2


@pytest.mark.parametrize("message,purpose", [
    ("一文目。二文目。", "一文目。"),
    ("First sentence. Second one.", "First sentence."),
    ("\n\n  first line\nsecond line", "first line"),
    ("inbox_watcher.sh を改修せよ", "inbox_watcher.sh を改修せよ"),
    ("Really? Yes", "Really?"),
])
def test_purpose_is_first_sentence_or_line(tmp_path, message, purpose):
    root, queue = make_root(tmp_path, config={"relay": {"nudge": False}})
    assert down(root, "miho", "main", message, "p").returncode == 0
    entry, _, _ = find_entry(queue.read_text(), "cmd_001")
    assert entry["purpose"] == purpose
    assert entry["command"] == message


HOSTILE = [
    "it's \"quoted\" and back\\slash\\",
    "'''\nprint('injected')\n'''",
    "key: value\n- id: cmd_999\n  status: done\nsource: agent_teams",
    "# not a comment\n  : colon first",
    "tab\there\tand trailing space ",
    "emoji 😀🎌 and 日本語 and \u00e9",
    "$(touch pwned) `touch pwned2` ; touch pwned3 && rm -rf / | cat",
    "yes",
    "2026-02-16T01:23:45",
    "012",
    "~",
    "- leading dash",
    "multi\n\n\nline with blank lines\n\n",
    "  leading spaces\nnext",
    "ends with backslash \\",
    "control \x01\x1b[31m red \x7f del \u0085 nel \u2028 ls",
    "{flow: [map]} & *alias !tag %directive @at `tick",
    "line\r\nwith crlf",
    "\n",
]


def test_hostile_messages_are_stored_verbatim_and_nothing_runs(tmp_path):
    root, queue = make_root(tmp_path, "pyyaml_indentless.yaml",
                            config={"relay": {"nudge": False}})
    ids = []
    for message in HOSTILE:
        result = down(root, "miho", "main", message, message, "high", message)
        if not message.strip():
            assert result.returncode == 2
            continue
        assert result.returncode == 0, (message, result.stderr)
        ids.append((result.stdout.strip(), message))
    text = queue.read_text(encoding="utf-8")
    for cmd_id, message in ids:
        entry, _, _ = find_entry(text, cmd_id)
        assert entry["command"] == message
        assert entry["project"] == message
        criteria = [ln.strip() for ln in message.split("\n") if ln.strip()]
        assert entry["acceptance_criteria"] == criteria
    for name in ("pwned", "pwned2", "pwned3"):
        assert not (root / name).exists() and not (tmp_path / name).exists()
    if yaml is not None:
        items = {it["id"]: it for it in yaml_entries(text)}
        for cmd_id, message in ids:
            assert items[cmd_id]["command"] == message
            assert items[cmd_id]["source"] == "agent_teams"
    assert "\ud83d" not in text and "\\ud8" not in text.lower()


def test_message_starting_with_dash_after_double_dash(tmp_path):
    root, queue = make_root(tmp_path, config={"relay": {"nudge": False}})
    result = run_bridge("relay", "down", "--root", root, "--", "miho", "main", "-x --y", "p")
    assert result.returncode == 0, result.stderr
    assert find_entry(queue.read_text(), "cmd_001")[0]["command"] == "-x --y"


def test_emitter_round_trips_random_text():
    """In-process property check of the scalar emitter against the strict reader
    (and PyYAML when present), indentless and indented layouts."""
    bridge = load_bridge()
    alphabet = list("ab yes: #-'\"\\\t\n|>{}[],&*!%@`?~=<0123.+") + [
        "日", "。", "😀", "\x85", "\u2028", "\x7f", "\x00", "\ufeff", "\u3000", " ", "\n"]
    rng = random.Random(4)
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        for dash, key, nested in ((0, 2, 0), (2, 4, 2)):
            fields = [("id", "cmd_001"), ("command", text), ("acceptance_criteria", [text, "x"]),
                      ("status", "pending")]
            prefix = " " * dash + "- "
            lines = bridge.yaml_entry_lines(fields, key, prefix, nested)
            entry, end = read_entry(lines, 0, re.escape(prefix), key)
            assert end == len(lines), (text, lines)
            assert entry == dict(fields), (text, lines)
            if yaml is not None:
                doc = "commands:\n" + "\n".join(lines) + "\n"
                assert yaml.safe_load(doc)["commands"][0] == dict(fields), (text, doc)


# ---- concurrency and locks ------------------------------------------------------

def test_twenty_concurrent_downs_get_distinct_consecutive_ids(tmp_path):
    root, queue = make_root(tmp_path, "pyyaml_indentless.yaml")
    procs = [subprocess.Popen([PYTHON, str(BRIDGE), "relay", "down", "--root", str(root),
                               "miho", "main", "writer %d: 並行" % n, "p%d" % n],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=clean_env(), stdin=subprocess.DEVNULL)
             for n in range(20)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 20, [o[1] for o in outs]
    ids = sorted(int(o[0].strip()[4:]) for o in outs)
    assert ids == list(range(49, 69))
    text = queue.read_text(encoding="utf-8")
    for n, (out, _) in enumerate(outs):
        entry, _, _ = find_entry(text, out.strip())
        assert entry["command"] == "writer %d: 並行" % n and entry["project"] == "p%d" % n
    if yaml is not None:
        assert len(yaml_entries(text)) == 22
    inbox = (root / "queue/inbox/vice_captain.yaml").read_text(encoding="utf-8")
    assert inbox.count("read: false") == 20
    if yaml is not None:
        assert len(yaml.safe_load(inbox)["messages"]) == 20


class _Holder:
    """flock(1) holding a lock in its own process group (its `sleep` child
    inherits the lock, so release means killing the whole group)."""

    def __init__(self, path, seconds):
        self.proc = subprocess.Popen(
            ["flock", "-x", str(path), "-c", "echo held; exec sleep %s" % seconds],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout.readline().strip() == "held"

    def kill(self):
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass

    def wait(self):
        self.proc.wait()
        self.proc.stdout.close()


def down_while_locked(root, lock):
    """`relay down` while flock(1) in another process holds `lock`."""
    holder = _Holder(str(lock), 30)
    try:
        return down(root, "miho", "main", "m", "p")
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.skipif(shutil.which("flock") is None, reason="flock(1) not installed")
def test_lock_held_elsewhere_is_reported_and_file_unchanged(tmp_path):
    root, queue = make_root(tmp_path, "pyyaml_indentless.yaml", config={"relay": {
        "lock_timeout_sec": 0.3, "lock_retry_sleep_sec": 0.1, "nudge": False}})
    before = queue.read_bytes()
    result = down_while_locked(root, str(queue) + ".lock")
    assert result.returncode == 1
    assert result.stdout == ""
    assert queue.read_bytes() == before
    messages = [LOG_LINE.match(ln).group(2) for ln in log_lines(root)]
    assert messages == ["Lock timeout (attempt 1/3), retrying...",
                        "Lock timeout (attempt 2/3), retrying...",
                        "ERROR: Failed to acquire lock after 3 attempts"]
    assert "could not lock" in result.stderr


@pytest.mark.skipif(shutil.which("flock") is None, reason="flock(1) not installed")
def test_lock_released_during_retries_succeeds(tmp_path):
    root, queue = make_root(tmp_path, "legacy_queue.yaml", config={"relay": {
        "lock_timeout_sec": 0.3, "lock_retry_sleep_sec": 0.3, "lock_attempts": 5,
        "nudge": False}})
    holder = _Holder(str(queue) + ".lock", 60)
    proc = subprocess.Popen([PYTHON, str(BRIDGE), "relay", "down", "--root", str(root), "miho",
                             "main", "m", "p"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env(), stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not any("attempt 1/5" in ln for ln in log_lines(root)):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
    finally:
        holder.kill()   # release the lock once the first attempt has timed out
        holder.wait()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out == "cmd_006\n"
    assert "Lock timeout (attempt 1/5), retrying..." in err
    assert "ERROR" not in err


# ---- the nudge -----------------------------------------------------------------------

@pytest.mark.parametrize("inbox", [None, "empty.yaml", "null.yaml", "existing.yaml"])
def test_native_nudge_appends_like_inbox_write(tmp_path, inbox):
    root, _ = make_root(tmp_path)
    path = root / "queue/inbox/vice_captain.yaml"
    before = ""
    if inbox:
        path.parent.mkdir(parents=True)
        shutil.copy(RELAY_FIX / "inbox" / inbox, path)
        before = path.read_text()
    result = down(root, "miho", "main", "m", "p")
    assert result.returncode == 0, result.stderr
    text = path.read_text(encoding="utf-8")
    m = re.search(r"^- content: (.*)\n  from: miho\n  id: (msg_\d{8}_\d{6}_[0-9a-f]{8})\n"
                  r"  read: false\n  timestamp: '(.*)'\n  type: cmd_new\n\Z", text, re.M)
    assert m, text
    assert m.group(1) == "新規指令 cmd_001 を受信。処理されたし。"
    if inbox == "existing.yaml":
        assert text.startswith(before)
    if yaml is not None:
        messages = yaml.safe_load(text)["messages"]
        assert messages[-1]["read"] is False and messages[-1]["type"] == "cmd_new"


def test_nudge_command_gets_inbox_write_arguments(tmp_path):
    record = tmp_path / "argv.txt"
    root, _ = make_root(tmp_path, cluster="alpha", config={"relay": {
        "nudge_command": ["sh", str(RELAY_FIX / "nudge_record.sh")]}})
    result = down(root, "miho", "alpha", "m", "p", env=clean_env(NUDGE_RECORD=record))
    assert result.returncode == 0, result.stderr
    assert record.read_text(encoding="utf-8").splitlines() == [
        "vice_captain", "新規指令 cmd_001 を受信。処理されたし。", "cmd_new", "miho",
        "CLUSTER_ID=alpha"]
    assert not (root / "queue/inbox").exists()


@pytest.mark.parametrize("cluster_config,target", [
    ("name: alpha\ncaptain: darjeeling  # the cluster's captain\n", "darjeeling"),
    ("name: alpha\n", "miho"),
])
def test_nudge_target_from_cluster_config(tmp_path, cluster_config, target):
    root, _ = make_root(tmp_path, cluster="alpha", config={"relay": {
        "queue_file": "captain_queue.yaml", "nudge_target": "@cluster_captain"}})
    (root / "clusters/alpha/config.yaml").write_text(cluster_config)
    (root / "queue").mkdir()
    result = down(root, "miho", "alpha", "m", "p")
    assert result.returncode == 0, result.stderr
    assert (root / ("queue/inbox/%s.yaml" % target)).exists()
    assert ("falling back to 'miho'" in result.stderr) == (target == "miho")


def test_failed_nudge_is_a_warning_and_down_still_succeeds(tmp_path):
    root, queue = make_root(tmp_path, config={"relay": {
        "nudge_command": "sh " + str(RELAY_FIX / "nudge_fail.sh")}})
    result = down(root, "miho", "main", "m", "p")
    assert result.returncode == 0
    assert result.stdout == "cmd_001\n"
    messages = [LOG_LINE.match(ln).group(2) for ln in log_lines(root)]
    assert messages[0].startswith("WARN: inbox nudge failed (exit 1)")
    assert messages[1] == "DOWN SUCCESS: cmd_001 created (project=p, priority=medium)"
    assert "cmd_001" in queue.read_text()


@pytest.mark.skipif(shutil.which("flock") is None, reason="flock(1) not installed")
def test_native_nudge_with_inbox_locked_warns(tmp_path):
    root, queue = make_root(tmp_path, config={"relay": {
        "lock_timeout_sec": 0.2, "lock_retry_sleep_sec": 0.05}})
    inbox = root / "queue/inbox"
    inbox.mkdir(parents=True)
    result = down_while_locked(root, inbox / "vice_captain.yaml.lock")
    assert result.returncode == 0
    assert result.stdout == "cmd_001\n"
    assert "WARN: inbox nudge failed" in result.stderr
    assert not (inbox / "vice_captain.yaml").exists()


# ---- up ---------------------------------------------------------------------------

def up(root, *args):
    return run_bridge("relay", "up", "--root", root, *args)


@pytest.mark.parametrize("fixture,cmd_id,relays", [
    ("pyyaml_indentless.yaml", "cmd_047", True),        # done + agent_teams
    ("pyyaml_indentless.yaml", "cmd_048", False),       # in_progress
    ("hand_indented.yaml", "cmd_001", False),           # no source (Lord)
    ("hand_indented.yaml", "cmd_002", False),           # redo_of
    ("hand_indented.yaml", "cmd_003", True),            # key order differs
    ("dict_keyed.yaml", "cmd_1076", True),
    ("dict_keyed.yaml", "cmd_1077", False),             # reassigned, no source
    ("naginata_mixed.yaml", "cmd_1183", True),          # the later duplicate counts
    ("naginata_mixed.yaml", "cmd_1184", True),          # `-` on its own line
    ("toplevel_list.yaml", "cmd_048", False),           # pending
])
def test_up_applies_the_no_relay_conditions(tmp_path, fixture, cmd_id, relays):
    root, _ = make_root(tmp_path, fixture)
    result = up(root, "miho", "main", cmd_id, "done", "テスト完了、確認済み")
    assert result.returncode == 0, result.stderr
    messages = [LOG_LINE.match(ln).group(2) for ln in log_lines(root)]
    if relays:
        assert result.stdout == "miho隊報告: %s [done] \u2014 テスト完了、確認済み\n" % cmd_id
        assert messages == ["UP SUCCESS: %s [done] \u2014 テスト完了、確認済み" % cmd_id]
    else:
        assert result.stdout == ""
        assert messages[0].startswith("NO RELAY: %s" % cmd_id)
        forced = up(root, "miho", "main", cmd_id, "done", "s", "--force")
        assert forced.returncode == 0
        assert forced.stdout == "miho隊報告: %s [done] \u2014 s\n" % cmd_id


def test_up_status_argument_pending_is_not_relayed(tmp_path):
    root, _ = make_root(tmp_path, "pyyaml_indentless.yaml")
    result = up(root, "miho", "main", "cmd_047", "in_progress", "half way")
    assert result.returncode == 0 and result.stdout == ""


def test_up_unknown_id_and_usage_errors(tmp_path):
    root, _ = make_root(tmp_path, "pyyaml_indentless.yaml")
    unknown = up(root, "miho", "main", "cmd_777", "done", "s")
    assert unknown.returncode == 1 and "cmd_777" in unknown.stderr and unknown.stdout == ""
    for args in (("miho", "main", "cmd_047", "done", ""), ("miho", "main", "", "done", "s"),
                 ("miho", "main", "cmd_047", "done")):
        result = up(root, *args)
        assert result.returncode == 2, args
        assert result.stdout == ""


def test_up_after_down_round_trip(tmp_path):
    root, queue = make_root(tmp_path, "hand_indented.yaml", config={"relay": {"nudge": False}})
    cmd_id = down(root, "miho", "main", "work", "p").stdout.strip()
    assert up(root, "miho", "main", cmd_id, "done", "s").stdout == ""     # still pending
    text = queue.read_text().replace("id: %s\n    timestamp" % cmd_id, "id: %s\n    ts" % cmd_id)
    queue.write_text(text.replace("    status: pending\n    source: agent_teams",
                                  "    status: done\n    source: agent_teams"))
    assert up(root, "miho", "main", cmd_id, "done", "s").stdout.startswith("miho隊報告: ")


def test_bad_nudge_command_is_a_warning_and_the_command_stays_queued(tmp_path):
    root, _ = make_root(tmp_path, config={"relay": {"nudge_command": 5}})
    out = down(root, "miho", "main", "Do the thing.", "proj")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "relay.nudge_command" in out.stderr
    assert out.stdout.strip() == "cmd_001"


def test_queue_file_may_not_leave_the_queue_directory(tmp_path):
    root, _ = make_root(tmp_path, config={"relay": {"queue_file": "../../escape.yaml"}})
    out = down(root, "miho", "main", "Do the thing.", "proj")
    assert out.returncode == 2 and "relay.queue_file" in out.stderr
    assert not (tmp_path / "escape.yaml").exists()


# ---- a queue YAML readers cannot read is never written ------------------------------

NEED_PYYAML = pytest.mark.skipif(
    yaml is None, reason="PyYAML is not installed (tests/tools.sh installs it into .venv "
                         "when it can; `pip install pyyaml` to run these cross-checks)")


def pyyaml_error(text):
    """None when yaml.safe_load reads `text`, else the error's first line."""
    try:
        yaml.safe_load(text)
    except Exception as exc:     # PyYAML raises YAMLError, ValueError, TypeError...
        return "%s: %s" % (type(exc).__name__, str(exc).split("\n")[0])
    return None


# The reproductions: each one PyYAML cannot read, each appended to and nudged before.
UNREADABLE = [
    ("commands:\n- id: cmd_001\n  command: 'an unterminated quote\n  status: done\n"
     "- id: cmd_002\n  status: done\n", 3),
    ("commands:\n- id: cmd_001\n  status: done\n   source: agent_teams\n", 4),
    ("commands:\n- id: cmd_001\n  status: done\nfoo: [\n", 4),
]


@pytest.mark.parametrize("text,line", UNREADABLE)
def test_down_refuses_a_queue_yaml_readers_cannot_read(tmp_path, text, line):
    root, queue = make_root(tmp_path, text=text)
    if yaml is not None:
        assert pyyaml_error(text)
    result = down(root, "miho", "main", "m", "p")
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert "%s line %d:" % (queue, line) in result.stderr and "not changed" in result.stderr
    assert "Traceback" not in result.stderr
    assert queue.read_text() == text
    assert not any("DOWN SUCCESS" in ln for ln in log_lines(root))
    assert not (root / "queue" / "inbox").exists()       # nobody was nudged


def broken_variants():
    """Queue files made unreadable one line at a time, in the ways hands and tools
    break them (PyYAML decides which of these are broken; all are kept that it rejects)."""
    texts = [(RELAY_FIX / name).read_text(encoding="utf-8") for name in (
        "pyyaml_indentless.yaml", "hand_indented.yaml", "dict_keyed.yaml")]
    edits = [
        lambda ln: ln.replace(": ", ": '", 1),                 # unterminated quote
        lambda ln: ln.replace(": ", ': "', 1),
        lambda ln: " " + ln,                                   # mis-indented
        lambda ln: ln[1:] if ln.startswith("  ") else ln,
        lambda ln: ln + "\nfoo: [",                            # an unclosed flow list
        lambda ln: ln.replace(": ", ": {a: 1", 1),
        lambda ln: ln.replace("  ", "\t", 1),                  # tab indentation
        lambda ln: ln + ": x" if ": " in ln else ln,          # a mapping value in a value
        lambda ln: ln.replace(": ", ": *undefined ", 1),       # alias to no anchor
        lambda ln: ln.replace(": ", ': "bad \\q escape" ', 1),
        lambda ln: ln.replace(": ", ": 2026-02-30", 1) if ":" in ln else ln,
        lambda ln: ln + "\n" + " " * (len(ln) - len(ln.lstrip())) + "- stray item",
    ]
    seen = set()
    for text in texts:
        lines = text.split("\n")
        for n in range(len(lines)):
            for edit in edits:
                broken = "\n".join(lines[:n] + [edit(lines[n])] + lines[n + 1:])
                if broken not in seen and pyyaml_error(broken):
                    seen.add(broken)
                    yield broken


@NEED_PYYAML
def test_every_file_pyyaml_rejects_relay_refuses():
    bridge = load_bridge()
    variants = list(broken_variants())
    assert len(variants) >= 50
    for text in variants:
        for keys in (("commands", "queue"), ("messages",)):
            with pytest.raises(bridge.BridgeError) as err:
                bridge.relay_layout("q.yaml", text, keys)
            assert err.value.code == 1 and re.match(r"q\.yaml line \d+: ", err.value.message), (
                text, err.value.message)


EDGES = [   # (text, readable): relay and PyYAML agree; None: PyYAML reads it, relay refuses
    ('a: "\\\\Uzzzzzzzz"  # c\n', True), ('a: "\\U0001F600"\n', True), ('a: "\\U00110000"\n', False),
    ('a: "\\q"\n', False), ('a: "x\\\n  y"\n', True), ("a: 2026-02-28\n", True),
    ("a: 2026-02-30\n", False), ("a: 2026-02-16 25:00:00\n", False), ("a: 0x_\n", False),
    ("a: =\n", False), ("a: x\tb\n", False), ("a: |2-\n   x\n", True), ("a: |0\n  x\n", False),
    ("a: {b: c, d}\n", True), ("a: [b, [c]]\n", None), ("a: [b\n", False), ("a: x # c\n  y\n", False),
    ("a:\n- x\n y\n", True), ("a: 'x'y\n", False), ("a: b: c\n", False), ("? a\n: b\n", None),
    ("a: 1\n--- b: 2\n", False), ("a: 1\n... b: 2\n", False), ("---x: 1\n", True),
]


@NEED_PYYAML
@pytest.mark.parametrize("text,readable", EDGES)
def test_relay_and_pyyaml_agree_on_edge_cases(text, readable):
    bridge = load_bridge()
    assert (pyyaml_error(text) is None) == (readable is not False), pyyaml_error(text)
    try:
        bridge.YamlSubset("q.yaml", text).check()
    except bridge.BridgeError as exc:
        assert not readable and exc.message.startswith("q.yaml line "), exc.message
    else:
        assert readable, text


def mutations(rng, count):
    """Deterministic random edits of every fixture: characters YAML cares about
    inserted, text deleted, lines re-indented."""
    texts = [p.read_text(encoding="utf-8") for p in sorted(RELAY_FIX.glob("*.yaml"))]
    texts += [p.read_text(encoding="utf-8") for p in sorted((RELAY_FIX / "inbox").glob("*.yaml"))]
    pieces = list(" -:#'\"\n[]{},|>&*!%@`?\t=<\\0") + [
        "  ", "\n  ", "\n- ", ": ", " #", "''", "\n\n", "\n# c\n", "\n    ", "2026-02-30",
        "0x_", "\\x4", "\\U0011", "\\\\U", "---\n", "\n---x: 1\n", "\n--- k: v\n", "\ncommands:\n", "\n  - x\n", "\n- id: cmd_5\n", "日"]
    for _ in range(count):
        text = rng.choice(texts)
        for _ in range(rng.randint(1, 3)):
            at = rng.randint(0, len(text))
            if rng.random() < 0.6:
                text = text[:at] + rng.choice(pieces) + text[at:]
            else:
                text = text[:at] + text[at + rng.randint(1, 4):]
        yield text


@NEED_PYYAML
def test_every_file_relay_accepts_pyyaml_loads_before_and_after():
    bridge = load_bridge()
    fields = [("id", "cmd_X"), ("command", "a: b\n#c"), ("acceptance_criteria", ["x", "y: z"]),
              ("status", "pending")]
    accepted = refused = 0
    for text in mutations(random.Random(13), 3000):
        try:
            layout = bridge.relay_layout("q.yaml", text, ("commands", "queue"))
        except bridge.BridgeError as exc:
            assert exc.code == 1 and re.match(r"q\.yaml line \d+: ", exc.message), exc.message
            refused += 1
            continue
        accepted += 1
        assert pyyaml_error(text) is None, text
        after = bridge.relay_splice(layout, text.encode("utf-8"), "", bridge.relay_entry_text(
            layout, "cmd_X", fields)).decode("utf-8")
        assert pyyaml_error(after) is None, (text, after)
        # relay's own output stays in the subset (the next append trusts its digest)
        bridge.relay_layout("q.yaml", after, ("commands", "queue"))
        items = yaml_entries(after)
        mine = [it for it in items if isinstance(it, dict) and it.get("id") == "cmd_X"]
        assert mine == [dict(fields)], after
    assert accepted > 500 and refused > 500      # both sides were exercised


def test_the_fast_path_accepts_nothing_the_line_by_line_check_refuses():
    """YamlSubset matches runs of common entries with one regex (for large queues);
    with it switched off the verdicts must be the same, error line included."""
    bridge = load_bridge()

    def verdict(text, fast):
        check = bridge.YamlSubset("q.yaml", text)
        if not fast:
            check.fast = lambda *args, **kwargs: None
        try:
            check.check()
        except bridge.BridgeError as exc:
            return exc.message
        return "ok"

    fast_hits = 0
    for text in mutations(random.Random(5), 3000):
        check = bridge.YamlSubset("q.yaml", text)
        assert verdict(text, True) == verdict(text, False), text
        fast_hits += verdict(text, True) == "ok" and any(
            check.fast(row, 2, 0) is not None for row in range(len(check.lines))
            if check.lines[row].startswith("- id"))
    assert fast_hits > 100


@pytest.mark.parametrize("text", [
    "commands:\n- id: cmd_001\n  when: 2026-02-16 01:23:45\n  n: 0x1f\n  s: {status: idle, t: null}\n"
    "  l: [a, 'b', \"c\"]\n  e: []\n  f: >-\n    folded\n\n    text\n  g: |2\n     indented\n"
    "  h: plain\n    continued\n\n    after a blank\n",
    "# header\n---\nqueue:\n  - id: cmd_001  # trailing comment\n    nested:\n      a: 1\n"
    "      b:\n      - x\n  - other: 1\n",
    "commands:\n- id: cmd_001\n---x: a key, not a document marker\n",
])
def test_down_accepts_the_yaml_real_queues_use(tmp_path, text):
    root, queue = make_root(tmp_path, text=text, config={"relay": {"nudge": False}})
    result = down(root, "miho", "main", "m", "p")
    assert result.returncode == 0, result.stderr
    if yaml is not None:
        assert yaml_entries(queue.read_text())[-1]["id"] == "cmd_002"


def test_a_top_level_mapping_without_commands_gets_a_new_key_not_a_stray_item(tmp_path):
    text = "settings:\n- a\n- b\nother:\n  x: 1\n"
    root, queue = make_root(tmp_path, text=text, config={"relay": {"nudge": False}})
    assert down(root, "miho", "main", "m", "p").stdout == "cmd_001\n"
    after = queue.read_text()
    assert after.startswith(text + "commands:\n- id: cmd_001\n")
    if yaml is not None:
        assert yaml.safe_load(after)["settings"] == ["a", "b"]


def test_up_refuses_a_status_the_queue_does_not_use(tmp_path):
    root, _ = make_root(tmp_path, "pyyaml_indentless.yaml")
    result = up(root, "miho", "main", "cmd_047", "bogus", "s")
    assert result.returncode == 2 and result.stdout == ""
    assert "pending, in_progress, done, failed, reassigned" in result.stderr
    assert "'bogus'" in result.stderr and "Traceback" not in result.stderr
    assert up(root, "miho", "main", "cmd_047", "failed", "s").stdout.startswith("miho隊報告")


def test_an_inbox_yaml_readers_cannot_read_is_not_appended_to(tmp_path):
    root, queue = make_root(tmp_path)
    inbox = root / "queue/inbox/vice_captain.yaml"
    inbox.parent.mkdir(parents=True)
    inbox.write_text("messages:\n- content: 'never closed\n  read: false\n")
    result = down(root, "miho", "main", "m", "p")
    assert result.returncode == 0 and result.stdout == "cmd_001\n"      # queued all the same
    assert "WARN: inbox nudge failed" in result.stderr and "line 2:" in result.stderr
    assert inbox.read_text() == "messages:\n- content: 'never closed\n  read: false\n"


def test_symlinked_log_folder_is_never_written_through(tmp_path):
    root, _queue = make_root(tmp_path, fixture="legacy_queue.yaml", config={"relay": {"nudge": False}})
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "logs").symlink_to(outside)
    result = down(root, "miho", "main", "m", "p")
    assert result.returncode == 0 and "cannot write relay log" in result.stderr
    assert "%s is a symlink" % (root / "logs") in result.stderr
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("link", ["queue", "clusters/main"])
def test_a_symlinked_queue_folder_is_refused_naming_it(tmp_path, link):
    """`queue/` or `clusters/<session>/` as a symlink to a folder outside the repository:
    nothing is read, locked or written through it (exit 2 naming the link)."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "bridge.config.json").write_text(json.dumps({"relay": {"nudge": False}}))
    outside = tmp_path / "outside"
    real = outside / ("queue" if link != "queue" else "") / QUEUE
    real.parent.mkdir(parents=True)
    shutil.copy(RELAY_FIX / "legacy_queue.yaml", real)
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    (root / link).symlink_to(outside)
    (root / "queue").mkdir(exist_ok=True)
    before = sorted(p.relative_to(outside) for p in outside.rglob("*"))
    for result in (down(root, "miho", "main", "m", "p"),
                   up(root, "miho", "main", "cmd_005", "done", "s")):
        assert result.returncode == 2, result.stderr
        assert "%s is a symlink" % (root / link) in result.stderr
    assert real.read_bytes() == (RELAY_FIX / "legacy_queue.yaml").read_bytes()
    assert sorted(p.relative_to(outside) for p in outside.rglob("*")) == before


def test_a_long_run_of_spaces_in_a_value_never_hangs(tmp_path):
    """A value with a long run of spaces, followed by a blank line, once made the
    whole-file check backtrack quadratically (minutes for 100 KB, lock held)."""
    value = "a" + " " * 120000 + "b"
    text = ("commands:\n- id: cmd_001\n  command: %s\n\n- id: cmd_002\n  status: done\n"
            % value)
    root, queue = make_root(tmp_path, text=text, config={"relay": {"nudge": False}})
    result = run_bridge("relay", "down", "--root", root, "miho", "main", "m", "p", timeout=60)
    assert result.returncode == 0 and result.stdout == "cmd_003\n", result.stderr
    assert queue.read_text(encoding="utf-8").startswith(text)
    if yaml is not None:
        assert yaml.safe_load(queue.read_text(encoding="utf-8"))["commands"][0]["command"] == value


def test_a_deeply_nested_queue_is_refused_naming_the_line(tmp_path):
    text = "commands:\n- id: cmd_001\n  x:\n" + "".join(
        " " * (4 + i) + "k%d:\n" % i for i in range(3000))
    root, queue = make_root(tmp_path, text=text, config={"relay": {"nudge": False}})
    for result in (down(root, "miho", "main", "m", "p"),
                   up(root, "miho", "main", "cmd_001", "done", "s")):
        assert result.returncode == 1, result.stderr
        assert "line 102: nested deeper than 100 levels" in result.stderr
        assert "internal error" not in result.stderr
    assert queue.read_text() == text


@pytest.mark.parametrize("message", ["\u3000字下げした指示", "\xa0nbsp first", "\u2003em"])
def test_a_value_relay_wrote_never_blocks_the_next_append(tmp_path, message):
    """A message starting with a space PyYAML keeps (U+3000...) but Python's \\s matches
    was written plain, and the next `relay down` refused the file bridge.py had written."""
    root, queue = make_root(tmp_path, text="commands: []\n", config={"relay": {"nudge": False}})
    for expected in ("cmd_001\n", "cmd_002\n"):
        result = down(root, "miho", "main", message, message)
        assert result.returncode == 0 and result.stdout == expected, result.stderr
    if yaml is not None:
        for entry in yaml.safe_load(queue.read_text(encoding="utf-8"))["commands"]:
            assert entry["command"] == entry["project"] == message


def test_arguments_cannot_forge_a_log_line(tmp_path):
    root, _queue = make_root(tmp_path, fixture="pyyaml_indentless.yaml",
                             config={"relay": {"nudge": False}})
    forged = "ok\n[2026-01-01T00:00:00] [bridge_relay/up] UP SUCCESS: cmd_999 [done]\x1b[2K"
    assert up(root, "miho", "main", "cmd_047", "done", forged).returncode == 0
    assert down(root, "miho", "main", "m", forged).returncode == 0
    lines = log_lines(root)
    assert len(lines) == 2 and all(LOG_LINE.match(line) for line in lines), lines
    assert "\x1b" not in "".join(lines) and "ok\\x0a[2026-01-01" in lines[0]


def test_a_queue_edited_after_relay_wrote_it_is_checked_again(tmp_path):
    """relay skips the whole-file check only for the exact bytes it wrote last (their
    digest is kept in the lock file): any edit since, or a lock file that `flock(1)`
    users truncated, means a full check."""
    root, queue = make_root(tmp_path, fixture="pyyaml_indentless.yaml",
                            config={"relay": {"nudge": False}})
    lock = queue.parent / (QUEUE + ".lock")
    assert down(root, "miho", "main", "m", "p").stdout == "cmd_049\n"
    assert down(root, "miho", "main", "m", "p").stdout == "cmd_050\n"     # the record's path
    broken = queue.read_text(encoding="utf-8") + "  priority: 'never closed\n"
    queue.write_text(broken, encoding="utf-8")
    result = down(root, "miho", "main", "m", "p")
    assert result.returncode == 1 and "the quote opened here is never closed" in result.stderr
    assert queue.read_text(encoding="utf-8") == broken
    lock.write_bytes(b"")                                  # as `200>queue.lock` leaves it
    queue.write_text(broken.rsplit("  priority:", 1)[0], encoding="utf-8")
    assert down(root, "miho", "main", "m", "p").stdout == "cmd_051\n"
    if yaml is not None:
        assert [e["id"] for e in yaml.safe_load(queue.read_text())["commands"]][-3:] == [
            "cmd_049", "cmd_050", "cmd_051"]


def test_relay_skips_the_whole_file_check_for_the_bytes_it_wrote_last(tmp_path):
    """The fast path: after each write the lock file holds the digest of the queue's bytes,
    and a queue whose bytes match it is not checked again. Observed through a record
    matching a queue the check would refuse (as a forged one would): the append goes through,
    where without the fast path it is refused as above."""
    bridge = load_bridge()
    root, queue = make_root(tmp_path, fixture="pyyaml_indentless.yaml",
                            config={"relay": {"nudge": False}})
    lock = queue.parent / (QUEUE + ".lock")
    assert down(root, "miho", "main", "m", "p").stdout == "cmd_049\n"
    assert lock.read_bytes() == bridge._relay_digest(queue.read_bytes())
    broken = queue.read_bytes() + b"  priority: 'never closed\n"
    queue.write_bytes(broken)
    lock.write_bytes(bridge._relay_digest(broken))
    result = down(root, "miho", "main", "m", "p")
    assert result.returncode == 0 and result.stdout == "cmd_050\n", result.stderr
    assert queue.read_bytes().startswith(broken)
    assert lock.read_bytes() == bridge._relay_digest(queue.read_bytes())


@pytest.mark.parametrize("keys,relays", [
    ("  source: agent_teams\n  status: done\n  source: lord\n", False),
    ("  status: done\n  source: lord\n  source: agent_teams\n", True),
    ("  source: agent_teams\n  status: done\n  status: in_progress\n", False),
])
def test_up_reads_a_key_given_twice_as_pyyaml_does(tmp_path, keys, relays):
    """A key given twice in an entry: PyYAML (every other reader) keeps the last value."""
    text = "commands:\n- id: cmd_001\n" + keys
    root, _queue = make_root(tmp_path, text=text, config={"relay": {"nudge": False}})
    if yaml is not None:
        entry = yaml.safe_load(text)["commands"][0]
        assert (entry["source"] == "agent_teams" and entry["status"] == "done") == relays
    result = up(root, "miho", "main", "cmd_001", "done", "s")
    assert result.returncode == 0, result.stderr
    assert (result.stdout == "miho隊報告: cmd_001 [done] — s\n") == relays, result.stderr


def test_a_hard_linked_lock_file_is_never_written(tmp_path):
    """relay keeps a digest in the lock file; a lock planted as a hard link to another
    file (here one outside the repository) must only be locked, never rewritten."""
    root, queue = make_root(tmp_path, fixture="legacy_queue.yaml", config={"relay": {"nudge": False}})
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    os.link(precious, queue.parent / (QUEUE + ".lock"))
    for expected in ("cmd_006\n", "cmd_007\n"):
        result = down(root, "miho", "main", "m", "p")
        assert result.returncode == 0 and result.stdout == expected, result.stderr
    assert precious.read_text() == "keep me\n"


def test_readme_relay_quick_start_runs_as_written(tmp_path):
    """The README's relay quick start, run with sh from the clone as a reader would paste it:
    down appends cmd_049 after the fixture's cmd_048 and nudges, up holds back a pending entry
    and prints the report line once the entry is done."""
    out = subprocess.run(["sh", "-ec", readme_quickstart("quickstart relay")], cwd=BRIDGE.parent,
                         env=clean_env(TMPDIR=tmp_path), capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "cmd_049" and lines[-1] == "miho隊報告: cmd_049 [done] — self-watch added.", out.stdout
    assert out.stdout.count("miho隊報告") == 1 and "NO RELAY: cmd_049" in out.stderr, out.stderr
    assert "新規指令 cmd_049 を受信。処理されたし。" in out.stdout
    (queue,) = tmp_path.glob("*/queue/captain_to_vice_captain.yaml")
    entry = find_entry(queue.read_text(), "cmd_049")[0]
    assert (entry["status"], entry["source"], entry["priority"]) == ("done", "agent_teams", "high"), entry
