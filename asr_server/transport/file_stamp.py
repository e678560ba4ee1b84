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


#: the stamp of a file that cannot be looked at (missing, mostly): no file's size is -1, and a
#: file that goes missing is a change like any other, to be reported once
MISSING: FileStamp = (-1, -1, -1)


def stamp_or_missing(path: Path) -> FileStamp:
    try:
        return file_stamp(path)
    except OSError:
        return MISSING
