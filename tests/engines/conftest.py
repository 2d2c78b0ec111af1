"""Real engines. A backend whose engine is missing is skipped locally, and fails when required.

`--require-engines=docker,...` (the README's test command passes it) turns a missing engine into a failure,
so CI can never pass by skipping.

`docker-remote` and `podman-remote` are the Docker and Podman backends on current engines (Debian 13's Docker 26
and Podman 5) whose filesystem the server cannot see, as with Docker Desktop's VM, Colima, Podman machine or a
remote DOCKER_HOST: `scripts/provision_remote.sh` starts them in mount namespaces of their own, sharing only their
sockets. `tests/engines/test_remote.py` proves both facts, so these parameters cannot silently run on the
home-ground engines. They run only the tests REMOTE_TESTS names (the rest is deselected, not skipped), chosen to
add at most about 6 minutes to CI. Measured on this 2-core machine, shared and loaded: the candidate modules whole,
on both engines, cost contract 2.7 min, sessions 1.2, languages 4.5, hostile over 5; the selection (92 tests) took
4.5 and 5.5 minutes in two runs (per module below, the range of the two):
- the contract, minus what runs the same server code whatever the engine (line numbers, exit codes, UTF-8, huge
  code, the environment, figures, concurrency): what a newer engine API could change, i.e. limits, capabilities,
  seccomp, read-only root, network none, kills, files back, installs (65-150 s);
- sessions and files, minus path validation, which never reaches the engine (30-42 s);
- languages: every language's hello world, which proves each project image runs there, and one installer other
  than pip's, npm's (15-22 s; the whole module cost 4.5 minutes);
- egress: an install through the proxy and a session's hosts (4-10 s, failing fast today);
- hostile: the bombs, devices, links, pid 1, orphans, secrets and the egress proxy (80-145 s); on Podman also
  what crosses the boundary there only, the template containers' seccomp variant (a file in a volume on the
  engine's side): the masked paths, devices and kernel knobs, and links in a child's outputs (about 30 s).
Installs, sessions with hosts and the compiled languages' build-cache step fail on these engines until the egress
proxy reaches sandboxes without a path of the server's filesystem: selected anyway, that is what they are for.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

import anyio
import pytest

from llm_sandbox_mcp import images
from llm_sandbox_mcp.backends import Backend, SandboxProcess, TemplateContainers, load_backend
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import SandboxError
from llm_sandbox_mcp.languages import LANGUAGES
from llm_sandbox_mcp.models import WORKDIR, ExecResult, OutputListener, SandboxRef, SandboxSpec
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.sessions import SessionRegistry
from tests.engines import kube
from tests.support.egress import public_registry_hosts

# Engine parameter -> (backend, its socket): the current engines across a filesystem boundary.
REMOTE_ENGINES = {
    "docker-remote": ("docker", "unix:///run/llm-sandbox-remote/docker.sock"),
    "podman-remote": ("podman", "unix:///run/llm-sandbox-remote/podman.sock"),
}
ENGINES = ("docker", "podman", "bubblewrap", "nsjail", "kubernetes", *REMOTE_ENGINES)
# What runs on the remote engines: test -> a word its parameters must include ("" for all), by module.
_CONTRACT = "tests/engines/test_contract.py::test_"
_SESSIONS = "tests/engines/test_sessions.py::test_"
_HOSTILE = "tests/hostile/test_"
REMOTE_TESTS = {
    "tests/engines/test_remote.py::test_the_remote_engine_is_current_and_cannot_see_the_servers_files": "",
    **{
        _CONTRACT + name: ""
        for name in (
            "hello_world",
            "sandbox_has_no_capabilities_no_root_and_no_new_privileges",
            "seccomp_every_engine_answers_the_same_to_each_denied_syscall",
            "open_files_and_core_dumps_are_limited",
            "sandbox_has_only_a_loopback_interface_or_a_pods_filtered_one",
            "root_filesystem_is_read_only_and_workspace_and_tmp_are_writable",
            "a_fork_bomb_is_contained_by_the_pids_limit",
            "a_memory_bomb_is_killed",
            "a_timeout_kills_every_process_and_keeps_partial_output",
            "a_timed_out_program_still_returns_its_files",
            "libraries_install_with_network_then_run_without_and_are_cached",
            "an_unknown_library_is_an_install_error_with_pips_message",
            "a_process_whose_sandbox_vanishes_under_it_ends_with_status_137",
        )
    },
    **{
        _SESSIONS + name: ""
        for name in (
            "python_state_survives_between_calls_like_a_notebook",
            "every_figure_of_a_cell_comes_back",
            "a_cell_that_times_out_is_interrupted_and_the_session_survives",
            "a_cell_that_ignores_interrupts_is_killed_and_the_session_restarts",
            "files_round_trip_and_list",
            "symlinks_planted_by_the_code_cannot_redirect_file_tools",
            "devices_and_oversized_files_are_refused",
            "host_copies_stay_below_the_allowed_directories",
            "sessions_end_with_the_server",
            "files_persist_between_calls_in_other_languages",
            "list_sessions_reports_what_a_session_uses",
        )
    },
    "tests/engines/test_languages.py::test_hello_world": "",
    "tests/engines/test_languages.py::test_a_library_installs_and_the_code_uses_it": "javascript",
    "tests/engines/test_egress.py::test_a_library_installs_through_the_proxy": "",
    "tests/engines/test_egress.py::test_a_session_reaches_its_hosts_and_nothing_else": "",
    "tests/engines/test_egress.py::test_installs_and_sessions_need_nothing_of_the_servers_filesystem": "",
    "tests/engines/test_principal_caches.py::test_each_principal_has_library_stores_of_their_own": "docker-remote",
    **{
        _HOSTILE + name: ""
        for name in (
            "bombs_and_escapes.py::test_a_disk_bomb_stops_at_the_workspace_and_tmp_sizes",
            "bombs_and_escapes.py::test_a_file_descriptor_bomb_stops_at_the_open_files_limit",
            "bombs_and_escapes.py::test_a_thread_bomb_stops_at_the_pids_limit",
            "bombs_and_escapes.py::test_raw_and_packet_sockets_devices_and_kernel_knobs_are_out_of_reach",
            "bombs_and_escapes.py::test_links_in_the_outputs_never_bring_back_files_from_outside",
            "bombs_and_escapes.py::test_a_library_that_fills_its_store_is_stopped_while_it_installs",
            "boundary.py::test_pid_1_has_no_output_the_code_could_flood",
            "boundary.py::test_orphans_are_reaped_so_their_pids_come_back",
            "boundary.py::test_pid_1_is_out_of_reach_of_the_code_in_every_kind_of_sandbox",
            "zygote_attacks.py::test_a_child_masks_every_path_the_engine_masks_in_its_sandboxes",
            "secrets_and_snooping.py::test_the_servers_secrets_are_nowhere_the_code_can_look",
            "secrets_and_snooping.py::test_what_the_engines_mask_of_proc_is_empty_in_every_sandbox",
            "zygote_attacks.py::test_raw_and_packet_sockets_devices_and_kernel_knobs_are_out_of_reach",
            "zygote_attacks.py::test_links_in_the_outputs_never_bring_back_files_from_outside",
            "secrets_and_snooping.py::test_a_session_cannot_see_another_sessions_processes_files_or_memory",
            "egress.py::test_only_the_allowed_host_is_reachable",
        )
    },
}
# The host's trust store: behind a TLS-inspecting proxy the images' own bundles are not enough to install.
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


_probed: dict[str, str | None] = {}


async def _probe(name: str) -> str | None:
    """None when the engine answers, else why not."""
    if name not in _probed:
        try:
            settings = engine_settings(name)
            backend = load_backend(settings.backend, settings)
            try:
                await backend.describe()
                _probed[name] = None
            finally:
                await backend.aclose()
        except SandboxError as exc:
            _probed[name] = str(exc)
    return _probed[name]


async def require(request: pytest.FixtureRequest, name: str) -> None:
    reason = await _probe(name)
    if reason is None:
        return
    required = {e.strip() for e in str(request.config.getoption("--require-engines")).split(",") if e.strip()}
    if name in required:
        pytest.fail(f"engine {name!r} is required (--require-engines) but unusable: {reason}")
    pytest.skip(f"engine {name!r} unusable here: {reason}")


def require_now(request: pytest.FixtureRequest, name: str) -> None:
    """`require` for synchronous tests."""
    anyio.run(require, request, name)


def engine_settings(name: str, **overrides: Any) -> Settings:
    # Installers reach the registries through the egress proxy, as on a user's machine.
    base: dict[str, Any] = {
        "backend": name,
        "sandbox_pool_size": 0,
        "sandbox_install_allow_hosts": list(public_registry_hosts()),
    }
    if os.path.isfile(HOST_CA_BUNDLE):
        base["sandbox_install_ca_bundle"] = HOST_CA_BUNDLE
    if name in REMOTE_ENGINES:
        backend, socket = REMOTE_ENGINES[name]
        base.update({"backend": backend, f"{backend}_host": socket})
    if name == "kubernetes":
        base["kubeconfig"] = kube.kubeconfig()
        base["sandbox_k8s_seccomp_profile"] = kube.SECCOMP_PROFILE
        # A cluster builds no images: as the recipe in docs/languages.md says, it runs project images built and pushed
        # elsewhere, here those built on the Docker engine the test double runs its pods in.
        base.update({f"sandbox_image_{lang}": images.recipe(Settings(), lang).tag for lang in LANGUAGES})
    return Settings(**{**base, **overrides})


class RecordingBackend:
    """A real backend, with every exec argv recorded (to prove what ran and what did not)."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = inner.name
        self.install_network = inner.install_network
        # Forks on the inner engine's zygote template containers (an inner TemplateHost's templates are not
        # reachable through this wrapper: on bubblewrap its calls take the pool, as they always have).
        self.template_containers = isinstance(inner, TemplateContainers) and inner.template_containers
        self.argvs: list[list[str]] = []
        self._watched: list[tuple[str, anyio.Event]] = []
        self._salt = ""
        self._salted: set[str] = set()

    def fresh_stores(self) -> None:
        """From now on, library stores live under keys of this backend's own (the server's key, salted): an
        install really runs, whatever stores earlier runs left on this engine. `drop_fresh_stores` removes them."""
        self._salt = secrets.token_hex(8)

    def _store(self, key: str) -> str:
        if not self._salt:
            return key
        salted = hashlib.sha256(f"{self._salt}:{key}".encode()).hexdigest()[:32]  # the server's key format
        self._salted.add(salted)
        return salted

    async def drop_fresh_stores(self) -> None:
        for key in self._salted:
            await self.inner.drop_cache(key)
        self._salted.clear()

    def exec_of(self, word: str) -> anyio.Event:
        """An event set once an exec whose argv mentions `word` is made."""
        event = anyio.Event()
        self._watched.append((word, event))
        return event

    def _record(self, argv: Sequence[str]) -> None:
        self.argvs.append(list(argv))
        for word, event in self._watched:
            if any(word in part for part in argv):
                event.set()

    async def create(self, spec: SandboxSpec) -> SandboxRef:
        if spec.cache is not None:
            spec = replace(spec, cache=replace(spec.cache, key=self._store(spec.cache.key)))
        return await self.inner.create(spec)

    async def exec(
        self,
        ref: SandboxRef,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: bytes = b"",
        env: Mapping[str, str] | None = None,
        workdir: PurePosixPath = WORKDIR,
        output_limit: int | None = None,
        on_output: OutputListener | None = None,
    ) -> ExecResult:
        self._record(argv)
        return await self.inner.exec(
            ref,
            argv,
            timeout=timeout,
            stdin=stdin,
            env=env,
            workdir=workdir,
            output_limit=output_limit,
            on_output=on_output,
        )

    async def start(
        self,
        ref: SandboxRef,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: PurePosixPath = WORKDIR,
    ) -> SandboxProcess:
        self._record(argv)
        return await self.inner.start(ref, argv, env=env, workdir=workdir)

    async def kill_all(self, ref: SandboxRef) -> None:
        await self.inner.kill_all(ref)

    async def destroy(self, ref: SandboxRef) -> None:
        await self.inner.destroy(ref)

    async def drop_cache(self, key: str) -> None:
        await self.inner.drop_cache(self._store(key))

    async def sweep(self) -> int:
        return await self.inner.sweep()

    async def describe(self) -> str:
        return await self.inner.describe()

    async def aclose(self) -> None:
        await self.inner.aclose()


