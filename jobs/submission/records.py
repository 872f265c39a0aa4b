"""Write the rows of one submission in one statement.

On PostgreSQL the job, its audit row, its first execution and the rows that go with them (jobs.models
.rows_inserting: the outbox's Change) are INSERTed by one statement (data-modifying CTEs), sent in autocommit:
one round trip, no BEGIN or COMMIT, and the statement is atomic on its own. Each row's INSERT has the ORM's
column list (built once per model) and its values prepared by each field as the ORM prepares them (`pre_save`
fills created_at and the like; JSON fields adapt their values). Then each row gets its post_save, as save()
would send it; inside a caller's transaction (or on SQLite) the ORM saves the rows in one transaction instead.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any, cast

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import AutoField, BigAutoField, Field, Model
from django.db.models.signals import post_save

from jobs.models import rows_inserting


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


def _row(obj: Model, db: BaseDatabaseWrapper, params: dict[str, Any], named: dict[Any, str]) -> str:
    """The INSERT of one row; its parameters are added to `params`, by name (`named`: the name each shareable
    value already has, see _key).

    NULL and the empty string are written in the statement, not sent as parameters, and a value the statement
    already has (the job's id in every row, its owner) is sent once: psycopg keeps its parsed form of a
    statement of at most 50 parameters, and the rows' 79 columns would otherwise be parsed again on every
    submission (67 us). The statement's text is the same from one submission to the next, so its parsed form
    is reused. `db` is the connection itself, not django.db.connection: every attribute read through that
    proxy looks the connection up again (half of the 118 us the three rows' values took)."""
    sql, fields = _columns(type(obj))
    placeholders = []
    for value in _values(obj, fields, db):
        literal = _literal(value)
        if literal is None:
            key = _key(value)
            name = named.get(key) if key is not None else None
            if name is None:
                name = f"p{len(params)}"
                params[name] = value
                if key is not None:
                    named[key] = name
            literal = f"%({name})s"
        placeholders.append(literal)
    return f"{sql}({', '.join(placeholders)})"


def _key(value: Any) -> tuple[type, Any] | None:
    """What makes two parameters one: the same type and an equal value (True is not 1). None: never shared
    (an adapted JSON value compares by identity)."""
    if type(value) not in (str, int, datetime):
        return None
    return type(value), value


def _rows_with(objs: tuple[Model, ...]) -> list[Model]:
    """The rows that go with `objs` (jobs.models.rows_inserting), asked once theirs have their values."""
    extras: list[Model] = []
    for obj in objs:
        for _receiver, rows in rows_inserting.send(type(obj), instance=obj):
            extras.extend(cast(list[Model], rows))
    return extras


def insert_together(*objs: Model) -> list[Model]:
    """INSERT every row and the rows that go with them, atomically, and answer all of them; the primary key of
    the last of `objs` is set from the database (the others have theirs already, or nobody reads it)."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql" or db.in_atomic_block:
        with transaction.atomic():
            for obj in objs:
                obj.save(force_insert=True)
            extras = _rows_with(objs)
            for extra in extras:
                extra.save(force_insert=True)
        return [*objs, *extras]
    *first, last = objs
    params: dict[str, Any] = {}
    named: dict[Any, str] = {}
    statements = [_row(obj, db, params, named) for obj in first]
    pk = last._meta.pk
    assert pk is not None
    returning = f"{_row(last, db, params, named)} RETURNING {db.ops.quote_name(pk.column)}"
    extras = _rows_with(objs)  # now that created_at and the like are filled
    statements += [_row(extra, db, params, named) for extra in extras]
    ctes = ", ".join(f"w{index} AS ({sql})" for index, sql in enumerate(statements))
    with db.cursor() as cursor:  # autocommit: the one statement is the transaction
        cursor.execute(f"WITH {ctes} {returning}" if statements else returning, params)
        row = cursor.fetchone()
    last.pk = row[0]
    rows = [*objs, *extras]
    for obj in rows:
        obj._state.adding = False
        obj._state.db = db.alias
    for obj in rows:  # as save() would (committed already: on_commit callbacks run at once)
        post_save.send(type(obj), instance=obj, created=True, raw=False, using=db.alias)
    return rows
