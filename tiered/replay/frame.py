"""RocketMQ remoting frames: the 4.x protocol every 4.x and 5.x client speaks.

A frame on the wire (``RemotingCommand.encode`` / ``decode`` and Netty's
``NettyDecoder`` in apache/rocketmq)::

    int32 length          bytes after this field
    int32 header info     serialize type in the high byte (0 JSON, 1 ROCKETMQ),
                          header length in the low three bytes
    header                JSON object, or the ROCKETMQ binary layout below
    body                  the rest of the frame

The ROCKETMQ binary header (``RocketMQSerializable``), big-endian::

    int16 code, int8 language, int16 version, int32 opaque, int32 flag,
    int32 remark length + UTF-8 remark,
    int32 extFields length + entries (int16 key length + key, int32 value length + value)

Flag bit 0 marks a response, bit 1 a one-way request. A frame the broker
could not decode makes it close the connection; ``decode`` raises
``BadFrameError`` for every such frame and never anything else.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

from tiered.errors import BadFrameError

JSON = 0
ROCKETMQ = 1
RESPONSE_FLAG = 1  # 1 << RPC_TYPE
ONEWAY_FLAG = 2  # 1 << RPC_ONEWAY
# NettyDecoder's FRAME_MAX_LENGTH (com.rocketmq.remoting.frameMaxLength): a
# frame, its length field included, is at most 16 MiB.
MAX_FRAME = 16 * 1024 * 1024
MAX_LENGTH = MAX_FRAME - 4

# LanguageCode: the JSON header names it, the binary header numbers it
LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS",
             "RUST", "NODE_JS")
_LANGUAGE_CODES = {name: i for i, name in enumerate(LANGUAGES)}

_I32 = struct.Struct(">i")
_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag
_I16 = struct.Struct(">h")
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
# one encoder for every header: json.dumps with separators builds one a call
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"))


@dataclass(frozen=True, kw_only=True)
class Command:
    """One request or response. ``ext`` holds the extFields as strings, as
    the broker's ``HashMap<String, String>`` does."""

    code: int
    opaque: int = 0
    flag: int = 0
    language: str = "JAVA"
    version: int = 0
    remark: str | None = None
    ext: dict[str, str] = field(default_factory=dict)
    body: bytes | memoryview = b""  # a pull's answer: a view of the records it serves
    serialize: int = JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RESPONSE_FLAG)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & ONEWAY_FLAG)


def frame_length(prefix: bytes) -> int:
    """The length field of a frame (its first four bytes), checked as Netty's
    LengthFieldBasedFrameDecoder and ``RemotingCommand.decode`` check it:
    negative, shorter than the header-info field or past 16 MiB is refused."""
    (length,) = _I32.unpack(prefix)
    if length < 4:
        raise BadFrameError(f"frame length {length}: at least 4")
    if length > MAX_LENGTH:
        raise BadFrameError(f"frame length {length}: over the {MAX_FRAME}-byte frame limit")
    return length


def decode(frame: bytes) -> Command:
    """A command from the bytes after the length field."""
    if len(frame) < 4:
        raise BadFrameError(f"frame of {len(frame)} bytes: no header length")
    (info,) = _I32.unpack_from(frame, 0)
    kind = (info >> 24) & 0xFF
    hlen = info & 0xFFFFFF
    if hlen > len(frame) - 4:
        raise BadFrameError(f"header length {hlen} past the frame's {len(frame) - 4} bytes")
    header = frame[4:4 + hlen]
    body = bytes(frame[4 + hlen:])
    if kind == JSON:
        return _from_json(header, body)
    if kind == ROCKETMQ:
        return _from_binary(header, body)
    raise BadFrameError(f"serialize type {kind}: not JSON (0) or ROCKETMQ (1)")


