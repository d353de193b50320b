"""Single-writer fencing: a second sidecar on the same cluster/broker prefix
refuses to write, with a clear error, and corrupts nothing; a restart with
the same identity takes over at once; another identity waits for expiry or
forces; a writer that lost its lease writes nothing more."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dispatchkit import BROKER, CLUSTER, CountingRecorder, assert_exact, new_dispatcher, new_writer, produce
from tiered.cli import app
from tiered.archive.coldtier import ColdTier
from tiered.errors import FencedError
from tiered.archive.lease import LeaseManager
from tiered.store.localstore import LocalStore
from tiered.ops.verify import verify

QUEUES = [("Fence", 0), ("Fence", 1)]
WRITES = ("put", "put_if_absent", "put_if_match", "delete")


def _writes(recorder: CountingRecorder) -> int:
    return sum(recorder.total_requests(op) for op in WRITES)


def _setup(tmp_path, open_cold, cold_url, clock, n=20):  # noqa: ANN001, ANN202
    w = new_writer(tmp_path / "store")
    for topic, qid in QUEUES:
        produce(w, topic, qid, n, clock=clock)
    return w, LocalStore(tmp_path / "store")


def _disp(open_cold, cold_url, local, tmp_path, clock, identity, **kw):  # noqa: ANN001, ANN202
    rec = CountingRecorder()
    store = open_cold(cold_url, recorder=rec)
    d = new_dispatcher(store, local, tmp_path / f"state-{identity}", clock, identity=identity, recorder=rec,
                       upload_bytes=1, max_delay_ms=0, segment_bytes=1500, **kw)
    return d, rec, store


def test_a_second_sidecar_refuses_and_writes_nothing(cold_url, open_cold, tmp_path, clock):
    w, local = _setup(tmp_path, open_cold, cold_url, clock)
    a, rec_a, store = _disp(open_cold, cold_url, local, tmp_path, clock, "sidecar-a")
    assert a.run_round().ok
    b, rec_b, _ = _disp(open_cold, cold_url, local, tmp_path, clock, "sidecar-b")
    produce(w, "Fence", 0, 10, clock=clock)
    result = b.run_round()
    assert result.fenced is not None
    assert "'sidecar-a'" in result.fenced and "refusing to write" in result.fenced
    assert result.segments == 0
    assert _writes(rec_b) == 0, rec_b.requests
    with pytest.raises(FencedError):
        b.start()
    assert rec_b.rounds == [("dispatch", False)]
    # the holder goes on; the archive is exact
    assert a.run_round().ok
    w.close()
    assert_exact(store, local, QUEUES)
    assert verify(ColdTier(store, CLUSTER, BROKER), local).ok


def test_same_identity_takes_over_at_once_after_a_crash(cold_url, open_cold, tmp_path, clock):
    w, local = _setup(tmp_path, open_cold, cold_url, clock)
    a1, _, store = _disp(open_cold, cold_url, local, tmp_path, clock, "sidecar-a")
    assert a1.run_round().ok
    del a1  # crashed: the lease is not released and has not expired
    produce(w, "Fence", 1, 10, clock=clock)
    a2, rec2, _ = _disp(open_cold, cold_url, local, tmp_path, clock, "sidecar-a")
    result = a2.run_round()
    assert result.ok and result.fenced is None
    assert result.messages == 10
    w.close()
    assert_exact(store, local, QUEUES)


def test_another_identity_waits_for_expiry_and_the_old_writer_is_fenced(cold_url, open_cold, tmp_path, clock):
    w, local = _setup(tmp_path, open_cold, cold_url, clock)
    a, rec_a, store = _disp(open_cold, cold_url, local, tmp_path, clock, "sidecar-a", ttl_s=60)
    assert a.run_round().ok
    b, rec_b, _ = _disp(open_cold, cold_url, local, tmp_path, clock, "sidecar-b", ttl_s=60)
    assert b.run_round().fenced
    clock.advance(61)  # a stopped renewing (paused, partitioned): its lease expires
    produce(w, "Fence", 0, 10, clock=clock)
    result = b.run_round()
    assert result.ok and result.messages == 10
    assert b.lease.lease.epoch == 2
    # a wakes up: it must notice before its next commit and write nothing
    produce(w, "Fence", 1, 10, clock=clock)
    before = _writes(rec_a)
    result = a.run_round()
    assert result.fenced is not None and "sidecar-b" in result.fenced
    assert _writes(rec_a) == before
    # and stays fenced on later rounds while b holds the lease
    assert a.run_round().fenced is not None
    assert _writes(rec_a) == before
    assert b.run_round().ok
    w.close()
    assert_exact(store, local, QUEUES)
    assert verify(ColdTier(store, CLUSTER, BROKER), local).ok


def test_forced_takeover_fences_the_old_writer_at_its_next_commit(cold_url, open_cold, tmp_path, clock):
    w, local = _setup(tmp_path, open_cold, cold_url, clock)
    a, rec_a, store = _disp(open_cold, cold_url, local, tmp_path, clock, "sidecar-a")
    assert a.run_round().ok
    b, _, _ = _disp(open_cold, cold_url, local, tmp_path, clock, "sidecar-b", force=True)
    produce(w, "Fence", 0, 10, clock=clock)
    assert b.run_round().ok  # took over although a's lease is still valid
    produce(w, "Fence", 0, 10, clock=clock)
    before = _writes(rec_a)
    result = a.run_round()
    assert result.fenced is not None
    assert _writes(rec_a) == before, "the fenced writer wrote after losing its lease"
    assert b.run_round().ok
    w.close()
    assert_exact(store, local, QUEUES)


def test_two_processes_with_one_identity_do_not_steal_the_lease_back(tmp_path, clock):
    """A replaced process (same identity, other session) stays fenced while
    the new one's lease is live: no ping-pong."""
    from tiered.archive.storage import FileStore

    store = FileStore(str(tmp_path / "cold"))
    old = LeaseManager(store, f"{CLUSTER}/{BROKER}", "same", clock=clock, ttl_s=60)
    new = LeaseManager(store, f"{CLUSTER}/{BROKER}", "same", clock=clock, ttl_s=60)
    old.acquire()
    new.acquire()  # restart: takes over at once
    with pytest.raises(FencedError):
        old.check()
    with pytest.raises(FencedError):
        old.ensure()  # does not take it back from the live session
    new.check()
    clock.advance(61)
    old.ensure()  # the other session stopped renewing: fair game again
    with pytest.raises(FencedError):
        new.check()


