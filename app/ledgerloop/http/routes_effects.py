"""/v1/effects: list, and an operator's resolution of an effect the machines could not settle."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from ledgerloop.approvals.preview import redact_secrets
from ledgerloop.approvals.principals import OPERATOR, VIEWER, Principal
from ledgerloop.db.connect import tenant_scope
from ledgerloop.effects.ledger import Effect, effect_list, effect_resolve
from ledgerloop.effects.messages import EffectStatus
from ledgerloop.http.auth import Caller, Connection, with_role
from ledgerloop.http.errors import responses, storable_text

router = APIRouter(prefix="/v1/effects", tags=["effects"])

Operator = Annotated[Principal, Depends(with_role(OPERATOR, action="resolving effects"))]


class Resolution(BaseModel):
    """Exactly one of: it happened (`succeeded`: the downstream's reference), it did not
    (`failed`: why), or try again automatically (`retry`: true)."""

    # The schema says "one property" too, so generated clients and fuzzers know it.
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"minProperties": 1, "maxProperties": 1}
    )

    # Nullable in Python (absent), never in the schema: a null is not a decision.
    succeeded: Annotated[str, Field(min_length=1, max_length=1000)] | SkipJsonSchema[None] = None
    failed: Annotated[str, Field(min_length=1, max_length=2000)] | SkipJsonSchema[None] = None
    retry: Literal[True] | SkipJsonSchema[None] = None

    @field_validator("succeeded", "failed")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip():
            raise ValueError("must not be blank")
        return storable_text(value)

    @model_validator(mode="after")
    def _exactly_one(self) -> Resolution:
        chosen = [self.succeeded is not None, self.failed is not None, self.retry is not None]
        if sum(chosen) != 1:
            raise ValueError(
                'give exactly one of {"succeeded": "<reference>"}, {"failed": "<reason>"} '
                'or {"retry": true}'
            )
        return self


class EffectOut(BaseModel):
    key: str
    run_id: uuid.UUID
    tool: str
    request_hash: str
    destination: str
    status: EffectStatus
    external_reference: str | None
    result: Any
    error: str | None
    evidence: dict[str, Any] | None = Field(
        description=(
            "What the relay and reconciler saw, with secrets hidden (credential-looking keys "
            "at any depth, bearer tokens in text); null unless the caller holds the operator "
            "or viewer role"
        )
    )
    attempts: int
    lease_until: datetime | None
    compensates: str | None
    resolved_by: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, effect: Effect, principal: Principal) -> EffectOut:
        out = cls.model_validate(effect, from_attributes=True)
        # Evidence holds whole delivery requests (bodies, headers): for the people who
        # settle or audit effects, and even then with its secrets hidden.
        shown = principal.role_for(EVIDENCE_ROLES) is not None and effect.evidence is not None
        return out.model_copy(
            update={"evidence": redact_secrets(effect.evidence) if shown else None}
        )


#: Who may read an effect's (redacted) evidence.
EVIDENCE_ROLES = (OPERATOR, VIEWER)


class EffectList(BaseModel):
    effects: list[EffectOut]


@router.get("", response_model=EffectList, responses=responses(401, 422), summary="List effects")
def list_effects(
    principal: Caller,
    conn: Connection,
    status: EffectStatus | None = None,
    run_id: uuid.UUID | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> EffectList:
    with tenant_scope(conn, principal.tenant_id):
        found = effect_list(conn, status=status, run_id=run_id, limit=limit)
    return EffectList(effects=[EffectOut.of(e, principal) for e in found])


@router.post(
    # `:path`: a key holds the tool call id, which this API does not control.
    "/{key:path}/resolve",
    response_model=EffectOut,
    responses=responses(400, 401, 403, 404, 409, 413, 415, 422),
    summary="Settle a needs_human or outcome_unknown effect (operator)",
)
def resolve(
    key: Annotated[str, Path(min_length=1, max_length=600)],
    body: Resolution,
    principal: Operator,
    conn: Connection,
) -> EffectOut:
    # In the tenant's scope: another tenant's effect is not found. The database tells the
    # run's workflow about the outcome in this same transaction.
    with tenant_scope(conn, principal.tenant_id):
        effect = effect_resolve(
            conn,
            key,
            succeeded_ref=body.succeeded,
            failed_reason=body.failed,
            retry=body.retry is True,
            operator=f"{principal.name} (principal {principal.id})",
        )
    return EffectOut.of(effect, principal)
