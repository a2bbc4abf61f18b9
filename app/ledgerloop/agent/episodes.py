"""Typed child episodes: freedom inside the episode, determinism between episodes.

    proposal = await run_episode(run, agent, input, output=Remediation, budget=...)

An episode is a child DBOS workflow of the run's workflow. Inside it the model decides what
to read and in what order, with read tools only, and ends by answering one JSON object that
must validate as `output`; an answer that does not is sent back with the validation error and
the model tries again, inside the episode. Outside it nothing is left to the model: the
parent owns the budgets, gets a validated proposal (or a typed error), and decides whether
anything happens next: an approval and an effect, another episode, or nothing.

Budgets, all the parent's:

    turns              model turns in one pass
    passes             passes: a pass that spends its turns without an accepted answer is
                       followed by a fresh one (a new conversation from the same input)
    rejected_answers   answers that failed validation, counted over the whole episode (every
                       pass), not per pass: a per-pass cap would multiply by the passes
    the run's own      the run's model turns, tokens and deadline (agent.budgets): the child
                       is handed what the run has left and spends from it; it ends
                       (`run_iterations`, `run_tokens`) when that is gone, and the parent
                       counts the child's turns and tokens as its own (`run.spent`)

Steps, in the child workflow `{parent workflow id}.episode-{n}` (n counts the run's episodes):

    {name}.p{pass}.think-{i}    {name}.p{pass}.tool-{i}-{call_id}...

The child's id is derived from the parent's, and DBOS records it as a step of the parent: a
resumed parent attaches to the same child (waiting for it if it still runs elsewhere, or
reading its recorded result) and never starts a second one. The child's own steps are
journaled like any run's, so a child killed mid-way resumes at its first unrecorded turn and
no recorded model turn is asked again. Its result, the proposal, is recorded once, as the
child's output.
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, TypeVar

from dbos import DBOS, SetWorkflowID
from pydantic import BaseModel, ValidationError

from ledgerloop.agent.budgets import RunBudget, Spent
from ledgerloop.agent.context import RunContext, Thought
from ledgerloop.agent.definition import Agent, get_agent
from ledgerloop.agent.keep import forget_workflow
from ledgerloop.agent.primitives import call_read_tool, think
from ledgerloop.errors import ConfigError, LedgerloopError
from ledgerloop.fleet.guard import executing
from ledgerloop.telemetry.executions import count_tokens
from ledgerloop.tools.registry import ToolKind

M = TypeVar("M", bound=BaseModel)

EPISODE_WORKFLOW = "ledgerloop_episode"

BudgetName = Literal["turns", "passes", "rejected_answers", "run_iterations", "run_tokens"]


@dataclass(frozen=True)
class EpisodeBudget:
    """What an episode may spend; constants in the parent's code, not wishes in a prompt."""

    #: Model turns per pass (a turn is one model call: a tool turn or an answer).
    turns: int = 8
    #: Passes: a fresh conversation after a pass spent its turns without an accepted answer.
    passes: int = 1
    #: Answers that failed validation over the whole episode before it ends.
    rejected_answers: int = 2

    def __post_init__(self) -> None:
        for field, least in (("turns", 1), ("passes", 1), ("rejected_answers", 0)):
            value = getattr(self, field)
            if not isinstance(value, int) or value < least:
                raise ConfigError(
                    f"episode budget {field}={value!r}",
                    fix=f"give {field} as an integer of at least {least}",
                )


class EpisodeError(LedgerloopError):
    """The episode ended without a proposal."""

    def __init__(self, message: str, *, episode: str, reason: str, details: dict[str, Any]):
        super().__init__(message)
        #: The child workflow's id, and why it ended ("turns", "model_call_failed"...).
        self.episode = episode
        self.reason = reason
        self.details = details
        #: The run's turns and tokens the episode used (already counted in `run.spent`).
        self.spent = Spent.from_json(details.get("spent"))


class EpisodeBudgetExceeded(EpisodeError):
    """The episode spent one of its budgets without an accepted answer."""

    @property
    def budget(self) -> BudgetName:
        return self.reason  # type: ignore[return-value]


class EpisodeFailed(EpisodeError):
    """The episode could not go on: the model call failed, it answered nothing, or the run's
    deadline passed."""


# -- the parent's side -----------------------------------------------------------------


def read_only_problem(agent: Agent) -> str | None:
    """Why `agent` may not run an episode, or None."""
    for tool in agent.tools:
        if tool.kind is not ToolKind.READ:
            return (
                f"agent {agent.name!r} has the {tool.kind.value} tool {tool.name!r}, and an "
                "episode may only read"
            )
    if agent.mcp_servers:
        return (
            f"agent {agent.name!r} has MCP servers ({', '.join(agent.mcp_servers)}), whose "
            "tools may write, and an episode may only read"
        )
    return None


