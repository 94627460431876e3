"""The web UI over HTTP (a real uvicorn server): pages, escaping, read-only mode, sessions, CSRF, actions, no secrets."""

from __future__ import annotations

import json
import re
import time

import pytest

import jobs
from uitools import TOKEN, Client, serve

pytest.importorskip("starlette")
T = 60
EVIL = "<script>alert(1)</script>"


def _populated(db):
    """A done chain, a failed job whose key and message hold markup, a batch, a job held back an hour."""
    ex = db.executor(2)
    a = ex.submit(jobs.add, 1, 2)
    b = ex.submit(jobs.add, a, 3)
    bad = ex.options(key=f"{db.prefix}{EVIL}", group="g<b>").submit(jobs.fail, EVIL)
    with ex.batch() as batch:
        for i in range(3):
            batch.submit(jobs.square, i)
    later = ex.options(delay=3600, group="later").submit(jobs.add, 0, 0)
    assert b.result(timeout=T) == 6 and batch.result(timeout=T) == [0, 1, 4]
    with pytest.raises(jobs.CustomError):
        bad.result(timeout=T)
    ex.flush()
    return ex, a, b, bad, batch, later


def test_every_page_renders_and_escapes_what_the_database_holds(db):
    ex, a, b, bad, batch, later = _populated(db)
    elsewhere = ex.options(queue="elsewhere").submit(jobs.add, 1, 1)  # a queue this executor does not serve
    ex.flush()
    store = db.store()
    try:
        with serve(store) as base:
            web = Client(base)
            pages = [
                "/", "/jobs", "/jobs?state=failed", "/jobs?group=g%3Cb%3E", "/jobs?function=jobs.add&newer=1h",
                f"/jobs/{bad.job_id}", f"/jobs/{b.job_id}", f"/graph?job={b.job_id}", f"/graph?job={batch.job_id}",
                f"/graph?key={db.prefix}", "/graph", "/workers", "/login",
            ]
            for path in pages:
                r = web.get(path)
                assert r.status == 200, (path, r.status, r.text[:500])
                assert EVIL not in r.text and "g<b>" not in r.text, path
                assert r.headers["content-security-policy"].startswith("default-src 'self'")
            failed = web.get(f"/jobs/{bad.job_id}").text
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in failed and "Traceback (most recent call last)" in failed
            assert "CustomError" in failed and "g&lt;b&gt;" in failed
            chain = web.get(f"/jobs/{b.job_id}").text
            assert f'href="/jobs/{a.job_id}"' in chain and f'href="/graph?job={b.job_id}"' in chain
            graph = web.get(f"/graph?job={b.job_id}").text
            assert graph.count('class="node st-done"') == 2 and "<svg" in graph
            listed = web.get("/jobs?state=failed").text
            assert f'data-job="{bad.job_id}"' in listed and f'data-job="{b.job_id}"' not in listed
            queued = web.get("/jobs?queue=elsewhere").text
            assert f'data-job="{elsewhere.job_id}"' in queued and f'data-job="{bad.job_id}"' not in queued
            assert {j["id"] for j in json.loads(web.get("/api/jobs?queue=elsewhere").text)["jobs"]} == {elsewhere.job_id}
            assert web.get("/jobs/987654").status == 404
            assert web.get("/jobs?newer=soon").status == 400
            assert web.get("/static/app.js").status == 200 and web.get("/static/app.css").status == 200
            api = json.loads(web.get(f"/api/jobs/{bad.job_id}").text)
            assert api["key"].endswith(EVIL) and api["function"] == "jobs.fail" and "traceback" in api
            page = json.loads(web.get("/api/jobs?state=done").text)
            assert {j["state"] for j in page["jobs"]} == {"done"}
            assert json.loads(web.get("/api/overview").text)["states"]["failed"] == 1
            assert json.loads(web.get(f"/api/graph?job={batch.job_id}").text)["nodes"]
            metrics = web.get("/metrics").text
            assert 'dbexecutor_jobs{group="later",state="ready"} 1.0' in metrics
    finally:
        store.close()


@pytest.mark.databases("sqlite")
def test_without_a_token_nothing_can_be_changed(db):
    ex, a, b, bad, batch, later = _populated(db)
    store = db.store()
    try:
        with serve(store) as base:
            web = Client(base)
            for path in ("/", f"/jobs/{bad.job_id}", f"/jobs/{later.job_id}"):
                page = web.get(path).text
                assert 'method="post"' not in page and "read-only" in page, path
            assert "without a token" in web.get("/login").text
            assert web.post("/login", {"token": TOKEN}).status == 403
            for path in (f"/jobs/{bad.job_id}/retry", f"/jobs/{later.job_id}/cancel", "/groups/later/pause"):
                refused = web.post(path, {"csrf": "x"}, headers={"Authorization": f"Bearer {TOKEN}"})
                assert refused.status == 403 and "read-only" in refused.text
        assert db.row(bad.job_id).state == "failed" and db.row(later.job_id).state == "ready"
    finally:
        store.close()


