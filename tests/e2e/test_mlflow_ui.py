"""The MLflow UI shows what data scientists look for: runs with their metrics, and the registered router
with its `champion` alias. Real server (`make mlflow-ui`'s command on a temp store), headless Chromium.

Needs Debian's chromium and chromium-driver (`apt-get install -y chromium chromium-driver`); skips
without them. Screenshots are left in the test's tmp dir (and copied to $ROUTEROPS_UI_SCREENSHOTS
when set).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
CHROME_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=2400,1100")
EXPERIMENT = "routerops-ui-test"
MODEL_METRICS = {"v1": {"aiq": 0.6125, "best_accuracy": 0.6375}, "v2": {"aiq": 0.8375, "best_accuracy": 0.9125}}
WAIT_S = 90  # the SPA loads its bundle and queries the server; a busy 2-core machine is slow



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ui_command(store: Path, artifacts: Path) -> list[str]:
    """`make mlflow-ui`'s recipe with the store and port of this test (the Makefile's own line is
    checked below, so the two cannot drift apart unnoticed)."""
    mlflow = str(Path(sys.executable).parent / "mlflow")
    return [mlflow, "ui", "--backend-store-uri", f"sqlite:///{store}", "--default-artifact-root", str(artifacts),
            "--host", "127.0.0.1", "--port", os.environ["MLFLOW_PORT"], "--workers", "1"]


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A store with two registered router versions (runs with metrics) and gate runs; v2 is champion."""
    sys.path.insert(0, str(REPO / "tests" / "evaluation"))
    try:
        from test_registry import BOOK, GATE, log_router, routing_data, shuffled, surface_router
    finally:
        sys.path.pop(0)
    import mlflow

    from routerops.config import TrackConfig
    from evaluation.registry import promote_on_logged_grid as promote_if_better
    from evaluation.tracking import use_tracking

    db, artifacts = tmp_path / "mlflow.db", tmp_path / "artifacts"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)  # mlflow sets both; teardown restores them
    use_tracking(TrackConfig(tracking_uri=f"sqlite:///{db}", artifact_root=str(artifacts), experiment=EXPERIMENT))
    # Open on the training-runs view, not the GenAI overview MLflow 3 shows for unknown experiments.
    mlflow.set_experiment_tag("mlflow.experimentKind", "custom_model_development")
    train, test = routing_data(200, seed=11), routing_data(100, seed=12)
    common = dict(price_book_version=BOOK.version, embedding=None, family="surface", include_code=False)
    for label, data in (("v1", shuffled(train)), ("v2", train)):
        reg = log_router(surface_router().fit(data), train, metrics=MODEL_METRICS[label], **common)
        assert promote_if_better(reg.name, reg.version, test, GATE).promote
    experiment_id = mlflow.get_experiment_by_name(EXPERIMENT).experiment_id
    yield db, artifacts, experiment_id
    mlflow.set_tracking_uri(None)


@pytest.fixture
def server(store, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_PORT", str(free_port()))
    log = open(tmp_path / "mlflow-ui.log", "w")
    # MLflow 3's server also starts a pool of job consumers (GenAI judges) the UI does not need here.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(ui_command(*store[:2]), stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, env=env,
                            start_new_session=True)  # its own process group: workers stop with it
    url = f"http://127.0.0.1:{os.environ['MLFLOW_PORT']}"
    try:
        wait_healthy(url, proc, tmp_path / "mlflow-ui.log")
        yield url, store[2]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"mlflow ui exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(f"mlflow ui not healthy after {timeout_s}s:\n{log.read_text()[-3000:]}")


