"""A worker's model calls spread over several connection pools, and a lone run keeps one.

Real SDK, real HTTP to the scripted Messages API server.
"""

from __future__ import annotations

import asyncio

import anthropic
import pytest

from ledgerloop.config import load_settings
from ledgerloop.models.client import HTTP_POOLS, make_model_client
from ledgerloop.models.script import parse_script
from ledgerloop.models.scripted_server import ScriptedModelServer

REQUEST = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def test_calls_one_at_a_time_share_one_pool() -> None:
    script = parse_script("default: {turns: [{text: a}]}")
    with ScriptedModelServer(script) as server:
        model = make_model_client(load_settings(anthropic_base_url=server.url))

        async def calls() -> None:
            try:
                for _ in range(5):
                    await model.create(**REQUEST)
                assert model.pools_open() == 1
                # A bare baseline's direct SDK calls go through that same client.
                await model.sdk().messages.create(**REQUEST)
                assert model.pools_open() == 1
            finally:
                await model.close()

        asyncio.run(calls())
    assert len(server.requests()) == 6


def test_concurrent_calls_spread_evenly_over_the_pools() -> None:
    script = parse_script("default: {turns: [{text: a, delay_ms: 400}]}")
    calls = 3 * HTTP_POOLS
    with ScriptedModelServer(script) as server:
        model = make_model_client(load_settings(anthropic_base_url=server.url))
        seen: list[list[int]] = []

        async def run() -> None:
            try:
                tasks = [asyncio.create_task(model.create(**REQUEST)) for _ in range(calls)]
                # Every call is under way once the server has them all (each waits 400 ms).
                for _ in range(200):
                    if len(server.requests()) == calls or sum(model.in_flight()) == calls:
                        break
                    await asyncio.sleep(0.01)
                seen.append(model.in_flight())
                await asyncio.gather(*tasks)
                seen.append(model.in_flight())
            finally:
                await model.close()

        asyncio.run(run())
    during, after = seen
    assert during == [3] * HTTP_POOLS
    assert after == [0] * HTTP_POOLS


def test_a_failed_call_leaves_its_pool() -> None:
    script = parse_script("default: {turns: [{status: 500}]}")
    with ScriptedModelServer(script) as server:
        model = make_model_client(load_settings(anthropic_base_url=server.url))

        async def run() -> None:
            try:
                with pytest.raises(anthropic.InternalServerError):
                    await model.create(**REQUEST)
                assert model.in_flight() == [0] * HTTP_POOLS
            finally:
                await model.close()

        asyncio.run(run())
