"""Library caches: one size limit per set and one in total, least recently used evicted, listed by the CLI; each
principal's stores their own, within their quota."""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from llm_sandbox_mcp.cache_index import CacheEntry, CacheIndex, over_total
from llm_sandbox_mcp.cli import main
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import InstallFailed
from llm_sandbox_mcp.languages import get_language, install_env
from llm_sandbox_mcp.models import ExecResult
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.libraries import QUOTA_SETTING
from tests.support.fakes import Call, FakeBackend, ok

pytestmark = pytest.mark.anyio
MIB = 1024**2


@pytest.fixture(autouse=True)
def own_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))


def entry(key: str, size: int, last_used: float, engine: str = "docker") -> CacheEntry:
    return CacheEntry(engine, key, "python", (key,), size, last_used)


def test_the_index_records_touches_and_forgets_entries_across_instances() -> None:
    CacheIndex().record(entry("a", MIB, 1.0))
    CacheIndex().record(entry("b", MIB, 2.0, engine="podman"))
    before = time.time()
    CacheIndex().touch("docker", "a")
    found = CacheIndex().entries()
    assert [(e.engine, e.key) for e in found] == [("podman", "b"), ("docker", "a")]  # least recently used first
    assert found[1].last_used >= before
    CacheIndex().forget("docker", "a")
    assert [e.key for e in CacheIndex().entries("docker")] == []


def test_a_damaged_index_is_an_empty_one() -> None:
    index = CacheIndex()
    index.path.parent.mkdir(parents=True)
    index.path.write_text('[{"engine": 1}, "x", {"key": "k"}]')
    assert index.entries() == []


def test_eviction_takes_the_least_recently_used_but_never_the_new_or_a_recent_one() -> None:
    entries = [entry("old", 4 * MIB, 10.0), entry("older", 4 * MIB, 5.0), entry("recent", 4 * MIB, 100.0)]
    entries.append(entry("new", 4 * MIB, 1.0))
    chosen = over_total(entries, total=8 * MIB, keep="new", recent_since=50.0)
    assert [e.key for e in chosen] == ["older", "old"]


def installer(du_kib: int) -> FakeBackend:
    def handler(call: Call) -> ExecResult:
        if call.argv[0] == "du":
            return ok(stdout=f"{du_kib}\t/opt/llm-sandbox/libs\n".encode())
        if call.argv[:2] == ["test", "-f"]:
            return ok(exit_code=1)  # not installed yet
        return ok()

    return FakeBackend(handler=handler)


async def test_a_library_set_above_the_size_limit_is_refused_and_its_cache_dropped() -> None:
    backend = installer(du_kib=3 * 1024)
    settings = Settings(sandbox_pool_size=0, sandbox_cache_max_size=2 * MIB)
    async with Executor(settings, backend) as executor:
        with pytest.raises(InstallFailed, match="SANDBOX_CACHE_MAX_SIZE"):
            await executor.libraries.ensure(get_language("python"), ["big"])
    assert CacheIndex().entries() == []


async def test_past_the_total_the_least_recently_used_caches_go() -> None:
    backend = installer(du_kib=1024)
    settings = Settings(sandbox_pool_size=0, sandbox_cache_total_size=2 * MIB)
    python = get_language("python")
    async with Executor(settings, backend) as executor:
        first = await executor.libraries.ensure(python, ["a"])
        second = await executor.libraries.ensure(python, ["b"])
        # Both last used longer ago than a session can live, the first one longest.
        for age, key in ((2.0, first), (1.0, second)):
            (found,) = [e for e in CacheIndex().entries() if e.key == key]
            CacheIndex().record(replace(found, last_used=time.time() - settings.sandbox_session_max_lifetime - age))
        third = await executor.libraries.ensure(python, ["c"])
    assert backend.dropped == [first]
    assert {e.key for e in CacheIndex().entries("fake")} == {second, third}


