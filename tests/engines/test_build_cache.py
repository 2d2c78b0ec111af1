"""A Go or C++ program already built runs without a build, on every engine, and nothing the program does can
change what the next identical call runs.

Each program tells from inside whether it was built for this call: a build writes ./main after the source, a
hit finds ./main (written by the supervisor) older than or as old as the source the run script writes next.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

import pytest

from llm_sandbox_mcp.languages import get_language
from llm_sandbox_mcp.models import Execution
from llm_sandbox_mcp.run.executor import Executor
from tests.engines.conftest import RecordingBackend, engine_settings

pytestmark = pytest.mark.anyio

WHICH = {
    "go": 'package main\n\nimport (\n\t"fmt"\n\t"os"\n)\n\nfunc main() {\n\tbin, _ := os.Stat("main")\n'
    '\tsrc, _ := os.Stat("main.go")\n\tif bin.ModTime().After(src.ModTime()) {\n\t\tfmt.Println("built")\n'
    '\t} else {\n\t\tfmt.Println("cached")\n\t}\n\tfmt.Println("hello")\n}\n',
    "cpp": "#include <filesystem>\n#include <iostream>\n\nint main() {\n    namespace fs = std::filesystem;\n"
    '    bool built = fs::last_write_time("main") > fs::last_write_time("main.cpp");\n'
    '    std::cout << (built ? "built" : "cached") << "\\nhello\\n";\n}\n',
}

# Says how it was started, then attacks everything the next call could run: each of its descriptors, every
# descriptor of every other process it can open through /proc, and its own ./main, replaced by a script. Its
# words are spelled backwards in the source, so that only a tampered binary holds "tampered".
TAMPER = r"""#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

static std::string backwards(const std::string& text) { return {text.rbegin(), text.rend()}; }

