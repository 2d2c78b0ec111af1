"""The libpod wire format: a hardened container as a SpecGenerator, and exec start on a hijacked connection.

The podman SDK's `containers.create` cannot say what a sandbox needs (it drops `nano_cpus`, refuses `tmpfs`,
sends `security_opt` as SELinux labels, and cannot mark a tmpfs `exec`), and its `exec_run` has no stdin and
no socket. So the spec is written here and posted with the SDK's API client, and exec start speaks HTTP/1.1
on a connection of its own, which after the `101` carries Docker's 8-byte frame headers (see `_stream`).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from llm_sandbox_mcp.backends._container import CACHE_PREFIX, INIT, oom_score_adj, rlimits
from llm_sandbox_mcp.models import WORKDIR, SandboxSpec
from llm_sandbox_mcp.proc_masks import MASKED
from llm_sandbox_mcp.seccomp.oci import ours_applies

_CPU_PERIOD = 100_000
_MAX_HEAD = 64 * 1024
SECURITY_OPTIONS = (
    "no-new-privileges[:true|false], seccomp=PATH|unconfined, apparmor=PROFILE, label=OPTION, mask=PATHS, "
    "unmask=PATHS, systempaths=unconfined"
)


class ExecStartError(Exception):
    """The service refused to start an exec session."""


def security_fields(options: Sequence[str]) -> dict[str, Any]:
    """Docker-style `--security-opt` values as SpecGenerator fields. Raises ValueError for an unknown one."""
    fields: dict[str, Any] = {"no_new_privileges": False}
    for option in options:
        key, _, value = option.partition("=") if "=" in option else option.partition(":")
        if key == "no-new-privileges" and value in ("", "true", "false"):
            fields["no_new_privileges"] = value != "false"
        elif key == "seccomp" and value:
            fields["seccomp_profile_path"] = value  # a path on the Podman host, or `unconfined`
        elif key == "apparmor" and value:
            fields["apparmor_profile"] = value
        elif key == "label" and value:
            fields.setdefault("selinux_opts", []).append(value)
        elif key in ("mask", "unmask") and value:
            fields.setdefault(key, []).extend(value.split(":"))
        elif key == "systempaths" and value == "unconfined":
            fields.setdefault("unmask", []).append("ALL")
        else:
            raise ValueError(f"SANDBOX_SECURITY_OPT: Podman does not understand {option!r}; use {SECURITY_OPTIONS}")
    return fields


def network_fields(mode: str) -> dict[str, Any]:
    """Docker's `network_mode` (none, host, bridge, container:ID, a network name) as SpecGenerator fields."""
    if mode in ("none", "host", "bridge", "private", "slirp4netns", "pasta"):
        return {"netns": {"nsmode": mode}}
    kind, _, value = mode.partition(":")
    if kind in ("container", "ns") and value:
        return {"netns": {"nsmode": "container" if kind == "container" else "path", "value": value}}
    return {"netns": {"nsmode": "bridge"}, "networks": {mode: {}}}