def _model_path(output: type[BaseModel]) -> str:
    if not (isinstance(output, type) and issubclass(output, BaseModel)):
        raise ConfigError(
            f"run_episode output={output!r} is not a pydantic model class",
            fix="pass output=YourModel, a subclass of pydantic.BaseModel",
        )
    path = f"{output.__module__}:{output.__qualname__}"
    if "<locals>" in output.__qualname__ or _import_model(path) is not output:
        raise ConfigError(
            f"output model {output.__qualname__} is not importable as {path}",
            fix="define the output model at module level, so a resumed episode finds it",
        )
    return path


def _import_model(path: str) -> type[BaseModel] | None:
    module_name, _, qualname = path.partition(":")
    try:
        value: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError):
        return None
    return value if isinstance(value, type) and issubclass(value, BaseModel) else None


async def run_episode(
    run: RunContext,
    agent: Agent,
    input: dict[str, Any],
    *,
    output: type[M],
    budget: EpisodeBudget | None = None,
    name: str | None = None,
) -> M:
    """Run `agent` as a child episode of `run` and return its validated proposal.

    Workflow code (call it from an orchestration, like the other primitives). `agent` must be
    registered and have read tools only. Raises EpisodeBudgetExceeded or EpisodeFailed when
    the episode ends without a proposal; both are EpisodeError, for the parent to handle.
    """
    problem = read_only_problem(agent)
    if problem is not None:
        raise ConfigError(
            problem,
            fix="give the episode an agent with read tools only (file_tools(root), "
            "@read_tool) and apply its proposal in the parent (wait_for_approval, "
            "write_effect)",
        )
    if get_agent(agent.name) is not agent:
        raise ConfigError(
            f"agent {agent.name!r} is not registered",
            fix="register it with register_agent() in a module of LEDGERLOOP_AGENT_MODULES",
        )
    model_path = _model_path(output)
    parent = DBOS.workflow_id
    if parent is None:
        raise ConfigError(
            "run_episode was called outside a workflow",
            fix="call it from an orchestration (@orchestration) or another DBOS workflow",
        )
    number = run.episodes
    run.episodes += 1
    spec = {
        "run_id": run.run_id,
        "tenant_id": run.tenant_id,
        "conversation_id": run.conversation_id,
        "deadline": run.deadline,
        "now": run.now,
        "agent": agent.name,
        "name": name or agent.name,
        "input": input,
        "output": model_path,
        "budget": asdict(budget or EpisodeBudget()),
        # What the run has left: the child spends from the run's budgets, not beside them.
        "run_budget": run.budget.left(run.spent).as_json(),
    }
    with SetWorkflowID(f"{parent}.episode-{number}"):
        handle = await DBOS.start_workflow_async(episode_workflow, spec)
    result: dict[str, Any] = await handle.get_result()
    # The child's turns and tokens are the run's (a child from before it reported them:
    # none, as that run counted then).
    run.spent.add(Spent.from_json(result.get("spent")))
    count_tokens(result.get("spent"))  # and in the run's totals on its root span
    if "ended" in result:
        ended = result["ended"]
        kind = EpisodeBudgetExceeded if ended["budget"] else EpisodeFailed
        details = {**ended, "spent": result.get("spent")}
        raise kind(
            ended["message"], episode=result["episode"], reason=ended["reason"], details=details
        )
    run.now = max(run.now, result["now"])
    return output.model_validate(result["output"])


# -- the child's side ------------------------------------------------------------------


@DBOS.workflow(name=EPISODE_WORKFLOW)
async def episode_workflow(spec: dict[str, Any]) -> dict[str, Any]:
    # Known to the fence like a run's execution (a child resumed on its own runs here).
    with executing():
        try:
            return await _passes(spec)
        finally:
            forget_workflow(str(DBOS.workflow_id))  # what its steps kept (agent.keep)


