"""`bridge.py changes`: change sets validated and executed through an MCP server.

Everything runs through the CLI on real git repositories, with fixtures/mcp_axiomregent.py
(axiomregent's real quirks, or the MCP standard with --line) as the server; it applies patches
with `git apply`, so a completed change set really changed the files."""
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import (BRIDGE, FIXTURES, PYTHON, clean_env, git, load_bridge, make_git_repo,
                      process_running, readme_quickstart, run_bridge)

SERVER = str(FIXTURES / "mcp_axiomregent.py")


B = load_bridge()

FEATURES = {
    "features": [
        {"feature_id": "auth_core", "title": "Auth", "spec_path": "spec/auth.md",
         "impl_files": ["src/auth.py"], "test_files": []},
        {"feature_id": "docs", "title": "Docs", "spec_path": "spec/docs.md",
         "impl_files": ["docs"], "test_files": []},
    ],
    "generated_files": ["src/gen.py"],
}

NOTES_PATCH = "--- a/notes.txt\n+++ b/notes.txt\n@@ -1 +1,2 @@\n hello\n+world\n"
AUTH_PATCH = ("--- a/src/auth.py\n+++ b/src/auth.py\n@@ -1,2 +1,2 @@\n def login():\n"
              "-    return 1\n+    return 2\n")
GEN_PATCH = "--- a/src/gen.py\n+++ b/src/gen.py\n@@ -1 +1 @@\n-X = 1\n+X = 2\n"
GUIDE_PATCH = "--- a/docs/guide.md\n+++ b/docs/guide.md\n@@ -1 +1 @@\n-guide\n+better guide\n"
BAD_PATCH = "--- a/notes.txt\n+++ b/notes.txt\n@@ -1 +1 @@\n-no such line\n+x\n"


class Env:
    """A repository with features, a config outside it, and helpers to drive the CLI."""

    def __init__(self, tmp_path, server_args=(), framing="content-length", **changes_cfg):
        self.tmp = tmp_path
        self.repo = make_git_repo(tmp_path / "repo")
        (self.repo / "spec").mkdir()
        (self.repo / "src").mkdir()
        (self.repo / "docs").mkdir()
        (self.repo / "spec" / "features.yaml").write_text(json.dumps(FEATURES, indent=1))
        (self.repo / "spec" / "auth.md").write_text("auth\n")
        (self.repo / "spec" / "docs.md").write_text("docs\n")
        (self.repo / "src" / "auth.py").write_text("def login():\n    return 1\n")
        (self.repo / "src" / "gen.py").write_text("X = 1\n")
        (self.repo / "docs" / "guide.md").write_text("guide\n")
        (self.repo / "notes.txt").write_text("hello\n")
        git(self.repo, "add", "-A")
        git(self.repo, "commit", "-q", "-m", "features")
        self.cfg_path = tmp_path / "cfg.json"
        self.configure(server_args, framing, **changes_cfg)

    def configure(self, server_args=(), framing="content-length", **changes_cfg):
        cfg = {"mcp": {"command": [PYTHON, SERVER] + list(server_args), "framing": framing,
                       "timeout_sec": 20},
               "approval_key": str(self.tmp / "keys" / "approval.key")}  # never ~/.config
        for key, value in changes_cfg.items():
            if key == "mcp":
                cfg["mcp"].update(value)
            else:
                cfg[key] = value
        self.cfg_path.write_text(json.dumps({"changes": cfg}))

    def cli(self, *args, **kw):
        return run_bridge("changes", *args, "--root", self.repo, "--config", self.cfg_path,
                          **kw)

    def new(self, subject, tasks, *extra, ok=True):
        plan_path = self.tmp / ("plan-%s.json" % time.monotonic_ns())
        plan_path.write_text(json.dumps(plan(tasks), indent=2))
        res = self.cli("new", "--subject", subject, "--plan", plan_path, *extra)
        if ok:
            assert res.returncode == 0, res.stderr
            return res.stdout.strip()
        return res

    def run(self, *extra, **kw):
        return self.cli("run", "--once", *extra, **kw)

    def dir(self, cs_id):
        return self.repo / "changes" / cs_id

    def wait_running(self, cs_id, task_id="t1", timeout=20):
        """Wait until 05-status.json says the executor is running `task_id`."""
        path, deadline = self.dir(cs_id) / "05-status.json", time.time() + timeout
        while time.time() < deadline:
            if path.exists() and b"running task " + task_id.encode() in path.read_bytes():
                return
            time.sleep(0.05)
        raise AssertionError("%s never said it runs %s" % (path, task_id))

    def status(self, cs_id):
        raw = (self.dir(cs_id) / "05-status.json").read_bytes()
        data = json.loads(raw)
        # written canonically: the bytes are exactly the canonical serialisation
        assert raw == B.canonical_json(data)
        assert data["schema_version"] == "changeset_status_v1"
        assert data["decision"] and data["reason"]
        return data

    def log(self):
        path = self.repo / "changes" / ".log" / "executor.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    def states(self, cs_id):
        return [r["state"] for r in self.log() if r.get("change_set_id") == cs_id
                and r["event"] == "status"]


def task(tid, patch=None, tool="workspace.apply_patch", type_="mcp_call", **params):
    if patch is not None:
        params["patch"] = patch
    return {"id": tid, "type": type_, "tool": tool, "params": params,
            "risk_profile": {"impact_score": "low", "touched_features": [],
                             "destructive": False}}


def plan(tasks):
    return {"version": "plan_v1", "tasks": tasks}


@pytest.fixture
def env(tmp_path):
    return Env(tmp_path)


# ---- canonical JSON ---------------------------------------------------------------------

def test_canonical_json_vectors():
    # Astral-plane keys: code-point (= UTF-8 byte) order puts U+FB33 before U+1F602;
    # RFC 8785 sorts UTF-16 code units, where U+1F602 is D83D DE02 < FB33. This is the one
    # place the seed's order and RFC 8785 differ.
    obj = {"\U0001F602": 1, "\uFB33": 2, "\u20ac": 3, "a": 4, "": 5, "\x7f": 6}
    out = B.canonical_json(obj).decode("utf-8")
    assert out == '{"":5,"a":4,"\x7f":6,"\u20ac":3,"\uFB33":2,"\U0001F602":1}'
    rfc_order = sorted(obj, key=lambda k: k.encode("utf-16-be"))
    assert rfc_order.index("\U0001F602") < rfc_order.index("\uFB33")
    assert list(json.loads(out)) == sorted(obj)  # code-point order
    # escapes: only " \ and controls; / DEL U+2028 and combining marks stay literal
    assert B.canonical_json(["a\"b\\c\n\t\x01/\u2028A\u030a"]) == \
        '["a\\"b\\\\c\\n\\t\\u0001/\u2028A\u030a"]'.encode("utf-8")
    assert B.canonical_json({"b": [3, {"d": None, "c": True}], "a": -0}) == \
        b'{"a":0,"b":[3,{"c":true,"d":null}]}'
    assert B.canonical_json(2 ** 53 - 1) == b"9007199254740991"
    assert not B.canonical_json({"x": "y"}).endswith(b"\n")


@pytest.mark.parametrize("value,words", [
    (1.0, "floats are not allowed"), (float("nan"), "not an integer"),
    (2 ** 53, "outside"), (-(2 ** 53), "outside"), ({"k": "\ud800"}, "lone surrogate"),
    ({"\udfff": 1}, "lone surrogate"), ({1: 2}, "not a string"),
])
def test_canonical_json_rejects(value, words):
    with pytest.raises(B.CanonicalJSONError) as err:
        B.canonical_json(value)
    assert words in err.value.message


@pytest.mark.parametrize("text,words", [
    ('{"a":1,"a":2}', 'duplicate key "a"'), ('{"a":1.5}', "number 1.5"),
    ('{"a":1e5}', "number 1e5"), ('[NaN]', "NaN"), ('[Infinity]', "Infinity"),
    ('["\\ud83d"]', "lone surrogate"), ('[9007199254740992]', "outside"),
    ('{"a": }', "line 1 column 7"), ('[' + '9' * 5000 + ']', "plan.json"),
])
def test_canonical_loads_rejects(text, words):
    with pytest.raises(B.CanonicalJSONError) as err:
        B.canonical_loads(text.encode(), "plan.json")
    assert words in err.value.message and "plan.json" in err.value.message


# ---- slug and repo key --------------------------------------------------------------------

@pytest.mark.parametrize("subject,slug", [
    ("Refactor Login Flow!", "refactor-login-flow"), ("Crème brûlée", "creme-brulee"),
    ("Straße — Ærø", "strasse-aero"), ("日本語", "change"), ("", "change"),
    ("a  --  b", "a-b"), ("İstanbul", "istanbul"), ("--x--", "x"),
    ("a" * 47 + " bcd", "a" * 47), ("x" * 60, "x" * 48),
])
def test_slug_table(subject, slug):
    assert B.changeset_slug(subject) == slug


REPO_KEYS = [
    ("https://github.com/owner/repo.git", "github.com/owner/repo"),
    ("git@github.com:owner/repo.git", "github.com/owner/repo"),
    ("ssh://git@host:2222/owner/repo", "host/owner/repo"),
    ("https://x-access-token:TOKEN@github.com/owner/repo.git", "github.com/owner/repo"),
    ("https://user@GitHub.com:443/Owner/Repo.git/", "github.com/Owner/Repo"),
    ("git+https://github.com/Org/Repo.git", "github.com/Org/Repo"),
    ("git://github.com/Org/Repo.git", "github.com/Org/Repo"),
    ("git@github.com:/owner/repo.git", "github.com/owner/repo"),
    ("ssh://git@[::1]:22/owner/repo.git", "::1/owner/repo"),
    ("git@host.org:9999/Org/Repo.git", "host.org/9999/Org/Repo"),
    ("https://gitlab.com/group/sub/repo.git", "gitlab.com/group/sub/repo"),
    ("https://dev.azure.com/org/proj/_git/repo", "dev.azure.com/org/proj/_git/repo"),
    ("file:///srv/git/repo.git", None), ("/srv/git/repo.git", None), ("C:\\src\\repo", None),
]


