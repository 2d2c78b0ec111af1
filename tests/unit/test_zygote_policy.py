"""Which one-shot calls fork, decided from what the backend declares, the same way for every engine."""

from __future__ import annotations

from dataclasses import dataclass, replace

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.languages import get_language
from llm_sandbox_mcp.models import CacheMount, Limits, SandboxSpec
from llm_sandbox_mcp.run.zygote.policy import Flavour, ZygotePolicy
from tests.support.fakes import FakeBackend

SPEC = SandboxSpec("python:3.12-slim", Limits())
PYTHON = get_language("python")


@dataclass
class ContainerEngine(FakeBackend):
    template_containers: bool = True


def test_only_python_one_shot_calls_without_a_writable_cache_or_egress_fork() -> None:
    policy = ZygotePolicy(Settings(), ContainerEngine())
    assert policy.forks(PYTHON, SPEC) is Flavour.CONTAINER
    assert policy.forks(get_language("javascript"), SPEC) is None
    assert policy.forks(PYTHON, replace(SPEC, cache=CacheMount("k", writable=True))) is None
    assert policy.forks(PYTHON, replace(SPEC, egress=True)) is None
    assert ZygotePolicy(Settings(sandbox_zygote=False), ContainerEngine()).forks(PYTHON, SPEC) is None
    assert ZygotePolicy(Settings(), ContainerEngine(template_containers=False)).forks(PYTHON, SPEC) is None


def test_a_writable_root_turns_template_containers_off() -> None:
    """A template container's root is the same for every call it serves: with SANDBOX_READ_ONLY=false a marker
    left in /var/tmp by one call would be seen by the next, so such calls take the warm pool."""
    writable = replace(SPEC, limits=replace(SPEC.limits, read_only=False))
    assert ZygotePolicy(Settings(), ContainerEngine()).forks(PYTHON, writable) is None
