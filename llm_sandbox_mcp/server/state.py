"""What the lifespan builds and the tools call: one method per tool, each returning its wire model.

Every member that needs the engine raises the start-up failure (with its fix) while the engine is missing,
so a tool answers with that text rather than failing obscurely. The engine side (executor, sessions, jobs,
files) is imported only for types here: the server answers tools/list before the lifespan imports it.

Sessions and jobs are the caller's own (`principals.caller()`): the registries are asked with the caller as
owner. Served over HTTP (`over_http`), each principal also has quotas of open sessions and running jobs, and `host_path`
is refused: the server's files belong to no principal.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import TYPE_CHECKING

import anyio

from llm_sandbox_mcp import stages
from llm_sandbox_mcp.artifacts import mime_type_of
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import BackendUnavailable, InvalidRequest, SandboxError
from llm_sandbox_mcp.images import run_image
from llm_sandbox_mcp.languages import LANGUAGES, Language, get_language
from llm_sandbox_mcp.models import Execution, Live
from llm_sandbox_mcp.server.principals import caller
from llm_sandbox_mcp.server.results import (
    Closed,
    Download,
    FileInfo,
    FileList,
    JobInfo,
    LanguageDetails,
    LanguageInfo,
    LanguagesResult,
    NetworkAnswer,
    SessionInfo,
    SessionList,
)

if TYPE_CHECKING:
    from llm_sandbox_mcp.run.executor import Executor
    from llm_sandbox_mcp.run.files import Files
    from llm_sandbox_mcp.run.jobs import Job, JobRegistry, Report
    from llm_sandbox_mcp.run.network_requests import Ask, Reply
    from llm_sandbox_mcp.run.sessions import Session, SessionRegistry


class AppState:
    """The server's executor and sessions once the engine is up, or why it is not."""

    def __init__(self, settings: Settings, over_http: bool = False) -> None:
        self.settings = settings
        self.over_http = over_http
        self.running: Executor | None = None
        self.registry: SessionRegistry | None = None
        self.runs: JobRegistry | None = None
        self.versions: dict[str, tuple[str, dict[str, str]]] = {}
        self.failure: str | None = None
        # Set once the engine is up, or known not to be (`failure`): the lifespan starts it beside the protocol.
        self.started = anyio.Event()

    async def ready(self) -> None:
        """Wait for the engine's start-up to end, however it ended (no checkpoint once it has)."""
        if not self.started.is_set():
            await self.started.wait()

    def _unavailable(self) -> SandboxError:
        if self.failure is not None:
            return BackendUnavailable(f"{self.failure} (restart the MCP server after fixing this)")
        return SandboxError("The server is still starting; try again in a moment")

    @property
    def executor(self) -> Executor:
        if self.running is None:
            raise self._unavailable()
        return self.running

    @property
    def sessions(self) -> SessionRegistry:
        if self.registry is None:
            raise self._unavailable()
        return self.registry

    @property
    def jobs(self) -> JobRegistry:
        if self.runs is None:
            raise self._unavailable()
        return self.runs

    @property
    def files(self) -> Files:
        return self.executor.files()

    async def close_now(self) -> None:
        """Remove every sandbox this server made, from outside the lifespan (on a signal)."""
        with anyio.CancelScope(shield=True):
            if self.registry is not None:
                await self.registry.aclose()
            if self.running is not None:
                await self.running.remove_everything()

    # Code.

    async def execute(
        self,
        code: str,
        language: str,
        libraries: list[str],
        timeout: float | None,
        session_id: str | None,
        background: bool = False,
        progress: Report | None = None,
    ) -> Execution:
        """Run code, one-shot or in a session; in the background, or in the foreground until the foreground
        limit, past which the run goes on as a job and its handle comes back."""
        stages.mark("the SDK validates the arguments")
        await self.ready()
        if session_id is not None:
            sessions = self.sessions
            owner = caller()
            cell = sessions.prepare(session_id, code, libraries, timeout, owner)  # one we cannot serve fails now
            language = cell.language.name

            async def work(live: Live) -> Execution:
                return await sessions.run_cell(session_id, cell, live, owner)
        else:
            executor = self.executor
            program = executor.program(code, language, libraries, timeout, caller())
            language = program.language.name

            async def work(live: Live) -> Execution:
                return await executor.execute_program(program, live)

        quota = (
            (self.settings.sandbox_http_max_jobs_per_principal, "SANDBOX_HTTP_MAX_JOBS_PER_PRINCIPAL")
            if self.over_http
            else None
        )
        stages.mark("validate the request (once the engine is up)")
        outcome = await self.jobs.run(work, language, session_id, background, progress, caller(), quota)
        stages.mark("back in the call's task")
        return outcome if isinstance(outcome, Execution) else self._handle(outcome, background)

    def _handle(self, job: Job, background: bool) -> Execution:
        """What execute_code answers for a run that goes on as a job: its output so far and what to do next."""
        # The latest output only (what a result would keep of one stream); get_job has the rest.
        stdout, stderr, _ = job.live.since(job.live.total - self.settings.sandbox_output_limit)
        started = (
            "Started in the background"
            if background
            else (
                f"Still running after {self.settings.sandbox_foreground_limit:g} s (SANDBOX_FOREGROUND_LIMIT), so it "
                "goes on in the background"
            )
        )
        return Execution(
            exit_code=None,
            stdout=stdout.decode("utf-8", errors="replace"),
            stderr=stderr.decode("utf-8", errors="replace"),
            timed_out=False,
            truncated=False,
            duration_ms=round((time.monotonic() - job.live.started) * 1000),
            language=job.language,
            backend=self.executor.engine,
            phase="run",
            session_id=job.session_id,
            interpreter_lost=False,
            artifacts=[],
            status="running",
            job_id=job.id,
            message=(
                f"{started} as job {job.id}. Call get_job(job_id={job.id!r}, since={job.live.total}, "
                f"wait={min(30.0, self.settings.sandbox_foreground_limit):g}) for new output and, once finished, "
                "the full result; cancel_job stops it."
            ),
        )

    async def get_job(self, job_id: str, since: int, wait: float) -> JobInfo:
        await self.ready()
        return self._job_info(await self.jobs.wait(job_id, wait, caller()), since)

    async def cancel_job(self, job_id: str) -> JobInfo:
        await self.ready()
        return self._job_info(await self.jobs.cancel(job_id, caller()), 0)

    def _job_info(self, job: Job, since: int) -> JobInfo:
        stdout, stderr, skipped = job.live.since(since)
        return JobInfo(
            job_id=job.id,
            status=job.state,
            language=job.language,
            session_id=job.session_id,
            progress=job.live.summary(),
            stdout=stdout.decode("utf-8", errors="replace"),
            stderr=stderr.decode("utf-8", errors="replace"),
            next_since=job.live.total,
            skipped_bytes=skipped,
            result=job.result,
            error=job.error,
            expires_in_s=self.jobs.expires_in(job),
        )

    # Languages.

    def _missing(self, lang: Language) -> str | None:
        """Why `lang` cannot run here, or None."""
        if self.failure is not None:
            return self.failure
        return self.running.missing_runtime(lang) if self.running is not None else None

    def _language_info(self, lang: Language) -> LanguageInfo:
        missing = self._missing(lang)
        return LanguageInfo(
            name=lang.name,
            title=lang.title,
            image=run_image(self.settings, lang.name),
            package_manager=lang.package_manager,
            plots=lang.plots,
            available=missing is None,
            unavailable_reason=missing,
        )

    def languages(self) -> LanguagesResult:
        backend = self.running.engine if self.running is not None else self.settings.backend
        return LanguagesResult(languages=[self._language_info(lang) for lang in LANGUAGES.values()], backend=backend)

    async def language_details(self, name: str) -> LanguageDetails:
        await self.ready()
        lang = get_language(name)
        executor = self.executor
        missing = self._missing(lang)
        if missing is not None:
            raise SandboxError(f"{lang.title} is not available on this server: {missing}")
        image = await executor.image_of(lang)
        if image not in self.versions:
            self.versions[image] = await executor.probe(lang)
        version, libraries = self.versions[image]
        return LanguageDetails(
            **self._language_info(lang).model_dump(),
            version=version,
            preinstalled=libraries,
            file_name=lang.file_name,
            library_syntax=lang.library_syntax,
            examples=list(lang.examples),
            notes=lang.notes,
        )

    # Sessions.

    async def create_session(
        self,
        language: str,
        libraries: list[str],
        memory: str | None,
        cpus: float | None,
        network: bool | list[str],
        progress: Report | None = None,
        secrets: list[str] | None = None,
    ) -> SessionInfo:
        from llm_sandbox_mcp.run.jobs import reporting

        await self.ready()
        sessions, live, owner = self.sessions, Live(), caller()
        quota = (
            (self.settings.sandbox_http_max_sessions_per_principal, "SANDBOX_HTTP_MAX_SESSIONS_PER_PRINCIPAL")
            if self.over_http
            else None
        )
        session = await reporting(
            live,
            progress,
            lambda: sessions.create(
                language, libraries, memory, cpus, network, live, secrets, owner=owner, owner_quota=quota
            ),
        )
        return SessionInfo.model_validate(session.describe())

    async def close_session(self, session_id: str) -> Closed:
        await self.ready()
        await self.sessions.close(session_id, owner=caller())
        return Closed(session_id=session_id, closed=True)

    def network_question(self, session_id: str, host: str, reason: str) -> str | None:
        """What request_network would ask the person, or None (nothing to ask, or not yet started)."""
        return self.registry.network_question(session_id, host, reason, caller()) if self.registry else None

    async def ask_person(self, session_id: str, message: str, ask: Ask) -> Reply:
        await self.ready()
        return await self.sessions.ask_person(session_id, message, ask, caller())

    async def request_network(self, session_id: str, host: str, reason: str, reply: Reply | None) -> NetworkAnswer:
        await self.ready()
        sessions = self.sessions
        decision = await sessions.request_network(session_id, host, reason, reply, caller())
        session = sessions.get(session_id, caller())
        return NetworkAnswer(
            session_id=session_id,
            host=decision.host,
            granted=decision.granted,
            decision=decision.outcome,
            message=decision.message,
            allowed_hosts=session.egress.policy.summary() if session.egress is not None else [],
        )

    async def list_sessions(self) -> SessionList:
        await self.ready()
        sessions = self.sessions
        infos: list[SessionInfo] = []
        for session in sessions.list(caller()):
            usage = await sessions.usage(session)
            infos.append(SessionInfo.model_validate({**session.describe(), **usage}))
        return SessionList(sessions=infos)

    # Files.

    def _session(self, session_id: str) -> Session:
        return self.sessions.get(session_id, caller())

    def _host_files(self) -> None:
        if self.over_http:
            raise InvalidRequest(
                "host_path is not available over HTTP: the files of the server's host belong to no user of it; "
                "send content or content_base64 to upload, and leave host_path out to get a file's content back"
            )

    async def upload(
        self,
        session_id: str,
        path: str,
        content: str | None,
        content_base64: str | None,
        host_path: str | None,
    ) -> FileInfo:
        await self.ready()
        ref = self._session(session_id).lease.ref
        if sum(value is not None for value in (content, content_base64, host_path)) != 1:
            raise InvalidRequest("Give exactly one of content, content_base64 or host_path")
        if content is not None:
            data = content.encode("utf-8")
        elif content_base64 is not None:
            try:
                data = base64.b64decode(content_base64, validate=True)
            except binascii.Error:
                raise InvalidRequest("content_base64 is not valid base64") from None
        else:
            assert host_path is not None
            self._host_files()
            data = await self.files.read_host(host_path)
        entry = await self.files.upload(ref, path, data)
        return FileInfo(path=entry.path, type=entry.type, size=entry.size)

    async def download(
        self, session_id: str, path: str, host_path: str | None, overwrite: bool = False
    ) -> tuple[Download, bytes]:
        """The file's description and its bytes (for the image block a result may add)."""
        await self.ready()
        session = self._session(session_id)
        if host_path is not None:
            self._host_files()
        data = await self.files.download(session.lease.ref, path)
        if session.secrets is not None:  # a file the session wrote reaches the client redacted
            from llm_sandbox_mcp.run.session_secrets import redact_bytes

            data = redact_bytes(data, session.secrets)
        written = await self.files.write_host(host_path, data, overwrite) if host_path is not None else None
        encoding, text = "host", None
        if written is None:
            try:
                encoding, text = "text", data.decode("utf-8")
            except UnicodeDecodeError:
                encoding, text = "base64", base64.b64encode(data).decode()
        download = Download(
            path=path,
            size=len(data),
            mime_type=mime_type_of(path),
            encoding=encoding,
            content=text,
            host_path=written,
        )
        return download, data

    async def list_files(self, session_id: str, path: str) -> FileList:
        await self.ready()
        entries = await self.files.list(self._session(session_id).lease.ref, path)
        return FileList(files=[FileInfo(path=e.path, type=e.type, size=e.size) for e in entries])
