"""Property-based fuzzing of the whole API from its own OpenAPI document (schemathesis).

Every operation, authenticated as admin, with generated bodies, paths and queries: no response
may be a 5xx, and every response must match the schema the API declares. The number of examples
is bounded so the suite stays fast.
"""

from __future__ import annotations

import os
import tempfile

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from orchestrator.server import build_app
from orchestrator.settings import Settings

_home = tempfile.mkdtemp(prefix="aerie-fuzz-")
os.environ.setdefault("AERIE_HOME", _home)
_settings = Settings(home=_home)
app = build_app(_settings, with_controller=False)
TOKEN = _settings.admin_token_path.read_text().strip()

schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.auth()
class AdminToken:
    def get(self, case, context):
        return TOKEN

    def set(self, case, data, context):
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_never_5xx_and_keeps_its_schema(case):
    case.call_and_validate(
        checks=[not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    )
