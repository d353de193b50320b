"""``tiered replay --acl``: RocketMQ ACL 1.0 signatures, permissions and addresses.

The signature vectors were derived by hand from apache/rocketmq's Java
code, not from tiered's: ``AclClientRPCHook.doBeforeRequest`` adds
``AccessKey`` to the extFields, puts them in a ``TreeMap`` (String order:
upper case before lower case), and ``AclUtils.combineRequestContent``
appends each value but ``Signature``'s, as UTF-8, then the body;
``AclSigner.calSignature`` is Base64(HmacSHA1(content, secret)). For the
pull below the keys sort as AccessKey, consumerGroup, queueId, topic, so the
content is ``replayReader`` + ``replay-group`` + ``0`` + ``Orders``, and

    printf '%s' 'replayReaderreplay-group0Orders' | openssl dgst -sha1 -hmac 's3cretValue42' -binary | base64

gives ``Ew5KDBYXaQv1RiihjtY6j8sRTS8=``; with the body ``{"x":1}`` appended,
``luPao1dy2vZvm7z+MpoEAoZoit4=``.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from replaykit import Archived, Raw, Replay
from tiered.errors import AclFileError, BadRequestError, ConfigError
from tiered.replay import protocol as p
from tiered.replay.acl import Acl, AddressPattern, content, sign, signature
from tiered.replay.aclfile import AclFile
from tiered.replay.frame import Command

rocketmq = pytest.importorskip("rocketmq.client", reason="the RocketMQ C++ client wheel (x86_64 Linux)")

pytestmark = pytest.mark.timeout(180, method="thread")

ACCESS, SECRET = "replayReader", "s3cretValue42"
ACL_YAML = f"""
globalWhiteRemoteAddresses:
  - 10.9.*.*
accounts:
  - accessKey: {ACCESS}
    secretKey: {SECRET}
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - Orders=SUB
      - Audit=DENY
    groupPerms:
      - banned-group=DENY
  - accessKey: replayAdmin
    secretKey: adminSecret77
    admin: true
