"""The egress policy and request parsing: what the proxy allows, and what it refuses to even parse."""

from __future__ import annotations

import ipaddress

import pytest

from llm_sandbox_mcp.config import Settings, load_settings
from llm_sandbox_mcp.egress.policy import EgressPolicy, Refusal, public
from llm_sandbox_mcp.egress.registries import configured_rules, gosumdb_rules, url_rules
from llm_sandbox_mcp.egress.request import MAX_HEAD, BadRequest, parse_head
from llm_sandbox_mcp.egress.upstream import bypassed
from llm_sandbox_mcp.errors import ConfigError
from llm_sandbox_mcp.host_rules import HostRule, normalize_host
from llm_sandbox_mcp.run.libraries import egress_report

LOOPBACK = ipaddress.ip_address("127.0.0.1")
PUBLIC = ipaddress.ip_address("8.8.8.8")


def policy(*entries: str, explicit: bool = True) -> EgressPolicy:
    return EgressPolicy.of([HostRule.parse(entry, explicit=explicit) for entry in entries], "SETTING")


@pytest.mark.parametrize(
    ("entry", "host", "port", "allowed"),
    [
        ("api.example.org", "api.example.org", 443, True),
        ("api.example.org", "api.example.org", 80, True),
        ("api.example.org", "api.example.org", 22, False),
        ("api.example.org", "other.example.org", 443, False),
        ("api.example.org:8443", "api.example.org", 8443, True),
        ("api.example.org:8443", "api.example.org", 443, False),
        ("*.example.org", "cdn.example.org", 443, True),
        ("*.example.org", "a.b.example.org", 443, True),
        ("*.example.org", "example.org", 443, False),
        ("*.example.org", "evilexample.org", 443, False),
        ("API.Example.ORG.", "api.example.org", 443, True),
        ("127.0.0.1:8080", "127.0.0.1", 8080, True),
        ("[::1]:8080", "::1", 8080, True),
    ],
)
def test_rules_match_names_and_ports(entry: str, host: str, port: int, allowed: bool) -> None:
    assert isinstance(policy(entry).match(host, port), HostRule) is allowed


@pytest.mark.parametrize("entry", ["", "*.", "exa mple.org", "a..b", "*.127.0.0.1", "host:99999", "-bad-.org", "x/y"])
def test_malformed_rules_are_refused(entry: str) -> None:
    with pytest.raises(ValueError, match="not a host name"):
        HostRule.parse(entry, explicit=True)


def test_wildcards_are_never_explicit() -> None:
    assert HostRule.parse("*.example.org", explicit=True).explicit is False


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0", "224.0.0.1",
     "::1", "fe80::1", "fc00::1", "::", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "ff02::1",
     # IPv6 forms that lead to a private IPv4 address, and deprecated or local-only prefixes
     "64:ff9b::a9fe:a9fe", "64:ff9b::a00:1", "64:ff9b:1::808:808", "2002:a00:1::1", "2002:7f00:1::",
     "2001:0:4136:e378:8000:63bf:f5ff:fffe", "::a00:1", "::7f00:1", "fec0::1"],
)  # fmt: skip
def test_non_public_addresses(address: str) -> None:
    assert not public(ipaddress.ip_address(address))


def test_public_addresses() -> None:
    assert public(PUBLIC) and public(ipaddress.ip_address("2606:4700::1111"))
    # The same forms leading to a public IPv4 address stay public.
    assert public(ipaddress.ip_address("64:ff9b::808:808")) and public(ipaddress.ip_address("2002:808:808::1"))


def test_explicit_hosts_reach_any_address_others_public_only() -> None:
    explicit = HostRule.parse("mirror.corp", explicit=True)
    implied = HostRule.parse("mirror.corp", explicit=False)
    rules = EgressPolicy.of([explicit], "S")
    assert rules.addresses(explicit, "mirror.corp", 443, [LOOPBACK]) == [LOOPBACK]
    refused = rules.addresses(implied, "mirror.corp", 443, [LOOPBACK])
    assert isinstance(refused, Refusal) and "non-public" in refused.reason
    assert rules.addresses(implied, "mirror.corp", 443, [LOOPBACK, PUBLIC]) == [PUBLIC]
    assert isinstance(rules.addresses(explicit, "mirror.corp", 443, []), Refusal)


def test_ip_literals_need_an_explicit_rule() -> None:
    implied = HostRule.parse("8.8.8.8", explicit=False)
    assert isinstance(EgressPolicy.of([implied], "S").addresses(implied, "8.8.8.8", 443, [PUBLIC]), Refusal)
    assert isinstance(policy("*.example.org").match("169.254.169.254", 80), Refusal)


def test_explicit_rule_wins_over_an_implied_one() -> None:
    rules = EgressPolicy.of([HostRule.parse("h.org", explicit=False), HostRule.parse("h.org", explicit=True)], "S")
    matched = rules.match("h.org", 443)
    assert isinstance(matched, HostRule) and matched.explicit


def test_refusal_names_host_and_setting() -> None:
    refusal = policy("a.org").match("b.org", 443)
    assert isinstance(refusal, Refusal)
    assert refusal.message("SANDBOX_INSTALL_ALLOW_HOSTS") == (
        "b.org:443 was refused (a host not on this sandbox's allowlist); SANDBOX_INSTALL_ALLOW_HOSTS can allow it"
    )


def test_registry_urls_become_explicit_rules_with_their_ports() -> None:
    rules = configured_rules(
        {"PIP_INDEX_URL": "http://mirror.corp:8080/simple", "GOPROXY": "https://a.corp,https://b.corp|direct"},
        ["files.corp", "*.cdn.corp"],
    )
    assert [rule.display() for rule in rules] == [
        "mirror.corp:8080",
        "a.corp:443",
        "b.corp:443",
        "files.corp",
        "*.cdn.corp",
    ]
    assert all(rule.explicit for rule in rules[:4])


