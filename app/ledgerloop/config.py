"""One Settings object: environment (LEDGERLOOP_* and a few standard names) over dbos-config.yaml.

The DBOS configuration is derived here and nowhere else, so the choices that keep runs
recoverable (a pinned application version, portable JSON instead of pickle, one executor id
per process) cannot be forgotten by a caller.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
import uuid
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import yaml
from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from ledgerloop.errors import ConfigError
from ledgerloop.pricing import ModelPrice

if TYPE_CHECKING:
    from ledgerloop.db.footprint import Footprint, Process

DEFAULT_CONFIG_FILE = "dbos-config.yaml"
DEFAULT_TENANT = uuid.UUID(int=0)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """`90s`, `15m`, `12h`, `30d`, `2w`, or a plain number of seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration; use e.g. 90s, 15m, 12h, 30d or 2w")
    return timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2) or "s"])


def parse_cutoff(text: str, now: datetime | None = None) -> datetime:
    """A point in time: an ISO 8601 timestamp (UTC unless it says otherwise), or a duration
    meaning that long before `now`."""
    try:
        return (now or datetime.now(UTC)) - parse_duration(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a timestamp nor a duration; use e.g. 2026-01-31T00:00:00Z or 30d"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


class _YamlSource(PydanticBaseSettingsSource):
    """dbos-config.yaml, read with the lowest priority: env variables override it."""

    # yaml key -> settings field; keys not listed are DBOS CLI keys we do not use.
    _KEYS: ClassVar[dict[str, str]] = {
        "name": "app_name",
        "application_version": "application_version",
        "system_database_url": "database_url",
    }

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = Path(os.environ.get("LEDGERLOOP_CONFIG", DEFAULT_CONFIG_FILE))
        if not path.is_file():
            return {}
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"{path} is not valid YAML: {exc}", fix="fix the file or unset LEDGERLOOP_CONFIG"
            ) from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{path} must be a mapping of keys to values")
        return {field: raw[key] for key, field in self._KEYS.items() if raw.get(key) is not None}


