"""Bearer tokens: the token file, checking a presented token, and making new tokens.

The file holds one client a line, ``NAME:SHA256_HEX_OF_TOKEN`` (``#`` starts a comment), so
it never contains a usable secret. A presented token is hashed and compared with every
entry by ``hmac.compare_digest``, so neither the match nor its position leaks through
timing. The file is re-read when it changes (``check_for_change()``: the server calls it
every second, and a call presenting a token does, at most once a second) or on ``reload()``
(SIGHUP); a file that is missing or fails to parse keeps the previous tokens and is logged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asr_server.transport.file_stamp import FileStamp, stamp_or_missing

logger = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
HASH_RE = re.compile(r"^[0-9a-f]{64}$")
#: tokens longer than this are refused before hashing (a cheap bound on work per call)
MAX_TOKEN_CHARS = 512
CHECK_INTERVAL_S = 1.0


class TokenFileError(ValueError):
    """The token file cannot be used; the message names the file and the line."""


@dataclass(frozen=True)
class _Entry:
    name: str
    digest: bytes


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token(name: str) -> tuple[str, str]:
    """A fresh random token for ``name`` and the line that goes into the token file."""
    if not NAME_RE.match(name):
        raise TokenFileError(
            f"client name {name!r}: use 1-64 letters, digits, '.', '_', '@' or '-'"
        )
    token = secrets.token_urlsafe(32)
    return token, f"{name}:{hash_token(token)}"


def parse_token_file(path: Path) -> list[_Entry]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"cannot read the token file {path}: {exc}") from None
    entries: list[_Entry] = []
    names: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, digest = line.partition(":")
        name, digest = name.strip(), digest.strip().lower()
        where = f"token file {path} line {number}"
        if not sep or not NAME_RE.match(name):
            # the line itself is never shown: it may be a token pasted in by mistake, and
            # this message is logged (a reload's) and printed
            what = "no ':'" if not sep else "a name that is not 1-64 of A-Z a-z 0-9 . _ @ -"
            raise TokenFileError(
                f"{where}: expected NAME:SHA256_HEX, the line has {what} (a token pasted in? "
                "the file holds hashes: `asr-server token NAME` prints a line for it)"
            )
        if not HASH_RE.match(digest):
            raise TokenFileError(
                f"{where}: {name}'s hash must be 64 hex digits (the SHA-256 of the token, "
                "as `asr-server token NAME` prints it)"
            )
        if name in names:
            raise TokenFileError(f"{where}: {name} appears twice")
        names.add(name)
        entries.append(_Entry(name, bytes.fromhex(digest)))
    return entries


def token_digest(token: str) -> bytes:
    """The SHA-256 of a presented token, as the file's lines hold it (in hex)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


#: a token as the file holds it: its client's name and its hash
Credential = tuple[str, bytes]


class TokenRegistry:
    """The clients of a token file; ``identify(token)`` returns the client's name or None."""

    def __init__(self, path: Path, *, on_reload: Callable[[bool], None] | None = None) -> None:
        self.path = path
        self._on_reload = on_reload
        self._lock = threading.Lock()
        self._stamp = self._file_stamp()  # before the read: a change during it is seen later
        self._entries = parse_token_file(path)  # start-up: a bad file is fatal
        self._failed_stamp: FileStamp | None = None
        self._checked = time.monotonic()
        #: told the tokens a reload withdrew (their line gone, or its hash replaced), from
        #: whichever thread reloaded
        self._on_revoked: list[Callable[[frozenset[Credential]], object]] = []
        self._warn_if_empty()

    def on_revoked(self, listener: Callable[[frozenset[Credential]], object]) -> None:
        """Call ``listener(tokens)`` after each reload that withdrew tokens. A token is its
        (name, hash): a name given a new hash withdraws its old token only."""
        self._on_revoked.append(listener)

    @property
    def names(self) -> list[str]:
        return [e.name for e in self._entries]

    def identify(self, token: str) -> str | None:
        credential = self.credential_of(token)
        return credential[0] if credential is not None else None

    def credential_of(self, token: str) -> Credential | None:
        """The file's (name, hash) for ``token``, or None: the token a call is admitted
        with, which a reload that withdraws it ends (``on_revoked``)."""
        self.check_for_change()
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        digest = token_digest(token)
        found = None
        for entry in self._entries:  # no early exit: the time taken says nothing
            if hmac.compare_digest(entry.digest, digest):
                found = (entry.name, entry.digest)
        return found

    def reload(self) -> bool:
        """Re-read the file now (SIGHUP); True if it was taken."""
        with self._lock:
            return self._load(self._file_stamp())

    def check_for_change(self) -> None:
        """Re-read the file if it changed since the last look (at most once a second)."""
        now = time.monotonic()
        if now - self._checked < CHECK_INTERVAL_S:
            return
        with self._lock:
            self._checked = now
            stamp = self._file_stamp()
            if stamp != self._stamp and stamp != self._failed_stamp:
                self._load(stamp)

    def _load(self, stamp: FileStamp) -> bool:
        try:
            entries = parse_token_file(self.path)
        except TokenFileError as exc:
            logger.error("token file reload failed, keeping the current tokens: %s", exc)
            self._failed_stamp = stamp
            self._notify(False)
            return False
        kept = {(e.name, e.digest) for e in entries}
        revoked = frozenset((e.name, e.digest) for e in self._entries) - kept
        self._entries, self._stamp, self._failed_stamp = entries, stamp, None
        self._notify(True)
        logger.info("token file %s reloaded: %d client(s)", self.path, len(entries))
        self._warn_if_empty()
        if revoked:
            names = ", ".join(sorted(name for name, _ in revoked))
            logger.warning("token(s) of %s withdrawn: their open calls end", names)
            for listener in self._on_revoked:
                listener(revoked)
        return True

    def _warn_if_empty(self) -> None:
        # also what a rewrite read half-way looks like; the rest is read at the next check
        if not self._entries:
            logger.warning("token file %s lists no clients: every call will be refused", self.path)

    def _notify(self, ok: bool) -> None:
        if self._on_reload is not None:
            self._on_reload(ok)

    def _file_stamp(self) -> FileStamp:
        return stamp_or_missing(self.path)
