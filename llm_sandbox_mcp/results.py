"""What execute_code returns: the result model, and artifacts as MCP content blocks."""

import base64
import json
from typing import Literal

from mcp_types import (
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)
from pydantic import BaseModel, Field

from llm_sandbox_mcp.artifacts import Artifact
from llm_sandbox_mcp.executor import Execution

# Non-image files are embedded in the result up to this size each; larger ones are listed only.
EMBED_LIMIT = 64 * 1024


class ArtifactInfo(BaseModel):
    name: str = Field(description="Path relative to the output directory")
    mime_type: str
    size: int = Field(description="Size in bytes")
    inline: bool = Field(description="Whether the content is included in this result")


class ExecutionResult(BaseModel):
    exit_code: int = Field(description="Exit status of the program; non-zero means it failed")
    stdout: str
    stderr: str
    timed_out: bool = Field(description="The timeout expired and every process was killed")
    truncated: bool = Field(description="Output was longer than the cap; its middle was cut")
    duration_ms: int
    language: str
    backend: str
    phase: Literal["compile", "run"] = Field(description="Where it failed or ended: compile errors say 'compile'")
    session_id: str | None = Field(description="The session the code ran in, if any")
    interpreter_lost: bool = Field(description="The session's interpreter was stopped; the next call starts anew")
    artifacts: list[ArtifactInfo] = Field(description="Files written to $OUTPUT_DIR (plots included)")


def shape_execution(execution: Execution) -> CallToolResult:
    result = ExecutionResult(
        exit_code=execution.exit_code,
        stdout=execution.stdout,
        stderr=execution.stderr,
        timed_out=execution.timed_out,
        truncated=execution.truncated,
        duration_ms=execution.duration_ms,
        language=execution.language,
        backend=execution.backend,
        phase="compile" if execution.phase == "compile" else "run",
        session_id=execution.session_id,
        interpreter_lost=execution.interpreter_lost,
        artifacts=[
            ArtifactInfo(name=a.name, mime_type=a.mime_type, size=a.size, inline=_inlined(a))
            for a in execution.artifacts
        ],
    )
    structured = result.model_dump(mode="json")
    content: list[ContentBlock] = [TextContent(text=json.dumps(structured, ensure_ascii=False))]
    for artifact in execution.artifacts:
        block = artifact_block(artifact)
        if block is not None:
            content.append(block)
    return CallToolResult(content=content, structured_content=structured)


def _inlined(artifact: Artifact) -> bool:
    return artifact.data is not None and (artifact.is_image or artifact.size <= EMBED_LIMIT)


def artifact_block(artifact: Artifact) -> ContentBlock | None:
    if artifact.data is None or not _inlined(artifact):
        return None
    encoded = base64.b64encode(artifact.data).decode()
    if artifact.is_image:
        return ImageContent(data=encoded, mime_type=artifact.mime_type)
    uri = f"sandbox://outputs/{artifact.name}"
    if artifact.mime_type.startswith("text/") or artifact.mime_type in ("application/json", "application/xml"):
        text = artifact.data.decode("utf-8", errors="replace")
        return EmbeddedResource(resource=TextResourceContents(uri=uri, mime_type=artifact.mime_type, text=text))
    return EmbeddedResource(resource=BlobResourceContents(uri=uri, mime_type=artifact.mime_type, blob=encoded))
