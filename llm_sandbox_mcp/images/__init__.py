"""Project images: one Dockerfile per language in this package, built FROM the image SANDBOX_IMAGE_* names.

They add what agents reach for first (Python's data-science stack, R's tidyverse core, a few npm utilities,
common C++ headers) with pinned versions. An image's tag is derived from its recipe (Dockerfile, library list,
base image name), so a changed recipe is a new image and an unchanged one is never rebuilt.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llm_sandbox_mcp.config import Settings

LABEL = "org.llm-sandbox-mcp."
RECIPE_LABEL = LABEL + "recipe"
BASE_LABEL = LABEL + "base"
BASE_ID_LABEL = LABEL + "base-id"
LIBRARIES_LABEL = LABEL + "libraries"
REPOSITORY = "localhost/llm-sandbox-mcp-"
CA_FILE = "install-ca.pem"

# Build argument -> the Settings field that sets it: the installers in a build use the operator's registries.
_REGISTRY_ARGS = {"PIP_INDEX_URL": "sandbox_pip_index_url", "NPM_CONFIG_REGISTRY": "sandbox_npm_registry"}


@cache
def _read(name: str) -> bytes | None:
    path = resources.files(__name__).joinpath(name)
    return path.read_bytes() if path.is_file() else None


def _specs(text: bytes | None) -> list[str]:
    lines = [line.split("#", 1)[0].strip() for line in (text or b"").decode(errors="replace").splitlines()]
    return [line for line in lines if line]


def library_specs(language: str) -> list[str]:
    """The pinned libraries the packaged project image of `language` adds (its `<language>.txt`), in file order."""
    return _specs(_read(f"{language}.txt"))


def library_name(spec: str) -> str:
    """'numpy==2.2.6' -> 'numpy', 'lodash@4.17.21' -> 'lodash', '@scope/x@1' -> '@scope/x', 'ggplot2' -> 'ggplot2'."""
    name = spec.split("==", 1)[0]
    at = name.rfind("@")
    return name[:at] if at > 0 else name


@dataclass(frozen=True)
class Recipe:
    """How to build one language's project image on a given base."""

    language: str
    base: str
    dockerfile: bytes
    libraries: bytes | None

    @property
    def specs(self) -> list[str]:
        """The libraries this recipe preinstalls (its `<language>.txt`), in file order."""
        return _specs(self.libraries)

    @property
    def digest(self) -> str:
        hashed = hashlib.sha256()
        for part in (self.language.encode(), self.base.encode(), self.dockerfile, self.libraries or b""):
            hashed.update(len(part).to_bytes(8, "big") + part)
        return hashed.hexdigest()

    @property
    def tag(self) -> str:
        return f"{REPOSITORY}{self.language}:{self.digest[:16]}"

    def labels(self, base_id: str | None) -> dict[str, str]:
        labels = {
            LABEL + "language": self.language,
            RECIPE_LABEL: self.digest,
            BASE_LABEL: self.base,
            LIBRARIES_LABEL: " ".join(self.specs),
        }
        if base_id:
            labels[BASE_ID_LABEL] = base_id
        return labels

    def context(self, ca_bundle: bytes = b"") -> bytes:
        """The build context, as a tar: the Dockerfile, the library list, and the CA certificates the installers
        in the build trust besides the image's own (SANDBOX_INSTALL_CA_BUNDLE; empty when unset)."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            files = {"Dockerfile": self.dockerfile, CA_FILE: ca_bundle}
            if self.libraries is not None:
                files[f"{self.language}.txt"] = self.libraries
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        return buffer.getvalue()


def recipe(settings: Settings, language: str) -> Recipe:
    dockerfile = _read(f"{language}.Dockerfile")
    if dockerfile is None:
        raise LookupError(f"no project image is defined for {language!r}")
    return Recipe(language, settings.base_image_for(language), dockerfile, _read(f"{language}.txt"))


def build_args(settings: Settings, base: str) -> dict[str, str]:
    args = {"BASE": base}
    for arg, setting in _REGISTRY_ARGS.items():
        value: str | None = getattr(settings, setting)
        if value:
            args[arg] = value
    return args


def derived(settings: Settings) -> bool:
    """Whether runs use project images built here: SANDBOX_PROJECT_IMAGES, except on Kubernetes (a cluster builds
    nothing; push the images and point SANDBOX_IMAGE_* at them)."""
    return settings.sandbox_project_images and settings.backend != "kubernetes"


def run_image(settings: Settings, language: str) -> str:
    """The image a language's sandboxes run: its project image when those are derived here, else SANDBOX_IMAGE_*."""
    if derived(settings):
        return recipe(settings, language).tag
    return settings.base_image_for(language)


_PYTHON_PROBE = """import sys
from importlib import metadata
for name in sys.argv[1:]:
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        pass
"""
_NODE_PROBE = """const fs = require('node:fs');
for (const name of process.argv.slice(1)) {
  try { console.log(name, JSON.parse(fs.readFileSync(`/node_modules/${name}/package.json`, 'utf8')).version); } catch {}
}"""
_R_PROBE = (
    "for (p in commandArgs(TRUE)) if (requireNamespace(p, quietly = TRUE)) cat(p, format(packageVersion(p)), '\\n')"
)
_DPKG_PROBE = "dpkg-query -W -f '${Package} ${Version}\\n' \"$@\" 2>/dev/null; true"


def probe_argv(language: str) -> list[str] | None:
    """A command printing `name version` for each of the project image's libraries the image really has."""
    names = [library_name(spec) for spec in library_specs(language)]
    if not names:
        return None
    prefix = {
        "python": ["python3", "-c", _PYTHON_PROBE],
        "javascript": ["node", "-e", _NODE_PROBE],
        "r": ["Rscript", "-e", _R_PROBE],
        "cpp": ["sh", "-c", _DPKG_PROBE, "sh"],
    }.get(language)
    return None if prefix is None else [*prefix, *names]


def parse_probe(language: str, output: str) -> dict[str, str]:
    """The `name version` lines of `probe_argv`'s output (the sandbox's: only names on the list, bounded)."""
    names = {library_name(spec) for spec in library_specs(language)}
    found: dict[str, str] = {}
    for line in output.splitlines()[: 2 * len(names)]:
        parts = line.split()
        if len(parts) == 2 and parts[0] in names and len(parts[1]) <= 64:
            found[parts[0]] = parts[1]
    return found
