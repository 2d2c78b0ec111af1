"""What to tell the model when its code failed for want of a library: the exact `libraries` value to pass.

Read from the run's stderr, which is the sandbox's (hostile) output: only names that are valid library
names of the language make it into a hint, and at most one hint is given.
"""

from __future__ import annotations

import json
import re
import sys

from llm_sandbox_mcp.images import library_name

# Import names whose PyPI distribution is named differently.
_PYPI_NAMES = {
    "PIL": "pillow",
    "bs4": "beautifulsoup4",
    "cv2": "opencv-python-headless",
    "sklearn": "scikit-learn",
    "skimage": "scikit-image",
    "yaml": "pyyaml",
    "dateutil": "python-dateutil",
    "dotenv": "python-dotenv",
    "docx": "python-docx",
    "pptx": "python-pptx",
    "Crypto": "pycryptodome",
    "jwt": "PyJWT",
    "fitz": "pymupdf",
    "serial": "pyserial",
    "mpl_toolkits": "matplotlib",
    "google.protobuf": "protobuf",
    "attr": "attrs",
}

_PYTHON = re.compile(r"ModuleNotFoundError: No module named '([A-Za-z_][A-Za-z0-9_.]{0,99})'")
_R = re.compile(r"there is no package called [‘'\"]([A-Za-z][A-Za-z0-9.]{0,98}[A-Za-z0-9])[’'\"]")
_NODE = re.compile(
    r"Cannot find (?:module|package) '((?:@[a-z0-9][a-z0-9._~-]{0,99}/)?[A-Za-z0-9][A-Za-z0-9._~-]{0,213})(?:/[^']*)?'"
)
_RUBY = re.compile(r"cannot load such file -- ([A-Za-z0-9][A-Za-z0-9._-]{0,99})(?:/\S*)? \(LoadError\)")


def _python(stderr: str) -> str | None:
    match = _PYTHON.search(stderr)
    if match is None:
        return None
    module = match.group(1)
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top.startswith("_"):
        return None  # not something pip installs (a module the image's Python was built without)
    return _PYPI_NAMES.get(module) or _PYPI_NAMES.get(top) or top.replace("_", "-")


def _first(pattern: re.Pattern[str], stderr: str) -> str | None:
    match = pattern.search(stderr)
    return match.group(1) if match else None


def missing_library(language: str, stderr: str) -> str | None:
    """The library to install for a run that failed because one is missing, or None."""
    if language == "python":
        return _python(stderr)
    if language == "r":
        return _first(_R, stderr)
    if language == "javascript":
        name = _first(_NODE, stderr)
        return None if name is None or name.startswith("node:") else name
    if language == "ruby":
        return _first(_RUBY, stderr)
    return None


def missing_library_hint(
    language: str, stderr: str, pending: str | None = None, coming: list[str] | None = None
) -> str:
    """A line to append to stderr saying which `libraries` value makes the run work, or ''. `pending`: the run
    was on the base image while the project image, which preinstalls `coming`, is built (what to say of it)."""
    library = missing_library(language, stderr)
    if library is None:
        return ""
    install = f"libraries={json.dumps([library])}"
    if pending is not None and _listed(library, coming or []):
        return (
            f"\n[hint: {library!r} comes with the {language} project image, which is not ready yet: {pending}. "
            f"Call again with {install} to install it for this run now, or without it once the image is ready]\n"
        )
    return (
        f"\n[hint: {library!r} is not installed in this sandbox's image; call again with {install} to install it "
        "for the run]\n"
    )


def _listed(library: str, specs: list[str]) -> bool:
    """Whether `library` is one of the specs' names (PyPI names compare case- and separator-insensitively)."""
    wanted = re.sub(r"[-_.]+", "-", library).lower()
    return any(re.sub(r"[-_.]+", "-", library_name(spec)).lower() == wanted for spec in specs)
