"""Request and response codes, and reading request header fields.

The numbers are RocketMQ's (``RequestCode``, ``ResponseCode`` and
``RemotingSysResponseCode`` in apache/rocketmq); only the ones replay
answers or answers with are named here.
"""

from __future__ import annotations

from tiered.errors import BadRequestError
from tiered.replay.frame import RESPONSE_FLAG, Command

# RequestCode
SEND_MESSAGE = 10
PULL_MESSAGE = 11
QUERY_MESSAGE = 12
QUERY_CONSUMER_OFFSET = 14
UPDATE_CONSUMER_OFFSET = 15
SEARCH_OFFSET_BY_TIMESTAMP = 29
GET_MAX_OFFSET = 30
GET_MIN_OFFSET = 31
GET_EARLIEST_MSG_STORETIME = 32
HEART_BEAT = 34
UNREGISTER_CLIENT = 35
CONSUMER_SEND_MSG_BACK = 36
GET_CONSUMER_LIST_BY_GROUP = 38
LOCK_BATCH_MQ = 41
UNLOCK_BATCH_MQ = 42
GET_ROUTEINFO_BY_TOPIC = 105
SEND_MESSAGE_V2 = 310
SEND_BATCH_MESSAGE = 320
SENDS = frozenset({SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE})

# ResponseCode / RemotingSysResponseCode
SUCCESS = 0
SYSTEM_ERROR = 1
REQUEST_CODE_NOT_SUPPORTED = 3
NO_PERMISSION = 16
TOPIC_NOT_EXIST = 17
PULL_NOT_FOUND = 19
PULL_RETRY_IMMEDIATELY = 20
PULL_OFFSET_MOVED = 21
QUERY_NOT_FOUND = 22
INVALID_PARAMETER = 29

# PullSysFlag
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2

# PermName: the route offers every queue for reading only
PERM_READ = 4


def response(request: Command, code: int, *, remark: str | None = None, ext: dict[str, str] | None = None,
             body: bytes | memoryview = b"") -> Command:
    """The answer to ``request``: its opaque, the response flag, and its
    serialize type (the broker answers in the type it was asked in)."""
    return Command(code=code, opaque=request.opaque, flag=RESPONSE_FLAG, remark=remark, ext=ext or {}, body=body,
                   serialize=request.serialize)


def text(cmd: Command, name: str) -> str:
    """A required string field; SYSTEM_ERROR as the broker's header decoding
    answers a missing @CFNotNull field."""
    value = cmd.ext.get(name)
    if value is None or value == "":
        raise BadRequestError(f"the custom field <{name}> is null")
    return value


def number(cmd: Command, name: str, *, default: int | None = None) -> int:
    """A required (or defaulted) integer field, sent as text."""
    value = cmd.ext.get(name)
    if value is None or value == "":
        if default is not None:
            return default
        raise BadRequestError(f"the custom field <{name}> is null")
    try:
        out = int(value)
    except ValueError:
        out = None
    if out is None or not -(1 << 63) <= out < (1 << 63):
        raise BadRequestError(f"the custom field <{name}> is not a number: {value[:40]!r}")
    return out
