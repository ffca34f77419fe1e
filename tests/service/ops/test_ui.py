"""The operators' page at ``/ui`` in a real headless Chromium, over ``purgatory serve`` and the
session's real broker (Kafka, then Tansu, on loopback), with an API token configured.

Debian's ``chromium`` (``/usr/bin/chromium``; ``make install`` installs it) is driven by
Playwright's Python client, launched with flags that keep it off the network it would otherwise
try to reach, in a fresh profile. Without the browser the test fails, naming ``make install``:
it is part of the gate, never skipped.

The workload: an operation whose deadline passes while the service is stopped (so, after the
restart, it expires flagged ``late`` and the partitions show what their restore read); a barrier
with one key of three signalled; a quorum of two keys of three with one signalled; three timers;
a barrier completed; a malformed registration on the requests topic (a dead letter naming the
field). The page is opened, asks for the token (a wrong one first), and must show each section
with the right content; then an operation registered after the page loaded must appear by
itself. With ``PURGATORY_RECORD_UI=1`` the test saves the screenshot of the docs
(``docs/ui.png``). Every wait is bounded.

The token is also given at the common screen sizes, from a narrow window to a full HD one, with
real clicks: nothing on the page (the deadline timeline once did) may cover the login form.
Those run on Tansu alone (what ``purgatory dev`` serves the page with): a layout is the page's,
not the broker's, and six more sizes on Kafka would add a quarter of a minute for nothing.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, ViewportSize, expect, sync_playwright

from purgatory.client import PurgatoryClient
from purgatory.devtools.broker import Broker
from purgatory.devtools.child import service_process
from purgatory.service.ownership.partitioning import partition_for
from purgatory.service.settings import Settings, env_name
from tests.service.end_to_end.test_e2e import PARTITIONS, Deadline, _produce, _settings

pytestmark = [pytest.mark.kafka, pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "ui-test-token-0123456789abcdef"
SCREENSHOT = Path(__file__).resolve().parents[3] / "docs" / "ui.png"
NIGHTLY = "nightly@2026-11-22"
QUORUM = "quorum@2026-11-22"
SESSIONS = "sessions"
YESTERDAY = "nightly@2026-11-21"
WAIT_MS = 20_000  # the page's own waits (it polls every 1.5 s)
CLICK_MS = 5_000  # a control that cannot take a click within this is covered
SIZES = [  # common laptop and desktop screens, and a narrow window
    ViewportSize(width=1280, height=720),
    ViewportSize(width=1366, height=768),
    ViewportSize(width=1440, height=900),
    ViewportSize(width=1536, height=864),
    ViewportSize(width=1920, height=1080),
    ViewportSize(width=800, height=600),
]


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _pause(seconds: float) -> None:
    time.sleep(seconds)  # noqa: TID251 - a real process, a real broker and a real browser


def _stamp(ms: int) -> str:
    """A time as the page writes it (UTC, to the millisecond)."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d} UTC"


def _chromium() -> Path:
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(
            f"Debian's chromium is not installed ({CHROMIUM}): run `make install` (as root it"
            " installs the chromium package with apt-get)",
            pytrace=False,
        )
    return CHROMIUM


def _env(settings: Settings) -> dict[str, str]:
    return {
        "PURGATORY_API_TOKEN": TOKEN,
        "PURGATORY_KAFKA_GROUP_ID": settings.kafka_group_id,
        **{
            env_name(f.name): getattr(settings, f.name)
            for f in fields(Settings)
            if f.name.startswith("topic_") and f.name != "topic_partitions"
        },
    }


def _overview(url: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/v1/overview", headers={"Authorization": f"Bearer {TOKEN}"})
    answer.raise_for_status()
    body: dict[str, Any] = answer.json()
    return body


def _until_overview(url: str, done: Callable[[dict[str, Any]], Any], what: str) -> dict[str, Any]:
    deadline = Deadline(30)
    while True:
        body = _overview(url)
        if done(body):
            return body
        if deadline.passed():
            raise AssertionError(f"{what}: not seen within 30 s; last overview: {body}")
        _pause(0.25)


@pytest.fixture
def browser_page(tmp_path: Path) -> Iterator[Page]:
    executable = _chromium()
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=str(executable),
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1440, "height": 900},
            timezone_id="UTC",
        )
        try:
            page = context.new_page()
            page.set_default_timeout(WAIT_MS)
            yield page
        finally:
            context.close()


