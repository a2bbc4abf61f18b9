"""The policy's condition language and summary templates: what they decide, and the errors a
bad one gets when the policy loads (naming the file, its line and the exact field) or the
worker starts (naming the policy field, its line and the tool's arguments, once)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ledgerloop.agent.definition import Agent
from ledgerloop.approvals.preview import render_preview
from ledgerloop.errors import ConfigError
from ledgerloop.tools.conditions import parse_condition
from ledgerloop.tools.policy import PolicyFile, load_policy
from ledgerloop.worker import check_policy_tools
from tests.support.refund_agents import REFUND_RULES, REFUNDER


def _load(tmp_path: Path, tools: dict[str, Any]) -> PolicyFile:
    path = tmp_path / "tool_policy.yaml"
    path.write_text(yaml.safe_dump({"version": "v1", "tools": tools}))
    return load_policy(path)


def _error(tmp_path: Path, rules: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, {"refund": rules})
    return info.value.one_line()


ARGS = {"amount_cents": 5000, "customer": {"name": "acme", "country": "DE"}, "tags": ["vip"]}


@pytest.mark.parametrize(
    ("condition", "holds"),
    [
        ({"field": "amount_cents", "gte": 5000}, True),
        ({"field": "amount_cents", "gt": 5000}, False),
        ({"field": "amount_cents", "lt": 5000}, False),
        ({"field": "amount_cents", "lte": 5000}, True),
        ({"field": "amount_cents", "eq": 5000}, True),
        ({"field": "amount_cents", "ne": 5000}, False),
        ({"field": "customer.country", "in": ["DE", "FR"]}, True),
        ({"field": "customer.country", "not_in": ["DE", "FR"]}, False),
        ({"field": "tags.0", "eq": "vip"}, True),
        ({"field": "tags.1", "exists": True}, False),
        ({"field": "customer.vat", "exists": False}, True),
        ({"field": "customer.vat", "eq": "x"}, False),  # absent: false ...
        ({"field": "customer.vat", "ne": "x"}, True),  # ... except ne
        ({"all": [{"field": "amount_cents", "gte": 1}, {"field": "tags.0", "eq": "vip"}]}, True),
        ({"all": [{"field": "amount_cents", "gte": 1}, {"field": "tags.0", "eq": "x"}]}, False),
        ({"any": [{"field": "amount_cents", "gte": 9999}, {"field": "tags.0", "eq": "vip"}]}, True),
        ({"not": {"field": "amount_cents", "gte": 5000}}, False),
        ({"all": []}, True),
        ({"any": []}, False),
        ({"field": "amount_cents", "eq": True}, False),  # a flag is not an amount
    ],
)
def test_conditions_decide_on_the_arguments(condition: dict[str, Any], holds: bool) -> None:
    assert parse_condition(condition).holds(ARGS) is holds


def test_a_threshold_asks_for_approval_at_and_above_it_only(tmp_path: Path) -> None:
    rules = _load(tmp_path, {"refund": REFUND_RULES}).for_write_tool("refund")
    assert rules.may_require_approval
    below = {"amount_cents": 4999, "customer": {"name": "a", "country": "DE"}}
    at = {"amount_cents": 5000, "customer": {"name": "a", "country": "DE"}}
    exempt = {"amount_cents": 9000, "customer": {"name": "a", "country": "XX"}}
    assert rules.approval_needed(below)[0] is False
    assert rules.approval_needed(at)[0] is True
    assert rules.approval_needed(exempt)[0] is False


def test_a_condition_that_cannot_be_decided_asks_a_person(tmp_path: Path) -> None:
    rules = _load(tmp_path, {"refund": REFUND_RULES}).for_write_tool("refund")
    needed, why = rules.approval_needed({"amount_cents": "lots", "customer": {"country": "DE"}})
    assert needed is True
    assert "cannot be decided" in why


def test_plain_true_and_false_still_work(tmp_path: Path) -> None:
    policy = _load(tmp_path, {"a": {"requires_approval": True}, "b": {}})
    assert policy.for_write_tool("a").approval_needed({})[0] is True
    assert policy.for_write_tool("b").may_require_approval is False


@pytest.mark.parametrize(
    ("rules", "field", "problem"),
    [
        (
            {"requires_approval": {"when": {"all": [{"field": "amount_cents", "gte": [1]}]}}},
            "tools.refund.requires_approval.when.all[0].gte",
            "gte takes a number or a string",
        ),
        (
            {"requires_approval": {"when": {"any": [{}, {"field": "x", "between": [1, 2]}]}}},
            "tools.refund.requires_approval.when.any[0]",
            "needs `field:`",
        ),
        (
            {"requires_approval": {"when": {"field": "x", "gte": 1, "lt": 9}}},
            "tools.refund.requires_approval.when",
            "exactly one of",
        ),
        (
            {"requires_approval": {"when": {"not": {"field": "a..b", "exists": True}}}},
            "tools.refund.requires_approval.when.not.field",
            "is not a field path",
        ),
        (
            {"requires_approval": {"when": {"field": "x", "in": []}}},
            "tools.refund.requires_approval.when.in",
            "non-empty list",
        ),
        (
            {"requires_approval": {"if": {"field": "x", "eq": 1}}},
            "tools.refund.requires_approval.when",
            "Field required",
        ),
        (
            {"requires_approval": "sometimes"},
            "tools.refund.requires_approval",
            "true, false or {when: CONDITION}",
        ),
        ({"summary": "Refund {amount!r}"}, "tools.refund.summary", "without ! or :"),
        ({"summary": "Refund {amount:>9}"}, "tools.refund.summary", "without ! or :"),
        ({"summary": "Refund {amount"}, "tools.refund.summary", "is not a template"),
        ({"summary": "Refund {}"}, "tools.refund.summary", "needs an argument name"),
        ({"summary": "Refund {amount.__class__}"}, "tools.refund.summary", "not a field path"),
    ],
)
def test_a_bad_rule_names_the_file_and_the_field(
    tmp_path: Path, rules: dict[str, Any], field: str, problem: str
) -> None:
    message = _error(tmp_path, rules)
    assert _named_line(tmp_path / "tool_policy.yaml", field, message)
    assert problem in message
    assert "docs/policy.md" in message


def _named_line(path: Path, field: str, message: str) -> str:
    """The line `FILE:LINE: FIELD: ` names, which must hold the deepest key of `field` that
    the file has (a missing key: the one above it), or the list item it ends with."""
    found = re.search(rf"{re.escape(str(path))}:(\d+): {re.escape(field)}: ", message)
    assert found, message
    line = path.read_text().splitlines()[int(found.group(1)) - 1]
    keys = [k for k in re.split(r"[.\[\]]", field) if k and not k.isdigit()]
    item = field.endswith("]") and line.lstrip().startswith("- ")
    assert item or any(f"{key}:" in line for key in keys[-2:]), (line, field)
    return line


#: A hand-written file, so the lines are known.
_CONDITION_FILE = """\
version: v1
tools:
  refund:
    requires_approval:
      when:
        all:
          - field: amount_cents
            gte: 5000
          - field: customer.country
            in: XX
    summary: "Refund {amount_cents}"