async def _passes(spec: dict[str, Any]) -> dict[str, Any]:
    agent = get_agent(spec["agent"])
    output = _import_model(spec["output"])
    if agent is None or output is None:
        missing = spec["agent"] if agent is None else spec["output"]
        raise LookupError(f"episode {DBOS.workflow_id}: {missing} is not loaded in this worker")
    budget = EpisodeBudget(**spec["budget"])
    base = RunContext(
        run_id=spec["run_id"],
        agent=agent,
        tenant_id=spec["tenant_id"],
        conversation_id=spec["conversation_id"],
        deadline=spec["deadline"],
        now=spec["now"],
        messages=[],
        # What the run had left when the parent started it (a spec from before: no cap).
        budget=RunBudget.from_json(spec.get("run_budget")),
    )
    first = agent.user_message(spec["input"])
    instructions = answer_instructions(output)
    rejected = 0
    turns = 0
    ended = _Ending(str(DBOS.workflow_id), budget, base)
    for number in range(budget.passes):
        note = "" if number == 0 else f"\n\n{_pass_note(number, budget)}"
        run = replace(
            base,
            scope=f"{spec['name']}.p{number}.",
            messages=[{"role": "user", "content": _with_text(first, instructions + note)}],
        )
        for i in range(budget.turns):
            if run.now > run.deadline:
                return ended.failed("deadline_exceeded", "the run's deadline passed", turns)
            spent_out = base.budget.exhausted(base.spent)
            if spent_out is not None:
                which: BudgetName = "run_iterations" if spent_out == "iterations" else "run_tokens"
                return ended.exceeded(which, turns)
            thought = await think(run, i)
            base.now = run.now
            turns += 1
            if thought.error is not None:
                return ended.failed("model_call_failed", json.dumps(thought.error), turns)
            if thought.empty:
                return ended.failed("empty_turn", "the model answered nothing", turns)
            calls = thought.tool_calls
            if not calls:
                problem, value = validate_answer(output, thought)
                if value is not None:
                    return {
                        "episode": ended.episode,
                        "output": value,
                        "turns": turns,
                        "passes": number + 1,
                        "rejected_answers": rejected,
                        "now": run.now,
                        "spent": base.spent.as_json(),
                    }
                rejected += 1
                if rejected > budget.rejected_answers:
                    return ended.exceeded("rejected_answers", turns, last_problem=problem)
                feedback = (
                    f"Your answer was rejected: {problem}\n"
                    "Answer again with only one JSON object that matches the schema."
                )
                run.messages += [thought.message(), {"role": "user", "content": feedback}]
                continue
            results = [await call_read_tool(run, i, call) for call in calls]
            run.messages += [thought.message(), {"role": "user", "content": results}]
    return ended.exceeded("turns" if budget.passes == 1 else "passes", turns)


@dataclass(frozen=True)
class _Ending:
    episode: str
    budget: EpisodeBudget
    #: The child's view of the run: its budget (what the run had left) and what it spent.
    run: RunContext

    def exceeded(self, which: BudgetName, turns: int, **extra: Any) -> dict[str, Any]:
        b = self.budget
        left = self.run.budget
        message = {
            "turns": f"used all {b.turns} turns without an accepted answer",
            "passes": f"used all {b.passes} passes of {b.turns} turns without an accepted answer",
            "rejected_answers": f"had more than {b.rejected_answers} answers rejected",
            "run_iterations": f"used the {left.iterations} model turns the run had left",
            "run_tokens": f"used the {left.tokens} tokens the run had left",
        }[which]
        return self._ended(which, f"episode {self.episode} {message}", turns, True, extra)

    def failed(self, reason: str, why: str, turns: int) -> dict[str, Any]:
        message = f"episode {self.episode} failed ({reason}): {why}"
        return self._ended(reason, message, turns, False, {})

    def _ended(
        self, reason: str, message: str, turns: int, budget: bool, extra: dict[str, Any]
    ) -> dict[str, Any]:
        ended = {"reason": reason, "message": message, "budget": budget, "turns": turns, **extra}
        return {"episode": self.episode, "ended": ended, "spent": self.run.spent.as_json()}


def answer_instructions(output: type[BaseModel]) -> str:
    """What the model is told about its final answer (after the input)."""
    schema = json.dumps(output.model_json_schema(), sort_keys=True)
    return (
        "When you have what you need, answer with only one JSON object (no other text) that "
        f"matches this JSON schema:\n{schema}"
    )


def _pass_note(number: int, budget: EpisodeBudget) -> str:
    return (
        f"This is pass {number + 1} of {budget.passes}: an earlier pass used its "
        f"{budget.turns} turns without an accepted answer. Read less and answer sooner."
    )


def _with_text(content: str | list[dict[str, Any]], text: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return f"{content}\n\n{text}"
    return [*content, {"type": "text", "text": text}]


_FENCED = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def validate_answer(output: type[BaseModel], thought: Thought) -> tuple[str, Any]:
    """(why the answer is rejected, None), or ("", the proposal as JSON)."""
    text = thought.text.strip()
    fenced = _FENCED.search(text)
    if fenced:
        text = fenced.group(1).strip()
    elif "{" in text and "}" in text:
        # Prose around the object is forgiven; the object itself must validate.
        text = text[text.index("{") : text.rindex("}") + 1]
    try:
        value = output.model_validate_json(text)
    except ValidationError as exc:
        return _describe(exc), None
    return "", value.model_dump(mode="json")


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False):
        if error["type"] == "json_invalid":
            problems.append("the answer is not a JSON object")
            continue
        where = ".".join(str(p) for p in error["loc"]) or "the answer"
        problems.append(f"{where}: {error['msg']}")
    return "; ".join(problems)
