"""The relay: delivers outbox rows to their destinations, woken by LISTEN/NOTIFY.

One loop claims due rows in batches (SKIP LOCKED, so several relays share the work), each
claim committing `started` on the effects before any call goes out. Calls run concurrently,
bounded, over one keep-alive HTTP client. A recorder task writes finished outcomes in batches,
each batch one transaction that records the effects, closes or reschedules the outbox rows
and (by the ledger's trigger) messages the waiting workflows.

The relay sleeps until a notification, the earliest backoff-delayed row, or a slow safety
poll for notifications lost while reconnecting; it never polls every second.

Inside a worker, the relay also delivers for the act steps (`deliver_now`): an act step
records its effect already claimed, in its own transaction, and hands the claim here, so
the call goes out without a wake-up, a claim or a message back to the run. The attempt
runs the same code, with the same fault points, and its outcome is recorded by the same
recorder; what it leaves behind after a crash is what a relay crash leaves.

Crash points (`ledgerloop.faults`): `relay.before_send` (started committed, nothing sent),
`relay.after_send_before_record` (the destination answered, nothing recorded),
`relay.after_record` (a batch of outcomes committed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from types import TracebackType

import psycopg
from psycopg_pool import AsyncConnectionPool

from ledgerloop import faults
from ledgerloop.db.errors import DatabaseUnreachable
from ledgerloop.db.pooling import session_url
from ledgerloop.effects.attempts import RelayConfig, backoff_s, decide, failure, http_client
from ledgerloop.effects.delivery import Requester, Verdict, delivery_url, send
from ledgerloop.effects.delivery_guard import NotSent, check_send
from ledgerloop.effects.errors import InvalidDeliveryRequest
from ledgerloop.effects.ledger import COMPENSATION_SUFFIX
from ledgerloop.effects.messages import DeliveryRequest, OutboxStatus
from ledgerloop.effects.outbox import (
    CHANNEL,
    AConn,
    Claimed,
    Outcome,
    connect_async,
    connect_async_or_later,
    connection_timeline,
    open_async_pool,
    outbox_claim,
    outbox_next_due,
    outbox_record,
)
from ledgerloop.errors import LedgerloopError
from ledgerloop.idle import IdleBackoff
from ledgerloop.mcptools.calls import call_tool
from ledgerloop.mcptools.client import McpConnections
from ledgerloop.mcptools.spans import call_facts, merge_sdk_spans
from ledgerloop.streams.source import NotificationSource
from ledgerloop.telemetry.effect_spans import delivery_span, mcp_delivery_span
from ledgerloop.tools.policy import McpServer

log = logging.getLogger(__name__)

#: After a claim that left due rows behind (another relay holds their locks), look again soon.
CONTENDED_WAIT_S = 0.05


async def _wait_any(timeout: float | None, *events: asyncio.Event) -> None:
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


class Relay:
    """Use as `async with Relay(url, destinations) as relay: await relay.run(stop)`."""

    def __init__(
        self,
        url: str,
        destinations: Mapping[str, str],
        config: RelayConfig | None = None,
        mcp_servers: Mapping[str, McpServer] | None = None,
        *,
        listen_url: str | None = "",
        notifications: NotificationSource | None = None,
    ) -> None:
        self.url = url
        #: The process's shared listener (`ledgerloop up`: the dispatcher's connection);
        #: None: the relay LISTENs on a connection of its own.
        self.notifications = notifications
        #: Where the relay LISTENs (a direct connection: a transaction-mode pooler drops
        #: notifications); None: it does not, and its safety poll finds the rows.
        # Default: the route registered for `url` (its direct URL behind a pooler).
        self.listen_url = session_url(url) if listen_url == "" else listen_url
        self.destinations = dict(destinations)
        #: MCP servers by name: the destinations of MCP write tools (tools/call, not HTTP).
        self.mcp_servers = dict(mcp_servers or {})
        self._mcp = McpConnections()
        self.config = config or RelayConfig()
        #: Test signals: the listener is subscribed; the loop is waiting for work.
        self.listening = asyncio.Event()
        self.idle = asyncio.Event()
        #: Outcomes this relay recorded (and still owned when it recorded them).
        self.recorded = 0
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._outcomes: asyncio.Queue[Outcome] = asyncio.Queue()
        #: Inline deliveries waiting for their outcome's record: outbox id -> owned?
        self._recorded: dict[int, asyncio.Future[bool]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        #: Act steps' deliveries under way; a stopping relay lets them finish (bounded).
        self._inline = 0
        self._inline_done = asyncio.Event()
        self._inline_done.set()
        self._claim_conn: AConn | None = None
        self._record_conn: AConn | None = None
        #: Act steps' records of the effects they hand to `send_now` (`records`).
        self._steps_pool: AsyncConnectionPool[AConn] | None = None
        self._steps_opening = asyncio.Lock()
        self._stopped = False
        self._client: Requester | None = None
        self._recorder: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Relay:
        self._loop = asyncio.get_running_loop()
        self._client = http_client(self.config)
        try:
            # None while the database is away: the loops below connect once it is back.
            self._claim_conn = await connect_async_or_later(self.url, "relay")
            self._record_conn = await connect_async_or_later(self.url, "relay recorder")
        except BaseException:
            await self._close_resources()
            raise
        self._recorder = asyncio.create_task(self._record_loop(), name="relay-recorder")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        grace = self.config.shutdown_grace_s
        self._closing = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._inline_done.wait(), grace)
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=grace)
            for task in late:
                # Their effects stay `started`; the reconciler settles them after the lease.
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        try:
            await asyncio.wait_for(self._outcomes.join(), grace)
        except TimeoutError:
            log.warning(
                "relay stopped with %d outcomes unrecorded; the reconciler will settle them",
                self._outcomes.qsize(),
            )
        if self._recorder is not None:
            self._recorder.cancel()
            await asyncio.gather(self._recorder, return_exceptions=True)
        for waiting in self._recorded.values():
            # Unrecorded: the effect stays started and settles after its lease.
            if not waiting.done():
                waiting.set_result(False)
        await self._close_resources()

    async def _close_resources(self) -> None:
        self._stopped = True
        await self._mcp.aclose()
        if self._client is not None:
            await self._client.aclose()
        for conn in (self._claim_conn, self._record_conn):
            if conn is not None:
                await conn.close()
        if self._steps_pool is not None:
            await self._steps_pool.close()

    # -- the loop -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until `stop` is set."""
        log.info("relay delivering to %s", ", ".join(sorted(self.destinations)) or "nowhere")
        listener = asyncio.create_task(self._listen_loop(stop), name="relay-listener")
        if self.listen_url is None:
            log.info(
                "relay without LISTEN (no direct database URL): due rows are found within %.1f s",
                self.config.safety_poll_s,
            )
        # With LISTEN, the safety poll is for a lost notification: slower while it finds
        # nothing (ledgerloop.idle). Without, it is how rows are found: never slower.
        backoff = IdleBackoff(self.config.safety_poll_s)
        try:
            while not stop.is_set():
                self._slot_freed.clear()
                try:
                    claimed, limit = await self._fill()
                    if limit == 0:
                        await _wait_any(None, stop, self._slot_freed)
                        continue
                    if claimed == limit:
                        continue  # a full batch: more may be due
                    due_in = await outbox_next_due(self._conn())
                except (psycopg.OperationalError, LedgerloopError) as exc:
                    log.warning("relay lost its database connection: %s", exc)
                    await _wait_any(self.config.reconnect_s, stop)
                    await self._reconnect_claim()
                    continue
                idle_s = backoff.after(
                    bool(claimed) or due_in is not None or self.listen_url is None
                )
                if due_in is None:
                    timeout = idle_s
                elif due_in <= 0:
                    timeout = CONTENDED_WAIT_S
                else:
                    timeout = min(due_in, self.config.safety_poll_s)
                self.idle.set()
                await _wait_any(timeout, stop, self._wake)
                self.idle.clear()
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    async def drain(self, timeout_s: float = 30.0) -> int:
        """Deliver everything pending, backoff retries included; return outcomes recorded.

        For tests and one-shot use: it returns when no pending row is left.
        """
        start = self.recorded
        deadline = time.monotonic() + timeout_s
        while True:
            self._slot_freed.clear()
            claimed, limit = await self._fill()
            if limit == 0:
                await _wait_any(None, self._slot_freed)
                continue
            if claimed:
                continue
            if self._tasks:
                await asyncio.gather(*self._tasks)
            await self._outcomes.join()
            due_in = await outbox_next_due(self._conn())
            if due_in is None:
                return self.recorded - start
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"outbox not drained within {timeout_s}s")
            await asyncio.sleep(min(max(due_in, 0.0), left))

    def _conn(self) -> AConn:
        assert self._loop is not None, "use the relay inside `async with`"
        if self._claim_conn is None:
            raise DatabaseUnreachable("the relay has had no database connection yet")
        return self._claim_conn

    async def _reconnect_claim(self) -> None:
        if self._claim_conn is not None:
            await self._claim_conn.close()
        try:
            self._claim_conn = await connect_async(self.url)
        except LedgerloopError as exc:
            log.warning("relay cannot reconnect yet: %s", exc)

    async def _fill(self) -> tuple[int, int]:
        """Claim as many due rows as there are free slots; returns (claimed, limit)."""
        free = self.config.concurrency - len(self._tasks)
        # While calls are in flight, wait for a quarter of the slots before claiming again:
        # refilling one slot per finished call would cost a claim round trip per delivery.
        if free <= 0 or (self._tasks and free < max(1, self.config.concurrency // 4)):
            return 0, 0
        limit = min(free, self.config.batch_size)
        # Cleared before the claim: a notification that lands during it wakes the next wait.
        self._wake.clear()
        conn = self._conn()
        timeline = connection_timeline(conn)
        claimed = await outbox_claim(conn, limit=limit, lease_margin_s=self.config.lease_margin_s)
        for row in claimed:
            task = asyncio.create_task(self._deliver(row, timeline))
            self._tasks.add(task)
            task.add_done_callback(self._task_done)
        return len(claimed), limit

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slot_freed.set()

    async def _listen_loop(self, stop: asyncio.Event) -> None:
        if self.notifications is not None:
            await self._hear_shared(self.notifications, stop)
            return
        if self.listen_url is None:
            return
        while not stop.is_set():
            try:
                conn = await connect_async(self.listen_url, "ledgerloop-relay-listen")
                async with conn:
                    await conn.execute("LISTEN ledgerloop_outbox")
                    self.listening.set()
                    # Rows inserted while nobody listened are due now.
                    self._wake.set()
                    async for _ in conn.notifies():
                        self._wake.set()
            except (psycopg.OperationalError, LedgerloopError) as exc:
                self.listening.clear()
                log.warning("relay listener on %s lost its connection: %s", CHANNEL, exc)
                await _wait_any(self.config.reconnect_s, stop)

    async def _hear_shared(self, source: NotificationSource, stop: asyncio.Event) -> None:
        """Wake on the outbox's notifications heard by the process's shared listener (and
        when it reconnected: rows inserted meanwhile are due now)."""
        loop = asyncio.get_running_loop()

        def heard(_: str | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the relay is gone
                loop.call_soon_threadsafe(self._wake.set)

        unsubscribe = source.subscribe(CHANNEL, heard)
        try:
            self.listening.set()
            self._wake.set()
            await stop.wait()
        finally:
            unsubscribe()
            self.listening.clear()

    # -- delivery for an act step ---------------------------------------------------------

    @property
    def lease_margin_s(self) -> float:
        return self.config.lease_margin_s

    @contextlib.asynccontextmanager
    async def records(self) -> AsyncIterator[AConn]:
        """A connection of this relay's own small pool, on its loop, for an act step's record
        of an effect it then hands to `send_now`. A record from a thread of the worker's pool
        costs two thread hand-offs between the model's answer and the delivery. The pool
        opens at the first record (a relay of its own, `ledgerloop relay`, never makes one)
        and does not wait for the database: a record made during an outage waits for a
        connection, then fails as transient, like any step's statement. It serves until the
        relay has stopped (a record begun as it stops is delivered, or settles after its
        lease, as before)."""
        if self._loop is None:
            raise RuntimeError("records() before the relay started (use `async with Relay(...)`)")
        if self._stopped:
            # A step that found this relay running just before it stopped: transient, so the
            # step runs again and records for a relay elsewhere (no pool opened to leak).
            raise DatabaseUnreachable("the relay has stopped; its records pool is closed")
        if self._steps_pool is None:
            async with self._steps_opening:  # the first records at once open one pool
                if self._steps_pool is None:
                    self._steps_pool = await open_async_pool(
                        self.url, self.config.step_connections, "ledgerloop-relay-steps"
                    )
        async with self._steps_pool.connection() as conn:
            yield conn

    def delivers_here(self) -> bool:
        """Whether a caller on the running event loop may hand this relay a claim now."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return False
        return running is self._loop and not self._closing and self._recorder is not None

    async def deliver_now(self, claimed: Claimed) -> Outcome | None:
        """Deliver a row its recorder claimed (`Claimed.at_insert`) and record the outcome.

        Returns the outcome once it is recorded; None when it was not (a bug in the attempt,
        the relay stopping, or someone else settled the effect first): the caller then reads
        the effect's row, which settles as after any relay's lost attempt.
        """
        sent = await self.send_now(claimed)
        if sent is None:
            return None
        outcome, recorded = sent
        return outcome if await recorded else None

    async def send_now(self, claimed: Claimed) -> tuple[Outcome, asyncio.Future[bool]] | None:
        """`deliver_now` without waiting for the record: the outcome as soon as the
        downstream has answered, and a future that says, once the outcome is recorded,
        whether this attempt still owned the effect (False: someone else settled it first,
        and the row says how). The caller may work with the outcome meanwhile, but must not
        make anything durable of it before the future says True. None: nothing was sent or
        will be recorded (a bug in the attempt, the relay stopping)."""
        self._inline += 1
        self._inline_done.clear()
        handed = False
        try:
            try:
                outcome = await self._attempt(claimed)
            except NotSent:
                return None  # the effect settles after its lease, found again by its key
            except Exception:
                log.exception("relay failed delivering %s", claimed.key)
                return None
            if self._recorder is None or self._recorder.done():
                return None  # stopped meanwhile: the effect settles after its lease
            recorded: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._recorded[claimed.outbox_id] = recorded
            recorded.add_done_callback(lambda _: self._sent_recorded(outcome))
            # The caller goes first: the recorder wakes only after it, at the caller's next
            # wait (a step's model call, sent about a millisecond later), and its statement
            # then runs while the model works. Woken first, the recorder's Python (0.3 ms)
            # stood between the downstream's answer and the step (`turn_write_timeline`).
            asyncio.get_running_loop().call_soon(self._outcomes.put_nowait, outcome)
            handed = True  # the delivery is under way until its record (_sent_recorded)
            return outcome, recorded
        finally:
            if not handed:
                self._inline_ended()

    def _sent_recorded(self, outcome: Outcome) -> None:
        self._recorded.pop(outcome.claimed.outbox_id, None)
        if outcome.retry_in_s is not None:
            self._wake.set()  # a retry is the relay's now: it must know when it is due
        self._inline_ended()

    def _inline_ended(self) -> None:
        self._inline -= 1
        if not self._inline:
            self._inline_done.set()

    # -- one delivery ---------------------------------------------------------------------

    async def _deliver(self, claimed: Claimed, timeline: int | None = None) -> None:
        try:
            outcome = await self._attempt(claimed, timeline)
        except NotSent:
            return  # the effect stays started and settles after its lease
        except Exception:
            # A bug must not take the relay down. The effect stays `started` and the
            # reconciler settles it once the lease runs out.
            log.exception("relay failed delivering %s", claimed.key)
            return
        self._outcomes.put_nowait(outcome)

    async def _attempt(self, claimed: Claimed, timeline: int | None = None) -> Outcome:
        await check_send(claimed.key, timeline)
        try:
            request = DeliveryRequest.from_json(claimed.request)
        except InvalidDeliveryRequest as exc:
            return failure(claimed, exc.message, OutboxStatus.DEAD)
        if request.mcp_tool is not None:
            return await self._attempt_mcp(claimed, request)
        base_url = self.destinations.get(claimed.destination)
        if base_url is None:
            known = ", ".join(sorted(self.destinations)) or "none"
            return failure(
                claimed,
                f"unknown destination {claimed.destination!r}; this relay knows: {known} "
                "(destinations: in the policy file, or LEDGERLOOP_DESTINATIONS)",
                OutboxStatus.DEAD,
            )
        faults.hit("relay.before_send")
        if claimed.key.endswith(COMPENSATION_SUFFIX):
            faults.hit("relay.before_send_compensation")
        assert self._client is not None
        with delivery_span(
            request.method,
            delivery_url(base_url, request),
            idempotency_key=claimed.key,
            attempt=claimed.effect_attempts,
            tool_traceparent=request.traceparent,
        ) as span:
            delivery = await send(self._client, base_url, claimed.key, request, span.headers)
            faults.hit("relay.after_send_before_record")
            outcome = decide(claimed, request, delivery, self.config)
            span.record(delivery.status_code, outcome.status.value, delivery.detail)
        return outcome

    async def _attempt_mcp(self, claimed: Claimed, request: DeliveryRequest) -> Outcome:
        """An MCP write: tools/call with the key in `_meta`, classified like an HTTP call."""
        server = self.mcp_servers.get(claimed.destination)
        if server is None:
            known = ", ".join(sorted(self.mcp_servers)) or "none"
            return failure(
                claimed,
                f"unknown MCP server {claimed.destination!r}; this relay knows: {known}",
                OutboxStatus.DEAD,
            )
        assert request.mcp_tool is not None
        arguments = request.body if isinstance(request.body, dict) else {}
        # The SDK's own client span would be a second span for this call (and a relay of its
        # own, `ledgerloop relay`, has had no worker step install the merge yet).
        merge_sdk_spans()
        faults.hit("relay.before_send")
        with mcp_delivery_span(
            request.mcp_tool,
            mcp=call_facts(server),
            idempotency_key=claimed.key,
            attempt=claimed.effect_attempts,
            tool_traceparent=request.traceparent,
        ) as span:
            called = await call_tool(
                self._mcp, claimed.destination, server, request.mcp_tool, arguments, key=claimed.key
            )
            faults.hit("relay.after_send_before_record")
            delivery = called.delivery
            outcome = decide(claimed, request, delivery, self.config)
            if called.connection is not None:
                span.connected(called.connection.session_id, called.connection.protocol_version)
            span.record(
                outcome.status.value,
                delivery.detail,
                rpc_code=called.rpc_code,
                tool_error=delivery.verdict is Verdict.FAILED and called.rpc_code is None,
            )
        return outcome

    # -- recording ------------------------------------------------------------------------

    async def _record_loop(self) -> None:
        while True:
            batch = [await self._outcomes.get()]
            while len(batch) < self.config.record_batch and not self._outcomes.empty():
                batch.append(self._outcomes.get_nowait())
            owned: set[str] = set()
            try:
                owned = await self._write(batch)
            except Exception:
                # Never let the recorder die: the relay would keep claiming and never record.
                # These effects stay `started`; the reconciler settles them after the lease.
                log.exception("relay could not record %d outcomes", len(batch))
            finally:
                for _ in batch:
                    self._outcomes.task_done()
            faults.hit("relay.after_record")
            for outcome in batch:
                waiting = self._recorded.get(outcome.claimed.outbox_id)
                if waiting is not None and not waiting.done():
                    waiting.set_result(outcome.claimed.key in owned)

    async def _write(self, batch: list[Outcome]) -> set[str]:
        """Record a batch, reconnecting as long as the database is away; returns the keys
        recorded (still owned by their attempt).

        Re-running a batch is harmless: each row's update is guarded by the attempt it owns.
        """
        while True:
            try:
                if self._record_conn is None:
                    raise DatabaseUnreachable("the relay has had no database connection yet")
                owned = await outbox_record(self._record_conn, batch)
            except (psycopg.OperationalError, DatabaseUnreachable) as exc:
                log.warning("relay cannot record outcomes yet: %s", exc)
                await asyncio.sleep(self.config.reconnect_s)
                await self._reconnect_record()
                continue
            except psycopg.Error:
                if len(batch) == 1:
                    log.exception("relay could not record %s; dropped", batch[0].claimed.key)
                    return set()
                # One bad row must not cost the others their outcome.
                recorded: set[str] = set()
                for outcome in batch:
                    recorded |= await self._write([outcome])
                return recorded
            self.recorded += len(owned)
            lost = len(batch) - len(owned)
            if lost:
                log.info("%d outcomes were settled by someone else first; dropped", lost)
            return owned

    async def _reconnect_record(self) -> None:
        if self._record_conn is not None:
            await self._record_conn.close()
        try:
            self._record_conn = await connect_async(self.url)
        except LedgerloopError as exc:
            log.warning("relay cannot reconnect yet: %s", exc)


async def run_relay(
    url: str,
    destinations: Mapping[str, str],
    *,
    stop: asyncio.Event,
    config: RelayConfig | None = None,
    mcp_servers: Mapping[str, McpServer] | None = None,
) -> None:
    """The relay as a service (`ledgerloop relay`, or a task inside `ledgerloop up`). It
    LISTENs on the direct connection of a pooled URL (db/pooling.py), and without one polls
    every `config.safety_poll_s` (set from LEDGERLOOP_POOLED_POLL_S by its callers)."""
    async with Relay(url, destinations, config, mcp_servers, listen_url=session_url(url)) as relay:
        await relay.run(stop)


__all__ = ["Relay", "RelayConfig", "backoff_s", "decide", "run_relay"]
