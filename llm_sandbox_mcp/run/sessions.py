"""Sessions: one sandbox kept across calls, with a live interpreter for Python (notebook semantics).

A session has a server-issued id, a language, libraries fixed at creation, optional per-session limits
within the operator's maxima, an idle TTL and a maximum lifetime. One call at a time runs in a session.

Every session has an owner (the principal that created it; "" for the one implicit principal of stdio): to
anyone else its id is unknown, exactly as an id that never existed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

import anyio

from llm_sandbox_mcp.config import Settings, parse_size
from llm_sandbox_mcp.durations import duration
from llm_sandbox_mcp.egress.bound import SecretRoutes
from llm_sandbox_mcp.egress.policy import EgressPolicy
from llm_sandbox_mcp.egress.proxy import EgressListener, open_listener
from llm_sandbox_mcp.egress.relay import Relay, relay_alive
from llm_sandbox_mcp.errors import InvalidRequest, SandboxError, SandboxFailure, SandboxNotFound
from llm_sandbox_mcp.host_rules import HostRule
from llm_sandbox_mcp.languages import Language, get_language
from llm_sandbox_mcp.models import EGRESS_NETWORK, MIN_CPUS, MIN_MEMORY, Execution, Limits, Live
from llm_sandbox_mcp.replica_ids import new_id
from llm_sandbox_mcp.run.executor import Executor, Program
from llm_sandbox_mcp.run.leases import Lease
from llm_sandbox_mcp.run.modes import Cell
from llm_sandbox_mcp.run.network_requests import (
    SESSION_SETTING,
    Ask,
    NetworkAsks,
    NetworkDecision,
    Reply,
    ask_once,
    ceiling_rules,
    decide,
    question_for,
    refusal_lines,
    within_ceiling,
)
from llm_sandbox_mcp.run.session_secrets import (
    TRUST_SCRIPT,
    SessionSecrets,
    placeholders_env,
    redact_execution,
    redact_text,
)

logger = logging.getLogger(__name__)

# Why recently closed sessions are gone, for the model that calls one again; older ones are forgotten.
_REMEMBERED_CLOSES = 1024

# Workspace size in KiB, then the memory the sandbox's cgroup charges (v2, then v1), when it is visible inside.
_USAGE = (
    "du -sk /workspace 2>/dev/null | cut -f1; "
    "cat /sys/fs/cgroup/memory.current 2>/dev/null || cat /sys/fs/cgroup/memory/memory.usage_in_bytes 2>/dev/null"
)


@dataclass
class Session:
    id: str
    language: Language
    libraries: list[str]
    lease: Lease
    owner: str = ""
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    cell: Cell = field(default_factory=Cell)
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    # The session's egress proxy and the relay to it in its sandbox, when it was given hosts.
    egress: EgressListener | None = None
    relay: Relay | None = None
    # The secrets it was given (their values stay in this process).
    secrets: SecretRoutes | None = None
    # Hosts asked for at run time (request_network): the decisions, and the question waiting.
    asks: NetworkAsks = field(default_factory=NetworkAsks.empty)

    def describe(self) -> dict[str, object]:
        now = time.monotonic()
        limits = self.lease.ref.spec.limits
        return {
            "session_id": self.id,
            "language": self.language.name,
            "libraries": self.libraries,
            "age_s": round(now - self.created, 1),
            "idle_s": round(now - self.last_used, 1),
            "calls": self.cell.number,
            "memory_limit_bytes": limits.memory_bytes,
            "cpus": limits.cpus,
            "network": EGRESS_NETWORK if self.egress is not None else limits.network_mode,
            "allowed_hosts": self.egress.policy.summary() if self.egress is not None else [],
            "secrets": [binding.spec.name for binding in self.secrets.bindings] if self.secrets is not None else [],
            "network_requests": self.asks.lines(),
        }


class SessionRegistry:
    """Live sessions of this server. Expired ones are closed by `reap`, all of them by `aclose`."""

    def __init__(self, settings: Settings, executor: Executor) -> None:
        self.settings = settings
        self.executor = executor
        self._sessions: dict[str, Session] = {}
        self._creating: dict[str, int] = {}
        # Why a recently closed session is gone, with its owner: told to that owner only.
        self._why_gone: dict[str, tuple[str, str]] = {}
        self.secrets = SessionSecrets(settings)
        # The operator's ceiling (SANDBOX_SESSION_ALLOW_HOSTS), parsed once: every session call reads it.
        self._ceiling = ceiling_rules(settings.sandbox_session_allow_hosts)

    async def create(
        self,
        language: str,
        libraries: list[str],
        memory: str | None = None,
        cpus: float | None = None,
        network: bool | list[str] = False,
        live: Live | None = None,
        secrets: list[str] | None = None,
        *,
        owner: str = "",
        owner_quota: tuple[int, str] | None = None,
    ) -> Session:
        """A new session for `owner`; `owner_quota` is the most sessions one owner may hold and the setting
        that says so (none over stdio, where the server-wide maximum is the owner's)."""
        lang = get_language(language)
        specs = lang.check_libraries(libraries)
        if len(self._sessions) + sum(self._creating.values()) >= self.settings.sandbox_max_sessions:
            raise InvalidRequest(
                f"The maximum of {self.settings.sandbox_max_sessions} sessions (SANDBOX_MAX_SESSIONS) is open; "
                "close one with close_session (list_sessions shows them)"
            )
        if owner_quota is not None:
            most, setting = owner_quota
            if len(self.list(owner)) + self._creating.get(owner, 0) >= most:
                raise InvalidRequest(
                    f"You have the maximum of {most} sessions open that this server allows each user ({setting}); "
                    "close one with close_session (list_sessions shows yours)"
                )
        limits = self._limits(memory, cpus, network is True)
        policy = self._egress(network) if isinstance(network, list) and self._proxied(network) else None
        # In a thread: a value may come from a command (a secret manager's client) that takes its time.
        routes = await anyio.to_thread.run_sync(self.secrets.bind, secrets, policy) if secrets else None
        session_id = new_id("s", 8, self.settings.sandbox_http_replica_id)
        self._creating[owner] = self._creating.get(owner, 0) + 1
        listener = open_listener(policy, f"session {session_id}", routes) if policy is not None else None
        env = placeholders_env(routes) if routes is not None else None
        try:
            lease = await self.executor.open(
                lang, specs, limits, live, egress=listener is not None, env=env, owner=owner
            )
            if routes is not None:
                await self._trust(lease, routes)
        except BaseException:
            if listener is not None:
                with anyio.CancelScope(shield=True):
                    await listener.aclose()
            raise
        finally:
            self._creating[owner] -= 1
            if not self._creating[owner]:
                del self._creating[owner]
        session = Session(
            id=session_id, language=lang, libraries=specs, lease=lease, owner=owner, egress=listener, secrets=routes
        )
        self._sessions[session.id] = session
        given = f" with secrets {', '.join(b.spec.name for b in routes.bindings)}" if routes is not None else ""
        logger.info("Session %s (%s) created%s", session.id, lang.name, given)
        return session

    async def _trust(self, lease: Lease, routes: SecretRoutes) -> None:
        """The proxy's CA into the sandbox; the sandbox is closed again when it cannot take it."""
        try:
            await self.executor.trust(lease, TRUST_SCRIPT, routes.authority.certificate_pem)
        except BaseException:
            await self.executor.close(lease)
            raise

    def _proxied(self, wanted: list[str]) -> bool:
        """Whether a session asking for `wanted` gets a proxy: any host, or none yet (`[]`, to ask for hosts
        later with request_network) where the operator lists hosts and the engine reaches the proxy."""
        return bool(wanted) or self._hosts_can_be_asked()

    def _hosts_can_be_asked(self) -> bool:
        """Whether sessions here may ever be given hosts: the operator lists some, and the engine's sandboxes
        reach the proxy."""
        return bool(self._ceiling) and self.executor.reaches_egress_proxy

    def _egress(self, wanted: list[str]) -> EgressPolicy:
        """The hosts a session asked for, each within SANDBOX_SESSION_ALLOW_HOSTS; explicit where the operator
        named that very host (then reached wherever it resolves), else public addresses only."""
        if not self.executor.reaches_egress_proxy:
            raise InvalidRequest(
                f"Sessions on {self.executor.engine} cannot be given hosts: its sandboxes cannot reach the "
                "server's egress proxy"
            )
        allowed = self._ceiling
        if not allowed:
            raise InvalidRequest(
                "This server lets sessions reach no hosts (the operator lists the hosts sessions may ask for in "
                f"{SESSION_SETTING}); install packages with the `libraries` argument instead"
            )
        rules: list[HostRule] = []
        for entry in wanted:
            try:
                rule = within_ceiling(entry, allowed)
            except InvalidRequest as exc:
                raise InvalidRequest(f"network: {exc}") from None
            if rule is None:
                raise InvalidRequest(
                    f"network: {entry!r} is not within the hosts this server allows sessions ({SESSION_SETTING}: "
                    f"{', '.join(rule.display() for rule in allowed)})"
                )
            rules.append(rule)
        return EgressPolicy.of(rules, SESSION_SETTING)

    def network_question(self, session_id: str, host: str, reason: str, owner: str = "") -> str | None:
        """What to ask the person before `request_network`, or None when nothing is to be asked. Never raises."""
        session = self._sessions.get(session_id)
        if session is None or session.owner != owner or session.egress is None:
            return None
        return question_for(session.id, session.language.name, session.egress, host, reason, self._ceiling)

    async def ask_person(self, session_id: str, message: str, ask: Ask, owner: str = "") -> Reply:
        """Ask the person `message` (from `network_question`) for a session, one question at a time."""
        return await ask_once(self.get(session_id, owner).asks, ask, message)

    async def request_network(
        self, session_id: str, host: str, reason: str, reply: Reply | None, owner: str = ""
    ) -> NetworkDecision:
        """A host for an open session's proxy, within the operator's ceiling, when the person (`reply`; None
        where the client cannot ask: then the operator's setting) allows it. Raises what the caller can fix."""
        session = self.get(session_id, owner)
        if session.egress is None:
            raise InvalidRequest(
                f"Session {session.id} has no proxy to allow hosts through: it was created without network=[...]. "
                "Create a session with network=[] (or the hosts it needs) to ask for hosts later"
                if self._hosts_can_be_asked()
                else f"This server lets sessions reach no hosts ({SESSION_SETTING} is unset, or sessions on "
                f"{self.executor.engine} cannot reach the server's proxy)"
            )
        decision = decide(
            session.id,
            session.egress,
            session.asks,
            host,
            reason,
            self._ceiling,
            reply,
            self.settings.sandbox_session_grant_unasked,
        )
        if session.id not in self._sessions:
            raise self._gone(session.id, owner)
        return decision

    def _limits(self, memory: str | None, cpus: float | None, network: bool) -> Limits:
        limits = self.executor.limits
        if memory is not None:
            try:
                wanted = parse_size(memory)
            except ValueError as exc:
                raise InvalidRequest(f"memory {memory!r}: {exc}") from None
            ceiling = self.settings.sandbox_session_max_memory
            if wanted < MIN_MEMORY:
                raise InvalidRequest(f"memory {memory!r} is below the minimum of {MIN_MEMORY // 1024**2} MiB")
            if wanted > ceiling:
                raise InvalidRequest(
                    f"memory {memory!r} is above the operator's maximum of {ceiling} bytes (SANDBOX_SESSION_MAX_MEMORY)"
                )
            limits = replace(limits, memory_bytes=wanted)
        if cpus is not None:
            if not MIN_CPUS <= cpus <= self.settings.sandbox_session_max_cpus:
                raise InvalidRequest(
                    f"cpus must be at least {MIN_CPUS:g} and at most {self.settings.sandbox_session_max_cpus:g} "
                    "(SANDBOX_SESSION_MAX_CPUS)"
                )
            limits = replace(limits, cpus=cpus)
        if network:
            mode = self.settings.sandbox_session_network_mode
            if mode is None:
                raise InvalidRequest(
                    "This server does not give sessions network access (the operator can allow it with "
                    "SANDBOX_SESSION_NETWORK_MODE); install packages with the `libraries` argument instead"
                )
            limits = replace(limits, network_mode=mode)
        return limits

    def get(self, session_id: str, owner: str = "") -> Session:
        """The session, if `owner` owns it; anyone else's is as unknown as one that never existed."""
        session = self._sessions.get(session_id)
        if session is None or session.owner != owner:
            raise self._gone(session_id, owner)
        return session

    def _gone(self, session_id: str, owner: str) -> SandboxNotFound:
        closer, why = self._why_gone.get(session_id, (owner, ""))
        if closer != owner or not why:
            why = "this server has no session with that id (none survive a restart)"
        return SandboxNotFound(
            f"Session {session_id!r} is gone: {why}. Create a new one with create_session; "
            "none of its variables or files are kept."
        )

    def list(self, owner: str = "") -> list[Session]:
        """`owner`'s sessions, oldest first."""
        return sorted((s for s in self._sessions.values() if s.owner == owner), key=lambda session: session.created)

    async def close(self, session_id: str, why: str = "it was closed", owner: str = "") -> None:
        """Close a session; closing one that is already closed is not an error (an unknown id is)."""
        gone = self._why_gone.get(session_id)
        if gone is not None and gone[0] == owner:
            return
        self.get(session_id, owner)
        await self._discard(session_id, why)

    async def _discard(self, session_id: str, why: str) -> None:
        """Remove a session and its sandbox, if it is still there. Never raises: the reaper and shutdown call it."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        self._why_gone[session_id] = (session.owner, why)
        while len(self._why_gone) > _REMEMBERED_CLOSES:
            del self._why_gone[next(iter(self._why_gone))]
        try:
            if session.relay is not None:
                await session.relay.aclose()
            await self.executor.close(session.lease)
        except Exception:
            logger.exception("Could not remove the sandbox of session %s", session_id)
        if session.egress is not None:
            with anyio.CancelScope(shield=True):
                await session.egress.aclose()
        logger.info("Session %s closed: %s", session_id, why)

    def prepare(
        self, session_id: str, code: str, libraries: list[str], timeout: float | None, owner: str = ""
    ) -> Program:
        """Validate a cell for a session before it runs (or is queued as a job). Raises what the caller can fix."""
        session = self.get(session_id, owner)
        program = self.executor.program(code, session.language.name, libraries, timeout, owner)
        missing = sorted(set(program.libraries) - set(session.libraries))
        if missing:
            raise InvalidRequest(
                f"Session {session.id} was created with libraries {session.libraries or '[]'}; "
                f"{', '.join(missing)} must be given to create_session (sessions have no network to install later)"
            )
        return program

    async def execute(
        self, session_id: str, code: str, libraries: list[str], timeout: float | None, live: Live | None = None
    ) -> Execution:
        """Run a cell: one at a time per session, in its sandbox, with its interpreter's state.

        A cancelled cell ends as if interrupted at its timeout, and the session takes the next one."""
        return await self.run_cell(session_id, self.prepare(session_id, code, libraries, timeout), live)

    async def run_cell(self, session_id: str, program: Program, live: Live | None = None, owner: str = "") -> Execution:
        """`execute` for a cell already validated (`prepare`)."""
        session = self.get(session_id, owner)
        live = live or Live()
        if session.secrets is not None:
            live.secrets = tuple(value.encode() for value in session.secrets.values())
        live.phase = "waiting for the session's previous call" if session.lock.locked() else "queued"
        async with session.lock, self.executor.limiter:
            if session.id not in self._sessions:
                raise self._gone(session.id, owner)
            window = session.egress.watch() if session.egress is not None else None
            try:
                await self._relay(session)
                execution = await self.executor.run(session.lease, program, session.cell, live)
            except SandboxError as exc:  # its message may quote the sandbox's output
                exc.args = (redact_text(str(exc), session.secrets),)
                raise
            finally:
                session.last_used = time.monotonic()
                if session.egress is not None:
                    session.egress.window = None
        execution.session_id = session.id
        if window is not None:
            execution.network_refused = refusal_lines(window, self._ceiling)
        return execution if session.secrets is None else redact_execution(execution, session.secrets)

    async def _relay(self, session: Session) -> None:
        """Have the relay to the session's proxy running (a timeout's kill, or the code, may have ended it)."""
        if session.egress is None or (session.relay is not None and await relay_alive(session.relay)):
            return
        if session.relay is not None:
            await session.relay.aclose()
            session.relay = None
        try:
            session.relay = await self.executor.relay(session.lease, session.egress)
        except SandboxFailure as exc:
            logger.warning("Session %s has no egress relay: %s", session.id, exc)

    async def reap(self) -> int:
        """Close sessions past their idle TTL, and those past their maximum lifetime even mid-call; return how many."""
        now = time.monotonic()
        idle, most = self.settings.sandbox_session_idle_ttl, self.settings.sandbox_session_max_lifetime
        expired: list[tuple[str, str]] = []
        for session in self._sessions.values():
            if now - session.created > most:
                expired.append((session.id, f"it reached its maximum lifetime of {duration(most)}"))
            elif not session.lock.locked() and now - session.last_used > idle:
                expired.append((session.id, f"it expired after {duration(idle)} idle"))
        for session_id, why in expired:
            await self._discard(session_id, why)
        return len(expired)

    async def usage(self, session: Session) -> dict[str, int | None]:
        """What a session uses now: workspace bytes and, where the sandbox sees its cgroup, memory bytes."""
        unknown: dict[str, int | None] = {"workspace_bytes": None, "memory_bytes": None}
        if session.lock.locked():
            return unknown
        # Bounded: the session's own code may stop (SIGSTOP) or starve the reading, which then has no numbers.
        try:
            result = await self.executor.inspect(session.lease, ["sh", "-c", _USAGE], timeout=10, output_limit=256)
        except SandboxFailure as exc:
            logger.info("No usage reading of session %s: %s", session.id, exc)
            return unknown
        if result.timed_out:
            logger.info("No usage reading of session %s: it did not answer within 10 s", session.id)
            return unknown
        values = result.stdout.decode("ascii", errors="replace").split()
        workspace = int(values[0]) * 1024 if values and values[0].isdigit() else None
        memory = int(values[1]) if len(values) > 1 and values[1].isdigit() else None
        return {"workspace_bytes": workspace, "memory_bytes": memory}

    async def run_reaper(self) -> None:
        while True:
            await anyio.sleep(min(30.0, self.settings.sandbox_session_idle_ttl / 2))
            try:
                await self.reap()
            except Exception:  # background work never ends the server
                logger.exception("Could not close expired sessions")

    async def aclose(self) -> None:
        # In parallel: each removal is an engine round trip, and shutdown waits for all of them.
        async with anyio.create_task_group() as closing:
            for session_id in list(self._sessions):
                closing.start_soon(self._discard, session_id, "the server shut down")
