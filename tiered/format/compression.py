"""Message bodies as consumers see them: producer-side compression undone.

A producer may compress a body before sending it and say so in the record's
sys flag (RocketMQ ``MessageSysFlag``):

- bit 0 (``COMPRESSED_FLAG``): the body is compressed;
- bits 8-10 (``COMPRESSION_TYPE_COMPARATOR``, RocketMQ 5.x): which codec,
  ``0x100`` LZ4, ``0x200`` ZSTD, ``0x300`` ZLIB. A 4.x producer leaves them
  zero and always uses zlib, so zero means zlib.

The broker stores the compressed bytes (and their CRC); consumers decompress
them (``MessageDecoder``). LZ4 and ZSTD are the frame formats of the Java
``LZ4FrameOutputStream`` and ``ZstdOutputStream``; zlib is ``Deflater``'s
zlib stream.

``decompress`` raises ``BodyDecompressError`` for a body that does not
decode, so callers can treat it as a per-record error.
"""

from __future__ import annotations

import zlib

from tiered.errors import BodyDecompressError

COMPRESSED_FLAG = 0x1
COMPRESSION_TYPE_MASK = 0x7 << 8
LZ4 = 0x1 << 8
ZSTD = 0x2 << 8
ZLIB = 0x3 << 8
_NAMES = {0: "zlib", ZLIB: "zlib", LZ4: "lz4", ZSTD: "zstd"}

# A body never inflates past this (the broker's default maxMessageSize is
# 4 MiB; compressed bodies inflate a few times): a cap keeps a hostile body
# from exhausting memory.
MAX_BODY = 256 << 20


def is_compressed(sys_flag: int) -> bool:
    return bool(sys_flag & COMPRESSED_FLAG)


def codec_name(sys_flag: int) -> str | None:
    """``zlib``, ``lz4`` or ``zstd`` for a compressed body, None when it is not
    compressed; ``unknown(N)`` for a type bit pattern RocketMQ does not define."""
    if not is_compressed(sys_flag):
        return None
    kind = sys_flag & COMPRESSION_TYPE_MASK
    return _NAMES.get(kind, f"unknown({kind >> 8})")


def decompress(body: bytes, sys_flag: int) -> bytes:
    """The body a consumer receives: decompressed when ``sys_flag`` says so,
    else ``body`` itself."""
    codec = codec_name(sys_flag)
    if codec is None:
        return body
    try:
        if codec == "zlib":
            d = zlib.decompressobj()
            out = d.decompress(body, MAX_BODY)
            if d.unconsumed_tail:
                raise BodyDecompressError(codec=codec, reason=f"inflates past {MAX_BODY} bytes")
            if not d.eof:
                raise BodyDecompressError(codec=codec, reason="truncated stream")
            return out
        if codec == "lz4":
            import lz4.frame

            return lz4.frame.decompress(body)
        if codec == "zstd":
            import zstandard

            return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    except BodyDecompressError:
        raise
    except Exception as exc:  # noqa: BLE001 - each codec has its own error types
        raise BodyDecompressError(codec=codec, reason=str(exc) or type(exc).__name__) from None
    raise BodyDecompressError(codec=codec, reason="compression type not defined by RocketMQ")


def compress(body: bytes, codec: str) -> tuple[bytes, int]:
    """(compressed body, sys flag bits) as a producer of ``codec`` writes them
    (``zlib4`` is a 4.x producer: zlib with no type bits). For tests and tools."""
    if codec == "zlib4":
        return zlib.compress(body), COMPRESSED_FLAG
    if codec == "zlib":
        return zlib.compress(body), COMPRESSED_FLAG | ZLIB
    if codec == "lz4":
        import lz4.frame

        return lz4.frame.compress(body), COMPRESSED_FLAG | LZ4
    if codec == "zstd":
        import zstandard

        return zstandard.ZstdCompressor().compress(body), COMPRESSED_FLAG | ZSTD
    raise ValueError(f"unknown codec {codec!r}: zlib4, zlib, lz4 or zstd")
