"""ledgerloop.client's typed events and TextSoFar: a step's text starts over on a new attempt."""

from __future__ import annotations

from ledgerloop.client import Event, SseParser, TextSoFar


def delta(step: str, attempt: int, text: str) -> Event:
    return Event(None, "text.delta", {"step": step, "attempt": attempt, "seq": 0, "text": text})


def test_text_so_far_drops_the_partial_text_of_an_earlier_attempt() -> None:
    texts = TextSoFar()
    assert texts.add(delta("think-0", 1, "Hel")) is False
    assert texts.add(delta("think-0", 1, "lo")) is False
    assert texts.text("think-0") == "Hello"
    assert texts.add(delta("think-0", 2, "Hi")) is True  # ran again: start over
    assert texts.add(delta("think-0", 1, "late")) is False  # the old attempt's: ignored
    assert texts.add(delta("think-0", 2, " there")) is False
    assert texts.text("think-0") == "Hi there"
    assert texts.add(Event(3, "step.finished", {"payload": {"step": "think-0"}})) is False
    assert texts.text("think-1") == ""


def test_events_are_typed() -> None:
    parser = SseParser()
    lines = [
        "id: 4",
        "event: step.finished",
        'data: {"step": null, "payload": {"step": "think-0", "error": false}}',
        "",
        "event: text.delta",
        'data: {"step": "think-1", "attempt": 2, "seq": 5, "text": "ok"}',
        "",
    ]
    events = [e for e in (parser.feed(line) for line in lines) if e is not None]
    finished, text = events
    assert (finished.durable, finished.step, finished.attempt, finished.text) == (
        True,
        "think-0",
        None,
        "",
    )
    assert (text.durable, text.step, text.attempt, text.text) == (False, "think-1", 2, "ok")