def _ext_value(key: str, value: Any) -> str:
    """An extFields value as the broker's map holds it: clients send strings,
    some send JSON numbers or booleans (fastjson reads those as their text)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise BadFrameError(f"extFields[{key!r}] is {type(value).__name__}, not a string or number")


def _int(doc: dict[str, Any], name: str, default: int) -> int:
    value = doc.get(name, default)
    if value is None:
        return default
    if isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not _INT32_MIN <= value <= _INT32_MAX:
        raise BadFrameError(f"header field {name}: {value!r} is not a 32-bit integer")
    return value


def _from_json(header: bytes, body: bytes) -> Command:
    try:
        doc = json.loads(header)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BadFrameError(f"JSON header: {exc}") from None
    if not isinstance(doc, dict):
        raise BadFrameError("JSON header is not an object")
    ext_doc = doc.get("extFields") or {}
    if not isinstance(ext_doc, dict):
        raise BadFrameError("extFields is not an object")
    # JSON object keys are strings; most values are too (checked inline: a call each costs)
    ext = {k: v if type(v) is str else _ext_value(k, v) for k, v in ext_doc.items() if v is not None}
    remark = doc.get("remark")
    language = doc.get("language", "JAVA")
    if isinstance(language, int) and not isinstance(language, bool) and 0 <= language < len(LANGUAGES):
        language = LANGUAGES[language]
    if not isinstance(language, str) or (remark is not None and not isinstance(remark, str)):
        raise BadFrameError("language or remark is not a string")
    if "code" not in doc:
        raise BadFrameError("JSON header without a code")
    return Command(code=_int(doc, "code", 0), opaque=_int(doc, "opaque", 0), flag=_int(doc, "flag", 0),
                   language=language, version=_int(doc, "version", 0), remark=remark, ext=ext, body=body,
                   serialize=JSON)


class _Cursor:
    """Bounds-checked reads over a binary header."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise BadFrameError(f"binary header: {n} bytes wanted at {self.pos}, {len(self.data)} in all")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, st: struct.Struct) -> tuple[Any, ...]:
        return st.unpack(self.take(st.size))

    def string(self, size: struct.Struct) -> str | None:
        """RocketMQSerializable.readStr: a length (0 = null), then UTF-8."""
        (n,) = self.unpack(size)
        if n == 0:
            return None
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadFrameError(f"binary header: {exc}") from None


def _from_binary(header: bytes, body: bytes) -> Command:
    cur = _Cursor(header)
    code, lang, version, opaque, flag = cur.unpack(_FIXED)
    remark = cur.string(_I32)
    (ext_len,) = cur.unpack(_I32)
    ext: dict[str, str] = {}
    if ext_len > 0:
        end = cur.pos + ext_len
        if end > len(header):
            raise BadFrameError(f"extFields length {ext_len} past the header's {len(header)} bytes")
        while cur.pos < end:
            key = cur.string(_I16)
            value = cur.string(_I32)
            if key is not None and value is not None:
                ext[key] = value
        if cur.pos != end:
            raise BadFrameError("extFields entries overrun their length")
    language = LANGUAGES[lang] if 0 <= lang < len(LANGUAGES) else "OTHER"
    return Command(code=code, opaque=opaque, flag=flag, language=language, version=version, remark=remark,
                   ext=ext, body=body, serialize=ROCKETMQ)


def _json_header(cmd: Command) -> bytes:
    # fastjson leaves null fields out
    doc: dict[str, Any] = {"code": cmd.code, "flag": cmd.flag, "language": cmd.language, "opaque": cmd.opaque,
                           "serializeTypeCurrentRPC": "JSON", "version": cmd.version}
    if cmd.ext:
        doc["extFields"] = cmd.ext
    if cmd.remark is not None:
        doc["remark"] = cmd.remark
    # ASCII with \u escapes: a lone surrogate a client sent (and a remark repeats) stays encodable
    return _JSON_ENCODER.encode(doc).encode("ascii")


def _binary_str(value: str, size: struct.Struct) -> bytes:
    raw = value.encode("utf-8", "replace")  # a lone surrogate a client sent becomes "?"
    return size.pack(len(raw)) + raw


def _binary_header(cmd: Command) -> bytes:
    ext = b"".join(_binary_str(k, _I16) + _binary_str(v, _I32) for k, v in cmd.ext.items())
    lang = _LANGUAGE_CODES.get(cmd.language, _LANGUAGE_CODES["OTHER"])
    remark = _binary_str(cmd.remark, _I32) if cmd.remark else _I32.pack(0)
    return _FIXED.pack(cmd.code, lang, cmd.version, cmd.opaque, cmd.flag) + remark + _I32.pack(len(ext)) + ext


def encode_head(cmd: Command, body_len: int) -> bytes:
    """Length, header info and header of ``cmd`` for a body of ``body_len``
    bytes (sent after it, so a large body is never copied into the frame)."""
    header = _binary_header(cmd) if cmd.serialize == ROCKETMQ else _json_header(cmd)
    return _I32.pack(4 + len(header) + body_len) + _I32.pack((cmd.serialize << 24) | len(header)) + header


def encode(cmd: Command) -> bytes:
    """The whole frame of ``cmd``, length field first."""
    return encode_head(cmd, len(cmd.body)) + cmd.body
