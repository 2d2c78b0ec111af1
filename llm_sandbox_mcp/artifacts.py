"""Files a run leaves in its output directory, turned into artifacts the client can show."""

from __future__ import annotations

import mimetypes
from dataclasses import dataclass
from pathlib import PurePosixPath

IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp", "image/svg+xml"})
_EXTRA_TYPES = {".webp": "image/webp", ".svg": "image/svg+xml", ".md": "text/markdown", ".csv": "text/csv"}


@dataclass(frozen=True)
class Artifact:
    """One output file. `data` is None when it was too large to return inline."""

    name: str
    mime_type: str
    size: int
    data: bytes | None

    @property
    def is_image(self) -> bool:
        return self.mime_type in IMAGE_TYPES


def mime_type_of(name: str) -> str:
    suffix = PurePosixPath(name).suffix.lower()
    return _EXTRA_TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"


def collect(files: dict[PurePosixPath, bytes], inline_limit: int) -> list[Artifact]:
    """Artifacts in name order; files are inlined until their total passes `inline_limit`."""
    artifacts: list[Artifact] = []
    budget = inline_limit
    for path in sorted(files):
        data = files[path]
        inline = len(data) <= budget
        if inline:
            budget -= len(data)
        artifacts.append(Artifact(str(path), mime_type_of(str(path)), len(data), data if inline else None))
    return artifacts
