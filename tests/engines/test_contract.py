"""One suite for every real backend: what code inside the sandbox can see and do, and what the server gets back."""

from __future__ import annotations

import resource
import textwrap

import anyio
import pytest

from llm_sandbox_mcp.errors import InvalidRequest
from llm_sandbox_mcp.executor import Executor
from llm_sandbox_mcp.languages import get_language
from llm_sandbox_mcp.models import Execution
from tests.engines.conftest import RecordingBackend, engine_settings

pytestmark = pytest.mark.anyio


async def run(executor: Executor, code: str, **kwargs: object) -> Execution:
    return await executor.execute(textwrap.dedent(code), **kwargs)  # type: ignore[arg-type]


async def test_hello_world(executor: Executor) -> None:
    result = await run(executor, "print('hello from the sandbox')")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "hello from the sandbox\n", "")
    assert not result.timed_out and not result.truncated
    assert result.artifacts == []


async def test_a_failing_program_is_a_result_with_the_users_line_numbers(executor: Executor) -> None:
    result = await run(executor, "x = 1\ny = 2\nraise ValueError('boom')\n")
    assert result.exit_code == 1
    assert 'File "/workspace/main.py", line 3, in <module>' in result.stderr
    assert "ValueError: boom" in result.stderr
    assert "python_runner" not in result.stderr and "<string>" not in result.stderr


async def test_exit_codes_and_syntax_errors(executor: Executor) -> None:
    assert (await run(executor, "import sys; sys.exit(7)")).exit_code == 7
    broken = await run(executor, "def f(:\n  pass")
    assert broken.exit_code == 1 and "SyntaxError" in broken.stderr and "main.py" in broken.stderr


async def test_sandbox_has_no_capabilities_no_root_and_no_new_privileges(executor: Executor) -> None:
    result = await run(
        executor,
        """
        import os
        status = dict(line.split(':\\t', 1) for line in open('/proc/self/status').read().splitlines() if ':\\t' in line)
        fields = [status[name].strip() for name in ('CapEff', 'CapPrm', 'NoNewPrivs')]
        print(os.getuid(), os.getgid(), *fields)
        """,
    )
    uid, gid, cap_eff, cap_prm, no_new_privs = result.stdout.split()
    assert uid != "0" and gid != "0"
    assert int(cap_eff, 16) == 0 and int(cap_prm, 16) == 0
    assert no_new_privs == "1"


async def test_open_files_and_core_dumps_are_limited(executor: Executor) -> None:
    result = await run(
        executor,
        "import resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrlimit(resource.RLIMIT_CORE))",
    )
    nofile = executor.limits.nofile
    assert result.stdout == f"({nofile}, {nofile}) (0, 0)\n"


async def test_sandbox_has_only_a_loopback_interface(executor: Executor) -> None:
    result = await run(
        executor,
        "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]))",
    )
    assert result.stdout.strip() == "['lo']"


async def test_root_filesystem_is_read_only_and_workspace_and_tmp_are_writable(executor: Executor) -> None:
    result = await run(
        executor,
        """
        import os
        for path in ('/etc/probe', '/usr/probe', '/probe', '/workspace/probe', '/tmp/probe'):
            try:
                open(path, 'w').write('x')
                print(path, 'writable')
            except OSError as exc:
                print(path, 'denied', exc.errno)
        """,
    )
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["/etc/probe"].startswith("denied")
    assert lines["/usr/probe"].startswith("denied")
    assert lines["/probe"].startswith("denied")
    assert lines["/workspace/probe"] == "writable"
    assert lines["/tmp/probe"] == "writable"