def test_lease_write_whose_response_was_lost_is_recognised(tmp_path, clock):
    """A conditional lease write that landed but whose reply was lost makes the
    retry fail its precondition: that is our own write, not a takeover."""
    from tiered.archive.storage import FileStore, RetryPolicy

    store = FileStore(str(tmp_path / "cold"), retry=RetryPolicy(attempts=3, base_delay=0, max_delay=0))
    raw = store._raw_put_if
    state = {"lose": True}

    def lossy(key, data, etag):  # noqa: ANN001, ANN202
        out = raw(key, data, etag)
        if state["lose"]:
            state["lose"] = False
            raise ConnectionResetError(104, "reply lost")
        return out

    store._raw_put_if = lossy  # type: ignore[method-assign]
    lm = LeaseManager(store, f"{CLUSTER}/{BROKER}", "me", clock=clock, ttl_s=60)
    assert lm.acquire().epoch == 1
    clock.advance(40)  # past half the TTL: the next ensure renews
    state["lose"] = True
    lm.ensure()
    lm.check()


def test_cli_refuses_while_another_sidecar_holds_the_prefix(tmp_path, clock):
    cold_url = f"file://{tmp_path / 'cold'}"
    with new_writer(tmp_path / "store") as w:
        produce(w, "Fence", 0, 5)
    from tiered.archive.storage import FileStore

    holder = LeaseManager(FileStore(str(tmp_path / "cold")), f"{CLUSTER}/{BROKER}", "the-other-sidecar")
    holder.acquire()
    env = {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": CLUSTER, "TIERED_BROKER": BROKER,
           "TIERED_INSTANCE_ID": "me", "TIERED_LOG__LEVEL": "WARNING"}
    res = CliRunner().invoke(app, ["dispatch", "--store", str(tmp_path / "store"), "--cold", cold_url, "--once",
                                   "--all"], env=env)
    assert res.exit_code == 1
    assert "held by 'the-other-sidecar'" in res.output and "refusing to write" in res.output
    assert not list((tmp_path / "cold").rglob("manifest.json"))


