"""The `turn` bench's job on LangGraph with PostgresSaver (installed by the `bench` extra).

A two-node graph (think -> tools -> think ... -> end) checkpointed after every node by
AsyncPostgresSaver, calling the same scripted model through the same SDK and the same tool
function as the other systems. Importing this module fails without the extra; the bench then
leaves LangGraph out.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypedDict

import anthropic
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg import AsyncConnection
from psycopg.rows import dict_row


class _State(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]


def langgraph_system(
    url: str,
    model_url: str,
    system: str,
    max_tokens: int,
    tools: list[Any],
    lookup: Callable[[str], str],
) -> Callable[[int], Awaitable[None]]:
    client = anthropic.AsyncAnthropic(base_url=model_url, api_key="bench", max_retries=0)
    graph: Any = None

    async def think(state: _State) -> dict[str, Any]:
        message = await client.messages.create(
            model="claude-haiku-4-5",
            max_tokens=max_tokens,
            system=system,
            messages=state["messages"],  # type: ignore[arg-type]
            tools=tools,
        )
        content = [b.model_dump(mode="json") for b in message.content]
        return {"messages": [{"role": "assistant", "content": content}]}

    async def act(state: _State) -> dict[str, Any]:
        calls = [b for b in state["messages"][-1]["content"] if b["type"] == "tool_use"]
        results = [
            {"type": "tool_result", "tool_use_id": c["id"], "content": lookup(c["input"]["key"])}
            for c in calls
        ]
        return {"messages": [{"role": "user", "content": results}]}

    def route(state: _State) -> str:
        last = state["messages"][-1]["content"]
        return "tools" if any(b["type"] == "tool_use" for b in last) else END

    async def build() -> Any:
        conn = await AsyncConnection.connect(
            url, autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
        saver = AsyncPostgresSaver(conn)  # type: ignore[arg-type,unused-ignore]
        await saver.setup()
        builder = StateGraph(_State)
        builder.add_node("think", think)
        builder.add_node("tools", act)
        builder.add_edge(START, "think")
        builder.add_conditional_edges("think", route, ["tools", END])
        builder.add_edge("tools", "think")
        return builder.compile(checkpointer=saver)

    async def go(n: int) -> None:
        nonlocal graph
        if graph is None:
            graph = await build()
        for _ in range(n):
            first = {"role": "user", "content": f"bench {uuid.uuid4()}"}
            config = {"configurable": {"thread_id": str(uuid.uuid4())}}
            out = await graph.ainvoke({"messages": [first]}, config)
            answer = out["messages"][-1]["content"][0].get("text")
            assert answer == "done", answer

    return go
