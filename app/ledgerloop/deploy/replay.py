"""Replay a run's journal against this process's code and policy, with no side effects.

The run's workflow function runs for real, in a harness that answers the durable operations
it makes from the run's journal, by position and name, the way DBOS replays a recovered
workflow (dbos 3.4: one operation id per step, two per `recv` (the message, then the record
of its timeout), one per `sleep`, one per applied patch; replay compares only the recorded
function name at each id):

- a step whose journal entry has the same name gets the recorded output (or error) back;
- an entry with another name is a **divergence**: DBOS would fail the run there
  (`DBOSUnexpectedStepError`);
- an operation with no entry ends the replay: that is where the run would go on executing
  (the **frontier**), and the run resumes; unless the journal has entries further on, which
  the new code would walk past or overwrite, which is a divergence too;
- the workflow function returning while the journal goes on is a divergence; failing with
  an error that is not a divergence (new code that cannot read an old step's output, say)
  is reported with the error.

No step body runs, so no model is called, no tool runs and nothing is written. The harness
takes the place of DBOS's workflow-facing calls (`run_step_async`, `recv_async`,
`sleep_async`, `patch_async`, `deprecate_patch_async`, `start_workflow_async` (a child
episode: its start and its result come from the journal; the child itself is not replayed),
`workflow_id`) only inside a replay
(a context variable says so); elsewhere in the process they are DBOS's own. Any other DBOS
call made from workflow code reaches DBOS itself, which is not launched here, and the replay
reports that failure.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from dbos import DBOS

from ledgerloop.agent.messages import journal_ahead
from ledgerloop.errors import LedgerloopError
from ledgerloop.failures import describe

RECV = "DBOS.recv"
SLEEP = "DBOS.sleep"
PATCH_PREFIX = "DBOS.patch-"
GET_RESULT = "DBOS.getResult"


@dataclass(frozen=True)
class Entry:
    """One operation of a run's journal (a row of DBOS's operation_outputs)."""

    function_id: int
    name: str
    output: Any = None
    error: BaseException | None = None

    @classmethod
    def from_step(cls, step: Any) -> Entry:
        """From a DBOS StepInfo (`DBOSClient.list_workflow_steps`)."""
        return cls(
            int(step["function_id"]), str(step["function_name"]), step["output"], step["error"]
        )


@dataclass(frozen=True)
class Verdict:
    """What the new code does with one run's journal."""

    resumable: bool
    #: The operation id where the replay ended (the frontier or the divergence).
    step: int | None
    #: What the journal has there (None: nothing).
    recorded: str | None
    #: What the new code does there (None: it ends the workflow).
    expected: str | None
    #: One line for people.
    reason: str
    #: Journal entries the new code replayed.
    replayed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "resumable": self.resumable,
            "step": self.step,
            "recorded": self.recorded,
            "expected": self.expected,
            "reason": self.reason,
            "replayed": self.replayed,
        }


class ReplayError(LedgerloopError):
    """The journal could not be replayed."""


