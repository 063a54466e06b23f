"""A trace file as replay reads it: a regular file only, read in passes (fit, then
simulate) from its start, each line bounded, with an optional progress report."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from resetctl.errors import InputError
from resetctl.files import bounded_lines

#: The longest trace line read: one notice's reads fit in a few KiB.
MAX_TRACE_LINE = 1024 * 1024


class TraceFile:
    """The lines of a trace file, from its start on each pass; InputError naming the
    line for one over MAX_TRACE_LINE bytes or not UTF-8 (read no further than that)."""

    def __init__(self, file: BinaryIO, progress: Callable[[int, int], None] | None) -> None:
        self.file, self.progress = file, progress
        self.total = os.fstat(file.fileno()).st_size

    def __iter__(self) -> Iterator[str]:
        self.file.seek(0)
        if self.progress is not None:
            self.progress(0, self.total)
        read = 0
        for line in bounded_lines(self.file, MAX_TRACE_LINE):
            read += len(line)
            if self.progress is not None:
                self.progress(read, self.total)
            yield line


def open_trace_file(path: str | os.PathLike[str]) -> BinaryIO:
    """The trace file at ``path``, opened to read; InputError for one that cannot be read
    or is not a regular file (a FIFO, /dev/zero: never waited on, never read forever)."""
    name = os.fspath(path)
    try:
        if not stat.S_ISREG(os.stat(name).st_mode):
            raise InputError([f"{name}: not a regular file"])
        file = Path(name).open("rb")  # noqa: SIM115 -- the caller closes it
    except OSError as exc:
        raise InputError([f"{name}: cannot read ({exc.strerror})"]) from None
    if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):  # swapped since the check
        file.close()
        raise InputError([f"{name}: not a regular file"])
    return file
