"""An in-process control plane served over real HTTP (uvicorn in a thread) for handler tests.

The handlers speak HTTP to the API exactly as they do in AWS Lambda; here the API runs in the
test process without a controller, so tests can arrange the store and step the dispatcher.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx
import uvicorn

from devtools.harness.control_plane import free_port
from orchestrator.events import Dispatcher, Handler, LambdaContext, Subscription
from orchestrator.server import build_app, service_token
from orchestrator.settings import Settings


@dataclass
class LiveApi:
    url: str
    db: object
    admin: str
    service: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def context(self, function_name: str) -> LambdaContext:
        """What a handler named `function_name` is given in AWS Lambda: this API and its service token."""
        return LambdaContext(function_name=function_name, aerie_api=self.url, aerie_token=self.service)

    def dispatcher(self, function_name: str, detail_type: str, handler: Handler) -> Dispatcher:
        """The control plane's dispatcher with one subscription: `handler` gets `detail_type` events
        with this API's context, as `aerie up` wires it."""
        subscription = Subscription(function_name, frozenset({detail_type}), handler)
        return Dispatcher(self.db, [subscription], api_url=self.url, token=self.service)


def start_live_api(settings: Settings) -> LiveApi:
    port = free_port()
    settings = settings.model_copy(update={"port": port})
    app = build_app(settings, with_controller=False)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    db = app.state.db
    return LiveApi(url, db, settings.admin_token_path.read_text().strip(), service_token(db), server, thread)
