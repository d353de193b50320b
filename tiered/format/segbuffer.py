"""A segment's bytes in memory of their own: an anonymous mapping.

Owned explicitly: the builder that fills it, then the upload that writes
it, then (given back by that last holder, ``BufferPool.give`` in
tiered.dispatcher.segment) the next segment's builder. Nothing counts
references to decide who holds it.

A mapping starts at a page, so a file:// store can write it around the
page cache (O_DIRECT, tiered/archive/filewrite.py). Its length is the
segment's: growing or shrinking it is ``mremap`` (the kernel moves page
tables, never the bytes), and the pages it adds are the kernel's
zero-fill-on-touch, written by nobody before the records are copied in.
A resize is refused (BufferError) while a view of it is held, so no view
outlives the memory it points into.
"""

from __future__ import annotations

import mmap


class SegmentBuffer(mmap.mmap):
    """Bytes of a segment, ``len`` of them, at a page: a writable buffer for
    every call that takes one (``memoryview``, numpy, ``os.write``)."""

    def __new__(cls, nbytes: int) -> SegmentBuffer:
        if nbytes <= 0:
            raise ValueError(f"a segment buffer holds at least a byte, not {nbytes}")
        # private: a shared anonymous mapping is a shmem file of the first size,
        # which mremap does not grow (a touch past it is SIGBUS)
        return super().__new__(cls, -1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)

    def append(self, *parts: bytes) -> None:
        """``parts`` written behind the bytes held, one after the other (a
        v2 object's tail behind its records: ``segmeta.pack_v2``)."""
        at = len(self)
        self.resize(at + sum(map(len, parts)))
        for part in parts:
            self[at:at + len(part)] = part
            at += len(part)
