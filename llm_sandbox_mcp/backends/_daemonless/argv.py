"""Command-line parts both daemonless engines use: the holder's PID 1, the gate every exec passes, the host
files a sandbox sees, its generated /etc files, and the nsenter that enters a holder's namespaces.
"""

from __future__ import annotations

import glob

from llm_sandbox_mcp.backends._daemonless.host import HOST_PATH
from llm_sandbox_mcp.models import Limits

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# PID 1 of the holder: says it is up, then idles. A shell as PID 1 reaps orphans (dash waits on any child
# while it waits for `sleep`), and as PID 1 it ignores every signal sent from inside the sandbox.
HOLDER_COMMAND = ("/bin/sh", "-c", "echo; while :; do sleep 3600; done")
# The per-exec gate: waits for a line on stdin, sent once the server has set rlimits and the cgroup on this very
# process, then becomes the real command, so nothing of the sandbox ever runs unlimited. (dash reads stdin one
# byte at a time, so the rest of stdin is left for the command.)
GATE = 'read -r _ || exit 125; exec "$@"'
# What runtimes read from /etc (Debian and others link config there from /usr); nothing with secrets (apt's
# auth.conf.d is readable by root only, and the sandbox user is never host root).
ETC_ENTRIES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl", "ca-certificates", "ca-certificates.conf",
    "pki", "crypto-policies", "localtime", "timezone", "locale.alias", "nsswitch.conf", "host.conf", "gai.conf",
    "protocols", "services", "mime.types", "os-release", "fonts", "matplotlibrc", "R", "java-*", "maven",
    "python3*", "ruby", "gemrc",
    # For installers that download Debian packages (C++): the host's apt sources and keys.
    "apt",
)  # fmt: skip
# What is installed, for the same installers (apt plans what the host lacks).
VAR_ENTRIES = ("/var/lib/dpkg",)
ROOT_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def host_sources(with_network: bool) -> list[str]:
    names: list[str] = []
    for entry in ETC_ENTRIES:
        names += sorted(glob.glob(f"/etc/{entry}")) if "*" in entry else [f"/etc/{entry}"]
    if with_network:
        names.append("/etc/resolv.conf")
    return [*names, *VAR_ENTRIES]


def generated_files(limits: Limits) -> dict[str, bytes]:
    """Minimal account and host files, not the host's, which list its users and hostnames."""
    uid, gid = limits.uid, limits.gid
    return {
        "/etc/passwd": (
            f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{gid}:sandbox:/tmp:/bin/sh\n".encode()
        ),
        "/etc/group": f"root:x:0:\nsandbox:x:{gid}:\n".encode(),
        "/etc/hosts": b"127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    }


def nsenter_argv(nsenter: str, holder_pid: int, limits: Limits, as_root: bool) -> list[str]:
    argv = [nsenter, "--target", str(holder_pid), "--user", "--mount", "--ipc", "--uts", "--pid"]
    if limits.network_mode != "host":  # else the holder has no network namespace of its own
        argv.append("--net")
    if as_root:
        argv += ["--setuid", str(limits.uid), "--setgid", str(limits.gid)]
    else:
        argv.append("--preserve-credentials")
    return [*argv, "--"]


def host_env() -> dict[str, str]:
    """The environment of the host-side helpers: nothing of the server's own."""
    return {"PATH": HOST_PATH}
