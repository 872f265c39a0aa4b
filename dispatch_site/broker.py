"""The Celery broker transport: kombu's Redis transport, with one fix so that a Redis restart cannot end a
Celery worker, and one Redis client per channel for what it sends (settings.CELERY_BROKER_TRANSPORT names
this module's Transport).

One client: kombu makes a new redis-py client for every message it sends (``Channel.conn_or_acquire``
without a client calls ``_create_client``), and redis-py builds each client's table of about 170 response
callbacks: 15% of the CPU a web process spent to enqueue a job's start (cProfile in a gunicorn worker). The
client holds no connection of its own: it takes one from the channel's connection pool for each command, as
the client made per message did, so one per pool serves every thread, and a Redis restart is met as before,
by the pool's new connection.

The bug (kombu 5.7.0, the newest release; upstream has the same code): when the broker connection is lost,
Celery's consumer calls ``Connection.collect()`` (celery/worker/consumer/consumer.py,
``on_connection_error_after_connected``), which closes the task channel and then detaches the transport
from the connection (kombu/connection.py ``_do_close_transport``: ``transport.client = None``). The
channel's ``close()`` (kombu/transport/redis.py ``Channel.close``) first reads the reply of the BRPOP it
has in flight; with Redis gone that read raises ``ConnectionError``, and ``close()`` gives up before it
has closed anything. ``collect()`` ignores the error and detaches the transport anyway. The consumer then
calls ``connection.close()``, which closes the same channel a second time: now it goes on to give its
unacknowledged messages back (``QoS.restore_unacked_once``), needs a new Redis client for that, and builds
its connection parameters from ``self.connection.client``, which is None: ``AttributeError: 'NoneType'
object has no attribute 'hostname'`` (kombu/transport/redis.py ``Channel._connparams``). That is neither a
connection nor a channel error, so it escapes the consumer and the worker stops ("Unrecoverable error").
It happens whenever Redis goes away while the worker holds unacknowledged messages: a task running with
``acks_late``, prefetched messages, or a countdown/ETA message (a retry) waiting.

The fix: a pending BRPOP reply that cannot be read because the connection is gone is treated like one
that brought nothing (``Empty``), and the close goes on while the transport still has its client. The
channel is then closed once, in ``collect()``; giving its messages back fails with a ``ConnectionError``
there (Redis is down), which kombu ignores, and Redis keeps them in its unacked index, from which they come
back after the visibility timeout if Redis kept its data (dispatch's stale sweep covers a Redis that lost
them). The second ``close()`` finds the channel closed and does nothing. tests/dispatch_site/
test_broker_restart.py restarts a real Redis under a real worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from queue import Empty
from typing import TYPE_CHECKING, Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    if TYPE_CHECKING:  # kombu's, missing from its stubs (celery-types)
        _in_poll: Any
        connection_errors: tuple[type[Exception], ...]

        def _brpop_read(self, **options: Any) -> bool: ...

        def _create_client(self, asynchronous: bool = False) -> Any: ...

    _sending: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client is None:
            # One client per pool: kombu replaces the channel's pool after a fork or a failed connect.
            client = self._sending
            if client is None or client.connection_pool is not self.pool:
                client = self._sending = self._create_client()
        yield client

    def close(self) -> None:
        if self._in_poll:
            try:
                self._brpop_read()  # clears _in_poll whatever happens
            except Empty:
                pass
            except self.connection_errors:
                # The socket is gone, and with it whatever reply was pending: nothing to read. Go on
                # closing now, while the transport still knows its connection parameters.
                pass
        super().close()


class Transport(kombu_redis.Transport):
    Channel = Channel
