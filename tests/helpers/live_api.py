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

from orchestrator.harness.control_plane import free_port
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
