"""The library cache: libraries installed once, in a sandbox of their own, into a store keyed by what they are.

The install runs in a short-lived sandbox whose only way out is the egress proxy, allowing the registries of
its language (SANDBOX_INSTALL_NETWORK_MODE opens another network, explicitly); the sandboxes that run user
code mount the finished store read-only and never get network.

Every store has an owner: the principal whose call installed it. Over stdio there is one ("" here), whose keys
are what they always were; a principal named over HTTP has keys of their own (the name is part of what the key
hashes, so it never becomes a path or a volume name), so no one else's call reuses, mounts or evicts their
stores, and their stores together stay within SANDBOX_HTTP_MAX_CACHE_BYTES_PER_PRINCIPAL.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

import anyio

from llm_sandbox_mcp.backends import Backend, stop_on_cancel
from llm_sandbox_mcp.cache_index import CacheEntry, CacheIndex, over_total
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.egress.policy import EgressPolicy
from llm_sandbox_mcp.egress.proxy import EgressListener, open_listener
from llm_sandbox_mcp.egress.registries import (
    DEFAULT_REGISTRY_COMMANDS,
    INSTALL_SETTING,
    configured_rules,
    url_rules,
)
from llm_sandbox_mcp.egress.relay import Relay, proxy_env, start_relay
from llm_sandbox_mcp.egress.tunnel import Tunnels
from llm_sandbox_mcp.errors import InstallFailed, SandboxFailure
from llm_sandbox_mcp.host_rules import HostRule
from llm_sandbox_mcp.images import run_image
from llm_sandbox_mcp.languages import LANGUAGES, Language, install_env, sandbox_env
from llm_sandbox_mcp.models import (
    EGRESS_NETWORK,
    LIBS_DIR,
    CacheMount,
    ExecResult,
    Limits,
    SandboxRef,
    SandboxSpec,
)
from llm_sandbox_mcp.run.budget import MemoryBudget
from llm_sandbox_mcp.run.transfer import pack

logger = logging.getLogger(__name__)

_COMPLETE = f"{LIBS_DIR}/.complete"
# How often a store in use is marked used in the index, and how long this server trusts it is still there.
_TOUCH_SECONDS = 60.0
_RECHECK_SECONDS = 3600.0
# How often a running installer's store is measured: what it may write past the limit is what it writes
# in this time.
_WATCH_SECONDS = 2.0
_CA_NAME = "llm-sandbox-ca.pem"
_CA_FILE = f"/tmp/{_CA_NAME}"
# Every installer we run honours one of these for extra trusted certificates (TLS-inspecting proxies).
_CA_VARIABLES = (
    "SSL_CERT_FILE",
    "PIP_CERT",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
)


QUOTA_SETTING = "SANDBOX_HTTP_MAX_CACHE_BYTES_PER_PRINCIPAL"


@dataclass(frozen=True)
class _Bound:
    """The most bytes a store may take, the setting that says so, and what that setting bounds (for errors)."""

    size: int
    setting: str
    what: str

    def said(self) -> str:
        return f"the limit of {self.size // 1024**2} MiB {self.what} ({self.setting})"


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _refusals(listener: EgressListener | None) -> str:
    """The hosts the proxy refused this installer (and the setting that allows them) or could not reach, for
    the install error."""
    if listener is None:
        return ""
    said = ""
    if listener.refused:
        refused = "; ".join(refusal.message(INSTALL_SETTING) for refusal in listener.refused[:5])
        said += f"The installer's egress proxy refused: {refused}. "
    if listener.unreachable:
        said += f"The installer's egress proxy could not reach: {'; '.join(listener.unreachable[:5])}. "
    return said


def installer_policy(settings: Settings, lang: Language) -> EgressPolicy:
    """What the operator configured for an installer of `lang`: its registry settings and extra hosts."""
    rules = configured_rules(install_env(lang, settings), settings.sandbox_install_allow_hosts)
    return EgressPolicy.of(rules, INSTALL_SETTING)


def needs_defaults(settings: Settings, lang: Language) -> bool:
    """Whether an installer of `lang` also uses registries no setting names (the image toolchain's defaults)."""
    configured = install_env(lang, settings)
    unset = not lang.registry_env or not all(variable in configured for variable in lang.registry_env)
    return lang.name in DEFAULT_REGISTRY_COMMANDS and unset


def egress_report(settings: Settings, install_network: str) -> list[str]:
    """`doctor`'s lines: what each kind of sandbox may reach with these settings on this engine."""
    lines = [f"code sandboxes: network {settings.sandbox_network_mode!r} (SANDBOX_NETWORK_MODE)"]
    if install_network == EGRESS_NETWORK:
        lines.append(
            "path to the proxy: a tunnel over the relay's own stream to the server (the sandbox has no network, "
            "and nothing of the server's filesystem is mounted)"
        )
    network = settings.sandbox_install_network_mode or install_network
    if network != EGRESS_NETWORK:
        origin = "SANDBOX_INSTALL_NETWORK_MODE" if settings.sandbox_install_network_mode else "this engine's"
        lines.append(f"installers: network {network!r} ({origin}), not filtered by the egress proxy")
    else:
        for lang in LANGUAGES.values():
            hosts = installer_policy(settings, lang).summary()
            if needs_defaults(settings, lang):
                hosts.append(f"the image's {lang.package_manager} defaults (public addresses)")
            lines.append(f"{lang.name} installer: through the egress proxy to {', '.join(hosts) or 'no host'}")
    allowed = ", ".join(settings.sandbox_session_allow_hosts)
    lines.append(
        f"sessions: network=[hosts] within {allowed} (SANDBOX_SESSION_ALLOW_HOSTS)"
        if allowed and install_network == EGRESS_NETWORK
        else "sessions: network=[hosts] refused (SANDBOX_SESSION_ALLOW_HOSTS unset, or this engine has no proxy)"
    )
    mode = settings.sandbox_session_network_mode
    lines.append(
        f"sessions: network=true gives network {mode!r} unfiltered (SANDBOX_SESSION_NETWORK_MODE)"
        if mode
        else "sessions: network=true refused (SANDBOX_SESSION_NETWORK_MODE unset)"
    )
    return lines


class LibraryCache:
    """Library stores on one backend; each is installed at most once per server."""

    def __init__(
        self, settings: Settings, backend: Backend, limits: Limits, budget: MemoryBudget, tunnels: Tunnels
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.limits = limits
        self.budget = budget
        self.tunnels = tunnels
        self._locks: defaultdict[str, anyio.Lock] = defaultdict(anyio.Lock)
        # Store -> when this server last found it complete (monotonic); rechecked after a while, since a
        # server elsewhere on this host may have evicted it meanwhile.
        self._ready: dict[str, float] = {}
        self._touched: dict[str, float] = {}
        self.index = CacheIndex()
        # The image a language's installs and runs use now (the executor's: its base image while the project
        # image is built in the background).
        self.image_of: Callable[[str], str] = lambda language: run_image(settings, language)

    def needed(self, lang: Language, specs: list[str]) -> bool:
        """Whether a run of `lang` with `specs` mounts a store (Go builds one even without libraries)."""
        return bool(specs) or lang.warm_cache

    def network(self) -> str:
        """The installer's network: as configured, else what this engine offers installers (EGRESS_NETWORK: no
        network but the proxy)."""
        return self.settings.sandbox_install_network_mode or self.backend.install_network

    def key(self, lang: Language, specs: list[str], owner: str = "") -> str:
        """Language, image, specs, the registry they come from and the installer: a different mirror, or an
        installer that writes another store (a new release's), is a different cache. A named `owner` is hashed
        in too (stdio's, "", is not: its keys stay those its stores were made under)."""
        registry = sorted(install_env(lang, self.settings).items())
        installer = hashlib.sha256(json.dumps(lang.install_argv(specs)).encode()).hexdigest()
        parts: list[object] = [lang.name, self.image_of(lang.name), specs, registry, installer]
        if owner:
            parts.append({"owner": owner})
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]

    def quota(self, owner: str) -> int | None:
        """The most bytes `owner`'s stores may hold together: none of its own for stdio's one principal (the
        total is its bound)."""
        return self.settings.sandbox_http_max_cache_bytes_per_principal if owner else None

    def _bound(self, owner: str) -> _Bound:
        """What one store of `owner`'s may take: SANDBOX_CACHE_MAX_SIZE, or the owner's quota when smaller."""
        quota = self.quota(owner)
        if quota is not None and quota < self.settings.sandbox_cache_max_size:
            return _Bound(quota, QUOTA_SETTING, "of library caches each user may hold")
        return _Bound(self.settings.sandbox_cache_max_size, "SANDBOX_CACHE_MAX_SIZE", "for one library set")

    async def ensure(self, lang: Language, specs: list[str], owner: str = "") -> str:
        """Install `specs` for `owner` unless their store is complete; return the store's key."""
        key = self.key(lang, specs, owner)
        async with self._locks[key]:
            now = time.monotonic()
            if now - self._ready.get(key, -_RECHECK_SECONDS) < _RECHECK_SECONDS:
                if now - self._touched.get(key, 0.0) > _TOUCH_SECONDS:
                    self._touched[key] = now
                    await anyio.to_thread.run_sync(self.index.touch, self.backend.name, key)
                return key
            await self._check_room(key, owner)
            network = self.network()
            install_limits = replace(
                self.limits,
                network_mode="none" if network == EGRESS_NETWORK else network,
                memory_bytes=max(self.limits.memory_bytes, 2 * 1024**3),
                tmp_bytes=max(self.limits.tmp_bytes, 2 * 1024**3),
                pids=max(self.limits.pids, 512),
                cpus=max(self.limits.cpus, 2.0),
            )
            listener = (
                open_listener(installer_policy(self.settings, lang), f"the {lang.title} installer")
                if (network == EGRESS_NETWORK)
                else None
            )
            try:
                spec = SandboxSpec(
                    self.image_of(lang.name),
                    install_limits,
                    CacheMount(key, writable=True),
                    egress=listener is not None,
                )
                with self.budget.held(install_limits.memory_bytes, "a library installer"):
                    size = await self._install_in_sandbox(spec, lang, specs, key, listener, self._bound(owner))
            finally:
                if listener is not None:
                    with anyio.CancelScope(shield=True):
                        await listener.aclose()
            entry = CacheEntry(self.backend.name, key, lang.name, tuple(specs), size, time.time(), owner)
            await anyio.to_thread.run_sync(self.index.record, entry)
            await self._evict(keep=key, owner=owner)
            self._ready[key] = self._touched[key] = time.monotonic()
            return key

    async def _check_room(self, key: str, owner: str) -> None:
        """Refuse before installing when `owner`'s stores used lately fill their quota already: none of them may
        go, so whatever the new set's size, its store would be removed again (and the installer's work lost)."""
        quota = self.quota(owner)
        if quota is None:
            return
        entries = await anyio.to_thread.run_sync(self.index.entries, self.backend.name)
        mine = [entry for entry in entries if entry.owner == owner]
        if any(entry.key == key for entry in mine):
            return  # installed already: its store is only checked
        recent_since = time.time() - self.settings.sandbox_session_max_lifetime
        held = sum(entry.size_bytes for entry in mine if entry.last_used >= recent_since)
        if held >= quota:
            hours = self.settings.sandbox_session_max_lifetime / 3600
            raise InstallFailed(
                f"Your library caches hold the {quota // 1024**2} MiB each user may hold on this server "
                f"({QUOTA_SETTING}) already, in library sets you used within the last {hours:g} h, which a live "
                f"session may still have mounted; nothing was installed. Use a set you installed before, or ask "
                f"the operator to raise {QUOTA_SETTING}"
            )

    async def _evict(self, keep: str, owner: str) -> None:
        """Least recently used stores of `owner` go until theirs fit their quota and this engine's all fit
        SANDBOX_CACHE_TOTAL_SIZE; never another principal's (each makes room in their own stores only), and
        never one used within a session's lifetime (a live session may have it mounted). When those alone leave
        no room (many library sets in a short time), the new store `keep` goes too, and the install fails
        naming the bound it would pass."""
        entries = await anyio.to_thread.run_sync(self.index.entries, self.backend.name)
        mine = [entry for entry in entries if entry.owner == owner]
        others = sum(entry.size_bytes for entry in entries if entry.owner != owner)
        total = self.settings.sandbox_cache_total_size
        quota = self.quota(owner)
        by_quota = quota is not None and quota < total - others
        room = quota if quota is not None and by_quota else total - others
        recent_since = time.time() - self.settings.sandbox_session_max_lifetime
        chosen = over_total(mine, room, keep, recent_since)
        for entry in chosen:
            logger.info(
                "Evicting library cache %s (%s, %d bytes): its owner's least recently used",
                entry.key,
                entry.language,
                entry.size_bytes,
            )
            await self._drop(entry)
        left = sum(entry.size_bytes for entry in mine if entry not in chosen)
        if left <= room:
            return
        new = [entry for entry in mine if entry.key == keep]
        for entry in new:
            await self._drop(entry)
        adding = sum(entry.size_bytes for entry in new) // 1024**2
        held = left - sum(entry.size_bytes for entry in new)
        hours = self.settings.sandbox_session_max_lifetime / 3600
        if by_quota:
            raise InstallFailed(
                f"Your library caches would pass the {room // 1024**2} MiB each user may hold on this server "
                f"({QUOTA_SETTING}): {held // 1024**2} MiB are library sets you used within the last {hours:g} h, "
                f"which a live session may still have mounted, and this set takes {adding} MiB more; its cache was "
                f"removed again. Use fewer or smaller libraries, or a set you installed before, or ask the "
                f"operator to raise {QUOTA_SETTING}"
            )
        theirs = ", and by other users' caches, which no one else's install evicts" if others else ""
        raise InstallFailed(
            f"The library caches on this engine are full: {(held + others) // 1024**2} MiB of "
            f"SANDBOX_CACHE_TOTAL_SIZE ({total // 1024**2} MiB) are held by library sets used within the last "
            f"{hours:g} h, which a live session may still have mounted{theirs}, and this set takes {adding} MiB "
            "more; its cache was removed again. `llm-sandbox-mcp cache prune` removes caches, or raise "
            "SANDBOX_CACHE_TOTAL_SIZE"
        )

    async def _drop(self, entry: CacheEntry) -> None:
        await self.backend.drop_cache(entry.key)
        await anyio.to_thread.run_sync(self.index.forget, entry.engine, entry.key)
        self._ready.pop(entry.key, None)

    async def _install_in_sandbox(
        self,
        spec: SandboxSpec,
        lang: Language,
        specs: list[str],
        key: str,
        listener: EgressListener | None,
        bound: _Bound,
    ) -> int:
        """Install (unless the store is complete already) and return the store's size in bytes."""
        try:
            ref = await self.backend.create(spec)
        except SandboxFailure as exc:
            if spec.egress:
                raise InstallFailed(
                    f"Could not start the library installer: {exc}. SANDBOX_INSTALL_NETWORK_MODE can give installers "
                    "a network this engine has instead, unfiltered (the installer runs the packages' own code)"
                ) from exc
            raise InstallFailed(
                f"Could not start the library installer: {exc}. Its network is "
                f"SANDBOX_INSTALL_NETWORK_MODE={spec.limits.network_mode!r}; set it to a network this engine "
                "has (e.g. 'host' when the engine has no bridge network)."
            ) from exc
        try:
            # Cancelled (the caller left): the installer is killed at once, and its half-written store dropped.
            await stop_on_cancel(self.backend, ref, lambda: self._install(ref, lang, specs, listener, bound))
            size = await self._final_size(ref, bound)
            if size > bound.size:
                raise InstallFailed(
                    f"{', '.join(specs)} take {size // 1024**2} MiB installed, above {bound.said()}; "
                    "install fewer or smaller libraries"
                )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.backend.destroy(ref)
                await self.backend.drop_cache(key)
            raise
        with anyio.CancelScope(shield=True):
            await self.backend.destroy(ref)
        return size

    async def _run_watched(
        self, ref: SandboxRef, argv: list[str], timeout: float, env: dict[str, str], bound: _Bound
    ) -> ExecResult | None:
        """The installer's result, or None when it was killed for growing its store past `bound`
        (measured every few seconds while it runs its packages' own code, not only once it ends)."""
        outgrown = False
        result: ExecResult | None = None

        async def watch() -> None:
            nonlocal outgrown
            while True:
                await anyio.sleep(_WATCH_SECONDS)
                if await self._size(ref) > bound.size:
                    outgrown = True
                    await self.backend.kill_all(ref)
                    return

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch)
            result = await self.backend.exec(ref, argv, timeout=timeout, env=env, output_limit=65536)
            tasks.cancel_scope.cancel()
        return None if outgrown else result

    async def _final_size(self, ref: SandboxRef, bound: _Bound) -> int:
        """Bytes in the store once the install is over, measured so that nothing of the packages' own code can
        make it look smaller: every process of the installer is killed first (none can stop `du` or write into
        its output), the store's modes are made normal (a directory its writer made unreadable hid what it
        holds, and could not be removed), and a measurement that fails counts as too big."""
        await self.backend.kill_all(ref)
        store = str(LIBS_DIR)
        # What is in the store, not the store itself (on Kubernetes a claim's root belongs to root).
        normal = ["find", store, "-mindepth", "1", "-maxdepth", "1", "-exec", "chmod", "-R", "u+rwX", "{}", "+"]
        opened = await self.backend.exec(ref, normal, timeout=120, output_limit=4096)
        measured, size = await self._measure(ref)
        if opened.exit_code != 0 or measured.exit_code != 0 or measured.timed_out or size is None:
            return bound.size + 1
        return size

    async def _size(self, ref: SandboxRef) -> int:
        """Bytes in the store while the installer runs (to stop it early; `_final_size` decides)."""
        _, size = await self._measure(ref)
        return size or 0

    async def _measure(self, ref: SandboxRef) -> tuple[ExecResult, int | None]:
        """`du` of the store, and the bytes it counted (None when it printed no number)."""
        result = await self.backend.exec(ref, ["du", "-sk", str(LIBS_DIR)], timeout=120, output_limit=4096)
        first = result.stdout.split(maxsplit=1)[0] if result.stdout.strip() else b""
        return result, int(first) * 1024 if first.isdigit() else None

    async def _install(
        self, ref: SandboxRef, lang: Language, specs: list[str], listener: EgressListener | None, bound: _Bound
    ) -> None:
        check = await self.backend.exec(ref, ["test", "-f", _COMPLETE], timeout=30)
        if check.exit_code == 0:
            return
        env = await self._env(ref, lang)
        timeout = self.settings.sandbox_install_timeout
        # A cache left half-written by an interrupted install is emptied first.
        await self.backend.exec(ref, ["find", str(LIBS_DIR), "-mindepth", "1", "-delete"], timeout=60)
        relay = await self._egress(ref, lang, env, listener) if listener is not None else None
        try:
            result = await self._run_watched(ref, lang.install_argv(specs), timeout, env, bound)
        finally:
            if relay is not None:
                await relay.aclose()
        if result is None:
            raise InstallFailed(
                f"Installing {', '.join(specs)} was stopped: its store grew past {bound.said()}; "
                "install fewer or smaller libraries"
            )
        if result.exit_code != 0 or result.timed_out:
            reason = f"timed out after {timeout:g} s (SANDBOX_INSTALL_TIMEOUT)" if result.timed_out else "failed"
            output = (_decode(result.stderr).strip() or _decode(result.stdout).strip())[-3000:]
            raise InstallFailed(
                f"Installing {', '.join(specs)} with {lang.package_manager} {reason}. "
                f"{_refusals(listener)}Check the names and versions. Installer output:\n{output}"
            )
        await self.backend.exec(ref, ["touch", _COMPLETE], timeout=30)

    async def _egress(self, ref: SandboxRef, lang: Language, env: dict[str, str], listener: EgressListener) -> Relay:
        """The installer's way out: its registries allowed, the relay to the proxy started, `env` pointed at it."""
        if needs_defaults(self.settings, lang):
            defaults = await self._default_rules(ref, lang, env)
            listener.policy = EgressPolicy.of([*listener.policy.rules, *defaults], INSTALL_SETTING)
        try:
            relay = await start_relay(self.backend, ref, listener, self.tunnels)
        except SandboxFailure as exc:
            raise InstallFailed(f"Could not start the library installer's network: {exc}") from exc
        env.update(proxy_env())
        return relay

    async def _default_rules(self, ref: SandboxRef, lang: Language, env: dict[str, str]) -> list[HostRule]:
        """The registries the image's toolchain uses where no setting names one (read before any package code
        runs); they reach public addresses only."""
        command = DEFAULT_REGISTRY_COMMANDS[lang.name]
        found = await self.backend.exec(ref, ["sh", "-c", command], timeout=60, env=env, output_limit=16384)
        return url_rules(_decode(found.stdout), explicit=False)

    async def _env(self, ref: SandboxRef, lang: Language) -> dict[str, str]:
        env = {**sandbox_env(lang, with_libraries=True), **install_env(lang, self.settings)}
        bundle = self.settings.sandbox_install_ca_bundle
        if bundle is not None:
            pem = await anyio.Path(bundle).read_bytes()
            limits = ref.spec.limits
            copied = await self.backend.exec(
                ref, ["tar", "-x", "-C", "/tmp"], timeout=30, stdin=pack({_CA_NAME: pem}, limits.uid, limits.gid)
            )
            if copied.exit_code != 0:
                raise InstallFailed(
                    f"Could not copy SANDBOX_INSTALL_CA_BUNDLE into the installer: {_decode(copied.stderr)}"
                )
            env.update(dict.fromkeys(_CA_VARIABLES, _CA_FILE))
        return env
