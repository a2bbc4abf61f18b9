"""The send of a write recorded ahead, as its step takes it (agent.effect_record.Sending).

The commit's thread starts the send on the loop; the step, resumed on that loop by a callback
the same thread makes later, awaits the send's task itself."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ledgerloop.agent.effect_record import Sending


async def _answer(value: str, gate: asyncio.Event | None = None) -> Any:
    if gate is not None:
        await gate.wait()
    return value


def test_the_send_is_started_before_the_step_its_thread_resumes_later() -> None:
    """The order the step relies on: `start`, asked for from the committing thread, runs on
    the loop before a callback that thread asks for afterwards (the checkpoint's completion)."""

    async def main() -> tuple[bool, str]:
        loop = asyncio.get_running_loop()
        sending = Sending()
        resumed: asyncio.Future[bool] = loop.create_future()

        def commit() -> None:  # what the checkpoint's thread does at the commit, then after
            loop.call_soon_threadsafe(sending.start, _answer("sent"))
            loop.call_soon_threadsafe(lambda: resumed.set_result(sending.task is not None))

        thread = threading.Thread(target=commit)
        thread.start()
        started_first = await resumed
        thread.join()
        return started_first, str(await sending.result())

    started_first, sent = asyncio.run(main())
    assert started_first
    assert sent == "sent"


def test_a_step_waiting_before_the_send_starts_gets_its_answer() -> None:
    async def main() -> object:
        sending = Sending()
        gate = asyncio.Event()
        waiting = asyncio.ensure_future(sending.result())
        await asyncio.sleep(0)  # the step waits: no task yet
        assert not waiting.done()
        sending.start(_answer("late", gate))
        await asyncio.sleep(0)
        assert not waiting.done()  # the send is under way
        gate.set()
        return await asyncio.wait_for(waiting, 5)

    assert asyncio.run(main()) == "late"


def test_a_send_that_ended_is_read_without_waiting() -> None:
    async def main() -> object:
        sending = Sending()
        sending.start(_answer("done"))
        assert sending.task is not None
        await sending.task
        return await sending.result()

    assert asyncio.run(main()) == "done"
