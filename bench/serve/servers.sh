# What the serving benchmarks share, sourced once `bin` (the lazykv binary)
# is set: a scratch folder `work`, and servers started in the background that
# are stopped on exit.

work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$work"' EXIT

# start VAR ARGS...: `lazykv ARGS --port 0`; sets VAR to its URL once it is ready.
start() {
  local var=$1 log=$work/$RANDOM.log url=""
  shift
  "$bin" "$@" --port 0 >"$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 600); do
    url=$(grep -o 'listening on http://[0-9.:]*' "$log" | head -1 || true)
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { cat "$log" >&2; exit 1; }
  url=${url#listening on }
  for _ in $(seq 1 600); do curl -sf "$url/ready" >/dev/null && break; sleep 0.1; done
  printf -v "$var" '%s' "$url"
}

stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null || true; done; pids=(); }
