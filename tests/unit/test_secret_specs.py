"""SANDBOX_SECRETS_FILE: what the server refuses at start (naming the secret and the problem, never a value), and
what a session asking for secrets by name is told when it cannot have them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client
from mcp_types import TextContent

from llm_sandbox_mcp.config import Settings, load_settings
from llm_sandbox_mcp.egress.policy import EgressPolicy
from llm_sandbox_mcp.errors import ConfigError, InvalidRequest
from llm_sandbox_mcp.host_rules import HostRule
from llm_sandbox_mcp.run.session_secrets import SessionSecrets, placeholders_env
from llm_sandbox_mcp.secret_specs import SecretPlace, SecretUnavailable, load_secret_specs
from llm_sandbox_mcp.server.app import build_server
from tests.support.fakes import FakeBackend, ok

VALUE = "ghp_s3cr3tVALUEthatMustNeverShow"


def _file(tmp_path: Path, document: object, mode: int = 0o600) -> Path:
    path = tmp_path / "secrets.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    path.chmod(mode)
    return path


def test_a_declaration_is_read_with_its_defaults(tmp_path: Path) -> None:
    specs = load_secret_specs(
        _file(
            tmp_path,
            {
                "GITHUB_TOKEN": {"value_env": "GH_TOKEN", "hosts": ["api.github.com", "uploads.github.com"]},
                "MAPS_KEY": {"value": VALUE, "hosts": ["maps.example.com:8443"], "query": "key"},
                "BODY": {"value_file": "/run/secret", "hosts": ["api.example.com"], "json_field": "api_key"},
                "RAW": {"value": VALUE, "hosts": ["x.example"], "header": "X-Api-Key"},
            },
        )
    )
    github = specs["GITHUB_TOKEN"]
    assert github.place == SecretPlace("header", "Authorization", "Bearer {}")
    # A host without a port is its HTTPS port only; the port given is the only one.
    assert github.bound_to("api.github.com", 443) and not github.bound_to("api.github.com", 80)
    assert not github.bound_to("github.com", 443) and not github.bound_to("evil.api.github.com", 443)
    assert specs["MAPS_KEY"].bound_to("maps.example.com", 8443) and not specs["MAPS_KEY"].bound_to(
        "maps.example.com", 443
    )
    assert specs["MAPS_KEY"].place == SecretPlace("query", "key")
    assert specs["BODY"].place == SecretPlace("json_field", "api_key")
    assert specs["RAW"].place == SecretPlace("header", "X-Api-Key", "{}")
    assert VALUE not in repr(specs)


@pytest.mark.parametrize(
    ("declaration", "problem"),
    [
        ({"hosts": ["a.example"]}, 'exactly one of "value"'),
        ({"value": VALUE, "value_env": "X", "hosts": ["a.example"]}, 'exactly one of "value"'),
        ({"value": VALUE}, '"hosts" must be a non-empty list'),
        ({"value": VALUE, "hosts": ["*.example.com"]}, "no wildcards"),
        ({"value": VALUE, "hosts": ["bad host"]}, "not a host name"),
        ({"value": VALUE, "hosts": ["a.example"], "header": "Host"}, "not a header a secret may go in"),
        ({"value": VALUE, "hosts": ["a.example"], "header": "A", "query": "k"}, "at most one of"),
        ({"value": VALUE, "hosts": ["a.example"], "format": "Bearer"}, "exactly one {}"),
        ({"value": VALUE, "hosts": ["a.example"], "query": "k", "format": "{}"}, "applies to a header only"),
        ({"value": VALUE, "hosts": ["a.example"], "value_from": "x"}, "unknown key 'value_from'"),
        ({"value": VALUE + "\n", "hosts": ["a.example"]}, "not printable ASCII"),
        ({"value_command": "op read x", "hosts": ["a.example"]}, "non-empty list of arguments"),
        ({"value_command": ["op", ""], "hosts": ["a.example"]}, "each argument must be a non-empty string"),
        ({"value_command": ["op"], "value": VALUE, "hosts": ["a.example"]}, 'exactly one of "value"'),
    ],
)
def test_a_malformed_declaration_names_the_secret_and_the_problem_never_the_value(
    tmp_path: Path, declaration: dict[str, object], problem: str
) -> None:
    with pytest.raises(ValueError, match="secret 'TOKEN'") as failure:
        load_secret_specs(_file(tmp_path, {"TOKEN": declaration}))
    assert problem in str(failure.value)
    assert VALUE not in str(failure.value)


def test_the_server_refuses_to_start_with_a_file_others_can_read_or_a_broken_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _file(tmp_path, {"TOKEN": {"value": VALUE, "hosts": ["a.example"]}}, mode=0o644)
    monkeypatch.setenv("SANDBOX_SECRETS_FILE", str(path))
    with pytest.raises(ConfigError, match=r"may be read or written by group or others \(mode 0644\).*chmod 600"):
        load_settings()
    path.chmod(0o600)
    assert load_settings().sandbox_secrets_file == path
    path.write_text('{"TOKEN": {"value": "' + VALUE + '", ')
    with pytest.raises(ConfigError, match="is not JSON") as failure:
        load_settings()
    assert VALUE not in str(failure.value)
    path.write_text(json.dumps({"PATH": {"value": VALUE, "hosts": ["a.example"]}}))
    with pytest.raises(ConfigError, match="secret 'PATH': that name is a variable the server sets"):
        load_settings()


def test_a_value_is_read_when_asked_for_and_its_absence_is_named(tmp_path: Path) -> None:
    value_file = tmp_path / "token"
    specs = load_secret_specs(
        _file(
            tmp_path,
            {
                "FROM_ENV": {"value_env": "LLM_SANDBOX_TEST_SECRET", "hosts": ["a.example"]},
                "FROM_FILE": {"value_file": str(value_file), "hosts": ["a.example"]},
            },
        )
    )
    with pytest.raises(SecretUnavailable, match="FROM_ENV: the variable LLM_SANDBOX_TEST_SECRET is not set"):
        specs["FROM_ENV"].read_value({})
    assert specs["FROM_ENV"].read_value({"LLM_SANDBOX_TEST_SECRET": VALUE}) == VALUE
    with pytest.raises(SecretUnavailable, match=r"FROM_FILE: its file .*token cannot be read"):
        specs["FROM_FILE"].read_value()
    value_file.write_text(VALUE + "\n")
    assert specs["FROM_FILE"].read_value() == VALUE


def test_a_command_s_one_line_is_the_value_and_its_output_never_shows_in_an_error(tmp_path: Path) -> None:
    """A secret manager's client prints the value: run with no shell (a `;` is an argument), with the server's
    environment; a failure names the command and why, never what it printed."""
    script = tmp_path / "manager"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  ok) printf "%s\\n" "$TOKEN_FOR_TEST";;\n'
        '  two) printf "%s\\nsecond\\n" "$TOKEN_FOR_TEST";;\n'
        '  fail) echo "$TOKEN_FOR_TEST" >&2; echo "$TOKEN_FOR_TEST"; exit 3;;\n'
        '  args) printf "%s|%s\\n" "$2" "$#";;\n'
        "esac\n"
    )
    script.chmod(0o700)
    specs = load_secret_specs(
        _file(
            tmp_path,
            {
                name.upper(): {"value_command": [str(script), *arguments], "hosts": ["a.example"]}
                for name, arguments in {
                    "ok": ["ok"],
                    "two": ["two"],
                    "fail": ["fail"],
                    "args": ["args", "a;b $(x)"],
                    "none": [],
                }.items()
            }
            | {"MISSING": {"value_command": [str(tmp_path / "no-such-manager")], "hosts": ["a.example"]}},
        )
    )
    environ = {"TOKEN_FOR_TEST": VALUE, "PATH": "/usr/bin:/bin"}
    assert specs["OK"].read_value(environ) == VALUE
    assert specs["ARGS"].read_value(environ) == "a;b $(x)|2"
    for name, problem in [
        ("TWO", "printed 2 lines, not one line"),
        ("FAIL", "exited with status 3"),
        ("NONE", "printed nothing"),
        ("MISSING", "cannot be run"),
    ]:
        with pytest.raises(SecretUnavailable, match=f"{name}: its command .*{problem}") as failure:
            specs[name].read_value(environ)
        assert VALUE not in str(failure.value)
    assert VALUE not in repr(specs)


def test_a_command_that_hangs_is_given_up_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("llm_sandbox_mcp.secret_specs.COMMAND_SECONDS", 0.5)
    specs = load_secret_specs(_file(tmp_path, {"SLOW": {"value_command": ["sleep", "30"], "hosts": ["a.example"]}}))
    with pytest.raises(SecretUnavailable, match="SLOW: its command sleep did not finish in 0.5 s"):
        specs["SLOW"].read_value({"PATH": "/usr/bin:/bin"})


def _policy(*hosts: str) -> EgressPolicy:
    return EgressPolicy.of([HostRule.parse(host, explicit=False) for host in hosts], "SANDBOX_SESSION_ALLOW_HOSTS")


def test_a_session_gets_only_declared_secrets_whose_hosts_its_network_includes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _file(
        tmp_path,
        {
            "API_TOKEN": {"value": VALUE, "hosts": ["api.example.com"]},
            "GONE": {"value_env": "LLM_SANDBOX_TEST_UNSET", "hosts": ["api.example.com"]},
        },
    )
    monkeypatch.delenv("LLM_SANDBOX_TEST_UNSET", raising=False)
    secrets = SessionSecrets(Settings(sandbox_secrets_file=path))
    with pytest.raises(
        InvalidRequest, match=r"'NOPE' is not a secret this server declares \(declared: API_TOKEN, GONE\)"
    ):
        secrets.bind(["NOPE"], _policy("api.example.com"))
    with pytest.raises(InvalidRequest, match=r"API_TOKEN goes to api.example.com, which this session's network does"):
        secrets.bind(["API_TOKEN"], _policy("other.example.com"))
    with pytest.raises(InvalidRequest, match=r"network does not include; add 'api.example.com' to network"):
        secrets.bind(["API_TOKEN"], None)
    with pytest.raises(InvalidRequest, match="GONE: the variable LLM_SANDBOX_TEST_UNSET is not set"):
        secrets.bind(["GONE"], _policy("api.example.com"))
    first = secrets.bind(["API_TOKEN"], _policy("*.example.com"))
    second = secrets.bind(["API_TOKEN"], _policy("api.example.com"))
    # A placeholder is random per session and says nothing of the value.
    placeholder = first.bindings[0].placeholder
    assert placeholder != second.bindings[0].placeholder and VALUE not in placeholder
    env = placeholders_env(first)
    assert env["API_TOKEN"] == placeholder and VALUE not in json.dumps(env)
    assert env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] and env["NODE_EXTRA_CA_CERTS"].endswith(".pem")
    assert first.authority is second.authority  # one CA per server


def test_a_server_without_secrets_says_where_they_are_declared() -> None:
    with pytest.raises(InvalidRequest, match="declares no secrets .*SANDBOX_SECRETS_FILE"):
        SessionSecrets(Settings()).bind(["API_TOKEN"], _policy("api.example.com"))


@pytest.mark.anyio
async def test_create_session_names_an_unknown_or_unavailable_secret_and_makes_no_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _file(tmp_path, {"GONE": {"value_env": "LLM_SANDBOX_TEST_UNSET", "hosts": ["api.example.org"]}})
    monkeypatch.delenv("LLM_SANDBOX_TEST_UNSET", raising=False)
    backend = FakeBackend(handler=lambda call: ok())
    backend.install_network = "egress"
    settings = Settings(sandbox_pool_size=0, sandbox_session_allow_hosts=["api.example.org"], sandbox_secrets_file=path)
    async with Client(build_server(settings, backend)) as client:
        tool = {tool.name: tool for tool in (await client.list_tools()).tools}["create_session"]
        assert "secrets" in tool.input_schema["properties"]
        args: dict[str, object] = {"network": ["api.example.org"]}
        unknown = await client.call_tool("create_session", {**args, "secrets": ["NOPE"]})
        unavailable = await client.call_tool("create_session", {**args, "secrets": ["GONE"]})
    texts = [item.text for result in (unknown, unavailable) for item in result.content if isinstance(item, TextContent)]
    assert unknown.is_error and "'NOPE' is not a secret this server declares (declared: GONE)" in texts[0]
    assert unavailable.is_error and "GONE: the variable LLM_SANDBOX_TEST_UNSET is not set" in texts[1]
    assert backend.created == []
