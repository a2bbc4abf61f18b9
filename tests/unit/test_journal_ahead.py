"""The journal check answered ahead (db.dbos_journal): who may take an answer, and when."""

from __future__ import annotations

import time

import pytest

from ledgerloop.db import dbos_journal


def test_an_answer_is_taken_once_by_its_own_execution() -> None:
    dbos_journal.answer_ahead("wf-once", 4, "owner-a")
    assert not dbos_journal.take_ahead("wf-once", 5, "owner-a")  # another operation
    assert not dbos_journal.take_ahead("other", 4, "owner-a")  # another workflow
    assert dbos_journal.take_ahead("wf-once", 4, "owner-a")
    assert not dbos_journal.take_ahead("wf-once", 4, "owner-a")  # a retry checks itself
    dbos_journal.answer_ahead("wf-once", 6, "owner-a")
    assert not dbos_journal.take_ahead("wf-once", 6, "owner-b")  # a takeover's execution
    assert not dbos_journal.take_ahead("wf-once", 6, "owner-a")  # the wrong take used it up


def test_an_answer_lapses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dbos_journal, "AHEAD_S", 0.02)
    dbos_journal.answer_ahead("wf-lapse", 1, None)
    time.sleep(0.05)
    assert not dbos_journal.take_ahead("wf-lapse", 1, None)


def test_lapsed_answers_are_dropped_when_another_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dbos_journal, "AHEAD_S", 0.02)
    for i in range(50):
        dbos_journal.answer_ahead("wf-many", i, None)
    time.sleep(0.05)
    dbos_journal.answer_ahead("wf-fresh", 0, None)
    assert [key for key in dbos_journal._ahead if key[0] == "wf-many"] == []
    assert dbos_journal.take_ahead("wf-fresh", 0, None)