async def test_a_burst_of_library_sets_cannot_pass_the_total() -> None:
    """Stores used lately are kept (a live session may have one mounted), so a burst of new sets would pile up
    past the total: the one that does not fit is removed again and its install fails, naming the setting."""
    backend = installer(du_kib=1024)
    settings = Settings(sandbox_pool_size=0, sandbox_cache_total_size=2 * MIB)
    python = get_language("python")
    async with Executor(settings, backend) as executor:
        kept = [await executor.libraries.ensure(python, [name]) for name in ("a", "b")]
        with pytest.raises(
            InstallFailed, match=r"full: 2 MiB of SANDBOX_CACHE_TOTAL_SIZE \(2 MiB\).* takes 1 MiB more"
        ):
            await executor.libraries.ensure(python, ["c"])
        assert executor.libraries.key(python, ["c"]) in backend.dropped
    assert {e.key for e in CacheIndex().entries("fake")} == set(kept)


def test_cache_list_shows_every_cache_with_its_size_and_libraries(capsys: pytest.CaptureFixture[str]) -> None:
    CacheIndex().record(CacheEntry("docker", "0123456789abcdef", "python", ("pandas",), 300 * MIB, time.time()))
    CacheIndex().record(CacheEntry("docker", "fedcba9876543210", "python", ("six",), 1 * MIB, time.time(), "alice"))
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "docker" in out and "0123456789ab" in out and "300.0 MiB" in out and "pandas" in out
    assert "six  (principal alice)" in out and "pandas  (principal" not in out
    assert "2 caches, 301.0 MiB" in out


# Names no tokens file or OAuth subject allows, which the run core must treat as opaque all the same.
HOSTILE_NAMES = ["../x", "../../etc", "/", "a/../../b", "x;rm -rf ~ `id` $(touch /tmp/p) | y", "a\x00b", " ", "\n"]


def mains_key(settings: Settings, lang_name: str, specs: list[str], image: str) -> str:
    """The key main's layout gave a store (before stores had owners), written out as main computed it."""
    lang = get_language(lang_name)
    registry = sorted(install_env(lang, settings).items())
    installer = hashlib.sha256(json.dumps(lang.install_argv(specs)).encode()).hexdigest()
    identity = json.dumps([lang.name, image, specs, registry, installer])
    return hashlib.sha256(identity.encode()).hexdigest()[:32]


async def test_a_stdio_store_made_under_mains_layout_is_still_a_hit() -> None:
    """Over stdio (owner "") the key is main's, so a store an earlier release installed is mounted, not
    installed again: the installer never runs."""
    backend = installer(du_kib=1024)
    complete = backend.handler
    backend.handler = lambda call: ok() if call.argv[:2] == ["test", "-f"] else complete(call)  # the store is there
    settings = Settings(sandbox_pool_size=0)
    python = get_language("python")
    async with Executor(settings, backend) as executor:
        image = executor.libraries.image_of("python")
        key = await executor.libraries.ensure(python, ["six"])
    assert key == mains_key(settings, "python", ["six"], image)
    assert [spec.cache.key for spec in backend.created if spec.cache] == [key]
    assert python.install_argv(["six"]) not in [call.argv for call in backend.calls]
    assert [(e.key, e.owner) for e in CacheIndex().entries()] == [(key, "")]


async def test_each_principal_has_keys_of_their_own_that_never_hold_their_name() -> None:
    settings = Settings(sandbox_pool_size=0)
    python = get_language("python")
    owners = ["", "alice", "Alice", "bob", *HOSTILE_NAMES]
    async with Executor(settings, FakeBackend()) as executor:
        keys = [executor.libraries.key(python, ["six"], owner) for owner in owners]
    assert len(set(keys)) == len(owners)
    for key in keys:
        assert re.fullmatch(r"[0-9a-f]{32}", key), key


async def test_another_principals_store_is_never_reused_nor_evicted() -> None:
    """Bob asking for Alice's set installs his own; when the total is full, Bob's install removes none of
    Alice's stores, however long unused, and fails saying so."""
    backend = installer(du_kib=1024)
    settings = Settings(sandbox_pool_size=0, sandbox_cache_total_size=2 * MIB)
    python = get_language("python")
    async with Executor(settings, backend) as executor:
        alices = await executor.libraries.ensure(python, ["six"], "alice")
        bobs = await executor.libraries.ensure(python, ["six"], "bob")
        assert alices != bobs
        installs = [call for call in backend.calls if call.argv == python.install_argv(["six"])]
        assert len(installs) == 2  # Bob's call installed afresh
        assert {spec.cache.key for spec in backend.created if spec.cache} == {alices, bobs}
        (found,) = [e for e in CacheIndex().entries() if e.key == alices]
        CacheIndex().record(replace(found, last_used=time.time() - settings.sandbox_session_max_lifetime - 60))
        with pytest.raises(InstallFailed, match=r"SANDBOX_CACHE_TOTAL_SIZE.*other users' caches"):
            await executor.libraries.ensure(python, ["tomli"], "bob")
    assert alices not in backend.dropped
    assert {(e.key, e.owner) for e in CacheIndex().entries()} == {(alices, "alice"), (bobs, "bob")}


