"""``tiered.query.spark_sql.sql`` from a Spark Connect client: the plan is not
reachable there, so the query runs on the full view, exactly, and says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from readerkit import local_rows
from test_spark_connect import connect_session, connect_url  # noqa: F401 - the real server, as fixtures
from tiered.query.spark_sql import prepare

pytestmark = pytest.mark.spark


def test_sql_over_connect_runs_on_the_full_view(connect_session, build, tmp_path: Path) -> None:  # noqa: ANN001, F811
    spark = connect_session
    url = f"file://{tmp_path / 'cold'}"
    _, local, _ = build(url)
    rows = local_rows(local)
    df, derived = prepare(spark, url, "SELECT (SELECT count(*) FROM messages WHERE topic = 'Orders'), "
                                      "(SELECT sum(body_crc) FROM messages WHERE topic = '%DLQ%billing')")
    assert tuple(df.collect()[0]) == (240, sum(r["body_crc"] for r in rows if r["topic"] == "%DLQ%billing"))
    assert derived is not None and derived.columns is None and derived.options == ()
    assert "Spark Connect: the plan is not reachable from the client" in derived.describe()
