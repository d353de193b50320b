"""ACL 1.0: RocketMQ's ``plain_acl.yml`` accounts and request signatures.

Followed from apache/rocketmq before ACL 1.0 was removed (commit f75dc5a4d2,
RIP-77): ``PlainPermissionManager.validate``, ``PlainAccessResource.parse``,
``PlainPermissionChecker``, ``Permission``, ``AclUtils`` and
``RemoteAddressStrategyFactory``; the client side is ``AclClientRPCHook``.

A client signs a request by adding ``AccessKey`` (and ``SecurityToken`` when
it has one) to its extFields, concatenating the values of every extField
but ``Signature`` in key order, appending the body, and adding
``Signature``: Base64 of HmacSHA1 over those bytes keyed with its secret.

Secret keys stay in ``Account.secret``, which no repr, log line or error
shows.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from tiered.errors import AclFileError, BadRequestError, ConfigError
from tiered.replay import protocol as p
from tiered.replay.frame import Command

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
RETRY_PREFIX = "%RETRY%"

# Permission's bits
DENY = 1
ANY = 1 << 1
PUB = 1 << 2
SUB = 1 << 3
_PERMS = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}

# PlainPermissionManager.checkPlainAccessConfig: keys longer than 6 characters
MIN_KEY_LENGTH = 6


def parse_perm(text: Any) -> int:
    """Permission.parsePermFromString: anything unknown (or missing) is DENY."""
    return _PERMS.get(str(text).strip(), DENY) if text is not None else DENY


def check_permission(needed: int, owned: int) -> bool:
    """Permission.checkPermission."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def content(ext: Mapping[str, str], body: bytes) -> bytes:
    """The signed bytes (AclUtils.combineRequestContent over a TreeMap of the
    extFields): values but Signature's, in Java's String order of their keys
    (UTF-16 code units), UTF-8, then the body."""
    keys = sorted((k for k in ext if k != SIGNATURE), key=lambda k: k.encode("utf-16-be", "surrogatepass"))
    # String.getBytes(UTF_8) writes "?" for a lone surrogate, as "replace" does
    return "".join(ext[k] for k in keys).encode("utf-8", "replace") + body


def signature(data: bytes, secret: str) -> str:
    """AclSigner.calSignature: Base64 of HmacSHA1(data) keyed with the UTF-8 secret."""
    mac = hmac.new(secret.encode("utf-8", "replace"), data, hashlib.sha1).digest()
    return base64.b64encode(mac).decode("ascii")


def sign(ext: Mapping[str, str], body: bytes, access_key: str, secret: str) -> dict[str, str]:
    """The extFields of a request signed as AclClientRPCHook signs it."""
    out = {**ext, ACCESS_KEY: access_key}
    out[SIGNATURE] = signature(content(out, body), secret)
    return out


class AddressPattern:
    """One ``whiteRemoteAddress`` entry (RemoteAddressStrategyFactory): blank
    matches nothing; ``*``, ``*.*.*.*``, ``*:*:*:*:*:*:*:*`` every address;
    ``a,b``, ``10.0.0.{1,2}`` and ``fd00::1:{1,2}`` a set; ``10.0.*.*``,
    ``10.0.1-9.*``, ``fd00::1:*``, ``fd00::1-a`` and ``fd00::1-a:*`` a range;
    anything else one address. A pattern that does not parse raises
    ConfigError."""

    def __init__(self, text: str | None) -> None:
        self.text = (text or "").strip()
        self._any = self.text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*")
        self._set: frozenset[str] = frozenset()
        self._range: _Range | None = None
        t = self.text
        if not t or self._any:
            return
        if t.endswith("}"):
            head, sep, tail = t.partition("{")
            if not sep or "," in head:
                raise ConfigError(f"whiteRemoteAddress {t!r}: a set is written a.b.c.{{x,y}} or a:b::c:{{x,y}}")
            self._set = frozenset(_address(head + x.strip()) for x in tail[:-1].split(",") if x.strip())
        elif "," in t:
            self._set = frozenset(_address(x.strip()) for x in t.split(",") if x.strip())
        elif "*" in t or "-" in t:
            self._range = _range6(t) if ":" in t else _range(t)
        else:
            self._set = frozenset({_address(t)})

    def match(self, host: str) -> bool:
        if self._any:
            return True
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            return False
        if self._range is not None:
            return self._range.match(addr)
        return str(addr) in self._set