async def test_the_servers_environment_is_not_visible_inside(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_SANDBOX_CANARY_SECRET", "do-not-leak")
    result = await run(executor, "import os; print(sorted(os.environ))")
    assert "LLM_SANDBOX_CANARY_SECRET" not in result.stdout
    assert "do-not-leak" not in result.stdout


async def test_a_fork_bomb_is_contained_by_the_pids_limit(executor: Executor) -> None:
    result = await run(
        executor,
        """
        import os, time
        children = 0
        try:
            while True:
                pid = os.fork()
                if pid == 0:
                    time.sleep(30)
                    os._exit(0)
                children += 1
        except OSError as exc:
            print('stopped after', children, exc.errno)
        """,
        timeout=20,
    )
    assert result.stdout.startswith("stopped after"), result.stderr
    children = int(result.stdout.split()[2])
    assert 0 < children < executor.limits.pids


async def test_a_memory_bomb_is_killed(executor: Executor) -> None:
    result = await run(
        executor, "blocks = []\nwhile True:\n    blocks.append(bytearray(64 * 1024 * 1024))\n", timeout=30
    )
    assert result.exit_code != 0
    assert result.exit_code == 137 or "MemoryError" in result.stderr


async def test_a_timeout_kills_every_process_and_keeps_partial_output(
    executor: Executor, backend: RecordingBackend
) -> None:
    spec = executor.spec_for(get_language("python"))
    ref = await backend.create(spec)
    try:
        result = await backend.exec(
            ref,
            ["sh", "-c", "echo started; sleep 1000 & (sleep 1000 &) ; python3 -c 'while True: pass'"],
            timeout=2,
        )
        assert result.timed_out
        assert result.stdout == b"started\n"
        listing = "for p in /proc/[0-9]*; do grep -q 'State:.*Z' $p/status || cat $p/comm; done"
        survivors = await backend.exec(ref, ["sh", "-c", listing], timeout=10)
        # Only PID 1 (the idle sleeper) and this listing's own processes are alive (on bubblewrap these include
        # the bwrap that launched it); zombies are dead.
        listing_itself = ("sh", "cat", "grep", "bwrap")
        remaining = [name for name in survivors.stdout.decode().split() if name not in listing_itself]
        assert remaining == ["sleep"], remaining
    finally:
        await backend.destroy(ref)


async def test_an_infinite_loop_times_out_as_a_result(executor: Executor) -> None:
    result = await run(executor, "print('before', flush=True)\nwhile True: pass\n", timeout=2)
    assert result.timed_out
    assert result.stdout == "before\n"
    assert "timed out after 2 s" in result.stderr


async def test_an_output_flood_is_capped_head_and_tail_without_growing_the_server(executor: Executor) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = await run(
        executor,
        """
        import sys
        sys.stdout.write('FIRST\\n')
        chunk = 'x' * (1 << 20)
        for _ in range(200):
            sys.stdout.write(chunk)
        sys.stdout.write('\\nLAST\\n')
        """,
        timeout=120,
    )
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert result.exit_code == 0 and result.truncated
    assert result.stdout.startswith("FIRST\n") and result.stdout.endswith("LAST\n")
    assert len(result.stdout) < executor.settings.sandbox_output_limit + 200
    assert grown_kib < 100 * 1024


async def test_invalid_utf8_output_is_replaced(executor: Executor) -> None:
    result = await run(
        executor, "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe\\n')\nsys.stderr.buffer.write(b'\\xc3')"
    )
    assert result.stdout == "ok \ufffd\ufffd\n"
    assert result.stderr == "\ufffd"


async def test_unicode_in_and_out(executor: Executor) -> None:
    result = await run(executor, "print('héllo wörld ✓ 日本')")
    assert result.stdout == "héllo wörld ✓ 日本\n"


async def test_huge_code_runs_and_oversized_code_is_refused(executor: Executor) -> None:
    big = "x = 0\n" + "x += 1\n" * 100_000 + "print(x)\n"
    assert (await run(executor, big)).stdout == "100000\n"
    with pytest.raises(InvalidRequest, match="limit is 1048576 bytes"):
        await run(executor, "#" * (1024 * 1024 + 1))


async def test_every_matplotlib_figure_comes_back_with_no_setup_text(executor: Executor) -> None:
    result = await run(
        executor,
        """
        import os
        import matplotlib.pyplot as plt
        plt.plot([1, 2, 3]); plt.show()
        plt.figure(); plt.bar(['a', 'b'], [3, 1]); plt.show()
        fig = plt.figure(); plt.scatter([1, 2], [2, 1])
        fig.savefig(os.path.join(os.environ['OUTPUT_DIR'], 'scatter.svg'))
        plt.figure(); plt.plot([3, 2, 1])
        print('done')
        """,
        timeout=60,
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "done\n"
    names = [(a.name, a.mime_type) for a in result.artifacts]
    pngs = [name for name, mime in names if mime == "image/png"]
    assert len(pngs) == 4, names  # two shown, two left open (the scatter one was also saved as SVG)
    assert ("scatter.svg", "image/svg+xml") in names
    for artifact in result.artifacts:
        assert artifact.data is not None
        if artifact.mime_type == "image/png":
            assert artifact.data.startswith(b"\x89PNG\r\n\x1a\n")


async def test_libraries_install_with_network_then_run_without_and_are_cached(
    executor: Executor, backend: RecordingBackend, engine: str
) -> None:
    code = "import six, socket\nprint(six.__name__, socket.gethostbyname_ex.__name__)\n"
    first = await run(executor, code, libraries=["six"], timeout=60)
    assert first.exit_code == 0, first.stderr
    assert first.stdout.startswith("six ")
    no_network = await run(executor, "print(open('/proc/net/dev').read().count(':'))", libraries=["six"])
    assert no_network.stdout.strip() == "1"  # only lo, even with libraries
    read_only = await run(executor, "open('/opt/llm-sandbox/libs/python/evil.py', 'w')", libraries=["six"])
    assert read_only.exit_code == 1 and "Read-only file system" in read_only.stderr

    # A new server process (fresh executor) on the same engine reuses the cache and installs nothing.
    backend.argvs.clear()
    async with Executor(engine_settings(engine), backend) as fresh:
        again = await fresh.execute(code, libraries=["six"])
    assert again.stdout == first.stdout
    assert not any("pip" in argv for argv in backend.argvs)


async def test_an_unknown_library_is_an_install_error_with_pips_message(executor: Executor) -> None:
    from llm_sandbox_mcp.errors import InstallFailed

    with pytest.raises(InstallFailed, match="No matching distribution|not find a version"):
        await run(executor, "pass", libraries=["no-such-package-llm-sandbox-zz9"], timeout=60)


async def test_calls_run_concurrently(executor: Executor) -> None:
    results: list[Execution] = []

    async def one(n: int) -> None:
        results.append(await run(executor, f"print({n} * 2)"))

    async with anyio.create_task_group() as tasks:
        for n in range(4):
            tasks.start_soon(one, n)
    assert sorted(r.stdout for r in results) == ["0\n", "2\n", "4\n", "6\n"]


async def test_a_process_whose_sandbox_vanishes_under_it_ends_with_status_137(
    executor: Executor, backend: RecordingBackend
) -> None:
    ref = await backend.create(executor.spec_for(get_language("python")))
    results: list[int] = []

    async def long_running() -> None:
        results.append((await backend.exec(ref, ["sh", "-c", "touch /tmp/started; sleep 300"], timeout=120)).exit_code)

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(long_running)
            started = await backend.exec(
                ref, ["sh", "-c", "until [ -f /tmp/started ]; do sleep 0.05; done"], timeout=60
            )
            assert not started.timed_out
            await backend.destroy(ref)
    finally:
        await backend.destroy(ref)
    assert results == [137]
