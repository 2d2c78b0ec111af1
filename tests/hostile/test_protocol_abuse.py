"""Protocol abuse over the real process boundary, on every engine: a client (or whatever sits on the server's
stdin) sends malformed JSON-RPC, bytes that are not UTF-8, nesting deep enough to break a recursive parser,
one enormous line and arguments far over every limit. The server answers each request it can identify with
an error, never writes anything but protocol to stdout, never shows a traceback, and then runs code."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import IO, cast

import pytest

from llm_sandbox_mcp.config import Settings, env_name
from tests.e2e.test_stdio import ENV, SCRIPT
from tests.engines.conftest import engine_settings, require_now

_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}
_PRINT_ONE = {"name": "execute_code", "arguments": {"code": "print(1)"}}


def _call(request_id: int, params: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode()


# One message a line. Those that are not JSON-RPC requests at all (ids 10, 13 and the rest without a number
# below) have no id the SDK can answer: it drops them, as the protocol allows for a message it cannot parse.
ABUSE = [
    b"this is not json",
    b"\xff\xfe\x00\xc3(not utf-8 at all\x80",
    b"[" * 200_000 + b"]" * 200_000,
    b'{"jsonrpc": "2.0", "id": 10, "method": "tools/list", "params": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    b'{"jsonrpc": "2.0", "id": 11, "method": "ping", "params": {"pad": "' + b"A" * (16 << 20) + b'"}}',
    json.dumps(_INITIALIZE).encode(),
    b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
    b'{"jsonrpc": "2.0", "id": 12, "method": "no/such/method"}',
    _call(13, 5),
    _call(14, {"name": "execute_code", "arguments": {"code": "x" * (2 << 20)}}),
    _call(15, {"name": "execute_code", "arguments": {"code": "1", "libraries": ["a" * 300] * 10_000}}),
    _call(16, {"name": "execute_code", "arguments": {"code": "1", "timeout": 1e308}}),
    _call(17, {"name": "execute_code", "arguments": {"code": "1", "language": "python\u0000; rm -rf /"}}),
    _call(18, {"name": "upload_file", "arguments": {"session_id": "s-" + "0" * 60, "path": "x", "content": "y"}}),
    _call(19, {"name": "no_such_tool", "arguments": {}}),
    b'{"jsonrpc": "2.0", "id": 1e400, "method": "ping"}',
    b'[{"jsonrpc": "2.0", "id": 20, "method": "ping"}]',
    _call(100, _PRINT_ONE),
]
REFUSED = (12, 14, 15, 16, 17, 18, 19)


def _server_env(engine: str) -> dict[str, str]:
    """The environment a user would give the server to run on `engine`, as the engine tier configures it."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **ENV}
    settings = engine_settings(engine)
    for name in ("backend", "kubeconfig", "sandbox_k8s_seccomp_profile"):
        value = getattr(settings, name)
        if value is not None and value != Settings.model_fields[name].default:
            env[env_name(name)] = str(value)
    return env


def _drain(stream: IO[bytes], into: bytearray) -> None:
    while chunk := stream.read(65536):
        into += chunk


def _send(stream: IO[bytes], data: bytes) -> None:
    stream.write(data)
    stream.flush()


def _refused(reply: dict[str, object]) -> bool:
    """A JSON-RPC error, or a tool result with isError: either way the request was refused, not served."""
    result = reply.get("result")
    return "error" in reply or (isinstance(result, dict) and cast(dict[str, object], result).get("isError") is True)


def test_malformed_and_oversized_messages_are_refused_and_the_server_runs_code(
    request: pytest.FixtureRequest, engine: str
) -> None:
    require_now(request, engine)
    server = subprocess.Popen(
        [SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_server_env(engine),
        cwd=Path.home(),
    )
    assert server.stdin is not None and server.stdout is not None and server.stderr is not None
    stderr = bytearray()
    reader = threading.Thread(target=_drain, args=(server.stderr, stderr), daemon=True)
    reader.start()
    replies: dict[object, dict[str, object]] = {}
    try:
        writer = threading.Thread(target=_send, args=(server.stdin, b"\n".join(ABUSE) + b"\n"), daemon=True)
        writer.start()
        while 100 not in replies:
            line = server.stdout.readline()  # bounded by the test's timeout
            assert line, f"the server closed stdout before answering: {bytes(stderr[-2000:])!r}"
            parsed: object = json.loads(line)  # only protocol on stdout
            assert isinstance(parsed, dict), line[:200]
            reply = cast(dict[str, object], parsed)
            assert reply.get("jsonrpc") == "2.0", line[:200]
            replies[reply.get("id")] = reply
        writer.join(timeout=30)
        assert server.poll() is None
    finally:
        server.stdin.close()
        server.wait(timeout=60)
        reader.join(timeout=10)
        server.stdout.close()
        server.stderr.close()

    assert "result" in replies[1]
    assert "result" in replies[11], "a 16 MiB message is still a message"
    for request_id in REFUSED:
        assert _refused(replies[request_id]), (request_id, str(replies[request_id])[:300])
    served = json.loads(json.dumps(replies[100]["result"]))["structuredContent"]
    assert (served["exit_code"], served["stdout"]) == (0, "1\n"), served
    assert "Traceback" not in json.dumps(replies) + stderr.decode("utf-8", errors="replace")
