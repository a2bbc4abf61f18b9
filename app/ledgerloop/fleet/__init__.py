"""Running many workers on one database: liveness and takeover, the step fence, dispatch,
and what operators read about the fleet."""
