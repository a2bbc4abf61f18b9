"""Bare DBOS for the restart benchmark: the same job (one model call through the same SDK,
then done) as a DBOS workflow with one async step, no Ledgerloop.

    python -m scripts.benchmarks.restart_bare start DATABASE_URL MODEL_URL N
        starts N workflows, each waiting in its model call, and waits to be killed;
    python -m scripts.benchmarks.restart_bare recover DATABASE_URL MODEL_URL
        launches DBOS under the same executor id: DBOS recovers the dead process's workflows
        at launch, each calls the model again and finishes; runs until terminated.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import anthropic
from dbos import DBOS, DBOSPortableJSONSerializer

_CLIENT: anthropic.AsyncAnthropic | None = None


async def _think(text: str) -> str:
    assert _CLIENT is not None
    message = await _CLIENT.messages.create(
        model="claude-haiku-4-5",
        max_tokens=512,
        system="You look things up.",
        messages=[{"role": "user", "content": text}],
    )
    return "".join(b.text for b in message.content if b.type == "text")


@DBOS.workflow(name="bench_bare_restart")
async def bench_bare_restart(text: str) -> str:
    answer: str = await DBOS.run_step_async({"name": "think-0"}, _think, text)
    return answer


def _config(url: str) -> dict[str, Any]:
    return {
        "name": "bench_bare_restart",
        "system_database_url": url,
        "application_version": "bench-bare-restart",
        "executor_id": "bench-bare-restart",
        "serializer": DBOSPortableJSONSerializer(),
        "run_migrations": False,
        "db_engine_kwargs": {"pool_pre_ping": False},
        "log_level": "WARNING",
    }


async def _main(mode: str, url: str, model_url: str, n: int) -> None:
    global _CLIENT
    _CLIENT = anthropic.AsyncAnthropic(
        api_key="scripted-model", base_url=model_url, max_retries=0, timeout=900
    )
    DBOS(config=_config(url))  # type: ignore[arg-type]
    DBOS.launch()  # "recover": DBOS resumes this executor's pending workflows here
    if mode == "start":
        for i in range(n):
            await DBOS.start_workflow_async(bench_bare_restart, f"run {i}")
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    mode, url, model_url = sys.argv[1:4]
    asyncio.run(_main(mode, url, model_url, int(sys.argv[4]) if len(sys.argv) > 4 else 0))
