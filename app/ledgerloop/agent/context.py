"""What the durable primitives pass around: the run's context and the outcomes of its steps.

Plain data with no behaviour that touches the database, so the step orchestrations (the
primitives, the sandbox path) can all share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ledgerloop.agent.budgets import RunBudget, Spent
from ledgerloop.agent.definition import Agent
from ledgerloop.runs.states import RunStatus

Message = dict[str, Any]


@dataclass
class RunContext:
    """One run as its workflow sees it: who it is for, its conversation, what it may undo."""

    run_id: str
    agent: Agent
    tenant_id: str
    conversation_id: str
    #: Epoch seconds after which the run fails with deadline_exceeded.
    deadline: float
    #: The latest journaled time (moved by think and memory_save); never the wall clock.
    now: float
    #: The conversation so far, as the model sees it.
    messages: list[Message]
    #: How many of this run's messages are in memory already, and those that are not yet.
    saved: int = 0
    unsaved: list[Message] = field(default_factory=list)
    #: Succeeded effects with a compensating action, undone if the run fails or is cancelled.
    compensable: list[dict[str, Any]] = field(default_factory=list)
    #: Sandboxes by tool: live ({"sandbox_id"}) or saved while the run waited ({"snapshot_id"}).
    sandboxes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: MCP tools this run discovered (its `mcp-discover` step), by name, and their schemas.
    mcp_tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    mcp_schemas: list[dict[str, Any]] = field(default_factory=list)
    #: The identity of the run's first execution (a resumed execution rebuilds its trace).
    trace: dict[str, Any] = field(default_factory=dict)
    #: When the run was created (ns since the epoch), for the run's root span.
    created_ns: int | None = None
    #: The run's status as this workflow last moved it. A think after a write turn (the run
    #: is executing, or was reconciling) moves it back to planning inside its own step.
    status: str = "planning"
    #: Prefixed to every step name; "" for the run's own agent, so names are `think-{i}`...
    #: A second agent in the same workflow takes its own scope (see `with_agent`).
    scope: str = ""
    #: Child episodes this workflow has started (run_episode): the next one's id suffix.
    episodes: int = 0
    #: The built-in loop runs a turn's read tools inside the next think step (one step per
    #: tool turn, not two). Set from the run's journaled memory-load, so a run that began
    #: under the older loop replays and finishes with a step per read.
    reads_in_think: bool = False
    #: Likewise for a turn's plain writes (agent.turn_tools), for runs begun under this loop.
    writes_in_think: bool = False
    #: The run's budgets (model turns, tokens), journaled by memory-load; a child episode's
    #: is what its parent had left (agent.budgets).
    budget: RunBudget = field(default_factory=RunBudget)
    #: What the run has spent of them: every think of every agent of the run, and every
    #: child episode's turns and tokens once it returns. One object, shared by `with_agent`.
    spent: Spent = field(default_factory=Spent)
    #: Ids of the messages people sent the run that it took (agent.messages), from journaled
    #: step results; shared by `with_agent` (they are the run's).
    messages_taken: list[str] = field(default_factory=list)
    #: `wait_for_message` calls so far: the next one's step-name suffix.
    message_waits: int = 0

    def with_agent(self, agent: Agent, scope: str, messages: list[Message]) -> RunContext:
        """Another agent's view of this run: its own conversation and step-name scope; the
        same run, deadline, budgets (and what is spent of them), compensations and sandboxes.
        Save its messages with memory_save if they should outlive the run's workflow."""
        return replace(
            self,
            agent=agent,
            scope=scope,
            messages=list(messages),
            unsaved=[],
            # Its MCP servers are its own: `discover_mcp` lists them in its scope.
            mcp_tools={},
            mcp_schemas=[],
        )


@dataclass(frozen=True)
class Ended:
    """memory_load found the run already in a terminal status (a replay after its end)."""

    status: str


@dataclass(frozen=True)
class Stop:
    """The run must end: hand it to `finish`."""

    status: RunStatus
    reason: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Thought:
    """One turn of the model: its content, or why there is none."""

    content: list[dict[str, Any]]
    #: The model call failed (an error dict), or every tier answered with an empty turn.
    error: dict[str, Any] | None = None
    empty: bool = False
    #: 1 when the agent's own tier answered with an empty turn, else 0.
    empty_turns: int = 0
    #: The think step saved this answer and ended the run (think(..., save_answer=True)).
    saved: bool = False
    #: The previous turn's calls, run by this think, ended the run (a write's wait did).
    stop: Stop | None = None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return [b for b in self.content if b.get("type") == "tool_use"]

    @property
    def text(self) -> str:
        return "".join(b.get("text", "") for b in self.content if b.get("type") == "text")

    def message(self) -> Message:
        return {"role": "assistant", "content": self.content}


@dataclass(frozen=True)
class Approved:
    """This exact action (its hash) may run: a person approved it through `approval_id`, or
    (no approval id) the policy's condition did not ask for a person for these arguments."""

    action_hash: str
    approval_id: str | None = None
