"""Live runs: a run's durable events and its model's text, streamed to subscribers.

`source` is where notifications come from (one LISTEN per process); `hub` fans them out to
the subscribers of each run in this process; `feed` reads the durable record. The HTTP
route (http/routes_events.py) turns a subscription into Server-Sent Events. docs/streaming.md
describes the format and the guarantees.
"""
