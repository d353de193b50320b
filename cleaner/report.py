"""What one clean pass decided and did, for the CLI, logs and tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from tiered.cleaner.plan import CleanPlan, MergeRun, QueueKey, QueuePlan
from tiered.archive.manifest import Manifest, Segment


@dataclass
class QueueOutcome:
    """A queue whose manifest change was committed."""

    plan: QueuePlan
    manifest: Manifest
    merged: list[tuple[MergeRun, Segment]] = field(default_factory=list)

    @property
    def key(self) -> QueueKey:
        return self.plan.key


@dataclass
class CleanReport:
    now_ms: int
    dry_run: bool = False
    plan: CleanPlan | None = None
    committed: list[QueueOutcome] = field(default_factory=list)
    deleted_objects: int = 0  # keys of expired segments and due pending deletes, sent for deletion
    delete_requests: int = 0
    orphan_scan: bool = False
    orphans: list[str] = field(default_factory=list)  # collected (or, dry run, collectable)
    unmanaged: dict[str, int] = field(default_factory=dict)  # "topic/qid" -> data objects without a manifest
    unaccounted: dict[str, list[str]] = field(default_factory=dict)  # "topic/qid" -> kept: not this history's
    retention_unknown: dict[str, str] = field(default_factory=dict)  # topic -> why its data is kept
    leftovers: list[str] = field(default_factory=list)  # temporary files of interrupted writes, removed
    busy: list[QueueKey] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    fenced: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors and self.fenced is None

    # --- what happened (executed) or would happen (dry run) --------------------

    def expired(self) -> list[QueuePlan]:
        """Queues whose expired prefix was (dry run: would be) removed."""
        plans = [o.plan for o in self.committed] if not self.dry_run else list(self.plan.queues if self.plan else ())
        return [p for p in plans if p.expire or p.drop_gaps]

    def merges(self) -> list[tuple[QueuePlan, MergeRun]]:
        if self.dry_run:
            return [(p, r) for p in (self.plan.queues if self.plan else ()) for r in p.merges]
        return [(o.plan, run) for o in self.committed for run, _seg in o.merged]

    @property
    def expired_segments(self) -> int:
        return sum(len(p.expire) for p in self.expired())

    @property
    def expired_bytes(self) -> int:
        return sum(p.expired_bytes for p in self.expired())

    @property
    def merged_segments(self) -> int:
        return sum(len(r.segments) for _p, r in self.merges())
