"""Control-plane settings from the environment (AERIE_*), with embedded defaults under ~/.aerie."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from aerie_contracts import env


class _InHome:
    """A path under the settings' `home_dir`, read as an attribute (`settings.jobs_dir`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, settings: Settings | None, owner: type | None = None) -> Path:
        if settings is None:
            raise AttributeError(f"{self.name!r} is a path under one Settings' home")
        return settings.home_dir / self.name


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AERIE_", extra="ignore", ignored_types=(_InHome,))

    home: Path = Path("~/.aerie")
    database_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8470
    # URL agents and handlers use to reach the API (defaults to http://host:port).
    public_url: str | None = None
    reconcile_interval_s: float = 0.5
    # A node with no heartbeat for this many heartbeat intervals is lost.
    lost_after_heartbeats: int = 3
    # EventBridge bus (name or ARN) to publish the outbox to (orchestrator/eventbus.py). Unset,
    # the default: the handlers run in-process. Set (as the CDK stack does), events go to the
    # bus, whose rules invoke the deployed Lambda functions, and nothing runs in-process.
    event_bus: str | None = None
    # The token the deployed handlers call the API with (Secrets Manager's `aerie/service-token`);
    # `aerie up` stores it as a service token so their calls are accepted.
    service_token: SecretStr | None = None
    # Slack (human eval). Secrets are SecretStr: they never appear in reprs or logs. Slack's own
    # variable names are accepted too. `slack_api_url` points the WebClient elsewhere (tests).
    slack_signing_secret: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices(env.SLACK_SIGNING_SECRET, "SLACK_SIGNING_SECRET")
    )
    slack_bot_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices(env.SLACK_BOT_TOKEN, "SLACK_BOT_TOKEN")
    )
    slack_api_url: str = "https://slack.com/api/"
    slack_max_body_bytes: int = 64 * 1024
    # The SageMaker-compatible endpoint (orchestrator/sagemaker_api; aerie_contracts.env documents
    # AERIE_DEFAULT_BACKEND, AERIE_SAGEMAKER_MAX_INSTANCES and AERIE_SIGV4_KEY).
    default_backend: str = "local"
    sagemaker_max_instances: int = 0
    sigv4_key: SecretStr | None = None
    # A bearer token that may only scrape /metrics (aerie_contracts.env.METRICS_TOKEN).
    metrics_token: SecretStr | None = None

    @property
    def home_dir(self) -> Path:
        path = self.home.expanduser()
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home_dir / 'aerie.db'}"

    jobs_dir = _InHome("jobs")
    admin_token_path = _InHome("admin.token")
    sigv4_key_path = _InHome("sigv4.key")
    api_url_path = _InHome("api.url")

    @property
    def api_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"
