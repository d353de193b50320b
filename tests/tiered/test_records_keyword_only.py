"""Records with many fields are built by name (issue 31, item 7): a frozen
dataclass of more than 8 fields is keyword-only, so a call site can never
put a value in the wrong field by position."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import pytest

import tiered

MAX_POSITIONAL = 8


def _modules() -> list[str]:
    return ["tiered", *(m.name for m in pkgutil.walk_packages(tiered.__path__, "tiered."))]


def _wide_positional_records() -> list[str]:
    found = []
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional extra (pyspark) not installed
            continue
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or not dataclasses.is_dataclass(cls):
                continue
            params = getattr(cls, "__dataclass_params__", None)
            if params is None or not params.frozen:
                continue
            init = [f for f in dataclasses.fields(cls) if f.init]
            if len(init) > MAX_POSITIONAL and any(not f.kw_only for f in init):
                found.append(f"{name}.{cls_name} ({len(init)} fields)")
    return found


def test_every_frozen_record_of_more_than_8_fields_is_keyword_only() -> None:
    assert _wide_positional_records() == []


def test_a_keyword_only_record_refuses_positions() -> None:
    from tiered.archive.manifest import CatalogEntry

    with pytest.raises(TypeError):
        CatalogEntry("T", 0, 0, 1, 1, 10, 1, 2, 1)  # type: ignore[misc]
