"""The replay harness on hand-made journals: positions, names, waits, patches, the frontier."""

from __future__ import annotations

import asyncio
from typing import Any

from dbos import DBOS

from ledgerloop.deploy.replay import Entry, Verdict, replay_journal


async def _noop() -> None:
    raise AssertionError("a step body ran during a replay")


async def workflow(run_id: str, *, approve: bool = False, patched: bool = False) -> Any:
    """think, [approve + wait], act, save: the loop's shape in miniature."""
    assert DBOS.workflow_id == run_id
    think = await DBOS.run_step_async({"name": "think-0"}, _noop)
    if patched and await DBOS.patch_async("approve-first"):
        approve = True
    if approve:
        await DBOS.run_step_async({"name": "approve-0-a"}, _noop)
        decision = await DBOS.recv_async("approval:1", 60)
        if decision != "yes":
            return "rejected"
    await DBOS.run_step_async({"name": "tool-0-a"}, _noop)
    await DBOS.run_step_async({"name": "memory-save-0"}, _noop)
    return think


def replay(journal: list[tuple[int, str, Any]], **kwargs: Any) -> Verdict:
    entries = [Entry(fid, name, output) for fid, name, output in journal]

    async def wf(run_id: str) -> Any:
        return await workflow(run_id, **kwargs)

    return asyncio.run(replay_journal(wf, "run-1", ["run-1"], entries))


def test_a_run_at_its_frontier_resumes() -> None:
    verdict = replay([(1, "think-0", "hi")])
    assert verdict.resumable
    assert (verdict.step, verdict.expected) == (2, "tool-0-a")
    assert verdict.replayed == 1


def test_a_step_put_in_front_of_a_recorded_one_diverges() -> None:
    verdict = replay([(1, "think-0", "hi"), (2, "tool-0-a", {})], approve=True)
    assert not verdict.resumable
    assert (verdict.step, verdict.recorded, verdict.expected) == (2, "tool-0-a", "approve-0-a")
    assert "'tool-0-a' where the new code runs 'approve-0-a'" in verdict.reason


def test_a_run_waiting_for_a_message_resumes_at_its_wait() -> None:
    # recv takes two ids; a wait in progress has only its timeout's record (DBOS.sleep).
    journal = [(1, "think-0", "hi"), (2, "approve-0-a", {}), (4, "DBOS.sleep", 123.0)]
    verdict = replay(journal, approve=True)
    assert verdict.resumable
    assert verdict.expected == "DBOS.recv(approval:1)"


def test_a_received_message_is_replayed_from_the_journal() -> None:
    journal = [(1, "think-0", "hi"), (2, "approve-0-a", {}), (3, "DBOS.recv", "no")]
    journal.append((4, "DBOS.sleep", 1.0))
    verdict = replay(journal, approve=True)
    assert verdict.resumable
    assert verdict.reason == "replays to its end (the workflow returns)"


def test_removing_a_recorded_wait_diverges() -> None:
    journal = [(1, "think-0", "hi"), (2, "approve-0-a", {}), (4, "DBOS.sleep", 1.0)]
    verdict = replay(journal)
    assert not verdict.resumable
    assert (verdict.recorded, verdict.expected) == ("approve-0-a", "tool-0-a")


def test_a_step_the_journal_skipped_while_going_on_diverges() -> None:
    # The new code asks for operation 2, never recorded, though the journal has 3.
    verdict = replay([(1, "think-0", "hi"), (3, "memory-save-0", {})])
    assert not verdict.resumable
    assert verdict.step == 2
    assert "goes on to operation 3" in verdict.reason


def test_new_code_ending_before_the_journal_does_diverges() -> None:
    journal = [(1, "think-0", "hi"), (2, "tool-0-a", {}), (3, "memory-save-0", {})]
    journal.append((4, "finish", {}))
    verdict = replay(journal)
    assert not verdict.resumable
    assert (verdict.step, verdict.recorded, verdict.expected) == (4, "finish", None)


def test_a_patch_keeps_old_runs_on_their_path_and_new_ones_on_the_new() -> None:
    old = [(1, "think-0", "hi"), (2, "tool-0-a", {})]
    assert replay(old, patched=True).resumable  # recorded before the patch: the old path
    marked = [(1, "think-0", "hi"), (2, "DBOS.patch-approve-first", None)]
    marked.append((3, "approve-0-a", {}))
    verdict = replay(marked, patched=True)
    assert verdict.resumable
    assert verdict.expected == "DBOS.recv(approval:1)"
    assert verdict.step == 4


def test_a_recorded_error_is_raised_in_the_workflow_again() -> None:
    async def wf(run_id: str) -> Any:
        try:
            await DBOS.run_step_async({"name": "think-0"}, _noop)
        except ValueError as exc:
            return str(exc)
        return "no error"

    entries = [Entry(1, "think-0", None, ValueError("model down"))]
    verdict = asyncio.run(replay_journal(wf, "run-1", ["run-1"], entries))
    assert verdict.resumable
    assert verdict.replayed == 1


def test_new_code_that_cannot_read_an_old_output_is_reported() -> None:
    async def wf(run_id: str) -> Any:
        think = await DBOS.run_step_async({"name": "think-0"}, _noop)
        return think["new_field"]

    verdict = asyncio.run(replay_journal(wf, "run-1", ["run-1"], [Entry(1, "think-0", {})]))
    assert not verdict.resumable
    assert "KeyError" in verdict.reason


def test_a_replay_that_never_ends_is_stopped() -> None:
    async def wf(run_id: str) -> Any:
        await DBOS.run_step_async({"name": "think-0"}, _noop)
        await asyncio.Event().wait()

    entries = [Entry(1, "think-0", {})]
    verdict = asyncio.run(replay_journal(wf, "run-1", ["run-1"], entries, timeout_s=0.2))
    assert not verdict.resumable
    assert "did not end" in verdict.reason
