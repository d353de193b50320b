"""SQL over the archive with the pruning Spark does not give a Python source.

::

    df = sql(spark, "s3://bucket/archive", "SELECT topic, count(*) FROM messages GROUP BY topic",
             endpoint="http://minio:9000")

Spark 4.1-4.3 hand a Python data source neither the columns a query uses nor
a plan of its own per scan (``tiered.query.spark_source``): ``load(url)``
decodes every column, and the source must not plan from pushed filters. A
caller that holds the query text can do better, which is what ``sql`` (and
``tiered sql``) does, per query:

1. Analyse and optimise the query against the full ``messages`` view (no
   execution) and walk the optimised plan, subqueries included, to every
   scan of that view's relation.
2. ``columns``: the union over those scans of the columns the plan reads
   from them (Spark's ColumnPruning leaves them in the Project above each
   scan), plus those the query text names (it must still resolve against
   the pruned view). No column at all (``count(*)``): the count comes from
   the manifests.
3. ``startTime``/``endTime``, ``topics``, ``queues``, and a ``key`` or
   ``msgId`` lookup (``unique_key = ``, ``array_contains(keys, ...)``,
   ``store_host = ... AND commitlog_offset = ...``): only when EVERY scan
   is filtered at least that narrowly (the filter directly above the scan,
   which Spark applies to the rows anyway); the widest range and the union
   of topics / queues over the scans is pushed. One unfiltered scan: nothing
   is pushed. Options only prune; results are the unpruned query's.
4. Re-register the view with those and run the query on it.

A query that both expands ``*`` and orders or groups by position
(``ORDER BY 3``) keeps every column: ordinals count the expanded columns,
which pruning would shift. Commands (``SHOW``, ``CREATE VIEW``...) run
unchanged: Spark executes them as soon as they are parsed.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from tiered.format.codec import Host, offset_msg_id
from tiered.query.spark_schema import spark_schema
from tiered.query.spark_source import NAME, register
from tiered.timeparse import parse_time_ms

log = logging.getLogger(__name__)

VIEW = "messages"
# Plan nodes whose output attributes are their children's (same ids) or made
# by their own expressions: what a node above needs from its children is in
# its references. Any other node (Union, CTE definitions, anything unknown)
# is taken to need every column of its children, by position.
_PRECISE = frozenset({
    "Project", "Filter", "Aggregate", "Join", "Sort", "GlobalLimit", "LocalLimit", "Offset", "Tail", "Window",
    "WindowGroupLimit", "Generate", "Expand", "Repartition", "RepartitionByExpression", "RebalancePartitions",
    "Sample", "Deduplicate", "ReturnAnswer", "Subquery", "OneRowRelation", "LocalRelation", "Range",
})
_SCANS = ("DataSourceV2ScanRelation", "DataSourceV2Relation")
# comparison of a column with a literal, as (column side) OP (literal side)
_FLIP = {"GreaterThan": "LessThan", "GreaterThanOrEqual": "LessThanOrEqual", "LessThan": "GreaterThan",
         "LessThanOrEqual": "GreaterThanOrEqual", "EqualTo": "EqualTo", "EqualNullSafe": "EqualNullSafe"}
# one view registration and the analysis against it at a time (threads sharing
# a session would otherwise analyse against each other's view)
_LOCK = threading.Lock()


@dataclass(frozen=True, kw_only=True)
class Narrowing:
    """What one filter restricts rows of one scan to (None: not restricted);
    times in store-time ms, ``end_ms`` exclusive."""

    topics: frozenset[str] | None = None
    queues: frozenset[int] | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    keys: frozenset[str] | None = None  # each row's KEYS or UNIQ_KEY holds one of them
    hosts: frozenset[str] | None = None  # store_host
    offsets: frozenset[int] | None = None  # commitlog_offset

    def and_(self, o: Narrowing) -> Narrowing:
        # rows matching both: either side's key set still holds (the smaller kept)
        keys = self.keys if o.keys is None or (self.keys is not None and len(self.keys) <= len(o.keys)) else o.keys
        return Narrowing(topics=_meet(self.topics, o.topics), queues=_meet(self.queues, o.queues),
                         start_ms=_pick(max, self.start_ms, o.start_ms), end_ms=_pick(min, self.end_ms, o.end_ms),
                         keys=keys, hosts=_meet(self.hosts, o.hosts), offsets=_meet(self.offsets, o.offsets))

    def or_(self, o: Narrowing) -> Narrowing:
        # rows of either side: restricted only where both sides are
        return Narrowing(topics=_join(self.topics, o.topics), queues=_join(self.queues, o.queues),
                         start_ms=_both(min, self.start_ms, o.start_ms), end_ms=_both(max, self.end_ms, o.end_ms),
                         keys=_join(self.keys, o.keys), hosts=_join(self.hosts, o.hosts),
                         offsets=_join(self.offsets, o.offsets))


def _meet(a: frozenset[Any] | None, b: frozenset[Any] | None) -> frozenset[Any] | None:
    return b if a is None else a if b is None else a & b


def _join(a: frozenset[Any] | None, b: frozenset[Any] | None) -> frozenset[Any] | None:
    return None if a is None or b is None else a | b


def _pick(fn: Any, a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else fn(a, b)


def _both(fn: Any, a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else fn(a, b)


@dataclass(frozen=True, kw_only=True)
class Derived:
    """What ``sql`` derived from one query's plan: the view's columns (None:
    every column) and pruning options, with the reasons for what it left."""

    scans: int
    columns: tuple[str, ...] | None
    options: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        cols = "every column" if self.columns is None else (",".join(self.columns) or "none (from the manifests)")
        opts = " ".join(f"{k}={v}" for k, v in self.options) or "none"
        text = f"{self.scans} scan{'s' if self.scans != 1 else ''} of the view; columns: {cols}; pruning: {opts}"
        return text + "".join(f"; {n}" for n in self.notes)


# --- the py4j walk -------------------------------------------------------------------


def _seq(s: Any) -> list[Any]:
    return [s.apply(i) for i in range(s.size())]


def _kind(j: Any) -> str:
    return str(j.getClass().getSimpleName())


def _ids(attrs: Any) -> dict[int, str]:
    """{expression id: name} of an attribute Seq or AttributeSet."""
    seq = attrs.toSeq() if _kind(attrs) == "AttributeSet" else attrs
    return {int(a.exprId().id()): str(a.name()) for a in _seq(seq)}


@dataclass(frozen=True, kw_only=True)
class _Scan:
    output: dict[int, str]  # its attributes: id -> column
    conditions: tuple[Any, ...]  # the Filter conditions directly above it


class _PlanWalk:
    """Every scan of ``table`` in an optimised plan (subqueries included) and
    every attribute id some node needs."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self.scans: list[_Scan] = []
        self.required: set[int] = set()

    def walk(self, node: Any, *, root: bool = False, conditions: tuple[Any, ...] = ()) -> None:
        kind = _kind(node)
        if root:  # a query's (or a subquery's) result columns are all used
            self.required |= set(_ids(node.output()))
        if kind in _SCANS:
            relation = node.relation() if kind == "DataSourceV2ScanRelation" else node
            if relation.table().equals(self.table):
                self.scans.append(_Scan(output=_ids(node.output()), conditions=conditions))
            return
        self.required |= set(_ids(node.references()))
        for sub in _seq(node.subqueries()):
            self.walk(sub, root=True)
        children = _seq(node.children())
        if kind not in _PRECISE:
            for child in children:
                self.required |= set(_ids(child.output()))
        above = conditions + (node.condition(),) if kind == "Filter" else ()
        for child in children:
            self.walk(child, conditions=above)


