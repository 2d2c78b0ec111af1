"""Attacks on the boundary in both directions, on every engine: code that knows our implementation tries to
reach the interpreter's protocol, stretch a timeout, fill the host's logs, exhaust its pids with zombies, or
tamper with its outputs while they are read. Each test proves the attack was contained, from inside the
sandbox where it can, and that the server still answers the next call."""

from __future__ import annotations

import textwrap

import anyio
import pytest

from llm_sandbox_mcp.errors import FileTransferError
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.files import Files
from llm_sandbox_mcp.run.sessions import SessionRegistry

pytestmark = pytest.mark.anyio

# The program from the report: forged result frames written to the warm interpreter's protocol pipe.
FORGED_FRAMES = """
import json, os, struct
fd = os.open(f"/proc/{os.getppid()}/fd/1", os.O_WRONLY)
blob = b"\\0" * (8 << 20)
for i in range(2):
    body = json.dumps({"name": f"forged_{i}.png", "size": len(blob), "inline": True}).encode() + b"\\n" + blob
    view = memoryview(b"F" + struct.pack(">I", len(body)) + body)
    while view:
        view = view[os.write(fd, view):]
"""


async def still_answers(executor: Executor) -> None:
    after = await executor.execute("print(1)")
    assert (after.exit_code, after.stdout) == (0, "1\n"), after


async def test_the_interpreters_protocol_pipe_cannot_be_opened_by_the_code(executor: Executor) -> None:
    result = await executor.execute(FORGED_FRAMES, timeout=60)
    assert result.exit_code != 0 and "PermissionError" in result.stderr, result
    assert result.artifacts == []
    await still_answers(executor)


async def test_forged_frames_from_inside_a_session_end_the_run_not_the_server(
    executor: Executor, registry: SessionRegistry
) -> None:
    session = await registry.create("python", [])
    # Inside a session the code runs in the interpreter itself and can write to its descriptors: every pipe
    # it may write to gets a forged file frame twice the inline budget.
    code = textwrap.dedent(
        """
        import fcntl, json, os, stat, struct
        blob = b"\\0" * (8 << 20)
        body = json.dumps({"name": "forged.png", "size": len(blob), "inline": True}).encode() + b"\\n" + blob
        frame = b"F" + struct.pack(">I", len(body)) + body
        for fd in range(3, 64):
            try:
                if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_WRONLY:
                    os.write(fd, frame[:65536])
            except OSError:
                pass
        """
    )
    with anyio.fail_after(120):
        result = await registry.execute(session.id, code, [], 30)
    assert result.artifacts == [] and result.interpreter_lost and result.exit_code == 137, result
    assert "broke the sandbox's result protocol" in result.stderr
    again = await registry.execute(session.id, "print(2)", [], 60)
    assert again.stdout == "2\n" and "restarted" in again.stderr
    await still_answers(executor)


async def test_a_code_that_stops_every_new_process_cannot_stretch_its_timeout(executor: Executor) -> None:
    code = """
    import os, signal
    me, seen = os.getpid(), set(os.listdir("/proc"))
    while True:
        for entry in os.listdir("/proc"):
            if entry.isdigit() and entry not in seen and int(entry) != me:
                try:
                    os.kill(int(entry), signal.SIGSTOP)
                except OSError:
                    pass
                seen.add(entry)
    """
    # A bound on a hang, not a timing assertion: before, such a call took minutes.
    with anyio.fail_after(120):
        result = await executor.execute(textwrap.dedent(code), timeout=3)
    assert result.timed_out and result.exit_code == 137, result
    await still_answers(executor)


async def test_a_session_whose_interpreter_stopped_reading_cannot_hold_a_cell_past_its_time(
    executor: Executor, registry: SessionRegistry
) -> None:
    """A thread of the session's own code stops its interpreter once the cell is over: the next cell's program,
    larger than every buffer on the way, cannot be written. The write is bounded by the cell's deadline on every
    engine (it blocked a worker thread for 120 s on Docker and for ever on Podman)."""
    session = await registry.create("python", [])
    stopper = "import os, signal, threading\nthreading.Timer(1, os.kill, (os.getpid(), signal.SIGSTOP)).start()"
    armed = await registry.execute(session.id, stopper, [], 60)
    assert armed.exit_code == 0, armed
    await anyio.sleep(3)
    with anyio.fail_after(90):  # a bound on a hang, not a timing assertion
        held = await registry.execute(session.id, "x = 1\n" + "#" * 900_000, [], 3)
    assert held.timed_out and held.interpreter_lost and held.exit_code == 137, held
    again = await registry.execute(session.id, "print(2)", [], 60)
    assert again.stdout == "2\n" and "restarted" in again.stderr, again
    await still_answers(executor)


