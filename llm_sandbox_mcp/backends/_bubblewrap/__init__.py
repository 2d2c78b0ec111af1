"""Bubblewrap backend: daemonless local sandboxes from the host's own runtimes, no image, no container engine.

Shape (see `argv`): one long-lived *holder* bwrap per sandbox owns its namespaces and its size-limited
tmpfs /workspace and /tmp; each exec enters it with nsenter and runs in a hardened inner bwrap. The holder,
cgroups, rlimits, kill and sweep are shared with NsJail (`_daemonless`); what is bubblewrap's own is here:
finding bwrap, its holder and per-exec command lines, its seccomp filter, and zygote templates.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import Process

from llm_sandbox_mcp.backends._bubblewrap.argv import exec_argv, holder_argv, probe_argv
from llm_sandbox_mcp.backends._bubblewrap.host import Bwrap, find_bwrap
from llm_sandbox_mcp.backends._daemonless.argv import generated_files, host_env
from llm_sandbox_mcp.backends._daemonless.cgroup import Cgroup
from llm_sandbox_mcp.backends._daemonless.pipes import PipeProcess
from llm_sandbox_mcp.backends._daemonless.sandbox import (
    CALL_CGROUP_PREFIX,
    HostInfo,
    HostSandbox,
    Sandbox,
    holder_error,
)
from llm_sandbox_mcp.backends._userns import refused, userns_refused
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import BackendUnavailable, SandboxFailure
from llm_sandbox_mcp.models import WORKDIR, SandboxRef, SandboxSpec
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

    # -- zygote templates (see llm_sandbox_mcp.run.zygote) ------------------------------------------------------

    async def start_template(
        self, ref: SandboxRef, argv: Sequence[str], env: Mapping[str, str], control_fd: int, calls: int
    ) -> PipeProcess:
        """A zygote's template process: an exec whose bwrap leaves it able to make one user namespace per child
        (no --disable-userns; `TEMPLATE_FILTER`), handed `control_fd` (same number; the caller closes it). Its
        RLIMIT_NPROC leaves room for `calls` children at their own limit (a nested user namespace counts against
        its parents)."""
        box = self._box(ref)
        host = await self._host()
        if not host.nproc_per_userns:
            raise SandboxFailure("zygote children need Linux 5.14 or newer (RLIMIT_NPROC per user namespace)")
        seccomp = _memfd("seccomp", TEMPLATE_FILTER)
        command = exec_argv(
            host.jail, host.nsenter, box.holder_pid, box.spec.limits, argv, env=env, workdir=WORKDIR,
            seccomp_fd=seccomp, as_root=host.root, template=True,
        )  # fmt: skip
        nproc = box.spec.limits.pids * (calls + 1)
        process = await self._launch(host, box, command, (seccomp,), None, nproc=nproc, keep=(control_fd,))
        return PipeProcess(process)

    async def child_cgroup(self, ref: SandboxRef) -> Cgroup:
        """A new cgroup with the sandbox's limits, for one child of its template (the caller removes it)."""
        box = self._box(ref)
        host = await self._host()
        # Named after the template's sandbox, so a sweep after a crash finds them by its record.
        name = f"{CALL_CGROUP_PREFIX}{box.id}-{uuid.uuid4().hex[:16]}"
        cgroup = await anyio.to_thread.run_sync(host.cgroups.create, name, box.spec.limits)
        if cgroup is None:
            raise SandboxFailure(f"bubblewrap could not make a call's cgroup: {host.cgroups.problem}")
        return cgroup

    async def confine_child(self, ref: SandboxRef, pid: int, cgroup: Cgroup) -> None:
        """Move the template's child at host pid `pid` (only a process in the template's cgroup qualifies) into
        `cgroup`. The child sets its own rlimits (lowering them needs no privilege; setting another user's from
        here needs CAP_SYS_RESOURCE, which containers often lack)."""
        box = self._box(ref)
        await anyio.to_thread.run_sync(self._confine_child, box, pid, cgroup)

    def _confine_child(self, box: Sandbox, pid: int, cgroup: Cgroup) -> None:
        if pid not in box.cgroup.pids():
            raise SandboxFailure(f"process {pid} is not a child of the sandbox's template")
        try:
            cgroup.place(pid)
        except OSError as exc:
            raise SandboxFailure(f"Could not move a zygote child into its cgroup: {exc}") from exc


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