def _literal(e: Any) -> tuple[bool, Any]:
    if _kind(e) != "Literal" or e.value() is None:
        return False, None
    t, v = str(e.dataType().typeName()), e.value()
    if t == "string":
        return True, str(v.toString())
    if t in ("integer", "long", "timestamp", "short", "byte"):
        return True, int(v)
    return False, None


def narrowing(e: Any, output: dict[int, str]) -> Narrowing:
    """What condition ``e`` restricts a scan with attributes ``output`` to."""
    kind = _kind(e)
    kids = _seq(e.children())
    if kind == "And":
        return narrowing(kids[0], output).and_(narrowing(kids[1], output))
    if kind == "Or":
        return narrowing(kids[0], output).or_(narrowing(kids[1], output))
    column = lambda a: output.get(int(a.exprId().id())) if _kind(a) == "AttributeReference" else None  # noqa: E731
    if kind in ("In", "InSet") and column(kids[0]) in ("topic", "queue_id"):
        if kind == "In":
            lits = [_literal(k) for k in kids[1:]]
            if not all(ok for ok, _ in lits):
                return Narrowing()
            values = frozenset(v for _, v in lits)
        else:
            it = e.hset().iterator()
            raw = []
            while it.hasNext():
                raw.append(it.next())
            if any(v is None for v in raw):
                return Narrowing()
            values = frozenset(str(v.toString()) if column(kids[0]) == "topic" else int(v) for v in raw)
        return _narrow(column(kids[0]), "EqualTo", values)
    if kind == "ArrayContains" and column(kids[0]) == "keys":
        ok, value = _literal(kids[1])
        return Narrowing(keys=frozenset([value])) if ok and isinstance(value, str) else Narrowing()
    if kind in _FLIP and len(kids) == 2:
        for col, lit, op in ((kids[0], kids[1], kind), (kids[1], kids[0], _FLIP[kind])):
            name = column(col)
            ok, value = _literal(lit)
            if name is not None and ok:
                return _narrow(name, op, frozenset([value]))
    return Narrowing()


