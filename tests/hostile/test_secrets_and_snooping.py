"""Secrets and snooping on every engine: code looks everywhere the server's secrets or another session's data
could leak to (its own and every visible process's environment, the host's files, other sandboxes' work) and
finds nothing; and the server answers the next call."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from llm_sandbox_mcp.proc_masks import MASKED
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.sessions import SessionRegistry

pytestmark = pytest.mark.anyio

CANARY = "canary-7f3a9d"

# Every environment and command line this sandbox can read, and host paths that hold credentials.
LOOK_EVERYWHERE = """
import glob, os, socket, stat
found = []
for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
    try:
        with open(path, "rb") as handle:
            if b"CANARY" in handle.read():
                found.append(path)
    except OSError:
        pass
for path in ("/root/.docker/config.json", "/root/.kube/config", "/etc/shadow", "/proc/1/root/etc/shadow"):
    if os.path.exists(path):
        try:
            open(path, "rb").read(1)
            found.append(path)
        except OSError:
            pass
# An engine's socket cannot be open()ed at all, so each is looked for as a socket and then connected to.
for path in ["/var/run/docker.sock", "/run/docker.sock", "/run/podman/podman.sock",
             "/run/containerd/containerd.sock"] + glob.glob("/run/llm-sandbox-remote/*.sock") + glob.glob(
             "/run/user/*/podman/podman.sock") + glob.glob("/run/user/*/docker.sock"):
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            continue
    except OSError:
        continue
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        found.append(path)
    except OSError:
        found.append(path + " (visible)")
    finally:
        probe.close()
print("found:", found)
""".replace("CANARY", CANARY)


async def test_the_servers_secrets_are_nowhere_the_code_can_look(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CANARY)
    monkeypatch.setenv("LLM_SANDBOX_TOKEN", CANARY)
    result = await executor.execute(LOOK_EVERYWHERE, timeout=60)
    assert result.stdout == "found: []\n", result
    after = await executor.execute("print(1)")
    assert after.stdout == "1\n"


def test_the_look_finds_what_the_host_exposes() -> None:
    """The probe above can fail: run on this host, where the engines' sockets are, it finds them."""
    done = subprocess.run([sys.executable, "-c", LOOK_EVERYWHERE], capture_output=True, text=True, timeout=60)
    assert "/var/run/docker.sock'" in done.stdout, done
    assert "/run/podman/podman.sock'" in done.stdout, done


# What the container engines hide of /proc and /sys (interrupt counts, a known timing side channel, among them):
# each path there must be empty, in every kind of sandbox on every engine.
LOOK_AT_MASKED = """
import json, os, sys
seen = {}
for path in json.loads(sys.argv[1]) if len(sys.argv) > 1 else MASKED:
    try:
        if os.path.isdir(path):
            seen[path] = len(os.listdir(path))
        else:
            with open(path, "rb") as handle:
                seen[path] = len(handle.read(4096))
    except OSError:
        pass  # out of reach is as good as empty
print(json.dumps({path: size for path, size in seen.items() if size}))
"""


# Not Kubernetes: a pod spec cannot add masked paths, so what a pod's /proc shows is the cluster runtime's choice.
# Across the filesystem boundary on Podman only: its template containers' seccomp variant is a file in a volume on
# the engine's side (Docker takes the profile's text), and the forked call below runs in such a container's child.
@pytest.mark.parametrize(
    "engine",
    [
        pytest.param(e, marks=getattr(pytest.mark, e))
        for e in ("docker", "podman", "bubblewrap", "nsjail", "podman-remote")
    ],
)
async def test_what_the_engines_mask_of_proc_is_empty_in_every_sandbox(
    executor: Executor, registry: SessionRegistry
) -> None:
    code = LOOK_AT_MASKED.replace("MASKED", repr(list(MASKED)))
    forked = await executor.execute(code, timeout=60)
    session = await registry.create("python", [])
    try:
        cell = await registry.execute(session.id, code, [], 60)
    finally:
        await registry.close(session.id)
    node = (
        "const fs = require('fs'); const found = [];"
        f" for (const p of {json.dumps(list(MASKED))}) {{ try {{"
        " const size = fs.statSync(p).isDirectory() ? fs.readdirSync(p).length"
        " : fs.readSync(fs.openSync(p, 'r'), Buffer.alloc(4096), 0, 4096, null);"
        " if (size) found.push(p); } catch (e) {} } console.log(JSON.stringify(found))"
    )
    pooled = await executor.execute(node, "javascript", timeout=60)  # a pooled sandbox, no zygote
    assert (forked.stdout, cell.stdout, pooled.stdout) == ("{}\n", "{}\n", "[]\n"), (forked, cell, pooled)


async def test_a_session_cannot_see_another_sessions_processes_files_or_memory(registry: SessionRegistry) -> None:
    victim = await registry.create("python", [])
    await registry.execute(
        victim.id,
        textwrap.dedent(
            f"""
            import subprocess
            secret = "{CANARY}"
            open("/workspace/secret.txt", "w").write(secret)
            open("/tmp/secret.txt", "w").write(secret)
            keeper = subprocess.Popen(["sleep", "300", "{CANARY}"])
            """
        ),
        [],
        60,
    )
    snoop = await registry.create("python", [])
    code = textwrap.dedent(
        f"""
        import glob, os
        hits = []
        for path in glob.glob("/proc/[0-9]*/cmdline") + glob.glob("/proc/[0-9]*/environ"):
            try:
                if b"{CANARY}" in open(path, "rb").read():
                    hits.append(path)
            except OSError:
                pass
        for root in ("/workspace", "/tmp"):
            for directory, _, names in os.walk(root):
                for name in names:
                    try:
                        if b"{CANARY}" in open(os.path.join(directory, name), "rb").read():
                            hits.append(os.path.join(directory, name))
                    except OSError:
                        pass
        print("hits:", hits)
        """
    )
    result = await registry.execute(snoop.id, code, [], 60)
    assert result.stdout == "hits: []\n", result
    # The victim still has its own data: the search looked in the right places.
    own = await registry.execute(victim.id, "print(open('/workspace/secret.txt').read(), secret)", [], 60)
    assert own.stdout == f"{CANARY} {CANARY}\n"
