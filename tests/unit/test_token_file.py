"""The token file is re-read when it changes, however it is rewritten
(asr_server/transport/auth.py)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from asr_server.transport import auth
from asr_server.transport.auth import TokenRegistry, new_token


@pytest.fixture(autouse=True)
def check_at_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "CHECK_INTERVAL_S", 0.0)


def a_file_listing_alice(tmp_path: Path) -> tuple[Path, tuple[str, str], tuple[str, str]]:
    """A token file that lists alice; and alice's and bob's (token, line)."""
    alice, bob = new_token("alice"), new_token("bob")
    path = tmp_path / "tokens"
    path.write_text(alice[1] + "\n")
    return path, alice, bob


def keep_mtime(path: Path, mtime_ns: int) -> None:
    """As on a file system whose timestamps are a second apart: writes within that second
    leave the modification time as it was."""
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_a_rewrite_read_half_way_is_read_again_when_its_time_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, (alice_token, alice), (bob_token, bob) = a_file_listing_alice(tmp_path)
    registry = TokenRegistry(path)
    mtime = os.stat(path).st_mtime_ns + 1_000_000_000
    path.write_text("")  # truncated, and a call comes before the rest is written
    keep_mtime(path, mtime)
    with caplog.at_level(logging.WARNING, logger="asr_server.transport.auth"):
        assert registry.identify(alice_token) is None
    assert f"token file {path} lists no clients: every call will be refused" in caplog.text
    path.write_text(f"{alice}\n{bob}\n")  # the rest, within the same second
    keep_mtime(path, mtime)
    assert registry.identify(alice_token) == "alice"
    assert registry.identify(bob_token) == "bob"


def test_a_file_renamed_over_it_is_read_though_time_and_size_stay(tmp_path: Path) -> None:
    path, (alice_token, alice), (bob_token, bob) = a_file_listing_alice(tmp_path)
    registry = TokenRegistry(path)
    mtime = os.stat(path).st_mtime_ns
    replacement = tmp_path / "tokens.new"
    replacement.write_text(bob + "\n")  # a line of the same length
    keep_mtime(replacement, mtime)
    replacement.replace(path)
    assert registry.identify(bob_token) == "bob"
    assert registry.identify(alice_token) is None


def test_a_change_while_the_file_is_first_read_is_read_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, (alice_token, alice), (bob_token, bob) = a_file_listing_alice(tmp_path)
    parse = auth.parse_token_file

    def rewritten_meanwhile(file: Path) -> list[auth._Entry]:
        entries = parse(file)
        path.write_text(f"{alice}\n{bob}\n")
        return entries

    monkeypatch.setattr(auth, "parse_token_file", rewritten_meanwhile)
    registry = TokenRegistry(path)
    monkeypatch.setattr(auth, "parse_token_file", parse)
    assert registry.identify(bob_token) == "bob"
    assert registry.identify(alice_token) == "alice"


def test_a_deleted_file_is_a_failed_reload_once_and_read_when_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, (alice_token, alice), (bob_token, bob) = a_file_listing_alice(tmp_path)
    outcomes: list[bool] = []
    registry = TokenRegistry(path, on_reload=outcomes.append)
    path.unlink()
    with caplog.at_level(logging.ERROR, logger="asr_server.transport.auth"):
        for _ in range(3):  # one error and one failed reload, not one per check
            assert registry.identify(alice_token) == "alice"  # the current tokens stay
    assert outcomes == [False]
    assert caplog.text.count(f"cannot read the token file {path}") == 1
    path.write_text(bob + "\n")
    assert registry.identify(bob_token) == "bob"
    assert registry.identify(alice_token) is None
    path.unlink()  # after a reload that was taken, too
    assert registry.identify(bob_token) == "bob"
    assert outcomes == [False, True, False]


@pytest.mark.parametrize("pasted", ["{token}", "alice {token}", "Bearer {token}"])
def test_a_token_pasted_into_the_file_is_not_repeated_in_the_error(
    tmp_path: Path, pasted: str
) -> None:
    """The error is printed at start and logged at a reload: it quoted the line's first 40
    characters, most of a token pasted in instead of its NAME:HASH line."""
    token, _ = new_token("alice")
    path = tmp_path / "tokens"
    path.write_text(pasted.format(token=token) + "\n")
    with pytest.raises(auth.TokenFileError) as err:
        auth.parse_token_file(path)
    message = str(err.value)
    assert "expected NAME:SHA256_HEX" in message and "asr-server token NAME" in message
    assert token[:8] not in message, message
