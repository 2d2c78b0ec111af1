"""Files a run leaves in its output directory, turned into artifacts the client can show."""

from __future__ import annotations

import mimetypes
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp", "image/svg+xml"})
_EXTRA_TYPES = {".webp": "image/webp", ".svg": "image/svg+xml", ".md": "text/markdown", ".csv": "text/csv"}
# Non-image files are embedded in the result up to this size each; larger ones are listed only.
EMBED_LIMIT = 64 * 1024


class Artifact(BaseModel):
    """One output file, as the result lists it. `data` (never serialised) is what was read of it, None when it
    was over the budget; `inline` says whether the result carries it."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="Path relative to the output directory")
    mime_type: str
    size: int = Field(description="Size in bytes")
    inline: bool = Field(description="Whether the content is included in this result")
    data: SkipJsonSchema[bytes | None] = Field(default=None, exclude=True, repr=False)

    @classmethod
    def of(cls, name: str, size: int, data: bytes | None) -> Artifact:
        mime_type = mime_type_of(name)
        inline = data is not None and (mime_type in IMAGE_TYPES or size <= EMBED_LIMIT)
        return cls(name=name, mime_type=mime_type, size=size, inline=inline, data=data)

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
        artifacts.append(Artifact.of(str(path), len(data), data if inline else None))
    return artifacts