async def test_past_their_quota_a_principals_own_least_recently_used_stores_go() -> None:
    backend = installer(du_kib=1024)
    settings = Settings(sandbox_pool_size=0, sandbox_http_max_cache_bytes_per_principal=2 * MIB)
    python = get_language("python")
    old = time.time() - settings.sandbox_session_max_lifetime - 60
    async with Executor(settings, backend) as executor:
        bobs = await executor.libraries.ensure(python, ["z"], "bob")
        first, second = [await executor.libraries.ensure(python, [name], "alice") for name in ("a", "b")]
        for age, key in ((3.0, bobs), (2.0, first), (1.0, second)):  # Bob's the oldest of all
            (found,) = [e for e in CacheIndex().entries() if e.key == key]
            CacheIndex().record(replace(found, last_used=old - age))
        third = await executor.libraries.ensure(python, ["c"], "alice")
    assert backend.dropped == [first]
    assert {e.key for e in CacheIndex().entries()} == {bobs, second, third}


@pytest.mark.parametrize(
    ("quota", "refusal", "installed"),
    [
        (2 * MIB, rf"hold the 2 MiB each user may hold on this server \({QUOTA_SETTING}\) already.*nothing was", False),
        (5 * MIB // 2, rf"would pass the 2 MiB each user may hold on this server \({QUOTA_SETTING}\)", True),
    ],
    ids=["full-before-installing", "full-once-installed"],
)
async def test_a_principal_whose_recent_stores_fill_the_quota_is_refused_naming_the_setting(
    quota: int, refusal: str, installed: bool
) -> None:
    """Stores used lately stay (a session may have one mounted): a set that cannot fit is refused, before its
    install when the quota is full already, else once its size is known (its store removed again). Over stdio
    there is no quota of a principal's own."""
    backend = installer(du_kib=1024)
    settings = Settings(sandbox_pool_size=0, sandbox_http_max_cache_bytes_per_principal=quota)
    python = get_language("python")
    async with Executor(settings, backend) as executor:
        kept = [await executor.libraries.ensure(python, [name], "alice") for name in ("a", "b")]
        with pytest.raises(InstallFailed, match=refusal):
            await executor.libraries.ensure(python, ["c"], "alice")
        assert (python.install_argv(["c"]) in [call.argv for call in backend.calls]) == installed
        assert (executor.libraries.key(python, ["c"], "alice") in backend.dropped) == installed
        for name in ("a", "b", "c"):
            await executor.libraries.ensure(python, [name])
    assert len([e for e in CacheIndex().entries() if e.owner == ""]) == 3
    assert {e.key for e in CacheIndex().entries() if e.owner == "alice"} == set(kept)


async def test_a_set_larger_than_the_quota_is_refused_naming_the_quota() -> None:
    backend = installer(du_kib=3 * 1024)
    settings = Settings(sandbox_pool_size=0, sandbox_http_max_cache_bytes_per_principal=2 * MIB)
    async with Executor(settings, backend) as executor:
        with pytest.raises(InstallFailed, match=rf"above the limit of 2 MiB .*\({QUOTA_SETTING}\)"):
            await executor.libraries.ensure(get_language("python"), ["big"], "alice")
        await executor.libraries.ensure(get_language("python"), ["big"])  # stdio's bound is SANDBOX_CACHE_MAX_SIZE
    assert [e.owner for e in CacheIndex().entries()] == [""]


def test_an_index_of_mains_layout_reads_as_stdios_stores(tmp_path: Path) -> None:
    index = CacheIndex(tmp_path / "index.json")
    index.path.write_text(
        json.dumps(
            [
                {
                    "engine": "docker",
                    "key": "k",
                    "language": "python",
                    "libraries": ["six"],
                    "size_bytes": 1,
                    "last_used": 1.0,
                }
            ]
        )
    )
    assert [(e.key, e.owner) for e in index.entries()] == [("k", "")]