@pytest.fixture
def browser(tmp_path):
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        pytest.skip("needs Debian's chromium and chromium-driver: apt-get install -y chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROME_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver, path: Path) -> None:
    driver.save_screenshot(str(path))
    if os.environ.get("ROUTEROPS_UI_SCREENSHOTS"):
        target = Path(os.environ["ROUTEROPS_UI_SCREENSHOTS"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target / path.name)


def wait_for(driver, xpath: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(ec.visibility_of_element_located((By.XPATH, xpath)))


def grid_rows(driver) -> dict[str, dict[str, str]]:
    """The runs table (an ag-grid: pinned run-name column and scrolling body are separate row sets)
    as {row index: {column id: text}}."""
    cells = driver.execute_script(
        "return Array.from(document.querySelectorAll('.ag-row .ag-cell')).map(c => "
        "[c.closest('.ag-row').getAttribute('row-index'), c.getAttribute('col-id'), c.innerText]);")
    rows: dict[str, dict[str, str]] = {}
    for row, column, text in cells:
        rows.setdefault(row, {})[column or ""] = text.strip()
    return rows


def show_all_metric_columns(driver) -> None:
    from selenium.webdriver.common.keys import Keys

    wait_for(driver, "//button[.//*[normalize-space(text())='Columns'] or normalize-space(.)='Columns']").click()
    wait_for(driver, "//*[starts-with(normalize-space(text()),'Metrics (')]").click()  # ticks the whole group
    driver.find_element("tag name", "body").send_keys(Keys.ESCAPE)


def close_assistant_panel(driver) -> None:
    """MLflow 3 opens an assistant side panel that hides half the table; close it for the screenshot."""
    for button in driver.find_elements("xpath", "//button[@aria-label='Close']"):
        if button.is_displayed():
            button.click()
            return


def test_makefile_target_is_the_command_the_test_runs():
    recipe = (REPO / "Makefile").read_text().split("mlflow-ui:", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"mlflow ui --backend-store-uri sqlite:///\S+", recipe)
    assert "--host 127.0.0.1" in recipe and "--port $${MLFLOW_PORT:-5000}" in recipe


def test_runs_metrics_and_champion_alias_are_visible(server, browser, tmp_path):
    url, experiment_id = server
    browser.get(f"{url}/#/experiments/{experiment_id}/runs")
    wait_for(browser, "//a[contains(normalize-space(.), 'register router-surface')]")
    show_all_metric_columns(browser)
    wait_for(browser, "//*[@role='columnheader'][.//*[normalize-space(text())='best_accuracy']]")
    close_assistant_panel(browser)
    time.sleep(1)  # let the grid render the new columns' cells
    screenshot(browser, tmp_path / "experiment-runs.png")
    rows = list(grid_rows(browser).values())
    register_rows = [r for r in rows if any(re.search(r"metrics.*aiq", k) and v not in ("", "-") for k, v in r.items())]
    shown = sorted(float(next(v for k, v in r.items() if re.search(r"metrics.*aiq", k))) for r in register_rows)
    assert shown == pytest.approx(sorted(m["aiq"] for m in MODEL_METRICS.values()), abs=1e-3), rows
    gate_rows = [r for r in rows if any(re.search(r"metrics.*ci_low", k) and v not in ("", "-") for k, v in r.items())]
    assert len(gate_rows) == 1 and float(np.round(float(
        next(v for k, v in gate_rows[0].items() if re.search(r"metrics.*ci_low", k))), 3)) > 0

    browser.get(f"{url}/#/models/router-surface")
    # The alias chip reads "@\u00a0champion"; the versions table is role-based divs, not <tr>s.
    alias = wait_for(browser, "//*[@role='cell']//span[translate(., '\u00a0', ' ')='@ champion']")
    version_row = alias.find_element("xpath", "./ancestor::*[@role='row'][1]")
    assert "Version 2" in version_row.text and "promotion.decision" in version_row.text
    assert "Version 1" in browser.find_element("tag name", "body").text
    close_assistant_panel(browser)
    screenshot(browser, tmp_path / "registered-model.png")
    assert (tmp_path / "experiment-runs.png").stat().st_size > 10_000