def test_the_page_shows_the_replica_and_updates_itself(
    kafka_broker: Broker, browser_page: Page, tmp_path: Path
) -> None:
    settings = _settings(kafka_broker)
    env = _env(settings)
    servers = kafka_broker.bootstrap_servers

    # 1. An operation whose deadline passes while the service is stopped.
    with (
        service_process(servers, tmp_path / "first.log", env, partitions=PARTITIONS) as child,
        PurgatoryClient(child.url, token=TOKEN) as client,
    ):
        client.register(scope=NIGHTLY, op_id="late-1", keys=["ingest/late"], timeout_ms=4_000)
        late_deadline_ms = client.get(NIGHTLY, "late-1")["deadline_ms"]
    while _wall_ms() < late_deadline_ms + 300:
        _pause(0.1)

    # 2. Restarted: the late expiry, then the rest of the workload.
    with service_process(servers, tmp_path / "second.log", env, partitions=PARTITIONS) as child:
        url = child.url
        with PurgatoryClient(url, token=TOKEN) as client:
            client.register(
                scope=NIGHTLY,
                op_id="report",
                keys=["ingest/orders", "ingest/users", "ingest/stock"],
                timeout_ms=600_000,
            )
            client.signal(NIGHTLY, "ingest/orders")
            client.register(
                scope=QUORUM,
                op_id="replicas",
                keys=["r1", "r2", "r3"],
                condition="count",
                count=2,
                timeout_ms=300_000,
            )
            client.signal(QUORUM, "r1")
            for i in range(3):
                client.register(scope=SESSIONS, op_id=f"user-{i}", timeout_ms=60_000 + i * 5_000)
            client.register(scope=YESTERDAY, op_id="report", keys=["done"], timeout_ms=600_000)
            client.signal(YESTERDAY, "done")
            report_deadline_ms = client.get(NIGHTLY, "report")["deadline_ms"]
        broken = {"v": 1, "type": "register", "scope": NIGHTLY, "op_id": "broken", "keys": "x"}
        _produce(
            kafka_broker,
            [(settings.topic_requests, NIGHTLY.encode(), json.dumps(broken).encode())],
        )
        settled = _until_overview(
            url,
            lambda o: len(o["outcomes"]) >= 2 and o["dead_letters"],
            "the late expiry, the completion and the dead letter",
        )
        [letter] = settled["dead_letters"]
        assert letter["field"] is not None and "keys" in letter["field"]

        page = browser_page
        page.goto(f"{url}/ui")

        # The page asks for the token: a wrong one is refused, the right one kept in the tab.
        expect(page.locator("#login")).to_be_visible()
        page.fill("#token", "not-the-token-at-all")
        page.click("#login-form button")
        expect(page.locator("#login-error")).to_have_text("That token was refused.")
        page.fill("#token", TOKEN)
        page.click("#login-form button")
        expect(page.locator("#login")).to_be_hidden()
        assert TOKEN not in page.url
        assert page.evaluate("sessionStorage.getItem('purgatory.token')") == TOKEN

        # Partitions: both served, each with the journal records its restore replayed, as
        # /readyz gives them (none when the first run's last snapshot covered its journal).
        rows = page.locator("#partitions tbody tr")
        expect(rows).to_have_count(PARTITIONS)
        for partition in range(PARTITIONS):
            expect(page.locator(f'#partitions tr[data-partition="{partition}"]')).to_contain_text(
                "serving"
            )
        late_partition = partition_for(NIGHTLY, PARTITIONS)
        restored = page.locator(f'#partitions tr[data-partition="{late_partition}"] td')
        replayed = httpx.get(f"{url}/readyz").json()["partitions"][str(late_partition)]
        assert int(restored.nth(2).inner_text().replace(",", "")) == replayed["restore_records"]
        assert restored.nth(4).inner_text() == "0"  # one writer: never fenced

        # Busiest scopes, with their counts and partitions.
        for scope, count in ((SESSIONS, 3), (NIGHTLY, 1), (QUORUM, 1)):
            row = page.locator(f'#scopes tr[data-scope="{scope}"] td')
            expect(row.nth(1)).to_have_text(str(count))
            expect(row.nth(2)).to_have_text(str(partition_for(scope, PARTITIONS)))
        expect(page.locator("#scopes tbody tr").first).to_have_attribute("data-scope", SESSIONS)

        # A scope's operations: what each still waits for, and its deadline.
        page.click(f'#scopes tr[data-scope="{NIGHTLY}"]')
        report = page.locator('#operations tr[data-op="report"]')
        expect(report.locator(".chip.missing")).to_have_text(["ingest/users", "ingest/stock"])
        expect(report.locator(".chip.got")).to_have_text(["ingest/orders"])
        expect(report).to_contain_text("2 missing")
        expect(report).to_contain_text(_stamp(report_deadline_ms))
        page.fill("#pick-scope", QUORUM)
        page.click("#pick button")
        replicas = page.locator('#operations tr[data-op="replicas"]')
        expect(replicas.locator(".chip.missing")).to_have_text(["r2", "r3"])
        expect(replicas).to_contain_text("1 more of the missing")

        # Next deadlines: the timers first, in order, on the timeline too.
        deadlines = page.locator("#deadlines tbody tr")
        expect(deadlines).to_have_count(5)
        expect(deadlines.nth(0)).to_have_attribute("data-op", "user-0")
        expect(deadlines.nth(2)).to_have_attribute("data-op", "user-2")
        expect(page.locator("#timeline .mark")).to_have_count(5)

        # Recent outcomes: the late expiry marked, the completion; the dead letter's reason.
        late = page.locator('#outcomes tr[data-op="late-1"]')
        expect(late.locator(".badge.expired")).to_have_text("expired")
        expect(late.locator(".badge.late")).to_have_text("late")
        expect(late.locator(".chip.missing")).to_have_text(["ingest/late"])
        done = page.locator('#outcomes tr[data-op="report"]')
        expect(done.locator(".badge.completed")).to_have_text("completed")
        expect(done.locator(".badge.late")).to_have_count(0)
        dead = page.locator("#dead-letters tbody tr")
        expect(dead).to_have_count(1)
        expect(dead.locator(".reason")).to_contain_text(letter["reason"])
        expect(dead).to_contain_text(f"field: {letter['field']}")
        expect(dead).to_contain_text(f"{settings.topic_requests}[")

        # It updates itself: an operation registered now appears, and the time moves on.
        page.click(f'#scopes tr[data-scope="{NIGHTLY}"]')
        expect(report).to_be_visible()
        before = int(page.locator("#status-line").get_attribute("data-updated-ms") or 0)
        with PurgatoryClient(url, token=TOKEN) as client:
            client.register(scope=NIGHTLY, op_id="fresh", keys=["ingest/fresh"], timeout_ms=90_000)
        expect(page.locator('#operations tr[data-op="fresh"]')).to_be_visible()
        expect(page.locator(f'#scopes tr[data-scope="{NIGHTLY}"] td').nth(1)).to_have_text("2")
        after = int(page.locator("#status-line").get_attribute("data-updated-ms") or 0)
        assert after > before
        expect(page.locator("#status-line")).to_contain_text("Updated")

        if os.environ.get("PURGATORY_RECORD_UI") == "1":
            page.screenshot(path=str(SCREENSHOT), full_page=True)