def _narrow(name: str | None, op: str, values: frozenset[Any]) -> Narrowing:
    if op in ("EqualTo", "EqualNullSafe"):
        if name == "topic":
            return Narrowing(topics=values)
        if name == "queue_id":
            return Narrowing(queues=values)
        if name == "unique_key":
            return Narrowing(keys=values)
        if name == "store_host":
            return Narrowing(hosts=values)
        if name == "commitlog_offset":
            return Narrowing(offsets=values)
    if name != "store_timestamp" or len(values) != 1:
        return Narrowing()
    us = next(iter(values))
    # store times are whole ms: [floor, floor + 1) holds every row the
    # comparison keeps, whether strict or not (Spark still applies it exactly)
    lo, hi = us // 1000, us // 1000 + 1
    if op in ("GreaterThan", "GreaterThanOrEqual"):
        return Narrowing(start_ms=lo)
    if op in ("LessThan", "LessThanOrEqual"):
        return Narrowing(end_ms=hi)
    return Narrowing(start_ms=lo, end_ms=hi)  # EqualTo, EqualNullSafe


def _positional_star(parsed: Any) -> bool:
    """Whether the parsed query expands ``*`` and also refers to columns by
    position (``ORDER BY 3``, ``GROUP BY 2``)."""
    seen: set[str] = set()

    def expr(e: Any) -> None:
        seen.add(_kind(e))
        for c in _seq(e.children()):
            expr(c)

    def plan(p: Any) -> None:
        for e in _seq(p.expressions()):
            expr(e)
        # subquery plans sit in expressions, CTE definitions in inner children
        for c in _seq(p.children()) + _seq(p.innerChildren()) + _seq(p.subqueries()):
            if c.getClass().getName().startswith("org.apache.spark.sql.catalyst.plans"):
                plan(c)

    plan(parsed)
    return "UnresolvedStar" in seen and "UnresolvedOrdinal" in seen