int main() {
    namespace fs = std::filesystem;
    std::puts(fs::last_write_time("main") > fs::last_write_time("main.cpp") ? "built" : "cached");
    std::fflush(stdout);
    std::string junk = backwards("derepmat FLE") + std::string(4096, 'x');
    for (int fd = 3; fd < 1024; ++fd) (void)!write(fd, junk.data(), junk.size());
    std::string self = std::to_string(getpid());
    if (DIR* proc = opendir("/proc")) {
        while (dirent* entry = readdir(proc)) {
            std::string pid = entry->d_name;
            if (pid.find_first_not_of("0123456789") != std::string::npos || pid == self) continue;
            std::string dir = "/proc/" + pid + "/fd";
            if (DIR* fds = opendir(dir.c_str())) {
                while (dirent* fd = readdir(fds)) {
                    int opened = open((dir + "/" + fd->d_name).c_str(), O_WRONLY | O_NONBLOCK);
                    if (opened >= 0) {
                        (void)!write(opened, junk.data(), junk.size());
                        close(opened);
                    }
                }
                closedir(fds);
            }
        }
        closedir(proc);
    }
    unlink("main");
    if (FILE* fake = std::fopen("main", "w")) {
        std::fputs(("#!/bin/sh\necho " + backwards("derepmat") + "\n").c_str(), fake);
        std::fclose(fake);
    }
    chmod("main", 0755);
}
"""


@asynccontextmanager
async def cache_of(backend: RecordingBackend, engine: str, size: str = "256m") -> AsyncGenerator[Executor]:
    async with Executor(engine_settings(engine, sandbox_build_cache_size=size), backend) as executor:
        yield executor


async def twice(executor: Executor, code: str, language: str) -> tuple[Execution, Execution]:
    first = await executor.execute(code, language, timeout=120)
    return first, await executor.execute(code, language, timeout=120)


@pytest.mark.parametrize("language", ["go", "cpp"])
async def test_a_program_already_built_is_run_without_a_build(
    backend: RecordingBackend, engine: str, language: str
) -> None:
    async with cache_of(backend, engine) as executor:
        built, cached = await twice(executor, WHICH[language], language)
        assert (built.exit_code, built.stdout, built.stderr, built.phase) == (0, "built\nhello\n", "", "run")
        assert (cached.exit_code, cached.stdout, cached.stderr, cached.phase) == (0, "cached\nhello\n", "", "run")
        assert (executor.builds.hits, executor.builds.stores) == (1, 1)
        # Another source is another program.
        other = await executor.execute(WHICH[language] + "// another\n", language, timeout=120)
        assert (other.exit_code, other.stdout) == (0, "built\nhello\n"), other.stderr


async def test_the_same_source_with_other_libraries_is_another_program(backend: RecordingBackend, engine: str) -> None:
    async with cache_of(backend, engine) as executor:
        plain = await executor.execute(WHICH["cpp"], "cpp", timeout=120)
        with_fmt = await executor.execute(WHICH["cpp"], "cpp", ["libfmt-dev"], timeout=300)
        again = await executor.execute(WHICH["cpp"], "cpp", ["libfmt-dev"], timeout=120)
        assert [plain.stdout, with_fmt.stdout, again.stdout] == ["built\nhello\n", "built\nhello\n", "cached\nhello\n"]
        assert (executor.builds.stores, executor.builds.hits) == (2, 1)


async def test_what_a_program_does_cannot_change_what_the_next_identical_call_runs(
    backend: RecordingBackend, engine: str
) -> None:
    lang = get_language("cpp")
    async with cache_of(backend, engine) as executor:
        # C++ runs mount the C++ store (its precompiled headers) even without libraries.
        spec = executor.spec_for(lang, await executor.libraries.ensure(lang, []))
        key = await executor.builds.key(lang, spec, TAMPER.encode())
        built = await executor.execute(TAMPER, "cpp", timeout=120)
        assert (built.exit_code, built.stdout.splitlines()[0], built.stderr) == (0, "built", "")
        kept = executor.builds.get(key)
        assert kept is not None and kept.startswith(b"\x7fELF") and b"tampered" not in kept
        cached = await executor.execute(TAMPER, "cpp", timeout=120)
        assert (cached.exit_code, cached.stdout.splitlines()[0], cached.stderr) == (0, "cached", "")
        assert "tampered" not in cached.stdout and executor.builds.get(key) == kept and executor.builds.stores == 1


async def test_compile_errors_and_builds_with_warnings_are_not_kept(backend: RecordingBackend, engine: str) -> None:
    async with cache_of(backend, engine) as executor:
        first, second = await twice(executor, "int main() { return missing; }\n", "cpp")
        assert first.phase == second.phase == "compile" and first.stderr == second.stderr
        assert "missing" in second.stderr
        warned = '#include <cstdio>\n\nint main() {\n    int unused = 1;\n    std::puts("ok");\n}\n'
        first, second = await twice(executor, warned, "cpp")
        assert first.stdout == second.stdout == "ok\n" and "-Wunused-variable" in second.stderr
        assert (executor.builds.stores, len(executor.builds)) == (0, 0)


async def test_a_cached_binary_that_does_not_start_is_built_again(backend: RecordingBackend, engine: str) -> None:
    lang = get_language("cpp")
    async with cache_of(backend, engine) as executor:
        spec = executor.spec_for(lang, await executor.libraries.ensure(lang, []))
        key = await executor.builds.key(lang, spec, WHICH["cpp"].encode())
        executor.builds.put(key, b"\x7fELF\x02\x01\x01" + b"\0" * 64)
        result = await executor.execute(WHICH["cpp"], "cpp", timeout=120)
        assert (result.exit_code, result.stdout, result.stderr) == (0, "built\nhello\n", "")
        assert (executor.builds.get(key) or b"").startswith(b"\x7fELF\x02") and executor.builds.stores == 2


async def test_a_cached_program_whose_own_status_is_127_runs_once(backend: RecordingBackend, engine: str) -> None:
    """126 and 127 are also what a shell says when ./main cannot start: only that (the shell's or the dynamic
    loader's own words) makes the server build again, not a program that ran and chose that status."""
    code = '#include <cstdio>\n\nint main() {\n    std::fputs("ran\\n", stderr);\n    return 127;\n}\n'
    async with cache_of(backend, engine) as executor:
        built, cached = await twice(executor, code, "cpp")
        assert (built.exit_code, built.stderr) == (cached.exit_code, cached.stderr) == (127, "ran\n"), cached
        assert (executor.builds.hits, executor.builds.stores) == (1, 1)  # ran from the cache, not built again


@pytest.mark.parametrize(("size", "language"), [("1m", "go"), ("0", "cpp")])
async def test_a_binary_over_the_cache_size_is_not_kept_and_size_zero_turns_it_off(
    backend: RecordingBackend, engine: str, size: str, language: str
) -> None:
    async with cache_of(backend, engine, size) as executor:
        first, second = await twice(executor, WHICH[language], language)
        assert first.stdout == second.stdout == "built\nhello\n", second.stderr
        assert len(executor.builds) == executor.builds.hits == 0
