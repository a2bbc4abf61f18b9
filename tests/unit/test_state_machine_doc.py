"""docs/state_machine.md must draw exactly the code's transition table."""

from __future__ import annotations

import re
from pathlib import Path

from ledgerloop.runs.states import TRANSITIONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "state_machine.md"


def _edges_in_doc() -> set[tuple[str, str]]:
    text = DOC.read_text()
    block = re.search(r"```mermaid\n(.*?)```", text, re.S)
    assert block, "docs/state_machine.md has no mermaid block"
    edges = set()
    for line in block.group(1).splitlines():
        match = re.fullmatch(r"\s*(\w+)\s*-->\s*(\w+)\s*(?::.*)?", line)
        if match and "[*]" not in line:
            edges.add((match.group(1), match.group(2)))
    return edges


def test_doc_diagram_matches_transition_table() -> None:
    in_code = {(a.value, b.value) for a, targets in TRANSITIONS.items() for b in targets}
    in_doc = _edges_in_doc()
    assert in_doc - in_code == set(), "edges drawn in the doc but not allowed by the code"
    assert in_code - in_doc == set(), "edges allowed by the code but missing from the doc"


def test_doc_marks_exactly_the_terminal_states() -> None:
    text = DOC.read_text()
    finals = set(re.findall(r"^\s*(\w+) --> \[\*\]", text, re.M))
    assert finals == {a.value for a, targets in TRANSITIONS.items() if not targets}
