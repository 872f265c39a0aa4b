"""make bench measures on a database of its own, created afresh each run
(scripts/bench_common.fresh_database): whatever an earlier run or the test suite left behind is not in it."""

from __future__ import annotations

import os

import psycopg
import pytest

from scripts.bench_common import fresh_database


@pytest.fixture
def server_url() -> str:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.fail("this test needs PostgreSQL: set DATABASE_URL (scripts/services up)")
    return url.rsplit("/", 1)[0] + "/dispatch_benchdb_test"


def test_each_run_gets_an_empty_database_beside_the_configured_one(server_url: str) -> None:
    first = fresh_database(server_url)
    assert first == server_url + "_bench"
    with psycopg.connect(first, autocommit=True) as conn:
        conn.execute("CREATE TABLE left_behind (id int)")
        conn.execute("INSERT INTO left_behind VALUES (1)")
    # The next run: the same name, nothing of the last run in it, even while a connection to it is open.
    lingering = psycopg.connect(first, autocommit=True)
    try:
        again = fresh_database(server_url)
    finally:
        lingering.close()
    assert again == first
    with psycopg.connect(again, autocommit=True) as conn:
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'left_behind'").fetchone()
        assert tables == (0,)
    with psycopg.connect(server_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{first.rsplit("/", 1)[1]}"')
