"""MCP glue for sessions and files: create, list and close sessions; move files in and out."""
# No `from __future__ import annotations`: the SDK evaluates the tool signatures.

import base64
import binascii
import json
from typing import Annotated, Any

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from llm_sandbox_mcp.artifacts import mime_type_of
from llm_sandbox_mcp.files import SessionFiles
from llm_sandbox_mcp.languages import LANGUAGES
from llm_sandbox_mcp.sessions import Session
from llm_sandbox_mcp.state import AppState, guard

SessionId = Annotated[str, Field(description="Id returned by create_session", max_length=64)]
WorkspacePath = Annotated[str, Field(description="Path relative to the session's /workspace", max_length=1024)]


class SessionInfo(BaseModel):
    session_id: str
    language: str
    libraries: list[str]
    age_s: float
    idle_s: float
    calls: int
    memory_limit_bytes: int
    cpus: float
    network: str
    workspace_bytes: int | None = Field(default=None, description="Bytes in /workspace now (list_sessions)")
    memory_bytes: int | None = Field(
        default=None, description="Memory the sandbox uses now, where the engine shows it (list_sessions)"
    )


class SessionList(BaseModel):
    sessions: list[SessionInfo]


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


def _info(session: Session) -> SessionInfo:
    return SessionInfo.model_validate(session.describe())


def register_session_tools(server: MCPServer[Any], state: AppState) -> None:
    languages = ", ".join(LANGUAGES)

    def files() -> SessionFiles:
        return SessionFiles(state.settings, state.executor)

    async def session(session_id: str) -> Session:
        return state.sessions.get(session_id)

    @server.tool(
        description=(
            "Start a session: a sandbox kept between execute_code calls (pass its session_id). Python keeps "
            "variables, imports and figures like a notebook; other languages keep files. Libraries are installed "
            "now (sessions have no network later). Sessions expire when idle; close them when done."
        ),
        annotations=ToolAnnotations(title="Create session", read_only_hint=False, open_world_hint=False),
    )
    async def create_session(
        language: Annotated[str, Field(description=f"One of: {languages}")] = "python",
        libraries: Annotated[
            list[Annotated[str, Field(max_length=200)]],
            Field(description="Packages to install, in the language's own syntax", max_length=50),
        ] = [],  # noqa: B006 - pydantic copies defaults
        memory: Annotated[
            str | None, Field(description="Memory limit such as '1g', within the operator's maximum", max_length=16)
        ] = None,
        cpus: Annotated[float | None, Field(description="CPU limit, within the operator's maximum", gt=0)] = None,
        network: Annotated[
            bool, Field(description="Ask for network access (refused unless the operator allows it)")
        ] = False,
    ) -> SessionInfo:
        created = await guard(state.sessions.create(language, libraries, memory, cpus, network))
        return _info(created)

    @server.tool(
        description="Close a session and destroy its sandbox. Its variables and files are gone afterwards.",
        annotations=ToolAnnotations(title="Close session", destructive_hint=True, open_world_hint=False),
    )
    async def close_session(session_id: SessionId) -> Closed:
        await guard(state.sessions.close(session_id))
        return Closed(session_id=session_id, closed=True)

    @server.tool(
        description="List open sessions with language, age, idle time, calls, limits and current resource use.",
        annotations=ToolAnnotations(title="List sessions", read_only_hint=True, open_world_hint=False),
    )
    async def list_sessions() -> SessionList:
        infos: list[SessionInfo] = []
        for open_session in state.sessions.list():
            usage = await guard(state.sessions.usage(open_session))
            infos.append(SessionInfo.model_validate({**open_session.describe(), **usage}))
        return SessionList(sessions=infos)

    @server.tool(
        description=(
            "Put a file into a session's workspace: give `content` (text) or `content_base64` (binary), or "
            "`host_path` to copy a host file (only below directories the operator allows)."
        ),
        annotations=ToolAnnotations(title="Upload file", read_only_hint=False, open_world_hint=False),
    )
    async def upload_file(
        session_id: SessionId,
        path: WorkspacePath,
        content: Annotated[str | None, Field(description="Text content (UTF-8)")] = None,
        content_base64: Annotated[str | None, Field(description="Binary content, base64-encoded")] = None,
        host_path: Annotated[str | None, Field(description="Absolute host path to copy from", max_length=4096)] = None,
    ) -> FileInfo:
        target = await guard(session(session_id))
        given = [value is not None for value in (content, content_base64, host_path)]
        if sum(given) != 1:
            raise ToolError("Give exactly one of content, content_base64 or host_path")
        if content is not None:
            data = content.encode("utf-8")
        elif content_base64 is not None:
            try:
                data = base64.b64decode(content_base64, validate=True)
            except binascii.Error:
                raise ToolError("content_base64 is not valid base64") from None
        else:
            assert host_path is not None
            data = await guard(files().read_host(host_path))
        entry = await guard(files().upload(target, path, data))
        return FileInfo(path=entry.path, type=entry.type, size=entry.size)

    @server.tool(
        description=(
            "Get a file from a session's workspace: text comes back as text, images also as images, other "
            "binary as base64. With `host_path` it is written to the host instead (only below allowed directories)."
        ),
        annotations=ToolAnnotations(title="Download file", read_only_hint=False, open_world_hint=False),
    )
    async def download_file(
        session_id: SessionId,
        path: WorkspacePath,
        host_path: Annotated[str | None, Field(description="Absolute host path to write to", max_length=4096)] = None,
    ) -> Annotated[CallToolResult, Download]:
        source = await guard(session(session_id))
        data = await guard(files().download(source, path))
        mime = mime_type_of(path)
        written = await guard(files().write_host(host_path, data)) if host_path is not None else None
        encoding, text = "host", None
        if written is None:
            try:
                encoding, text = "text", data.decode("utf-8")
            except UnicodeDecodeError:
                encoding, text = "base64", base64.b64encode(data).decode()
        result = Download(path=path, size=len(data), mime_type=mime, encoding=encoding, content=text, host_path=written)
        structured = result.model_dump(mode="json")
        content: list[ContentBlock] = [TextContent(text=json.dumps(structured, ensure_ascii=False))]
        if written is None and mime.startswith("image/"):
            content.append(ImageContent(data=base64.b64encode(data).decode(), mime_type=mime))
        return CallToolResult(content=content, structured_content=structured)

    @server.tool(
        description="List files in a session's workspace (up to four levels deep).",
        annotations=ToolAnnotations(title="List files", read_only_hint=True, open_world_hint=False),
    )
    async def list_files(session_id: SessionId, path: WorkspacePath = ".") -> FileList:
        target = await guard(session(session_id))
        entries = await guard(files().list(target, path))
        return FileList(files=[FileInfo(path=e.path, type=e.type, size=e.size) for e in entries])