async def test_pid_1_has_no_output_the_code_could_flood(executor: Executor) -> None:
    code = """
    import os
    for fd in (1, 2):
        try:
            target = os.readlink(f"/proc/1/fd/{fd}")
        except OSError as exc:
            target = type(exc).__name__
        print(target)
    """
    result = await executor.execute(textwrap.dedent(code))
    # Either PID 1 writes to /dev/null, or its descriptors are out of reach (bubblewrap's nested namespaces).
    assert result.stdout.split() in (["/dev/null", "/dev/null"], ["PermissionError", "PermissionError"]), result


async def test_orphans_are_reaped_so_their_pids_come_back(executor: Executor) -> None:
    code = """
    import os, time
    for _ in range(30):
        if os.fork() == 0:
            if os.fork() == 0:
                os._exit(0)  # exits after its parent: an orphan, reparented to PID 1
            os._exit(0)
        os.wait()

    def zombies():
        found = 0
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    found += stat.read().rsplit(")", 1)[1].split()[0] == "Z"
            except (OSError, IndexError):
                pass
        return found

    # An orphan may still be running when the count first reads 0: wait for 0 to hold for half a second.
    deadline, clear_since = time.monotonic() + 20, None
    while time.monotonic() < deadline:
        if zombies():
            clear_since = None
        elif clear_since is None:
            clear_since = time.monotonic()
        elif time.monotonic() - clear_since > 0.5:
            break
        time.sleep(0.05)
    print(zombies())
    """
    result = await executor.execute(textwrap.dedent(code), timeout=60)
    assert result.stdout == "0\n", result


async def test_nothing_of_a_program_runs_on_after_it_while_its_files_are_read(registry: SessionRegistry) -> None:
    session = await registry.create("javascript", [])
    spawn = textwrap.dedent(
        """
        const { spawn } = require("child_process");
        spawn("sleep", ["4242"], { detached: true, stdio: "ignore" }).unref();
        const fs = require("fs");
        fs.mkdirSync(process.env.OUTPUT_DIR, { recursive: true });
        fs.writeFileSync(process.env.OUTPUT_DIR + "/out.txt", "done");
        """
    )
    first = await registry.execute(session.id, spawn, [], 60)
    assert first.exit_code == 0 and [a.name for a in first.artifacts] == ["out.txt"], first
    check = textwrap.dedent(
        """
        const fs = require("fs");
        const alive = fs.readdirSync("/proc").filter((p) => /^\\d+$/.test(p)).filter((p) => {
          try { return fs.readFileSync(`/proc/${p}/cmdline`, "utf8").includes("4242"); } catch { return false; }
        });
        console.log(alive.length);
        """
    )
    second = await registry.execute(session.id, check, [], 60)
    assert second.stdout == "0\n", second


# Started by the program and left running: as soon as anything reads a.txt (the collector, after the program
# exited), it rewrites b.txt. Only a collector that runs with nothing of the program alive gets b.txt as the
# program left it.
REWRITER = (
    'before=$(stat -c %x a.txt); : > /tmp/ready; while [ "$(stat -c %x a.txt)" = "$before" ]; do :; done; '
    "echo tampered > b.txt"
)
LEAVES_A_REWRITER = {
    "python": f"""
import os, subprocess, time
out = os.environ["OUTPUT_DIR"]
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "a.txt"), "wb").write(b"x" * (2 << 20))
open(os.path.join(out, "b.txt"), "w").write("final\\n")
subprocess.Popen(["sh", "-c", {REWRITER!r}], cwd=out, start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while not os.path.exists("/tmp/ready"):
    time.sleep(0.01)
""",
    "javascript": f"""
const fs = require("fs");
const out = process.env.OUTPUT_DIR;
fs.mkdirSync(out, {{ recursive: true }});
fs.writeFileSync(out + "/a.txt", Buffer.alloc(2 << 20, "x"));
fs.writeFileSync(out + "/b.txt", "final\\n");
require("child_process").spawn("sh", ["-c", {REWRITER!r}], {{ cwd: out, detached: true, stdio: "ignore" }}).unref();
while (!fs.existsSync("/tmp/ready")) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10);
""",
    "ruby": f"""
out = ENV["OUTPUT_DIR"]
Dir.mkdir(out) unless Dir.exist?(out)
File.binwrite(File.join(out, "a.txt"), "x" * (2 << 20))
File.write(File.join(out, "b.txt"), "final\\n")
null = File::NULL
Process.detach(Process.spawn("sh", "-c", {REWRITER!r}, chdir: out, pgroup: true, in: null, out: null, err: null))
sleep 0.01 until File.exist?("/tmp/ready")
""",
}


