"""docs/benchmarks.md is generated from docs/benchmarks/*.json (scripts/benchmarks/report.py):
it must be exactly what the generator makes of the committed files, so nobody edits it by
hand, and every committed file must have the keys a bench's `publish` writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.benchmarks import report
from scripts.benchmarks.results import (
    COMMITTED,
    KEYS,
    REPORTED,
    RESULTS_ENV,
    SMOKE_ENV,
    Baseline,
    Figure,
    load,
    publish,
    reported,
)


def test_page_is_generated_from_the_json() -> None:
    expected = report.render()
    actual = report.PAGE.read_text()
    assert actual == expected, (
        "docs/benchmarks.md differs from its JSON: run scripts/bench --report"
    )
    assert len(actual.splitlines()) < 300


def test_every_committed_result_is_well_formed() -> None:
    paths = sorted(COMMITTED.glob("*.json"))
    assert paths, "no results in docs/benchmarks/"
    for path in paths:
        data = json.loads(path.read_text())
        assert set(KEYS) <= set(data), path
        result = load(path)
        assert result.bench == path.stem
        assert result.command.startswith(("scripts/bench ", "BENCH_")), result.command
        assert result.figures, path
        for figure in result.figures:
            assert figure.name, path
            assert figure.value is not None or figure.note, (path, figure)


def test_a_changed_figure_changes_the_page(tmp_path: Path) -> None:
    for path in COMMITTED.glob("*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    data = json.loads((tmp_path / "turn.json").read_text())
    data["figures"][0]["value"] = 123.456
    (tmp_path / "turn.json").write_text(json.dumps(data))
    page = report.render(tmp_path)
    assert page != report.render()
    assert "| 123.5x |" in page


def test_a_smoke_run_never_writes_the_committed_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SMOKE_ENV, "1")
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    with pytest.raises(RuntimeError, match=RESULTS_ENV):
        publish("bench_x", "Doc.", Baseline("none"), [Figure("f", 1.0)])


def test_a_printed_row_becomes_a_figure_with_its_unit_and_ratio() -> None:
    before = len(REPORTED)
    reported(
        "t", [("p50 (ms)", 1.23456, "1.5x the raw"), ("statements/s (BEGIN left out)", 4.0, "")]
    )
    first, second = REPORTED[before:]
    del REPORTED[before:]
    assert first == Figure("t: p50", 1.235, "ms", 1.5, "1.5x the raw")
    assert (second.name, second.unit, second.ratio) == (
        "t: statements/s (BEGIN left out)",
        "",
        None,
    )
