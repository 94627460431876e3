"""The web UI in a real browser: Debian's chromium, headless, driven through chromedriver by Selenium.

An operator opens the overview, follows a failed job to its traceback, logs
in with the token, retries the job and watches it finish without reloading
the page; without the token no action is offered, and a form posted from
another site is refused. With ``DBEXECUTOR_UI_SCREENSHOTS=DIR`` the tests
save the overview, a job and a graph there (``docs/`` holds the README's).

``.ci/run`` installs chromium and chromium-driver; elsewhere a machine
without them skips these tests, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import jobs
import ops_jobs
from clitools import cli_env, read
from conftest import IN_CI
from uitools import TOKEN, free_port

pytestmark = [pytest.mark.browser, pytest.mark.databases("sqlite")]
T = 60
CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
# Headless, and quiet on the network: this machine has none, and without these
# flags Chromium waits on connection attempts of its own.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1280,1000",
)


def _missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (.ci/run installs chromium and chromium-driver with apt-get)")
    pytest.skip(reason)


def _first(paths: tuple[str, ...], name: str) -> str:
    for path in paths:
        if os.path.exists(path):
            return path
    found = shutil.which(name)
    if found is None:
        _missing(f"no {name} here")
    return str(found)


@pytest.fixture
def browser() -> Iterator[Any]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium is not installed (it is in the test extra)")
    options = webdriver.ChromeOptions()
    options.binary_location = _first(CHROMIUM, "chromium")
    profile = tempfile.mkdtemp(prefix="dbexecutor-chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(_first(CHROMEDRIVER, "chromedriver")), options=options)
    driver.set_page_load_timeout(T)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@contextlib.contextmanager
def ui(db: Any, tmp_path: Any, token: str | None = TOKEN) -> Iterator[str]:
    """``dbexecutor ui`` as a subprocess (the token from the environment), refreshing fast; yields its base URL."""
    port = free_port()
    log = str(tmp_path / f"ui-{port}.log")
    env = cli_env(**({"DBEXECUTOR_UI_TOKEN": token} if token else {}))
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dbexecutor", "ui", db.url, "--prefix", db.prefix, "--port", str(port), "--refresh", "0.5"],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + T
        while True:
            assert proc.poll() is None, read(log)
            try:
                import urllib.request

                urllib.request.urlopen(base + "/static/app.css", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < end, read(log)
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait(driver: Any, check: Any, what: str, timeout: float = T) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # Pages update themselves every few seconds: an element found a moment ago may have
    # been replaced by the time it is read (stale), and the check is simply tried again.
    return WebDriverWait(
        driver, timeout, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    ).until(lambda d: check(d), message=what)


def _read(driver: Any, read: Any, what: str) -> Any:
    """``read(driver)`` taken whole, without a live update replacing an element halfway (see :func:`_wait`)."""
    return _wait(driver, lambda d: (read(d),), what)[0]


def _shot(driver: Any, name: str) -> None:
    where = os.environ.get("DBEXECUTOR_UI_SCREENSHOTS")
    if where:
        os.makedirs(where, exist_ok=True)
        driver.save_screenshot(os.path.join(where, f"ui-{name}.png"))


def _spread_finishes(db: Any) -> None:
    """Move done jobs' finish times back over the last twelve minutes (a picture's data, not a check)."""
    store = db.store()
    try:
        j = store.tables.jobs
        with store.engine.begin() as conn:
            for row in conn.execute(j.select().with_only_columns(j.c.id).where(j.c.state == "done")).all():
                back = 60.0 * ((row.id * 7) % 12) + (row.id % 5) * 3
                conn.execute(j.update().where(j.c.id == row.id).values(finished_at=j.c.finished_at - back))
    finally:
        store.close()


def _css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def test_an_operator_follows_a_failure_to_its_traceback_retries_it_and_sees_it_finish(db, tmp_path, browser):
    ex = db.executor(2, heartbeat_interval=0.3)
    ex.configure_group("ingest", weight=3)
    ex.configure_group("reports", limit=2)
    marker, gate = str(tmp_path / "marker"), str(tmp_path / "gate")
    upstream = [ex.options(group="ingest").submit(jobs.square, i) for i in range(24)]
    total = ex.options(group="ingest", key="etl:2024-01:total").submit(jobs.sum_list, upstream)
    with ex.options(group="ingest").batch() as batch:
        for i in range(5):
            batch.submit(jobs.add, i, total)
    flaky = ex.options(group="reports", key="report:2024-01").submit(jobs.fail_first_time, marker, "second time lucky")
    assert batch.result(timeout=T)[0] == sum(i * i for i in range(24))
    with pytest.raises(jobs.CustomError):
        flaky.result(timeout=T)
    # Submitted last: a short job queued behind it in the same child would wait for it.
    held = ex.options(group="reports").submit(ops_jobs.progress_then_wait, gate, 0.4, "rendering page 4 of 10")
    end = time.monotonic() + T
    while held.progress is None:
        assert time.monotonic() < end
        time.sleep(0.05)
    try:
        with ui(db, tmp_path) as base:
            from selenium.webdriver.common.by import By

            browser.get(base + "/")
            assert browser.title.startswith("Overview")
            chips = _read(browser, lambda d: {c.text.split("\n")[1]: int(c.text.split("\n")[0]) for c in _css(d, ".chip")}, "the chips")
            assert chips["failed"] == 1 and chips["done"] == len(upstream) + 7
            assert "rendering page 4 of 10" in browser.find_element(By.ID, "running").text
            if os.environ.get("DBEXECUTOR_UI_SCREENSHOTS"):
                # For the README's picture only: the jobs above finished within a second;
                # spread their finish times over the last minutes so the chart has a shape.
                _spread_finishes(db)
                time.sleep(1.2)  # past the UI's one-second sharing of reads
                browser.set_window_size(1280, 1450)
                browser.get(base + "/")
                _shot(browser, "overview")
                browser.set_window_size(1280, 1000)

            # The failed chip leads to the list of failed jobs, the row to the job, the job to its traceback.
            browser.find_element(By.CSS_SELECTOR, ".chip.st-failed").click()
            _wait(browser, lambda d: "state=failed" in d.current_url, "the failed jobs")
            rows = _read(browser, lambda d: [r.get_attribute("data-job") for r in _css(d, "#jobs tbody tr[data-job]")], "the rows")
            assert rows == [str(flaky.job_id)]
            browser.find_element(By.CSS_SELECTOR, f'#jobs tbody tr[data-job="{flaky.job_id}"]').find_element(By.LINK_TEXT, str(flaky.job_id)).click()
            _wait(browser, lambda d: d.current_url.endswith(f"/jobs/{flaky.job_id}"), "the job's page")
            assert "CustomError: first attempt fails" in browser.find_element(By.ID, "traceback").text
            assert _css(browser, "form.action") == []  # not logged in: nothing offered

            browser.find_element(By.LINK_TEXT, "log in").click()
            browser.find_element(By.NAME, "token").send_keys(TOKEN)
            browser.find_element(By.CSS_SELECTOR, "form.login button").click()
            _wait(browser, lambda d: "actions enabled" in d.page_source, "logged in")

            browser.get(f"{base}/jobs/{flaky.job_id}")
            browser.find_element(By.ID, "job")
            browser.find_element(By.CSS_SELECTOR, f'form[action="/jobs/{flaky.job_id}/retry"] button').click()
            _wait(browser, lambda d: "retried" in d.find_element(By.CSS_SELECTOR, ".notice").text, "the retry")
            browser.find_element(By.ID, "job")  # the page is back after the retry
            loaded = browser.execute_script("return performance.timeOrigin")
            # The job runs again and finishes; the page follows without a reload.
            _wait(browser, lambda d: d.find_element(By.ID, "job").get_attribute("data-state") == "done", "the job done, live")
            assert browser.execute_script("return performance.timeOrigin") == loaded
            assert flaky.job_id and ex.future(flaky.job_id).result(timeout=T) == "second time lucky"
            outcomes = _read(browser, lambda d: [c.text for c in _css(d, "#job span.out")], "the attempts")
            assert outcomes == ["exception", "ok"]
            _shot(browser, "job")

            browser.get(f"{base}/graph?job={batch.job_id}")
            nodes = _read(browser, lambda d: [n.get_attribute("data-state") for n in _css(d, "svg.dag a.node")], "the nodes")
            assert len(nodes) == 1 + 5 + 1 + len(upstream)  # the batch, its children, the total and its inputs
            assert set(nodes) == {"done"}
            _shot(browser, "graph")
    finally:
        open(gate, "w").close()


def test_without_the_token_no_action_is_offered_and_a_forged_post_is_refused(db, tmp_path, browser):
    from selenium.webdriver.common.by import By

    ex = db.executor(1)
    bad = ex.submit(jobs.fail, "leave me failed")
    with pytest.raises(jobs.CustomError):
        bad.result(timeout=T)
    with ui(db, tmp_path, token=None) as base:
        browser.get(f"{base}/jobs/{bad.job_id}")
        assert _css(browser, "form[method=post]") == [] and _css(browser, "a[href='/login']") == []
        assert "read-only" in browser.find_element(By.TAG_NAME, "header").text
    with ui(db, tmp_path) as base, _other_site(f"{base}/jobs/{bad.job_id}/retry") as evil:
        browser.get(base + "/login")
        browser.find_element(By.NAME, "token").send_keys(TOKEN)
        browser.find_element(By.CSS_SELECTOR, "form.login button").click()
        _wait(browser, lambda d: "actions enabled" in d.page_source, "logged in")
        # Another site's page posts a form to the UI while the operator is logged in.
        browser.get(evil)
        _wait(browser, lambda d: d.current_url.startswith(base), "the forged post sent")
        _wait(browser, lambda d: "Refused" in d.title, "the refusal")
        assert "CSRF" in browser.page_source or "another site" in browser.page_source
    assert db.row(bad.job_id).state == "failed" and len(db.attempts(bad.job_id)) == 1


@contextlib.contextmanager
def _other_site(target: str) -> Iterator[str]:
    """A page on another port that posts a form to ``target`` as soon as it loads (what a CSRF attack does)."""
    page = (
        "<!doctype html><html><head><title>cute cats</title></head><body>"
        f'<form id="f" method="post" action="{target}"><input type="hidden" name="retries" value="5"></form>'
        "<script>document.getElementById('f').submit()</script></body></html>"
    ).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
