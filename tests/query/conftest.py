"""Reader test fixtures: one small archive per test, on file:// and on the S3
server (defined in tests/support/readerkit.py, shared with tests/cli)."""

from readerkit import archived, archived_v1  # noqa: F401 - fixtures