class Settings(BaseSettings):
    """Everything Ledgerloop reads from its environment, validated once."""

    model_config = SettingsConfigDict(env_prefix="LEDGERLOOP_", extra="ignore", frozen=True)

    database_url: str | None = None
    #: The same database without a pooler in between, for what a transaction-mode pooler
    #: cannot carry: LISTEN, session advisory locks (the heartbeat's, the purge's) and the
    #: migration lock (docs/operations.md, Poolers). Unset: there is none.
    direct_database_url: str | None = None
    #: What database_url runs through: `none` (a direct connection), `session` (a pooler in
    #: session mode: a client keeps its server connection, so nothing changes) or
    #: `transaction` (PgBouncer's transaction mode: no prepared statements, no session state).
    #: Unset: `transaction` when a direct URL is given, else `none`.
    pooler: Literal["none", "session", "transaction"] | None = None
    #: Behind a transaction-mode pooler without a direct URL there is no LISTEN: a worker
    #: looks for queued runs, awaited messages and due outbox rows this often instead.
    pooled_poll_s: float = Field(default=1.0, ge=0.05, le=60)
    home: Path = Path(".ledgerloop")
    app_name: str = "ledgerloop"
    application_version: str = "ledgerloop-2"
    #: A new identity per process start: random, never derived from host name and pid (a
    #: peer in another PID namespace can have the same host name and pid).
    executor_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()[:40]}-{uuid.uuid4().hex[:16]}"
    )

    # Model access: the standard Anthropic names, not LEDGERLOOP_ ones.
    anthropic_api_key: str | None = Field(
        default=None, validation_alias=AliasChoices("ANTHROPIC_API_KEY"), repr=False
    )
    anthropic_base_url: str | None = Field(
        default=None, validation_alias=AliasChoices("ANTHROPIC_BASE_URL")
    )
    model_cheap: str = "claude-haiku-4-5"
    model_strong: str = "claude-sonnet-4-6"
    #: Stream each model call and publish its text as it is written to the run's event
    #: stream (docs/streaming.md); off, model calls are made whole (messages.create).
    stream_text: bool = True
    #: How long a sent model call may take; one that times out is never sent again.
    model_timeout_s: float = Field(default=240.0, gt=0, le=3600)
    #: Refused model calls (429, 529, connection refused) are tried this many times in all,
    #: after the server's Retry-After, each wait capped at model_refusal_max_wait_s.
    model_refusal_attempts: int = Field(default=5, ge=1, le=100)
    model_refusal_max_wait_s: float = Field(default=60.0, ge=0, le=3600)
    #: USD per million tokens by model (ledgerloop.pricing), as JSON:
    #: {"claude-haiku-4-5": {"input_per_mtok": 1, "output_per_mtok": 5}}. Unset: no costs.
    model_prices: dict[str, ModelPrice] = Field(default_factory=dict)
    #: The model provider's limits, shared by every worker on the database (models/limits.py):
    #: requests and input tokens per minute for all tiers together, and per tier. Unset: no
    #: limit kept here (each worker still honours a 429's Retry-After).
    model_rpm: int | None = Field(default=None, gt=0)
    model_input_tpm: int | None = Field(default=None, gt=0)
    model_rpm_cheap: int | None = Field(default=None, gt=0)
    model_rpm_strong: int | None = Field(default=None, gt=0)
    model_input_tpm_cheap: int | None = Field(default=None, gt=0)
    model_input_tpm_strong: int | None = Field(default=None, gt=0)

    # Budgets: constants counted per run, never requests in a prompt.
    #: Model turns per run: every think of the run's agents and of its child episodes.
    max_iterations: int = Field(default=8, ge=1, le=1000)
    #: Input plus output tokens per run, over the same calls (agent/budgets.py).
    max_run_tokens: int = Field(default=2_000_000, ge=1)
    max_rejected_answers: int = Field(default=3, ge=0, le=100)
    run_deadline_s: float = Field(default=3600.0, gt=0)
    payload_offload_bytes: int = Field(default=64 * 1024, ge=1024)
    #: How long a step keeps retrying a transient failure (the database restarting or failing
    #: over, a dropped connection) before the run fails; the default outlasts a 60 s outage.
    step_retry_budget_s: float = Field(default=120.0, ge=0, le=86400)

    policy_file: Path = Path("tool_policy.yaml")
    #: Named base URLs write tools deliver to; overrides the policy file's `destinations`.
    destinations: dict[str, str] = Field(default_factory=dict)
    # A comma-separated list in the environment, not JSON.
    agent_modules: Annotated[tuple[str, ...], NoDecode] = ()

    #: How often the reconciler looks for effects whose outcome is unknown.
    reconcile_interval_s: float = Field(default=5.0, gt=0, le=3600)
    #: How long an unknown outcome rests before the reconciler asks the destination (a call
    #: that timed out here may still commit there), and the slack on a relay's claim lease.
    effect_settle_after_s: float = Field(default=5.0, ge=0, le=3600)
    relay_lease_margin_s: float = Field(default=5.0, gt=0, le=3600)
    #: A worker that runs the relay sends each effect from the act step that records it (the
    #: relay's code, without its wake-up and claim); false leaves every effect to the relay's
    #: claim, as a worker started with --no-relay does.
    inline_delivery: bool = True

    #: Where sandboxes' working directories live (default: a directory of this user's under
    #: the system's temporary directory); the reaper looks here for what dead workers left.
    sandbox_root: Path | None = None
    sandbox_reap_interval_s: float = Field(default=60.0, gt=0, le=86400)

    #: The sweeper (control/sweeper.py): how often it looks for unfinished runs whose workflow
    #: ended, vanished or outlived the run; how old a run must be to be judged; and how long
    #: past its deadline a run with a live workflow gets to end itself.
    sweep_interval_s: float = Field(default=5.0, gt=0, le=3600)
    sweep_min_age_s: float = Field(default=5.0, ge=0, le=3600)
    sweep_deadline_grace_s: float = Field(default=60.0, ge=0, le=86400)
    #: How long `ledgerloop up` and `ledgerloop relay` wait for an unreachable database at
    #: start-up (a failover, a database starting beside them) before giving up; 0: no wait.
    startup_wait_s: float = Field(default=300.0, ge=0, le=86400)

    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8080, ge=0, le=65535)
    #: How often a worker writes its heartbeat (twice as often while it executes runs), and
    #: after how long without one (by the database's clock) peers take its runs over. A
    #: worker killed outright is taken over sooner: once its database session is gone and the
    #: lease its row records has run out (idle: the larger of 2.5 heartbeats and a quarter of
    #: stale_after_s; executing runs: 1.5 heartbeats). See docs/operations.md.
    heartbeat_s: float = Field(default=0.5, ge=0.05, le=60)
    stale_after_s: float = Field(default=5.0, ge=0.2, le=3600)
    #: Runs a worker claims at a time when woken; small batches spread a burst over workers.
    dispatch_batch: int = Field(default=8, ge=1, le=1000)
    #: How often a worker looks for queued runs without being notified (the fallback).
    dispatch_fallback_s: float = Field(default=10.0, gt=0, le=300)
    #: Every database connection of one process (`ledgerloop up`, `ledgerloop relay`), its
    #: parts and pools included (db/footprint.py splits it). The default lets three
    #: `ledgerloop up` and an application share a default Postgres (max_connections 100).
    max_connections: int = Field(default=15, ge=1, le=10_000)
    #: DBOS's pool and Ledgerloop's own pool; unset (the default): their share of
    #: max_connections. Set, they must fit under it beside the process's other connections.
    dbos_pool_size: int | None = Field(default=None, ge=2, le=500)
    #: A stopping worker lets step bodies under way finish for up to this long.
    drain_s: float = Field(default=10.0, ge=0, le=600)
    pool_size: int | None = Field(default=None, ge=2, le=500)
    #: DBOS's thread pool (its database I/O and our store calls run there). DBOS leaves it
    #: unbounded; a bound keeps thousands of concurrent runs from becoming thousands of threads.
    worker_threads: int = Field(default=16, ge=2, le=512)
    #: A run that has waited this long for a message (an approval, an effect's outcome) leaves
    #: memory and is woken by the message or its deadline; 0 keeps waiting runs resident.
    hibernate_after_s: float = Field(default=30.0, ge=0, le=86400)
    #: Runs one worker executes at once; the rest wait on the queue. A hibernated run frees
    #: its place, so this bounds a worker's memory, not how many runs may wait.
    worker_concurrency: int = Field(default=1000, ge=1, le=100_000)
    #: How often a worker cancels, through DBOS, the workflows of cancelled runs whose
    #: requester did not (it died after committing, or cancelled inside its own transaction);
    #: a request is left this long to its requester first.
    cancel_sweep_s: float = Field(default=2.0, gt=0, le=3600)

    # Retention, done continuously by `ledgerloop up` when set (durations: 30d, 12h...).
    #: Finished runs older than this lose their journal and messages; their audit history
    #: (run, events, approvals, effects) stays.
    purge_journals_after: timedelta | None = None
    #: Finished runs older than this are deleted whole, from both schemas.
    purge_runs_after: timedelta | None = None
    #: How often a worker looks for runs to purge (one worker of the fleet at a time does).
    purge_interval_s: float = Field(default=300.0, gt=0, le=86400)

    @field_validator("app_name")
    @classmethod
    def _dbos_name(cls, value: str) -> str:
        # DBOS refuses names outside this alphabet at launch; refuse them earlier and clearer.
        allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-_")
        if not 3 <= len(value) <= 256 or not set(value) <= allowed:
            raise ValueError("must be 3-256 characters of lowercase letters, digits, '-' or '_'")
        return value

    @property
    def transaction_pooled(self) -> bool:
        """database_url runs through a transaction-mode pooler."""
        if self.pooler is None:
            return self.direct_database_url is not None
        return self.pooler == "transaction"

    @model_validator(mode="after")
    def _routes(self) -> Settings:
        # Every connection this process makes from database_url takes its options from
        # here (db/pooling.py), whichever part of Ledgerloop opens it.
        from ledgerloop.db import pooling

        # Only a configured route: settings that say nothing about poolers (a test's, say)
        # leave a route registered elsewhere in the process as it is.
        configured = self.pooler is not None or self.direct_database_url is not None
        if self.database_url is not None and configured:
            pooling.register(
                self.database_url,
                pooled=self.transaction_pooled,
                direct_url=self.direct_database_url,
            )
        return self

    def footprint(self, process: Process = "up", *, relay: bool = True) -> Footprint:
        """This process's connections under max_connections (db/footprint.py); a cap below
        the process's minimum, or pool sizes that do not fit, is one ConfigError."""
        from ledgerloop.db.footprint import plan

        return plan(
            self.max_connections,
            process,
            relay=relay,
            dbos_pool_size=self.dbos_pool_size,
            pool_size=self.pool_size,
        )

    @model_validator(mode="after")
    def _timings(self) -> Settings:
        # The lease must run out before any peer may take this worker over (fleet.fence).
        if self.stale_after_s < 4 * self.heartbeat_s:
            raise ValueError(
                f"stale_after_s ({self.stale_after_s}) must be at least 4 heartbeats "
                f"(heartbeat_s {self.heartbeat_s})"
            )
        return self

    @field_validator("purge_journals_after", "purge_runs_after", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        if isinstance(value, str):
            if not value.strip():
                return None
            return parse_duration(value)
        return value

    @field_validator("purge_runs_after")
    @classmethod
    def _runs_outlive_journals(cls, value: timedelta | None, info: Any) -> timedelta | None:
        journals = info.data.get("purge_journals_after")
        if value is not None and journals is not None and value < journals:
            raise ValueError(
                "must not be shorter than LEDGERLOOP_PURGE_JOURNALS_AFTER (a run is deleted "
                "whole after its journal)"
            )
        return value

    @field_validator("agent_modules", mode="before")
    @classmethod
    def _split_modules(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlSource(settings_cls))

    @cached_property
    def pgdata(self) -> Path:
        return self.home / "pgdata"

    @cached_property
    def sandboxes(self) -> Path:
        if self.sandbox_root is not None:
            return self.sandbox_root
        # Not under the project: a sandbox's own uid must be able to reach its directory,
        # and a home directory is usually closed to others.
        return Path(tempfile.gettempdir()) / f"ledgerloop-sandboxes-{os.geteuid()}"

    def dbos_config(self, database_url: str, *, pool_size: int | None = None) -> dict[str, Any]:
        """The DBOSConfig for this process (a TypedDict at runtime, so a plain dict here).
        `pool_size`: DBOS's pool (default: its share of a worker's footprint)."""
        from dbos import DBOSPortableJSONSerializer

        from ledgerloop.db import footprint, pooling

        route = pooling.route(database_url)
        engine_kwargs: dict[str, Any] = {
            # No ping on every checkout (a statement per step): a connection broken by a
            # database restart fails once and SQLAlchemy then replaces the whole pool.
            "pool_pre_ping": False,
            "connect_args": pooling.engine_connect_args(
                database_url, footprint.application_name("dbos")
            ),
        }
        pooled: dict[str, Any] = {}
        if route.pooled:
            pooled = {
                # DBOS's listener LISTENs on a connection of its engine, which through the
                # pooler hears nothing. The dispatcher's direct connection relays DBOS's
                # message notifications instead (fleet/dispatch.py); without one, DBOS polls
                # for the messages its waiting workflows expect.
                "use_listen_notify": False,
                "notification_listener_polling_interval_sec": (
                    FORWARDED_POLL_S if route.direct_url else self.pooled_poll_s
                ),
                # DBOS would SET idle_in_transaction_session_timeout on each new connection,
                # a session setting the pooler passes on to other clients. PgBouncer's own
                # idle_transaction_timeout does that job (docs/operations.md, Poolers).
                "sys_db_idle_transaction_timeout_sec": 0,
            }
        return {
            "name": self.app_name,
            "system_database_url": database_url,
            "application_version": self.application_version,
            "executor_id": self.executor_id,
            # Portable JSON: SQL and other languages can start and read runs, and nothing a
            # model, a tool or a human produced is ever unpickled.
            "serializer": DBOSPortableJSONSerializer(),
            # Migrations run under `ledgerloop db upgrade`, with its lock; workers only verify.
            "run_migrations": False,
            "max_executor_threads": self.worker_threads,
            "sys_db_pool_size": pool_size or self.footprint(relay=False).pool("dbos"),
            "db_engine_kwargs": engine_kwargs,
            # DBOS flushes the NOTIFYs of its events and streams from a thread that wakes every
            # 10 ms by default, busy or idle: most of an idle worker's CPU. Ledgerloop uses
            # neither (its runs wait on DBOS.recv, notified by a trigger), so a slower flush
            # costs it nothing; a user's own DBOS.set_event may be seen up to 0.25 s later.
            "notification_coalesce_sec": NOTIFICATION_FLUSH_S,
            "log_level": os.environ.get("LEDGERLOOP_DBOS_LOG_LEVEL", "WARNING"),
            **pooled,
        }


#: How often DBOS flushes its coalesced event and stream notifications (see dbos_config).
NOTIFICATION_FLUSH_S = 0.25

#: Behind a transaction-mode pooler with a direct URL, DBOS's message notifications come
#: from the dispatcher's LISTEN; DBOS's own poll of its waiters is then only a safety net.
FORWARDED_POLL_S = 30.0


def load_settings(**overrides: Any) -> Settings:
    """Read and validate the settings; a bad value is one ConfigError naming the variable."""
    try:
        return Settings(**overrides)
    except SettingsError as exc:
        # Raised for values that are not valid JSON where a structure is expected.
        raise ConfigError(
            str(exc).splitlines()[0], fix="give the variable a valid JSON value"
        ) from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "settings"
        env_name = f"LEDGERLOOP_{field.upper()}"
        raise ConfigError(
            f"invalid setting {field}: {first['msg']}",
            fix=f"set {env_name} or the key in {DEFAULT_CONFIG_FILE} to a valid value",
        ) from exc
