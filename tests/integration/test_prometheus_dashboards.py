"""docs/monitoring/ against a real Prometheus (Debian's ``prometheus`` package) and promtool.

A real Prometheus scrapes ``assistant run --no-tui --metrics-port`` on the virtual sound
devices while it answers typed turns: its query API must return the turns of the app's
JSONL log, it must load and evaluate the alert rules, and it must accept every expression of
the Grafana dashboard. promtool checks the config and the rules and runs the rules' unit
tests (``tests/integration/prometheus/alerts_test.yml``). Every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from assistant.observe.gpu import GpuSample
from assistant.observe.metrics import Metrics
from bench.corpus import TYPED_PAIR as TYPED
from tests.helpers.metrics import free_port, wait_records

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "docs" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
ALERTS = MONITORING / "alerts.yml"
# What Grafana puts in place of its own variables; the dashboard's are read from its templating.
GRAFANA_VARIABLES = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h"}


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (scripts/setup.sh --dev installs Debian's prometheus)")
    return path


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every target, Grafana's and the dashboard's variables filled in."""
    board = json.loads(DASHBOARD.read_text())
    values = dict(GRAFANA_VARIABLES)
    for var in board["templating"]["list"]:
        # a query variable (the stations) matches all; an interval or a list takes its default
        values[var["name"]] = ".*" if var["type"] == "query" else var.get("current", {}).get("value", "")

    def fill(expr: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values[m.group(1) or m.group(2)], expr)

    return [(p["title"], fill(t["expr"])) for p in board["panels"] for t in p.get("targets", [])]


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def exported_names() -> set[str]:
    """Every sample name the app can serve, the scrape-time gauges included (a stand-in GPU)."""
    gpu = SimpleNamespace(name="H200", sample=lambda: GpuSample("H200", 0.5, 1, 2))
    metrics = Metrics(gpu=gpu)
    metrics.gauges.decoder = SimpleNamespace(cached_ids=[1], capacity_tokens=8)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "info": ("_info",)}
    return {  # from the families: a labelled counter has no sample before its first count
        family.name + suffix
        for family in metrics.registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def test_promtool_accepts_the_scrape_config_and_the_alert_rules():
    promtool = tool("promtool")
    for args in (("check", "config", MONITORING / "prometheus.yml"), ("check", "rules", ALERTS)):
        out = subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr


def test_the_alert_rules_fire_on_the_series_of_their_unit_tests():
    out = subprocess.run(
        [tool("promtool"), "test", "rules", str(Path(__file__).parent / "prometheus" / "alerts_test.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_dashboard_is_importable_and_names_only_metrics_the_app_serves():
    board = json.loads(DASHBOARD.read_text())
    assert isinstance(board["schemaVersion"], int) and board["uid"] and board["title"]
    (source,) = board["__inputs"]
    assert source["name"] == "DS_PROMETHEUS" and source["pluginId"] == "prometheus"
    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids)
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert panel["targets"] and len(set(refs)) == len(refs), panel["title"]
        assert panel.get("description"), panel["title"]  # docs/monitoring.md explains each too
    served = exported_names() | {"up"}
    texts = [expr for _, expr in dashboard_queries()] + [rule["expr"] for rule in alert_rules()]
    named = {name for text in texts for name in re.findall(r"\b(?:assistant|process)_\w+|\bup\b", text)}
    assert named and named <= served, sorted(named - served)


def query(port: int, expr: str) -> list[dict]:
    """The result of an instant query; an expression Prometheus refuses fails with its error."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
    except urllib.error.HTTPError as e:  # 400/422 carry Prometheus' error in JSON
        body = json.load(e)
    assert body["status"] == "success", (expr, body.get("error"))
    return body["data"]["result"]


def wait_for(what: str, check: Callable[[], object], timeout_s: float) -> object:
    """``check()``'s first true result; fails after ``timeout_s`` with the last error or value."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (OSError, AssertionError) as e:  # not up yet, or not scraped yet
            last = e
        time.sleep(0.3)
    raise AssertionError(f"{what} not within {timeout_s} s; last: {last!r}")


def read_until(proc: subprocess.Popen, text: str, timeout_s: float) -> None:
    """Read the app's stdout until a line contains ``text``."""
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    deadline, seen = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen += line
        if text in line:
            return
        if not line:
            assert proc.poll() is None, f"the app ended: {seen}"
            time.sleep(0.1)
    raise AssertionError(f"no {text!r} within {timeout_s} s: {seen}")


def scalar(port: int, expr: str) -> float | None:
    result = query(port, expr)
    return float(result[0]["value"][1]) if result else None


@pytest.mark.slow
def test_a_real_prometheus_scrapes_the_app_and_returns_its_turns_rules_and_dashboard(pulse, tmp_path):
    prometheus = tool("prometheus")
    app_port, prom_port = free_port(), free_port()
    log = tmp_path / "turns.jsonl"
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{json.dumps(str(ALERTS))}]\n"
        "scrape_configs:\n"
        "  - job_name: assistant\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{app_port}']}}]\n"
    )
    app_err, prom_log = (tmp_path / "app.txt").open("w"), (tmp_path / "prometheus.txt").open("w")
    cmd = [sys.executable, "-m", "assistant", "run", "--no-tui", "--metrics-port", str(app_port)]
    cmd += ["--log", str(log), "--max-new-tokens", "24"]
    app = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=app_err,
        text=True,
        env={**os.environ, **pulse},
    )
    server = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}"]
        + [f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=prom_log,
        stderr=subprocess.STDOUT,
    )
    try:
        read_until(app, "listening on", 180)
        # scraped before any turn: a zero, so rate() and increase() will count every turn
        wait_for(
            "a scrape with 0 typed turns", lambda: query(prom_port, 'assistant_turns_total{kind="typed"}'), 30
        )
        assert scalar(prom_port, 'assistant_turns_total{kind="typed"}') == 0
        assert app.stdin is not None
        for text in TYPED:
            app.stdin.write(text + "\n")
            app.stdin.flush()
        records = wait_records(log, len(TYPED), app, 120)
        turns = len(records)
        wait_for(
            f"sum(assistant_turns_total) == {turns}",
            lambda: scalar(prom_port, "sum(assistant_turns_total)") == turns,
            30,
        )
        seen = "sum(max_over_time(assistant_turns_total[5m]) - min_over_time(assistant_turns_total[5m]))"
        assert scalar(prom_port, seen) == turns
        ttft = [r["metrics"]["ttft_ms"] for r in records]
        assert scalar(prom_port, "assistant_ttft_seconds_sum") == pytest.approx(sum(ttft) / 1000, rel=1e-9)

        # the alert rules load, and each was evaluated without an error
        def rules_evaluated() -> list[dict]:
            with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/rules", timeout=10) as response:
                groups = json.load(response)
            rules = [r for g in groups["data"]["groups"] for r in g["rules"]]
            return rules if all(not r["lastEvaluation"].startswith("0001") for r in rules) else []

        rules = wait_for("an evaluation of every rule", rules_evaluated, 30)
        assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()}
        assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]

        # every dashboard expression is accepted; the turn panel shows the typed turns
        refused = []
        for title, expr in dashboard_queries():
            try:
                query(prom_port, expr)
            except AssertionError as e:
                refused.append((title, e))
        assert not refused, refused
        (by_kind,) = [e for t, e in dashboard_queries() if t == "Turns per minute, by kind"]
        per_minute = {r["metric"]["kind"]: float(r["value"][1]) for r in query(prom_port, by_kind)}
        assert per_minute["typed"] > 0 and per_minute["spoken"] == 0, per_minute
        (table,) = [e for t, e in dashboard_queries() if t == "What each station runs"]
        assert query(prom_port, table)[0]["metric"]["backend"] == "onnxruntime-cpu"
    finally:
        codes = []
        for proc in (server, app):
            proc.send_signal(signal.SIGTERM)
            try:
                codes.append(proc.wait(60))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait(10))
        app_err.close()
        prom_log.close()
    app_text, prom_text = (tmp_path / "app.txt").read_text(), (tmp_path / "prometheus.txt").read_text()
    assert codes == [0, 0], (codes, prom_text[-2000:], app_text[-2000:])
    assert "Traceback" not in app_text, app_text
