"""Control-plane settings from the environment (AERIE_*), with embedded defaults under ~/.aerie."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AERIE_", extra="ignore")

    home: Path = Path("~/.aerie")
    database_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8470
    # URL agents and handlers use to reach the API (defaults to http://host:port).
    public_url: str | None = None
    reconcile_interval_s: float = 0.5
    # A node with no heartbeat for this many heartbeat intervals is lost.
    lost_after_heartbeats: int = 3
    # Slack (human eval). Secrets are SecretStr: they never appear in reprs or logs. Slack's own
    # variable names are accepted too. `slack_api_url` points the WebClient elsewhere (tests).
    slack_signing_secret: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("AERIE_SLACK_SIGNING_SECRET", "SLACK_SIGNING_SECRET"))
    slack_bot_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("AERIE_SLACK_BOT_TOKEN", "SLACK_BOT_TOKEN"))
    slack_api_url: str = "https://slack.com/api/"
    slack_max_body_bytes: int = 64 * 1024

    @property
    def home_dir(self) -> Path:
        path = self.home.expanduser()
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home_dir / 'aerie.db'}"

    @property
    def jobs_dir(self) -> Path:
        return self.home_dir / "jobs"

    @property
    def admin_token_path(self) -> Path:
        return self.home_dir / "admin.token"

    @property
    def api_url_path(self) -> Path:
        return self.home_dir / "api.url"

    @property
    def api_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