def test_the_lease_is_read_once_per_round_then_every_lease_check_s(cold_url, open_cold, tmp_path, clock):
    w, local = _setup(tmp_path, open_cold, cold_url, clock, n=40)
    a, rec_a, store = _disp(open_cold, cold_url, local, tmp_path, clock, "sidecar-a", parallelism=1)
    assert a.run_round().ok
    for topic, qid in QUEUES:
        produce(w, topic, qid, 40, clock=clock)
    gets = rec_a.total_requests("get")
    result = a.run_round()
    assert result.ok and result.segments >= 10
    assert rec_a.total_requests("get") - gets == 2, "one identity and one lease read for the whole round"

    # A takeover in the middle of a long round is noticed once lease_check_s has passed.
    b, _, _ = _disp(open_cold, cold_url, local, tmp_path, clock, "sidecar-b", force=True)
    for topic, qid in QUEUES:
        produce(w, topic, qid, 40, clock=clock)
    commits = []

    class TakeOverMidRound(CountingRecorder):
        def store_request(self, op: str, outcome: str, seconds: float) -> None:
            super().store_request(op, outcome, seconds)
            if op == "put_if_match":
                commits.append(op)
                if len(commits) == 3:
                    b.start()  # forced takeover
                    clock.advance(6)  # past lease_check_s (5 s)

    a.cold.store.recorder = TakeOverMidRound()
    result = a.run_round()
    assert result.fenced is not None
    assert len(commits) == 3, "a commit after the takeover was noticed"
    assert b.run_round().ok
    w.close()
    assert_exact(store, local, QUEUES)


def test_a_thread_waiting_for_the_lease_check_when_another_loses_it_writes_nothing(cold_url, open_cold, tmp_path,
                                                                                   clock):
    """An upload thread that waited for the lease check while another thread
    learnt the lease was lost must not check again: with the old lease
    expired, a check would take a new one in the middle of the round."""
    import threading

    w, local = _setup(tmp_path, open_cold, cold_url, clock)
    a, rec_a, _ = _disp(open_cold, cold_url, local, tmp_path, clock, "sidecar-a", ttl_s=60)
    assert a.run_round().ok
    clock.advance(61)  # a's lease expired: a check now would take a fresh one
    inner = threading.Lock()
    waiting = threading.Event()

    class SignallingLock:
        def __enter__(self) -> None:
            waiting.set()
            inner.acquire()

        def __exit__(self, *exc: object) -> None:
            inner.release()

    a._check_lock = SignallingLock()  # type: ignore[assignment]
    before = _writes(rec_a)
    raised: list[BaseException] = []

    def upload() -> None:
        try:
            a._before_write()
        except BaseException as exc:  # noqa: BLE001
            raised.append(exc)

    inner.acquire()  # the thread that is checking (and will lose the lease)
    waiter = threading.Thread(target=upload)
    waiter.start()
    assert waiting.wait(30)  # past the unlocked test, waiting for the lock
    a._fenced = "lease of 'sidecar-a' lost"
    inner.release()
    waiter.join(30)
    assert len(raised) == 1 and isinstance(raised[0], FencedError)
    assert _writes(rec_a) == before, "the waiting thread took a new lease mid-round"
    assert a.lease.lease.epoch == 1
    w.close()
