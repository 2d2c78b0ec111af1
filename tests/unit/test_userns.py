"""The cause and fix of refused user namespaces, read from a /proc laid out as each kind of host shows it.

AppArmor cannot run here, so its sysctl is a file in a stand-in /proc; what the real refusals look like through
the installed server is in tests/e2e/test_refusals.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_sandbox_mcp.backends import _userns
from llm_sandbox_mcp.backends._userns import diagnosis, outer_sandbox, refused, userns_refused

BWRAP = Path("/usr/bin/bwrap")
UBUNTU_SAYS = "bwrap: setting up uid map: Permission denied"  # Ubuntu 24.04: made, then denied capabilities


def fake_proc(
    tmp_path: Path,
    *,
    apparmor: str | None = None,
    clone: str | None = None,
    max_namespaces: str = "63000",
    uid_map: str = "0 0 4294967295",
    seccomp: str = "0",
    no_new_privs: str = "0",
) -> Path:
    proc = tmp_path / "proc"
    files = {
        "sys/user/max_user_namespaces": max_namespaces,
        "self/uid_map": f"         {uid_map}",
        "self/status": f"Name:\tpython3\nNoNewPrivs:\t{no_new_privs}\nSeccomp:\t{seccomp}\nSeccomp_filters:\t0\n",
    }
    if apparmor is not None:
        files["sys/kernel/apparmor_restrict_unprivileged_userns"] = apparmor
    if clone is not None:
        files["sys/kernel/unprivileged_userns_clone"] = clone
    for relative, text in files.items():
        (proc / relative).parent.mkdir(parents=True, exist_ok=True)
        (proc / relative).write_text(text + "\n")
    return proc


def test_ubuntus_apparmor_restriction_is_named_with_a_profile_for_the_binary_that_runs(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, apparmor="1", clone="1")
    message = str(userns_refused("bubblewrap", BWRAP, UBUNTU_SAYS, proc))
    assert "without the capabilities to set it up" in message
    assert "kernel.apparmor_restrict_unprivileged_userns = 1" in message
    assert "profile llm-sandbox-bwrap /usr/bin/bwrap flags=(unconfined) {\\n  userns,\\n}" in message
    assert "sudo apparmor_parser -r /etc/apparmor.d/llm-sandbox-bwrap" in message
    assert "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in message
    assert "BACKEND=docker" in message and "docs/platforms-linux.md" in message


@pytest.mark.parametrize(
    ("sysctls", "fix"),
    [
        ({"clone": "0"}, "`sudo sysctl -w kernel.unprivileged_userns_clone=1`"),
        ({"max_namespaces": "0"}, "`sudo sysctl -w user.max_user_namespaces=28633`"),
    ],
)
def test_a_sysctl_that_switches_them_off_is_named_with_the_one_that_switches_them_on(
    tmp_path: Path, sysctls: dict[str, str], fix: str
) -> None:
    cause, given = diagnosis(BWRAP, fake_proc(tmp_path, apparmor="1", **sysctls))
    assert "switches them off" in cause and given.startswith(fix)


def test_a_confined_server_is_told_to_leave_its_sandbox_whatever_the_sysctls_say(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, max_namespaces="0", uid_map="1000 1000 1", no_new_privs="1")
    cause, fix = diagnosis(BWRAP, proc)
    assert "runs inside another sandbox or container (in a user namespace, with no_new_privs)" in cause
    assert '"sandboxEnabled": false' in fix and "codex sandbox" in fix and "/var/run/docker.sock" in fix


def test_without_any_sysctl_to_blame_the_policy_on_the_binary_is(tmp_path: Path) -> None:
    cause, fix = diagnosis(Path("/opt/jail/nsjail"), fake_proc(tmp_path))
    assert "a security policy on /opt/jail/nsjail refuses them" in cause
    assert "journalctl -k" in fix and "profile llm-sandbox-nsjail /opt/jail/nsjail" in fix


def test_only_namespace_failures_count_as_refusals() -> None:
    assert refused(UBUNTU_SAYS)
    assert refused("bwrap: No permissions to create new namespace, likely because the kernel does not allow")
    assert refused("bwrap: Creating new namespace failed: nesting depth or max_user_namespaces exceeded (ENOSPC)")
    assert refused("[W][1] runChild():511 clone(flags=CLONE_NEWNS|CLONE_NEWUSER|CLONE_NEWPID) failed: EPERM")
    assert not refused("bwrap: execvp true: No such file or directory")


def test_a_confined_server_with_no_engine_socket_is_said_to_be_inside_a_clients_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nothing: list[str] = []
    monkeypatch.setattr(_userns, "_visible_sockets", lambda: nothing)
    confined = fake_proc(tmp_path / "a", uid_map="1000 1000 1", seccomp="2")
    hint = outer_sandbox(confined)
    assert hint is not None and "appears to run inside a sandbox (in a user namespace, under a seccomp filter)" in hint
    assert outer_sandbox(fake_proc(tmp_path / "b")) is None
    monkeypatch.setattr(_userns, "_visible_sockets", lambda: ["/var/run/docker.sock"])
    assert outer_sandbox(confined) is None