def _words(query: str) -> frozenset[str]:
    """Every word of the query text, lower case: a superset of the column
    names it resolves (``a.topic``, ``USING (queue_id)``, ``* EXCEPT (body)``)."""
    return frozenset(w.lower() for w in re.findall(r"\w+", query))


def _is_command(parsed: Any, jvm: Any) -> bool:
    command = jvm.java.lang.Class.forName("org.apache.spark.sql.catalyst.plans.logical.Command")
    return bool(command.isInstance(parsed))


# --- deriving and running ----------------------------------------------------------


def derive_from(walk: _PlanWalk, view_columns: tuple[str, ...], *, prune_columns: bool,
                mentioned: frozenset[str] = frozenset()) -> Derived:
    """The view's columns (a subset of ``view_columns``, in their order: ``*``
    expands alike) and pruning options for the scans ``walk`` found. Columns
    the optimised plan reads, plus those the query text names (``mentioned``,
    lower case): the query must still resolve against the pruned view, and a
    name the optimiser dropped (``SELECT count(*) FROM (SELECT topic ...)``)
    is still resolved."""
    scans = walk.scans
    if not scans:
        return Derived(scans=0, columns=None, notes=("the query does not read the view",))
    used = {name for s in scans for i, name in s.output.items() if i in walk.required or name.lower() in mentioned}
    notes: list[str] = []
    columns: tuple[str, ...] | None = tuple(c for c in view_columns if c in used)
    if not prune_columns:
        columns = None
        notes.append("every column: the query expands * and refers to columns by position")
    elif columns == view_columns:
        columns = None
    narrow = []
    for s in scans:
        n = Narrowing()
        for cond in s.conditions:
            n = n.and_(narrowing(cond, s.output))
        narrow.append(n)
    options: list[tuple[str, str]] = []
    topics = _every(n.topics for n in narrow)
    queues = _every(n.queues for n in narrow)
    start = _every_bound(min, [n.start_ms for n in narrow])
    end = _every_bound(max, [n.end_ms for n in narrow])
    if topics:
        options.append(("topics", ",".join(sorted(topics))))
    if queues:
        options.append(("queues", ",".join(map(str, sorted(queues)))))
    if start is not None:
        options.append(("startTime", str(start)))
    if end is not None:
        options.append(("endTime", str(end)))
    options += _lookup(narrow)
    if len(scans) > 1 and not options and any(n != Narrowing() for n in narrow):
        notes.append("no pruning option: not every scan is filtered by topic, queue or store time")
    return Derived(scans=len(scans), columns=columns, options=tuple(options), notes=tuple(notes))


def _lookup(narrow: list[Narrowing]) -> list[tuple[str, str]]:
    """``key`` when every scan looks up the same one key (``unique_key =``,
    ``array_contains(keys, ...)``), else ``msgId`` when every scan looks up the
    same store host and CommitLog offset (the broker's offset message id)."""
    keys = _every(n.keys for n in narrow)
    if keys is not None and len(keys) == 1:
        return [("key", next(iter(keys)))]
    hosts, offsets = _every(n.hosts for n in narrow), _every(n.offsets for n in narrow)
    if hosts is None or offsets is None or len(hosts) != 1 or len(offsets) != 1:
        return []
    text, offset = next(iter(hosts)), next(iter(offsets))
    try:
        host = Host.parse(text)
    except ValueError:
        return []
    # a spelling other than the column's matches no row in Spark's filter anyway
    return [("msgId", offset_msg_id(host, offset))] if str(host) == text and offset >= 0 else []


def _every(sets: Any) -> frozenset[Any] | None:
    """The union of the scans' sets when every scan has one (an empty union:
    None, pushing nothing: the option cannot say "no topic")."""
    out: frozenset[Any] = frozenset()
    for s in sets:
        if s is None:
            return None
        out |= s
    return out or None


def _every_bound(fn: Any, bounds: list[int | None]) -> int | None:
    return None if any(b is None for b in bounds) else fn(bounds)