"""


def test_a_bad_condition_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "tool_policy.yaml"
    path.write_text(_CONDITION_FILE)
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert info.value.one_line().startswith(
        f"{path}:10: tools.refund.requires_approval.when.all[1].in: in takes a non-empty list"
    )


def test_a_path_the_tool_lacks_names_its_line_once_for_every_agent_sharing_the_tool(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tool_policy.yaml"
    path.write_text(_CONDITION_FILE.replace("in: XX", "in: [XX]").replace("customer.", "buyer."))
    policy = load_policy(path)
    # Two agents with the same tool: one entry, one mistake, one line about it.
    other = Agent(name="refunder_too", system="", tools=REFUNDER.tools)
    registered = {"refunder": REFUNDER, "refunder_too": other}
    with pytest.raises(ConfigError) as info:
        check_policy_tools(policy, policy_file="p.yaml", registered=registered)
    message = info.value.one_line()
    assert message.startswith(
        "p.yaml:9: tools.refund.requires_approval.when.all[1].field: 'buyer.country' is not "
        "an argument of tool refund"
    ), message
    assert message.count("is not an argument") == 1, message


def test_a_condition_on_an_argument_the_tool_lacks_stops_the_worker(tmp_path: Path) -> None:
    rules = {
        **REFUND_RULES,
        "requires_approval": {
            "when": {"any": [{"field": "amount_cents", "gte": 1}, {"field": "amount", "gte": 1}]}
        },
    }
    policy = _load(tmp_path, {"refund": rules})
    with pytest.raises(ConfigError) as info:
        check_policy_tools(policy, policy_file="p.yaml", registered={"refunder": REFUNDER})
    message = info.value.one_line()
    assert re.search(
        r"p\.yaml:\d+: tools\.refund\.requires_approval\.when\.any\[1\]\.field: 'amount'", message
    )
    assert "RefundArgs: amount_cents, customer, reason" in message


@pytest.mark.parametrize(
    ("summary", "missing"),
    [("Refund {customer.city}", "city"), ("{amount_cents.value}", "value"), ("{x}", "x")],
)
def test_a_template_field_the_tool_lacks_stops_the_worker(
    tmp_path: Path, summary: str, missing: str
) -> None:
    policy = _load(tmp_path, {"refund": {**REFUND_RULES, "summary": summary}})
    with pytest.raises(ConfigError, match=f"tools.refund.summary: .*no '{missing}' there"):
        check_policy_tools(policy, policy_file="p.yaml", registered={"refunder": REFUNDER})


def test_paths_into_nested_models_lists_and_untyped_values_pass(tmp_path: Path) -> None:
    policy = _load(tmp_path, {"refund": REFUND_RULES})
    check_policy_tools(policy, policy_file="p.yaml", registered={"refunder": REFUNDER})
    agent = Agent(name="x", system="", tools=())
    check_policy_tools(policy.model_copy(update={"tools": {}}), registered={"x": agent})


def test_the_summary_template_reads_arguments_never_attributes() -> None:
    preview = render_preview(
        "refund",
        {"title": "t"},
        {"summary": "{customer.name} {customer.__class__} {customer.api_key} {amount_cents}"},
        fields={"customer": {"name": "acme", "api_key": "sk"}, "amount_cents": 12},
    )
    # `__class__` is no argument path: the template does not parse, the default summary shows.
    assert preview["summary"] == "refund(title=t)"
    preview = render_preview(
        "refund",
        {"title": "t"},
        {"summary": "{customer.name} {customer.api_key} {amount_cents} {nope}"},
        fields={"customer": {"name": "acme", "api_key": "sk"}, "amount_cents": 12},
    )
    assert preview["summary"] == "acme [hidden] 12 {nope}"


def test_the_tools_own_preview_is_the_summary_without_a_template() -> None:
    shown = render_preview("refund", {"a": 1}, {}, tool_summary="refund 12\u202e to acme")
    assert shown["summary"] == "refund 12\\u202e to acme"  # neutralised like any text
    templated = render_preview("refund", {"a": 1}, {"summary": "A={a}"}, tool_summary="own")
    assert templated["summary"] == "A=1"


def _destinations(tmp_path: Path, destinations: dict[str, Any], **tool: Any) -> PolicyFile:
    path = tmp_path / "tool_policy.yaml"
    text = {"version": "v1", "tools": {"pay": tool}, "destinations": destinations}
    path.write_text(yaml.safe_dump(text))
    return load_policy(path)


def test_a_destination_entry_wins_over_the_code_field_by_field(tmp_path: Path) -> None:
    entry = {
        "url": "http://pay.internal:8080",
        "idempotency_header": "X-Request-Key",
        "lookup_path": "/payments/by-key/{key}",
    }
    policy = _destinations(tmp_path, {"payments": entry, "tickets": "http://t:1"})
    assert policy.destination_urls() == {"payments": entry["url"], "tickets": "http://t:1"}
    facts = policy.effect_facts(
        "payments",
        policy.for_write_tool("pay"),
        honours_idempotency=True,
        lookup_path="/code/{key}",
        compensate_path="/payments/{ref}/refund",
    )
    # Said by the entry: the entry's; left unsaid: the code's.
    assert facts.idempotency_header == "X-Request-Key"
    assert facts.lookup_path == "/payments/by-key/{key}"
    assert facts.honours_idempotency is True
    assert facts.compensate_path == "/payments/{ref}/refund"
    plain = policy.effect_facts("tickets", policy.for_write_tool("pay"), lookup_path="/t/{key}")
    assert (plain.idempotency_header, plain.honours_idempotency, plain.lookup_path) == (
        "Idempotency-Key",
        False,
        "/t/{key}",
    )


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"url": "ftp://x"}, "destinations.payments.url"),
        ({"url": "http://x", "lookup_path": "/by-key"}, "destinations.payments.lookup_path"),
        (
            {"url": "http://x", "compensate_path": "/{id}/undo"},
            "destinations.payments.compensate_path",
        ),
        (
            {"url": "http://x", "honors_idempotency": True},
            "destinations.payments.honors_idempotency",
        ),
        ({"lookup_path": "/k/{key}"}, "destinations.payments.url"),
    ],
)
def test_a_bad_destination_names_the_file_and_the_field(
    tmp_path: Path, entry: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _destinations(tmp_path, {"payments": entry})
    _named_line(tmp_path / "tool_policy.yaml", field, info.value.one_line())
