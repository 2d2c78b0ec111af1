"""The HTTP face's start-up checks: the tokens file (format, permissions, never a token in an error), the
token verifier, the listen address, and when serving without tokens is refused."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from llm_sandbox_mcp.cli import main
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import ConfigError
from llm_sandbox_mcp.server.bearer_tokens import TokenFile
from llm_sandbox_mcp.server.http import check_authentication, parse_listen
from llm_sandbox_mcp.server.verifier import Verifier

pytestmark = pytest.mark.anyio

ALICE = "a" * 16 + "-alice-secret-" + "1" * 10
BOB = "b" * 40
POSIX = pytest.mark.skipif(sys.platform == "win32", reason="permission bits are POSIX")


def _file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "tokens"
    path.write_text(text)
    path.chmod(mode)
    return path


async def test_a_good_file_maps_each_token_to_its_principal(tmp_path: Path) -> None:
    text = f"# operators\n\nalice {ALICE}\n   # a comment after blanks\nbob\t{BOB}\nalice {'c' * 32}\n"
    tokens = TokenFile.load(_file(tmp_path, text))
    assert tokens.principals == ["alice", "bob"]
    verifier = Verifier(tokens, None)
    for token, principal in ((ALICE, "alice"), (BOB, "bob"), ("c" * 32, "alice")):
        access = await verifier.verify_token(token)
        assert access is not None and access.subject == access.client_id == principal
    for wrong in ("", ALICE[:-1], ALICE + "x", BOB.upper(), "alice"):
        assert await verifier.verify_token(wrong) is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (f"alice {ALICE}\nbob\n", "line 2: expected `principal token` (two fields separated by blanks), found 1"),
        (f"alice {ALICE} extra\n", "line 1: expected `principal token`"),
        (f"al/ice {ALICE}\n", "line 1: the principal must be"),
        ("# c\nalice short-token\n", "line 2: the token of alice must be 32 to 512 printable ASCII characters"),
        (f"alice {ALICE}\nbob {ALICE}\n", "line 2: the token of bob is the same as the one on line 1"),
        ("# nothing but comments\n\n", "holds no `principal token` line"),
    ],
    ids=["one-field", "three-fields", "bad-principal", "short-token", "shared-token", "empty"],
)
def test_a_malformed_file_is_refused_naming_the_line_and_never_the_token(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(ConfigError) as refused:
        TokenFile.load(path)
    message = str(refused.value)
    assert message.startswith(f"SANDBOX_HTTP_TOKENS_FILE ({path}): ") and problem in message
    for token in (ALICE, "short-token", "extra"):
        assert token not in message


@POSIX
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602])
def test_a_file_others_can_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    with pytest.raises(
        ConfigError, match=rf"readable or writable by others than its owner \(mode {mode:04o}\).*chmod 600"
    ):
        TokenFile.load(_file(tmp_path, f"alice {ALICE}\n", mode))


def _load_as(uid: int, path: Path) -> str:
    """What loading the file gives a process of `uid` (whose only group is `uid`): the principal, or the error."""
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe and never returns
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            answer = str(TokenFile.load(path).principal_of(ALICE))
        except BaseException as exc:
            answer = f"refused: {exc}"
        os.write(writing, answer.encode())
        os._exit(0)
    os.close(writing)
    with os.fdopen(reading, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(child, 0)
    return answer


ROOT_ONLY = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="makes another user's file")


@ROOT_ONLY
@pytest.mark.parametrize(
    ("group", "mode", "accepted"), [(12345, 0o440, True), (12346, 0o440, False), (12345, 0o460, False)]
)
def test_a_kubernetes_secret_readable_by_the_servers_own_group_only_is_accepted(
    group: int, mode: int, accepted: bool
) -> None:
    """A kubelet mounts a Secret root's, with the pod's fsGroup: the server, not root, reads it through its group."""
    directory = Path(tempfile.mkdtemp())
    try:
        directory.chmod(0o755)
        path = _file(directory, f"alice {ALICE}\n", mode)
        os.chown(path, 0, group)
        path.chmod(mode)
        answer = _load_as(12345, path)
        assert (answer == "alice") is accepted, answer
        assert ALICE not in answer
    finally:
        shutil.rmtree(directory)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _replace(path: Path, text: str, mode: int = 0o600) -> None:
    """Write a new version of the file the way an operator should: a whole new file renamed over the old one."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    new.chmod(mode)
    new.replace(path)


CAROL = "c4" * 20


def test_a_changed_file_is_read_again_on_a_request_a_second_later_without_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "llm_sandbox_mcp")
    clock = Clock()
    path = _file(tmp_path, f"alice {ALICE}\nbob {BOB}\n")
    tokens = TokenFile.load(path, clock)
    _replace(path, f"bob {BOB}\ncarol {CAROL}\n")
    assert tokens.principal_of(CAROL) is None  # the file is looked at once a second at most
    clock.now += 1.0
    assert tokens.principal_of(CAROL) == "carol"  # added
    assert tokens.principal_of(ALICE) is None  # revoked
    assert tokens.principal_of(BOB) == "bob"
    assert tokens.principals == ["bob", "carol"]
    assert f"SANDBOX_HTTP_TOKENS_FILE ({path}) read again: 2 token(s) of bob, carol" in caplog.text
    path.write_text(f"bob {BOB}\n")  # rewritten in place: the same inode, a new size and time
    clock.now += 1.0
    assert tokens.principal_of(CAROL) is None and tokens.principal_of(BOB) == "bob"
    assert all(token not in caplog.text for token in (ALICE, BOB, CAROL))