@dataclass(frozen=True, kw_only=True)
class _Range:
    """RangeRemoteAddressStrategy: addresses whose first parts are ``head``
    and whose next part is within ``start``..``end``; later parts are free."""

    version: int
    head: tuple[int, ...]
    start: int
    end: int

    def match(self, addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        if addr.version != self.version:
            return False
        parts = tuple(addr.packed) if addr.version == 4 else struct.unpack(">8H", addr.packed)
        n = len(self.head)
        return parts[:n] == self.head and self.start <= parts[n] <= self.end


def _address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ConfigError(f"whiteRemoteAddress {text!r}: not an IP address") from None


def _range(text: str) -> _Range:
    """RangeRemoteAddressStrategy for IPv4: the fixed head, then the part that
    varies (``*`` or ``x-y``); the parts after it must be ``*``."""
    parts = text.split(".")
    if len(parts) != 4:
        raise ConfigError(f"whiteRemoteAddress {text!r}: an IPv4 range is a.b.c.d with * or x-y")
    for index in (1, 2, 3):
        value = parts[index].strip()
        if value == "*" or "-" in value:
            if value == "*":
                start, end = 0, 255
            else:
                lo, _, hi = value.partition("-")
                if not lo.isdigit() or not hi.isdigit() or not int(lo) <= int(hi) <= 255:
                    raise ConfigError(f"whiteRemoteAddress {text!r}: range {value!r}")
                start, end = int(lo), int(hi)
            if any(x.strip() != "*" for x in parts[index + 1:]):
                raise ConfigError(f"whiteRemoteAddress {text!r}: only * may follow a range")
            head = parts[:index]
            if not all(x.isdigit() and int(x) <= 255 for x in head):
                raise ConfigError(f"whiteRemoteAddress {text!r}: not an IP address")
            return _Range(version=4, head=tuple(int(x) for x in head), start=start, end=end)
    raise ConfigError(f"whiteRemoteAddress {text!r}: no range part")


def _range6(text: str) -> _Range:
    """RangeRemoteAddressStrategy for IPv6 (AclUtils.IPv6AddressCheck and
    v6ipProcess): ``HEAD:*``, ``HEAD:x-y`` or ``HEAD:x-y:*``, bounds in hex.
    HEAD with ``::`` is expanded to the 7 (6 before ``x-y:*``) groups before
    the varying one; without it, its groups are a prefix and the groups after
    the varying one are free, as RocketMQ matches them. Stricter than
    RocketMQ: a ``::`` just before the varying group (which RocketMQ reads as
    a shorter prefix than written), a group that is not hex, or more than 8
    groups are refused."""
    bad = f"whiteRemoteAddress {text!r}"
    if text.count("*") > 1 or ("*" in text and not text.endswith(":*")) or text.count("-") > 1:
        raise ConfigError(f"{bad}: an IPv6 range is HEAD:*, HEAD:x-y or HEAD:x-y:*")
    # the groups before the varying one expand to 6 when a * follows it, else to 7
    width = 6 if "*" in text and "-" in text else 7
    pieces = text.rsplit(":", 8 - width)
    if len(pieces) != 9 - width:
        raise ConfigError(f"{bad}: an IPv6 range is HEAD:*, HEAD:x-y or HEAD:x-y:*")
    head, varying = pieces[0], pieces[1]
    if varying == "*":
        start, end = 0, 0xFFFF
    else:
        lo, sep, hi = varying.partition("-")
        if not (sep and _hex_group(lo) and _hex_group(hi)):
            raise ConfigError(f"{bad}: range {varying!r} is x-y, in hex")
        start, end = int(lo, 16), int(hi, 16)
        if not 0 <= start <= end or end == 0:
            raise ConfigError(f"{bad}: range {varying!r} needs x <= y and 0 < y")
    return _Range(version=6, head=_head6(head, width, bad), start=start, end=end)


def _head6(head: str, width: int, bad: str) -> tuple[int, ...]:
    """The fixed groups of an IPv6 range, ``::`` expanded to ``width`` groups."""
    if not head or head.endswith(":"):
        raise ConfigError(f"{bad}: write the groups before the varying one (no :: just before it)")
    if head.count("::") > 1:
        raise ConfigError(f"{bad}: :: at most once")
    if "::" in head:
        left, _, right = head.partition("::")
        lefts, rights = left.split(":") if left else [], right.split(":")
        zeros = width - len(lefts) - len(rights)
        if zeros < 1:
            raise ConfigError(f"{bad}: more than 8 groups")
        groups = [*lefts, *["0"] * zeros, *rights]
    else:
        groups = head.split(":")
        if len(groups) > width:
            raise ConfigError(f"{bad}: more than 8 groups")
    if not all(_hex_group(g) for g in groups):
        raise ConfigError(f"{bad}: not an IPv6 address before the varying group")
    return tuple(int(g, 16) for g in groups)


def _hex_group(text: str) -> bool:
    return 1 <= len(text) <= 4 and all(c in "0123456789abcdefABCDEF" for c in text)


@dataclass(frozen=True, kw_only=True)
class Account:
    access_key: str
    secret: str = field(repr=False)
    white: AddressPattern = field(repr=False)
    admin: bool = False
    default_topic: int = DENY
    default_group: int = DENY
    # topic -> perm; groups under their retry topic, as PlainAccessResource keys them
    perms: Mapping[str, int] = field(default_factory=dict)


class AccessCheck(Protocol):
    """What the server asks of an ACL: an Acl, or an AclFile that reloads one."""

    def check(self, req: Command, host: str) -> None: ...


def denied(message: str) -> BadRequestError:
    """A request the ACL refuses: NO_PERMISSION, with a message naming no secret."""
    return BadRequestError(message, code=p.NO_PERMISSION)


NO_DATA = "no data"  # AclFileError.reason of an empty file (the broker: "No data in file")


class Acl:
    def __init__(self, accounts: Mapping[str, Account], global_white: list[AddressPattern]) -> None:
        self.accounts = dict(accounts)
        self.global_white = list(global_white)

    @classmethod
    def parse(cls, data: bytes, path: Path, *, empty_ok: bool = True) -> Acl:
        """The rules of ``data``, the content of ``path``. An empty file has no
        account (so every request must come from nowhere); ``empty_ok=False``
        refuses it, as RocketMQ skips an empty file it reloads ("No data")."""
        try:
            doc = yaml.safe_load(data.decode("utf-8"))
        except (UnicodeDecodeError, yaml.YAMLError) as exc:
            # the type only: a YAML error quotes the file, secrets and all
            raise AclFileError(str(path), type(exc).__name__) from None
        if doc is None or doc == {}:
            if not empty_ok:
                raise AclFileError(str(path), NO_DATA)
            doc = {}
        if not isinstance(doc, dict):
            raise AclFileError(str(path), "a mapping with accounts and globalWhiteRemoteAddresses")
        try:
            white = []
            for i, text in enumerate(_listed(doc, "globalWhiteRemoteAddresses")):
                try:
                    white.append(AddressPattern(str(text)))
                except ConfigError as exc:
                    raise ConfigError(f"globalWhiteRemoteAddresses[{i}]: {exc}") from None
            accounts: dict[str, Account] = {}
            for i, raw in enumerate(_listed(doc, "accounts")):
                account = _account(raw, f"accounts[{i}]")
                accounts.setdefault(account.access_key, account)  # the first of a repeated key wins
        except ConfigError as exc:
            raise AclFileError(str(path), str(exc)) from None
        return cls(accounts, white)

    def check(self, req: Command, host: str) -> None:
        """PlainPermissionManager.validate: raises a NO_PERMISSION BadRequestError unless ``req`` from
        ``host`` may run."""
        if any(w.match(host) for w in self.global_white):
            return
        access_key = req.ext.get(ACCESS_KEY)
        if access_key is None:
            raise denied("No accessKey is configured")
        owned = self.accounts.get(access_key)
        if owned is None:
            raise denied(f"No acl config for {access_key[:64]}")
        if owned.white.match(host):
            return
        expected = signature(content(req.ext, req.body), owned.secret).encode()
        sent = req.ext.get(SIGNATURE)
        if sent is None or not hmac.compare_digest(expected, sent.encode("utf-8", "replace")):
            raise denied(f"Check signature failed for accessKey={access_key}")
        if owned.admin:
            return
        for resource, needed in needed_perms(req).items():
            is_group = resource.startswith(RETRY_PREFIX)
            if resource in owned.perms:
                if not check_permission(needed, owned.perms[resource]):
                    raise denied(f"No permission for {_shown(resource, is_group)}")
            elif not check_permission(needed, owned.default_group if is_group else owned.default_topic):
                raise denied(f"No default permission for {_shown(resource, is_group)}")


def _shown(resource: str, is_group: bool) -> str:
    return f"group:{resource[len(RETRY_PREFIX):]}" if is_group else f"topic:{resource}"


def _account(raw: Any, where: str) -> Account:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a mapping")
    access_key, secret = raw.get("accessKey"), raw.get("secretKey")
    if not isinstance(access_key, str) or len(access_key) <= MIN_KEY_LENGTH:
        raise ConfigError(f"{where}: accessKey must be longer than {MIN_KEY_LENGTH} characters")
    if not isinstance(secret, str) or len(secret) <= MIN_KEY_LENGTH:
        raise ConfigError(f"{where} ({access_key}): secretKey must be longer than {MIN_KEY_LENGTH} characters")
    perms: dict[str, int] = {}
    for kind, prefix in (("groupPerms", RETRY_PREFIX), ("topicPerms", "")):
        for item in raw.get(kind) or ():
            name, sep, perm = str(item).partition("=")
            if not sep or "=" in perm or not name.strip():
                raise ConfigError(f"{where} ({access_key}): {kind} entry {str(item)[:80]!r}: NAME=PERM")
            perms[prefix + name.strip()] = parse_perm(perm)
    white = raw.get("whiteRemoteAddress")
    try:
        pattern = AddressPattern(None if white is None else str(white))
    except ConfigError as exc:
        raise ConfigError(f"{where} ({access_key}): {exc}") from None
    return Account(access_key=access_key, secret=secret, white=pattern,
                   admin=bool(raw.get("admin", False)), default_topic=parse_perm(raw.get("defaultTopicPerm")),
                   default_group=parse_perm(raw.get("defaultGroupPerm")), perms=perms)


def _listed(doc: Mapping[str, Any], key: str) -> list[Any]:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{key}: a list")
    return value


def needed_perms(req: Command) -> dict[str, int]:
    """PlainAccessResource.parse: what a request needs, by topic (groups as
    their retry topic). Codes it does not list need only a valid signature."""
    ext, code, out = req.ext, req.code, {}

    def add(resource: str | None, perm: int) -> None:
        if resource is not None:
            out[resource] = perm

    def group(name: str | None) -> str | None:
        return None if name is None else retry_topic(name)

    if code == p.SEND_MESSAGE:
        topic = ext.get("topic")
        add(topic, SUB if (topic or "").startswith(RETRY_PREFIX) else PUB)
    elif code in (p.SEND_MESSAGE_V2, p.SEND_BATCH_MESSAGE):
        topic = ext.get("b")
        add(topic, SUB if (topic or "").startswith(RETRY_PREFIX) else PUB)
    elif code == p.PULL_MESSAGE:
        add(ext.get("topic"), SUB)
        add(group(ext.get("consumerGroup")), SUB)
    elif code == p.QUERY_MESSAGE:
        add(ext.get("topic"), SUB)
    elif code == p.CONSUMER_SEND_MSG_BACK:
        add(group(ext.get("group")), SUB)
    elif code == p.HEART_BEAT:
        for name, topics in _heartbeat(req.body):
            add(retry_topic(name), SUB)
            for topic in topics:
                add(topic, SUB)
    elif code in (p.UNREGISTER_CLIENT, p.GET_CONSUMER_LIST_BY_GROUP):
        add(group(_required(ext, "consumerGroup")), SUB)
    elif code == p.UPDATE_CONSUMER_OFFSET:
        add(group(_required(ext, "consumerGroup")), SUB)
        add(_required(ext, "topic"), SUB)
    return out


def _required(ext: Mapping[str, str], name: str) -> str:
    """A @CFNotNull header field: decoding the header fails without it, and
    on the broker that failure is an AclException."""
    value = ext.get(name)
    if value is None:
        raise denied(f"the custom field <{name}> is null")
    return value


def _heartbeat(body: bytes) -> list[tuple[str, list[str]]]:
    """(group, subscribed topics) of each consumer in a heartbeat body."""
    try:
        doc = json.loads(body)
        return [(str(c["groupName"]), [str(s["topic"]) for s in c.get("subscriptionDataSet") or ()])
                for c in doc.get("consumerDataSet") or ()]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise denied(f"heartbeat body: {type(exc).__name__}") from None
