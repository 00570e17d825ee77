#!/usr/bin/env bash
# Per-request cost of nginx-as-proxy and weir, side by side in one run. (Until issue 8 it also
# ran a bare pingora proxy and weir on its pingora plane; proxy/README.md has those numbers.)
# The app is nginx `return 200` (CPU 0, with wrk); every proxy has one worker on CPU 1.
# Each round: per proxy, 1 s warm-up then SECS of `wrk -t1 -c64`; CPU/request is the
# utime+stime delta of the proxy's processes (/proc/PID/stat) over the requests served;
# `app_conns` is how many connections the app accepted meanwhile (keep-alive reuse check).
#
#   cargo build --release -p proxy --bin weir
#   proxy/bench/side-by-side.sh [ROUNDS] [SECS]        # needs nginx, wrk, taskset, curl, bc
#
# WEIR=path picks another binary. Ports 18080-18093 on 127.0.0.1. CONNS=8 changes wrk's
# connection count (default 64).
set -euo pipefail
rounds=${1:-3}; secs=${2:-5}
root=$(cd "$(dirname "$0")/../.." && pwd)
weir=${WEIR:-$root/target/release/weir}
dir=$(mktemp -d); tick=$(getconf CLK_TCK)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
cat > "$dir/app.conf" <<CONF
worker_processes 1; daemon off; pid $dir/app.pid; error_log $dir/app.err warn;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 10000000; keepalive_timeout 300s;
  server { listen 127.0.0.1:18080; location / { return 200 "ok"; } }
  server { listen 127.0.0.1:18090; location / { stub_status; } } }
CONF
cat > "$dir/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $dir/nginx.pid; error_log $dir/nginx.err warn;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 10000000;
  upstream app { server 127.0.0.1:18080; keepalive 128; keepalive_requests 10000000; }
  server { listen 127.0.0.1:18081; location / { proxy_pass http://app;
    proxy_http_version 1.1; proxy_set_header Connection ""; } } }
CONF
cat > "$dir/weir.yaml" <<CONF
inbound: { listen: 127.0.0.1:18083, app: 127.0.0.1:18080, max_inflight: 1024, threads: 1 }
admin: { listen: 127.0.0.1:18093 }
log: { filter: warn }
CONF
taskset -c 0 nginx -c "$dir/app.conf" & pids+=($!)
taskset -c 1 nginx -c "$dir/nginx.conf" & nginx_pid=$!; pids+=($nginx_pid)
taskset -c 1 "$weir" run --config "$dir/weir.yaml" 2>"$dir/weir.err" & weir_pid=$!; pids+=($weir_pid)
contenders="nginx:18081:$nginx_pid weir:18083:$weir_pid"
sleep 1.5
cpu() { local t=0 p; for p in $(pgrep -P "$1") "$1"; do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo $t; }
accepts() { curl -s http://127.0.0.1:18090/ | awk 'NR==3{print $1}'; }
for r in $(seq "$rounds"); do
  for c in $contenders; do
    IFS=: read -r name port pid <<< "$c"
    taskset -c 0 wrk -t1 -c${CONNS:-64} -d1s "http://127.0.0.1:$port/" >/dev/null
    a0=$(accepts); c0=$(cpu "$pid")
    out=$(taskset -c 0 wrk -t1 -c${CONNS:-64} -d"${secs}s" --latency "http://127.0.0.1:$port/")
    c1=$(cpu "$pid"); a1=$(accepts)
    reqs=$(awk '/requests in/ {print $1}' <<< "$out")
    rps=$(awk '/Requests\/sec/ {print $2}' <<< "$out")
    p99=$(awk '$1=="99%" {print $2}' <<< "$out")
    us=$(echo "($c1-$c0)*1000000/$tick/$reqs" | bc -l)
    # The status request itself is one accepted connection.
    printf "round %s %-13s rps=%-9s cpu_us/req=%5.1f p99=%-8s app_conns=%s\n" \
      "$r" "$name" "$rps" "$us" "$p99" $((a1 - a0 - 1))
  done
done
