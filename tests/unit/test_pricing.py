"""The model price table: exact and family entries, unpriced models, bad configuration."""

from __future__ import annotations

import pytest

from ledgerloop.config import load_settings
from ledgerloop.errors import ConfigError
from ledgerloop.pricing import ModelPrice, cost_usd, price_for

PRICES = {
    "claude-haiku-4-5": ModelPrice(input_per_mtok=1, output_per_mtok=5),
    "claude-haiku-4-5-fast": ModelPrice(input_per_mtok=2, output_per_mtok=10),
}


def test_a_dated_model_takes_the_longest_family_entry() -> None:
    assert price_for(PRICES, "claude-haiku-4-5") == PRICES["claude-haiku-4-5"]
    assert price_for(PRICES, "claude-haiku-4-5-20251001") == PRICES["claude-haiku-4-5"]
    assert price_for(PRICES, "claude-haiku-4-5-fast-20251001") == PRICES["claude-haiku-4-5-fast"]
    assert price_for(PRICES, "claude-haiku-4-50") is None  # not a family member
    assert cost_usd(PRICES, "claude-haiku-4-5-1", 2_000_000, 100_000) == pytest.approx(2.5)
    assert cost_usd(PRICES, "other", 10, 10) is None
    assert cost_usd(PRICES, None, 10, 10) is None


def test_the_table_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "LEDGERLOOP_MODEL_PRICES", '{"m": {"input_per_mtok": 3, "output_per_mtok": 15}}'
    )
    assert load_settings().model_prices == {"m": ModelPrice(input_per_mtok=3, output_per_mtok=15)}
    monkeypatch.setenv("LEDGERLOOP_MODEL_PRICES", '{"m": {"input_per_mtok": -1}}')
    with pytest.raises(ConfigError, match="invalid setting model_prices"):
        load_settings()
