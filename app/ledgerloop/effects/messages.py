"""The vocabulary shared by the ledger, the relay, the reconciler and the agent loop.

`EffectMessage` is the contract with a waiting workflow: the workflow whose id is the run id
waits in `DBOS.recv_async(topic=idempotency_key)` and receives this JSON object (DBOS's portable
JSON, so a dict) each time its effect reaches a status in `REPORTED`. `outcome_unknown` is not
final: the reconciler settles it later and the workflow hears again on the same topic.

`DeliveryRequest` is what an outbox row asks the relay to do and tells the reconciler how the
destination behaves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypedDict

from ledgerloop.effects.errors import InvalidDeliveryRequest


class EffectStatus(StrEnum):
    PENDING = "pending"
    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    OUTCOME_UNKNOWN = "outcome_unknown"
    NEEDS_HUMAN = "needs_human"


class OutboxStatus(StrEnum):
    PENDING = "pending"
    CLAIMED = "claimed"
    DONE = "done"  # delivered, or settled with an answer from the destination
    DEAD = "dead"  # closed without a delivery: unknown destination, retries exhausted


#: The statuses a waiting workflow is told about, in the transaction that records them.
REPORTED: frozenset[EffectStatus] = frozenset(
    {
        EffectStatus.SUCCEEDED,
        EffectStatus.FAILED,
        EffectStatus.OUTCOME_UNKNOWN,
        EffectStatus.NEEDS_HUMAN,
    }
)
#: Statuses no automatic process moves on from (needs_human waits for a person).
FINAL: frozenset[EffectStatus] = frozenset({EffectStatus.SUCCEEDED, EffectStatus.FAILED})


class EffectMessage(TypedDict):
    """What `DBOS.recv_async(topic=key)` returns to the run's workflow."""

    key: str
    status: str  # an EffectStatus value in REPORTED
    result: Any  # the destination's JSON answer on success, else usually None
    error: str | None
    external_reference: str | None


def message_id(key: str, status: str, attempts: int) -> str:
    """The id dbos.send_message deduplicates on (the migration's trigger builds the same)."""
    return f"{key}:{status}:{attempts}"


def parse_message(value: Any) -> EffectMessage:
    """Check a received message has the contract's shape; raises ValueError otherwise."""
    if not isinstance(value, dict) or not {"key", "status"} <= value.keys():
        raise ValueError(f"not an effect message: {value!r}")
    if value["status"] not in REPORTED:
        raise ValueError(f"effect message with unreported status {value['status']!r}")
    return EffectMessage(
        key=str(value["key"]),
        status=str(value["status"]),
        result=value.get("result"),
        error=value.get("error"),
        external_reference=value.get("external_reference"),
    )


@dataclass(frozen=True)
class DeliveryRequest:
    """One HTTP call to a named destination, and the policy that governs retrying it.

    `honours_idempotency`: the destination returns the original result for a repeated
    `idempotency_header`, so a resend with the same key is always safe. `lookup_path`: a
    template with `{key}` that answers 200 (found) or 404 (nothing was created with the key).
    With neither, an unknown outcome can only be settled by a person.
    """

    path: str = ""
    method: str = "POST"
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    idempotency_header: str = "Idempotency-Key"
    honours_idempotency: bool = False
    lookup_path: str | None = None
    timeout_ms: int = 10_000
    max_attempts: int = 3
    deadline_s: float = 300.0
    #: An MCP write: the tool to call on the destination (an MCP server), with `body` as its
    #: arguments and the key in `_meta` under `idempotency_header`; `path` and `method` unused.
    mcp_tool: str | None = None
    #: An MCP read tool answering what a key created (the reconciler's lookup).
    mcp_lookup_tool: str | None = None
    #: W3C traceparent of the span that recorded the effect (its execute_tool span): the
    #: relay's and reconciler's spans join the run's trace and link to it.
    traceparent: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.mcp_tool is None and not self.path.startswith("/"):
            problems.append(f"path must start with '/', not {self.path!r}")
        if self.method.upper() not in {"POST", "PUT", "PATCH", "DELETE"}:
            problems.append(f"method must be POST, PUT, PATCH or DELETE, not {self.method!r}")
        if self.lookup_path is not None and (
            not self.lookup_path.startswith("/") or "{key}" not in self.lookup_path
        ):
            problems.append(
                f"lookup_path must start with '/' and contain {{key}}: {self.lookup_path!r}"
            )
        if not self.idempotency_header:
            problems.append("idempotency_header must not be empty")
        if not 0 < self.timeout_ms <= 600_000:
            problems.append(f"timeout_ms must be in (0, 600000], not {self.timeout_ms}")
        if not 1 <= self.max_attempts <= 100:
            problems.append(f"max_attempts must be in [1, 100], not {self.max_attempts}")
        if not self.deadline_s > 0:
            problems.append(f"deadline_s must be > 0, not {self.deadline_s}")
        if problems:
            raise InvalidDeliveryRequest("invalid delivery request: " + "; ".join(problems))

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000

    @property
    def resend_safe(self) -> bool:
        """Whether an automatic resend can be made safe (by the key, or by a lookup first)."""
        return (
            self.honours_idempotency
            or self.lookup_path is not None
            or self.mcp_lookup_tool is not None
        )

    def to_json(self) -> dict[str, Any]:
        # Field by field, not dataclasses.asdict: that deep-copies the body on every call,
        # and a write turn makes this twice. Headers are copied, so a caller's change stays its
        # own; the body, as the model's arguments gave it, is only read.
        made = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return {**made, "headers": dict(self.headers), "method": self.method.upper()}

    @classmethod
    def from_json(cls, value: Any) -> DeliveryRequest:
        if isinstance(value, DeliveryRequest):
            return value
        if not isinstance(value, dict):
            raise InvalidDeliveryRequest(f"a delivery request is an object, not {value!r}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(value) - known)
        if unknown:
            raise InvalidDeliveryRequest(
                f"unknown delivery request field(s) {', '.join(unknown)}",
                fix=f"use only {', '.join(sorted(known))}",
            )
        if "path" not in value and "mcp_tool" not in value:
            raise InvalidDeliveryRequest("a delivery request needs a path")
        try:
            return cls(**value)
        except TypeError as exc:
            raise InvalidDeliveryRequest(f"invalid delivery request: {exc}") from exc
