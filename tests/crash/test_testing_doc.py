"""docs/testing.md's tests run as the tests they are, so the page cannot say one thing while
the plugin does another (it once did: its approval-abuse excerpt, run in order on one
approval, got other answers than it stated, and waited 60 s for an expiry 8 hours away).

The page's Python blocks, in order, make one test module, as a reader pasting them into a
file would get. Its tests run in the project they are written for, tests/user_project/ (the
`refunds` agent, its scripts and policies): a relative script or policy name is looked up
there, and the worker imports the agent from there. A parametrized test runs once, with the
last boundary of its matrix; tests/user_project/ runs the whole matrices. Every boundary
`crash_matrix()` can return must be in the page's table, with its fault points.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ledgerloop.testing.crash import crash_matrix
from tests.conftest import REPO
from tests.support.payments_fake import PaymentsFake

pytestmark = pytest.mark.crash

DOC = REPO / "docs" / "testing.md"
PROJECT = REPO / "tests" / "user_project"
PYTHON_BLOCK = re.compile(r"^```python\n(?P<body>.*?)^```", re.DOTALL | re.MULTILINE)


def _doc_module() -> dict[str, Any]:
    text = DOC.read_text()
    namespace: dict[str, Any] = {"__name__": "testing_doc"}
    for match in PYTHON_BLOCK.finditer(text):
        line = text.count("\n", 0, match.start("body")) + 1
        code = compile(match["body"], f"{DOC}:{line}", "exec")
        exec(code, namespace)  # noqa: S102 - the page's own code, run as a reader would
    return namespace


MODULE = _doc_module()
TESTS = sorted(name for name in MODULE if name.startswith("test_") and callable(MODULE[name]))


def test_the_page_has_its_tests() -> None:
    # Against a pattern that finds nothing: the page shows a matrix, one process,
    # compensation, a downstream of the user's own and the three approval abuses.
    assert len(TESTS) == 7, TESTS


@pytest.fixture
def payments_fake() -> Iterator[PaymentsFake]:
    """What the page's "Your own downstream" calls the project's own fixture."""
    fake = PaymentsFake().start()
    yield fake
    fake.stop()


def _in_project(make: Callable[..., Any]) -> Callable[..., Any]:
    """`ledgerloop_crash` as tests/user_project/'s own tests get it: names relative to that
    project, its agent module (what its pytest.ini would say)."""

    def made(
        *, script: Any, policy_file: str = "policy.yaml", agent_modules: Any = None, **kw: Any
    ) -> Any:
        return make(
            script=PROJECT / script if isinstance(script, str) else script,
            policy_file=PROJECT / policy_file,
            agent_modules=agent_modules or ["refunds"],
            **kw,
        )

    return made


@pytest.mark.parametrize("name", TESTS)
def test_the_pages_test_passes(
    name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    test = MODULE[name]
    arguments: dict[str, Any] = {}
    for mark in getattr(test, "pytestmark", []):
        if mark.name == "parametrize":
            argname, values = mark.args[0], list(mark.args[1])
            arguments[argname] = values[-1]
    # The worker imports the project's agent as the project's own run would: from its root.
    pythonpath = [str(PROJECT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(pythonpath))
    for parameter in inspect.signature(test).parameters:
        if parameter in arguments:
            continue
        value = request.getfixturevalue(parameter)
        arguments[parameter] = _in_project(value) if parameter == "ledgerloop_crash" else value
    test(**arguments)


def _table() -> str:
    text = DOC.read_text()
    start = text.index("## The boundaries")
    return text[start : text.index("\n## ", start + 1)]


def test_every_boundary_is_in_the_table_with_its_fault_points() -> None:
    table = _table()
    every = crash_matrix(
        approval=True, compensation=True, reads=True, model_call=True, steps=["think-0"]
    )
    for boundary in every:
        if boundary.fault and boundary.fault.startswith("step.after:"):
            assert "| after step *name*" in table
            assert "`step.after:{name}`" in table
            continue
        name = re.sub(r" \((worker|relay)\)$", "", boundary.name)
        assert f"| {name}" in table, f"{name!r} is not in the table of docs/testing.md"
        for fault in filter(None, (boundary.fault or "").split(",")):
            assert f"`{fault}`" in table, f"{boundary}: fault point {fault} is not in the table"
