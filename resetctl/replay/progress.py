"""Reading a trace file in passes (fit, then simulate) with a progress report."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TextIO


class ReadProgress:
    """A trace file read in passes (fit, then simulate), each reported from its start."""

    def __init__(self, file: TextIO, total: int, progress: Callable[[int, int], None]) -> None:
        self.file, self.total, self.progress = file, total, progress

    def __iter__(self) -> Iterator[str]:
        self.file.seek(0)
        self.progress(0, self.total)
        read = 0
        for line in self.file:
            read += len(line)
            self.progress(read, self.total)
            yield line
