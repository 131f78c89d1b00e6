"""The inspector served for real (uvicorn on a free port, in a thread of the test process)
over a private Redis holding threads in every status, and a headless Chromium to drive it.

The browser tests skip only where Debian's chromium and chromium-driver are not installed
(``scripts/services`` installs them as root).
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the inspector's extra is not installed: agentq[ui]")

import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from starlette.applications import Starlette

from agentq.records import Status
from agentq.store.redis.store import RedisStore
from agentq.ui import create_app
from tests.support.redis_server import RedisServer, free_port, wait_until
from tests.ui.population import populate

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


@contextmanager
def serving(app: Starlette, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="agentq-ui", daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout=20, what="the inspector listening")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(
            "chromium and chromedriver are not installed (apt-get install chromium "
            "chromium-driver, or run scripts/services as root)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisStore]:
    with RedisStore.from_url(redis_server.url, prefix=f"ui{uuid.uuid4().hex[:8]}:") as backend:
        yield backend


@pytest.fixture
def threads(store: RedisStore) -> dict[Status, str]:
    return populate(store)


@pytest.fixture
def serve(store: RedisStore) -> Iterator[Callable[..., str]]:
    """``serve(**create_app options)``: the inspector's base URL over ``store``."""
    stack: list[Any] = []

    def start(**options: Any) -> str:
        context = serving(create_app(store, **options))
        stack.append(context)
        return context.__enter__()

    yield start
    while stack:
        stack.pop().__exit__(None, None, None)


@pytest.fixture
def inspector(
    threads: dict[Status, str], serve: Callable[..., str], browser: webdriver.Chrome
) -> str:
    browser.delete_all_cookies()
    return serve()
