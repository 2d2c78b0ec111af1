"""A host asked for an open session at run time (`request_network`), and the refusals a call reports.

The operator's ceiling (SANDBOX_SESSION_ALLOW_HOSTS) is never crossed: a host outside it is refused at once and
the person is never asked. Inside it, the person decides through the client (MCP elicitation); a client that
cannot ask leaves the decision to SANDBOX_SESSION_GRANT_UNASKED (default: refused). One question waits per
session at a time, so a flood of requests cannot queue questions or hold more than one waiting call's state.
What the model gives as the reason is untrusted text: it is shown and logged only with control characters
escaped, and cut to a bounded length.
"""

from __future__ import annotations

import logging
import time
import unicodedata
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Literal

import anyio

from llm_sandbox_mcp.egress.policy import EgressPolicy, Refusal
from llm_sandbox_mcp.egress.proxy import EgressListener, RefusalWindow
from llm_sandbox_mcp.errors import InvalidRequest
from llm_sandbox_mcp.host_rules import HostRule

logger = logging.getLogger(__name__)

SESSION_SETTING = "SANDBOX_SESSION_ALLOW_HOSTS"
UNASKED_SETTING = "SANDBOX_SESSION_GRANT_UNASKED"
MAX_REASON = 500  # characters the tool accepts; the person and the log see at most SHOWN_REASON of them
SHOWN_REASON = 300
MAX_HOST = 260
# How long a question waits for the person before it counts as unanswered (refused).
ASK_SECONDS = 300.0
# Decisions a session keeps for its description, and logs; past them, only a count.
KEPT_DECISIONS = 20
LOGGED_DECISIONS = 100

Answer = Literal["accept", "decline", "cancel"]
# Asks the person (the message is all they see) and waits for the answer.
Ask = Callable[[str], Awaitable[Answer]]
# What came of asking: the person's answer, or why there is none. None where the client cannot ask.
Reply = Literal["accept", "decline", "cancel", "unanswered", "busy"]
Outcome = Literal[
    "granted",  # the person accepted
    "granted-unasked",  # the client cannot ask, and the operator lets such hosts through
    "already-allowed",
    "declined",
    "cancelled",
    "unanswered",  # no answer in time, or the client failed to ask
    "outside-ceiling",
    "no-elicitation",  # the client cannot ask, and the operator's setting refuses
    "busy",  # another question for this session is waiting
]
GRANTED: frozenset[Outcome] = frozenset({"granted", "granted-unasked", "already-allowed"})


def shown(text: str, limit: int = SHOWN_REASON) -> str:
    """`text` safe for one line of a log or a prompt: control, format and unassigned characters escaped (newlines,
    ANSI escapes, bidirectional overrides), cut to `limit` characters."""
    safe = "".join(
        char.encode("unicode_escape").decode("ascii") if unicodedata.category(char).startswith("C") else char
        for char in text[: limit + 1]
    )
    return safe if len(safe) <= limit and len(text) <= limit else safe[:limit] + "…"


@dataclass(frozen=True)
class NetworkDecision:
    """One answer to a request for a host: what was asked, the outcome, and the line that says so."""

    host: str
    outcome: Outcome
    reason: str  # as shown: escaped and cut
    at: float
    message: str

    @property
    def granted(self) -> bool:
        return self.outcome in GRANTED

    def line(self) -> str:
        clock = time.strftime("%H:%M:%SZ", time.gmtime(self.at))
        return f"{clock} {self.outcome} {self.host} (reason: {self.reason})"


def ceiling_rules(entries: Iterable[str]) -> list[HostRule]:
    return [HostRule.parse(entry, explicit=True) for entry in entries]


def within_ceiling(entry: str, ceiling: list[HostRule]) -> HostRule | None:
    """The rule for `entry` (host, host:port or *.domain) if the ceiling covers it, explicit where the operator
    named that very host; None when it is outside. Raises InvalidRequest for a malformed entry."""
    try:
        rule = HostRule.parse(entry, explicit=False)
    except ValueError as exc:
        raise InvalidRequest(f"{exc}; give a host name, host:port or *.domain (no scheme, user or path)") from None
    within = [
        operator
        for operator in ceiling
        if rule.ports <= operator.ports
        and (operator.covers(rule.name) or (rule.wildcard and operator.wildcard and operator.name == rule.name))
    ]
    if not within:
        return None
    return replace(rule, explicit=not rule.wildcard and any(operator.explicit for operator in within))


def covered(policy: EgressPolicy, rule: HostRule) -> bool:
    """Whether `policy` already lets through everything `rule` would."""
    return any(
        rule.ports <= have.ports
        and (have.covers(rule.name) if not rule.wildcard else have.wildcard and have.name == rule.name)
        and (have.explicit or not rule.explicit)
        for have in policy.rules
    )


def question(session_id: str, language: str, rule: HostRule, reason: str) -> str:
    return (
        f"Sandbox session {session_id} ({language}) asks to reach {rule.display()} through its proxy, for this "
        f"session only (ports {', '.join(map(str, sorted(rule.ports)))}).\n"
        f"Reason given by the AI model (not verified): {reason}\n"
        "Accept to allow it until the session ends; decline to keep it refused."
    )