def container_spec(spec: SandboxSpec, labels: Mapping[str, str], seccomp_path: str | None = None) -> dict[str, Any]:
    """The SpecGenerator of a hardened, idle sandbox: the same limits and hardening as the Docker backend.

    `seccomp_path`: the project's seccomp profile as a file on the Podman host (libpod takes a path, not the
    content; its template variant for `spec.forks`); given unless SANDBOX_SECURITY_OPT names a profile or the
    sandbox is privileged.
    """
    limits = spec.limits
    body: dict[str, Any] = {
        "image": spec.image,
        "command": INIT,
        "init": False,
        "user": f"{limits.uid}:{limits.gid}",
        "work_dir": str(WORKDIR),
        "env": {"HOME": "/tmp"},
        "httpproxy": False,  # Podman would copy the service's proxy variables into the sandbox
        "oom_score_adj": oom_score_adj(spec.forks),
        # The engine keeps no log of a sandbox: nothing in it can grow a file on the host that way.
        "log_configuration": {"driver": "none"},
        "hostname": "sandbox",
        "labels": dict(labels),
        "read_only_filesystem": limits.read_only,
        "read_write_tmpfs": False,  # no writable /run and /var/tmp besides the sized mounts below
        "cap_drop": list(limits.cap_drop),
        "privileged": limits.privileged,
        "resource_limits": {
            "memory": {"limit": limits.memory_bytes, "swap": limits.memory_bytes},
            "cpu": {"quota": int(limits.cpus * _CPU_PERIOD), "period": _CPU_PERIOD},
            "pids": {"limit": limits.pids},
        },
        "r_limits": [{"type": name, "soft": value, "hard": value} for name, value in rlimits(limits).items()],
        "mounts": [
            # `U`: owned by the sandbox user (libpod refuses tmpfs uid=/gid= options).
            _tmpfs(WORKDIR, limits.workspace_bytes, "0700", "U"),
            _tmpfs(PurePosixPath("/tmp"), limits.tmp_bytes, "1777"),
        ],
        # SIGKILL at once on removal: PID 1 ignores SIGTERM, and Podman would wait 10 s for it.
        "stop_signal": 9,
        "stop_timeout": 0,
        **network_fields(limits.network_mode),
        **security_fields(limits.security_opt),
    }
    if seccomp_path is not None and ours_applies(limits.security_opt, limits.privileged):
        body["seccomp_profile_path"] = seccomp_path
    if spec.forks:
        # A zygote template: its children mount a /proc of their own, which the kernel refuses under masked
        # /proc paths; each child masks them again in its own mount namespace.
        body["unmask"] = [*body.get("unmask", []), "ALL"]
    elif "ALL" not in body.get("unmask", []):
        # Beyond Podman's own list: what Docker masks, and /proc/interrupts.
        body["mask"] = [*body.get("mask", []), *MASKED]
    if spec.cache is not None:
        options = ["nosuid", "nodev"] + ([] if spec.cache.writable else ["ro"])
        body["volumes"] = [{"Name": CACHE_PREFIX + spec.cache.key, "Dest": str(spec.cache.target), "Options": options}]
    return body


def _tmpfs(target: PurePosixPath, size: int, mode: str, *extra: str) -> dict[str, Any]:
    options = ["rw", "exec", "nosuid", "nodev", f"size={size}", f"mode={mode}", *extra]
    return {"destination": str(target), "type": "tmpfs", "source": "tmpfs", "options": options}


def exec_body(argv: Sequence[str], user: str, env: Mapping[str, str], workdir: PurePosixPath) -> dict[str, Any]:
    """Body of `POST /containers/{id}/exec`: stdin, stdout and stderr attached, no TTY (so frames are muxed)."""
    return {
        "Cmd": list(argv),
        "User": user,
        "Env": [f"{key}={value}" for key, value in env.items()],
        "WorkingDir": str(workdir),
        "AttachStdin": True,
        "AttachStdout": True,
        "AttachStderr": True,
        "Tty": False,
    }


def start_exec(sock: socket.socket, path: str) -> None:
    """Start an exec session on a fresh connection and leave `sock` positioned at its first frame.

    `path` is the full request path, e.g. `/v4.0.0/libpod/exec/ID/start`. Send stdin only after this
    returns: bytes sent before the upgrade may be swallowed by the service's HTTP reader.
    """
    body = json.dumps({"Detach": False, "Tty": False}).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: podman\r\nContent-Type: application/json\r\n"
        f"Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(request.encode() + body)
    head = _read_head(sock)
    status_line, _, headers = head.decode("latin-1").partition("\r\n")
    parts = status_line.split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    if status in (101, 200):
        return
    raise ExecStartError(_error_message(sock, headers) or status_line)


def _read_head(sock: socket.socket) -> bytes:
    """Read the response head and not one byte more (peek, then consume exactly), so no frame is lost."""
    head = bytearray()
    while True:
        peeked = sock.recv(4096, socket.MSG_PEEK)
        if not peeked:
            raise ExecStartError("the Podman service closed the connection without answering")
        tail = bytes(head[-3:])  # the blank line may straddle two reads
        end = (tail + peeked).find(b"\r\n\r\n")
        take = len(peeked) if end < 0 else end + 4 - len(tail)
        while take:
            chunk = sock.recv(take)
            if not chunk:
                raise ExecStartError("the Podman service closed the connection mid-answer")
            head += chunk
            take -= len(chunk)
        if end >= 0:
            return bytes(head)
        if len(head) > _MAX_HEAD:
            raise ExecStartError("the Podman service sent an oversized answer")


def _error_message(sock: socket.socket, headers: str) -> str:
    length = 0
    for line in headers.split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            length = min(int(value), _MAX_HEAD)
    data = b""
    while len(data) < length:
        chunk = sock.recv(length - len(data))
        if not chunk:
            break
        data += chunk
    try:
        message = json.loads(data).get("message", "")
    except (ValueError, AttributeError):
        message = data.decode("utf-8", errors="replace")
    return str(message).strip()
