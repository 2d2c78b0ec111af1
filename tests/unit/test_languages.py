from __future__ import annotations

import re

import pytest

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import InvalidRequest
from llm_sandbox_mcp.languages import LANGUAGES, get_language, install_env, sandbox_env


@pytest.mark.parametrize(
    "spec", ["requests", "numpy==2.1.0", "pandas[excel,perf]>=2,<3", "Django~=5.0", "zope.interface", "a_b-c.d"]
)
def test_python_accepts_plain_requirements(spec: str) -> None:
    assert get_language("python").check_libraries([spec]) == [spec]


@pytest.mark.parametrize(
    "spec",
    [
        "requests; rm -rf /",
        "requests && curl evil",
        "$(id)",
        "`id`",
        "numpy|sh",
        "--index-url=http://evil/simple",
        "-e .",
        "git+https://github.com/x/y",
        "https://evil/pkg.whl",
        "../../etc/passwd",
        "/tmp/pkg.whl",
        "numpy==1.0 ; python_version<'4'",
        "pkg\nother",
        "",
        "name with space",
        "pkg @ file:///x",
    ],
)
def test_python_refuses_options_urls_paths_and_shell(spec: str) -> None:
    with pytest.raises(InvalidRequest, match="Invalid Python library"):
        get_language("python").check_libraries([spec])


def test_specs_are_deduplicated_and_sorted_for_a_stable_cache_key() -> None:
    assert get_language("python").check_libraries(["b", "a", "b"]) == ["a", "b"]


def test_unknown_language_lists_the_supported_ones() -> None:
    with pytest.raises(
        InvalidRequest, match=r"Unsupported language 'cobol'\. Supported: python, javascript, go, cpp, java, r, ruby"
    ):
        get_language("cobol")


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("Python3", "python"),
        ("js", "javascript"),
        ("Node", "javascript"),
        ("golang", "go"),
        ("C++", "cpp"),
        ("R", "r"),
        ("rb", "ruby"),
        ("Java", "java"),
    ],
)
def test_aliases_resolve(alias: str, name: str) -> None:
    assert get_language(alias).name == name


# Inputs no ecosystem may accept: shell syntax, options, URLs, paths, whitespace, control characters.
HOSTILE = [
    "",
    " ",
    "$(id)",
    "`id`",
    "a;id",
    "a && id",
    "a|sh",
    "a>/tmp/out",
    "a\nb",
    "a b",
    "a\tb",
    "a\x00b",
    "-e",
    "--help",
    "--index-url=http://evil/simple",
    "https://evil.example/pkg",
    "http://127.0.0.1/x",
    "file:///etc/passwd",
    "git+https://evil.example/x.git",
    "/etc/passwd",
    "./local",
    "../../etc",
    "~/x",
    "${HOME}",
    "'quoted'",
    '"quoted"',
    "a*",
    "x" * 300,
]

# Valid in each ecosystem, and then that ecosystem's own dangerous forms.
ACCEPTED = {
    "javascript": ["lodash", "lodash@4.17.21", "@types/node", "@scope/name@^2.1.0", "zod@latest", "left-pad@~1.3"],
    "go": [
        "github.com/google/uuid",
        "github.com/google/uuid@v1.6.0",
        "github.com/google/go-cmp@v0.0.0-20240416160154-fe59bbe5cc7f",
        "example.com/yaml.v3",
        "example.com/greet@latest",
    ],
    "cpp": ["libfmt-dev", "libboost-dev", "nlohmann-json3-dev", "libstdc++-14-dev", "libgtest-dev"],
    "java": ["com.google.code.gson:gson:2.11.0", "org.apache.commons:commons-lang3:3.14.0", "junit:junit:4.13.2"],
    "r": ["data.table", "jsonlite", "ggplot2", "R6"],
    "ruby": ["rainbow", "rainbow:3.1.1", "activesupport:7.1.3.2", "net-http"],
}
REFUSED = {
    "javascript": [
        "npm:evil@1",  # an alias to another package
        "user/repo",  # a GitHub shorthand
        "github:user/repo",
        "lodash@file:../x",
        "lodash@git+ssh://x",
        "@scope",
        "@/name",
        "lodash@1 || 2",
        "-g",
        ".hidden",
    ],
    "go": [
        "uuid",  # no domain
        "github.com/../../etc",
        "github.com/./x",
        "github.com/google/uuid@",
        "-modfile=/tmp/x",
        "github.com/google/uuid@-x",
        "GitHub.com/google/uuid",
        "github.com//uuid",
    ],
    "cpp": ["libfmt-dev=10.1", "libfmt-dev/trixie", "a", "-o", "Libfmt-dev", "./x.deb", "libfmt-dev:amd64"],
    "java": [
        "gson",
        "com.google.code.gson:gson",
        "com.google.code.gson:gson:[2.0,3.0)",
        "com.google.code.gson:gson:2.11.0:sources:jar",
        "..:..:..",
        "com/google:gson:1",
        "-Dx=y:a:b",
    ],
    "r": ["1pkg", "pkg.", "pkg_name", "pkg-name", "pkg==1.0", "pkg@1.0", ".pkg", "a"],
    "ruby": ["rainbow:>=3", "rainbow -v 3", "rainbow:3.1.1:x", ":3.1", "rainbow:", "rainbow@3.1.1", "--source"],
}