@pytest.mark.parametrize(
    ("text", "mode", "problem"),
    [
        (f"alice {ALICE}\ncarol {CAROL}\n", 0o644, "is readable or writable by others than its owner (mode 0644)"),
        (f"alice {ALICE}\ncarol {CAROL} x\n", 0o600, "line 2: expected `principal token`"),
        (f"alice {ALICE}\ncarol short\n", 0o600, "line 2: the token of carol must be 32 to 512"),
        ("# nobody\n", 0o600, "holds no `principal token` line"),
        (None, 0o600, "cannot be read: No such file or directory"),
    ],
    ids=["others-may-read", "malformed", "short-token", "empty", "removed"],
)
def test_a_changed_file_that_fails_the_checks_is_refused_and_the_tokens_before_stay_in_force(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str | None, mode: int, problem: str
) -> None:
    clock = Clock()
    path = _file(tmp_path, f"alice {ALICE}\nbob {BOB}\n")
    tokens = TokenFile.load(path, clock)
    if text is None:
        path.unlink()
    else:
        _replace(path, text, mode)
    clock.now += 1.0
    assert tokens.principal_of(ALICE) == "alice" and tokens.principal_of(BOB) == "bob"
    assert tokens.principal_of(CAROL) is None
    errors = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert len(errors) == 1, caplog.text
    message = errors[0].getMessage()
    assert message.startswith(f"SANDBOX_HTTP_TOKENS_FILE ({path}): {problem}"), message
    assert message.endswith(". The tokens read before stay in force until the file is fixed")
    assert all(token not in caplog.text for token in (ALICE, BOB, CAROL, "short"))
    clock.now += 1.0
    tokens.principal_of(ALICE)
    assert len([record for record in caplog.records if record.levelno == logging.ERROR]) == 1  # said once
    _replace(path, f"carol {CAROL}\n")  # fixed
    clock.now += 1.0
    assert tokens.principal_of(CAROL) == "carol" and tokens.principal_of(ALICE) is None


def test_a_missing_file_or_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        TokenFile.load(tmp_path / "absent")
    with pytest.raises(ConfigError, match="is not a regular file"):
        TokenFile.load(tmp_path)


@pytest.mark.parametrize(
    ("text", "host", "port", "loopback"),
    [
        ("127.0.0.1:8000", "127.0.0.1", 8000, True),
        ("localhost:1", "localhost", 1, True),
        ("[::1]:65535", "::1", 65535, True),
        ("0.0.0.0:8000", "0.0.0.0", 8000, False),
        ("[::]:8000", "::", 8000, False),
        ("sandbox.example.org:443", "sandbox.example.org", 443, False),
    ],
)
def test_listen_addresses(text: str, host: str, port: int, loopback: bool) -> None:
    listen = parse_listen(text)
    assert (listen.host, listen.port, listen.loopback) == (host, port, loopback)


@pytest.mark.parametrize("text", ["8000", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", "::1:8000", ":8000", "h:x"])
def test_a_bad_listen_address_says_what_is_expected(text: str) -> None:
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        parse_listen(text)


def test_serving_without_tokens_is_refused_unless_on_loopback_with_the_flag(tmp_path: Path) -> None:
    settings = Settings()
    with pytest.raises(ConfigError, match="not a loopback address, without authentication: set SANDBOX_HTTP_TOKENS"):
        check_authentication(settings, parse_listen("0.0.0.0:8000"), unauthenticated_loopback=True)
    with pytest.raises(ConfigError, match="or pass --allow-unauthenticated-loopback"):
        check_authentication(settings, parse_listen("127.0.0.1:8000"), unauthenticated_loopback=False)
    assert not check_authentication(settings, parse_listen("[::1]:8000"), unauthenticated_loopback=True).enabled
    with_tokens = Settings(sandbox_http_tokens_file=_file(tmp_path, f"alice {ALICE}\n"))
    tokens = check_authentication(with_tokens, parse_listen("0.0.0.0:8000"), unauthenticated_loopback=False).tokens
    assert tokens is not None and tokens.principals == ["alice"]


def test_the_command_line_refuses_before_serving_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--http", "0.0.0.0:8000", "--allow-unauthenticated-loopback"]) == 2
    captured = capsys.readouterr()
    assert "not a loopback address, without authentication" in captured.err and captured.out == ""
    assert main(["serve", "--http", "127.0.0.1:8000"]) == 2
    assert "or pass --allow-unauthenticated-loopback" in capsys.readouterr().err
    assert main(["serve", "--http", "nonsense"]) == 2
    assert "expected HOST:PORT" in capsys.readouterr().err
    if sys.platform != "win32":
        monkeypatch.setenv("SANDBOX_HTTP_TOKENS_FILE", str(_file(tmp_path, f"alice {ALICE}\n", 0o644)))
        assert main(["serve", "--http", "127.0.0.1:8000"]) == 2
        captured = capsys.readouterr()
        assert "(mode 0644); make it private with: chmod 600" in captured.err and ALICE not in captured.err
