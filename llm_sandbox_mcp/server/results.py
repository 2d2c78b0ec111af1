"""The wire contract: every tool's output model, the content blocks a result carries, and the one error boundary.

Each tool returns one of these models (or a `CallToolResult` whose `structured_content` is one, when it also
carries images or files); the SDK derives each tool's `outputSchema` from them.
"""

import base64
import json
from collections.abc import Awaitable, Callable, Generator
from contextlib import contextmanager
from typing import Any, Literal

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
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

from llm_sandbox_mcp import stages
from llm_sandbox_mcp.artifacts import Artifact
from llm_sandbox_mcp.errors import SandboxError
from llm_sandbox_mcp.models import Execution

ExecutionResult = Execution


class LanguageInfo(BaseModel):
    name: str
    title: str
    image: str
    package_manager: str
    plots: str
    available: bool = Field(description="Whether this language can run on the server's backend")
    unavailable_reason: str | None = Field(description="Why not, when it cannot")


class LanguagesResult(BaseModel):
    languages: list[LanguageInfo]
    backend: str


class LanguageDetails(LanguageInfo):
    version: str = Field(description="Version reported by the runtime in the configured image")
    preinstalled: dict[str, str] = Field(
        default_factory=lambda: {},
        description="Libraries the image already has (name -> version found in it): use them without `libraries`",
    )
    file_name: str
    library_syntax: str
    examples: list[str]
    notes: str


class SessionInfo(BaseModel):
    session_id: str
    language: str
    libraries: list[str]
    age_s: float
    idle_s: float
    calls: int
    memory_limit_bytes: int
    cpus: float
    network: str = Field(description="none; egress (only allowed_hosts, through the server's proxy); or a network")
    allowed_hosts: list[str] = Field(default_factory=lambda: [], description="Hosts the session may reach")
    secrets: list[str] = Field(
        default_factory=lambda: [],
        description="Secrets given to the session: each an environment variable holding a placeholder that the "
        "proxy replaces with the value only in requests to the secret's hosts",
    )
    network_requests: list[str] = Field(
        default_factory=lambda: [], description="Hosts asked for with request_network and what was decided"
    )
    workspace_bytes: int | None = Field(default=None, description="Bytes in /workspace now (list_sessions)")
    memory_bytes: int | None = Field(
        default=None, description="Memory the sandbox uses now, where the engine shows it (list_sessions)"
    )


class SessionList(BaseModel):
    sessions: list[SessionInfo]


class NetworkAnswer(BaseModel):
    session_id: str
    host: str
    granted: bool = Field(description="Whether the session may reach the host now")
    decision: str  # the outcomes are listed in docs/network.md; `message` says what it means
    message: str
    allowed_hosts: list[str]


class Closed(BaseModel):
    session_id: str
    closed: bool


class FileInfo(BaseModel):
    path: str
    type: str = Field(description="file, directory, symlink or other")
    size: int


class FileList(BaseModel):
    files: list[FileInfo]


class Download(BaseModel):
    path: str
    size: int
    mime_type: str
    encoding: str = Field(description="'text' (content holds the text), 'base64', or 'host' (written to host_path)")
    content: str | None
    host_path: str | None


class JobInfo(BaseModel):
    job_id: str
    status: Literal["running", "finished", "failed", "cancelled"]
    language: str
    session_id: str | None
    progress: str = Field(description="What the run is doing: phase, time, output so far and its last line")
    stdout: str = Field(description="Output of the run from offset `since` on")
    stderr: str = Field(description="Error output of the run from offset `since` on")
    next_since: int = Field(description="Pass as `since` next time to get only newer output")
    skipped_bytes: int = Field(description="Output between `since` and what is still kept, no longer available")
    result: Execution | None = Field(description="The full result once finished (plots come back as images)")
    error: str | None = Field(description="Why the run could not be served, when it failed")
    expires_in_s: float | None = Field(description="Seconds until a finished job is forgotten")


@contextmanager
def tool_errors() -> Generator[None]:
    """The one error boundary of every tool: our errors become tool errors whose text the model reads.

    Anything else is a bug, and the SDK's generic crash path keeps its details in the server log.
    """
    try:
        yield
    except SandboxError as exc:
        raise ToolError(str(exc)) from exc


def progress_of(ctx: Context[Any, Any] | None) -> Callable[[str], Awaitable[None]] | None:
    """Progress notifications for the calling request (the SDK sends them only when it carries a token)."""
    if ctx is None:
        return None
    count = 0

    async def report(message: str) -> None:
        nonlocal count
        count += 1
        await ctx.report_progress(count, None, message)

    return report


def _with_blocks(model: BaseModel, blocks: list[ContentBlock]) -> CallToolResult:
    """The model as JSON text (and structured content), followed by `blocks`."""
    structured = model.model_dump(mode="json")
    content: list[ContentBlock] = [TextContent(text=json.dumps(structured, ensure_ascii=False)), *blocks]
    return CallToolResult(content=content, structured_content=structured)


def execution_result(execution: Execution) -> CallToolResult:
    """The outcome, then each artifact the result carries as an image or an embedded file."""
    result = _with_blocks(execution, [_artifact_block(a) for a in execution.artifacts if a.inline])
    stages.mark("the result as MCP content")
    return result


def job_result(info: JobInfo) -> CallToolResult:
    """A job's status; once finished, with its result's plots and files as for execute_code."""
    artifacts = info.result.artifacts if info.result is not None else []
    return _with_blocks(info, [_artifact_block(a) for a in artifacts if a.inline])


def download_result(download: Download, data: bytes) -> CallToolResult:
    """A downloaded file; an image also comes back as an image the client can show."""
    blocks: list[ContentBlock] = []
    if download.host_path is None and download.mime_type.startswith("image/"):
        blocks.append(ImageContent(data=base64.b64encode(data).decode(), mime_type=download.mime_type))
    return _with_blocks(download, blocks)


def _artifact_block(artifact: Artifact) -> ContentBlock:
    assert artifact.data is not None
    encoded = base64.b64encode(artifact.data).decode()
    if artifact.is_image:
        return ImageContent(data=encoded, mime_type=artifact.mime_type)
    uri = f"sandbox://outputs/{artifact.name}"
    if artifact.mime_type.startswith("text/") or artifact.mime_type in ("application/json", "application/xml"):
        text = artifact.data.decode("utf-8", errors="replace")
        return EmbeddedResource(resource=TextResourceContents(uri=uri, mime_type=artifact.mime_type, text=text))
    return EmbeddedResource(resource=BlobResourceContents(uri=uri, mime_type=artifact.mime_type, blob=encoded))
