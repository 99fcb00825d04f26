#!/usr/bin/env bash
# A real-process herd: N `dart` nodes, each in its own network namespace behind a shaped link
# (the same rate in both directions), and an nginx origin behind the same kind of link, all on
# one bridge in a hub namespace. Every namespace, link and process is made here and removed on
# exit; nothing else on the machine is touched. Needs root, ip, tc, nginx, curl, sha256sum.
#
#   sudo bench/herd-netns.sh [NODES] [SIZE_MIB] [RATE]      (defaults: 8 128 100mbit)
#
# It prints one table row per phase:
#   solo   one node reads object A alone, cold (the time a herd reader is compared with);
#   herd   every node reads object B at once, cold: slowest, median, fastest;
#   direct object C read straight from the origin by a client in node 0's namespace, over the
#          same link, no cache between (what the solo read through the cache is compared with);
# with origin body bytes per object (from the origin's access log), the herd / solo ratio and the
# solo / direct ratio (the cache's cost to one cold reader). Every downloaded body is checked
# against the file's sha256; a wrong or short body fails the run.
# Extra dart flags can be passed in DART_FLAGS (e.g. DART_FLAGS="--read-ahead 0").
set -euo pipefail

NODES=${1:-8}
SIZE_MIB=${2:-128}
RATE=${3:-100mbit}
DART=${DART:-${CARGO_TARGET_DIR:-target}/release/dart}
TAG=dh$$
WORK=$(mktemp -d /tmp/dart-herd.XXXXXX)
NET=10.77.$((RANDOM % 200 + 20))

fail() {
  echo "herd-netns: $*" >&2
  exit 1
}

[ "$(id -u)" = 0 ] || fail "needs root (network namespaces and tc)"
for tool in ip tc curl sha256sum; do
  command -v "$tool" >/dev/null || fail "missing $tool"
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || fail "missing nginx (apt-get install nginx)"
[ -x "$DART" ] || fail "missing $DART (cargo build --release -p dart-node)"
[ "$NODES" -ge 2 ] || fail "NODES must be at least 2"

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ns in $(ip netns list | awk '{print $1}' | grep "^$TAG-" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

hub=$TAG-hub
ip netns add "$hub"
ip -n "$hub" link add br0 type bridge
ip -n "$hub" link set br0 up
ip -n "$hub" link set lo up

# A namespace `ns` with address `addr` on the bridge, its link shaped to RATE both ways.
attach() {
  local ns=$1 addr=$2 i=$3
  ip netns add "$ns"
  ip link add "v$TAG$i" type veth peer name "b$TAG$i"
  ip link set "v$TAG$i" netns "$ns"
  ip link set "b$TAG$i" netns "$hub"
  ip -n "$ns" link set "v$TAG$i" name eth0
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$hub" link set "b$TAG$i" master br0
  ip -n "$hub" link set "b$TAG$i" up
  # Egress of the namespace, and egress of the bridge port towards it (its ingress).
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 400ms
  ip netns exec "$hub" tc qdisc add dev "b$TAG$i" root tbf rate "$RATE" burst 256kb latency 400ms
}

# The origin: nginx serving two files of SIZE_MIB each.
attach "$TAG-o" "$NET.2" o
mkdir -p "$WORK/www" "$WORK/nginx"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$WORK/www/a.bin"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$WORK/www/b.bin"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$WORK/www/c.bin"
# nginx's workers run unprivileged: they must be able to read the files.
chmod 755 "$WORK" "$WORK/www"
chmod 644 "$WORK/www/a.bin" "$WORK/www/b.bin" "$WORK/www/c.bin"
sum_a=$(sha256sum "$WORK/www/a.bin" | cut -d' ' -f1)
sum_b=$(sha256sum "$WORK/www/b.bin" | cut -d' ' -f1)
sum_c=$(sha256sum "$WORK/www/c.bin" | cut -d' ' -f1)
cat >"$WORK/nginx/nginx.conf" <<EOF
worker_processes 2;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 1024; }
http {
  log_format body '\$body_bytes_sent';
  access_log $WORK/nginx/body.log body;
  sendfile on;
  tcp_nopush on;
  client_body_temp_path $WORK/nginx;
  proxy_temp_path $WORK/nginx;
  fastcgi_temp_path $WORK/nginx;
  uwsgi_temp_path $WORK/nginx;
  scgi_temp_path $WORK/nginx;
  server {
    listen $NET.2:8080;
    root $WORK/www;
  }
}
EOF
ip netns exec "$TAG-o" "$NGINX" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/error.log" &
pids+=($!)

