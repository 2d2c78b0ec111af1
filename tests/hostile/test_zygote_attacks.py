"""The hostile tier's attacks on one-shot Python calls, against zygote children (SANDBOX_ZYGOTE): on bubblewrap
and NsJail children of a template, on Docker and Podman children of template containers that serve the calls that
follow. A child must hold as a pooled sandbox does, and leave the host as unharmed (`host_unharmed`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.sessions import SessionRegistry
from tests.engines.test_zygote import TEMPLATE_HOSTS, zygote_executor
from tests.engines.test_zygote_containers import container_executor
from tests.hostile import test_bombs_and_escapes as bombs
from tests.hostile import test_boundary as boundary
from tests.hostile import test_secrets_and_snooping as snooping

pytestmark = [pytest.mark.anyio]


# podman-remote: Podman's template containers take their seccomp variant from a file in a volume on the engine's
# side, a path that crosses the filesystem boundary (Docker takes the profile's text, the same code either side);
# REMOTE_TESTS keeps the attacks on what that profile and the children's outputs guard.
@pytest.fixture(
    params=[
        pytest.param(name, marks=getattr(pytest.mark, name))
        for name in (*TEMPLATE_HOSTS, "docker", "podman", "podman-remote")
    ]
)
def engine(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
async def executor(request: pytest.FixtureRequest, engine: str) -> AsyncIterator[Executor]:
    if engine in TEMPLATE_HOSTS:
        async with zygote_executor(request, 2, engine) as executor:
            yield executor
        return
    async with container_executor(request, engine, pool_size=1) as executor:
        yield executor
        # Every call of the test ran in a template container's child: none fell back to the pool.
        assert executor.zygote.policy.served > 0 and not executor.zygote.policy.unavailable


test_a_disk_bomb_stops_at_the_workspace_and_tmp_sizes = bombs.test_a_disk_bomb_stops_at_the_workspace_and_tmp_sizes
test_a_file_descriptor_bomb_stops_at_the_open_files_limit = (
    bombs.test_a_file_descriptor_bomb_stops_at_the_open_files_limit
)
test_a_thread_bomb_stops_at_the_pids_limit = bombs.test_a_thread_bomb_stops_at_the_pids_limit
test_raw_and_packet_sockets_devices_and_kernel_knobs_are_out_of_reach = (
    bombs.test_raw_and_packet_sockets_devices_and_kernel_knobs_are_out_of_reach
)
test_links_in_the_outputs_never_bring_back_files_from_outside = (
    bombs.test_links_in_the_outputs_never_bring_back_files_from_outside
)
test_the_interpreters_protocol_pipe_cannot_be_opened_by_the_code = (
    boundary.test_the_interpreters_protocol_pipe_cannot_be_opened_by_the_code
)
test_a_code_that_stops_every_new_process_cannot_stretch_its_timeout = (
    boundary.test_a_code_that_stops_every_new_process_cannot_stretch_its_timeout
)
test_pid_1_has_no_output_the_code_could_flood = boundary.test_pid_1_has_no_output_the_code_could_flood
test_orphans_are_reaped_so_their_pids_come_back = boundary.test_orphans_are_reaped_so_their_pids_come_back
test_the_servers_secrets_are_nowhere_the_code_can_look = snooping.test_the_servers_secrets_are_nowhere_the_code_can_look


async def test_a_process_left_running_is_killed_before_the_files_are_read(executor: Executor) -> None:
    await boundary.test_a_process_left_running_is_killed_before_the_files_are_read(executor, "python")


@pytest.mark.parametrize("engine", [pytest.param(e, marks=getattr(pytest.mark, e)) for e in ("docker", "podman")])
async def test_with_a_writable_root_nothing_of_one_call_reaches_the_next(
    request: pytest.FixtureRequest, engine: str
) -> None:
    """With SANDBOX_READ_ONLY=false a template container's root (/var/tmp, /run/lock, ...) would be shared by the
    calls it serves; such calls take the warm pool, one fresh container each."""
    async with container_executor(request, engine, pool_size=1, max_concurrency=1, read_only=False) as executor:
        left = await executor.execute("open('/var/tmp/left', 'w').write('x')\nprint('left')")
        seen = await executor.execute("import os\nprint(os.path.exists('/var/tmp/left'))")
        assert (left.stdout, seen.stdout) == ("left\n", "False\n"), (left, seen)
        assert executor.zygote.policy.served == 0


# The paths under /proc and /sys that this sandbox has masked (a file behind /dev/null, an empty read-only tmpfs)
# and made read-only, from its own mount table.
MASKS_IN_MOUNTINFO = """
import json
masked, read_only = set(), set()
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    root, point, options = fields[3], fields[4], fields[5].split(",")
    kind = fields[fields.index("-") + 1]
    if not point.startswith(("/proc/", "/sys/")):
        continue
    if root.endswith("/null") or (kind == "tmpfs" and "ro" in options):
        masked.add(point)
    elif kind in ("proc", "sysfs") and "ro" in options:
        read_only.add(point)
print(json.dumps({"masked": sorted(masked), "read_only": sorted(read_only)}))
"""


@pytest.mark.parametrize(
    "engine",
    [pytest.param(e, marks=getattr(pytest.mark, e)) for e in ("docker", "podman", "docker-remote", "podman-remote")],
)
async def test_a_child_masks_every_path_the_engine_masks_in_its_sandboxes(
    executor: Executor, registry: SessionRegistry
) -> None:
    """What the engine masks and makes read-only in an ordinary sandbox (a session's container), each template
    child masks too: the template container itself has nothing masked, so that its children can mount a /proc."""
    session = await registry.create("python", [])
    try:
        ordinary = json.loads((await registry.execute(session.id, MASKS_IN_MOUNTINFO, [], 60)).stdout)
    finally:
        await registry.close(session.id)
    forked = json.loads((await executor.execute(MASKS_IN_MOUNTINFO, timeout=60)).stdout)
    assert ordinary["masked"], ordinary  # the probe sees masks at all
    assert set(ordinary["masked"]) - set(forked["masked"]) == set(), (ordinary, forked)
    assert set(ordinary["read_only"]) - set(forked["read_only"]) - set(forked["masked"]) == set(), (ordinary, forked)
