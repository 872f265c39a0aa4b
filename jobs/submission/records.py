"""Write the rows of one submission in one statement.

On PostgreSQL the job, its audit row and its first execution are INSERTed by one statement (data-modifying
CTEs) instead of three. The statement and what listens for the rows' post_save (the outbox of
jobs.observability writes its Change row) share one transaction, as they would with the ORM's save(). Each
row's INSERT has the ORM's column list (built once per model) and its values prepared by each field as the
ORM prepares them (`pre_save` fills created_at and the like; JSON fields adapt their values).
Elsewhere (SQLite), the ORM saves the rows in one transaction.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import AutoField, BigAutoField, Field, Model
from django.db.models.signals import post_save


@cache
def _columns(model: type[Model]) -> tuple[str, tuple[Field[Any, Any], ...]]:
    """`INSERT INTO "table" ("a", "b") VALUES ` and its fields (the database numbers the id)."""
    fields = tuple(
        f for f in model._meta.local_concrete_fields if not isinstance(f, AutoField | BigAutoField)
    )
    quote = connection.ops.quote_name
    sql = f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) VALUES "
    return sql, fields


def _values(obj: Model, fields: tuple[Field[Any, Any], ...], db: BaseDatabaseWrapper) -> list[Any]:
    return [field.get_db_prep_save(field.pre_save(obj, True), db) for field in fields]


def _literal(value: Any) -> str | None:
    """How the statement itself writes the value when it is NULL or the empty string (see _row), else None."""
    if value is None:
        return "NULL"
    if type(value) is str and not value:
        return "''"
    return None


def _row(obj: Model, db: BaseDatabaseWrapper) -> tuple[str, list[Any]]:
    """The INSERT of one row and its parameters. NULL and the empty string are written in the statement, not
    sent as parameters: psycopg keeps its parsed form of a statement of at most 50 parameters, and the three
    rows' 66 columns (most of them NULL or empty for a new job) would otherwise be parsed again on every
    submission (67 us). The statement's text is the same from one submission to the next, so its parsed form
    is reused. `db` is the connection itself, not django.db.connection: every attribute read through that
    proxy looks the connection up again (half of the 118 us the three rows' values took)."""
    sql, fields = _columns(type(obj))
    values = _values(obj, fields, db)
    literals = [_literal(value) for value in values]
    placeholders = ", ".join("%s" if literal is None else literal for literal in literals)
    params = [value for value, literal in zip(values, literals, strict=True) if literal is None]
    return f"{sql}({placeholders})", params


def insert_together(*objs: Model) -> None:
    """INSERT every row, atomically; the last one's primary key is set from the database (the others have
    theirs already, or nobody reads it)."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql" or db.in_atomic_block:
        with transaction.atomic():
            for obj in objs:
                obj.save(force_insert=True)
        return
    *first, last = objs
    statements: list[str] = []
    params: list[Any] = []
    for index, obj in enumerate(first):
        sql, values = _row(obj, db)
        statements.append(f"w{index} AS ({sql})")
        params += values
    sql, values = _row(last, db)
    params += values
    pk = last._meta.pk
    assert pk is not None
    returning = f"{sql} RETURNING {db.ops.quote_name(pk.column)}"
    with transaction.atomic():
        with db.cursor() as cursor:
            cursor.execute(f"WITH {', '.join(statements)} {returning}" if statements else returning, params)
            row = cursor.fetchone()
        last.pk = row[0]
        for obj in objs:
            obj._state.adding = False
            obj._state.db = db.alias
        for obj in objs:  # as save() would: the outbox records the new job in this transaction
            post_save.send(type(obj), instance=obj, created=True, raw=False, using=db.alias)
