"""The build cache: its bounds, what its key depends on, and binaries coming back from a sandbox as hostile
frames (oversized, truncated, lying about their size, not asked for)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from llm_sandbox_mcp.backends import ImageInfo
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.languages import get_language
from llm_sandbox_mcp.models import CacheMount, ExecResult, Limits, SandboxRef, SandboxSpec
from llm_sandbox_mcp.run import build_cache
from llm_sandbox_mcp.run.build_cache import MAX_BINARY, MAX_ENTRIES, BuildCache
from llm_sandbox_mcp.run.kernel import Kernel
from tests.support.fakes import FakeBackend
from tests.unit.test_kernel_frames import Scripted, done, frame

pytestmark = pytest.mark.anyio

GO = get_language("go")
CPP = get_language("cpp")
SPEC = SandboxSpec("llm-sandbox/go", Limits(), CacheMount("store-1"))
SOURCE = b'package main\n\nfunc main() { println("hi") }\n'


@dataclass
class Images(FakeBackend):
    """A backend with images: the id the engine reports for every tag."""

    image_id: str = "sha256:aaa"

    async def image_info(self, image: str) -> ImageInfo | None:
        return ImageInfo(self.image_id, {})

    async def build_image(self, build: object, on_line: object) -> None:
        raise NotImplementedError


@dataclass
class HostRuntimes(FakeBackend):
    """A backend that runs the host's own runtimes (as bubblewrap and NsJail do)."""

    def missing_runtime(self, executable: str) -> str | None:
        return None


def test_least_recently_used_binaries_go_first_once_over_the_size() -> None:
    cache = BuildCache(FakeBackend(), size=300)
    for name in "abc":
        assert cache.put(name, name.encode() * 100)
    assert cache.get("a") is not None  # used again: now the most recent
    assert cache.put("d", b"d" * 100)
    assert (cache.get("b"), len(cache), cache.bytes) == (None, 3, 300)
    assert [cache.get(name) is not None for name in "acd"] == [True, True, True]


async def test_one_principals_build_is_never_a_hit_for_another() -> None:
    """Keyed by principal too: the speed of a hit would tell Bob that someone ran the same program."""
    cache = BuildCache(Images(), size=10**6)
    alices = await cache.plan(GO, SPEC, SOURCE, owner="alice")
    assert alices.key is not None and cache.put(alices.key, b"ELF", owner=alices.owner)
    assert (await cache.plan(GO, SPEC, SOURCE, owner="alice")).binary == b"ELF"
    for other in ("bob", "", "../alice"):
        plan = await cache.plan(GO, SPEC, SOURCE, owner=other)
        assert (plan.binary, plan.mode) == (None, "capture")
        assert plan.key != alices.key


def test_a_principal_storing_past_the_size_pushes_out_their_own_binaries_first() -> None:
    cache = BuildCache(FakeBackend(), size=300)
    assert cache.put("bob-1", b"b" * 100, owner="bob")
    assert cache.put("alice-1", b"a" * 100, owner="alice")
    assert cache.put("alice-2", b"a" * 100, owner="alice")
    assert cache.put("alice-3", b"a" * 100, owner="alice")
    assert [cache.get(key) is not None for key in ("bob-1", "alice-1", "alice-2", "alice-3")] == [
        True,
        False,
        True,
        True,
    ]
    assert cache.put("carol-1", b"c" * 300, owner="carol")  # no binary of her own: the least recently used go
    assert (len(cache), cache.bytes) == (1, 300)


def test_the_number_of_entries_is_bounded_too() -> None:
    cache = BuildCache(FakeBackend(), size=10**9)
    for number in range(MAX_ENTRIES + 10):
        cache.put(str(number), b"x")
    assert len(cache) == MAX_ENTRIES and cache.get("0") is None and cache.get(str(MAX_ENTRIES + 9)) == b"x"


def test_a_binary_over_the_limit_or_empty_is_not_kept_and_replacing_one_keeps_the_count() -> None:
    assert BuildCache(FakeBackend(), size=10**12).limit == MAX_BINARY
    cache = BuildCache(FakeBackend(), size=1000)
    assert not cache.put("big", b"x" * 1001) and not cache.put("empty", b"")
    assert not cache.put("over-its-sandboxs-share", b"x" * 11, limit=10)
    assert cache.put("k", b"1" * 10) and cache.put("k", b"2" * 20)
    assert (len(cache), cache.bytes, cache.get("k")) == (1, 20, b"2" * 20)
    cache.forget("k")
    assert (len(cache), cache.bytes) == (0, 0)


def test_the_setting_takes_a_size_or_zero_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().sandbox_build_cache_size == 256 * 1024**2
    for value, size in (("0", 0), ("64m", 64 * 1024**2), ("1Gi", 1024**3)):
        monkeypatch.setenv("SANDBOX_BUILD_CACHE_SIZE", value)
        assert Settings().sandbox_build_cache_size == size
    for bad in ("-1", "lots", "true"):
        monkeypatch.setenv("SANDBOX_BUILD_CACHE_SIZE", bad)
        with pytest.raises(ValueError, match="sandbox_build_cache_size"):
            Settings()


async def test_size_zero_turns_the_cache_off() -> None:
    plan = await BuildCache(FakeBackend(), size=0).plan(GO, SPEC, SOURCE)
    assert (plan.key, plan.mode) == (None, "build")