@pytest.mark.databases("sqlite")
def test_actions_need_a_session_a_csrf_token_and_this_origin(db):
    ex, a, b, bad, batch, later = _populated(db)
    store = db.store()
    try:
        with serve(store, token=TOKEN) as base:
            web = Client(base)
            assert 'method="post"' not in web.get(f"/jobs/{bad.job_id}").text  # not logged in: no action offered
            assert web.post("/login", {"token": "wrong-token-000"}).status == 403
            assert web.post(f"/jobs/{bad.job_id}/retry", {"retries": "0"}).status == 403  # no session
            web.login()
            page = web.get(f"/jobs/{bad.job_id}")
            assert 'action="/jobs/%d/retry"' % bad.job_id in page.text and TOKEN not in page.text
            assert web.post(f"/jobs/{bad.job_id}/retry", {"retries": "0"}).status == 403  # no CSRF token
            assert web.post(f"/jobs/{bad.job_id}/retry", {"retries": "0", "csrf": "0" * 64}).status == 403
            forged = web.post(f"/jobs/{bad.job_id}/retry", {"retries": "0", "csrf": page.csrf()},
                              headers={"Origin": "http://evil.example"})
            assert forged.status == 403 and "another site" in forged.text
            assert db.row(bad.job_id).state == "failed"
            done = web.post(f"/jobs/{bad.job_id}/retry", {"retries": "1", "csrf": page.csrf()}, headers={"Origin": base})
            assert done.status == 303 and "retried" in done.headers["location"]
            assert db.row(bad.job_id).retries == 2  # attempt 1, then one more retry after the next attempt
            csrf = page.csrf()
            assert web.post(f"/jobs/{later.job_id}/cancel", {"csrf": csrf}).status == 303
            assert db.row(later.job_id).state == "cancelled"
            again = web.post(f"/jobs/{later.job_id}/cancel", {"csrf": csrf})
            assert again.status == 303 and "refused=" in again.headers["location"]
            assert web.post("/groups/later/pause", {"csrf": csrf}).status == 303
            assert {g.name: g.limit for g in store.groups()}["later"] == 0
            assert "Resume" in web.get("/").text
            assert web.post("/groups/later/resume", {"csrf": csrf, "limit": "3"}).status == 303
            assert {g.name: g.limit for g in store.groups()}["later"] == 3
            assert web.post("/groups/nosuch/pause", {"csrf": csrf}).status == 303
            assert web.post("/logout", {"csrf": csrf}).status == 303
            web.jar.clear()
            assert 'method="post"' not in web.get("/").text
            # A script: the token as a bearer, JSON back, no CSRF token needed.
            script = Client(base)
            reply = script.post("/groups/later/pause", {}, headers={"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"})
            assert reply.status == 200 and json.loads(reply.text) == {"done": "group later paused"}
    finally:
        store.close()


@pytest.mark.databases("sqlite")
def test_terminate_from_the_ui(db, tmp_path):
    ex = db.executor(1, heartbeat_interval=0.3)
    gate = str(tmp_path / "never")
    fut = ex.submit(jobs.wait_for_file, gate, None, 120.0)
    end = time.monotonic() + T
    while db.row(fut.job_id).state != "running":
        assert time.monotonic() < end
        time.sleep(0.05)
    store = db.store()
    try:
        with serve(store, token=TOKEN) as base:
            web = Client(base)
            web.login()
            page = web.get(f"/jobs/{fut.job_id}")
            assert "Terminate" in page.text
            assert web.post(f"/jobs/{fut.job_id}/terminate", {"csrf": page.csrf()}).status == 303
            assert fut.exception(timeout=T) is not None or fut.cancelled()
            assert db.row(fut.job_id).state == "cancelled"
            assert ">terminated<" in web.get(f"/jobs/{fut.job_id}").text
    finally:
        store.close()


@pytest.mark.databases("postgresql")
def test_no_password_token_or_secret_in_any_page(db):
    from sqlalchemy.engine import make_url

    from dbexecutor.store import Store

    password, secret = "hunter2-db-password", "the signing secret 42"
    url = make_url(db.url).set(password=password).render_as_string(hide_password=False)
    try:
        store = Store(url, db.prefix, signer=__import__("dbexecutor").serialization.Signer(secret))
    except Exception as error:  # noqa: BLE001 - a server that checks passwords cannot take this one
        pytest.skip(f"this server refuses the made-up password: {error}")
    try:
        signed = type(db)(db.kind, url, db.prefix).executor(1, secret=secret)
        db.executors.append(signed)
        bad = signed.submit(jobs.fail, "x")
        assert isinstance(bad.exception(timeout=T), jobs.CustomError)
        with serve(store, token=TOKEN) as base:
            web = Client(base)
            web.login()
            paths = ["/", "/jobs", f"/jobs/{bad.job_id}", f"/graph?job={bad.job_id}", "/workers", "/metrics",
                     "/api/overview", "/api/jobs", f"/api/jobs/{bad.job_id}", "/api/workers", "/login"]
            for path in paths:
                text = web.get(path).text
                assert password not in text and TOKEN not in text and secret not in text, path
            assert "valid" in web.get(f"/jobs/{bad.job_id}").text  # the signature was checked, with the secret
            assert "***" in web.get("/").text
    finally:
        store.close()


@pytest.mark.databases("sqlite")
def test_only_loopback_names_are_served_and_pages_link_to_their_neighbours(db):
    ex = db.executor(2)
    futs = [ex.submit(jobs.add, i, 0) for i in range(60)]
    assert [f.result(timeout=T) for f in futs] == list(range(60))
    store = db.store()
    try:
        with serve(store) as base:
            web = Client(base)
            assert web.get("/", headers={"Host": "evil.example"}).status == 400  # DNS rebinding
            first = web.get("/jobs").text
            assert first.count("data-job=") == 50 and "← newer" not in first
            older = re.search(r'href="(/jobs\?before=\d+)" rel="next"', first).group(1)
            second = web.get(older).text
            assert second.count("data-job=") == 10 and "older →" not in second
            newer = re.search(r'href="(/jobs\?after=\d+)" rel="prev"', second).group(1)
            assert web.get(newer.replace("&amp;", "&")).text.count("data-job=") == 50
    finally:
        store.close()
