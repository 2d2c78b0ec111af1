"""The library cache: libraries installed once, in a sandbox of their own, into a store keyed by what they are.

The install runs in a short-lived sandbox with the network the engine offers installers; the sandboxes that
run user code mount the finished store read-only and never get network.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import replace

import anyio

from llm_sandbox_mcp.backends import Backend, stop_on_cancel
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import InstallFailed, SandboxFailure
from llm_sandbox_mcp.languages import Language, install_env, sandbox_env
from llm_sandbox_mcp.models import LIBS_DIR, CacheMount, Limits, SandboxRef, SandboxSpec
from llm_sandbox_mcp.transfer import pack

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


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class LibraryCache:
    """Library stores on one backend; each is installed at most once per server."""

    def __init__(self, settings: Settings, backend: Backend, limits: Limits) -> None:
        self.settings = settings
        self.backend = backend
        self.limits = limits
        self._locks: defaultdict[str, anyio.Lock] = defaultdict(anyio.Lock)
        self._ready: set[str] = set()

    def needed(self, lang: Language, specs: list[str]) -> bool:
        """Whether a run of `lang` with `specs` mounts a store (Go builds one even without libraries)."""
        return bool(specs) or lang.warm_cache

    def network(self) -> str:
        """The installer's network: as configured, else what this engine offers installers."""
        return self.settings.sandbox_install_network_mode or self.backend.install_network

    def key(self, lang: Language, specs: list[str]) -> str:
        """Language, image, specs and the registry they come from: a different mirror is a different cache."""
        registry = sorted(install_env(lang, self.settings).items())
        identity = json.dumps([lang.name, self.settings.image_for(lang.name), specs, registry])
        return hashlib.sha256(identity.encode()).hexdigest()[:32]

    async def ensure(self, lang: Language, specs: list[str]) -> str:
        """Install `specs` unless their store is complete; return the store's key."""
        key = self.key(lang, specs)
        async with self._locks[key]:
            if key in self._ready:
                return key
            install_limits = replace(
                self.limits,
                network_mode=self.network(),
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
                # Cancelled (the caller left): the installer is killed at once, and its half-written store dropped.
                await stop_on_cancel(self.backend, ref, lambda: self._install(ref, lang, specs))
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self.backend.destroy(ref)
                    await self.backend.drop_cache(key)
                raise
            with anyio.CancelScope(shield=True):
                await self.backend.destroy(ref)
            self._ready.add(key)
            return key

    async def _install(self, ref: SandboxRef, lang: Language, specs: list[str]) -> None:
        check = await self.backend.exec(ref, ["test", "-f", _COMPLETE], timeout=30)
        if check.exit_code == 0:
            return
        env = await self._env(ref, lang)
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