@pytest.fixture(scope="module")
def served_with_token(
    tansu_broker: Broker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``purgatory serve`` with an API token, one operation pending in ``NIGHTLY``: its URL.

    On Tansu alone: see the module docstring."""
    settings = _settings(tansu_broker)
    log = tmp_path_factory.mktemp("ui-sizes") / "service.log"
    with service_process(
        tansu_broker.bootstrap_servers, log, _env(settings), partitions=PARTITIONS
    ) as child:
        with PurgatoryClient(child.url, token=TOKEN) as client:
            client.register(
                scope=NIGHTLY, op_id="report", keys=["ingest/orders"], timeout_ms=600_000
            )
        yield child.url


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size['width']}x{size['height']}")
def test_the_token_is_taken_at_every_common_screen_size(
    served_with_token: str, browser_page: Page, size: ViewportSize
) -> None:
    page = browser_page
    page.set_viewport_size(size)
    page.goto(f"{served_with_token}/ui")
    expect(page.locator("#login")).to_be_visible()
    page.locator("#token").click(timeout=CLICK_MS)  # real clicks: they fail if covered
    page.keyboard.type(TOKEN)
    page.get_by_role("button", name="Use token").click(timeout=CLICK_MS)
    expect(page.locator("#login")).to_be_hidden()

    # What only the token shows: the pending operation's scope, then its operations.
    scope = page.locator(f'#scopes tr[data-scope="{NIGHTLY}"]')
    expect(scope.locator("td").nth(1)).to_have_text("1")
    expect(page.locator("#status-line")).to_contain_text("Updated")
    scope.click(timeout=CLICK_MS)
    expect(page.locator('#operations tr[data-op="report"]')).to_contain_text("ingest/orders")
    page.get_by_role("button", name="Pause").click(timeout=CLICK_MS)
    expect(page.get_by_role("button", name="Resume")).to_be_visible()