@pytest.mark.parametrize("url,key", REPO_KEYS)
def test_repo_key_table(url, key):
    assert B.normalize_repo_key(url) == key


def test_repo_key_from_origin_never_leaks_token(env):
    git(env.repo, "remote", "add", "origin",
        "https://x-access-token:ghp_SuperSecret123@GitHub.com:443/Owner/Repo.git")
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    meta = json.loads((env.dir(cs_id) / "00-meta.json").read_bytes())
    assert meta["repo_key"] == "github.com/Owner/Repo"
    assert env.run().returncode == 0
    for dirpath, _, files in os.walk(env.repo / "changes"):
        for name in files:
            data = open(os.path.join(dirpath, name), "rb").read()
            assert b"SuperSecret" not in data and b"x-access-token" not in data
    # the id depends on the normalised key only
    ident = B.changeset_identity("Add world", "github.com/Owner/Repo", meta["base_state"])
    assert B.changeset_id(ident) == cs_id


def test_repo_key_falls_back_to_path_and_id_is_deterministic(env):
    a = env.cli("id", "--subject", "Fix it", "--snapshot", "snap-1")
    b = env.cli("id", "--subject", "  fix   IT ", "--snapshot", "snap-1")
    assert a.returncode == 0 and a.stdout == b.stdout
    ident = B.changeset_identity("Fix it", os.path.abspath(str(env.repo)),
                                 {"kind": "snapshot", "id": "snap-1"})
    assert ident == {"base_state": {"id": "snap-1", "kind": "snapshot"},
                     "protocol": "changeset_id_v1", "repo_key": os.path.abspath(str(env.repo)),
                     "subject": "fix-it"}
    assert a.stdout.strip() == "fix-it--" + B.canonical_sha256(ident)[:12]
    c = env.cli("id", "--subject", "Fix it", "--snapshot", "snap-2")
    assert c.stdout != a.stdout


def test_id_needs_a_server_or_a_snapshot(tmp_path):
    repo = make_git_repo(tmp_path / "r")
    res = run_bridge("changes", "id", "--subject", "x", "--root", repo)
    assert res.returncode == 2 and "changes.mcp.command" in res.stderr


# ---- the executor: decisions and states -------------------------------------------------

def test_tier1_change_runs_automatically(env):
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)], "--architecture",
                    str(env.repo / "spec" / "auth.md"))
    d = env.dir(cs_id)
    assert sorted(os.listdir(d)) == ["00-meta.json", "01-architecture.md",
                                     "02-implementation-plan.json", "03-task-list.md"]
    meta_raw = (d / "00-meta.json").read_bytes()
    meta = json.loads(meta_raw)
    assert meta_raw == B.canonical_json(meta)
    assert meta["plan_sha256"] == B.canonical_sha256(
        json.loads((d / "02-implementation-plan.json").read_bytes()))
    assert meta["base_state"]["kind"] == "worktree"
    assert "`t1` workspace.apply_patch" in (d / "03-task-list.md").read_text()
    st = env.cli("status")
    assert "ready" in st.stdout and cs_id in st.stdout
    res = env.run()
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "%s completed" % cs_id
    assert (env.repo / "notes.txt").read_text() == "hello\nworld\n"
    status = env.status(cs_id)
    assert status["state"] == "completed" and status["decision"] == "auto"
    assert status["execution"]["completed_task_ids"] == ["t1"]
    assert status["validated_against"]["plan_sha256"] == meta["plan_sha256"]
    assert status["validation"]["safety_tier"] == "tier1"
    assert status["validation"]["impact_source"] == "features.overview"  # -32601 fallback
    assert env.states(cs_id) == ["validating", "executing", "executing", "completed"]
    # a second pass leaves terminal change sets alone
    again = env.run()
    assert again.returncode == 0 and again.stdout == ""
    # the worktree moved on, so the same request is now a different change set
    assert env.new("Add world", [task("t1", NOTES_PATCH)]) != cs_id


def test_processed_change_sets_are_immutable(env):
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)], "--snapshot", "sha256:gone")
    assert env.new("Add world", [task("t1", NOTES_PATCH)], "--snapshot", "sha256:gone") == cs_id
    env.run()
    assert env.status(cs_id)["state"] == "failed"
    res = env.new("Add world", [task("t1", NOTES_PATCH)], "--snapshot", "sha256:gone", ok=False)
    assert res.returncode == 1 and "immutable" in res.stderr and cs_id in res.stderr


def test_tier2_waits_for_approval_then_runs(env):
    cs_id = env.new("Change login", [task("t1", AUTH_PATCH)])
    pre = env.cli("approve", cs_id)
    assert pre.returncode == 1 and "not been validated" in pre.stderr
    res = env.run()
    assert res.returncode == 0 and "pending_review" in res.stdout
    status = env.status(cs_id)
    assert status["state"] == "pending_review" and status["decision"] == "review_required"
    assert "Tier 2" in status["reason"]
    assert status["validation"]["touched_features"] == ["auth_core"]
    assert "return 1" in (env.repo / "src" / "auth.py").read_text()
    assert env.run().stdout == ""  # still waiting, nothing happens
    ap = env.cli("approve", cs_id)
    assert ap.returncode == 0 and "approved" in ap.stdout
    status = env.status(cs_id)
    assert status["decision"] == "approved" and status["approval"]["plan_sha256"]
    assert env.cli("approve", cs_id).stdout.strip().endswith("already approved")
    res = env.run()
    assert res.returncode == 0 and "completed" in res.stdout
    assert "return 2" in (env.repo / "src" / "auth.py").read_text()
    status = env.status(cs_id)
    assert status["state"] == "completed" and status["decision"] == "approved"
    again = env.cli("approve", cs_id)
    assert again.returncode == 1 and "not waiting for review" in again.stderr


def forge_approval(env, cs_id, **approval):
    """What a planning agent can do: rewrite 05-status.json as if a human had approved."""
    path = env.dir(cs_id) / "05-status.json"
    status = json.loads(path.read_bytes())
    meta = json.loads((env.dir(cs_id) / "00-meta.json").read_bytes())
    status["decision"] = "approved"
    status["approval"] = dict({"approved_at": "2026-01-01T00:00:00Z", "by": "alice",
                               "plan_sha256": meta["plan_sha256"]}, **approval)
    path.write_bytes(B.canonical_json(status))


@pytest.mark.parametrize("mac", [None, "hmac-sha256:" + "0" * 64, "hmac-sha256:\u00e9"])
def test_the_planning_agent_cannot_approve_its_own_change_set(tmp_path, mac):
    env = Env(tmp_path, critical_features=["auth_core"])
    cs_id = env.new("Change login", [task("t1", AUTH_PATCH)])
    env.run()
    assert env.status(cs_id)["state"] == "pending_review"
    key = env.tmp / "keys" / "approval.key"  # the key exists: the MAC itself is checked
    key.parent.mkdir()
    key.write_text(os.urandom(32).hex())
    key.chmod(0o600)
    forge_approval(env, cs_id, **({"mac": mac} if mac else {}))
    res = env.run()
    assert res.returncode == 1, res.stdout
    status = env.status(cs_id)
    assert status["state"] == "failed" and status["reason"].startswith("forged_approval:")
    assert "return 1" in (env.repo / "src" / "auth.py").read_text()
    assert [r for r in env.log() if r["event"] == "forged_approval"]


def test_an_approval_copied_to_another_change_set_fails(tmp_path):
    env = Env(tmp_path, critical_features=["auth_core"])
    first = env.new("Change login", [task("t1", AUTH_PATCH)])
    second = env.new("Change login too", [task("t1", AUTH_PATCH.replace("return 2", "return 3"))])
    env.run()
    assert env.cli("approve", first).returncode == 0
    genuine = env.status(first)["approval"]
    assert genuine["mac"].startswith("hmac-sha256:") and len(genuine["mac"]) == 12 + 64
    forge_approval(env, second, **dict(genuine, plan_sha256=env.status(second)[
        "validated_against"]["plan_sha256"]))
    forge_approval(env, first, **genuine)  # the genuine one, rewritten as is, still holds
    env.run()
    assert env.status(second)["reason"].startswith("forged_approval:")
    assert env.status(first)["state"] == "completed"
    assert "return 2" in (env.repo / "src" / "auth.py").read_text()


def test_a_plan_changed_after_approval_fails(env):
    cs_id = env.new("Change login", [task("t1", AUTH_PATCH)])
    env.run()
    assert env.cli("approve", cs_id).returncode == 0
    doc = json.loads((env.dir(cs_id) / "02-implementation-plan.json").read_bytes())
    doc["tasks"][0]["params"]["patch"] = GEN_PATCH
    (env.dir(cs_id) / "02-implementation-plan.json").write_bytes(B.canonical_json(doc))
    meta = json.loads((env.dir(cs_id) / "00-meta.json").read_bytes())
    meta["plan_sha256"] = B.canonical_sha256(doc)
    (env.dir(cs_id) / "00-meta.json").write_bytes(B.canonical_json(meta))
    assert env.run().returncode == 1
    assert env.status(cs_id)["reason"].startswith("plan_tampered: the plan changed after")