def merged(user: dict[str, str], derived: Derived) -> dict[str, str]:
    """The user's options narrowed by the derived ones (never widened: the
    user's selection is the view's contents)."""
    # derived columns replace the user's (a subset of them), declared as the schema
    opts = {k: v for k, v in user.items() if derived.columns is None or k.lower() != "columns"}
    lower = {k.lower(): k for k in opts}
    for name, value in derived.options:
        given = lower.get(name.lower())
        if name in ("key", "msgId"):  # one lookup per scan: the user's, when given
            if "key" not in lower and "msgid" not in lower:
                opts[name] = value
            continue
        if given is None:
            opts[name] = value
            continue
        if name in ("topics", "queues"):
            mine = {v.strip() for v in opts[given].split(",") if v.strip()}
            both = mine & set(value.split(","))
            if both:  # empty: the query reads nothing there; keep the user's
                opts[given] = ",".join(sorted(both))
        else:
            keep = max if name == "startTime" else min
            opts[given] = str(keep(parse_time_ms(opts[given]), int(value)))
    return opts


def prepare(spark: Any, url: str, query: str, *, view: str = VIEW, **options: str) -> tuple[Any, Derived | None]:
    """(DataFrame of ``query``, what was derived; None for a command, which ran
    as it is). The view ``view`` is left registered as the query used it."""
    jss = getattr(spark, "_jsparkSession", None)
    if jss is None:  # Spark Connect: no JVM to walk the plan in; the full view (the server has the source)
        spark.read.format(NAME).options(**options).load(url).createOrReplaceTempView(view)
        return spark.sql(query), Derived(scans=0, columns=None,
                                         notes=("Spark Connect: the plan is not reachable from the client",))
    register(spark)
    jvm = spark._jvm
    parsed = jss.sessionState().sqlParser().parsePlan(query)
    with _LOCK:
        full = _frame(spark, url, options, None)
        full.createOrReplaceTempView(view)
        df = spark.sql(query)  # analysed now (a command: run now, once)
        if _is_command(parsed, jvm):
            return df, None
        walk = _PlanWalk(full._jdf.queryExecution().analyzed().table())
        walk.walk(df._jdf.queryExecution().optimizedPlan(), root=True)
        derived = derive_from(walk, tuple(full.columns), prune_columns=not _positional_star(parsed),
                              mentioned=_words(query))
        if derived.columns is None and not derived.options:
            return df, derived
        _frame(spark, url, merged(options, derived), derived.columns).createOrReplaceTempView(view)
        return spark.sql(query), derived


# Loaded DataFrames by (session, URL, options, columns): a load costs Spark a
# Python worker call for the schema, and a loaded relation holds no plan (each
# scan plans from the catalog and manifests when it runs), so reuse is exact.
_FRAMES: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_FRAMES_MAX = 32


def _frame(spark: Any, url: str, options: dict[str, str], columns: tuple[str, ...] | None) -> Any:
    key = (id(spark), url, tuple(sorted(options.items())), columns)
    df = _FRAMES.get(key)
    if df is not None and df.sparkSession is spark:
        _FRAMES.move_to_end(key)
        return df
    reader = spark.read.format(NAME).options(**options)
    if columns is not None:  # the declared schema is what gets decoded
        reader = reader.schema(spark_schema(columns))
    df = _FRAMES[key] = reader.load(url)
    while len(_FRAMES) > _FRAMES_MAX:
        _FRAMES.popitem(last=False)
    return df


def sql(spark: Any, url: str, query: str, *, view: str = VIEW, **options: str) -> Any:
    """``spark.sql(query)`` over the archive at ``url`` as the view ``view``,
    with the columns and pruning options derived from the query's own plan
    (module docstring); logged at INFO."""
    df, derived = prepare(spark, url, query, view=view, **options)
    if derived is not None:
        log.info("tiered sql: %s", derived.describe())
    return df


__all__ = ["Derived", "Narrowing", "VIEW", "derive_from", "merged", "prepare", "sql"]
