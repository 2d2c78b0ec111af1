"""Runs that outlive a call: background jobs, and foreground calls that turn into jobs at the foreground limit.

Every run goes through `JobRegistry.run`, in a task of the registry's own, so a run can outlive the call that
started it. A foreground call waits for it (sending progress meanwhile) up to SANDBOX_FOREGROUND_LIMIT, then
hands back a job id instead of being cut off by the client. Cancelling the call cancels its run, unless the
run has become a job; `cancel_job` cancels a job. A finished job's outcome is kept for SANDBOX_JOB_RETENTION
seconds. Jobs never outlive the server: closing the registry cancels them, and each one's run stops and gives
back its sandbox as any cancelled run does. A job belongs to the owner that started it ("" for the one
implicit principal of stdio): to anyone else its id is unknown, exactly as one that never existed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import anyio

from llm_sandbox_mcp import stages
from llm_sandbox_mcp.background import TaskOwner
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import InvalidRequest, SandboxError, SandboxNotFound
from llm_sandbox_mcp.models import Execution, Live
from llm_sandbox_mcp.replica_ids import new_id

logger = logging.getLogger(__name__)

Work = Callable[[Live], Awaitable[Execution]]
Report = Callable[[str], Awaitable[None]]
JobState = Literal["running", "finished", "failed", "cancelled"]
T = TypeVar("T")

# How often a waiting call reports progress: well under any client's idle timeout, and rate-limited by design.
PROGRESS_EVERY = 2.0


@dataclass
class Job:
    """One run in the registry's task group; a job (with an id the client knows) once it is `registered`."""

    id: str
    language: str
    session_id: str | None
    live: Live
    owner: str = ""
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)
    state: JobState = "running"
    result: Execution | None = None
    failure: BaseException | None = None
    finished: float | None = None
    registered: bool = False

    @property
    def error(self) -> str | None:
        if self.failure is None:
            return None
        if isinstance(self.failure, SandboxError):
            return str(self.failure)
        return "the run failed inside the server (see its log)"