def test_approval_key_lives_outside_the_repository(tmp_path):
    env = Env(tmp_path)
    cs_id = env.new("Change login", [task("t1", AUTH_PATCH)])
    env.run()
    # the default place: $XDG_CONFIG_HOME/bridge/approval.key, made on first use
    env.configure(approval_key=None)
    xdg = tmp_path / "xdg"
    res = env.cli("approve", cs_id, env=clean_env(XDG_CONFIG_HOME=xdg))
    assert res.returncode == 0, res.stderr
    key = xdg / "bridge" / "approval.key"
    assert key.stat().st_mode & 0o777 == 0o600 and key.parent.stat().st_mode & 0o777 == 0o700
    assert len(bytes.fromhex(key.read_text().strip())) == 32
    assert not any(p.name == "approval.key" for p in env.repo.rglob("*"))
    # the executor finds it the same way, and only with it does the approval count
    assert env.run(env=clean_env(XDG_CONFIG_HOME=tmp_path / "other")).returncode == 1
    assert "no approval key at %s" % (tmp_path / "other" / "bridge" / "approval.key") in \
        env.status(cs_id)["reason"]
    # a key others can read, or one inside the repository, is refused naming it
    cs_id = env.new("Change login again", [task("t1", AUTH_PATCH)])
    env.run()
    os.chmod(key, 0o644)
    res = env.cli("approve", cs_id, env=clean_env(XDG_CONFIG_HOME=xdg))
    assert res.returncode == 2 and str(key) in res.stderr and "chmod 600" in res.stderr
    env.configure(approval_key=str(env.repo / "approval.key"))
    res = env.cli("approve", cs_id)
    assert res.returncode == 2 and "inside the repository" in res.stderr
    env.configure(approval_key="approval.key")
    res = env.cli("approve", cs_id)
    assert res.returncode == 2 and "must be an absolute path" in res.stderr
    assert env.status(cs_id)["decision"] == "review_required"  # nothing was approved


def test_approval_key_from_the_environment(env):
    cs_id = env.new("Change login", [task("t1", AUTH_PATCH)])
    env.run()
    key = env.tmp / "elsewhere" / "k"
    res = env.cli("approve", cs_id, env=clean_env(BRIDGE_APPROVAL_KEY=key))
    assert res.returncode == 0 and key.exists()
    assert env.run(env=clean_env(BRIDGE_APPROVAL_KEY=key)).returncode == 0
    assert env.status(cs_id)["state"] == "completed"


def test_approve_names_who_approved_without_USER(env, monkeypatch):
    # Containers often have no $USER: the approval said "by": "unknown".
    import pwd
    cs_id = env.new("Change login", [task("t1", AUTH_PATCH)])
    env.run()
    bare = {k: v for k, v in clean_env().items() if k not in ("USER", "LOGNAME")}
    assert env.cli("approve", cs_id, env=bare).returncode == 0
    by = env.status(cs_id)["approval"]["by"]
    assert by == pwd.getpwuid(os.getuid()).pw_name
    assert "approved by %s" % by in env.status(cs_id)["reason"]
    # a uid without a passwd entry: git's user.name, else the uid itself
    monkeypatch.delenv("USER", raising=False)
    monkeypatch.delenv("LOGNAME", raising=False)

    def no_entry(uid):
        raise KeyError(uid)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    git(env.repo, "config", "user.name", "Ada Lovelace")
    assert B.approver_name(str(env.repo)) == "Ada Lovelace"
    git(env.repo, "config", "--unset", "user.name")
    monkeypatch.setenv("HOME", str(env.tmp))  # no global user.name either
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    assert B.approver_name(str(env.repo)) == "uid %d" % os.getuid()


def test_approving_a_stale_change_set_warns(tmp_path):
    # Two change sets on the same base: once one is applied, the other can only fail with
    # stale_base, and approving it used to succeed silently.
    env = Env(tmp_path, critical_features=["auth_core"])
    first = env.new("Change login", [task("t1", AUTH_PATCH)])
    second = env.new("Add world", [task("t1", NOTES_PATCH), task("t2", GUIDE_PATCH)])
    env.configure(critical_features=["auth_core", "docs"])
    env.run()
    assert env.status(second)["state"] == "pending_review"
    res = env.cli("approve", first)
    assert res.returncode == 0 and "stale" not in res.stderr, res.stderr
    env.run()
    assert env.status(first)["state"] == "completed"
    res = env.cli("approve", second)
    assert res.returncode == 0 and "approved" in res.stdout
    assert "base is already stale" in res.stderr and "Re-plan" in res.stderr, res.stderr
    assert env.run().returncode == 1
    assert env.status(second)["reason"].startswith("stale_base:")


def test_new_lists_every_problem_of_the_plan_at_once(env):
    plan_file = env.tmp / "bad.json"
    doc = plan([task("t1", NOTES_PATCH), task("t2", tool="run.execute")])
    text = json.dumps(doc).replace('"low"', '"low", "weight": 0.5, "cost": 1e3', 1).replace(
        '"destructive": false', '"destructive": false, "destructive": NaN', 1)
    plan_file.write_text(text)
    res = env.cli("new", "--subject", "x", "--plan", plan_file)
    assert res.returncode == 2, res.stderr
    for words in ("$.tasks[0].risk_profile.weight: number 0.5", "$.tasks[0].risk_profile.cost: "
                  "number 1e3", 'duplicate key "destructive"', "NaN is not valid JSON",
                  "forbidden_tool", "(6 problem(s))"):
        assert words in res.stderr, (words, res.stderr)


@pytest.mark.parametrize("line", [False, True])
def test_critical_feature_asks_for_review(tmp_path, line):
    env = Env(tmp_path, server_args=["--line"] if line else [],
              framing="line" if line else "content-length", critical_features=["docs"])
    cs_id = env.new("Improve guide", [task("t1", GUIDE_PATCH)])
    res = env.run()
    assert res.returncode == 0, res.stderr
    status = env.status(cs_id)
    assert status["state"] == "pending_review" and "critical feature(s) docs" in status["reason"]
    assert status["validation"]["safety_tier"] == "tier1"
    assert status["validation"]["impact_source"] == (
        "features.impact" if line else "features.overview")


def test_line_json_server_runs_a_change(tmp_path):
    env = Env(tmp_path, server_args=["--line"], framing="line")
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    res = env.run()
    assert res.returncode == 0, res.stderr
    assert env.status(cs_id)["state"] == "completed"
    assert (env.repo / "notes.txt").read_text() == "hello\nworld\n"


def test_tier3_is_rejected_and_never_approvable(env):
    cs_id = env.new("Edit generated", [task("t1", GEN_PATCH)])
    res = env.run()
    assert res.returncode == 1 and "failed" in res.stdout
    status = env.status(cs_id)
    assert status["state"] == "failed" and status["decision"] == "rejected"
    assert status["reason"].startswith("tier3:") and "EDIT_GENERATED_FILE" in status["reason"]
    ap = env.cli("approve", cs_id)
    assert ap.returncode == 1 and "Tier 3 changes can never be approved" in ap.stderr
    assert (env.repo / "src" / "gen.py").read_text() == "X = 1\n"


def test_gov_drift_rejects(env):
    os.remove(env.repo / "spec" / "docs.md")
    git(env.repo, "commit", "-qam", "drop docs spec")
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    assert env.run().returncode == 1
    status = env.status(cs_id)
    assert status["decision"] == "rejected"
    assert status["reason"].startswith("gov_drift:") and "SPEC_PATH_MISMATCH" in status["reason"]
    assert (env.repo / "notes.txt").read_text() == "hello\n"


def test_patch_rejects_are_a_failure(env):
    cs_id = env.new("Bad patch", [task("t1", NOTES_PATCH), task("t2", BAD_PATCH)])
    res = env.run()
    assert res.returncode == 1
    status = env.status(cs_id)
    assert status["state"] == "failed" and status["decision"] == "auto"
    assert status["reason"].startswith("patch_rejected:") and "context_mismatch" in \
        status["reason"]
    assert status["execution"]["completed_task_ids"] == ["t1"]
    assert status["execution"]["started_task_id"] == "t2"
    assert status["execution"]["last_error"].startswith("patch_rejected")


def test_stale_base_is_refused(env):
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    (env.repo / "other.txt").write_text("someone else was here\n")
    res = env.run()
    assert res.returncode == 1
    status = env.status(cs_id)
    assert status["state"] == "failed" and status["reason"].startswith("stale_base:")
    assert (env.repo / "notes.txt").read_text() == "hello\n"


