"""NsJail backend: the daemonless design (see `_daemonless`) with Google's nsjail making the namespaces.

One holder nsjail per sandbox owns its namespaces and size-limited tmpfs /workspace and /tmp; each exec enters
it with nsenter and runs a hardening `nsjail -Me` there (see `argv`). The cgroup per sandbox (pids, memory
without swap, cpu; v1 or v2), the rlimits, the kill from outside and the sweep are shared with bubblewrap
through `_daemonless.sandbox.HostSandbox`, and so are zygote templates (a template's exec differs only in its
policy and the control socket nsjail must be told to keep); the seccomp policy is the project's one, rendered in
Kafel (see `policy`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

import anyio
import anyio.to_thread
from anyio.abc import Process

from llm_sandbox_mcp.backends._daemonless.argv import generated_files, host_env
from llm_sandbox_mcp.backends._daemonless.host import HOST_PATH
from llm_sandbox_mcp.backends._daemonless.sandbox import HostInfo, HostSandbox, Sandbox, holder_error
from llm_sandbox_mcp.backends._nsjail.argv import SETPRIV, exec_argv, holder_argv, probe_argv
from llm_sandbox_mcp.backends._nsjail.host import Nsjail, find_nsjail
from llm_sandbox_mcp.backends._nsjail.policy import kafel_policy, native_arch, template_policy, x32_enabled
from llm_sandbox_mcp.backends._userns import refused, userns_refused
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import BackendUnavailable, SandboxFailure
from llm_sandbox_mcp.models import WORKDIR, Limits, SandboxSpec

_START_SECONDS = 30.0
# "[W][2026-01-01T00:00:00+0000][42] runChild():511 " before each of its log lines.
_LOG_PREFIX = re.compile(r"^\[[A-Z]\]\[[^]]*\]\[\d+\] (?:\S+\(\):\d+ )?")


def _holder_pid(nsjail_pid: int) -> int:
    """The jail's PID 1: the only child of the holder's nsjail."""
    children = Path(f"/proc/{nsjail_pid}/task/{nsjail_pid}/children").read_text().split()
    if len(children) != 1:
        raise ValueError(f"the holder's nsjail has {len(children)} children")
    return int(children[0])


def _errors(log: str) -> str:
    """nsjail's warning and error lines (its info lines say what it set up, not what failed), without their
    level, time, pid and source location."""
    lines = [_LOG_PREFIX.sub("", line) for line in log.splitlines() if line.startswith(("[W]", "[E]", "[F]"))]
    return "; ".join(lines or log.strip().splitlines())[-500:]


def _kill_jail(nsjail_pid: int) -> None:
    """SIGKILL the jail's PID 1 (and so its PID namespace), if it was started."""
    with contextlib.suppress(OSError, ValueError):
        os.kill(_holder_pid(nsjail_pid), signal.SIGKILL)