# The modules about one engine whose tests take no `engine` parameter, and the engine they run on.
_ENGINE_MODULES = {
    "test_bubblewrap.py": "bubblewrap",  # host-wide /proc looks for one command line, MARKER, across its tests
    "test_docker.py": "docker",
    "test_kubernetes.py": "kubernetes",  # one API server double per worker, not one per test
    "test_kubernetes_claims.py": "kubernetes",
    "test_nsjail.py": "nsjail",
    "test_podman.py": "podman",
}


# Engines that share host state outside any engine (the daemonless backends' state directory and its sweep, the
# host's library stores, host-wide /proc looks for one marker), so their tests run in one group, one at a time.
_SHARED_HOST_STATE = {"bubblewrap": "daemonless", "nsjail": "daemonless"}


def xdist_group(item: pytest.Item) -> str | None:
    """The engine a test runs on, as its pytest-xdist group: with `--dist loadgroup` (scripts/test) each engine's
    tests run one at a time on one worker while other engines' run beside them, as they did in one process."""
    params: dict[str, object] = getattr(getattr(item, "callspec", None), "params", {})
    # The engine parameter has other names in some modules (`proxied`, `remote`): any value naming an engine.
    named = [value for value in params.values() if isinstance(value, str) and value in ENGINES]
    engine = named[0] if named else _ENGINE_MODULES.get(item.path.name)
    return None if engine is None else _SHARED_HOST_STATE.get(engine, engine)


