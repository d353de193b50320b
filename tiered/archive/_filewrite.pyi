"""tiered/archive/_filewrite.c: the compiled whole write of tiered.archive.filewrite."""

import os

def write_file(tmp: str | os.PathLike[str], data: bytes | bytearray | memoryview, head: int,
               dest: str | os.PathLike[str] | None, dir: str | os.PathLike[str] | None, /) -> int: ...
