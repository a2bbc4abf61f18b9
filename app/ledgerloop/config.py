"""One Settings object: environment (LEDGERLOOP_* and a few standard names) over dbos-config.yaml.

The DBOS configuration is derived here and nowhere else, so the choices that keep runs
recoverable (a pinned application version, portable JSON instead of pickle, one executor id
per process) cannot be forgotten by a caller.
"""

from __future__ import annotations

import os
import socket
import uuid
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, ClassVar

import yaml
from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from ledgerloop.errors import ConfigError

DEFAULT_CONFIG_FILE = "dbos-config.yaml"
DEFAULT_TENANT = uuid.UUID(int=0)


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
    home: Path = Path(".ledgerloop")
    app_name: str = "ledgerloop"
    application_version: str = "ledgerloop-1"
    executor_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
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

    # Budgets: constants counted per run, never requests in a prompt.
    max_iterations: int = Field(default=8, ge=1, le=1000)
    max_rejected_answers: int = Field(default=3, ge=0, le=100)
    run_deadline_s: float = Field(default=3600.0, gt=0)
    payload_offload_bytes: int = Field(default=64 * 1024, ge=1024)

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

    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8080, ge=0, le=65535)
    queue_poll_s: float = Field(default=0.05, gt=0, le=5)
    #: DBOS's thread pool (its database I/O and our store calls run there). DBOS leaves it
    #: unbounded; a bound keeps thousands of concurrent runs from becoming thousands of threads.
    worker_threads: int = Field(default=16, ge=2, le=512)
    #: A run that has waited this long for a message (an approval, an effect's outcome) leaves
    #: memory and is woken by the message or its deadline; 0 keeps waiting runs resident.
    hibernate_after_s: float = Field(default=30.0, ge=0, le=86400)
    #: Runs one worker executes at once; the rest wait on the queue. A hibernated run frees
    #: its place, so this bounds a worker's memory, not how many runs may wait.
    worker_concurrency: int = Field(default=1000, ge=1, le=100_000)

    @field_validator("app_name")
    @classmethod
    def _dbos_name(cls, value: str) -> str:
        # DBOS refuses names outside this alphabet at launch; refuse them earlier and clearer.
        allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-_")
        if not 3 <= len(value) <= 256 or not set(value) <= allowed:
            raise ValueError("must be 3-256 characters of lowercase letters, digits, '-' or '_'")
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

    def dbos_config(self, database_url: str) -> dict[str, Any]:
        """The DBOSConfig for this process (a TypedDict at runtime, so a plain dict here)."""
        from dbos import DBOSPortableJSONSerializer

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
            "log_level": os.environ.get("LEDGERLOOP_DBOS_LOG_LEVEL", "WARNING"),
        }


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
