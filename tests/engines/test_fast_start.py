"""The compiled languages' fast starts, proven from inside the sandbox on every engine: the warm JVM starts from
the runner jar and class data archive made in the Java store, g++ uses the C++ store's precompiled headers,
a sandbox can write neither, and a bad, missing or foreign archive or header gives the same result, slower.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import PurePosixPath

import pytest

from llm_sandbox_mcp.cache_index import CacheIndex
from llm_sandbox_mcp.images import run_image
from llm_sandbox_mcp.languages import Language, get_language, sandbox_env
from llm_sandbox_mcp.models import LIBS_DIR, WORKDIR, CacheMount, SandboxSpec
from llm_sandbox_mcp.run.executor import Executor
from tests.engines.conftest import RecordingBackend, engine_settings

pytestmark = pytest.mark.anyio

RUNNER = f"{LIBS_DIR}/java/.runner"
PCH = f"{LIBS_DIR}/cpp/pch"
JAVA_FILES = ("runner.jsa", "runner.jar", "made-for", "new")
CPP_FILES = ("iostream.gch", "bits/stdc++.h.gch", "new.gch")


def _quoted(names: tuple[str, ...]) -> str:
    return ", ".join(f'"{name}"' for name in names)


# Whether the JVM mapped the store's archive, how it was started, and whether each of the store's files (and a
# new one) opens for writing.
JAVA_PROBE = (
    "import java.io.FileOutputStream;\nimport java.nio.file.*;\n\npublic class Probe {\n"
    "    public static void main(String[] args) throws Exception {\n"
    '        boolean mapped = Files.readAllLines(Path.of("/proc/self/maps")).stream()\n'
    '                .anyMatch(line -> line.endsWith("/.runner/runner.jsa"));\n'
    '        String argv = ProcessHandle.current().info().arguments().map(a -> String.join(" ", a)).orElse("");\n'
    '        System.out.println((mapped ? "mapped " : "not-mapped ")\n'
    '                + (argv.contains("runner.jar") ? "jar" : "source"));\n'
    f"        for (String name : new String[] {{{_quoted(JAVA_FILES)}}}) {{\n"
    f'            try (FileOutputStream out = new FileOutputStream("{RUNNER}/" + name, true)) {{\n'
    '                System.out.println(name + " writable");\n'
    "            } catch (Exception e) {\n"
    '                System.out.println(name + " refused");\n'
    "            }\n        }\n"
    '        System.out.println("hello");\n    }\n}\n'
)
JAVA_REFUSED = "".join(f"{name} refused\n" for name in JAVA_FILES) + "hello\n"

CPP_PROBE = (
    "#include <iostream>\n\n#include <fcntl.h>\n#include <unistd.h>\n\nint main() {\n"
    f"    for (const char* name : {{{_quoted(CPP_FILES)}}}) {{\n"
    f'        int fd = open((std::string("{PCH}/") + name).c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);\n'
    '        std::cout << name << (fd >= 0 ? " writable" : " refused") << "\\n";\n'
    "        if (fd >= 0) close(fd);\n    }\n"
    '    std::cout << "hello\\n";\n}\n'
)
CPP_REFUSED = "".join(f"{name} refused\n" for name in CPP_FILES) + "hello\n"

# The fallbacks do not depend on the engine, only on where the JDK and g++ come from: an image, or the host.
ONE_OF_EACH_KIND = pytest.mark.parametrize(
    "engine",
    [pytest.param("docker", marks=pytest.mark.docker), pytest.param("bubblewrap", marks=pytest.mark.bubblewrap)],
    indirect=True,
)
# On the sandbox's PATH before g++: the same g++ with -H, which lists each header read ("! x.gch": a
# precompiled header used, "x x.gch": one found invalid).
GXX_WRAPPER = f'#!/bin/sh\nPATH=${{PATH#{WORKDIR}/.bin:}}\nexec g++ -H "$@"\n'


async def test_the_warm_jvm_starts_from_the_store_s_jar_and_archive_which_it_cannot_write(executor: Executor) -> None:
    result = await executor.execute(JAVA_PROBE, "java", timeout=120)
    assert (result.exit_code, result.stderr, result.phase) == (0, "", "run")
    assert result.stdout == "mapped jar\n" + JAVA_REFUSED


async def test_cpp_compiles_with_the_store_s_precompiled_headers_which_it_cannot_write(
    backend: RecordingBackend, executor: Executor
) -> None:
    result = await executor.execute(CPP_PROBE, "cpp", timeout=120)
    assert (result.exit_code, result.stderr, result.phase, result.stdout) == (0, "", "run", CPP_REFUSED)
    lang = get_language("cpp")
    headers = await headers_read(backend, executor, lang, await executor.libraries.ensure(lang, []))
    assert f"! {PCH}/iostream.gch" in headers, headers


@ONE_OF_EACH_KIND
async def test_a_bad_missing_or_foreign_java_archive_gives_the_same_result(
    backend: RecordingBackend, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with private_store(backend, engine, monkeypatch, "java") as (executor, change):
        for damage, started in [
            ("", "mapped jar"),
            # Garbage of the same size and time (the JVM writes its archive read-only, 0444): the JVM ignores it.
            (
                "cp -p runner.jsa /tmp/made && chmod u+w runner.jsa && "
                "head -c $(stat -c %s /tmp/made) /dev/urandom > runner.jsa && touch -r /tmp/made runner.jsa",
                "not-mapped jar",
            ),
            # Truncated (on which some JVMs crash): not offered.
            ("truncate -s 100000 runner.jsa", "not-mapped source"),
            ("echo another JDK > made-for", "not-mapped source"),
            ("rm -f runner.jsa runner.jar made-for", "not-mapped source"),
        ]:
            await change(f"cd {RUNNER} && {damage or 'true'}")
            result = await executor.execute(JAVA_PROBE, "java", timeout=120)
            assert (result.exit_code, result.stderr, result.phase) == (0, "", "run"), damage
            assert result.stdout == f"{started}\n" + JAVA_REFUSED, damage


@ONE_OF_EACH_KIND
async def test_a_bad_or_missing_precompiled_header_gives_the_same_result(
    backend: RecordingBackend, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lang = get_language("cpp")
    async with private_store(backend, engine, monkeypatch, "cpp") as (executor, change):
        key = executor.libraries.key(lang, [])
        for damage, read in [
            ("head -c 4096 /dev/urandom > iostream.gch", f"x {PCH}/iostream.gch"),
            ("rm -rf bits iostream.gch", "iostream"),
        ]:
            await change(f"cd {PCH} && {damage}")
            result = await executor.execute(CPP_PROBE, "cpp", timeout=120)
            assert (result.exit_code, result.stderr, result.phase) == (0, "", "run"), damage
            assert result.stdout == CPP_REFUSED, damage
            headers = await headers_read(backend, executor, lang, key)
            assert read in headers and f"! {PCH}/iostream.gch" not in headers, headers


@asynccontextmanager
async def private_store(
    backend: RecordingBackend, engine: str, monkeypatch: pytest.MonkeyPatch, language: str
) -> AsyncGenerator[tuple[Executor, Callable[[str], Awaitable[None]]]]:
    """An executor whose store of `language` without libraries has a key of its own (other tests, and other runs
    on this machine, keep theirs), made by the real installer and changed by `change` between calls; the store
    is removed once the executor and its sandboxes are gone."""
    lang = get_language(language)
    key = uuid.uuid4().hex

    def private_key(_lang: Language, _specs: list[str], _owner: str = "") -> str:
        return key

    try:
        async with Executor(engine_settings(engine), backend) as executor:
            monkeypatch.setattr(executor.libraries, "key", private_key)
            await executor.libraries.ensure(lang, [])

            async def change(script: str) -> None:
                writable = CacheMount(key, writable=True)
                ref = await backend.create(
                    SandboxSpec(run_image(executor.settings, language), executor.limits, writable)
                )
                try:
                    done = await backend.exec(ref, ["sh", "-c", script], timeout=60)
                    assert done.exit_code == 0, done.stderr
                finally:
                    await backend.destroy(ref)

            yield executor, change
    finally:
        await backend.drop_cache(key)
        CacheIndex().forget(backend.name, key)


async def headers_read(backend: RecordingBackend, executor: Executor, lang: Language, key: str) -> str:
    """The headers g++ read (its -H list) when the C++ run script builds the probe in a sandbox with store `key`."""
    ref = await backend.create(executor.spec_for(lang, key))
    try:
        path = (await backend.exec(ref, ["sh", "-c", 'printf %s "$PATH"'], timeout=30)).stdout.decode()
        bin_dir = PurePosixPath(WORKDIR) / ".bin"
        made = await backend.exec(
            ref,
            ["sh", "-c", f"mkdir -p {bin_dir} && cat > {bin_dir}/g++ && chmod 755 {bin_dir}/g++"],
            stdin=GXX_WRAPPER.encode(),
            timeout=30,
        )
        assert made.exit_code == 0, made.stderr
        env = {**sandbox_env(lang, with_libraries=True), "PATH": f"{bin_dir}:{path}"}
        built = await backend.exec(ref, lang.run_argv(), stdin=CPP_PROBE.encode(), env=env, timeout=120)
        assert built.exit_code == 0 and built.stdout.decode().endswith("hello\n"), built.stderr
        return built.stderr.decode(errors="replace")
    finally:
        await backend.destroy(ref)