@dataclass
class NetworkAsks:
    """One session's requests for hosts: the question waiting, and the decisions made."""

    decisions: list[NetworkDecision]
    count: int = 0
    asking: bool = False

    @classmethod
    def empty(cls) -> NetworkAsks:
        return cls([])

    def record(self, session_id: str, decision: NetworkDecision) -> NetworkDecision:
        self.count += 1
        self.decisions.append(decision)
        del self.decisions[:-KEPT_DECISIONS]
        if self.count <= LOGGED_DECISIONS:
            logger.warning(
                "Session %s network request for %s: %s (reason: %s)",
                session_id,
                decision.host,
                decision.outcome,
                decision.reason,
            )
        if self.count == LOGGED_DECISIONS:
            logger.warning("Session %s: further network requests are not logged", session_id)
        return decision

    def lines(self) -> list[str]:
        earlier = self.count - len(self.decisions)
        return ([f"{earlier} earlier decisions not kept"] if earlier else []) + [d.line() for d in self.decisions]


def question_for(
    session_id: str, language: str, listener: EgressListener, host: str, reason: str, ceiling: list[HostRule]
) -> str | None:
    """What to ask the person about `host`, or None when there is nothing to ask (a malformed host, one
    outside the ceiling, or one the session has): `decide` then answers without them. Never raises."""
    try:
        rule = within_ceiling(host, ceiling) if len(host) <= MAX_HOST else None
    except InvalidRequest:
        return None
    if rule is None or covered(listener.policy, rule):
        return None
    return question(session_id, language, rule, shown(reason))


async def ask_once(asks: NetworkAsks, ask: Ask, message: str) -> Reply:
    """Ask, unless a question for this session is waiting already; no answer within ASK_SECONDS, or the
    client failing to ask, is `unanswered`."""
    if asks.asking:
        return "busy"
    asks.asking = True
    try:
        with anyio.move_on_after(ASK_SECONDS):
            return await ask(message)
    except Exception as exc:  # the client's failure to ask is a refusal, never the server's end
        logger.warning("Asking the person failed: %s", shown(str(exc)))
    finally:
        asks.asking = False
    return "unanswered"


def decide(
    session_id: str,
    listener: EgressListener,
    asks: NetworkAsks,
    host: str,
    reason: str,
    ceiling: list[HostRule],
    reply: Reply | None,
    grant_unasked: bool,
) -> NetworkDecision:
    """Decide on `host` for one session given what the person replied (None: the client cannot ask), and
    apply a grant to the session's proxy (live). Raises InvalidRequest for a malformed host."""
    if len(host) > MAX_HOST:
        raise InvalidRequest(f"host is {len(host)} characters long; a host name has at most 253")
    said = shown(reason)
    rule = within_ceiling(host, ceiling)
    name = rule.display() if rule is not None else shown(host.strip().lower(), MAX_HOST)

    def decided(outcome: Outcome, message: str) -> NetworkDecision:
        return asks.record(session_id, NetworkDecision(name, outcome, said, time.time(), message))

    if rule is None:
        listed = ", ".join(operator.display() for operator in ceiling) or "none"
        return decided(
            "outside-ceiling",
            f"{name} is outside the hosts this server lets sessions have ({SESSION_SETTING}: {listed}); "
            "only the operator can widen that, and the person was not asked",
        )
    if covered(listener.policy, rule):
        return decided("already-allowed", f"Session {session_id} may already reach {name}")
    if reply == "busy":
        return decided(
            "busy", f"Another request for session {session_id} is waiting for the person's answer; ask after it"
        )
    if reply is None:
        if not grant_unasked:
            return decided(
                "no-elicitation",
                f"{name} was not allowed: this client cannot ask the person (no MCP elicitation), and the operator "
                f"has not let such requests through ({UNASKED_SETTING})",
            )
        listener.allow(rule)
        return decided("granted-unasked", f"Session {session_id} may now reach {name} ({UNASKED_SETTING})")
    if asks.count < LOGGED_DECISIONS:
        logger.warning("Session %s network request for %s: asked the person (reason: %s)", session_id, name, said)
    if reply == "accept":
        if listener.closed:
            return decided("unanswered", f"Session {session_id} was closed while the person was asked")
        listener.allow(rule)
        return decided("granted", f"The person allowed {name} for session {session_id}; it is reachable now")
    if reply == "decline":
        return decided("declined", f"The person declined {name} for session {session_id}; it stays refused")
    if reply == "cancel":
        return decided("cancelled", f"The person dismissed the question; {name} stays refused")
    return decided("unanswered", f"The person did not answer; {name} stays refused")


def refusal_lines(window: RefusalWindow, ceiling: list[HostRule]) -> list[str]:
    """A call's refusals, one line each (host:port and why, and whether asking could help), then how many more."""

    def hint(refusal: Refusal) -> str:
        if not refusal.settable:
            return ""
        try:
            inside = within_ceiling(
                f"[{refusal.host}]:{refusal.port}" if ":" in refusal.host else f"{refusal.host}:{refusal.port}", ceiling
            )
        except InvalidRequest:
            inside = None
        if inside is not None:
            return "; request_network can ask the person for it"
        return f"; outside {SESSION_SETTING}"

    lines = [f"{r.host}:{r.port} refused: {r.reason}{hint(r)}" for r in window.shown]
    if window.left_out:
        lines.append(f"{window.left_out} more refused connections not listed")
    return lines