class _Stop(BaseException):
    """Ends a replay from inside the workflow code; a BaseException, so no `except Exception`
    in workflow code can mistake it for a failure of its own."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict


class _Replay:
    def __init__(self, workflow_id: str, journal: list[Entry]) -> None:
        self.workflow_id = workflow_id
        self.entries = {entry.function_id: entry for entry in journal}
        self.last = max(self.entries, default=0)
        #: The operation id DBOS would give the next operation (ids start at 1).
        self.next_id = 1
        self.replayed = 0

    def recorded(self, name: str) -> bool:
        """Whether the journal has an operation of this name (step names are unique in a
        run), wherever it is."""
        return any(entry.name == name for entry in self.entries.values())

    def _take(self, count: int) -> int:
        taken = self.next_id
        self.next_id += count
        return taken

    def _diverge(self, fid: int, recorded: str | None, expected: str | None, why: str) -> _Stop:
        return _Stop(Verdict(False, fid, recorded, expected, why, self.replayed))

    def _frontier(self, fid: int, expected: str) -> _Stop:
        why = f"resumes at operation {fid}: {expected}"
        return _Stop(Verdict(True, fid, None, expected, why, self.replayed))

    def _unrecorded(self, fid: int, expected: str, span: int = 1) -> _Stop:
        """No entry at `fid`: the frontier, unless the journal goes on past this operation."""
        later = [i for i in self.entries if i >= fid + span]
        if later:
            recorded = self.entries[min(later)].name
            return self._diverge(
                fid,
                None,
                expected,
                f"at operation {fid} the new code runs {expected!r}, which the journal "
                f"never recorded, though it goes on to operation {max(later)} "
                f"({recorded!r} next)",
            )
        return self._frontier(fid, expected)

    def _mismatch(self, fid: int, recorded: str, expected: str, detail: str = "") -> _Stop:
        return self._diverge(
            fid,
            recorded,
            expected,
            f"at operation {fid} the journal has {recorded!r} where the new code runs "
            f"{expected!r}{detail}",
        )

    def step(self, name: str, args: tuple[Any, ...]) -> Any:
        fid = self._take(1)
        entry = self.entries.get(fid)
        if entry is None:
            raise self._unrecorded(fid, name)
        if entry.name != name:
            raise self._mismatch(fid, entry.name, name, _call_detail(name, args))
        self.replayed += 1
        if entry.error is not None:
            raise entry.error
        return entry.output

    def recv(self, topic: str | None) -> Any:
        fid = self._take(2)  # the message, then the record of the wait's timeout
        entry = self.entries.get(fid)
        expected = f"{RECV}({topic})"
        if entry is None:
            timeout = self.entries.get(fid + 1)
            if timeout is not None and timeout.name != SLEEP:
                raise self._mismatch(fid + 1, timeout.name, SLEEP, f" (the timeout of {expected})")
            raise self._unrecorded(fid, expected, span=2)
        if entry.name != RECV:
            raise self._mismatch(fid, entry.name, expected)
        self.replayed += 1
        return entry.output

    def child(self, name: str) -> _ChildHandle:
        """A child workflow started (run_episode): its start is one operation, its result
        (read through the handle) the next."""
        fid = self._take(1)
        entry = self.entries.get(fid)
        if entry is None:
            raise self._unrecorded(fid, name)
        if entry.name != name:
            raise self._mismatch(fid, entry.name, name)
        self.replayed += 1
        return _ChildHandle(self)

    def sleep(self) -> None:
        fid = self._take(1)
        entry = self.entries.get(fid)
        if entry is None:
            raise self._unrecorded(fid, SLEEP)
        if entry.name != SLEEP:
            raise self._mismatch(fid, entry.name, SLEEP)
        self.replayed += 1

    def patch(self, name: str, *, deprecated: bool) -> bool:
        marker = PATCH_PREFIX + name
        entry = self.entries.get(self.next_id)
        if entry is not None and entry.name != marker:
            return deprecated  # recorded before the patch: the old path, no position used
        if entry is not None or not deprecated:
            self._take(1)
            if entry is not None:
                self.replayed += 1
        return True

    def finished(self, result: Any) -> Verdict:
        later = [i for i in self.entries if i >= self.next_id]
        if later:
            fid = min(later)
            return Verdict(
                False,
                fid,
                self.entries[fid].name,
                None,
                f"the new code ends the workflow at operation {fid}, where the journal goes "
                f"on with {self.entries[fid].name!r}",
                self.replayed,
            )
        return Verdict(
            True, None, None, None, "replays to its end (the workflow returns)", self.replayed
        )


class _ChildHandle:
    """A replayed child's handle: its result is the journal's, the child never runs."""

    def __init__(self, replay: _Replay) -> None:
        self.replay = replay

    async def get_result(self) -> Any:
        return self.replay.step(GET_RESULT, ())


def _call_detail(name: str, args: tuple[Any, ...]) -> str:
    # A run that fails in the new code ends with a `finish` step that names why.
    if name == "finish" and len(args) >= 4 and isinstance(args[3], dict):
        error = args[3].get("error")
        why = f"; {_one_line(error)}" if isinstance(error, dict) else ""
        return f" (it would end the run {args[1]}: {args[2]}{why})"
    return ""


def _one_line(error: dict[str, Any]) -> str:
    return f"{error.get('type')}: {error.get('message')}"


_current: contextvars.ContextVar[_Replay | None] = contextvars.ContextVar(
    "ledgerloop_replay", default=None
)
_installed = False


def _install() -> None:
    """Put the harness in front of DBOS's workflow-facing calls, once per process."""
    global _installed
    if _installed:
        return
    run_step_async = DBOS.run_step_async
    recv_async = DBOS.recv_async
    sleep_async = DBOS.sleep_async
    patch_async = DBOS.patch_async
    deprecate_patch_async = DBOS.deprecate_patch_async
    workflow_id = DBOS.__dict__["workflow_id"]
    start_workflow_async = DBOS.start_workflow_async

    async def step(options: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        replay = _current.get()
        if replay is None:
            return await run_step_async(options, fn, *args, **kwargs)
        name = (options or {}).get("name") or getattr(fn, "__qualname__", repr(fn))
        return replay.step(str(name), args)

    async def start_workflow(func: Any, *args: Any, **kwargs: Any) -> Any:
        replay = _current.get()
        if replay is None:
            return await start_workflow_async(func, *args, **kwargs)
        name = getattr(func, "dbos_function_name", None) or getattr(func, "__qualname__", "")
        return replay.child(str(name))

    async def recv(topic: str | None = None, timeout_seconds: float = 60) -> Any:
        replay = _current.get()
        if replay is None:
            return await recv_async(topic, timeout_seconds)
        return replay.recv(topic)

    async def sleep(seconds: float) -> None:
        replay = _current.get()
        if replay is None:
            return await sleep_async(seconds)
        if seconds > 0:
            replay.sleep()
        return None

    async def patch(name: str) -> bool:
        replay = _current.get()
        if replay is None:
            return bool(await patch_async(name))
        return replay.patch(name, deprecated=False)

    async def deprecate_patch(name: str) -> bool:
        replay = _current.get()
        if replay is None:
            return bool(await deprecate_patch_async(name))
        return replay.patch(name, deprecated=True)

    class _WorkflowId:
        def __get__(self, obj: Any, owner: Any) -> str | None:
            replay = _current.get()
            if replay is None:
                return workflow_id.__get__(obj, owner)  # type: ignore[no-any-return]
            return replay.workflow_id

    for attr, value in (
        ("run_step_async", step),
        ("recv_async", recv),
        ("sleep_async", sleep),
        ("patch_async", patch),
        ("deprecate_patch_async", deprecate_patch),
        ("start_workflow_async", start_workflow),
        ("workflow_id", _WorkflowId()),
    ):
        setattr(DBOS, attr, value)
    _installed = True


async def replay_journal(
    workflow: Callable[..., Coroutine[Any, Any, Any]],
    workflow_id: str,
    args: list[Any],
    journal: list[Entry],
    *,
    timeout_s: float = 10.0,
) -> Verdict:
    """Run `workflow` (a DBOS workflow function, decorated or not) against `journal`."""
    _install()
    body = inspect.unwrap(workflow)
    replay = _Replay(workflow_id, journal)

    async def run() -> Verdict:
        _current.set(replay)
        # The loop's turn boundaries take messages where the journal shows they did.
        journal_ahead.set(replay.recorded)
        try:
            result = await body(*args)
        except _Stop as stop:
            return stop.verdict
        except Exception as exc:
            return Verdict(
                False,
                replay.next_id,
                None,
                None,
                f"the new code fails on replay after operation {replay.next_id - 1}: "
                f"{_one_line(describe(exc))}",
                replay.replayed,
            )
        return replay.finished(result)

    # Its own task (and so its own copy of the context): nothing set here leaks out.
    try:
        return await asyncio.wait_for(asyncio.create_task(run()), timeout_s)
    except TimeoutError:
        return Verdict(
            False,
            replay.next_id,
            None,
            None,
            f"the replay did not end within {timeout_s:.0f} s (stopped after operation "
            f"{replay.next_id - 1})",
            replay.replayed,
        )
