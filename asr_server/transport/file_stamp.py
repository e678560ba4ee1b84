"""Whether a file the server re-reads when it changes (the token file, the TLS files) has
changed since it was read."""

from __future__ import annotations

import os
from pathlib import Path

#: modification time (ns), size, inode
FileStamp = tuple[int, int, int]


def file_stamp(path: Path) -> FileStamp:
    """Modification time, size and inode; OSError if the file cannot be looked at. A file
    rewritten in place and read half-way, whose rest came within the file system's
    timestamp resolution (a second on some), has the same time but not the same size; a
    file renamed over it has another inode."""
    stat = os.stat(path)
    return stat.st_mtime_ns, stat.st_size, stat.st_ino
