"""The web tree explorer at /ui, end to end in real headless Chromium (Playwright driving
Debian's /usr/bin/chromium). Writes a screenshot to build/screenshots/ui-explorer.png."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arbormem import Memory
from tests.conftest import chat

from .conftest import TOKENS, LiveServer, seed

CHROMIUM = os.environ.get("ARBORMEM_CHROMIUM", "/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
    pytest.skip(f"UI tests need Chromium at {CHROMIUM} (apt-get install chromium; "
                "scripts/system-deps.sh does it in CI)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="UI tests need: pip install playwright")


@pytest.fixture
def server(tmp_path: Path, demo_data: dict[str, Any]) -> Iterator[LiveServer]:
    from arbormem.server.app import create_app

    mem = Memory(tmp_path / "ui.db", embedder="hash")
    seed(mem)
    mem.add_many(demo_data["exchanges"], user_id="alice")
    # Stored markup must render as text, never run.
    mem.add(chat('<img src=x onerror="window.__pwned=1"> is my avatar markup', "<b>bold</b> reply"),
            user_id="alice")
    # A multi-party exchange: its messages name their speakers.
    mem.add([{"role": "user", "name": "Maria", "content": "I signed up for pottery classes on Tuesdays."},
             {"role": "assistant", "name": "John", "content": "Pottery sounds relaxing."}], user_id="alice")
    srv = LiveServer(create_app(mem, tokens=TOKENS))
    yield srv
    srv.stop()
    mem.close()


@pytest.fixture
def page() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                                     args=ARGS, headless=True)
        pg = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        pg.on("pageerror", lambda exc: errors.append(str(exc)))
        pg.js_errors = errors  # type: ignore[attr-defined]
        yield pg
        browser.close()


def _login(page: Any, url: str, token: str, user: str) -> None:
    page.goto(url + "/ui/")
    page.fill("#token", token)
    page.fill("#user", user)
    page.click("#login button[type=submit]")


def test_explorer_tree_topic_search_and_recall(server: LiveServer, page: Any, tmp_path: Path) -> None:
    _login(page, server.url, "tok-alice-bob", "alice")
    page.wait_for_selector("#tree .node")
    assert "exchanges" in page.text_content("#tree-stats")
    themes = page.locator("#tree > .node")
    assert themes.count() >= 1
    # Top-level themes are open, deeper levels collapsed; expanding shows every topic leaf.
    assert page.locator("#tree > .node.collapsed").count() == 0
    assert page.locator("#tree > .node > ul > .node").first.is_visible()
    page.click("#expand-all")
    leaves = page.locator('.node[data-kind="topic"]')
    assert leaves.count() >= 3
    first = leaves.first
    assert first.locator(".size").text_content().strip().isdigit()
    assert first.locator(".dates").text_content().strip()[:2] in ("20",)

    # Collapse / expand a theme by clicking it.
    theme = page.locator('#tree .node[data-kind="theme"]').first
    if theme.count():
        theme.locator(":scope > .label").click()
        assert "collapsed" in (theme.get_attribute("class") or "")
        theme.locator(":scope > .label").click()
        assert "collapsed" not in (theme.get_attribute("class") or "")

    # A topic's summary, detail and verbatim exchanges.
    first.locator(":scope > .label").click()
    page.wait_for_selector("#topic-exchanges li")
    # The topic pane fills asynchronously after the click: wait for it, then compare.
    expected = first.locator(".title").text_content().strip()
    page.wait_for_function(
        "t => document.querySelector('#topic-title').textContent.trim() === t", arg=expected)
    assert page.text_content("#topic-title").strip() == expected
    assert page.locator("#topic-exchanges li").count() >= 1
    assert page.text_content("#topic-detail-src") == "(extractive)"
    page.click("#topic-packet-box summary")
    assert page.text_content("#topic-packet").startswith("## ")

    # Search, then open the hit's topic.
    page.fill("#search-q", "peanut allergy")
    page.click("#search-form button")
    page.wait_for_selector("#search-results .hit")
    assert "peanut" in page.text_content("#search-results .hit").lower()
    page.click("#search-results .hit")
    page.wait_for_function("document.querySelector('#topic-exchanges').textContent.toLowerCase().includes('peanut')")

    # What recall would inject at N tokens, with provenance.
    page.fill("#recall-q", "What snacks should I bring for Leo?")
    page.fill("#recall-n", "300")
    page.click("#recall-form button[type=submit]")
    page.wait_for_selector("#recall-prov li")
    meta = page.text_content("#recall-meta")
    used = int(meta.split(" of ")[0])
    assert 0 < used <= 300 and "of 300 tokens" in meta
    assert page.text_content("#recall-text").startswith("<memory-context>")
    assert page.locator("#recall-prov li .path").count() >= 1

    # Markup stored in memory is shown as text and never executed; no script errors.
    page.fill("#search-q", "avatar markup")
    page.click("#search-form button")
    page.wait_for_selector("#search-results .hit")
    assert "<img" in page.text_content("#search-results")
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#search-results img").count() == 0

    # Messages that name their speaker show the name where others show the role.
    page.fill("#search-q", "pottery classes")
    page.click("#search-form button")
    page.wait_for_selector("#search-results .hit")
    page.click("#search-results .hit")
    page.wait_for_function("document.querySelector('#topic-exchanges').textContent.includes('pottery classes')")
    roles = page.locator("#topic-exchanges .msg .role").all_text_contents()
    assert roles[:2] == ["Maria:", "John:"]
    assert page.js_errors == []

    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / "ui-explorer.png"
    page.screenshot(path=str(shot), full_page=True)
    page.screenshot(path=str(tmp_path / "ui-explorer.png"))
    assert shot.stat().st_size > 10_000


def test_explorer_enforces_the_token(server: LiveServer, page: Any) -> None:
    _login(page, server.url, "tok-alice-bob", "carol")
    page.wait_for_function("document.querySelector('#status').textContent.includes('forbidden')")
    assert page.locator("#tree .node").count() == 0
    _login(page, server.url, "wrong-token", "alice")
    page.wait_for_function("document.querySelector('#status').textContent.includes('unauthorized')")
    assert page.locator("#tree .node").count() == 0
    assert "cello" not in page.content()


def test_a_slow_answer_to_an_earlier_click_does_not_overwrite_a_later_one(
        tmp_path: Path, demo_data: dict[str, Any], page: Any) -> None:
    """Clicking a theme and then one of its topics sends two requests; when the theme's answer
    comes last (held back here on the server), the pane must still show the topic."""
    import asyncio

    from arbormem.server.app import create_app

    mem = Memory(tmp_path / "ui.db", embedder="hash")
    mem.add_many(demo_data["exchanges"], user_id="alice")
    app = create_app(mem, tokens=TOKENS)
    hold: dict[str, str] = {}

    @app.middleware("http")
    async def slow_for_one_topic(request: Any, call_next: Any) -> Any:
        if hold.get("id") and request.url.path.endswith("/topics/" + hold["id"]):
            await asyncio.sleep(1.0)
        return await call_next(request)

    srv = LiveServer(app)
    try:
        _login(page, srv.url, "tok-alice-bob", "alice")
        page.wait_for_selector("#tree .node")
        page.click("#expand-all")
        theme = page.locator('#tree > .node[data-kind="theme"]').first
        topic = theme.locator('.node[data-kind="topic"]').first
        hold["id"] = theme.get_attribute("data-id")
        expected = topic.locator(":scope > .label .title").text_content().strip()
        assert expected != theme.locator(":scope > .label .title").text_content().strip()
        held: list[str] = []
        page.on("response", lambda r: held.append(r.url) if "/topics/" + hold["id"] + "?" in r.url else None)
        # Collapse and re-open the theme (each click also opens its pane), then open the topic.
        theme.locator(":scope > .label").click()
        theme.locator(":scope > .label").click()
        topic.locator(":scope > .label").click()
        page.wait_for_function(
            "t => document.querySelector('#topic-title').textContent.trim() === t", arg=expected)
        for _ in range(100):  # the two held-back answers to the earlier clicks arrive...
            if len(held) == 2:
                break
            page.wait_for_timeout(50)
        assert len(held) == 2
        page.wait_for_timeout(100)
        assert page.text_content("#topic-title").strip() == expected  # ...and change nothing
        assert page.js_errors == []
    finally:
        srv.stop()
        mem.close()


def test_deleting_a_theme_shows_the_count_first_and_deletes_exactly_that(
        tmp_path: Path, demo_data: dict[str, Any], page: Any) -> None:
    from arbormem.check import check
    from arbormem.server.app import create_app

    mem = Memory(tmp_path / "ui.db", embedder="hash")
    seed(mem)
    mem.add_many(demo_data["exchanges"], user_id="alice")
    theme = next(t for t in mem.tree(user_id="alice").walk()
                 if t.kind == "theme" and sum(1 for x in t.walk() if x.kind == "topic") > 1)
    leaves = {t.id for t in theme.walk() if t.kind == "topic"}
    doomed = [e.id for e in mem.exchanges(user_id="alice") if e.topic_id in leaves]
    everything = [e.id for e in mem.exchanges(user_id="alice")]
    srv = LiveServer(create_app(mem, tokens=TOKENS))
    try:
        _login(page, srv.url, "tok-alice-bob", "alice")
        page.wait_for_selector("#tree .node")
        page.click("#expand-all")
        node = page.locator(f'#tree .node[data-id="{theme.id}"]')
        node.locator(":scope > .label").click()
        page.wait_for_function(
            "t => document.querySelector('#topic-title').textContent.trim() === t", arg=theme.title)
        assert page.locator("#forget-box").is_hidden()

        # The count comes first; cancelling deletes nothing.
        page.click("#forget")
        page.wait_for_selector("#forget-box", state="visible")
        assert page.text_content("#forget-msg") == f"Delete {len(doomed)} exchanges in {len(leaves)} topics?"
        page.click("#forget-no")
        assert page.locator("#forget-box").is_hidden()
        assert [e.id for e in mem.exchanges(user_id="alice")] == everything

        page.click("#forget")
        page.wait_for_selector("#forget-box", state="visible")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "ui-forget.png"))
        page.click("#forget-yes")
        page.wait_for_function("document.querySelector('#status').textContent.startsWith('deleted')")
        assert page.text_content("#status") == f"deleted {len(doomed)} exchanges in {len(leaves)} topics"
        assert page.locator(f'#tree .node[data-id="{theme.id}"]').count() == 0
        assert page.locator("#topic").is_hidden()
        assert [e.id for e in mem.exchanges(user_id="alice")] == [x for x in everything if x not in doomed]
        assert len(mem.exchanges(user_id="carol")) == 2
        assert check(mem).ok
        assert page.js_errors == []
    finally:
        srv.stop()
        mem.close()


def test_a_deep_topic_card_comes_into_view(server: LiveServer, page: Any) -> None:
    page.set_viewport_size({"width": 1100, "height": 420})
    _login(page, server.url, "tok-alice-bob", "alice")
    page.wait_for_selector("#tree .node")
    page.click("#expand-all")
    last = page.locator('.node[data-kind="topic"]').last
    last.scroll_into_view_if_needed()
    assert page.evaluate("window.scrollY") > 0  # the tree is longer than the window
    last.locator(":scope > .label").click()
    expected = last.locator(":scope > .label .title").text_content().strip()
    page.wait_for_function("t => document.querySelector('#topic-title').textContent.trim() === t", arg=expected)
    top = page.evaluate("document.querySelector('#topic').getBoundingClientRect().top")
    assert -2 <= top < 420, top  # in the window (sub-pixel rounding aside)
    assert page.js_errors == []


def test_docs_render_offline_with_an_authorize_button(server: LiveServer, page: Any) -> None:
    """/docs is Swagger UI from the server's own files: every request the page makes goes to
    the server itself (anything else is recorded and aborted), and Authorize is there."""
    outside: list[str] = []

    def route(r: Any) -> None:
        if r.request.url.startswith(server.url):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(server.url + "/docs")
    page.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
    assert "arbormem" in page.text_content(".swagger-ui .info .title")
    page.wait_for_selector("button.authorize")
    page.wait_for_selector(".opblock-tag-section", timeout=30_000)
    assert page.locator(".opblock").count() >= 20  # every route is listed
    page.click("button.authorize")
    page.wait_for_selector(".modal-ux")
    assert "bearerAuth" in page.text_content(".modal-ux")
    page.fill(".modal-ux input", "tok-alice-bob")
    page.click(".modal-ux button.authorize")
    page.click(".modal-ux button.close-modal")
    # Try /v1/me with the token just entered: the browser sends it.
    me = page.locator(".opblock", has_text="/v1/me").first
    me.locator(".opblock-summary").click()
    # The operation body renders after the click: wait for its "Try it out" button (counting
    # it at once raced the rendering and skipped it, so "Execute" never appeared).
    me.locator("button.try-out__btn").wait_for(timeout=30_000)
    me.locator("button.try-out__btn").click()
    me.locator("button.execute").click()
    status = me.locator(".live-responses-table tbody .response-col_status").first
    status.wait_for()
    assert status.text_content().strip().startswith("200")
    assert "alice" in page.text_content(".live-responses-table")
    assert outside == [] and page.js_errors == []