"""


def test_the_signature_is_rocketmqs_vector() -> None:
    ext = {"consumerGroup": "replay-group", "queueId": "0", "topic": "Orders", "AccessKey": ACCESS}
    assert content(ext, b"") == b"replayReaderreplay-group0Orders"
    assert signature(content(ext, b""), SECRET) == "Ew5KDBYXaQv1RiihjtY6j8sRTS8="
    assert signature(content(ext, b'{"x":1}'), SECRET) == "luPao1dy2vZvm7z+MpoEAoZoit4="
    # Signature itself is never signed; sign() is what AclClientRPCHook adds
    signed = sign({k: v for k, v in ext.items() if k != "AccessKey"}, b"", ACCESS, SECRET)
    assert signed["Signature"] == "Ew5KDBYXaQv1RiihjtY6j8sRTS8="
    assert content(signed, b"") == content(ext, b"")


def test_keys_sort_as_java_strings() -> None:
    # TreeMap<String> compares UTF-16 code units: U+1F600 (the pair 0xD83D 0xDE00) sorts before
    # U+FF21, though code point order (Python's own sort) puts it after
    assert content({"\uFF21": "a", "\U0001F600": "b"}, b"") == b"ba"
    assert content({"b": "2", "B": "1", "a": "3"}, b"") == b"132"


@pytest.mark.parametrize(("pattern", "host", "matches"), [
    ("", "127.0.0.1", False),  # blank: nobody is let in without a signature
    ("*", "203.0.113.9", True),
    ("*.*.*.*", "10.0.0.1", True),
    ("192.168.0.1", "192.168.0.1", True),
    ("192.168.0.1", "192.168.0.2", False),
    ("192.168.0.1,10.0.0.3", "10.0.0.3", True),
    ("192.168.0.1,10.0.0.3", "10.0.0.4", False),
    ("192.168.1.{1,2}", "192.168.1.2", True),
    ("192.168.1.{1,2}", "192.168.1.3", False),
    ("192.168.*.*", "192.168.77.1", True),
    ("192.168.*.*", "192.169.0.1", False),
    ("192.168.1-10.*", "192.168.10.200", True),
    ("192.168.1-10.*", "192.168.11.1", False),
    ("192.168.1.5-7", "192.168.1.6", True),
    ("192.168.1.5-7", "192.168.1.8", False),
    ("192.168.1.*", "192.168.10.1", False),  # the head must match whole parts
    ("::1", "0:0:0:0:0:0:0:1", True),
    ("192.168.*.*", "not-an-address", False),
])
def test_white_remote_address_patterns(pattern: str, host: str, matches: bool) -> None:
    assert AddressPattern(pattern).match(host) is matches


# IPv6, as RemoteAddressStrategyFactory and AclUtils read it before ACL 1.0's removal (f75dc5a4d2^):
# a range's bounds are hex; HEAD with :: is expanded to the groups before the varying one; without ::
# HEAD is a prefix and the groups after the varying one are free (RemoteAddressStrategyTest's shapes)
@pytest.mark.parametrize(("pattern", "host", "matches"), [
    ("*:*:*:*:*:*:*:*", "2001:db8::1", True),
    ("1050:0000:0000:0000:0005:0600:300c:326b", "1050::5:600:300c:326b", True),  # one address, any spelling
    ("1050::5:600:300c:326b", "1050:0:0:0:5:600:300c:326B", True),
    ("1050::5:600:300c:326b", "1050::5:600:300c:326c", False),
    ("1050::0005:0600:300c:3261,1050::0005:0600:300c:3262", "1050::5:600:300c:3262", True),
    ("1050::0005:0600:300c:3261,1050::0005:0600:300c:3262", "1050::5:600:300c:3263", False),
    ("1050::0005:0600:300c:3261:{1,2,3}", "1050:0:0:5:600:300c:3261:2", True),  # a set in the last group
    ("1050::0005:0600:300c:3261:{1,2,3}", "1050:0:0:5:600:300c:3261:4", False),
    ("1050::0005:0600:300c:*", "1050::5:600:300c:ffff", True),  # HEAD:*
    ("1050::0005:0600:300c:*", "1050::5:600:300c:0", True),
    ("1050::0005:0600:300c:*", "1050::5:600:3001:1", False),
    ("1050::0005:0600:300c:1-200", "1050::5:600:300c:200", True),  # HEAD:x-y, hex bounds
    ("1050::0005:0600:300c:1-200", "1050::5:600:300c:1", True),
    ("1050::0005:0600:300c:1-200", "1050::5:600:300c:201", False),
    ("1050::0005:0600:300c:1-200", "1050::5:600:300c:0", False),
    ("1050::0005:0600:300c:1-200:*", "1050:0:0:5:600:300c:1:abcd", True),  # HEAD:x-y:*
    ("1050::0005:0600:300c:1-200:*", "1050:0:0:5:600:300c:200:0", True),
    ("1050::0005:0600:300c:1-200:*", "1050:0:0:5:600:300c:201:1", False),
    ("1050::0005:0600:300c:1-200:*", "1051:0:0:5:600:300c:1:1", False),
    ("1050:0005:0600:300c:3261:*", "1050:5:600:300c:3261:9:8:7", True),  # no ::: a prefix of 5 groups
    ("1050:0005:0600:300c:3261:*", "1050:5:600:300c:3262::", False),
    ("::1:*", "::1:5", True),
    ("::1:*", "::2:5", False),
    ("1050::0005:0600:300c:*", "10.0.0.1", False),  # an IPv4 client never matches an IPv6 range
    ("10.0.*.*", "::ffff:10.0.0.1", False),  # nor an IPv6 client an IPv4 range
    ("1050::0005:0600:300c:*", "not-an-address", False),
])
def test_ipv6_white_remote_address_patterns(pattern: str, host: str, matches: bool) -> None:
    assert AddressPattern(pattern).match(host) is matches


@pytest.mark.parametrize("pattern", [
    "192.168.1.300", "192.168.*.1", "192.168.9-3.*", "10.0.0.{a,b}",
    "fe80::1-2:*",  # :: just before the varying group: RocketMQ reads fe80:0 as the head; refused
    "1050::*",
    "1050::300c:*:*",  # * only once, as the last group
    "1050::300c:*:1",
    "1050::300c:1-2:3",  # a range is the last group, or the one before a last *
    "1050::300c:2-1",  # x <= y
    "1050::300c:0-0",  # RocketMQ finds no range when y is 0
    "1050::300c:1-10000",  # past ffff
    "1050::300c:-5",
    "1-2:*",  # no head
    "1-2",
    "1050::zz:*",  # a head group that is not hex
    "1050::1::2:*",
    "1:2:3:4:5:6:7:8:*",  # more than 8 groups
    "1:2:3:4:5:6:7:1-2:*",
    "1050::0005:0600:300c:3261:{1,zz}",
    "1050::0005:0600:300c:3261:326g",
])
def test_bad_patterns_are_refused_at_load(pattern: str) -> None:
    with pytest.raises(ConfigError):
        AddressPattern(pattern)


def test_a_bad_pattern_in_a_file_is_an_acl_file_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    for text, where in ((ACL_YAML.replace("whiteRemoteAddress:\n", "whiteRemoteAddress: 1050::300c:2-1\n", 1),
                         f"accounts[0] ({ACCESS}): whiteRemoteAddress '1050::300c:2-1'"),
                        (ACL_YAML.replace("  - 10.9.*.*", "  - 10.9.*.*\n  - 1050::*"),
                         "globalWhiteRemoteAddresses[1]: whiteRemoteAddress '1050::*'")):
        path.write_text(text)
        with pytest.raises(AclFileError) as info:
            AclFile(path).acl
        assert info.value.path == str(path) and info.value.reason.startswith(where)
        assert str(info.value).startswith(f"--acl {path}: {where}") and SECRET not in str(info.value)


def _acl(tmp_path: Path, text: str = ACL_YAML) -> Acl:
    path = tmp_path / "plain_acl.yml"
    path.write_text(text)
    return AclFile(path).acl


def _pull(ext: dict[str, str] | None = None, **kw: str) -> Command:
    fields = {"consumerGroup": "replay-group", "topic": "Orders", "queueId": "0", "queueOffset": "0",
              "maxMsgNums": "32", "sysFlag": "0", **(ext or {}), **kw}
    return Command(code=p.PULL_MESSAGE, ext=fields)


def _refused(acl: Acl, cmd: Command, host: str = "127.0.0.1") -> str:
    with pytest.raises(BadRequestError) as info:
        acl.check(cmd, host)
    assert info.value.code == p.NO_PERMISSION
    return str(info.value)


def test_permissions_follow_plain_permission_checker(tmp_path: Path) -> None:
    acl = _acl(tmp_path)
    ok = _pull()
    acl.check(Command(code=ok.code, ext=sign(ok.ext, b"", ACCESS, SECRET)), "127.0.0.1")
    assert _refused(acl, ok) == "No accessKey is configured"
    assert _refused(acl, _pull(sign(ok.ext, b"", "nobody-here", SECRET))) == "No acl config for nobody-here"
    wrong = _refused(acl, _pull(sign(ok.ext, b"", ACCESS, "wrongSecret99")))
    assert wrong == f"Check signature failed for accessKey={ACCESS}" and SECRET not in wrong
    # a field changed after signing breaks the signature
    tampered = {**sign(ok.ext, b"", ACCESS, SECRET), "queueOffset": "5"}
    assert _refused(acl, _pull(tampered)).startswith("Check signature failed")
    for topic, why in (("Audit", "No permission for topic:Audit"), ("Other", "No default permission for topic:Other")):
        assert _refused(acl, _pull(sign(_pull(topic=topic).ext, b"", ACCESS, SECRET))) == why
    banned = sign(_pull(consumerGroup="banned-group").ext, b"", ACCESS, SECRET)
    assert _refused(acl, _pull(banned)) == "No permission for group:banned-group"
    # codes PlainAccessResource lists no resource for need only a valid signature (the route of a DENY topic too)
    route = Command(code=p.GET_ROUTEINFO_BY_TOPIC, ext=sign({"topic": "Audit"}, b"", ACCESS, SECRET))
    acl.check(route, "127.0.0.1")
    # a heartbeat needs SUB on its group and on every subscribed topic; the body is signed too
    body = json.dumps({"clientID": "c1", "consumerDataSet": [
        {"groupName": "replay-group", "subscriptionDataSet": [{"topic": "Orders"}, {"topic": "Audit"}]}]}).encode()
    beat = Command(code=p.HEART_BEAT, ext=sign({}, body, ACCESS, SECRET), body=body)
    assert _refused(acl, beat) == "No permission for topic:Audit"
    assert _refused(acl, Command(code=p.HEART_BEAT, ext=beat.ext, body=body + b" ")).startswith("Check signature")
    # an admin passes every resource check; a send still gets no further than the broker's refusal
    acl.check(Command(code=p.SEND_MESSAGE_V2, ext=sign({"b": "Audit"}, b"x", "replayAdmin", "adminSecret77"),
                      body=b"x"), "127.0.0.1")


def test_white_addresses_skip_the_signature(tmp_path: Path) -> None:
    acl = _acl(tmp_path)
    acl.check(_pull(topic="Audit"), "10.9.3.4")  # globalWhiteRemoteAddresses: anything goes
    assert _refused(acl, _pull(), "10.8.3.4") == "No accessKey is configured"
    own = _acl(tmp_path, ACL_YAML.replace("whiteRemoteAddress:\n", "whiteRemoteAddress: 192.168.0.*\n", 1))
    acl_key_only = {**_pull().ext, "AccessKey": ACCESS}
    own.check(_pull(acl_key_only, topic="Audit"), "192.168.0.7")  # the account's own white address: no check at all
    assert _refused(own, _pull(acl_key_only), "192.168.1.7").startswith("Check signature failed")


def test_a_bad_acl_file_names_no_secret(tmp_path: Path) -> None:
    for text in (ACL_YAML.replace(f"accessKey: {ACCESS}", "accessKey: short"),
                 ACL_YAML.replace(f"secretKey: {SECRET}", "secretKey: tiny"),
                 ACL_YAML.replace("- Orders=SUB", "- Orders"),
                 ACL_YAML + "  - {accessKey: third-key, secretKey: " + SECRET + "X, whiteRemoteAddress: 1.2.3}\n",
                 "accounts: [\n" + SECRET):
        with pytest.raises(ConfigError) as info:
            _acl(tmp_path, text)
        assert SECRET not in str(info.value) and "tiny" not in str(info.value)
    assert SECRET not in repr(_acl(tmp_path).accounts[ACCESS])


# --- end to end: the real C++ client, and raw frames --------------------------------------------


@pytest.fixture(scope="module")
def acl_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("acl") / "plain_acl.yml"
    path.write_text(ACL_YAML)
    return path


@pytest.fixture(scope="module")
def guarded(archived: Archived, acl_file: Path) -> Iterator[Replay]:
    with Replay(archived.cold_url, "--acl", str(acl_file), env={"TIERED_LOG__LEVEL": "DEBUG"}) as r:
        yield r


def pull_all(address: str, group: str, topic: str, creds: tuple[str, str] | None) -> list[tuple[int, int]]:
    """(queue, offset) of every message a C++ PullConsumer gets. The wrapper's
    own ``pull`` retries a refused pull forever, so this is its loop, ending
    each queue at the first answer that is neither found nor filtered."""
    from ctypes import POINTER, c_int, c_longlong, pointer

    from rocketmq.client import RecvMessage, _CMessageQueue, _CPullStatus, _to_bytes, dll, ffi_check

    consumer = rocketmq.PullConsumer(group)
    consumer.set_namesrv_addr(address)
    if creds is not None:
        consumer.set_session_credentials(creds[0], creds[1], "LOCAL")
    consumer.start()
    got: list[tuple[int, int]] = []
    try:
        queues, count = POINTER(_CMessageQueue)(), c_int()
        ffi_check(dll.FetchSubscriptionMessageQueues(consumer._handle, _to_bytes(topic), pointer(queues),
                                                     pointer(count)))
        for i in range(count.value):
            offset, status = 0, _CPullStatus.FOUND
            while status in (_CPullStatus.FOUND, _CPullStatus.NO_MATCHED_MSG):
                res = dll.Pull(consumer._handle, pointer(queues[i]), b"*", c_longlong(offset), 32)
                status, offset = res.pullStatus, res.nextBeginOffset
                if status == _CPullStatus.FOUND:
                    got += [(m.queue_id, m.queue_offset) for m in map(RecvMessage, res.msgFoundList[:res.size])]
                dll.ReleasePullResult(res)
        if count.value:
            ffi_check(dll.ReleaseSubscriptionMessageQueue(queues))
    finally:
        consumer.shutdown()
    return sorted(got)


def test_the_cpp_client_gets_everything_only_with_the_right_secret(archived: Archived, guarded: Replay) -> None:
    want = sorted((q, o) for (t, q, o) in archived.messages if t == "Orders")
    assert pull_all(guarded.address, "acl-none", "Orders", None) == []
    assert pull_all(guarded.address, "acl-wrong", "Orders", (ACCESS, "wrongSecret99")) == []
    assert pull_all(guarded.address, "acl-right", "Orders", (ACCESS, SECRET)) == want
    assert pull_all(guarded.address, "acl-deny", "Audit", (ACCESS, SECRET)) == []
    assert pull_all(guarded.address, "acl-admin", "Audit", ("replayAdmin", "adminSecret77")) == sorted(
        (q, o) for (t, q, o) in archived.messages if t == "Audit")


def test_a_push_consumer_with_the_right_secret_gets_every_message(archived: Archived, guarded: Replay) -> None:
    """Heartbeats (signed with their body), consumer lists and offset commits
    pass the ACL too: the push consumer's whole cycle."""
    import threading

    want = sorted((q, o) for (t, q, o) in archived.messages if t == "Orders")
    got: list[tuple[int, int]] = []
    done = threading.Event()

    def on_message(m) -> None:  # noqa: ANN001
        got.append((m.queue_id, m.queue_offset))
        if len(got) >= len(want):
            done.set()

    consumer = rocketmq.PushConsumer("acl-push")
    consumer.set_namesrv_addr(guarded.address)
    consumer.set_session_credentials(ACCESS, SECRET, "LOCAL")
    consumer.subscribe("Orders", on_message)
    consumer.start()
    try:
        assert done.wait(60), f"received {len(got)} of {len(want)}"
    finally:
        consumer.shutdown()
    assert sorted(got) == want
    text = urllib.request.urlopen(guarded.metrics_url + "/metrics", timeout=10).read().decode()
    assert 'tiered_replay_requests_total{outcome="success",request="heartbeat"}' in text


