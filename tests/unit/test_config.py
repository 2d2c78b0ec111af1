from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from llm_sandbox_mcp.cli import main
from llm_sandbox_mcp.config import Settings, env_name, load_settings, parse_size
from llm_sandbox_mcp.errors import ConfigError
from llm_sandbox_mcp.languages import LANGUAGES
from llm_sandbox_mcp.models import Limits

ROOT = Path(__file__).parents[2]
CONFIGURATION = ROOT / "docs" / "configuration.md"


def test_defaults_are_the_hardened_ones() -> None:
    limits = load_settings().limits()
    assert limits.network_mode == "none"
    assert limits.read_only is True
    assert limits.cap_drop == ("ALL",)
    assert "no-new-privileges:true" in limits.security_opt
    assert limits.privileged is False
    assert limits.uid != 0
    assert limits.pids > 0 and limits.memory_bytes > 0


def test_mem_limit_wins_over_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_MEMORY", "1g")
    assert load_settings().limits().memory_bytes == 1024**3
    monkeypatch.setenv("SANDBOX_MEM_LIMIT", "256m")
    assert load_settings().limits().memory_bytes == 256 * 1024**2


def test_cpu_count_wins_over_cpus_and_must_be_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_CPUS", "0.5")
    assert load_settings().limits().cpus == 0.5
    monkeypatch.setenv("SANDBOX_CPU_COUNT", "2")
    assert load_settings().limits().cpus == 2.0
    monkeypatch.setenv("SANDBOX_CPU_COUNT", "1.5")
    with pytest.raises(ConfigError, match=r"^SANDBOX_CPU_COUNT: .*whole|^SANDBOX_CPU_COUNT: .*integer"):
        load_settings()


