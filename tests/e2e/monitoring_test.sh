#!/usr/bin/env bash
# End to end: the monitoring that ships with lazykv against the real thing.
#  1. promtool checks deploy/prometheus/ (config and alert rules) and runs the
#     rules' unit tests; dashboards/lazykv.json is well formed and names only
#     metrics lazykv exports (tests/e2e/dashboard_check.py static);
#  2. a real Prometheus, with the committed config (only the targets and the
#     scrape interval changed), scrapes `lazykv serve`, a `lazykv kvstore` and
#     a `lazykv router` in front of serve while they serve greedy, lazy+tiers
#     and bad requests (some through the router): all three targets are
#     up, every alert rule evaluates without error and none is pending, and every
#     dashboard query is accepted and returns series.
#   usage: monitoring_test.sh LAZYKV_BINARY
# Needs LAZYKV_DEFAULT_MODEL (set by scripts/test.sh); exits 77 (skipped) without it.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$here/lib.sh"
prom_dir=$root/deploy/prometheus
dashboard=$root/dashboards/lazykv.json

# 1. Static checks.
check "promtool check config deploy/prometheus/prometheus.yml" promtool check config "$prom_dir/prometheus.yml"
check "promtool test rules deploy/prometheus/alerts_test.yml" promtool test rules "$prom_dir/alerts_test.yml"
check "dashboards/lazykv.json is well formed and uses only exported metrics" \
  /usr/bin/python3 "$here/dashboard_check.py" static "$dashboard" "$root/common/metrics/metric_names.h" \
  "$prom_dir/alerts.yml"

# 2. A kvstore whose small host tier spills to NVMe, and serve demoting to it.
start_kvstore "$bin" 2 --nvme-path "$work/nvme"
kv_http=${kv_metrics#http://}
kv_http=${kv_http%/metrics}
model=$(/usr/bin/python3 -c 'import os,sys; print(os.path.basename(sys.argv[1]).rsplit(".gguf", 1)[0])' "$LAZYKV_DEFAULT_MODEL")
start_http serve serve --model "$LAZYKV_DEFAULT_MODEL" --port 0 --threads 2 --kv-cache-mib 64 \
  --kvstore "127.0.0.1:$kv_port" --kvstore-transports tcp
serve_pid=$http_pid serve_log=$http_log
pass "serve at $url, kvstore metrics at $kv_http"
serve_url=$url
start_http router router --replica "${url#http://}" --port 0 --health-interval-ms 300
router=$url url=$serve_url
check "the router in front of serve is ready" ready_becomes "$router" 200

# The committed config, pointed at these two processes.
mkdir -p "$work/prometheus"
cp "$prom_dir/alerts.yml" "$work/prometheus/"
sed -e "s|127.0.0.1:8000|${url#http://}|; s|127.0.0.1:9100|$kv_http|; s|scrape_interval: 5s|scrape_interval: 1s|" \
  -e "s|127.0.0.1:8080|${router#http://}|" \
  -e "s|evaluation_interval: 5s|evaluation_interval: 1s|" "$prom_dir/prometheus.yml" >"$work/prometheus/prometheus.yml"
check "the test's config differs from the committed one only in targets and intervals" \
  test "$(diff "$prom_dir/prometheus.yml" "$work/prometheus/prometheus.yml" | grep -c '^>')" = 5
prom_port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
prometheus --config.file="$work/prometheus/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
prom_pid=$!
pids+=("$prom_pid")
prom=http://127.0.0.1:$prom_port
for _ in $(seq 1 100); do
  [ "$(status_of "$prom/-/ready")" = 200 ] && break
  kill -0 "$prom_pid" 2>/dev/null || break
  sleep 0.1
done
[ "$(status_of "$prom/-/ready")" = 200 ] || { cat "$work/prometheus.log" >&2; echo "FAILED: Prometheus did not start" >&2; exit 1; }

# Traffic: greedy completions and chat, a lazy+tiers request that demotes,
# spills and promotes, and a bad request (an invalid_request error).
json='Content-Type: application/json'
for i in 1 2 3; do
  code=$(status_of "$url/v1/completions" -H "$json" \
    -d '{"model": "'$model'", "prompt": "Counting: '$i'", "max_tokens": 16, "temperature": 0}')
  check "completion $i -> $code" test "$code" = 200
done
code=$(status_of "$url/v1/chat/completions" -H "$json" \
  -d '{"model": "'$model'", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}')
check "chat completion -> $code" test "$code" = 200
for i in 1 2; do  # the second has the first's prompt prefix: an affinity route
  code=$(status_of "$router/v1/completions" -H "$json" \
    -d '{"model": "'$model'", "prompt": "'"$(printf 'The router test prompt. %.0s' $(seq 1 12))"'", "max_tokens": 4}')
  check "completion $i through the router -> $code" test "$code" = 200
done
code=$(status_of "$url/v1/completions" -H "$json" -d '{"model": "'$model'", "prompt": "Count slowly from one to one hundred, one number per line:", "max_tokens": 400, "temperature": 0, "ignore_eos": true, "kv_policy": {"name": "lazy+tiers", "budget": 48, "window": 8, "alpha": 0.001}}')
check "lazy+tiers completion -> $code" test "$code" = 200
check "bad request -> 400" test "$(status_of "$url/v1/completions" -H "$json" -d '{"model": 1}')" = 400
spilled=$(kv_metric 'lazykv_kvstore_nvme_admissions_total{type="admitted"}')
check "the kvstore spilled blocks to NVMe ($spilled)" test "${spilled:-0}" -gt 0

# Prometheus has seen the traffic once both targets were scraped after it.
query() { curl -s "$prom/api/v1/query" --data-urlencode "query=$1"; }
seen=""
for _ in $(seq 1 60); do
  seen=$(query 'count(up{job=~"lazykv.*"} == 1) == 3 and on() lazykv_errors_total{type="invalid_request"} > 0
    and on() lazykv_demotions_total > 0 and on() sum(lazykv_router_requests_total) >= 2' \
    | json_get 'len(d["data"]["result"])' 2>/dev/null)
  [ "$seen" = 1 ] && break
  sleep 1
done
check "Prometheus scraped all three targets after the traffic" test "$seen" = 1
sleep 3  # a few more scrapes, so rates over the traffic have two points

rules=$(curl -s "$prom/api/v1/rules")
check "Prometheus loaded all 8 alert rules" test "$(json_get 'len(d["data"]["groups"][0]["rules"])' <<<"$rules")" = 8
check "every rule evaluates without error" \
  test "$(json_get 'sorted({r["health"] for g in d["data"]["groups"] for r in g["rules"]})' <<<"$rules")" = "['ok']"
# Every rule has a `for` longer than this test, so none can fire yet: a rule
# that is wrongly true shows as pending.
check "no alert is pending or firing on a healthy deployment" \
  test "$(curl -s "$prom/api/v1/alerts" | json_get '[(a["labels"]["alertname"], a["state"]) for a in d["data"]["alerts"]]')" = "[]"

check "every dashboard query answers on the live deployment" /usr/bin/python3 "$here/dashboard_check.py" live \
  "$dashboard" "$prom" "Router retries / s"

kill -TERM "$serve_pid"
wait "$serve_pid"
check "serve exits 0 on SIGTERM" test $? = 0

if [ "$failures" -gt 0 ]; then
  echo "--- serve log" >&2; tail -30 "$serve_log" >&2
  echo "--- prometheus log" >&2; tail -20 "$work/prometheus.log" >&2
  echo "$failures check(s) FAILED" >&2
  exit 1
fi
echo "all monitoring checks passed"
