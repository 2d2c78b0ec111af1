"""One execution, end to end: language -> libraries -> sandbox -> run -> artifacts."""

from __future__ import annotations

import hashlib
import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field, replace
from types import TracebackType

import anyio

from llm_sandbox_mcp.artifacts import Artifact, collect
from llm_sandbox_mcp.backends import Backend
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import InstallFailed, InvalidRequest, SandboxFailure
from llm_sandbox_mcp.kernel import Kernel
from llm_sandbox_mcp.languages import COMPILE_FAILED_MARKER, Language, get_language, install_env, sandbox_env
from llm_sandbox_mcp.models import (
    LIBS_DIR,
    OUTPUT_DIR,
    WORKDIR,
    CacheMount,
    ExecResult,
    Limits,
    SandboxRef,
    SandboxSpec,
)
from llm_sandbox_mcp.pool import Pool
from llm_sandbox_mcp.transfer import pack, unpack

logger = logging.getLogger(__name__)

MAX_CODE_BYTES = 1024 * 1024
_COMPLETE = f"{LIBS_DIR}/.complete"
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


@dataclass
class Execution:
    """The outcome of running user code. User code failing is an outcome, not an error."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    duration_ms: int
    language: str
    backend: str
    phase: str = "run"
    artifacts: list[Artifact] = field(default_factory=lambda: [])
    session_id: str | None = None
    interpreter_lost: bool = False


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class WarmKey:
    """What makes two sandboxes interchangeable in the pool."""

    language: str
    spec: SandboxSpec


@dataclass
class Lease:
    """A sandbox ready for one call, with its warm interpreter when the language has one."""

    ref: SandboxRef
    kernel: Kernel | None = None


class Executor:
    """Runs code on one backend, through the warm pool, with libraries from the install cache.

    Use as an async context manager: it owns the pool's background work.
    """

    def __init__(self, settings: Settings, backend: Backend) -> None:
        self.settings = settings
        self.backend = backend
        self.limits = settings.limits()
        self.pool: Pool[WarmKey, Lease] = Pool(self._make_lease, self._dispose_lease, settings.sandbox_pool_size)
        self._limiter = anyio.CapacityLimiter(settings.sandbox_max_concurrency)
        self._install_locks: defaultdict[str, anyio.Lock] = defaultdict(anyio.Lock)
        self._ready_caches: set[str] = set()

    async def __aenter__(self) -> Executor:
        await self.pool.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.pool.__aexit__(exc_type, exc, tb)

    def spec_for(self, language: Language, cache_key: str | None = None) -> SandboxSpec:
        cache = CacheMount(cache_key) if cache_key else None
        return SandboxSpec(image=self.settings.image_for(language.name), limits=self.limits, cache=cache)

    def warm(self, language: Language) -> None:
        """Have sandboxes for `language` (without libraries) ready before the first call."""
        self.pool.warm(WarmKey(language.name, self.spec_for(language)))

    async def _make_lease(self, key: WarmKey, ahead: bool) -> Lease:
        lang = get_language(key.language)
        ref = await self.backend.create(key.spec)
        if not lang.kernel:
            return Lease(ref)
        try:
            env = sandbox_env(lang, with_libraries=key.spec.cache is not None)
            return Lease(ref, await Kernel.start(self.backend, ref, env, preload=ahead))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.backend.destroy(ref)
            raise

    async def _dispose_lease(self, lease: Lease) -> None:
        if lease.kernel is not None:
            await lease.kernel.aclose()
        await self.backend.destroy(lease.ref)

    def check_timeout(self, timeout: float | None) -> float:
        if timeout is None:
            return self.settings.sandbox_timeout
        if timeout <= 0:
            raise InvalidRequest("timeout must be a positive number of seconds")
        if timeout > self.settings.sandbox_max_timeout:
            raise InvalidRequest(
                f"timeout {timeout:g} s is above the maximum of {self.settings.sandbox_max_timeout:g} s "
                "(SANDBOX_MAX_TIMEOUT); use a smaller timeout or split the work"
            )
        return timeout

    async def execute(
        self, code: str, language: str = "python", libraries: list[str] | None = None, timeout: float | None = None
    ) -> Execution:
        """Run code in a fresh sandbox from the pool, which is destroyed afterwards."""
        lang = get_language(language)
        seconds = self.check_timeout(timeout)
        source = self.check_code(code)
        specs = lang.check_libraries(libraries or [])
        async with self._limiter:
            cache_key = await self.ensure_libraries(lang, specs) if specs or lang.warm_cache else None
            lease = await self.pool.acquire(WarmKey(lang.name, self.spec_for(lang, cache_key)))
            try:
                result, artifacts, _ = await self.run_in(lease, lang, source, seconds, inline=False)
            finally:
                await self.pool.release(lease)
        return self.shape(lang, result, artifacts, seconds)

    def check_code(self, code: str) -> bytes:
        source = code.encode("utf-8", errors="replace")
        if len(source) > MAX_CODE_BYTES:
            raise InvalidRequest(f"code is {len(source)} bytes; the limit is {MAX_CODE_BYTES} bytes")
        return source

    async def open_lease(self, lang: Language, spec: SandboxSpec) -> Lease:
        """A sandbox (with its interpreter) outside the pool, for a session."""
        return await self._make_lease(WarmKey(lang.name, spec), False)

    async def close_lease(self, lease: Lease) -> None:
        with anyio.CancelScope(shield=True):
            await self._dispose_lease(lease)

    async def run_in(
        self, lease: Lease, lang: Language, source: bytes, seconds: float, *, inline: bool, cell: int = 0
    ) -> tuple[ExecResult, list[Artifact], bool]:
        """Run source in a leased sandbox. Returns the result, artifacts, and whether the interpreter was lost."""
        if lease.kernel is not None:
            run = await lease.kernel.run(
                source.decode("utf-8", errors="replace"),
                mode="inline" if inline else "fork",
                echo=inline,
                filename=f"<cell {cell}>" if inline else str(WORKDIR / lang.file_name),
                timeout=seconds,
                output_limit=self.settings.sandbox_output_limit,
                artifact_limit=self.settings.sandbox_artifact_limit,
            )
            return run.result, run.artifacts, run.kernel_lost
        result = await self.backend.exec(
            lease.ref,
            lang.run_argv(),
            timeout=seconds,
            stdin=source,
            env=sandbox_env(lang, lease.ref.spec.cache is not None),
            output_limit=self.settings.sandbox_output_limit,
        )
        return result, await self.collect_outputs(lease.ref), False

    async def probe_version(self, lang: Language) -> str:
        """The runtime version the configured image really has."""
        lease = await self.pool.acquire(WarmKey(lang.name, self.spec_for(lang)))
        try:
            result = await self.backend.exec(lease.ref, list(lang.version_argv), timeout=30, output_limit=4096)
        finally:
            await self.pool.release(lease)
        text = (result.stdout or result.stderr).decode("utf-8", errors="replace").strip()
        return text.splitlines()[0] if text else "unknown"

    def shape(self, lang: Language, result: ExecResult, artifacts: list[Artifact], seconds: float) -> Execution:
        phase = "run"
        raw_stderr = result.stderr
        if raw_stderr.endswith(COMPILE_FAILED_MARKER):
            phase, raw_stderr = "compile", raw_stderr[: -len(COMPILE_FAILED_MARKER)]
        stderr = _decode(raw_stderr)
        if result.timed_out:
            stderr += (
                f"\n[timed out after {seconds:g} s: every process was killed; raise `timeout` "
                f"(maximum {self.settings.sandbox_max_timeout:g} s) if the work needs longer]\n"
            )
        return Execution(
            exit_code=result.exit_code,
            stdout=_decode(result.stdout),
            stderr=stderr,
            timed_out=result.timed_out,
            truncated=result.truncated,
            duration_ms=round(result.duration_ms),
            language=lang.name,
            backend=self.backend.name,
            phase=phase,
            artifacts=artifacts,
        )

    async def collect_outputs(self, ref: SandboxRef) -> list[Artifact]:
        """Every file in the output directory (for languages without a kernel, which reports changes itself)."""
        limit = self.settings.sandbox_artifact_limit
        listing = await self.backend.exec(
            ref, ["tar", "-c", "-C", str(OUTPUT_DIR), "."], timeout=30, output_limit=limit * 2
        )
        if listing.exit_code != 0 or listing.truncated:
            if listing.truncated:
                logger.warning("Output directory of %s exceeds %d bytes; artifacts not returned", ref.id[:12], limit)
            return []
        return collect(unpack(listing.stdout), inline_limit=limit)

    def install_network_mode(self) -> str:
        """The installer's network: as configured, else what this engine offers by default."""
        configured = self.settings.sandbox_install_network_mode
        if configured:
            return configured
        return "host" if self.backend.name == "bubblewrap" else "bridge"

    def cache_key(self, lang: Language, specs: list[str]) -> str:
        """Language, image, specs and the registry they come from: a different mirror is a different cache."""
        registry = sorted(install_env(lang, self.settings).items())
        identity = json.dumps([lang.name, self.settings.image_for(lang.name), specs, registry])
        return hashlib.sha256(identity.encode()).hexdigest()[:32]

    async def ensure_libraries(self, lang: Language, specs: list[str]) -> str:
        """Install `specs` once into a cache keyed by language, image and specs; return the cache key.

        The install runs in its own short-lived sandbox with network; user code never gets network.
        """
        key = self.cache_key(lang, specs)
        async with self._install_locks[key]:
            if key in self._ready_caches:
                return key
            install_limits: Limits = replace(
                self.limits,
                network_mode=self.install_network_mode(),
                memory_bytes=max(self.limits.memory_bytes, 2 * 1024**3),
                tmp_bytes=max(self.limits.tmp_bytes, 2 * 1024**3),
                pids=max(self.limits.pids, 512),
                cpus=max(self.limits.cpus, 2.0),
            )
            spec = SandboxSpec(self.settings.image_for(lang.name), install_limits, CacheMount(key, writable=True))
            try:
                ref = await self.backend.create(spec)
            except SandboxFailure as exc:
                raise InstallFailed(
                    f"Could not start the library installer: {exc}. Its network is "
                    f"SANDBOX_INSTALL_NETWORK_MODE={install_limits.network_mode!r}; set it to a network this engine "
                    "has (e.g. 'host' when the engine has no bridge network)."
                ) from exc
            try:
                await self._install(ref, lang, specs)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self.backend.destroy(ref)
                    await self.backend.drop_cache(key)
                raise
            with anyio.CancelScope(shield=True):
                await self.backend.destroy(ref)
            self._ready_caches.add(key)
            return key

    async def _install(self, ref: SandboxRef, lang: Language, specs: list[str]) -> None:
        check = await self.backend.exec(ref, ["test", "-f", _COMPLETE], timeout=30)
        if check.exit_code == 0:
            return
        env = await self._install_env(ref, lang)
        timeout = self.settings.sandbox_install_timeout
        # A cache left half-written by an interrupted install is emptied first.
        await self.backend.exec(ref, ["find", str(LIBS_DIR), "-mindepth", "1", "-delete"], timeout=60)
        result = await self.backend.exec(ref, lang.install_argv(specs), timeout=timeout, env=env, output_limit=65536)
        if result.exit_code != 0 or result.timed_out:
            reason = f"timed out after {timeout:g} s (SANDBOX_INSTALL_TIMEOUT)" if result.timed_out else "failed"
            output = (_decode(result.stderr).strip() or _decode(result.stdout).strip())[-3000:]
            raise InstallFailed(
                f"Installing {', '.join(specs)} with {lang.package_manager} {reason}. "
                f"Check the names and versions. Installer output:\n{output}"
            )
        await self.backend.exec(ref, ["touch", _COMPLETE], timeout=30)

    async def _install_env(self, ref: SandboxRef, lang: Language) -> dict[str, str]:
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
