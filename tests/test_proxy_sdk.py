"""Interop: the official MCP Python SDK (`mcp`) as a real client of `bridge.py proxy`.

One SDK session over stdio to `bridge.py proxy --watch DIR -- python3 DIR/server.py` (a copy of
fixtures/mcp_server.py): a tool call, a server crash, the next call in the same SDK session answered
by the restarted server, then an edit of the watched copy and a call answered after the reload.
The SDK is never a dependency of bridge.py: tests/tools.sh installs it best effort into .venv, and
without it this test skips, saying why. Every wait is bounded, so a failure cannot hang."""
import asyncio
import json
import shutil
import time

import pytest

from conftest import BRIDGE, FIXTURES, PYTHON

mcp = pytest.importorskip("mcp", reason="the MCP Python SDK (pip install mcp) is not installed; "
                                        "tests/tools.sh installs it best effort into .venv")
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

STEP = 20           # seconds any single SDK request may take
WHOLE = 90          # seconds for the whole session


def starts(log):
    """pids of the fixture server's starts, from its --log file."""
    if not log.exists():
        return []
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return [r["pid"] for r in records if r["event"] == "start"]


async def wait_for(check, what, timeout=STEP):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        await asyncio.sleep(0.05)


def text_of(result):
    assert not result.is_error, result
    return result.content[0].text


def proxied(tmp_path, *server_args, stderr_by_shell=False):
    """(SDK server parameters, server copy, its --log, bridge.py's stderr file): `bridge.py proxy
    --watch` in front of a copy of the fixture server; with stderr_by_shell, bridge.py's stderr is
    appended to that file by a shell (for clients that take no errlog)."""
    folder = tmp_path / "srv"
    folder.mkdir()
    server = folder / "server.py"
    shutil.copy(str(FIXTURES / "mcp_server.py"), str(server))
    log, errlog = tmp_path / "server.jsonl", tmp_path / "stderr.txt"
    (tmp_path / "cfg.json").write_text(json.dumps({"lifecycle": {"cooldown": 20},
                                                   "doctor": {"watch_debounce_ms": 150}}))
    argv = [PYTHON, str(BRIDGE), "proxy", "--config", str(tmp_path / "cfg.json"), "--watch", str(folder),
            "--", PYTHON, str(server), "--log", str(log)] + list(server_args)
    if stderr_by_shell:
        argv = ["sh", "-c", 'exec "$@" 2>>"$0"', str(errlog)] + argv
    params = StdioServerParameters(command=argv[0], args=argv[1:], cwd=str(tmp_path),
                                   env={"BRIDGE_OBS_ENABLED": "false", "XDG_CONFIG_HOME": str(tmp_path / "config")})
    return params, server, log, errlog


def add_tool(server):
    """Edit the watched server copy the way an editor saves: one more tool, `added`."""
    text = server.read_text()
    start = text.index("EXTRA_TOOLS = ")
    server.write_text(text[:start] + "EXTRA_TOOLS = {'added': {'type': 'object'}}" + text[text.index("\n", start):])


async def session(tmp_path):
    params, server, log, errlog = proxied(tmp_path)
    with open(str(errlog), "w") as err:
        async with stdio_client(params, errlog=err) as (read, write):
            async with mcp.ClientSession(read, write, read_timeout_seconds=STEP) as client:
                info = await client.initialize()
                assert info.server_info.name == "fixture"
                assert text_of(await client.call_tool("echo", {"text": "one"})) == "one"
                first = starts(log)
                assert len(first) == 1

                # the server dies in the middle of a call: the SDK gets a JSON-RPC error, not a hang
                with pytest.raises(MCPError) as crashed:
                    await client.call_tool("crash", {"code": 3})
                error = crashed.value.error
                assert error.code == -32000 and error.data["reason"] == "crashed", error
                assert error.data["exit"] == {"code": 3}, error
                # the same SDK session goes on, answered by a new server process
                assert text_of(await client.call_tool("echo", {"text": "two"})) == "two"
                second = starts(log)
                assert len(second) == 2 and second[1] != first[0]
                assert "doctor:crashed" in errlog.read_text()

                # an edit of the watched server file reloads it; the session still goes on
                await wait_for(lambda: "bridge proxy: info: watch: " in errlog.read_text(), "the watch's first look")
                add_tool(server)
                await wait_for(lambda: "doctor:reloaded" in errlog.read_text(), "doctor:reloaded")
                names = [t.name for t in (await client.list_tools()).tools]
                assert "added" in names and "echo" in names
                assert text_of(await client.call_tool("echo", {"text": "three"})) == "three"
                assert len(starts(log)) == 3
    return errlog.read_text()


def test_sdk_session_survives_a_crash_and_a_reload(tmp_path):
    err = asyncio.run(asyncio.wait_for(session(tmp_path), WHOLE))
    assert "doctor:fatal" not in err


async def modern_session(tmp_path):
    """The SDK as a 2026-07-28 client (no handshake) of a strict 2026-07-28 server through the proxy:
    its subscriptions/listen stream outlives a crash and a reload of the server."""
    params, server, log, errlog = proxied(tmp_path, "--modern", stderr_by_shell=True)

    async def changed(events):
        return type(await asyncio.wait_for(events.__anext__(), STEP)).__name__

    errlog.write_text("")
    async with mcp.Client(params, read_timeout_seconds=STEP) as client:
        assert client.protocol_version == "2026-07-28"
        async with client.listen(tools_list_changed=True) as sub:
            assert sub.honored.tools_list_changed is True
            events = sub.__aiter__()
            await client.call_tool("listchanged", {})
            assert await changed(events) == "ToolsListChanged"
            with pytest.raises(MCPError) as crashed:
                await client.call_tool("crash", {"code": 3})
            assert crashed.value.error.data["reason"] == "crashed"
            # the stream goes on: re-established on the new server, which may list other tools
            assert await changed(events) == "ToolsListChanged"
            assert text_of(await client.call_tool("echo", {"text": "two"})) == "two"
            await client.call_tool("listchanged", {})                # the new server's own
            assert await changed(events) == "ToolsListChanged"
            await wait_for(lambda: "bridge proxy: info: watch: " in errlog.read_text(), "the watch's first look")
            add_tool(server)
            assert await changed(events) == "ToolsListChanged"
            await wait_for(lambda: "doctor:reloaded" in errlog.read_text(), "doctor:reloaded")
            assert "added" in [t.name for t in (await client.list_tools()).tools]
            assert len(starts(log)) == 3
    return errlog.read_text()


def test_sdk_2026_client_keeps_its_subscription_across_a_crash_and_a_reload(tmp_path):
    if not hasattr(mcp, "Client") or not hasattr(mcp.Client, "listen"):
        pytest.skip("this MCP Python SDK has no 2026-07-28 client (mcp.Client.listen); 2.3.0 has")
    err = asyncio.run(asyncio.wait_for(modern_session(tmp_path), WHOLE))
    assert "doctor:fatal" not in err and "doctor:reloaded" in err