def select_and_group(
    config: pytest.Config, items: list[pytest.Item], group: Callable[[pytest.Item], str | None]
) -> None:
    """Deselect (not skip: they were never meant to run) the remote engines' parameters REMOTE_TESTS leaves out,
    and mark the rest with their pytest-xdist group."""
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        params: dict[str, object] = getattr(getattr(item, "callspec", None), "params", {})
        remote = any(isinstance(value, str) and value in REMOTE_ENGINES for value in params.values())
        test, _, ids = item.nodeid.partition("[")
        selected = test in REMOTE_TESTS and REMOTE_TESTS[test] in ids
        (dropped if remote and not selected else kept).append(item)
        name = group(item)
        if name is not None:
            item.add_marker(pytest.mark.xdist_group(name))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    select_and_group(config, items, xdist_group)


@pytest.fixture(scope="session", autouse=True)
def kube_double_stopped() -> Iterator[None]:
    yield
    kube.stop()


@pytest.fixture(params=[pytest.param(name, marks=getattr(pytest.mark, name)) for name in ENGINES])
def engine(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
async def backend(request: pytest.FixtureRequest, engine: str) -> AsyncIterator[RecordingBackend]:
    await require(request, engine)
    settings = engine_settings(engine)
    real = RecordingBackend(load_backend(settings.backend, settings))
    try:
        yield real
    finally:
        try:
            await real.drop_fresh_stores()
        finally:
            await real.aclose()


@pytest.fixture
async def executor(backend: RecordingBackend, engine: str) -> AsyncIterator[Executor]:
    async with Executor(engine_settings(engine), backend) as executor:
        yield executor


@pytest.fixture
async def registry(executor: Executor) -> AsyncIterator[SessionRegistry]:
    sessions = SessionRegistry(executor.settings, executor)
    try:
        yield sessions
    finally:
        await sessions.aclose()