def test_raw_frames_get_no_permission_and_nothing_else(guarded: Replay) -> None:
    raw = Raw(guarded.address)
    try:
        for ext in (_pull().ext, sign(_pull().ext, b"", ACCESS, "wrongSecret99"),
                    sign(_pull(topic="Audit").ext, b"", ACCESS, SECRET)):
            resp = raw.call(p.PULL_MESSAGE, ext)
            assert (resp.code, resp.body, set(resp.ext)) == (p.NO_PERMISSION, b"", set())
        resp = raw.call(p.PULL_MESSAGE, sign(_pull().ext, b"", ACCESS, SECRET))
        assert resp.code == p.SUCCESS and resp.body
        # a refused one-way request gets no answer; the connection goes on
        raw.send(_frame(Command(code=p.UNREGISTER_CLIENT, flag=2, opaque=999, ext={"clientID": "x"})))
        assert raw.call(p.GET_MAX_OFFSET, sign({"topic": "Orders", "queueId": "0"}, b"", ACCESS, SECRET)).code == 0
        # binary (ROCKETMQ) headers are checked the same way
        signed = sign({"topic": "Orders", "queueId": "0"}, b"", ACCESS, SECRET)
        assert raw.call(p.GET_MAX_OFFSET, signed, serialize=1).code == p.SUCCESS
        assert raw.call(p.GET_MAX_OFFSET, {**signed, "queueId": "1"}, serialize=1).code == p.NO_PERMISSION
    finally:
        raw.close()


