"""One error family: every exception class the project defines lives in
tiered/errors.py under TieredError, and decisions read its attributes,
never its class name."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

from tiered.metrics.recorder import STUCK_REASONS
import tiered
from tiered import errors
from tiered.errors import TieredError, stuck_reason

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("tiered", "dispatcher", "cleaner", "metrics")  # the last three are tiered.*
_BUILTIN_EXCEPTIONS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}


def _sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def _modules() -> list[str]:
    return ["tiered", *(m.name for m in pkgutil.walk_packages(tiered.__path__, "tiered."))]


def test_every_exception_class_in_the_project_is_a_tiered_error_from_errors_py() -> None:
    found = {}
    for name in _modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__.split(".")[0] == "tiered":
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    assert "tiered.errors.ManifestChunkError" in found and len(found) >= 28  # the walk saw the family
    assert [n for n, c in found.items() if not issubclass(c, TieredError) and c is not TieredError] == []
    assert [n for n in found if not n.startswith("tiered.errors.")] == []


def _exception_bases(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, class) of every class statement whose base is a builtin
    exception or one of tiered.errors' classes: nested ones included,
    which importing the module would not show."""
    ours = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, BaseException)}
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
            if bases & (_BUILTIN_EXCEPTIONS | ours):
                hits.append((node.lineno, node.name))
    return hits


def test_no_exception_class_is_defined_outside_errors_py() -> None:
    outside = {str(p.relative_to(ROOT)): _exception_bases(ast.parse(p.read_text()))
               for p in _sources() if p != ROOT / "tiered" / "errors.py"}
    assert {k: v for k, v in outside.items() if v} == {}
    assert len(_exception_bases(ast.parse((ROOT / "tiered" / "errors.py").read_text()))) >= 28


# Where a class name is taken for text that is not an f-string, a log call's
# argument or a raised error's message: (file, enclosing function) -> why.
TEXT_ONLY = {
    ("tiered/archive/s3store.py", "_transport_error"): "the StorageError's reason text",
    ("tiered/archive/objectstore.py", "_translate"): "the StorageError's reason text",
    ("tiered/configsources.py", "yaml_problem"): "the ConfigError's message text",
    ("tiered/cli/query.py", "spark_error_summary"): "the message shown to the user",
}


def _class_names_taken(tree: ast.AST) -> list[tuple[str, int, bool]]:
    """(enclosing function, line, used only as text) of every
    ``type(x).__name__``, ``x.__class__.__name__`` or ``__qualname__``."""
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    hits = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr in ("__name__", "__qualname__")):
            continue
        inner = node.value
        is_type = isinstance(inner, ast.Call) and getattr(inner.func, "id", None) == "type"
        if not (is_type or (isinstance(inner, ast.Attribute) and inner.attr == "__class__")):
            continue
        text, function, up = False, "<module>", parents.get(node)
        while up is not None:
            if isinstance(up, ast.JoinedStr) or isinstance(up, ast.Raise):
                text = True
            if isinstance(up, ast.Call) and getattr(up.func, "attr", "") in (
                    "debug", "info", "warning", "error", "exception", "critical"):
                text = True
            if isinstance(up, ast.FunctionDef | ast.AsyncFunctionDef) and function == "<module>":
                function = up.name
            up = parents.get(up)
        hits.append((function, node.lineno, text))
    return hits


def test_no_decision_reads_a_class_name() -> None:
    decisions, allowed_seen = [], set()
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        for function, line, text in _class_names_taken(ast.parse(path.read_text())):
            if (rel, function) in TEXT_ONLY:
                allowed_seen.add((rel, function))
            elif not text:
                decisions.append(f"{rel}:{line} in {function}")
    assert decisions == []
    assert allowed_seen == set(TEXT_ONLY)  # an allowance whose use is gone goes too


def test_the_class_name_check_sees_a_decision() -> None:
    source = ("def f(exc):\n    if type(exc).__name__ == 'X':\n        return 1\n"
              "    log.error('%s', type(exc).__name__)\n    raise E(f'{type(exc).__name__}')\n")
    assert _class_names_taken(ast.parse(source)) == [("f", 2, False), ("f", 4, True), ("f", 5, True)]


def test_no_class_name_is_compared_as_a_string() -> None:
    """No string literal naming one of our errors (a table keyed by names),
    outside the ``__all__`` lists that export them."""
    ours = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, BaseException)}
    found = []
    for path in _sources():
        tree = ast.parse(path.read_text())
        exported = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", "") == "__all__" for t in node.targets) for c in ast.walk(node)}
        found += [f"{path.relative_to(ROOT)}:{n.lineno} {n.value}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and n.value in ours and id(n) not in exported]
    assert found == []


def _sample(cls: type[TieredError]) -> TieredError:
    """An instance of ``cls`` built from its signature (every argument a
    string or a small value of its annotated type)."""
    try:
        signature = inspect.signature(cls)
    except ValueError:  # Exception's own constructor: a message
        return cls("x")
    params = [p for p in signature.parameters.values() if p.default is inspect.Parameter.empty]
    values = {"int": 1, "list[str]": ["x"], "tuple[str, ...]": ("x",), "bool": False,
              "int | None": None, "list[tuple[Any, str]]": [(None, "x")]}
    args = {p.name: values.get(str(p.annotation), "x") for p in params}
    kw = {n: v for n, v in args.items() if signature.parameters[n].kind == inspect.Parameter.KEYWORD_ONLY}
    return cls(*[v for n, v in args.items() if n not in kw], **kw)


FAMILY = sorted((v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, TieredError)),
                key=lambda c: c.__name__)

# what the round reads: the queue's stuck reason, None when the queue is not
# stuck on its own (the object store failed, a race was lost)
STUCK = {
    "CorruptRecordError": "corrupt_local_data",
    "ManifestChunkError": "manifest",
    "StoreBehindError": "store_behind",
    "FormatVersionError": "manifest",
    "UnaccountedObjectsError": "unaccounted_objects",
    "ConflictError": None,
    **{c.__name__: None for c in FAMILY if issubclass(c, errors.StorageError)},
}


@pytest.mark.parametrize("cls", FAMILY, ids=lambda c: c.__name__)
def test_each_error_carries_its_stuck_reason(cls: type[TieredError]) -> None:
    exc = _sample(cls)
    assert stuck_reason(exc) == STUCK.get(cls.__name__, "error")
    assert stuck_reason(exc) in (*STUCK_REASONS, None)  # a label value the metric and its alert know
    assert exc.transport is issubclass(cls, errors.StorageError)


def test_errors_not_ours_stop_the_queue_as_error() -> None:
    assert stuck_reason(KeyError("x")) == "error"
    assert stuck_reason(OSError(5, "I/O error")) == "error"


def test_mix_ins_callers_catch_stay() -> None:
    for cls in (errors.BodyDecompressError, errors.BadProperties, errors.OptionError, errors.NoArchiveError):
        assert issubclass(cls, ValueError) and issubclass(cls, TieredError)
    assert str(errors.BodyDecompressError(codec="zstd", reason="truncated stream")) == (
        "body does not decompress as zstd: truncated stream")
