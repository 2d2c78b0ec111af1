"""The functions that put a secret into a request to its bound host, only at its bound place, and take it out
of the answer and of what a session returns."""

from __future__ import annotations

import json

import pytest

from llm_sandbox_mcp.artifacts import Artifact
from llm_sandbox_mcp.egress.authority import Authority
from llm_sandbox_mcp.egress.bound import SecretRoutes
from llm_sandbox_mcp.egress.substitution import (
    BadInnerRequest,
    Binding,
    Scrubber,
    host_matches,
    outgoing_head,
    parse_inner,
    substitute_json,
    wants_json,
)
from llm_sandbox_mcp.host_rules import HostRule
from llm_sandbox_mcp.models import Execution, Live
from llm_sandbox_mcp.run.session_secrets import redact_bytes, redact_execution
from llm_sandbox_mcp.secret_specs import SecretPlace, SecretSpec

HOSTS = (HostRule("api.example.com", frozenset({443})),)
HEADER = Binding(
    SecretSpec("TOKEN", "value", "v", HOSTS, SecretPlace("header", "Authorization", "Bearer {}")), "PH1", "VAL1"
)
QUERY = Binding(SecretSpec("KEY", "value", "v", HOSTS, SecretPlace("query", "api_key")), "PH2", "VAL 2&x")
FIELD = Binding(SecretSpec("FIELD", "value", "v", HOSTS, SecretPlace("json_field", "token")), "PH3", "VAL3")
ALL = [HEADER, QUERY, FIELD]


def _request(target: str, *headers: str) -> bytes:
    return (f"POST {target} HTTP/1.1\r\n" + "".join(f"{h}\r\n" for h in headers) + "\r\n").encode()


def test_a_header_gets_the_value_only_when_it_is_the_bound_header_in_its_format() -> None:
    request = parse_inner(
        _request(
            "/x",
            "Host: api.example.com",
            "authorization: Bearer PH1",
            "X-Other: Bearer PH1",
            "Accept-Encoding: gzip",
            "Connection: keep-alive",
        )
    )
    head = outgoing_head(request, ALL, None).decode()
    assert "authorization: Bearer VAL1\r\n" in head
    assert "X-Other: Bearer PH1\r\n" in head
    # The answer comes uncompressed (a reflected value can be found in it) and the connection ends after it.
    assert "Accept-Encoding: identity\r\n" in head and "gzip" not in head
    assert head.count("Connection") == 1 and head.endswith("Connection: close\r\n\r\n")
    # Not in its format (another scheme, the placeholder inside a longer value): left as it is.
    for value in ("token PH1", "Bearer PH1 PH1", "Bearer PH1x"):
        other = outgoing_head(
            parse_inner(_request("/x", "Host: api.example.com", f"Authorization: {value}")), ALL, None
        )
        assert b"VAL1" not in other and value.encode() in other


def test_a_query_parameter_gets_the_value_only_when_it_is_the_bound_one() -> None:
    request = parse_inner(_request("/x?api_key=PH2&other=PH2&api_key2=PH2&q=api_key%3DPH2", "Host: api.example.com"))
    line = outgoing_head(request, ALL, None).split(b"\r\n")[0]
    assert line == b"POST /x?api_key=VAL%202%26x&other=PH2&api_key2=PH2&q=api_key%3DPH2 HTTP/1.1"


def test_a_json_field_gets_the_value_only_at_the_top_level_field() -> None:
    body = json.dumps({"token": "PH3", "note": "PH3", "nested": {"token": "PH3"}, "list": ["PH3"]}).encode()
    assert json.loads(substitute_json(body, ALL)) == {
        "token": "VAL3",
        "note": "PH3",
        "nested": {"token": "PH3"},
        "list": ["PH3"],
    }
    for untouched in (b'["PH3"]', b"not json", b'{"token": "PH3x"}'):
        assert substitute_json(untouched, ALL) == untouched
    request = parse_inner(
        _request("/x", "Host: api.example.com", "Content-Type: application/json", "Content-Length: 9")
    )
    assert wants_json(request, ALL) and not wants_json(request, [HEADER])
    head = outgoing_head(request, ALL, 42).decode()
    assert "Content-Length: 42\r\n" in head and "Content-Length: 9" not in head


def test_the_host_header_must_name_the_tunnels_host() -> None:
    def matches(host_header: str) -> bool:
        return host_matches(parse_inner(_request("/", f"Host: {host_header}")), "api.example.com", 443)

    assert matches("api.example.com") and matches("API.example.com:443") and matches("api.example.com.")
    assert not matches("evil.example.com") and not matches("api.example.com:8443")
    assert not host_matches(parse_inner(_request("/")), "api.example.com", 443)  # HTTP/1.1 without Host


@pytest.mark.parametrize(
    "head",
    [
        b"GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
        b"GET / HTTP/2\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",
    ],
)
def test_an_inner_request_this_proxy_does_not_serve_is_refused(head: bytes) -> None:
    with pytest.raises(BadInnerRequest):
        parse_inner(head)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_the_scrubber_masks_a_value_split_across_chunks_and_keeps_the_length(size: int) -> None:
    stream = b"HTTP/1.1 200 OK\r\n\r\nyou sent Bearer VAL1 and VAL1VAL1 and VAL 2&x; VAL"
    scrubber = Scrubber(["VAL1", "VAL 2&x"])
    out = b"".join(scrubber.feed(stream[i : i + size]) for i in range(0, len(stream), size)) + scrubber.end()
    assert out == stream.replace(b"VAL1", b"****").replace(b"VAL 2&x", b"*******")
    assert len(out) == len(stream)


def test_what_a_session_returns_is_redacted() -> None:
    routes = SecretRoutes((HEADER, FIELD), Authority())
    execution = Execution(
        exit_code=0,
        stdout="got VAL1\n",
        stderr="and VAL3",
        timed_out=False,
        truncated=False,
        duration_ms=1,
        language="python",
        backend="docker",
        phase="run",
        session_id="s",
        interpreter_lost=False,
        artifacts=[Artifact.of("out.txt", 9, b"VAL1 here"), Artifact.of("clean.txt", 2, b"ok")],
    )
    redacted = redact_execution(execution, routes)
    assert redacted.stdout == "got [secret TOKEN redacted]\n"
    assert redacted.stderr == "and [secret FIELD redacted]"
    assert redacted.artifacts[0].data == b"[secret TOKEN redacted] here"
    assert redacted.artifacts[1].data == b"ok"
    assert redact_bytes(b"VAL1VAL3", routes) == b"[secret TOKEN redacted][secret FIELD redacted]"  # download_file


def test_output_read_while_a_session_runs_is_masked() -> None:
    live = Live()
    live.secrets = (b"VAL1",)
    live.feed("stdout", b"a VA")
    live.feed("stdout", b"L1 b\n")
    live.feed("stderr", b"VAL1")
    assert live.since(0)[:2] == (b"a **** b\n", b"****")
    assert "VAL1" not in live.summary()