@pytest.mark.parametrize("language", sorted(LEAVES_A_REWRITER))
async def test_a_process_left_running_is_killed_before_the_files_are_read(executor: Executor, language: str) -> None:
    result = await executor.execute(LEAVES_A_REWRITER[language], language=language, timeout=60)
    assert result.exit_code == 0, result
    files = {artifact.name: artifact.data for artifact in result.artifacts}
    assert files.get("b.txt") == b"final\n" and len(files.get("a.txt") or b"") == 2 << 20, sorted(files)
    await still_answers(executor)


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("javascript", "require('fs').openSync(`/proc/${process.ppid}/fd/1`, 'w')"),
        ("ruby", "File.open(\"/proc/#{Process.ppid}/fd/1\", 'w')"),
    ],
)
async def test_the_warm_runners_protocol_pipe_cannot_be_opened_by_the_code(
    executor: Executor, language: str, code: str
) -> None:
    result = await executor.execute(code, language=language, timeout=60)
    assert result.exit_code != 0 and ("EACCES" in result.stderr or "Permission denied" in result.stderr), result
    assert result.artifacts == []
    await still_answers(executor)


# Stops every process that appears after it starts, the moment it may be signalled (a PID namespace hands pids
# out in order; the kernel's own threads are left alone): whatever the server would start in the sandbox to
# interrupt the cell is stopped before it acts. A stopped `runc init` held the engine's every call on that
# container (the cell, its kill, its removal) for minutes.
STOP_NEWCOMERS = """
import os, signal
mine = {int(task) for task in os.listdir("/proc/self/task")}
last = max(mine | {int(entry) for entry in os.listdir("/proc") if entry.isdigit()})
waiting = set(range(last + 1, last + 200)) - mine
while waiting:
    for pid in sorted(waiting)[:16]:
        try:
            os.kill(pid, signal.SIGSTOP)
            waiting.discard(pid)
        except OSError:
            pass
"""


async def test_a_cell_that_stops_every_new_process_is_still_interrupted_at_its_timeout(
    executor: Executor, registry: SessionRegistry
) -> None:
    """The server keeps a cell's time and interrupts it through the kernel's own stream: nothing started in the
    sandbox, so nothing the code can stop, and the cell ends at its timeout with its session's state kept."""
    session = await registry.create("python", [])
    await registry.execute(session.id, "x = 1", [], 60)
    with anyio.fail_after(60):  # a bound on a hang, not a timing assertion: before, such a cell took minutes
        result = await registry.execute(session.id, textwrap.dedent(STOP_NEWCOMERS), [], 3)
    assert result.timed_out and not result.interpreter_lost and "KeyboardInterrupt" in result.stderr, result
    again = await registry.execute(session.id, "print(x)", [], 60)
    assert (again.exit_code, again.stdout) == (0, "1\n"), again
    await still_answers(executor)


async def test_signals_the_code_sends_pid_1_do_not_end_its_session(
    executor: Executor, registry: SessionRegistry
) -> None:
    """PID 1 survives every signal the code may send it, and the session keeps its state. SIGUSR1 is the container
    engines' kill request (Kubernetes can only send it from inside): there it kills the sender's own processes,
    and the next cell says the interpreter was lost, then it is restarted."""
    session = await registry.create("python", [])
    code = "import os, signal, time\nx = 41\nfor name in ('INT', 'TERM', 'HUP', 'QUIT', 'USR2', 'ALRM', 'PIPE'):\n"
    code += "    os.kill(1, getattr(signal, 'SIG' + name))\n    time.sleep(0.1)"
    assert (await registry.execute(session.id, code, [], 60)).exit_code == 0
    check = "print(x + 1 if 'x' in dir() else 'gone')"
    kept = await registry.execute(session.id, check, [], 60)
    assert (kept.exit_code, kept.stdout) == (0, "42\n"), kept
    await registry.execute(session.id, "import os, signal, time\nos.kill(1, signal.SIGUSR1)\ntime.sleep(0.5)", [], 60)
    again = await registry.execute(session.id, check, [], 60)
    if again.stdout == "42\n":  # bubblewrap and NsJail: their PID 1 ignores it too
        return
    if again.interpreter_lost:  # it died after its cell: this cell says so, the next one restarts it
        assert "the interpreter was lost" in again.stderr, again
        again = await registry.execute(session.id, check, [], 60)
    assert again.stdout == "gone\n" and "restarted" in again.stderr, again