peers=""
for i in $(seq 0 $((NODES - 1))); do
  peers+="${peers:+,}node-$i@$NET.$((10 + i)):9000"
done
for i in $(seq 0 $((NODES - 1))); do
  attach "$TAG-$i" "$NET.$((10 + i))" "$i"
  mkdir -p "$WORK/n$i"
  # shellcheck disable=SC2086
  ip netns exec "$TAG-$i" env DART_LOG=warn "$DART" \
    --listen 127.0.0.1:8080 --admin 127.0.0.1:9100 --peer-listen "$NET.$((10 + i)):9000" \
    --self-id "node-$i" --peers "$peers" \
    --cache-dir "$WORK/n$i" --cache-size "$((SIZE_MIB * 4))MiB" --mem-size 0 \
    --allow-upstream "$NET.0/24" --public-upstream "$NET.0/24" ${DART_FLAGS:-} \
    >"$WORK/n$i.out" 2>"$WORK/n$i.err" &
  pids+=($!)
done

# Wait until nginx and every node answer.
ready() { ip netns exec "$1" curl -s -o /dev/null --max-time 1 "$2"; }
for _ in $(seq 100); do
  ok=1
  ready "$TAG-0" "http://$NET.2:8080/" || ok=0
  for i in $(seq 0 $((NODES - 1))); do
    ready "$TAG-$i" "http://127.0.0.1:9100/healthz" || ok=0
  done
  [ "$ok" = 1 ] && break
  sleep 0.2
done
[ "$ok" = 1 ] || fail "nodes or origin did not come up (logs in $WORK)"

# Body bytes the origin has sent so far (its access log holds one line per response), as an integer
# (awk prints a sum past 2^31 in exponent form, which bash arithmetic refuses: objects of 1 GiB).
origin_tx() { awk '{s += $1} END {printf "%.0f\n", s}' "$WORK/nginx/body.log" 2>/dev/null || echo 0; }

# One read of `object` through node `i` (or, with a fifth argument `direct`, straight from the
# origin from node `i`'s namespace); writes "seconds" to $WORK/t.<tag>.<i>.
read_one() {
  local i=$1 object=$2 want=$3 tag=$4 via=${5:-dart}
  local out="$WORK/body.$tag.$i"
  local t url="http://127.0.0.1:8080/dart/http://$NET.2:8080/$object"
  [ "$via" = direct ] && url="http://$NET.2:8080/$object"
  t=$(ip netns exec "$TAG-$i" curl -sS --fail -o "$out" -w '%{time_total}' "$url")
  local got
  got=$(sha256sum "$out" | cut -d' ' -f1)
  rm -f "$out"
  [ "$got" = "$want" ] || { echo "node-$i: wrong bytes for $object" >&2; return 1; }
  echo "$t" >"$WORK/t.$tag.$i"
}

before=$(origin_tx)
read_one 0 a.bin "$sum_a" solo || fail "the solo read failed"
solo=$(cat "$WORK/t.solo.0")
solo_origin=$(($(origin_tx) - before))

read_one 0 c.bin "$sum_c" direct direct || fail "the direct read failed"
direct=$(cat "$WORK/t.direct.0")

before=$(origin_tx)
herd=()
for i in $(seq 0 $((NODES - 1))); do
  read_one "$i" b.bin "$sum_b" herd &
  herd+=($!)
done
failed=0
for p in "${herd[@]}"; do wait "$p" || failed=1; done
[ "$failed" = 0 ] || fail "a herd read failed (logs in $WORK)"
herd_origin=$(($(origin_tx) - before))

times=$(cat "$WORK"/t.herd.* | sort -n)
slowest=$(echo "$times" | tail -n 1)
fastest=$(echo "$times" | head -n 1)
median=$(echo "$times" | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}')
size=$((SIZE_MIB << 20))
awk -v n="$NODES" -v mib="$SIZE_MIB" -v rate="$RATE" -v solo="$solo" -v so="$solo_origin" \
  -v s="$slowest" -v m="$median" -v f="$fastest" -v ho="$herd_origin" -v size="$size" -v flags="${DART_FLAGS:-}" \
  -v d="$direct" 'BEGIN {
  printf "| nodes | object | link | flags | one node alone, cold | herd slowest | herd median | herd fastest | slowest / alone | origin bytes / object | direct from the origin | alone / direct |\n"
  printf "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
  printf "| %d | %d MiB | %s | %s | %.2f s | %.2f s | %.2f s | %.2f s | %.2f | %.2f (solo %.2f) | %.2f s | %.2f |\n",
    n, mib, rate, (flags == "" ? "defaults" : flags), solo, s, m, f, s / solo, ho / size, so / size, d, solo / d
}'