@pytest.mark.parametrize(
    ("language", "spec"), [(language, spec) for language, specs in ACCEPTED.items() for spec in specs]
)
def test_each_ecosystem_accepts_its_own_library_names(language: str, spec: str) -> None:
    assert get_language(language).check_libraries([spec]) == [spec]


@pytest.mark.parametrize(
    ("language", "spec"),
    [(language, spec) for language in LANGUAGES for spec in HOSTILE]
    + [(language, spec) for language, specs in REFUSED.items() for spec in specs],
)
def test_each_ecosystem_refuses_shell_options_urls_and_paths(language: str, spec: str) -> None:
    lang = get_language(language)
    with pytest.raises(InvalidRequest, match=rf"Invalid {re.escape(lang.title)} library"):
        lang.check_libraries([spec])


@pytest.mark.parametrize("language", list(LANGUAGES))
def test_library_specs_are_arguments_never_part_of_a_script(language: str) -> None:
    lang = get_language(language)
    marker = "a.b.c.spec.marker"
    argv = lang.install_argv([marker])
    assert argv[-1] == marker
    assert all(marker not in arg for arg in argv[:-1])


REGISTRIES = {
    "python": ("sandbox_pip_index_url", "PIP_INDEX_URL"),
    "javascript": ("sandbox_npm_registry", "NPM_CONFIG_REGISTRY"),
    "go": ("sandbox_goproxy", "GOPROXY"),
    "r": ("sandbox_cran_repo", "LLM_SANDBOX_CRAN_REPO"),
    "ruby": ("sandbox_gem_source", "LLM_SANDBOX_GEM_SOURCE"),
    "java": ("sandbox_maven_repo", "LLM_SANDBOX_MAVEN_REPO"),
}


@pytest.mark.parametrize("language", list(REGISTRIES))
def test_a_registry_setting_reaches_that_languages_installer_only(language: str) -> None:
    setting, variable = REGISTRIES[language]
    settings = Settings.model_validate({setting: "https://mirror.example/repo"})
    for other in LANGUAGES.values():
        env = install_env(other, settings)
        assert env == ({variable: "https://mirror.example/repo"} if other.name == language else {})


def test_without_registry_settings_installers_use_their_own_defaults() -> None:
    assert all(install_env(lang, Settings()) == {} for lang in LANGUAGES.values())


def test_go_can_turn_the_checksum_database_off_for_a_private_proxy() -> None:
    settings = Settings.model_validate({"sandbox_goproxy": "http://proxy.internal", "sandbox_gosumdb": "off"})
    assert install_env(get_language("go"), settings) == {"GOPROXY": "http://proxy.internal", "GOSUMDB": "off"}


@pytest.mark.parametrize("language", list(LANGUAGES))
def test_every_language_tells_the_truth_it_can_tell_without_an_engine(language: str) -> None:
    lang = get_language(language)
    assert lang.version_argv and lang.package_manager and lang.library_syntax and lang.notes
    assert 1 <= len(lang.examples) <= 2
    assert lang.run_argv()  # its runner ships with the package
    env = sandbox_env(lang, with_libraries=True)
    assert env["HOME"] == "/tmp" and env["OUTPUT_DIR"] == "/workspace/outputs"


def test_the_library_cache_key_changes_with_the_registry() -> None:
    from llm_sandbox_mcp.config import Settings
    from llm_sandbox_mcp.run.executor import Executor
    from tests.support.fakes import FakeBackend

    python = get_language("python")
    default = Executor(Settings(), FakeBackend()).libraries.key(python, ["six"])
    mirror = Executor(Settings(sandbox_pip_index_url="http://127.0.0.1:3141/simple"), FakeBackend())
    assert mirror.libraries.key(python, ["six"]) != default
    assert Executor(Settings(), FakeBackend()).libraries.key(python, ["six"]) == default