# PID 1 from inside: its memory, its environment, a ptrace attach. Each line: what was tried, and "refused" or
# what was reached.
PID_1_PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for path, flags in (("/proc/1/mem", os.O_RDWR), ("/proc/1/environ", os.O_RDONLY)):
    try:
        os.close(os.open(path, flags))  # the kernel checks at open (reading /proc/1/mem at 0 fails anyway)
        print(path, "reached")
    except OSError as exc:
        print(path, "refused" if exc.errno in (1, 13) else f"errno {exc.errno}")
if libc.ptrace(16, 1, None, None) == 0:  # PTRACE_ATTACH
    print("ptrace reached")
else:
    print("ptrace", "refused" if ctypes.get_errno() in (1, 13) else f"errno {ctypes.get_errno()}")
"""
PID_1_REFUSED = ["/proc/1/mem refused", "/proc/1/environ refused", "ptrace refused"]
# The same in JavaScript (no ptrace from Node without a native module), for a pooled sandbox of the supervisor.
PID_1_PROBE_JS = """
const fs = require("fs");
for (const [path, flags] of [["/proc/1/mem", "r+"], ["/proc/1/environ", "r"]]) {
  try {
    fs.closeSync(fs.openSync(path, flags));
    console.log(path, "reached");
  } catch (e) {
    console.log(path, e.code === "EACCES" || e.code === "EPERM" ? "refused" : e.code);
  }
}
"""


async def test_pid_1_is_out_of_reach_of_the_code_in_every_kind_of_sandbox(
    executor: Executor, registry: SessionRegistry
) -> None:
    """PID 1 of a pooled sandbox, a zygote child and a session is not dumpable: no process of the sandbox user can
    write its memory, read its environment or attach to it (before, a container's PID 1 was dumpable, and where
    Yama allows it /proc/1/mem was writable). The orphan test proves it still reaps."""
    session = await registry.create("python", [])
    in_session = await registry.execute(session.id, PID_1_PROBE, [], 60)
    assert in_session.stdout.splitlines() == PID_1_REFUSED, in_session
    one_shot = await executor.execute(PID_1_PROBE, timeout=60)
    assert one_shot.stdout.splitlines() == PID_1_REFUSED, one_shot
    pooled = await executor.execute(PID_1_PROBE_JS, language="javascript", timeout=60)
    assert pooled.stdout.splitlines() == PID_1_REFUSED[:2], pooled
    await still_answers(executor)


async def test_a_session_that_stops_every_new_process_cannot_hang_its_file_tools_or_its_description(
    executor: Executor, registry: SessionRegistry
) -> None:
    """A thread of the session's code stops every process that appears once its cell is over, so what the server
    starts in the sandbox (a file listing, a read, the usage reading) is stopped before it acts. Each ends at its
    own deadline with a clear result (an error saying so; a description without the reading), the sandbox's
    processes killed, and the next cell restarts the interpreter. Before, a stopped `runc init` held every Docker
    call on the container: the listing, its kill and the session's removal each waited out their timeouts."""
    session = await registry.create("python", [])
    files = Files(executor.settings, executor.backend)
    files.deadline = 5.0  # the tools' 60 s, shortened to keep the test short
    ref = session.lease.ref
    stopper = "import threading\nthreading.Thread(target=exec, args=(STOP_NEWCOMERS,), daemon=True).start()"
    stopper = f"STOP_NEWCOMERS = {STOP_NEWCOMERS!r}\n" + stopper

    # Kubernetes may see the transfer killed before its own clock says so.
    stalled = r"did not answer within 5 s: its own code may be stopping|was killed \(exit status 137\)"

    async def list_files() -> None:
        with pytest.raises(FileTransferError, match=stalled):
            await files.list(ref)

    async def read_a_file() -> None:
        with pytest.raises(FileTransferError, match=stalled):
            await files.download(ref, "main.py")

    async def describe() -> None:
        assert await registry.usage(session) == {"workspace_bytes": None, "memory_bytes": None}

    for attempt in (list_files, read_a_file, describe):
        armed = await registry.execute(session.id, stopper, [], 60)
        if armed.interpreter_lost:  # killed with the last attempt: this cell says so, the next one restarts it
            armed = await registry.execute(session.id, stopper, [], 60)
        assert armed.exit_code == 0, armed
        with anyio.fail_after(60):  # a bound on a hang, not a timing assertion
            await attempt()
    again = await registry.execute(session.id, "print(2)", [], 60)
    if again.interpreter_lost:
        assert "the interpreter was lost" in again.stderr, again
        again = await registry.execute(session.id, "print(2)", [], 60)
    assert again.stdout == "2\n" and "restarted" in again.stderr, again
    await still_answers(executor)
