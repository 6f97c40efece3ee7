"""The pipeline's web page (issue 22 point 3) in a real headless browser.

A tiny warehouse gets two sources and three stream tables (a chain of two, and one broken by a source
schema change, so the page has an error to show). ``trickle ui --warehouse`` serves it from a subprocess,
as a user would start it (no Spark: a local warehouse is read as files), and Debian's Chromium, driven
through chromedriver's WebDriver protocol (plain HTTP and JSON, so no client library), loads the page:
the DAG shows every table and source with its edges, the rows show each table's status, the sparkline has
one bar per refresh, the error is shown with its message, and clicking a table (in the graph, then in the
table) shows its refresh history, checked against the catalog's. Finally a screenshot is taken.

``./dev test`` installs Chromium and chromedriver when missing (apt-get, as root). The screenshot goes to
the test's temporary folder; to refresh the README's, run::

    TRICKLE_UI_SCREENSHOT=docs/ui.png .venv/bin/pytest tests/test_ui.py
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: how long a page element, the server or the browser may take to appear (a deadline, not a measurement)
WAIT_S = 60.0
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the WebDriver spec's key of an element reference


# ------------------------------------------------------------------------------------------ the data


@pytest.fixture(scope="module")
def warehouse(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<wh>/_trickle``: ui_orders -> ui_order_totals -> ui_region_totals <- ui_customers ->
    ui_customer_list, the last in ERROR. Readable names (prefixed ``ui_``, dropped first) since they end up
    in the README's screenshot."""
    from pipeline import SourceChangedError, StreamTables

    wh = tmp_path_factory.mktemp("ui") / "warehouse"
    for t in ("ui_orders", "ui_customers"):
        spark.sql(f"DROP TABLE IF EXISTS {t}")
    cdf = "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    spark.sql(f"CREATE TABLE ui_orders (id INT, customer INT, amount INT) USING delta {cdf}")
    spark.sql(f"CREATE TABLE ui_customers (id INT, region STRING) USING delta {cdf}")
    spark.sql("INSERT INTO ui_orders VALUES (1, 1, 10), (2, 2, 20), (3, 3, 30)")
    spark.sql("INSERT INTO ui_customers VALUES (1, 'north'), (2, 'south'), (3, 'south')")
    st = StreamTables(spark, root=str(wh / "_trickle"))
    st.create_stream_table("ui_order_totals", "SELECT customer, SUM(amount) AS total, COUNT(*) AS orders "
                           "FROM ui_orders GROUP BY customer", schedule="30s", refresh_mode="DIFFERENTIAL")
    st.create_stream_table("ui_region_totals", "SELECT c.region, SUM(t.total) AS total FROM ui_order_totals t "
                           "JOIN ui_customers c ON t.customer = c.id GROUP BY c.region", schedule="1m")
    st.create_stream_table("ui_customer_list", "SELECT * FROM ui_customers", schedule="5m",
                           refresh_mode="DIFFERENTIAL")
    for i in range(2):  # two change cycles: DIFFERENTIAL, then NO_DATA checks (milliseconds each)
        spark.sql(f"INSERT INTO ui_orders VALUES ({10 + i}, {1 + i}, 5)")
        for _ in range(3):
            st.refresh_stream_table("ui_order_totals")
    # ui_region_totals is not refreshed (a join refresh costs seconds here): it shows as stale
    spark.sql("ALTER TABLE ui_customers ADD COLUMNS (tier STRING)")  # SELECT * can no longer be kept
    with pytest.raises(SourceChangedError):
        st.refresh_stream_table("ui_customer_list")
    return wh


# --------------------------------------------------------------------------------- trickle ui process


@pytest.fixture(scope="module")
def page_url(warehouse: Path) -> Iterator[str]:
    """``trickle ui --warehouse <wh> --port 0`` running; its URL (from the line it prints)."""
    p = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "ui", "--warehouse", str(warehouse), "--port", "0"],
                         cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.append(p.stdout.readline() if p.stdout else ""), daemon=True)
    reader.start()
    reader.join(WAIT_S)
    try:
        line = first[0] if first else ""
        assert "serving the pipeline page" in line and "http://" in line, f"trickle ui printed {line!r}"
        yield line[line.index("http://"):].split()[0]
    finally:
        p.send_signal(signal.SIGINT)  # Ctrl-C: it stops cleanly
        try:
            out, _ = p.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            raise
    assert p.returncode == 0, f"trickle ui exited with {p.returncode}:\n{out}"