def test_comma_separated_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_CAP_DROP", "NET_RAW, SYS_ADMIN,")
    monkeypatch.setenv("SANDBOX_SECURITY_OPT", "no-new-privileges:true,seccomp=unconfined")
    limits = load_settings().limits()
    assert limits.cap_drop == ("NET_RAW", "SYS_ADMIN")
    assert limits.security_opt == ("no-new-privileges:true", "seccomp=unconfined")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("BACKEND", "dockr"),
        ("SANDBOX_READ_ONLY", "maybe"),
        ("SANDBOX_MEM_LIMIT", "lots"),
        ("SANDBOX_MEMORY", "-5m"),
        ("SANDBOX_PIDS_LIMIT", "0"),
        ("SANDBOX_TIMEOUT", "abc"),
        ("SANDBOX_USER", "0:0"),
        ("SANDBOX_USER", "nobody"),
        ("SANDBOX_POOL_SIZE", "100"),
    ],
)
def test_a_bad_value_names_its_variable(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert len(raised.value.problems) == 1
    assert variable in raised.value.problems[0] or (
        variable == "SANDBOX_MEMORY" and "SANDBOX_MEM" in raised.value.problems[0]
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SANDBOX_PIP_INDEX_URL", "https://reader:s3cret@pypi.example/simple"),
        ("SANDBOX_NPM_REGISTRY", "https://:s3cret@npm.example/"),
        ("SANDBOX_GOPROXY", "https://proxy.example,https://reader:s3cret@mirror.example|direct"),
        ("SANDBOX_GOSUMDB", "sum.example+key https://reader:s3cret@sum.example"),
        ("SANDBOX_CRAN_REPO", "https://reader:s3cret@cran.example"),
        ("SANDBOX_GEM_SOURCE", "https://s3cret@gems.example/"),
        ("SANDBOX_MAVEN_REPO", "https://reader:s3cret@maven.example/releases"),
    ],
)
def test_a_registry_url_with_credentials_is_refused_without_repeating_them(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as raised:
        load_settings()
    (problem,) = raised.value.problems
    assert problem.startswith(f"{variable}: carries credentials") and "mirror or proxy of yours" in problem
    assert "s3cret" not in problem and "s3cret" not in str(raised.value)


def test_a_registry_url_without_credentials_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_NPM_REGISTRY", "https://npm.example/@scope/path@1")
    monkeypatch.setenv("SANDBOX_GOSUMDB", "off")
    settings = load_settings()
    assert (settings.sandbox_npm_registry, settings.sandbox_gosumdb) == ("https://npm.example/@scope/path@1", "off")


def test_every_bad_variable_gets_its_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACKEND", "nope")
    monkeypatch.setenv("SANDBOX_PIDS_LIMIT", "-1")
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert [line.split(":")[0] for line in raised.value.problems] == ["BACKEND", "SANDBOX_PIDS_LIMIT"]
    assert "accepted: auto, docker, podman, kubernetes, bubblewrap" in raised.value.problems[0]


def test_timeout_default_cannot_exceed_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_TIMEOUT", "600")
    with pytest.raises(ConfigError, match="SANDBOX_TIMEOUT must not exceed SANDBOX_MAX_TIMEOUT"):
        load_settings()


def test_bad_configuration_exits_2_before_serving(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SANDBOX_NETWORK_MODE", "none")
    monkeypatch.setenv("SANDBOX_READ_ONLY", "perhaps")
    assert main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines() == [
        "llm-sandbox-mcp: invalid configuration: SANDBOX_READ_ONLY: "
        "Input should be a valid boolean, unable to interpret input (got 'perhaps')"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512m", 512 * 1024**2), ("1g", 1024**3), ("256Mi", 256 * 1024**2), ("1048576", 1048576), ("64k", 65536)],
)
def test_sizes_in_docker_and_kubernetes_notation(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_the_configuration_page_documents_every_variable() -> None:
    documented = set(re.findall(r"^\| `([A-Z0-9_]+)`", CONFIGURATION.read_text(), flags=re.MULTILINE))
    declared = {env_name(name) for name in Settings.model_fields} | {"SANDBOX_MEMORY"}
    assert documented == declared


def _documented_defaults() -> dict[str, str]:
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \| (.*?) \|", CONFIGURATION.read_text(), flags=re.MULTILINE)
    return {name: default.strip("`") for name, default in rows}


# Variables whose field is unset by default and then takes a value the documentation states as the default.
_DERIVED: dict[str, Callable[[Settings], object]] = {"SANDBOX_CPUS": lambda settings: settings.limits().cpus}


def test_every_documented_default_is_the_one_the_code_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways: each documented default, given as the variable's value, is what the code uses when the variable
    is absent; and a variable documented as unset has no value in the code."""
    documented = _documented_defaults()
    defaults = Settings()
    for field, info in Settings.model_fields.items():
        name = env_name(field)
        text = documented[name]
        if text in ("unset", "—"):
            assert getattr(defaults, field) in (None, [], {}), f"{name} is documented as unset"
            continue
        unset_in_code = info.default is None and info.default_factory is None and name not in _DERIVED
        assert not unset_in_code, f"{name} has no default in the code but is documented as {text!r}"
        monkeypatch.setenv(name, text)
        given = Settings()
        monkeypatch.delenv(name)
        if name in _DERIVED:
            assert getattr(defaults, field) is None and _DERIVED[name](given) == _DERIVED[name](defaults), name
        else:
            assert getattr(given, field) == getattr(defaults, field), f"{name}: documented {text!r}"
    assert documented["SANDBOX_MEMORY"] == "—"  # the synonym's row defers to SANDBOX_MEM_LIMIT's


def test_server_json_declares_every_variable_with_the_documented_default() -> None:
    manifest = json.loads((ROOT / "server.json").read_text())
    package = manifest["packages"][0]
    assert package["registryType"] == "pypi" and package["transport"] == {"type": "stdio"}
    declared = {item["name"]: item.get("default") for item in package["environmentVariables"]}
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \| (.*?) \|", CONFIGURATION.read_text(), flags=re.MULTILINE)
    documented = {name: default.strip("`") for name, default in rows}
    assert set(declared) == set(documented)
    for name, default in declared.items():
        assert default == (None if documented[name] in ("unset", "—") else documented[name]), name


@pytest.mark.skipif(sys.platform != "linux", reason="provisioning is the Linux CI machine's script")
def test_provisioning_builds_exactly_the_base_images_and_user_the_settings_default_to() -> None:
    script = Path(__file__).parents[2] / "scripts" / "provision.sh"
    printed = subprocess.run(
        ["bash", str(script), "--print-images"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.splitlines()
    settings = Settings()
    expected = [f"{language} {settings.base_image_for(language)}" for language in LANGUAGES]
    assert printed == [*expected, f"user {settings.sandbox_user}"]
    assert settings.limits().uid == Limits().uid and settings.limits() == Limits()


@pytest.mark.parametrize(("variable", "value"), [("SANDBOX_CPUS", "1e-10"), ("SANDBOX_MEM_LIMIT", "1m")])
def test_limits_too_small_to_enforce_are_refused(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert variable in str(raised.value) or "SANDBOX_MEM_LIMIT" in str(raised.value)
