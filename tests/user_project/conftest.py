"""The project's own fixtures: the conversation its crash tests drive."""

from __future__ import annotations

from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "refund_conversation.yaml"


@pytest.fixture
def conversation() -> Path:
    return SCRIPT
