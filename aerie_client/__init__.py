"""The one client of Aerie's API: the CLI, the agent, the handlers and the checkpoint fence all
speak through it (paths from `aerie_contracts.routes`, errors as `ApiError`, one retry policy)."""

from aerie_client.http import ApiError, Client, backoff_s, error_text

__all__ = ["ApiError", "Client", "backoff_s", "error_text"]