async def test_a_hit_a_build_to_keep_and_sources_that_are_never_kept() -> None:
    cache = BuildCache(FakeBackend(), size=10**6)
    miss = await cache.plan(GO, SPEC, SOURCE)
    assert miss.mode == "capture" and miss.key is not None
    # A binary runs in the sandbox's memory: one larger than an eighth of it is not kept for that sandbox.
    small = replace(SPEC, limits=replace(SPEC.limits, memory_bytes=64 * 1024**2))
    assert miss.limit == 10**6 and (await BuildCache(FakeBackend(), 10**9).plan(GO, small, SOURCE)).limit == 8 * 1024**2
    cache.put(miss.key, b"\x7fELF")
    assert (await cache.plan(GO, SPEC, SOURCE)).mode == "built"
    assert (await cache.plan(GO, SPEC, SOURCE, lookup=False)).mode == "capture"
    # A C++ build that embeds its own time, or includes a file from outside the workspace, differs each time.
    for source in (b"const char* t = __TIME__;\n", b'#include "/proc/uptime"\n', b"#include </etc/hostname>\n"):
        assert (await cache.plan(CPP, SandboxSpec("cpp", Limits()), source)).mode == "build"


async def test_the_key_changes_with_everything_the_build_depends_on() -> None:
    backend = Images()
    cache = BuildCache(backend, size=10**6)
    base = await cache.key(GO, SPEC, SOURCE)
    variants = [
        await cache.key(GO, SPEC, SOURCE + b"\n"),
        await cache.key(GO, replace(SPEC, image="other/go"), SOURCE),
        await cache.key(GO, replace(SPEC, cache=CacheMount("store-2")), SOURCE),
        await cache.key(GO, replace(SPEC, cache=None), SOURCE),
        await cache.key(CPP, SPEC, SOURCE),
    ]
    assert len({base, *variants}) == len(variants) + 1
    # The same tag rebuilt (another image id) is another image, once its id is looked up again.
    backend.image_id = "sha256:bbb"
    cache._identities.clear()  # pyright: ignore[reportPrivateUsage]
    assert await cache.key(GO, SPEC, SOURCE) != base
    assert await cache.key(GO, SPEC, SOURCE) == await cache.key(GO, SPEC, SOURCE)


async def test_on_host_runtimes_another_compiler_file_is_another_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = tmp_path / "go"
    compiler.write_text("#!/bin/sh\n")
    compiler.chmod(0o755)
    monkeypatch.setattr(build_cache, "_HOST_PATH", str(tmp_path))
    cache = BuildCache(HostRuntimes(), size=10**6)
    before = await cache.key(GO, SPEC, SOURCE)
    assert await cache.key(GO, SPEC, SOURCE) == before
    replacement = tmp_path / "go.new"
    replacement.write_text("#!/bin/sh\n# upgraded\n")
    replacement.chmod(0o755)
    replacement.replace(compiler)  # as a package upgrade does
    cache._identities.clear()  # pyright: ignore[reportPrivateUsage]
    assert await cache.key(GO, SPEC, SOURCE) != before


LIMIT = 1000


def end(size: object) -> bytes:
    return frame(b"b", json.dumps({"size": size}).encode())


async def build_run(answer: bytes, build_limit: int = LIMIT) -> tuple[ExecResult, Kernel]:
    process = Scripted(answer)
    kernel = Kernel(FakeBackend(), SandboxRef("fake-1", SandboxSpec("go", Limits())), process)
    kernel.pid = 42
    result = await kernel.run(
        "capture\n" + SOURCE.decode(),
        mode="fork",
        echo=False,
        filename="/workspace/main.go",
        timeout=5,
        output_limit=65536,
        artifact_limit=0,
        build_limit=build_limit,
    )
    return result, kernel


async def test_a_binary_that_arrives_whole_is_handed_over() -> None:
    result, kernel = await build_run(frame(b"B", b"\x7fELF") + frame(b"B", b"more") + end(8) + done(0))
    assert (result.exit_code, kernel.built) == (0, b"\x7fELFmore")


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(frame(b"B", b"x" * 600) + frame(b"B", b"x" * 600) + end(1200) + done(0), id="oversized"),
        pytest.param(frame(b"B", b"x" * 600) + end(5000), id="oversized-stated-only"),
        pytest.param(frame(b"B", b"\x7fELF") + done(0), id="truncated-no-end"),
        pytest.param(frame(b"B", b"\x7fELF"), id="stream-ends-mid-binary"),
        pytest.param(frame(b"B", b"\x7fELF") + struct.pack(">cI", b"B", 100) + b"\x7f", id="frame-cut-short"),
        pytest.param(end(0) + done(0), id="nothing-built"),
    ],
)
async def test_a_binary_that_is_not_whole_or_too_large_is_not_kept(answer: bytes) -> None:
    _, kernel = await build_run(answer)
    assert kernel.built is None


@pytest.mark.parametrize(
    ("answer", "build_limit", "why"),
    [
        pytest.param(frame(b"B", b"\x7fELF") + end(3) + done(0), LIMIT, "does not match", id="size-a-lie"),
        pytest.param(frame(b"B", b"\x7fELF") + end("4") + done(0), LIMIT, "invalid end", id="size-a-string"),
        pytest.param(frame(b"B", b"x") + end(1) + end(1) + done(0), LIMIT, "invalid end", id="two-ends"),
        pytest.param(end(0) + frame(b"B", b"x") + done(0), LIMIT, "not asked for", id="binary-after-its-end"),
        pytest.param(frame(b"B", b"\x7fELF") + end(4) + done(0), 0, "not asked for", id="not-asked-for"),
        pytest.param(frame(b"B", b"", size=2**31), LIMIT, "over its limit", id="huge-frame"),
    ],
)
async def test_a_build_frame_that_breaks_the_protocol_ends_the_run_and_keeps_nothing(
    answer: bytes, build_limit: int, why: str
) -> None:
    result, kernel = await build_run(answer, build_limit)
    assert result.exit_code == 137 and why.encode() in result.stderr
    assert kernel.built is None