class NsjailBackend(HostSandbox[Nsjail]):
    """Sandboxes as nsjail namespaces on this host."""

    name = "nsjail"

    def __init__(self, nsjail_path: Path | None, probe_uid: int = 65534, probe_gid: int = 65534) -> None:
        super().__init__(nsjail_path, probe_uid, probe_gid)
        arch = native_arch()
        self._policy = kafel_policy(arch) if arch is not None else None
        self._template_policy = template_policy(arch) if arch is not None else None

    def _find_jail(self, state: Path, root: bool) -> Nsjail:
        if self._policy is None:
            raise BackendUnavailable("BACKEND=nsjail runs on x86_64 and aarch64 only (the seccomp policy's ABIs)")
        if x32_enabled():
            raise BackendUnavailable(
                "BACKEND=nsjail refuses this kernel: it runs x32 system calls, which NsJail's Kafel policy does not "
                "cover (boot with syscall.x32=n), or use BACKEND=bubblewrap, whose filter kills them"
            )
        if shutil.which(SETPRIV, path=HOST_PATH) is None:
            raise BackendUnavailable("BACKEND=nsjail needs setpriv; install util-linux with your package manager")
        return find_nsjail(self._configured)

    def _probe(self, jail: Nsjail, root: bool) -> None:
        limits = Limits(uid=self._probe_ids[0], gid=self._probe_ids[1])
        try:
            done = subprocess.run(
                probe_argv(jail, limits, root), capture_output=True, text=True, timeout=30, env=host_env(),
                cwd="/", check=False,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            raise BackendUnavailable(f"{jail.describe()} does not run: {exc}") from exc
        if done.returncode != 0:
            raise self._refusal(jail, _errors(done.stderr))

    def _files(self, host: HostInfo[Nsjail], limits: Limits) -> dict[str, Path]:
        """The generated /etc files (the same for every sandbox of these ids), written once."""
        directory = host.state / "files" / f"{limits.uid}-{limits.gid}"
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        placed: dict[str, Path] = {}
        for dest, data in generated_files(limits).items():
            path = directory / Path(dest).name
            if not path.is_file() or path.read_bytes() != data:
                # Sandboxes start concurrently (worker threads): each writes its own file, then renames it.
                fd, work = tempfile.mkstemp(dir=directory)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                os.chmod(work, 0o644)
                os.replace(work, path)
            placed[dest] = path
        return placed

    async def _start_holder(
        self, host: HostInfo[Nsjail], spec: SandboxSpec, cache_dir: Path | None
    ) -> tuple[Process, int]:
        assert self._policy is not None
        files = await anyio.to_thread.run_sync(self._files, host, spec.limits)
        argv = holder_argv(host.jail, spec, files=files, cache_dir=cache_dir, policy=self._policy, as_root=host.root)
        # Started from the event loop's thread, which lives as long as the server: the parent-death signal the
        # holder asks for (setpriv) follows that thread.
        holder = await anyio.open_process(
            argv, stdin=subprocess.DEVNULL, cwd="/", env=host_env(), start_new_session=True
        )
        try:
            assert holder.stdout is not None
            with anyio.fail_after(_START_SECONDS):
                await holder.stdout.receive()  # PID 1 speaks once it runs, so the namespaces and mounts are in place
            return holder, _holder_pid(holder.pid)
        except (anyio.EndOfStream, anyio.BrokenResourceError, TimeoutError, OSError, ValueError) as exc:
            message = ""
            with anyio.CancelScope(shield=True):
                _kill_jail(holder.pid)
                message = await holder_error(holder)
            if refused(message):
                raise userns_refused(self.name, host.jail.path, _errors(message)) from exc
            raise SandboxFailure(f"nsjail could not create a sandbox: {message or exc!r}") from exc
        except BaseException:  # cancelled: a SIGKILLed nsjail would leave its jail running
            with anyio.CancelScope(shield=True):
                _kill_jail(holder.pid)
                await holder_error(holder)
            raise

    def _exec_command(
        self, host: HostInfo[Nsjail], box: Sandbox, argv: Sequence[str], env: Mapping[str, str], workdir: PurePosixPath
    ) -> tuple[list[str], tuple[int, ...]]:
        assert self._policy is not None
        command = exec_argv(
            host.jail, host.nsenter, box.holder_pid, box.spec.limits, argv, env=env, workdir=workdir,
            policy=self._policy, as_root=host.root,
        )  # fmt: skip
        return command, ()

    def _template_command(
        self, host: HostInfo[Nsjail], box: Sandbox, argv: Sequence[str], env: Mapping[str, str], control_fd: int
    ) -> tuple[list[str], tuple[int, ...]]:
        assert self._template_policy is not None
        command = exec_argv(
            host.jail, host.nsenter, box.holder_pid, box.spec.limits, argv, env=env, workdir=WORKDIR,
            policy=self._template_policy, as_root=host.root, pass_fds=(control_fd,),
        )  # fmt: skip
        return command, ()


def from_settings(settings: Settings) -> NsjailBackend:
    limits = settings.limits()
    return NsjailBackend(settings.sandbox_nsjail_path, limits.uid, limits.gid)
