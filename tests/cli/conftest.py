"""CLI test fixtures: the reader tests' small archive, for ``cat``/``find``/``ls``
(defined in tests/support/readerkit.py, shared with tests/query)."""

from readerkit import archived  # noqa: F401 - a fixture
