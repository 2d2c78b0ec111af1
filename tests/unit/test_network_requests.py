"""Hosts asked for at run time: the decision (ceiling, asking, the operator's fallback), the proxy widened live,
and the refusals one call reports. The proxy is the real one, served on connections handed to it in this
process, with an origin on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp_types import CallToolResult, ElicitRequestParams, ElicitResult, TextContent

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.egress.policy import EgressPolicy, Refusal
from llm_sandbox_mcp.egress.proxy import EgressListener, RefusalWindow, open_listener
from llm_sandbox_mcp.errors import InvalidRequest, SandboxNotFound
from llm_sandbox_mcp.host_rules import HostRule
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.network_requests import (
    KEPT_DECISIONS,
    Answer,
    Ask,
    NetworkAsks,
    NetworkDecision,
    Reply,
    ask_once,
    ceiling_rules,
    decide,
    question_for,
    refusal_lines,
)
from llm_sandbox_mcp.run.sessions import SessionRegistry
from llm_sandbox_mcp.server.app import build_server
from tests.support.fakes import FakeBackend, ok

pytestmark = pytest.mark.anyio

CEILING = ceiling_rules(["api.example.org", "*.example.net", "127.0.0.1:8080"])


def _listener(*entries: str) -> EgressListener:
    rules = [HostRule.parse(entry, explicit=True) for entry in entries]
    return open_listener(EgressPolicy.of(rules, "SANDBOX_SESSION_ALLOW_HOSTS"), "a test session")


class Person:
    """The person behind the client: answers each question with `answer`, and remembers what was asked."""

    def __init__(self, answer: Answer | Exception = "accept") -> None:
        self.answer: Answer | Exception = answer
        self.asked: list[str] = []

    async def __call__(self, message: str) -> Answer:
        self.asked.append(message)
        answer = self.answer
        if isinstance(answer, Exception):
            raise answer
        return answer


async def _decide(
    listener: EgressListener,
    host: str,
    person: Ask | None,
    *,
    reason: str = "to fetch the data",
    asks: NetworkAsks | None = None,
    grant_unasked: bool = False,
    ceiling: list[HostRule] = CEILING,
) -> NetworkDecision:
    """As request_network does it: the question asked (when there is one) through `person`, then the decision."""
    asks = asks if asks is not None else NetworkAsks.empty()
    reply: Reply | None = None
    if person is not None:
        message = question_for("s-1", "python", listener, host, reason, ceiling)
        reply = await ask_once(asks, person, message) if message is not None else "unanswered"
    return decide("s-1", listener, asks, host, reason, ceiling, reply, grant_unasked)


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        ("accept", "granted"),
        ("decline", "declined"),
        ("cancel", "cancelled"),
        (RuntimeError("the client went away"), "unanswered"),
    ],
)
async def test_within_the_ceiling_the_person_decides_and_only_accept_widens_the_proxy(
    answer: Answer | Exception, outcome: str
) -> None:
    listener, person = _listener(), Person(answer)
    decision = await _decide(listener, "api.example.org", person)
    assert decision.outcome == outcome and decision.granted == (outcome == "granted")
    assert len(person.asked) == 1 and "s-1" in person.asked[0] and "api.example.org" in person.asked[0]
    assert "to fetch the data" in person.asked[0]
    allowed = listener.policy.match("api.example.org", 443)
    assert isinstance(allowed, HostRule) == (outcome == "granted")
    assert isinstance(listener.policy.match("other.example.org", 443), Refusal)


@pytest.mark.parametrize("host", ["evil.example.com", "example.org", "127.0.0.1:22", "127.0.0.1"])
async def test_outside_the_ceiling_the_person_is_never_asked(host: str) -> None:
    listener, person = _listener(), Person()
    decision = await _decide(listener, host, person, grant_unasked=True)
    assert decision.outcome == "outside-ceiling" and not decision.granted and person.asked == []
    assert "SANDBOX_SESSION_ALLOW_HOSTS" in decision.message and listener.policy.rules == ()


@pytest.mark.parametrize(("grant_unasked", "outcome"), [(False, "no-elicitation"), (True, "granted-unasked")])
async def test_without_elicitation_the_operators_setting_decides(grant_unasked: bool, outcome: str) -> None:
    listener = _listener()
    decision = await _decide(listener, "a.example.net", None, grant_unasked=grant_unasked)
    assert decision.outcome == outcome
    assert isinstance(listener.policy.match("a.example.net", 443), HostRule) == grant_unasked
    if not grant_unasked:
        assert "SANDBOX_SESSION_GRANT_UNASKED" in decision.message


async def test_a_host_the_session_has_is_answered_at_once() -> None:
    listener, person = _listener("api.example.org"), Person("decline")
    decision = await _decide(listener, "API.example.org.", person)
    assert decision.outcome == "already-allowed" and decision.granted and person.asked == []


@pytest.mark.parametrize(
    "host",
    [
        "user:pass@api.example.org",
        "api.example.org;curl evil",
        "api.example.org/path",
        "http://api.example.org",
        "api.example.org:70000",
        "api.example.org:0",
        "api.example.org\r\nX: 1",
        "a" * 300,
        "",
    ],
)
async def test_a_malformed_host_is_a_clear_error_and_nobody_is_asked(host: str) -> None:
    listener, person, asks = _listener(), Person(), NetworkAsks.empty()
    with pytest.raises(InvalidRequest, match="host") as raised:
        await _decide(listener, host, person, asks=asks)
    assert "\r" not in str(raised.value) and "\n" not in str(raised.value)
    assert person.asked == [] and asks.decisions == [] and listener.policy.rules == ()


async def test_a_hostile_reason_reaches_the_person_and_the_log_escaped_and_cut(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reason = "need it\x1b[2J\r\nERROR forged log line\u202e" + "x" * 100_000
    listener, person, asks = _listener(), Person("decline"), NetworkAsks.empty()
    with caplog.at_level(logging.WARNING, logger="llm_sandbox_mcp.run.network_requests"):
        decision = await _decide(listener, "api.example.org", person, reason=reason, asks=asks)
    shown_reason = person.asked[0].split("(not verified): ", 1)[1].split("\n", 1)[0]
    assert shown_reason.startswith("need it\\x1b[2J\\r\\nERROR forged log line\\u202e")
    assert len(shown_reason) <= 301 and shown_reason.endswith("…")
    for text in [decision.reason, *asks.lines(), *(record.getMessage() for record in caplog.records)]:
        assert not any(char in text for char in "\x1b\r\n\u202e"), text
        assert len(text) < 1000
    assert [record.getMessage().rsplit(": ", 1)[0] for record in caplog.records][-1].endswith("declined (reason")


async def test_one_question_waits_per_session_and_a_flood_is_refused_and_bounded() -> None:
    listener, asks = _listener(), NetworkAsks.empty()
    answered, waiting = anyio.Event(), anyio.Event()
    asked: list[str] = []

    async def slow_person(message: str) -> Answer:
        asked.append(message)
        waiting.set()
        await answered.wait()
        return "accept"

    results: list[NetworkDecision] = []
    flood: list[NetworkDecision] = []

    async def first() -> None:
        results.append(await _decide(listener, "api.example.org", slow_person, reason="r", asks=asks))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(first)
            await waiting.wait()
            flood += [
                await _decide(listener, f"h{i}.example.net", slow_person, reason="r", asks=asks) for i in range(500)
            ]
            answered.set()
    assert {decision.outcome for decision in flood} == {"busy"} and len(asked) == 1
    assert results[0].outcome == "granted"
    lines = asks.lines()
    assert len(lines) == KEPT_DECISIONS + 1 and lines[0] == f"{501 - KEPT_DECISIONS} earlier decisions not kept"
    assert "granted api.example.org" in lines[-1]


async def _origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    await writer.drain()
    writer.close()


@pytest.fixture
async def origin() -> AsyncIterator[int]:
    server = await asyncio.start_server(_origin, "127.0.0.1", 0)
    port: int = server.sockets[0].getsockname()[1]
    async with server:
        yield port


async def _get(listener: EgressListener, target: str) -> bytes:
    answer = b""
    async with await listener.connect() as stream:
        await stream.send(f"GET http://{target}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        with anyio.fail_after(10):
            while True:
                try:
                    answer += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return answer


async def test_a_grant_opens_the_running_proxy_at_once_and_each_call_sees_only_its_refusals(origin: int) -> None:
    listener, ceiling = _listener(), ceiling_rules([f"127.0.0.1:{origin}"])
    try:
        first = listener.watch()
        before = await _get(listener, f"127.0.0.1:{origin}")
        for _ in range(3):
            await _get(listener, "evil.example.com")
        listener.window = None
        await _decide(listener, f"127.0.0.1:{origin}", Person("accept"), ceiling=ceiling)
        second = listener.watch()
        after = await _get(listener, f"127.0.0.1:{origin}")
    finally:
        await listener.aclose()
    assert before.startswith(b"HTTP/1.1 403") and after.startswith(b"HTTP/1.1 200") and after.endswith(b"ok")
    assert refusal_lines(first, ceiling) == [
        f"127.0.0.1:{origin} refused: an IP address not on this sandbox's allowlist; "
        "request_network can ask the person for it",
        "evil.example.com:80 refused: a host not on this sandbox's allowlist; outside SANDBOX_SESSION_ALLOW_HOSTS",
    ]
    assert refusal_lines(second, ceiling) == []


def test_a_calls_refusals_are_deduplicated_and_capped_with_a_count_of_the_rest() -> None:
    window = RefusalWindow(cap=3)
    for i in range(1000):
        window.add(Refusal(f"h{i % 5}.example.com", 443, "a host not on this sandbox's allowlist"))
    lines = refusal_lines(window, CEILING)
    assert len(window.shown) == 3 and len(lines) == 4
    assert lines[:3] == [
        f"h{i}.example.com:443 refused: a host not on this sandbox's allowlist; outside SANDBOX_SESSION_ALLOW_HOSTS"
        for i in range(3)
    ]
    assert lines[3] == "400 more refused connections not listed"


def _server(**settings: Any) -> tuple[Any, FakeBackend]:
    backend = FakeBackend(handler=lambda call: ok())
    backend.install_network = "egress"
    configured = Settings(sandbox_pool_size=0, sandbox_session_allow_hosts=["api.example.org"], **settings)
    return build_server(configured, backend), backend


def _structured(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error and result.structured_content is not None, result.content
    return result.structured_content


def _error(result: CallToolResult) -> str:
    assert result.is_error
    first = result.content[0]
    assert isinstance(first, TextContent)
    return first.text


# Both ways the SDK carries the question: in the call's result (2026-07-28 on), and as a request of the server's.
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_over_mcp_the_person_is_asked_by_elicitation_and_hostile_requests_get_clear_errors(
    mode: Literal["auto", "legacy"],
) -> None:
    server, _ = _server()
    asked: list[ElicitRequestParams] = []

    async def person(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params)
        return ElicitResult(action="accept", content={})

    async with Client(server, elicitation_callback=person, mode=mode) as client:
        session_id = _structured(await client.call_tool("create_session", {"network": []}))["session_id"]

        async def request(**arguments: Any) -> CallToolResult:
            return await client.call_tool("request_network", {"session_id": session_id, "reason": "r", **arguments})

        granted = _structured(await request(host="api.example.org", reason="the API\x1b[2J"))
        again = _structured(await request(host="api.example.org"))
        outside = _structured(await request(host="evil.example.com"))
        bad_host = _error(await request(host="user@api.example.org:99999"))
        huge = await request(host="api.example.org", reason="x" * 100_000)
        unknown = _error(
            await client.call_tool("request_network", {"session_id": "s-0", "host": "api.example.org", "reason": "r"})
        )
        listed = _structured(await client.call_tool("list_sessions", {}))["sessions"][0]
    assert granted["granted"] and granted["decision"] == "granted" and granted["allowed_hosts"] == ["api.example.org"]
    assert again["decision"] == "already-allowed" and outside["decision"] == "outside-ceiling"
    assert len(asked) == 1 and session_id in asked[0].message and "the API\\x1b[2J" in asked[0].message
    assert "\x1b" not in asked[0].message
    assert "host name, host:port or *.domain" in bad_host and "s-0" in unknown and "gone" in unknown
    assert huge.is_error and len(asked) == 1
    assert [line.split(" ", 1)[1] for line in listed["network_requests"]] == [
        "granted api.example.org (reason: the API\\x1b[2J)",
        "already-allowed api.example.org (reason: r)",
        "outside-ceiling evil.example.com (reason: r)",
    ]


@pytest.mark.parametrize(("grant_unasked", "granted"), [(False, False), (True, True)])
async def test_over_mcp_a_client_without_elicitation_gets_the_operators_decision(
    grant_unasked: bool, granted: bool
) -> None:
    server, _ = _server(sandbox_session_grant_unasked=grant_unasked)
    async with Client(server) as client:
        session_id = _structured(await client.call_tool("create_session", {"network": []}))["session_id"]
        answer = _structured(
            await client.call_tool(
                "request_network", {"session_id": session_id, "host": "api.example.org", "reason": "r"}
            )
        )
    assert answer["granted"] is granted
    assert answer["decision"] == ("granted-unasked" if granted else "no-elicitation")


async def test_a_session_of_another_owner_is_as_unknown_as_one_that_never_existed() -> None:
    backend = FakeBackend(handler=lambda call: ok())
    backend.install_network = "egress"
    settings = Settings(sandbox_pool_size=0, sandbox_session_allow_hosts=["api.example.org"])
    person = Person()
    async with Executor(settings, backend) as executor:
        registry = SessionRegistry(settings, executor)
        try:
            session = await registry.create("python", [], network=[], owner="alice")
            assert registry.network_question(session.id, "api.example.org", "r", owner="mallory") is None
            with pytest.raises(SandboxNotFound, match="no session with that id"):
                await registry.ask_person(session.id, "a question", person, owner="mallory")
            with pytest.raises(SandboxNotFound, match="no session with that id"):
                await registry.request_network(session.id, "api.example.org", "r", "accept", owner="mallory")
            assert session.egress is not None and session.egress.policy.rules == ()
        finally:
            await registry.aclose()
    assert person.asked == []


async def test_a_session_without_a_proxy_says_how_to_get_one() -> None:
    server, _ = _server()
    async with Client(server) as client:
        session_id = _structured(await client.call_tool("create_session", {}))["session_id"]
        said = _error(
            await client.call_tool(
                "request_network", {"session_id": session_id, "host": "api.example.org", "reason": "r"}
            )
        )
    assert "network=[]" in said


@pytest.mark.parametrize(("allowed", "proxied"), [(["api.example.org"], True), ([], False)])
async def test_network_empty_gives_a_proxy_to_ask_through_only_where_the_operator_lists_hosts(
    allowed: list[str], proxied: bool
) -> None:
    backend = FakeBackend(handler=lambda call: ok())
    backend.install_network = "egress"
    settings = Settings(sandbox_pool_size=0, sandbox_session_allow_hosts=allowed)
    async with Executor(settings, backend) as executor:
        registry = SessionRegistry(settings, executor)
        try:
            session = await registry.create("python", [], network=[])
            described = session.describe()
        finally:
            await registry.aclose()
    assert (session.egress is not None) == proxied
    assert described["network"] == ("egress" if proxied else "none") and described["allowed_hosts"] == []