def _get(url: str, method: str = "GET") -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=WAIT_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# --------------------------------------------------------------------------------------- WebDriver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _browser_paths() -> tuple[str, str]:
    """Chromium and chromedriver from Debian's packages; a clear failure (not a skip) without them."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or next(
        (p for p in ("/usr/lib/chromium/chromedriver", "/usr/bin/chromedriver") if Path(p).exists()), None)
    if browser is None or driver is None:
        pytest.fail("tests/test_ui.py needs Chromium and chromedriver: `./dev test` installs them "
                    "(apt-get install chromium chromium-driver), or install them yourself")
    return browser, driver


class Browser:
    """A headless Chromium session through chromedriver's WebDriver endpoints (W3C WebDriver: JSON over
    HTTP), with the few commands this test needs."""

    def __init__(self, driver_url: str, session: str) -> None:
        self.base = f"{driver_url}/session/{session}"

    @staticmethod
    def call(url: str, method: str = "GET", body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=WAIT_S) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:
            raise AssertionError(f"WebDriver {method} {url}: {e.read().decode(errors='replace')[:2000]}") from None

    def go(self, url: str) -> None:
        self.call(f"{self.base}/url", "POST", {"url": url})

    def js(self, script: str, *args: Any) -> Any:
        return self.call(f"{self.base}/execute/sync", "POST", {"script": script, "args": list(args)})

    def wait(self, script: str, *args: Any) -> Any:
        """Poll ``script`` (a function body) until it returns something truthy; that value."""
        deadline = time.monotonic() + WAIT_S
        while True:
            value = self.js(script, *args)
            if value:
                return value
            assert time.monotonic() < deadline, f"the page never satisfied: {script} {args}"
            time.sleep(0.2)

    def click(self, css: str) -> None:
        """Click the element ``css`` finds; found again if the page redrew it meanwhile (it polls)."""
        for attempt in range(3):
            found = self.call(f"{self.base}/element", "POST", {"using": "css selector", "value": css})
            try:
                self.call(f"{self.base}/element/{found[ELEMENT]}/click", "POST", {})
                return
            except AssertionError as e:
                if "stale element" not in str(e) or attempt == 2:
                    raise

    def screenshot(self) -> bytes:
        """The whole page, from its top: the window is made as tall as the page first."""
        self.js("window.scrollTo(0, 0)")
        chrome, height = self.js("return [window.outerHeight - window.innerHeight, "
                                 "document.documentElement.scrollHeight]")
        self.call(f"{self.base}/window/rect", "POST", {"width": 1440, "height": chrome + height})
        return base64.b64decode(self.call(f"{self.base}/screenshot"))


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    chromium, chromedriver = _browser_paths()
    port = _free_port()
    log = tmp_path_factory.mktemp("chromedriver") / "chromedriver.log"
    with open(log, "w") as out:
        driver = subprocess.Popen([chromedriver, f"--port={port}"], stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                if Browser.call(f"{url}/status").get("ready"):
                    break
            except (OSError, AssertionError):
                pass
            assert driver.poll() is None and time.monotonic() < deadline, f"chromedriver did not start:\n{log.read_text()}"
            time.sleep(0.2)
        # --no-sandbox: Chromium refuses to run as root (CI) with its sandbox
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                "--window-size=1440,1050", "--force-device-scale-factor=1"]
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome",
                                                 "goog:chromeOptions": {"binary": chromium, "args": args}}}}
        session = Browser.call(f"{url}/session", "POST", caps)["sessionId"]
        b = Browser(url, session)
        try:
            yield b
        finally:
            Browser.call(b.base, "DELETE")
    finally:
        driver.terminate()
        driver.wait(WAIT_S)


# ------------------------------------------------------------------------------------------ the tests


TABLES = ("ui_order_totals", "ui_region_totals", "ui_customer_list")
EDGES = {("ui_orders", "ui_order_totals"), ("ui_order_totals", "ui_region_totals"),
         ("ui_customers", "ui_region_totals"), ("ui_customers", "ui_customer_list")}


def test_endpoints_are_json_and_read_only(page_url: str) -> None:
    status, doc = _get(page_url + "api/pipeline")
    assert status == 200 and doc["mode"] == "warehouse"
    rows = {t["name"]: t for t in doc["tables"]}
    assert set(rows) == set(TABLES)
    assert {(e["source"], e["reader"]) for e in doc["dag"]["edges"]} == EDGES
    assert rows["ui_order_totals"]["staleness_s"] == 0.0  # read from the Delta logs, without Spark
    assert [p["action"] for p in rows["ui_order_totals"]["recent"]][-3:] == ["DIFFERENTIAL", "NO_DATA", "NO_DATA"]
    assert rows["ui_region_totals"]["staleness_s"] > 0  # the changes are not in it yet
    status, doc = _get(page_url + "api/history/ui_customer_list?limit=1")
    assert status == 200 and [r["status"] for r in doc["records"]] == ["ERROR"]
    assert _get(page_url + "api/history/no_such_table")[0] == 404
    assert _get(page_url + "api/pipeline", method="POST")[0] == 405


def test_page_in_a_headless_browser(warehouse: Path, page_url: str, browser: Browser, tmp_path: Path) -> None:
    from pipeline import monitor
    from pipeline.catalog import Catalog

    catalog = Catalog(warehouse / "_trickle")
    browser.go(page_url)
    browser.wait("return document.body.dataset.loaded === 'yes'")

    # the DAG: a node per table and source, an arrow per read
    nodes = browser.js("return [...document.querySelectorAll('#dag g.node')].map(g => g.dataset.name)")
    assert sorted(nodes) == sorted([*TABLES, "ui_orders", "ui_customers"]), nodes
    edges = browser.js("return [...document.querySelectorAll('#dag path.edge')]"
                       ".map(p => [p.dataset.source, p.dataset.reader])")
    assert {tuple(e) for e in edges} == EDGES
    assert browser.js("return document.querySelector('#dag g.node[data-name=ui_customer_list]').classList"
                      ".contains('status-ERROR')")

    # the rows: status, mode, staleness, last action, a bar per refresh, the error with its message
    cells = browser.js("""return Object.fromEntries([...document.querySelectorAll('#tables tbody tr')].map(tr =>
        [tr.dataset.name, Object.fromEntries([...tr.children].map(td => [td.className.split(' ')[0], td.innerText]))]))""")
    assert {n: c["status"] for n, c in cells.items()} == {
        "ui_order_totals": "ACTIVE", "ui_region_totals": "ACTIVE", "ui_customer_list": "ERROR"}, cells
    totals = cells["ui_order_totals"]
    assert totals["mode"] == "DIFFERENTIAL" and totals["staleness"] == "0.0s", totals
    assert totals["latest"].startswith("NO_DATA") and totals["work"].startswith("DIFFERENTIAL"), totals
    refreshes = [r for r in catalog.history("ui_order_totals", 50) if monitor.action_of(r)]
    bars = browser.js("return [...document.querySelectorAll('#tables tr[data-name=ui_order_totals] svg.spark rect')]"
                      ".map(r => r.getAttribute('class'))")
    assert bars == [monitor.action_of(r) for r in reversed(refreshes)], bars
    error = catalog.get("ui_customer_list").last_error
    assert error and "output columns changed" in error
    shown = browser.js("return document.querySelector('#errors li[data-name=ui_customer_list]').innerText")
    assert error in shown and not browser.js("return document.getElementById('errors-section').hidden")

    # a click on a table in the graph shows its history, as the catalog has it
    assert browser.js("return document.getElementById('history-section').hidden")
    for name, click in (("ui_customer_list", "#dag g.node[data-name=ui_customer_list]"),
                        ("ui_order_totals", "#tables tbody tr[data-name=ui_order_totals] td.name")):
        browser.click(click)
        records = catalog.history(name, 50)
        shown = browser.wait("""const rows = [...document.querySelectorAll('#history tbody tr')];
            return document.getElementById('history-name').innerText === arguments[0] && rows.length === arguments[1]
              && rows.map(tr => [tr.children[1].innerText, tr.children[2].innerText, tr.children[5].innerText]);""",
                             name, len(records))
        assert [s[:2] for s in shown] == [[r["status"], r["action"] or ""] for r in records], shown
        if name == "ui_customer_list":
            assert error in shown[0][2]
    assert browser.js("return location.hash") == "#table=ui_order_totals"

    png = browser.screenshot()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000, len(png)
    (tmp_path / "ui.png").write_bytes(png)
    target = os.environ.get("TRICKLE_UI_SCREENSHOT")
    if target:  # the documented command that refreshes docs/ui.png
        Path(target).write_bytes(png)


def test_run_serves_the_same_page_beside_the_pipeline(spark: Any, warehouse: Path, tmp_path: Path) -> None:
    """``trickle run --ui``: the view of the running pipeline (its catalog, Spark session, checkpoints)."""
    from pipeline import StreamTables, ui
    from pipeline.cli import build_parser
    from pipeline.conf import load_conf
    from pipeline.errors import TrickleError
    from pipeline.runtime import Runtime

    conf_file = tmp_path / "pipeline.yaml"
    conf_file.write_text(f"warehouse: {warehouse}\nstream_tables:\n  - name: ui_order_totals\n"
                         "    query: SELECT customer, SUM(amount) AS total, COUNT(*) AS orders FROM ui_orders "
                         "GROUP BY customer\n")
    st = StreamTables(spark, root=str(warehouse / "_trickle"))
    rt = Runtime(st, load_conf(conf_file), SimpleNamespace(event=lambda *a, **k: None, error=print), warehouse)
    page = ui.serve(ui.PipelineView.for_runtime(rt), "127.0.0.1:0")
    try:
        status, doc = _get(page.url + "api/pipeline")
    finally:
        page.close()
    assert status == 200 and doc["mode"] == "run" and doc["title"] == str(conf_file)
    assert sorted(t["name"] for t in doc["tables"]) == sorted(TABLES)

    p = build_parser()
    assert p.parse_args(["run", "c.yaml", "--ui", "8421"]).ui == "8421"
    assert p.parse_args(["run", "c.yaml"]).ui is None
    assert p.parse_args(["ui", "--port", "0.0.0.0:9000"]).port == "0.0.0.0:9000"
    assert ui.parse_address("8421") == ("127.0.0.1", 8421)
    assert ui.parse_address("0.0.0.0:80") == ("0.0.0.0", 80)
    with pytest.raises(TrickleError, match="give PORT or HOST:PORT"):
        ui.parse_address("localhost:http")
