"""The durable agent loop: think, act, wait and memory steps on DBOS."""
