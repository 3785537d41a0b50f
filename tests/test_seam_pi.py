"""The README's Pi extension, run inside the real Pi (seed 001, issue 6), end to end.

Pi (`@mariozechner/pi-coding-agent`) runs in print mode in a temp git repo with `scripts/bridge.py`
and the extension taken verbatim from README.md, against fixtures/fake_llm.py (an OpenAI-compatible
server on a real socket that asks for one `read` tool call, then answers). What Pi's hooks put in
`_bridge/events.jsonl` is checked line by line.

Pi is found through $BRIDGE_PI_BIN (its `pi` executable), else `.pi-test/` (where `.ci/run` installs
the pinned version), else `pi` on PATH; without Pi or node the tests skip and say why.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BRIDGE, FIXTURES, REPO, clean_env, make_git_repo

PI_VERSION = "0.73.1"  # the version the README names; .ci/run installs it
TURN = ["SessionStart", "SubagentStart", "UserPromptSubmit", "PostToolUse", "Stop",
        "UserPromptSubmit", "Stop", "SubagentStop", "Stop"]
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def find_pi():
    """(path of the `pi` executable, None) or (None, why not)."""
    if not shutil.which("node"):
        return None, "node is not installed (Pi runs on node >= 20.6)"
    explicit = os.environ.get("BRIDGE_PI_BIN")
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit, None
        return None, "BRIDGE_PI_BIN=%s is not an executable" % explicit
    local = REPO / ".pi-test" / "node_modules" / ".bin" / "pi"
    if os.access(str(local), os.X_OK):
        return str(local), None
    on_path = shutil.which("pi")
    if on_path:
        return on_path, None
    return None, ("Pi is not installed: `npm install --prefix .pi-test @mariozechner/pi-coding-agent@%s`"
                  " (.ci/run does it), or set BRIDGE_PI_BIN" % PI_VERSION)


PI, WHY_NOT = find_pi()
pytestmark = pytest.mark.skipif(PI is None, reason=str(WHY_NOT))


def readme_extension():
    """The one ```ts block of the README's seam section: the extension users copy."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("<!-- section:seam -->"):readme.index("<!-- end section:seam -->")]
    blocks = re.findall(r"```ts\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the seam section should hold exactly one TypeScript block"
    return blocks[0]


@pytest.fixture
def llm(tmp_path):
    """A running fake model server: (base URL, path of its request log)."""
    log = tmp_path / "llm.jsonl"
    server = subprocess.Popen(
        [sys.executable, str(FIXTURES / "fake_llm.py"), "--log", str(log),
         "--tool-call", "read", json.dumps({"path": "notes.txt"}), "--reply", "All done."],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        yield "http://127.0.0.1:%d/v1" % port, log
    finally:
        server.stdin.close()  # EOF: the server stops
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture
def pi_home(tmp_path, llm):
    """An empty HOME and Pi agent dir whose models.json points at the fake server."""
    base_url, _ = llm
    agent = tmp_path / "pi-agent"
    agent.mkdir()
    (agent / "models.json").write_text(json.dumps({"providers": {"fake": {
        "baseUrl": base_url, "api": "openai-completions", "apiKey": "unused",
        "models": [{"id": "fake-model"}]}}}))
    (tmp_path / "home").mkdir()
    return agent


@pytest.fixture
def project(tmp_path):
    """A git repo with scripts/bridge.py and a file for the model to read."""
    repo = make_git_repo(tmp_path / "repo")
    (repo / "scripts").mkdir()
    shutil.copy(str(BRIDGE), str(repo / "scripts" / "bridge.py"))
    (repo / "notes.txt").write_text("hello from the repo\n")
    (repo / "sub" / "deep").mkdir(parents=True)
    (repo / "sub" / "deep" / "notes.txt").write_text("hello from below\n")
    return repo


def run_pi(agent, cwd, *extra):
    env = {k: v for k, v in clean_env().items() if "proxy" not in k.lower()}
    env.update(HOME=str(agent.parent / "home"), PI_CODING_AGENT_DIR=str(agent), PI_OFFLINE="1",
               PI_TELEMETRY="0", PI_SKIP_VERSION_CHECK="1", NO_PROXY="127.0.0.1,localhost")
    result = subprocess.run([PI, "-p", "--provider", "fake", "--model", "fake-model", *extra,
                             "Read notes.txt"],
                            cwd=str(cwd), env=env, capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert (result.returncode, result.stdout) == (0, "All done.\n"), (pi_version(), result)
    return result


def pi_version():
    result = subprocess.run([PI, "--version"], capture_output=True, text=True, timeout=60)
    return "pi " + (result.stdout + result.stderr).strip()


def events(root):
    return [json.loads(line) for line in (root / "_bridge" / "events.jsonl").read_text().splitlines()]


def assert_turn(recorded, session_id):
    assert [e["event"] for e in recorded] == TURN, (pi_version(), recorded)
    for event in recorded:
        assert event["host"] == "pi" and event["session_id"] == session_id
        assert event["actor_id"] == session_id and (event["agent_id"], event["agent_type"]) == ("", "")
        assert STAMP.match(event["ts"]) and event["timestamp"] == event["ts"]
    assert [e["detail"] for e in recorded] == [
        {"tool": "read" if e["event"] == "PostToolUse" else "", "source": "pi"} for e in recorded]


def test_project_extension_records_a_pi_turn(project, pi_home, llm):
    """`.pi/extensions/bridge.ts` at the root: every lifecycle event, in order, one session."""
    (project / ".pi" / "extensions").mkdir(parents=True)
    (project / ".pi" / "extensions" / "bridge.ts").write_text(readme_extension())
    run_pi(pi_home, project)
    requests = [json.loads(line) for line in llm[1].read_text().splitlines()]
    assert [r["body"]["messages"][-1]["role"] for r in requests] == ["user", "tool"]  # really talked
    sessions = list((pi_home / "sessions").rglob("*.jsonl"))
    assert len(sessions) == 1
    assert_turn(events(project), sessions[0].stem)
    # Pi's payload names no agent and no entity: Pi never writes a session marker
    assert sorted(p.name for p in (project / "_bridge").iterdir()) == ["events.jsonl"]


def test_global_extension_finds_the_root_from_below_and_stays_out_elsewhere(project, pi_home, tmp_path):
    """`~/.pi/agent/extensions/bridge.ts`: records in the enclosing root's `_bridge/` from a
    subdirectory (with Pi's own session id under --no-session), and nothing where there is no
    scripts/bridge.py."""
    (pi_home / "extensions").mkdir()
    (pi_home / "extensions" / "bridge.ts").write_text(readme_extension())
    run_pi(pi_home, project / "sub" / "deep", "--no-session")
    assert not (project / "sub" / "deep" / "_bridge").exists()
    recorded = events(project)
    assert re.match(r"^[0-9a-f]{8}-[0-9a-f]{4}-", recorded[0]["session_id"]), recorded[0]
    assert_turn(recorded, recorded[0]["session_id"])
    elsewhere = make_git_repo(tmp_path / "elsewhere")
    (elsewhere / "notes.txt").write_text("no bridge here\n")
    # a scripts/bridge.py above the repository is not this project's: never run
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "bridge.py").write_text(
        "open(%r, 'w').write('ran')\n" % str(tmp_path / "outer-ran"))
    run_pi(pi_home, elsewhere, "--no-session")
    assert not (elsewhere / "_bridge").exists() and not (tmp_path / "outer-ran").exists()
