"""Bubblewrap backend: daemonless local sandboxes from the host's own runtimes, no image, no container engine.

Shape (see `argv`): one long-lived *holder* bwrap per sandbox owns its namespaces and its size-limited
tmpfs /workspace and /tmp; each exec enters it with nsenter and runs in a hardened inner bwrap. The holder,
cgroups, rlimits, kill, sweep and zygote templates are shared with NsJail (`_daemonless`); what is bubblewrap's
own is here: finding bwrap, its holder, per-exec and template command lines, and its seccomp filters.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import Process

from llm_sandbox_mcp.backends._bubblewrap.argv import exec_argv, holder_argv, probe_argv
from llm_sandbox_mcp.backends._bubblewrap.host import Bwrap, find_bwrap
from llm_sandbox_mcp.backends._daemonless.argv import generated_files, host_env
from llm_sandbox_mcp.backends._daemonless.sandbox import (
    HostInfo,
    HostSandbox,
    Sandbox,
    holder_error,
)
from llm_sandbox_mcp.backends._userns import refused, userns_refused
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import BackendUnavailable, SandboxFailure
from llm_sandbox_mcp.models import WORKDIR, SandboxSpec
from llm_sandbox_mcp.seccomp.bpf import FILTER, TEMPLATE_FILTER

_START_SECONDS = 30.0


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class BubblewrapBackend(HostSandbox[Bwrap]):
    """Sandboxes as bubblewrap namespaces on this host."""

    name = "bubblewrap"

    def _find_jail(self, state: Path, root: bool) -> Bwrap:
        return find_bwrap(self._configured, state, staging=root)

    def _probe(self, jail: Bwrap, root: bool) -> None:
        uid, gid = self._probe_ids
        try:
            done = subprocess.run(
                probe_argv(jail, uid, gid), capture_output=True, text=True, timeout=30, env=host_env(),
                cwd="/", check=False, **_run_as(root, uid, gid),
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            raise BackendUnavailable(f"{jail.describe()} does not run: {exc}") from exc
        if done.returncode != 0:
            raise self._refusal(jail, done.stderr.strip())

    async def _start_holder(
        self, host: HostInfo[Bwrap], spec: SandboxSpec, cache_dir: Path | None
    ) -> tuple[Process, int]:
        limits = spec.limits
        info_read, info_write = os.pipe()
        files = {dest: _memfd(dest, data) for dest, data in generated_files(limits).items()}
        argv = holder_argv(host.jail, spec, info_fd=info_write, file_fds=files, cache_dir=cache_dir)
        try:
            holder = await anyio.open_process(
                argv, stdin=subprocess.DEVNULL, cwd="/", env=host_env(), start_new_session=True,
                pass_fds=(info_write, *files.values()),
                **_run_as(host.root, limits.uid, limits.gid),
            )  # fmt: skip
        finally:
            for fd in (info_write, *files.values()):
                os.close(fd)
        try:
            assert holder.stdout is not None
            with anyio.fail_after(_START_SECONDS):
                # PID 1 speaks once it runs, so the namespaces and mounts are in place.
                await holder.stdout.receive()
            info = json.loads(await anyio.to_thread.run_sync(read_all, info_read))
            return holder, int(info["child-pid"])
        except (anyio.EndOfStream, anyio.BrokenResourceError, TimeoutError, ValueError, KeyError) as exc:
            message = ""
            with anyio.CancelScope(shield=True):
                message = await holder_error(holder)
            if refused(message):
                raise userns_refused(self.name, host.jail.path, message) from exc
            raise SandboxFailure(f"bubblewrap could not create a sandbox: {message or exc!r}") from exc
        finally:
            os.close(info_read)

    def _exec_command(
        self, host: HostInfo[Bwrap], box: Sandbox, argv: Sequence[str], env: Mapping[str, str], workdir: PurePosixPath
    ) -> tuple[list[str], tuple[int, ...]]:
        seccomp = _memfd("seccomp", FILTER)
        command = exec_argv(
            host.jail, host.nsenter, box.holder_pid, box.spec.limits, argv, env=env, workdir=workdir,
            seccomp_fd=seccomp, as_root=host.root,
        )  # fmt: skip
        return command, (seccomp,)

    def _template_command(
        self, host: HostInfo[Bwrap], box: Sandbox, argv: Sequence[str], env: Mapping[str, str], control_fd: int
    ) -> tuple[list[str], tuple[int, ...]]:
        # bwrap passes on every descriptor it inherits: `control_fd` needs no mention here.
        seccomp = _memfd("seccomp", TEMPLATE_FILTER)
        command = exec_argv(
            host.jail, host.nsenter, box.holder_pid, box.spec.limits, argv, env=env, workdir=WORKDIR,
            seccomp_fd=seccomp, as_root=host.root, template=True,
        )  # fmt: skip
        return command, (seccomp,)


def _run_as(root: bool, uid: int, gid: int) -> dict[str, Any]:
    return {"user": uid, "group": gid, "extra_groups": []} if root else {}


def read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    return data


def from_settings(settings: Settings) -> BubblewrapBackend:
    limits = settings.limits()
    return BubblewrapBackend(settings.sandbox_bwrap_path, limits.uid, limits.gid)
