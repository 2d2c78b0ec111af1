"""The languages the server runs: image setting, how code is run, how libraries are named and installed."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from llm_sandbox_mcp.errors import InvalidRequest
from llm_sandbox_mcp.models import LIBS_DIR, OUTPUT_DIR

if TYPE_CHECKING:
    from llm_sandbox_mcp.config import Settings


@cache
def runner_source(name: str) -> str:
    return resources.files("llm_sandbox_mcp.runners").joinpath(name).read_text()


@dataclass(frozen=True)
class Language:
    """How one language is run in a sandbox. Code always arrives on the process's stdin."""

    name: str
    title: str
    file_name: str
    run_argv: Callable[[], list[str]]
    version_argv: tuple[str, ...]
    package_manager: str
    library_syntax: str
    library_pattern: re.Pattern[str]
    install_argv: Callable[[Sequence[str]], list[str]]
    env: dict[str, str] = field(default_factory=lambda: {})
    lib_env: dict[str, str] = field(default_factory=lambda: {})
    plots: str = "no automatic capture; write files to $OUTPUT_DIR to return them"
    examples: tuple[str, ...] = ()
    notes: str = ""
    # Runs through a warm interpreter in the sandbox (runners/python_kernel.py) instead of one exec per call.
    kernel: bool = False

    def check_libraries(self, libraries: Sequence[str]) -> list[str]:
        """Validated, de-duplicated, sorted specs; raises InvalidRequest naming the first bad one."""
        specs: set[str] = set()
        for library in libraries:
            spec = library.strip()
            if not spec or not self.library_pattern.fullmatch(spec):
                raise InvalidRequest(
                    f"Invalid {self.title} library {library!r}: expected {self.library_syntax}. "
                    "Options, URLs, paths and shell syntax are not accepted."
                )
            specs.add(spec)
        return sorted(specs)


# A run script whose compile step failed ends its stderr with this, so the result can say phase "compile".
COMPILE_FAILED_MARKER = b"\x1ellm-sandbox-phase:compile\x1e\n"

_COMMON_ENV = {"HOME": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "OUTPUT_DIR": str(OUTPUT_DIR)}

# A PEP 508 name, optional extras, optional comma-separated version specifiers; no URLs or markers.
_PIP_SPEC = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?"
    r"(?:\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?"
    r"(?:(?:===|==|!=|~=|>=|<=|<|>)[A-Za-z0-9.*+!_-]{1,64}"
    r"(?:,(?:===|==|!=|~=|>=|<=|<|>)[A-Za-z0-9.*+!_-]{1,64})*)?"
)


def _pip_install(specs: Sequence[str]) -> list[str]:
    return [
        "python3", "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check", "--no-input",
        "--no-warn-script-location", "--target", f"{LIBS_DIR}/python", *specs,
    ]  # fmt: skip


PYTHON = Language(
    name="python",
    title="Python",
    file_name="main.py",
    run_argv=lambda: ["python3", "-c", runner_source("python_kernel.py")],
    kernel=True,
    version_argv=("python3", "--version"),
    package_manager="pip",
    library_syntax="a PyPI requirement such as 'requests', 'numpy==2.1.0' or 'pandas[excel]>=2,<3'",
    library_pattern=_PIP_SPEC,
    install_argv=_pip_install,
    env={"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "MPLCONFIGDIR": "/tmp/.matplotlib"},
    lib_env={"PYTHONPATH": f"{LIBS_DIR}/python"},
    plots="every matplotlib figure (plt.show(), figures left open, savefig into $OUTPUT_DIR) comes back as PNG",
    examples=(
        "print(sum(range(10)))",
        "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9, 16])\nplt.title('squares')\nplt.show()",
    ),
    notes="Code runs as /workspace/main.py; the working directory is /workspace and is discarded after the call.",
)

LANGUAGES: dict[str, Language] = {language.name: language for language in (PYTHON,)}
ALIASES = {"py": "python", "python3": "python"}


def get_language(name: str) -> Language:
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    try:
        return LANGUAGES[key]
    except KeyError:
        raise InvalidRequest(
            f"Unsupported language {name!r}. Supported: {', '.join(LANGUAGES)} (see get_supported_languages)."
        ) from None


def sandbox_env(language: Language, with_libraries: bool) -> dict[str, str]:
    env = {**_COMMON_ENV, **language.env}
    if with_libraries:
        env.update(language.lib_env)
    return env


def install_env(language: Language, settings: Settings) -> dict[str, str]:
    """Variables that point a language's installer at the operator's registry or mirror."""
    env: dict[str, str] = {}
    if language.name == "python" and settings.sandbox_pip_index_url:
        env["PIP_INDEX_URL"] = settings.sandbox_pip_index_url
    return env