def test_stale_lease_mid_execution(tmp_path):
    env = Env(tmp_path, server_args=["--slow", "workspace.apply_patch=2"])
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    proc = subprocess.Popen([PYTHON, str(BRIDGE), "changes", "run", "--once", "--root",
                             str(env.repo), "--config", str(env.cfg_path)], env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    env.wait_running(cs_id)
    (env.repo / "other.txt").write_text("changed under the lease\n")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    status = env.status(cs_id)
    assert status["state"] == "failed" and status["reason"].startswith("stale_lease:")
    assert "STALE_LEASE" in status["reason"]


def test_snapshot_mode_via_fallback(tmp_path):
    env = Env(tmp_path, server_args=["--no-snapshot-info"])
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    meta = json.loads((env.dir(cs_id) / "00-meta.json").read_bytes())
    assert meta["base_state"]["kind"] == "snapshot"
    # --worktree asks for the worktree state: no fallback, the server's refusal is said
    res = env.cli("id", "--subject", "Add world", "--worktree")
    assert res.returncode == 1 and "snapshot.info failed" in res.stderr, res.stderr
    res = env.run()
    assert res.returncode == 0, res.stderr
    status = env.status(cs_id)
    assert status["state"] == "completed"
    assert status["result_snapshot_id"] != meta["base_state"]["id"]
    assert (env.repo / "notes.txt").read_text() == "hello\n"  # snapshots, not the worktree
    # an unknown snapshot is a stale base
    other = env.new("Other", [task("t1", NOTES_PATCH)], "--snapshot", "sha256:nope")
    assert env.run().returncode == 1
    assert env.status(other)["reason"].startswith("stale_base:")


# ---- integrity and schema -----------------------------------------------------------------

def test_tampered_plan_is_refused(env):
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    path = env.dir(cs_id) / "02-implementation-plan.json"
    doc = json.loads(path.read_bytes())
    doc["tasks"][0]["params"]["patch"] = AUTH_PATCH
    path.write_bytes(B.canonical_json(doc))
    val = env.cli("validate", cs_id)
    assert val.returncode == 1 and "plan_tampered" in val.stdout
    assert env.run().returncode == 1
    status = env.status(cs_id)
    assert status["decision"] == "rejected" and status["reason"].startswith("plan_tampered:")
    assert "return 1" in (env.repo / "src" / "auth.py").read_text()


def test_renamed_folder_is_refused(env):
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    os.rename(env.dir(cs_id), env.dir("add-world--000000000000"))
    assert env.run().returncode == 1
    status = env.status("add-world--000000000000")
    assert status["reason"].startswith("integrity_mismatch:") and cs_id in status["reason"]
    assert (env.repo / "notes.txt").read_text() == "hello\n"


def test_duplicate_keys_and_floats_are_refused(env):
    plan_file = env.tmp / "dup.json"
    plan_file.write_text('{"version": "plan_v1", "version": "plan_v1", "tasks": []}')
    res = env.cli("new", "--subject", "x", "--plan", plan_file)
    assert res.returncode == 2 and 'duplicate key "version"' in res.stderr
    plan_file.write_text(json.dumps(plan([task("t1", NOTES_PATCH)])).replace(
        '"low"', '"low", "weight": 0.5'))
    res = env.cli("new", "--subject", "x", "--plan", plan_file)
    assert res.returncode == 2 and "floats are not allowed" in res.stderr
    assert not (env.repo / "changes").exists() or not [
        n for n in os.listdir(env.repo / "changes") if not n.startswith(".")]
    # tampering inside an existing change set: duplicate keys in the meta
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    meta_path = env.dir(cs_id) / "00-meta.json"
    meta_path.write_bytes(meta_path.read_bytes()[:-1] + b',"subject":"other"}')
    assert env.run().returncode == 1
    status = env.status(cs_id)
    assert status["reason"].startswith("invalid_meta:") and "duplicate key" in status["reason"]


def test_forbidden_tasks_are_refused(env):
    res = env.new("Shell", [task("t1", tool="run.execute", command="rm -rf /")], ok=False)
    assert res.returncode == 2 and "forbidden_tool" in res.stderr
    res = env.new("Shell", [task("t1", tool="shell", type_="shell_command")], ok=False)
    assert res.returncode == 2 and "forbidden_task" in res.stderr
    # a hand-made change set with correct hashes is still refused by the executor
    base = {"kind": "snapshot", "id": "s1"}
    ident = B.changeset_identity("Shell", os.path.abspath(str(env.repo)), base)
    cs_id = B.changeset_id(ident)
    doc = plan([task("t1", NOTES_PATCH, mode="snapshot"),
                task("t2", tool="shell", type_="shell_command")])
    os.makedirs(env.dir(cs_id))
    (env.dir(cs_id) / "02-implementation-plan.json").write_bytes(B.canonical_json(doc))
    (env.dir(cs_id) / "00-meta.json").write_bytes(B.canonical_json(
        dict(ident, plan_sha256=B.canonical_sha256(doc))))
    val = env.cli("validate", cs_id)
    assert val.returncode == 1 and "forbidden_task" in val.stdout
    assert env.run().returncode == 1
    assert env.status(cs_id)["reason"].startswith("forbidden_task:")


def test_validate_prints_every_problem_and_passes_good_sets(env):
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    val = env.cli("validate", cs_id)
    assert val.returncode == 0 and "would decide auto" in val.stdout
    assert not (env.dir(cs_id) / "05-status.json").exists()  # validate never writes status
    path = env.dir(cs_id) / "02-implementation-plan.json"
    doc = json.loads(path.read_bytes())
    doc["version"] = "plan_v0"
    doc["tasks"].append(task("t1", tool="run.execute"))
    path.write_bytes(B.canonical_json(doc))
    val = env.cli("validate", cs_id)
    lines = val.stdout.splitlines()
    assert val.returncode == 1
    for word in ("plan_tampered", "version must be", "used twice", "forbidden_tool"):
        assert any(word in line for line in lines), (word, lines)


def test_draft_is_left_alone(env):
    d = env.repo / "changes" / "half-written--0123456789ab"
    d.mkdir(parents=True)
    (d / "00-meta.json").write_text("{}")
    assert env.run().returncode == 0
    assert not (d / "05-status.json").exists()
    assert "draft" in env.cli("status").stdout


def test_edited_plan_gets_a_new_id_and_supersedes(env):
    first = env.new("Add world", [task("t1", NOTES_PATCH)])
    second = env.new("Add world", [task("t1", AUTH_PATCH)])
    assert second.startswith("add-world--") and len(second) == len(first) + 4
    assert second[:len(first)] == first
    meta = json.loads((env.dir(second) / "00-meta.json").read_bytes())
    assert meta["supersedes"] == [first]
    assert env.new("Add world", [task("t1", AUTH_PATCH)]) == second  # idempotent
    third = env.new("Add world", [task("t1", GEN_PATCH)], ok=False)
    assert third.returncode == 1 and "both taken" in third.stderr
    env.run()
    assert env.status(first)["state"] == "superseded"
    assert env.status(first)["reason"] == "superseded by %s" % second
    assert env.status(second)["state"] == "pending_review"


# ---- the MCP server failing ---------------------------------------------------------------

def test_server_crash_mid_call_is_recorded(tmp_path):
    env = Env(tmp_path, server_args=["--crash-on", "workspace.apply_patch"])
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    res = env.run(env=clean_env(DEPLOY_TOKEN="tok-0123456789abcdef"))
    assert res.returncode == 1
    status = env.status(cs_id)
    assert status["state"] == "failed" and status["reason"].startswith("mcp_server_gone:")
    assert "exit code 3" in status["reason"] and "crashing on purpose" in status["reason"]
    # the server's stderr is redacted before it reaches the status, the log or the terminal
    assert "DEPLOY_TOKEN=[REDACTED]" in status["reason"]
    for path in (env.dir(cs_id) / "05-status.json", env.repo / "changes" / ".log" /
                 "executor.jsonl"):
        assert b"0123456789abcdef" not in path.read_bytes()
    assert "0123456789abcdef" not in res.stderr


def test_slow_server_times_out(tmp_path):
    env = Env(tmp_path)
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    tag = "--tag=%s" % tmp_path.name  # ignored by the server; lets us find its process
    env.configure(["--slow", "gov.drift=10", tag], mcp={"timeout_sec": 1})
    t0 = time.time()
    res = env.run()
    assert res.returncode == 1 and time.time() - t0 < 9
    status = env.status(cs_id)
    assert "did not answer gov.drift within 1 s" in status["reason"]
    # the stalled server was killed, not left behind
    for pid in os.listdir("/proc"):
        if pid.isdigit() and process_running(int(pid)):
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    assert tag.encode() not in f.read(), "server %s outlived its run" % pid
            except OSError:
                pass


def test_server_that_cannot_start(tmp_path):
    env = Env(tmp_path)
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    env.configure(mcp={"command": ["/nonexistent/axiomregent"]})
    assert env.run().returncode == 1
    assert "cannot start MCP server" in env.status(cs_id)["reason"]


# ---- the executor lock --------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_planted_executor_lock_is_refused_naming_it(env, kind):
    """A FIFO or a symlink as changes/.locks/worktree.lock: `changes run` exits 2 naming it (never
    waits on it, never locks or writes the file a link points to) and applies nothing."""
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    lock, outside = env.repo / "changes" / ".locks" / "worktree.lock", env.tmp / "outside.lock"
    lock.parent.mkdir(exist_ok=True)
    os.mkfifo(lock) if kind == "fifo" else lock.symlink_to(outside)
    res = env.run(timeout=20)
    assert res.returncode == 2 and "cannot lock %s" % lock in res.stderr, res.stderr
    assert ("not a regular file" if kind == "fifo" else "symlink") in res.stderr
    assert not outside.exists() and not (env.dir(cs_id) / "05-status.json").exists()
    assert (env.repo / "notes.txt").read_text() == "hello\n"


def test_two_executors_one_works(tmp_path):
    env = Env(tmp_path)
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    env.configure(["--slow", "gov.preflight=2"])
    first = subprocess.Popen([PYTHON, str(BRIDGE), "changes", "run", "--once", "--root",
                              str(env.repo), "--config", str(env.cfg_path)], env=clean_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = env.repo / "changes" / ".locks" / "worktree.lock"
    deadline = time.time() + 20
    while time.time() < deadline and not (lock.exists() and lock.read_text().strip()):
        time.sleep(0.05)
    second = env.run()
    assert second.returncode == 3
    assert "another executor holds" in second.stderr and "pid %d" % first.pid in second.stderr
    st = env.cli("status", "--json")
    assert json.loads(st.stdout)["executor"]["lock"] == "held"
    out, err = first.communicate(timeout=30)
    assert first.returncode == 0, err
    assert env.status(cs_id)["state"] == "completed"


def test_killed_executor_is_recovered(tmp_path):
    env = Env(tmp_path, server_args=["--slow", "workspace.apply_patch=30"])
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    proc = subprocess.Popen([PYTHON, str(BRIDGE), "changes", "run", "--once", "--root",
                             str(env.repo), "--config", str(env.cfg_path)], env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    env.wait_running(cs_id)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    env.configure()
    res = env.run()
    assert res.returncode == 1
    status = env.status(cs_id)
    assert status["state"] == "failed" and status["reason"].startswith("interrupted:")
    assert "t1" in status["reason"]
    assert any(r["event"] == "lock_recovered" for r in env.log())


def test_run_without_a_server_is_a_usage_error(tmp_path):
    repo = make_git_repo(tmp_path / "r")
    res = run_bridge("changes", "run", "--once", "--root", repo)
    assert res.returncode == 2 and "changes.mcp.command" in res.stderr
    res = run_bridge("changes", "--root", repo)
    assert res.returncode == 2


def test_status_json_lists_everything(env):
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    env.run()
    data = json.loads(env.cli("status", "--json").stdout)
    assert data["change_sets"] == [{"change_set_id": cs_id, "state": "completed",
                                    "decision": "auto", "reason": "applied 1 task(s)"}]
    one = json.loads(env.cli("status", cs_id, "--json").stdout)
    assert one["state"] == "completed" and one["execution"]["completed_task_ids"] == ["t1"]
    assert env.cli("status", "nope").returncode == 2
    # the status file is the planning agent's to write too: --json prints it ASCII-only
    status_file = env.repo / "changes" / cs_id / "05-status.json"
    status_file.write_text(json.dumps(dict(json.loads(status_file.read_text()), reason="x\u009b2J\u0085")))
    for args in (("status", cs_id, "--json"), ("status", "--json")):
        out = env.cli(*args).stdout
        assert out.isascii() and "x\\u009b2J\\u0085" in out, out


PATCH_FORMS = {  # name -> (patch, the paths git apply -p1 reads or writes)
    "headers only": ("--- a/x.sql\n+++ b/x.sql\n@@ -1,2 +1,2 @@\n--- comment\n+++ plus\n keep\n"
                     "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+hi\n"
                     "\\ No newline at end of file\n", ["new.txt", "x.sql"]),
    "non-ASCII digits": ("@@ -\u0669 +\u0669 @@\n" + NOTES_PATCH, ["notes.txt"]),
    "rename only": ("diff --git a/src/gen.py b/src/gen2.py\nsimilarity index 100%\n"
                    "rename from src/gen.py\nrename to src/gen2.py\n", ["src/gen.py", "src/gen2.py"]),
    "copy": ("diff --git a/notes.txt b/n2.txt\nsimilarity index 100%\ncopy from notes.txt\n"
             "copy to n2.txt\n", ["n2.txt", "notes.txt"]),
    "new empty file": ("diff --git a/e.txt b/e.txt\nnew file mode 100644\nindex 0000000..e69de29\n",
                       ["e.txt"]),
    "deleted": ("diff --git a/notes.txt b/notes.txt\ndeleted file mode 100644\n--- a/notes.txt\n"
                "+++ /dev/null\n@@ -1 +0,0 @@\n-hello\n", ["notes.txt"]),
    "mode change": ("diff --git a/notes.txt b/notes.txt\nold mode 100644\nnew mode 100755\n",
                    ["notes.txt"]),
    "C-quoted names": ('--- "a/\\143hanges/x"\n+++ "b/\\143hanges/x"\n@@ -0,0 +1 @@\n+hi\n',
                       ["changes/x"]),
    "two files": (NOTES_PATCH + GEN_PATCH, ["notes.txt", "src/gen.py"]),
}


@pytest.mark.parametrize("form", sorted(PATCH_FORMS))
def test_patch_paths_are_the_ones_git_apply_reads(tmp_path, form):
    patch, paths = PATCH_FORMS[form]
    repo = make_git_repo(tmp_path / "r")
    assert B.changeset_patch_paths(str(repo), patch) == paths
    assert git(repo, "status", "--porcelain") == ""  # nothing applied


@pytest.mark.parametrize("patch,words", [
    ("hello world\n", "No valid patches"),
    ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n", "corrupt patch"),
    ('--- "a/\\377x"\n+++ "b/\\377x"\n@@ -0,0 +1 @@\n+hi\n', "UTF-8 text"),
    ('--- "a/x\\ny"\n+++ "b/x\\ny"\n@@ -0,0 +1 @@\n+hi\n', "control characters"),
    ("diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n"
     "+../changes\n\\ No newline at end of file\n", "symlink"),
])
def test_patches_git_cannot_read_are_refused(tmp_path, patch, words):
    repo = make_git_repo(tmp_path / "r")
    with pytest.raises(B.BridgeError) as err:
        B.changeset_patch_paths(str(repo), patch)
    assert words in err.value.message


def plant(env, subject, tasks):
    """A change set written by hand, as a planning agent can (skipping `changes new`'s
    checks): a real id and base, and the given tasks with a matching plan_sha256."""
    cs_id = env.new(subject, [task("t1", NOTES_PATCH)])
    doc = dict(plan(tasks), change_set_id=cs_id)
    (env.dir(cs_id) / "02-implementation-plan.json").write_bytes(B.canonical_json(doc))
    meta = json.loads((env.dir(cs_id) / "00-meta.json").read_bytes())
    meta["plan_sha256"] = B.canonical_sha256(doc)
    (env.dir(cs_id) / "00-meta.json").write_bytes(B.canonical_json(meta))
    return cs_id


NONASCII = "@@ -\u0669 +\u0669 @@\n"  # \d matches U+0669; git's hunk-header parser does not
RENAME_GEN = ("diff --git a/src/gen.py b/src/gen2.py\nsimilarity index 100%\n"
              "rename from src/gen.py\nrename to src/gen2.py\n")


@pytest.mark.parametrize("form,patch", [
    ("non-ASCII digits", NONASCII + AUTH_PATCH),
    ("C-quoted name", AUTH_PATCH.replace("a/src/auth.py", '"a/src/\\141uth.py"').replace(
        "b/src/auth.py", '"b/src/\\141uth.py"')),
])
def test_critical_feature_is_seen_through_every_patch_form(tmp_path, form, patch):
    # Reading only ---/+++ lines its own way, bridge.py saw no path (or a different one) and
    # ran this patch of the critical auth_core as `completed (auto)`.
    env = Env(tmp_path, critical_features=["auth_core"])
    cs_id = env.new("Change login", [task("t1", patch)])
    res = env.run()
    assert res.returncode == 0, res.stderr
    status = env.status(cs_id)
    assert status["state"] == "pending_review", status["reason"]
    assert "critical feature(s) auth_core" in status["reason"]
    assert status["validation"]["changed_paths"] == ["src/auth.py"]
    assert "return 1" in (env.repo / "src" / "auth.py").read_text()
    assert "`src/auth.py`" in (env.dir(cs_id) / "03-task-list.md").read_text()  # the reviewer


@pytest.mark.parametrize("form,patch", [
    ("non-ASCII digits", NONASCII + GEN_PATCH), ("rename only", RENAME_GEN),
])
def test_tier3_is_seen_through_every_patch_form(env, form, patch):
    # Tier 3 (a generated file) ran automatically: the paths bridge.py sent to gov.preflight
    # were empty, and an empty change is Tier 1.
    cs_id = env.new("Edit generated", [task("t1", patch)])
    assert env.run().returncode == 1
    status = env.status(cs_id)
    assert status["state"] == "failed" and status["reason"].startswith("tier3:"), status
    assert "src/gen.py" in status["validation"]["changed_paths"]
    assert (env.repo / "src" / "gen.py").read_text() == "X = 1\n"


FORGED = B.canonical_json({"schema_version": "changeset_status_v1", "state": "completed",
                           "decision": "auto", "reason": "planted"}).decode()
INTO_CHANGES = {
    "non-ASCII digits": NONASCII + "--- /dev/null\n+++ b/changes/victim/05-status.json\n"
                        "@@ -0,0 +1 @@\n+%s\n" % FORGED,
    "rename only": "diff --git a/notes.txt b/changes/victim/05-status.json\nsimilarity index "
                   "100%\nrename from notes.txt\nrename to changes/victim/05-status.json\n",
    "new empty file": "diff --git a/changes/victim/05-status.json b/changes/victim/"
                      "05-status.json\nnew file mode 100644\nindex 0000000..e69de29\n",
    "C-quoted name": '--- /dev/null\n+++ "b/\\143hanges/victim/05-status.json"\n'
                     "@@ -0,0 +1 @@\n+%s\n" % FORGED,
    "upper-case .GIT": "--- /dev/null\n+++ b/.GIT/hooks/pre-commit\n@@ -0,0 +1 @@\n+evil\n",
    "quoted .git": '--- /dev/null\n+++ "b/\\056git/hooks/pre-commit"\n@@ -0,0 +1 @@\n+x\n',
    # U+200C, which HFS+ ignores in names: changes/ on a Mac
    "HFS+-ignored code point": '--- /dev/null\n+++ "b/chan\\342\\200\\214ges/victim/05-status.'
                               'json"\n@@ -0,0 +1 @@\n+x\n',
    "through a symlinked folder": "--- a/linked/guide.md\n+++ b/linked/guide.md\n"
                                  "@@ -1 +1 @@\n-guide\n+better guide\n",
    "through a symlink out of the repository": "--- /dev/null\n+++ b/out/planted.txt\n"
                                               "@@ -0,0 +1 @@\n+x\n",
}


@pytest.mark.parametrize("form", sorted(INTO_CHANGES))
def test_forbidden_paths_are_refused_in_every_patch_form(tmp_path, form):
    # Each of these ran as `completed (auto)` (or reached git apply) with bridge.py seeing
    # no forbidden path: a planted 05-status.json in changes/, hooks in .git/, writes
    # through symlinks. Refused by `new` (exit 2) and by the executor for a hand-made set.
    env = Env(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink("docs", env.repo / "linked")
    os.symlink(str(outside), env.repo / "out")
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "links")
    patch = INTO_CHANGES[form]
    cs_id = plant(env, "Evil planted", [task("t1", patch)])
    assert env.run().returncode == 1
    status = env.status(cs_id)
    assert status["decision"] == "rejected" and status["reason"].startswith(
        "forbidden_path:"), status["reason"]
    assert not (env.repo / "changes" / "victim").exists()
    assert not (env.repo / ".GIT").exists() and os.listdir(outside) == []
    assert (env.repo / "docs" / "guide.md").read_text() == "guide\n"
    res = env.new("Evil", [task("t1", patch)], ok=False)
    assert res.returncode == 2 and "forbidden_path" in res.stderr, res.stderr


def test_patches_may_not_change_the_rules(env):
    # A Tier-2 approval of a patch to the executor's config (say, another changes.mcp.command
    # that calls everything Tier 1, or an empty critical_features) would decide every later
    # change set; bridge.py itself likewise.
    cfg = "--- /dev/null\n+++ b/bridge.config.json\n@@ -0,0 +1 @@\n+{}\n"
    res = env.new("Rules", [task("t1", cfg)], ok=False)
    assert res.returncode == 2 and "forbidden_path" in res.stderr
    assert "own code or configuration" in res.stderr
    (env.repo / "conf").mkdir()
    inside = env.repo / "conf" / "Bridge.json"
    inside.write_text(env.cfg_path.read_text())
    patch = "--- /dev/null\n+++ b/conf/bridge.json\n@@ -0,0 +1 @@\n+{}\n"  # the one in use
    (env.tmp / "p.json").write_text(json.dumps(plan([task("t1", patch)])))
    res = run_bridge("changes", "new", "--subject", "Rules", "--plan", env.tmp / "p.json",
                     "--root", env.repo, "--config", inside)
    assert res.returncode == 2 and "own code or configuration" in res.stderr, res.stderr
    # bridge.py as users install it: scripts/bridge.py in the repository
    (env.repo / "scripts").mkdir()
    installed = env.repo / "scripts" / "bridge.py"
    installed.write_bytes(BRIDGE.read_bytes())
    patch = "--- /dev/null\n+++ b/scripts/bridge.py\n@@ -0,0 +1 @@\n+x\n"
    (env.tmp / "p.json").write_text(json.dumps(plan([task("t1", patch)])))
    res = subprocess.run([PYTHON, str(installed), "changes", "new", "--subject", "Rules",
                          "--plan", str(env.tmp / "p.json"), "--root", str(env.repo),
                          "--config", str(env.cfg_path)], env=clean_env(), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and "own code or configuration" in res.stderr, res.stderr


@pytest.mark.parametrize("params,words", [
    ({"strip": -1}, "strip must be an integer from 0 to 32"),
    ({"strip": 33}, "strip must be an integer from 0 to 32"),
    ({"strip": True}, "strip must be an integer"),
])
def test_strip_is_validated(env, params, words):
    # strip -1 made bridge.py judge only the last name component ("05-status.json")
    evil = "--- a/changes/x/05-status.json\n+++ b/changes/x/05-status.json\n@@ -1 +1 @@\n-a\n+b\n"
    res = env.new("Strip", [task("t1", evil, **params)], ok=False)
    assert res.returncode == 2 and words in res.stderr, res.stderr


@pytest.mark.parametrize("tool", ["snapshot.export", "snapshot.", "snapshot.anything"])
def test_tools_are_matched_exactly(env, tool):
    res = env.new("Export", [task("t1", tool=tool, destination="/tmp/x")], ok=False)
    assert res.returncode == 2 and "forbidden_tool" in res.stderr, res.stderr


def test_mcp_header_lines_are_bounded(tmp_path):
    env = Env(tmp_path)
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    env.configure(["--long-header"], mcp={"timeout_sec": 5})
    t0 = time.time()
    assert env.run().returncode == 1
    status = env.status(cs_id)
    assert "a header line exceeds 1024 bytes" in status["reason"], status["reason"]
    assert time.time() - t0 < 5  # not waited out: the endless header line is an error


def test_validate_redacts_the_servers_last_words_with_the_configs_secrets(tmp_path):
    # A server gone is told with the config's redaction, as the status file is: a secret
    # changes.mcp.env hands the server, printed back on its stderr, reached the terminal of
    # `changes validate` as it was (the client redacted with the default patterns only).
    env = Env(tmp_path)
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    env.configure(["--crash-on", "gov.preflight"], mcp={
        "env": {"AXIOMREGENT_LICENSE_KEY": "correct-horse-battery-staple"}})
    res = env.cli("validate", cs_id)
    assert res.returncode == 1 and "exited during gov.preflight" in res.stdout, res.stdout
    assert "licensed to [REDACTED]" in res.stdout, res.stdout
    assert "correct-horse-battery-staple" not in res.stdout + res.stderr


def test_a_request_has_one_deadline_for_its_write_and_its_answer(tmp_path):
    # A server busy (not reading) for most of the timeout and then silent failed a request
    # only after the write's wait plus a whole second timeout for the answer.
    client = B.McpClient([PYTHON, str(FIXTURES / "mcp_server.py")], tmp_path, framing="line",
                         timeout=2.0)
    with client:
        client.start()
        assert client.call_tool("busy", {"sec": 1.5}) == "busy"  # then it reads nothing for 1.5 s
        started = time.monotonic()
        with pytest.raises(B.McpServerGone) as gone:  # larger than a pipe: the write waits
            client.request("ignore", {"pad": "x" * (1 << 20)})
        took = time.monotonic() - started
    assert "did not answer ignore within 2 s" in gone.value.message
    assert took < 2.8, took


def test_mcp_stderr_lines_are_bounded(tmp_path):
    env = Env(tmp_path, server_args=["--crash-on", "gov.preflight", "--stderr-flood"])
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    assert env.run().returncode == 1
    status = env.status(cs_id)
    assert "crashing on purpose" in status["reason"] and "exit code 3" in status["reason"]
    assert len(status["reason"]) < 2000
    assert (env.dir(cs_id) / "05-status.json").stat().st_size < 10000


def test_preflight_warnings_ask_for_review_and_odd_values_are_kept(tmp_path):
    env = Env(tmp_path, server_args=["--warn"])
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    assert env.run().returncode == 0
    status = env.status(cs_id)  # still canonical although the server sent a float
    assert status["state"] == "pending_review"
    assert "gov.preflight warnings: INVALID_HEADER_FORMAT notes.txt" in status["reason"]
    assert status["validation"]["preflight_violations"][0]["confidence"] == "0.5"


def test_loop_mode_picks_up_new_change_sets_and_stops_cleanly(env):
    proc = subprocess.Popen([PYTHON, str(BRIDGE), "changes", "run", "--poll", "0.2", "--root",
                             str(env.repo), "--config", str(env.cfg_path)], env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lock = env.repo / "changes" / ".locks" / "worktree.lock"
        deadline = time.time() + 20
        while time.time() < deadline and not (lock.exists() and lock.read_text().strip()):
            time.sleep(0.05)
        # the running executor excluded changes/ already, so this base stays valid
        cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
        status = env.dir(cs_id) / "05-status.json"
        while time.time() < deadline and not (status.exists()
                                               and b'"completed"' in status.read_bytes()):
            time.sleep(0.1)
        assert env.status(cs_id)["state"] == "completed"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "%s completed" % cs_id in out
    assert json.loads(env.cli("status", "--json").stdout)["executor"]["lock"] == "free"


def test_validate_offline_and_against_the_server(env):
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    offline = env.tmp / "offline.json"
    offline.write_text("{}")
    res = run_bridge("changes", "validate", cs_id, "--root", env.repo, "--config", offline)
    assert res.returncode == 0 and "offline checks passed" in res.stdout
    (env.repo / "notes.txt").write_text("moved on\n")
    res = env.cli("validate", cs_id)
    assert res.returncode == 1 and "stale_base" in res.stdout
    # every problem the server finds is printed, not just the first
    os.remove(env.repo / "spec" / "docs.md")
    res = env.cli("validate", cs_id)
    assert res.returncode == 1
    assert [line.split(": ")[1] for line in res.stdout.splitlines()] == [
        "stale_base", "gov_drift"], res.stdout
    assert env.run().returncode == 1
    status = env.status(cs_id)
    assert status["reason"].startswith("stale_base:") and status["reason"].endswith(
        "(+ gov_drift)")
    assert len(status["validation"]["problems"]) == 2
    assert env.cli("validate", "no-such--000000000000").returncode == 2


def test_unreadable_status_is_reported_not_overwritten(env):
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    (env.dir(cs_id) / "05-status.json").write_text('{"state": "completed"')
    res = env.run()
    assert res.returncode == 0 and "skipped" in res.stderr
    assert (env.dir(cs_id) / "05-status.json").read_text() == '{"state": "completed"'
    assert "unknown" in env.cli("status").stdout
    assert (env.repo / "notes.txt").read_text() == "hello\n"


def test_a_status_that_trips_a_bug_fails_alone(env):
    # A planted status of an odd shape crashed the executor on every pass, so no other
    # change set was ever processed.
    bad = env.new("Odd status", [task("t1", GUIDE_PATCH)])
    (env.dir(bad) / "05-status.json").write_bytes(B.canonical_json({
        "schema_version": "changeset_status_v1", "change_set_id": bad, "state": "executing",
        "decision": "auto", "reason": "planted", "execution": "not an object"}))
    good = env.new("Add world", [task("t1", NOTES_PATCH)])
    res = env.run()
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert env.status(bad)["state"] == "failed"
    assert env.status(bad)["reason"].startswith("internal_error: AttributeError")
    assert [r for r in env.log() if r["event"] == "internal_error" and r["traceback"]]
    assert env.status(good)["state"] == "completed"


def test_interrupted_validation_is_validated_again(env):
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    (env.dir(cs_id) / "05-status.json").write_bytes(B.canonical_json({
        "schema_version": "changeset_status_v1", "change_set_id": cs_id,
        "state": "validating", "decision": "auto", "reason": "validating"}))
    assert env.run().returncode == 0
    assert env.status(cs_id)["state"] == "completed"
    text = env.cli("status", cs_id)
    assert "state:         completed" in text.stdout and "completed:     t1" in text.stdout


def test_patches_may_not_touch_changes_git_or_outside(env):
    evil = "--- a/changes/x/05-status.json\n+++ b/changes/x/05-status.json\n@@ -1 +1 @@\n-a\n+b\n"
    res = env.new("Evil", [task("t1", evil)], ok=False)
    assert res.returncode == 2 and "forbidden_path" in res.stderr and "changes/" in res.stderr
    for path in ("../outside.txt", ".git/config"):
        patch = "--- a/%s\n+++ b/%s\n@@ -1 +1 @@\n-a\n+b\n" % (path, path)
        res = env.new("Evil", [task("t1", patch)], ok=False)
        assert res.returncode == 2 and "forbidden_path" in res.stderr


def test_id_command_matches_new(env):
    res = env.cli("id", "--subject", "Add world")
    assert res.returncode == 0
    assert env.new("Add world", [task("t1", NOTES_PATCH)]) == res.stdout.strip()
    assert env.cli("id", "--subject", "Add world", "--worktree").stdout == res.stdout


@pytest.mark.parametrize("line", [False, True])
def test_requests_from_the_server_are_not_taken_for_replies(tmp_path, line):
    env = Env(tmp_path, server_args=["--server-request"] + (["--line"] if line else []),
              framing="line" if line else "content-length")
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    res = env.run()
    assert res.returncode == 0, res.stderr
    assert env.status(cs_id)["state"] == "completed"


# ---- review fixes: redaction, bad argv text, info/exclude, --poll ------------------------

GH_TOKEN = "ghp_" + "A1b2C3d4E5f6" * 3


def test_status_extras_are_redacted(tmp_path):
    env = Env(tmp_path, server_args=["--warn"])
    secret_patch = NOTES_PATCH.replace("notes.txt", "%s.txt" % GH_TOKEN)
    # the server's answer (preflight violations) names the patched path, token and all
    (env.repo / ("%s.txt" % GH_TOKEN)).write_text("hello\n")
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "tokenish file")
    cs_id = env.new("Add world", [task("t1", secret_patch)])
    assert env.run().returncode == 0
    status = env.status(cs_id)
    assert status["state"] == "pending_review" and status["validation"]["preflight_violations"]
    assert "[REDACTED]" in status["validation"]["preflight_violations"][0]["path"]
    # the problems list of an offline rejection (a tampered plan) is redacted too
    cs_id = env.new("Tampered", [task("t1", NOTES_PATCH)])
    plan_path = env.dir(cs_id) / "02-implementation-plan.json"
    doc = json.loads(plan_path.read_text())
    doc["tasks"][0]["params"]["patch"] = NOTES_PATCH.replace("notes.txt", "../%s" % GH_TOKEN)
    plan_path.write_bytes(B.canonical_json(doc))
    env.run()
    status = env.status(cs_id)
    assert status["state"] == "failed" and len(status["problems"]) >= 2
    for f in env.repo.joinpath("changes").rglob("05-status.json"):
        assert GH_TOKEN not in f.read_text(), f
    assert "[REDACTED]" in (env.dir(cs_id) / "05-status.json").read_text()


def test_new_refuses_non_utf8_text_and_leaves_nothing(env):
    plan_path = env.tmp / "plan.json"
    plan_path.write_text(json.dumps(plan([task("t1", NOTES_PATCH)])))
    for flags, name in ((["--subject", "a\udcff"], "--subject"),
                        (["--subject", "ok", "--snapshot", "s\udcff"], "--snapshot")):
        res = env.cli("new", *flags, "--plan", plan_path)
        assert res.returncode == 2 and name in res.stderr and "UTF-8" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    changes = env.repo / "changes"
    assert not changes.exists() or [p.name for p in changes.iterdir()
                                     if not p.name.startswith(".")] == []
    assert not changes.exists() or not [p for p in changes.iterdir()
                                        if p.name.startswith(".new-")]
    assert "no change sets" in env.cli("status").stdout
    assert env.cli("id", "--subject", "a\udcff").returncode == 2


def test_new_failure_midway_leaves_no_half_set(env, monkeypatch):
    sets = B.ChangeSets(str(env.repo), B.load_config(env.repo, env={}))
    plan_path = env.tmp / "plan.json"
    plan_path.write_text(json.dumps(plan([task("t1", NOTES_PATCH)])))

    real_write = B.atomic_write

    def failing_write(path, data, mode=None):  # the plan is written, then the disk fills
        if str(path).endswith("03-task-list.md"):
            raise OSError(28, "No space left on device")
        return real_write(path, data, mode)
    monkeypatch.setattr(B, "atomic_write", failing_write)
    with pytest.raises(OSError):
        B.changeset_new(sets, "Add world", str(plan_path), snapshot="snap1")
    assert sets.ids() == [] and [p.name for p in (env.repo / "changes").iterdir()] == []
    monkeypatch.undo()
    cs_id = B.changeset_new(sets, "Add world", str(plan_path), snapshot="snap1")
    assert sets.ids() == [cs_id]
    assert B.changeset_new(sets, "Add world", str(plan_path), snapshot="snap1") == cs_id
    assert sorted(p.name for p in (env.repo / "changes").iterdir()
                  if p.name.startswith(".new-")) == []


def test_exclude_without_final_newline_and_not_utf8(env):
    exclude = env.repo / ".git" / "info" / "exclude"
    exclude.write_bytes(b"# caf\xe9\n*.log")
    assert env.cli("id", "--subject", "Add world").returncode == 0
    assert exclude.read_bytes() == b"# caf\xe9\n*.log\n/changes/\n"
    assert git(env.repo, "check-ignore", "x.log").strip() == "x.log"  # *.log intact
    env.cli("id", "--subject", "Add world")  # idempotent
    assert exclude.read_bytes().count(b"/changes/") == 1


def test_watch_init_exclude_without_final_newline(tmp_path):
    repo = make_git_repo(tmp_path / "r")
    exclude = repo / ".git" / "info" / "exclude"
    exclude.write_bytes(b"\xff*.log")
    B.handoff_init(str(repo))
    data = exclude.read_bytes()
    assert data.startswith(b"\xff*.log\n#") and data.endswith(b"\n/.ai-handoff/\n")
    assert B.handoff_init(str(repo)) == []
    assert exclude.read_bytes() == data


@pytest.mark.parametrize("poll", ["-1", "0", "nan", "0.01", "7200"])
def test_run_refuses_a_bad_poll(env, poll):
    res = env.cli("run", "--poll", poll, timeout=20)
    assert res.returncode == 2 and "--poll" in res.stderr, res.stderr
    assert not (env.repo / "changes" / ".locks" / "worktree.lock").exists() or \
        not (env.repo / "changes" / ".locks" / "worktree.lock").read_text().strip()


def test_run_refuses_a_bad_poll_sec_in_config(tmp_path):
    env = Env(tmp_path, poll_sec=-1)
    res = env.cli("run", timeout=20)
    assert res.returncode == 2 and "changes.poll_sec" in res.stderr, res.stderr


# ---- files an agent may have planted ------------------------------------------------------

def test_fifo_meta_is_a_problem_not_a_hang(env):
    """A FIFO as 00-meta.json (or 05-status.json) is an error naming it; a plain open() of it
    would wait forever for a writer."""
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    meta = env.dir(cs_id) / "00-meta.json"
    meta.unlink()
    os.mkfifo(meta)
    res = env.cli("validate", cs_id, timeout=20)
    assert res.returncode == 1 and "invalid_meta" in res.stdout
    assert str(meta) in res.stdout and "not a regular file" in res.stdout
    status = env.dir(cs_id) / "05-status.json"
    os.mkfifo(status)
    res = env.cli("status", timeout=20)
    assert res.returncode == 0 and "unknown" in res.stdout
    res = env.run(timeout=20)
    assert "05-status.json" in res.stderr and "not a regular file" in res.stderr
    assert (env.repo / "notes.txt").read_text() == "hello\n"


def test_symlinked_status_to_outside_is_never_read(env):
    """A 05-status.json that is a symlink to a file outside is not read, trusted or written
    through."""
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    outside = env.tmp / "forged-status.json"
    outside.write_bytes(B.canonical_json({
        "schema_version": "changeset_status_v1", "change_set_id": cs_id, "state": "completed",
        "decision": "approved", "reason": "forged"}))
    before = outside.read_bytes()
    (env.dir(cs_id) / "05-status.json").symlink_to(outside)
    res = env.cli("status", "--json", timeout=20)
    assert "forged" not in res.stdout
    res = env.run(timeout=20)
    assert "symlink" in res.stderr and "05-status.json" in res.stderr
    assert outside.read_bytes() == before
    assert (env.repo / "notes.txt").read_text() == "hello\n"


def test_symlinked_change_set_folder_is_never_written_through(env):
    """changes/<id> replaced by a link to a folder outside the repository: the executor
    stops naming it; nothing is written there and nothing is applied."""
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    outside = env.tmp / "outside-set"
    os.rename(env.dir(cs_id), outside)
    env.dir(cs_id).symlink_to(outside)
    before = sorted(p.name for p in outside.iterdir())
    res = env.run(timeout=20)  # reported and skipped, like any change set it cannot read
    assert "%s is a symlink" % env.dir(cs_id) in res.stderr
    res = env.cli("validate", cs_id, timeout=20)
    assert res.returncode != 0 and "%s is a symlink" % env.dir(cs_id) in res.stderr + res.stdout
    assert sorted(p.name for p in outside.iterdir()) == before
    assert (env.repo / "notes.txt").read_text() == "hello\n"


@pytest.mark.parametrize("name", [".log", ".locks"])
def test_symlinked_executor_state_folder_is_never_written_through(env, name):
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    outside = env.tmp / "outside"
    outside.mkdir()
    folder = env.repo / "changes" / name
    if folder.exists():
        import shutil
        shutil.rmtree(folder)
    folder.symlink_to(outside)
    res = env.run(timeout=20)
    assert res.returncode == 2 and "%s is a symlink" % folder in res.stderr, res.stderr
    assert list(outside.iterdir()) == []
    assert (env.repo / "notes.txt").read_text() == "hello\n" and cs_id


def test_text_from_the_server_and_the_agent_reaches_the_terminal_inert(tmp_path):
    # A server error quoting a file, a 05-status.json reason and a folder name written by the
    # planning agent held terminal escapes (set the title, erase the line and print
    # `completed`) and were printed raw by run, validate and status.
    env = Env(tmp_path)
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    env.configure(["--escapes"])
    res = env.run()
    assert res.returncode == 1 and "\\x1b]0;owned\\x07" in res.stderr, res.stderr
    res2 = env.cli("validate", cs_id)
    assert res2.returncode == 1 and "\\x1b[2K\\x0dcompleted" in res2.stdout, res2.stdout
    planted = env.dir(cs_id) / "05-status.json"
    planted.write_bytes(B.canonical_json(dict(env.status(cs_id), reason="x\x1b[2K\rcompleted")))
    (env.repo / "changes" / "odd\x1b[31m").mkdir()
    res3 = env.cli("status")
    res4 = env.cli("status", cs_id)
    for out in (res.stdout + res.stderr, res2.stdout + res2.stderr, res3.stdout + res3.stderr,
                res4.stdout + res4.stderr):
        assert "\x1b" not in out and "\r" not in out and "\x07" not in out, repr(out)
    assert "x\\x1b[2K\\x0dcompleted" in res3.stdout and "odd\\x1b[31m" in res3.stdout
    assert "x\\x1b[2K\\x0dcompleted" in res4.stdout


def test_approve_shows_what_it_signs_not_what_the_agent_says(tmp_path):
    # Between validation and approve the agent swapped the plan (a patch of notes.txt too),
    # fixed plan_sha256, validated_against and kept the old 03-task-list.md: approve signed
    # the new plan and printed only "ID approved". It must show what it signs, from the plan.
    env = Env(tmp_path)
    cs_id = env.new("Change login", [task("t1", AUTH_PATCH)])
    env.run()
    assert env.status(cs_id)["state"] == "pending_review"
    doc = json.loads((env.dir(cs_id) / "02-implementation-plan.json").read_bytes())
    doc["tasks"][0]["params"]["patch"] = AUTH_PATCH + NOTES_PATCH
    (env.dir(cs_id) / "02-implementation-plan.json").write_bytes(B.canonical_json(doc))
    meta = json.loads((env.dir(cs_id) / "00-meta.json").read_bytes())
    meta["plan_sha256"] = B.canonical_sha256(doc)
    (env.dir(cs_id) / "00-meta.json").write_bytes(B.canonical_json(meta))
    status = env.status(cs_id)
    status["validated_against"]["plan_sha256"] = meta["plan_sha256"]
    (env.dir(cs_id) / "05-status.json").write_bytes(B.canonical_json(status))
    res = env.cli("approve", cs_id)
    assert res.returncode == 0, res.stderr
    assert "plan sha256 %s; its patches write: notes.txt, src/auth.py" % meta["plan_sha256"] \
        in res.stdout, res.stdout


def test_approve_prints_the_file_names_it_signs_inert(tmp_path):
    # A file name in the plan's patch is the agent's: one holding a C1 control (U+009B, a
    # terminal's CSI: "2K" erases the line) was printed raw by approve, on the line that tells
    # the human what the patches write. (C0 controls are refused in names already.)
    env = Env(tmp_path)
    hidden = '--- /dev/null\n+++ "b/x\\302\\2332Ky.txt"\n@@ -0,0 +1 @@\n+hi\n'
    cs_id = env.new("Change login", [task("t1", AUTH_PATCH + hidden)])
    env.run()
    assert env.status(cs_id)["state"] == "pending_review", env.status(cs_id)
    res = env.cli("approve", cs_id)
    assert res.returncode == 0, res.stderr
    assert "\x9b" not in res.stdout and "its patches write: src/auth.py, x\\x9b2Ky.txt" in res.stdout, \
        res.stdout


def test_a_fingerprint_with_a_float_is_a_clear_server_error(tmp_path):
    # `new` exited 2 (usage) with "$.mtime: number ... is not an integer": no word of the
    # server, snapshot.info or what to do.
    env = Env(tmp_path, server_args=["--float-fingerprint"])
    res = env.new("Add world", [task("t1", NOTES_PATCH)], ok=False)
    assert res.returncode == 1, res.stderr
    assert "snapshot.info returned a fingerprint that canonical JSON cannot hold" in res.stderr
    assert "$.mtime" in res.stderr and "--snapshot ID" in res.stderr


def test_a_symlinked_changes_folder_is_never_written_through(env):
    # changes/ itself replaced by a link to a folder outside: the executor read the change set
    # there, wrote its 05-status.json, the decision log and the locks through the link.
    import shutil
    cs_id = env.new("Add world", [task("t1", NOTES_PATCH)])
    outside = env.tmp / "outside"
    shutil.copytree(str(env.repo / "changes"), str(outside))
    shutil.rmtree(str(env.repo / "changes"))
    (env.repo / "changes").symlink_to(outside)
    before = sorted(str(p.relative_to(outside)) for p in outside.rglob("*"))
    res = env.run(timeout=20)
    assert res.returncode == 2 and "%s is a symlink" % (env.repo / "changes") in res.stderr, \
        res.stderr
    assert sorted(str(p.relative_to(outside)) for p in outside.rglob("*")) == before
    assert (env.repo / "notes.txt").read_text() == "hello\n" and cs_id
    res = env.cli("status")
    assert "is a symlink" in res.stdout + res.stderr
    assert sorted(str(p.relative_to(outside)) for p in outside.rglob("*")) == before


def test_readme_workflow_works_when_followed_literally(tmp_path):
    # The workflow said `--plan plan.json` and showed no plan: a new user could not follow it.
    # Its config (auth_core critical), its example plan and its commands, in order, from the
    # repository root with the config and plan.json in it.
    import re
    import shlex
    readme = (BRIDGE.parent / "README.md").read_text()
    section = readme[readme.index("## changes: deterministic change sets"):]
    example = section.split("<!-- changes plan example -->\n```json\n", 1)[1].split("```")[0]
    config = json.loads(re.search(r"#   (\{\"changes\".*\})\n", section).group(1))
    commands = re.findall(r"^python3 scripts/bridge.py (changes .*?)(?:  +#.*)?$",
                          section.split("### Workflow", 1)[1].split("```sh\n", 1)[1].split("```")[0]
                          .replace("\\\n", ""),
                          re.M)
    env = Env(tmp_path)
    config["changes"]["mcp"]["command"] = [PYTHON, SERVER]
    (env.repo / "bridge.config.json").write_text(json.dumps(config))
    (env.repo / "plan.json").write_text(example)
    (env.repo / "notes.md").write_text("why\n")
    shell_env = clean_env(XDG_CONFIG_HOME=tmp_path / "xdg")
    cs_id = None
    assert len(commands) == 6, commands
    for command in commands:
        args = [cs_id if a == "fix-login-redirect--3f9c0a1b2c4d" else a
                for a in shlex.split(command)]
        res = run_bridge(*args, cwd=env.repo, env=shell_env)
        assert res.returncode == 0, (command, res.stdout, res.stderr)
        if args[1] == "new":
            cs_id = res.stdout.strip()
    status = json.loads((env.repo / "changes" / cs_id / "05-status.json").read_bytes())
    assert status["state"] == "completed" and status["decision"] == "approved", status
    assert "return 2" in (env.repo / "src" / "auth.py").read_text()


@pytest.mark.parametrize("field,value", [("validated_against", "x"), ("execution", [1]),
                                         ("validated_against", {"base_state": 1})])
def test_odd_shapes_in_a_planted_status_are_errors_not_crashes(env, field, value):
    # approve and status took 05-status.json's fields for objects: a string or list there
    # (the agent writes that file too) ended in "internal error: AttributeError".
    cs_id = env.new("Change login", [task("t1", AUTH_PATCH)])
    env.run()
    status = dict(env.status(cs_id), **{field: value})
    (env.dir(cs_id) / "05-status.json").write_bytes(B.canonical_json(status))
    for args in (("status", cs_id), ("approve", cs_id)):
        res = env.cli(*args)
        assert "internal error" not in res.stderr, (args, res.stderr)
        assert res.returncode in (0, 1), (args, res.stderr)
    assert "return 1" in (env.repo / "src" / "auth.py").read_text()


def test_a_root_below_the_top_of_its_git_repository_is_refused(tmp_path):
    # git applies a patch from a subdirectory relative to the repository's top level (and
    # `git apply --numstat` names the files that way: proj/changes/x for changes/x), so
    # bridge.py judged paths one folder off: a patch into the change sets passed `new`.
    env = Env(tmp_path)
    os.rename(str(env.repo / ".git"), str(tmp_path / ".git"))
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "the repository is one level up")
    patch = "--- /dev/null\n+++ b/changes/victim/05-status.json\n@@ -0,0 +1 @@\n+%s\n" % FORGED
    for args in (("new", "--subject", "Evil"), ("run", "--once"), ("status",)):
        if args[0] == "new":
            (tmp_path / "p.json").write_text(json.dumps(plan([task("t1", patch)])))
            args += ("--plan", str(tmp_path / "p.json"))
        res = env.cli(*args)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert "not the top of its git repository %s" % tmp_path in res.stderr, res.stderr
    assert not (env.repo / "changes").exists()


def test_a_server_that_stops_reading_is_gone_not_a_hang(tmp_path):
    # A server stuck without reading its input (alive): a request larger than the pipe's
    # buffer (gov.preflight with the paths of a 3,000-file patch) blocked the executor's
    # write forever, lock held, no timeout, no status.
    env = Env(tmp_path, mcp={"timeout_sec": 3})
    patch = "".join("--- /dev/null\n+++ b/new/%s.txt\n@@ -0,0 +1 @@\n+x\n" % ("f%04d" % i * 8)
                    for i in range(3000))
    cs_id = env.new("Many files", [task("t1", patch)])
    env.configure(["--deaf-after", "snapshot.info"], mcp={"timeout_sec": 3})
    res = env.run(timeout=40)
    assert res.returncode == 1, res.stderr
    status = env.status(cs_id)
    assert status["state"] == "failed" and status["reason"].startswith("mcp_server_gone:")
    assert "did not read its input within 3 s" in status["reason"], status["reason"]
    assert not (env.repo / "new").exists()


def test_readme_changes_quick_start_runs_as_written(tmp_path):
    """The README's changes quick start, run with sh from the clone: a throwaway repository, the
    axiomregent stand-in, one Tier-1 patch validated, applied and reported completed."""
    out = subprocess.run(["sh", "-ec", readme_quickstart("quickstart changes")], cwd=BRIDGE.parent,
                         env=clean_env(TMPDIR=tmp_path, XDG_CONFIG_HOME=tmp_path / "xdg"),
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    cs_id = out.stdout.splitlines()[0]
    assert cs_id.startswith("say-world--") and "%s completed\n" % cs_id in out.stdout, out.stdout
    assert out.stdout.endswith("hello\nworld\n"), out.stdout
    (repo,) = [p for p in tmp_path.iterdir() if (p / ".git").is_dir()]
    status = json.loads((repo / "changes" / cs_id / "05-status.json").read_bytes())
    assert (status["state"], status["decision"]) == ("completed", "auto"), status