class JobRegistry(TaskOwner):
    """The server's runs. Use as an async context manager: leaving it cancels every run still going."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._jobs: dict[str, Job] = {}

    async def run(
        self,
        work: Work,
        language: str,
        session_id: str | None,
        background: bool,
        progress: Report | None = None,
        owner: str = "",
        owner_quota: tuple[int, str] | None = None,
    ) -> Execution | Job:
        """Start `work`. In the background: the job at once. In the foreground: its outcome (its error raised),
        or the job when it is still running at the foreground limit and the job table has room, for `owner`
        too when `owner_quota` (the most running jobs one owner may have, and the setting that says so) is given."""
        if self._tasks is None:
            raise SandboxError("The server is shutting down")
        self._prune()
        if background:
            self._make_room(owner, owner_quota)
        job = Job(
            id=new_id("j", 6, self.settings.sandbox_http_replica_id),
            language=language,
            session_id=session_id,
            live=Live(),
            owner=owner,
        )
        if background:
            self._register(job)
        self._tasks.start_soon(self._drive, job, work)
        if background:
            return job
        try:
            async with anyio.create_task_group() as waiting:
                if progress is not None:
                    waiting.start_soon(_report, job.live, progress)
                with anyio.move_on_after(self.settings.sandbox_foreground_limit):
                    await job.done.wait()
                if not job.done.is_set() and self._owner_has_room(owner, owner_quota) and self._has_room():
                    self._register(job)
                else:
                    await job.done.wait()
                waiting.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            if not job.registered:  # the caller left: its run stops, and is done stopping when the call ends
                job.scope.cancel()
                with anyio.CancelScope(shield=True):
                    await job.done.wait()
            raise
        if job.registered:
            return job
        if job.failure is not None:
            raise job.failure
        assert job.result is not None
        return job.result

    async def _drive(self, job: Job, work: Work) -> None:
        try:
            with job.scope:
                stages.mark("into the run's task")
                job.result = await work(job.live)
                job.state = "finished"
        except Exception as exc:  # kept for the caller or get_job; never ends the server
            if not isinstance(exc, SandboxError):
                logger.exception("Run %s failed", job.id)
            job.failure, job.state = exc, "failed"
        finally:
            if job.state == "running":
                job.state = "cancelled"
            job.live.phase = job.state
            job.finished = job.live.ended = time.monotonic()
            job.done.set()

    def _register(self, job: Job) -> None:
        job.registered = True
        self._jobs[job.id] = job

    def _has_room(self) -> bool:
        """Whether one more job may run: only running jobs count against SANDBOX_MAX_JOBS. A finished job keeps
        its result for SANDBOX_JOB_RETENTION, unless its slot is needed: then the oldest finished goes first."""
        limit = self.settings.sandbox_max_jobs
        if sum(1 for job in self._jobs.values() if job.finished is None) >= limit:
            return False
        finished = sorted((job for job in self._jobs.values() if job.finished is not None), key=_finished_at)
        while len(self._jobs) >= limit and finished:
            del self._jobs[finished.pop(0).id]
        return True

    def _owner_has_room(self, owner: str, quota: tuple[int, str] | None) -> bool:
        running = sum(1 for job in self._jobs.values() if job.finished is None and job.owner == owner)
        return quota is None or running < quota[0]

    def _make_room(self, owner: str, quota: tuple[int, str] | None) -> None:
        if quota is not None and not self._owner_has_room(owner, quota):
            raise InvalidRequest(
                f"You have the maximum of {quota[0]} running jobs that this server allows each user ({quota[1]}); "
                "wait for one to finish, or cancel one with cancel_job"
            )
        if not self._has_room():
            raise InvalidRequest(
                f"The maximum of {self.settings.sandbox_max_jobs} running jobs (SANDBOX_MAX_JOBS) is reached; wait "
                "for one to finish, or cancel one with cancel_job"
            )

    def _prune(self) -> None:
        now = time.monotonic()
        retention = self.settings.sandbox_job_retention
        for job_id, job in list(self._jobs.items()):
            if job.finished is not None and now - job.finished > retention:
                del self._jobs[job_id]

    def get(self, job_id: str, owner: str = "") -> Job:
        self._prune()
        job = self._jobs.get(job_id)
        if job is None or job.owner != owner:
            raise SandboxNotFound(
                f"Job {job_id!r} is not known: it never existed, or it finished more than "
                f"{self.settings.sandbox_job_retention:g} s ago (SANDBOX_JOB_RETENTION), or its slot went to a new "
                f"job when {self.settings.sandbox_max_jobs} were kept (SANDBOX_MAX_JOBS), and its result is gone"
            )
        return job

    async def wait(self, job_id: str, seconds: float, owner: str = "") -> Job:
        """The job, once finished or after `seconds` (at most the foreground limit), whichever comes first."""
        job = self.get(job_id, owner)
        with anyio.move_on_after(min(seconds, self.settings.sandbox_foreground_limit)):
            await job.done.wait()
        return job

    async def cancel(self, job_id: str, owner: str = "") -> Job:
        """Stop a job and wait until its run has stopped; cancelling a finished job changes nothing."""
        job = self.get(job_id, owner)
        job.scope.cancel()
        await job.done.wait()
        return job

    def expires_in(self, job: Job) -> float | None:
        if job.finished is None:
            return None
        return max(0.0, self.settings.sandbox_job_retention - (time.monotonic() - job.finished))


def _finished_at(job: Job) -> float:
    assert job.finished is not None
    return job.finished


async def reporting(live: Live, progress: Report | None, work: Callable[[], Awaitable[T]]) -> T:
    """Await `work`, sending progress from `live` meanwhile (work that is not a run, e.g. creating a session)."""
    failure: Exception | None = None
    outcome: list[T] = []
    async with anyio.create_task_group() as tasks:
        if progress is not None:
            tasks.start_soon(_report, live, progress)
        try:
            outcome.append(await work())
        except Exception as exc:  # raised below, outside the task group, so not wrapped in an ExceptionGroup
            failure = exc
        finally:
            tasks.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return outcome[0]


async def _report(live: Live, progress: Report) -> None:
    """Progress while a call waits: every few seconds, what the run is doing. Never fails the call."""
    while True:
        try:
            await progress(live.summary())
        except Exception:
            logger.debug("Could not send progress", exc_info=True)
            return
        await anyio.sleep(PROGRESS_EVERY)
