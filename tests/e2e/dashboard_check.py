"""Checks dashboards/lazykv.json, the Grafana dashboard, two ways.

  dashboard_check.py static DASHBOARD METRIC_NAMES_H ALERTS_YML
      The panels are well formed (unique ids, inside the 24-column grid, no
      two overlapping, every query on the ${datasource} variable); every
      lazykv_* name the dashboard or the alert rules use is a metric of
      common/metrics/metric_names.h, and every metric there is on the
      dashboard.
  dashboard_check.py live DASHBOARD PROMETHEUS_URL [EMPTY_OK...]
      Every query, with Grafana's $__rate_interval set to 1m, runs on a real
      Prometheus that scrapes a real lazykv: Prometheus must accept it, and it
      must return series, except for the panels named in EMPTY_OK.
Prints one line per failure and exits 1 if there is any.
"""
import json
import re
import sys
import urllib.parse
import urllib.request

NAME = re.compile(r"\blazykv_[a-z_]+\b")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def panels_of(path):
    with open(path) as f:
        dashboard = json.load(f)
    return [p for p in dashboard["panels"] if p["type"] != "row"], dashboard


def queries(panels):
    for p in panels:
        for t in p.get("targets", []):
            yield p["title"], t["expr"]


def exported_names(metric_names_h):
    text = open(metric_names_h).read()
    return set(re.findall(r'"(lazykv_[a-z_]+)", MetricType::', text))


def base_name(name, known):
    if name in known:
        return name
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in known:
            return name[: -len(suffix)]
    return None


def check_static(dashboard_path, metric_names_h, alerts_path):
    failures = []
    panels, dashboard = panels_of(dashboard_path)
    ids = [p["id"] for p in dashboard["panels"]]
    if len(ids) != len(set(ids)):
        failures.append(f"panel ids repeat: {ids}")
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    if "datasource" not in variables:
        failures.append("no datasource variable")
    cells = {}
    for p in dashboard["panels"]:
        g = p["gridPos"]
        if g["x"] < 0 or g["w"] <= 0 or g["x"] + g["w"] > 24 or g["h"] <= 0:
            failures.append(f"panel '{p['title']}' is outside the grid: {g}")
        for y in range(g["y"], g["y"] + g["h"]):
            for x in range(g["x"], g["x"] + g["w"]):
                if (x, y) in cells:
                    failures.append(f"panels '{cells[(x, y)]}' and '{p['title']}' overlap at ({x}, {y})")
                    break
                cells[(x, y)] = p["title"]
            else:
                continue
            break
    for p in panels:
        if not p.get("targets"):
            failures.append(f"panel '{p['title']}' has no query")
        if not p.get("title") or not p.get("description"):
            failures.append(f"panel {p['id']} needs a title and a description")
        for t in p.get("targets", []):
            if t.get("datasource", {}).get("uid") != "${datasource}":
                failures.append(f"panel '{p['title']}' query {t.get('refId')} is not on ${{datasource}}")
    known = exported_names(metric_names_h)
    if len(known) < 20:
        failures.append(f"found only {len(known)} metrics in {metric_names_h}: has its format changed?")
    used = set()
    for title, expr in queries(panels):
        for name in NAME.findall(expr):
            base = base_name(name, known)
            if base is None:
                failures.append(f"panel '{title}' uses {name}, which lazykv does not export")
            else:
                used.add(base)
    for name in sorted(known - used):
        failures.append(f"metric {name} is on no panel")
    for name in sorted(set(NAME.findall(open(alerts_path).read()))):
        if base_name(name, known) is None:
            failures.append(f"{alerts_path} uses {name}, which lazykv does not export")
    return failures


def check_live(dashboard_path, prometheus_url, empty_ok):
    failures = []
    panels, _ = panels_of(dashboard_path)
    answered = 0
    for title, expr in queries(panels):
        query = expr.replace("$__rate_interval", "1m")
        url = prometheus_url + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.load(r)
        except Exception as e:  # a 400 carries Prometheus's reason in its body
            detail = e.read().decode() if hasattr(e, "read") else str(e)
            failures.append(f"panel '{title}': Prometheus refused {query}: {detail}")
            continue
        if body.get("status") != "success":
            failures.append(f"panel '{title}': {query}: {body}")
            continue
        answered += 1
        if not body["data"]["result"] and title not in empty_ok:
            failures.append(f"panel '{title}': no series for {query}")
    print(f"{answered} dashboard queries answered by Prometheus")
    return failures


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "static":
        failures = check_static(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) >= 4 and sys.argv[1] == "live":
        failures = check_live(sys.argv[2], sys.argv[3].rstrip("/"), set(sys.argv[4:]))
    else:
        sys.exit(__doc__)
    for f in failures:
        print("FAILED:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