def test_gosumdb_forms() -> None:
    assert gosumdb_rules("off") == []
    assert [r.display() for r in gosumdb_rules("sum.corp+abc")] == ["sum.corp:443"]
    assert [r.display() for r in gosumdb_rules("sum.corp+abc https://proxy.corp/sumdb")] == ["proxy.corp:443"]


def test_default_registries_are_read_from_any_text() -> None:
    text = "*** CURRENT SOURCES ***\n\nhttps://gems.example.org/\ndeb http://deb.example.org/debian bookworm main\n"
    rules = url_rules(text, explicit=False)
    assert [rule.display() for rule in rules] == ["gems.example.org:443", "deb.example.org:80"]
    assert not any(rule.explicit for rule in rules)


@pytest.mark.parametrize(
    ("host", "normal"),
    [("A.B.", "a.b"), ("[::1]", "::1"), ("a_b.c", "a_b.c"), ("127.000.0.1", None), ("2130706433", None),
     ("0x7f.1", None), ("127.1", None), ("1.example.org", "1.example.org")],
)  # fmt: skip
def test_hosts_are_normalized(host: str, normal: str | None) -> None:
    assert normalize_host(host) == normal


def test_connect_request() -> None:
    request = parse_head(b"CONNECT Example.ORG:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n")
    assert (request.method, request.host, request.port, request.tunnel) == ("CONNECT", "example.org", 443, True)
    assert parse_head(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n").host == "::1"


def test_plain_http_is_rewritten_to_origin_form_and_closed() -> None:
    request = parse_head(
        b"GET http://example.org:8080/simple/x/?a=1 HTTP/1.1\r\nHost: wrong.example\r\n"
        b"Proxy-Authorization: Basic c2VjcmV0\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n"
    )
    assert (request.host, request.port) == ("example.org", 8080)
    assert request.head == (
        b"GET /simple/x/?a=1 HTTP/1.1\r\nHost: example.org:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )
    assert request.absolute_head.startswith(b"GET http://example.org:8080/simple/x/?a=1 HTTP/1.1\r\n")
    assert b"secret" not in request.head and b"c2VjcmV0" not in request.absolute_head


@pytest.mark.parametrize(
    "head",
    [
        b"\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET https://example.org/ HTTP/1.1\r\n\r\n",
        b"GET http://user@example.org/ HTTP/1.1\r\n\r\n",
        b"CONNECT example.org HTTP/1.1\r\n\r\n",
        b"CONNECT example.org:0 HTTP/1.1\r\n\r\n",
        b"CONNECT example.org:70000 HTTP/1.1\r\n\r\n",
        b"CONNECT exa\xffmple.org:443 HTTP/1.1\r\n\r\n",
        b"CONNECT example.org:443 HTTP/2.0\r\n\r\n",
        b"CONNECT  example.org:443 HTTP/1.1\r\n\r\n",
        b"GET http://example.org/ HTTP/1.1\r\n folded: header\r\n\r\n",
        b"GET http://example.org/ HTTP/1.1\r\nno colon\r\n\r\n",
        b"POST http://example.org/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET http://example.org/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET http://example.org/ HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n",
        b"GET http://example.org/" + b"a" * MAX_HEAD + b" HTTP/1.1\r\n\r\n",
        b"GET http://exa mple.org/ HTTP/1.1\r\n\r\n",
    ],
)
def test_malformed_requests_are_bad_requests(head: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_head(head)


def test_no_proxy_matching() -> None:
    assert bypassed("a.corp", "x.org, .corp")
    assert bypassed("corp", "corp:8080")
    assert bypassed("anything", "*")
    assert not bypassed("evilcorp", ".corp")
    assert not bypassed("a.org", "")


def test_doctor_shows_the_policy_of_each_kind() -> None:
    settings = Settings(
        sandbox_pip_index_url="https://mirror.corp/simple",
        sandbox_install_allow_hosts=["files.corp"],
        sandbox_session_allow_hosts=["api.example.org"],
    )
    lines = egress_report(settings, "egress")
    assert lines[0] == "code sandboxes: network 'none' (SANDBOX_NETWORK_MODE)"
    assert "python installer: through the egress proxy to mirror.corp:443, files.corp" in lines
    assert any(
        line.startswith("cpp installer: through the egress proxy to files.corp, the image's apt") for line in lines
    )
    assert "sessions: network=[hosts] within api.example.org (SANDBOX_SESSION_ALLOW_HOSTS)" in lines
    assert "sessions: network=true refused (SANDBOX_SESSION_NETWORK_MODE unset)" in lines
    opened = egress_report(Settings(sandbox_install_network_mode="host", sandbox_session_network_mode="host"), "egress")
    assert "installers: network 'host' (SANDBOX_INSTALL_NETWORK_MODE), not filtered by the egress proxy" in opened
    assert "sessions: network=true gives network 'host' unfiltered (SANDBOX_SESSION_NETWORK_MODE)" in opened
    assert "sessions: network=[hosts] refused" in egress_report(settings, "bridge")[-2]
    assert any(line.startswith("path to the proxy: a tunnel over the relay's own stream") for line in lines)
    assert not any("socket" in line or "mounted into" in line for line in lines)


def test_bad_allowlist_entries_are_configuration_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_SESSION_ALLOW_HOSTS", "api.example.org, not a host")
    with pytest.raises(ConfigError, match="SANDBOX_SESSION_ALLOW_HOSTS: not a host name"):
        load_settings()