def _frame(cmd: Command) -> bytes:
    from tiered.replay.frame import encode

    return encode(cmd)


def test_no_secret_reaches_logs_or_metrics(guarded: Replay) -> None:
    raw = Raw(guarded.address)
    try:
        wrong = sign(_pull().ext, b"", ACCESS, "wrongSecret99")
        assert raw.call(p.PULL_MESSAGE, wrong).code == p.NO_PERMISSION
    finally:
        raw.close()
    with urllib.request.urlopen(guarded.metrics_url + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    assert 'tiered_replay_requests_total{outcome="no_permission",request="pull"}' in metrics
    seen = "\n".join(guarded.lines) + metrics
    assert "refused" in seen  # the debug log saw the refusals...
    for secret in (SECRET, "wrongSecret99", "adminSecret77", wrong["Signature"]):
        assert secret not in seen  # ...and no secret nor signature


def test_with_acl_no_exposure_warning(archived: Archived, acl_file: Path) -> None:
    from tiered.cli.replay import exposure_warning

    assert exposure_warning("10.1.2.3", acl=True) is None
    assert exposure_warning("10.1.2.3") is not None and exposure_warning("127.0.0.1") is None
    with Replay(archived.cold_url, "--acl", str(acl_file)) as r:
        lines = list(r.lines)
    assert not [x for x in lines if "WARNING" in x]


def test_ipv6_clients_are_matched_by_ipv6_ranges(archived: Archived, tmp_path: Path) -> None:
    """A client connected over IPv6 (::1): outside the global range it must
    sign; inside its account's range its access key alone lets it in."""
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML.replace("  - 10.9.*.*", "  - 0:0:0:0:0:0:0:2-5").replace(
        "whiteRemoteAddress:\n", "whiteRemoteAddress: '::0:1-2'\n", 1))
    with Replay(archived.cold_url, "--acl", str(path), listen="[::1]:0") as r:
        raw = Raw(r.address)
        try:
            ext = {"topic": "Orders", "queueId": "0"}
            assert raw.call(p.GET_MAX_OFFSET, ext).code == p.NO_PERMISSION
            assert raw.call(p.GET_MAX_OFFSET, {**ext, "AccessKey": ACCESS}).code == p.SUCCESS
        finally:
            raw.close()


def test_the_acl_comes_from_the_environment_too(archived: Archived, acl_file: Path) -> None:
    with Replay(archived.cold_url, env={"TIERED_REPLAY__ACL": str(acl_file)}) as r:
        raw = Raw(r.address)
        try:
            assert raw.call(p.GET_MAX_OFFSET, {"topic": "Orders", "queueId": "0"}).code == p.NO_PERMISSION
        finally:
            raw.close()


def test_an_unreadable_acl_stops_start_up(archived: Archived, tmp_path: Path) -> None:
    import subprocess
    import sys

    from replaykit import REPO

    bad = tmp_path / "plain_acl.yml"
    bad.write_text(ACL_YAML.replace("- Orders=SUB", "- Orders"))
    out = subprocess.run([sys.executable, "-m", "tiered.cli", "replay", "--cold", archived.cold_url, "--acl", str(bad)],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 2 and "topicPerms entry 'Orders'" in out.stderr and SECRET not in out.stderr
