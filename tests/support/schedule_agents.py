"""An agent with a schedule that ticks every second, for the fleet schedule test."""

from __future__ import annotations

from ledgerloop import Agent, Schedule, register_agent

TICKER = register_agent(
    Agent(
        name="ticker",
        system="Say done.",
        tools=(),
        schedules=(Schedule("every-second", "* * * * * *", {"message": "tick"}),),
    )
)
