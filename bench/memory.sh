#!/usr/bin/env bash
# dart's memory: an idle node, and a herd of concurrent whole reads of one large object, cold.
#
#   bench/memory.sh [READERS] [SIZE_MIB] [HERDS]     (defaults: 64 1024 2; from the repository root)
#
# One nginx origin (static file, sendfile) and one dart node with default flags (RAM tier
# --mem-size 256MiB, 4 MiB blocks; origin read-ahead is for a lone read, so a herd's readers
# read nothing ahead once a second one has started), both on loopback. It prints the node's
# resident set (VmRSS, sampled every 100 ms from /proc) when idle, its peak during the herd, and
# after it, with the kernel's own peak (VmHWM), and how much of it after the herd is the node's own
# memory (RssAnon) and how much the page cache's pages of the arena files that disk-tier hits
# mapped (RssFile: shared, reclaimable, still the page cache's), once per herd: each herd reads another object, cold,
# so a second herd tells memory kept for reuse (flat) from memory lost (growing). Every reader must receive SIZE_MIB bytes; one
# reader's body is checked against the file's sha256 (checking all of them would cost more CPU
# than the herd). Installs nginx when missing (as root), else fails naming it. DART_FLAGS adds
# flags to the node (e.g. "--mem-size 0"). After the herds it waits IDLE_WAIT seconds (12) and
# prints the resident set again: an idle node gives memory kept for reuse back.
set -euo pipefail
cd "$(dirname "$0")/.."

READERS=${1:-64}
SIZE_MIB=${2:-1024}
HERDS=${3:-2}
DART=${DART:-${CARGO_TARGET_DIR:-target}/release/dart}

NAME=memory
# shellcheck source=bench/lib.sh
. bench/lib.sh
need_packages nginx
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
for tool in curl sha256sum awk; do command -v "$tool" >/dev/null || fail "missing $tool"; done
need_dart

BASE=$(free_ports 2)
P_ORIGIN=$BASE P_DART=$((BASE + 1))
mkdir -p "$WORK/www" "$WORK/nginx"
for h in $(seq "$HERDS"); do
  head -c "$((SIZE_MIB << 20))" /dev/urandom >"$WORK/www/obj$h.bin"
done
chmod -R a+rwX "$WORK"
{
  nginx_conf_head "$WORK/nginx"
  cat <<EOF
  server {
    listen 127.0.0.1:$P_ORIGIN;
    root $WORK/www;
  }
}
EOF
} >"$WORK/nginx/nginx.conf"
"$NGINX" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/error.log" &
pids+=($!)
# shellcheck disable=SC2086
DART_LOG=warn "$DART" --listen "127.0.0.1:$P_DART" --admin "" --cache-dir "$WORK/cache" \
  --cache-size "$((SIZE_MIB * (HERDS + 1)))MiB" --allow-upstream 127.0.0.1 --public-upstream 127.0.0.1 \
  ${DART_FLAGS:-} >"$WORK/dart.out" 2>"$WORK/dart.err" &
dart=$!
pids+=($dart)
for _ in $(seq 100); do
  curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$P_ORIGIN/obj1.bin" -r 0-0 &&
    curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$P_DART/" && break
  sleep 0.1
done

kib() { awk -v k="$1" '$1 == k":" {print $2}' "/proc/$dart/status"; }
sleep 1
idle=$(kib VmRSS)

# Sample the resident set while the herd runs.
herd() {
  local h=$1 url="http://127.0.0.1:$P_DART/dart/http://127.0.0.1:$P_ORIGIN/obj$h.bin"
  local sum
  sum=$(sha256sum <"$WORK/www/obj$h.bin" | cut -d' ' -f1)
  rm -f "$WORK/peak"
  (
    peak=0
    while kill -0 "$dart" 2>/dev/null; do
      r=$(kib VmRSS || echo 0)
      [ "${r:-0}" -gt "$peak" ] && peak=$r && echo "$peak" >"$WORK/peak"
      sleep 0.1
    done
  ) &
  local sampler=$! start end i p failed=0 readers=()
  start=$(date +%s.%N)
  for i in $(seq "$READERS"); do
    if [ "$i" = 1 ]; then
      curl -sS --fail -o "$WORK/body" -w '%{size_download}\n' "$url" >"$WORK/got.$i" &
    else
      curl -sS --fail -o /dev/null -w '%{size_download}\n' "$url" >"$WORK/got.$i" &
    fi
    readers+=($!)
  done
  for p in "${readers[@]}"; do wait "$p" || failed=1; done
  end=$(date +%s.%N)
  [ "$failed" = 0 ] || fail "a reader failed (node log: $(tail -n 3 "$WORK/dart.err"))"
  for i in $(seq "$READERS"); do
    [ "$(cat "$WORK/got.$i")" = "$((SIZE_MIB << 20))" ] || fail "reader $i got $(cat "$WORK/got.$i") bytes"
  done
  [ "$(sha256sum <"$WORK/body" | cut -d' ' -f1)" = "$sum" ] || fail "reader 1 got wrong bytes"
  rm -f "$WORK/body"
  sleep 1
  local after hwm peak anon file
  after=$(kib VmRSS)
  anon=$(kib RssAnon)
  file=$(kib RssFile)
  hwm=$(kib VmHWM)
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  peak=$(cat "$WORK/peak" 2>/dev/null || echo 0)
  awk -v h="$h" -v n="$READERS" -v mib="$SIZE_MIB" -v idle="$idle" -v peak="$peak" -v after="$after" \
    -v hwm="$hwm" -v anon="$anon" -v file="$file" -v s="$start" -v e="$end" -v flags="${DART_FLAGS:-defaults}" 'BEGIN {
    printf "| %d | %d | %d MiB | %s | %.1f MiB | %.1f / %.1f MiB | %.1f MiB | %.1f / %.1f MiB | %.1f s | %.1f GiB |\n",
      h, n, mib, flags, idle / 1024, peak / 1024, hwm / 1024, after / 1024, anon / 1024, file / 1024,
      e - s, n * mib / 1024
  }'
}

printf "| herd | readers | object | flags | idle RSS (before the first) | peak RSS during the herd (sampled / VmHWM so far) | RSS after | of which anonymous / file-mapped | herd wall time | bytes served |\n"
printf "|---|---|---|---|---|---|---|---|---|---|\n"
for h in $(seq "$HERDS"); do herd "$h"; done

# Idle again: the node gives memory kept for reuse back 10 s after its last read ends
# (IDLE_RELEASE_AFTER in core/src/node; dart_memory_releases_total counts it).
sleep "${IDLE_WAIT:-12}"
awk -v rss="$(kib VmRSS)" -v anon="$(kib RssAnon)" -v file="$(kib RssFile)" -v w="${IDLE_WAIT:-12}" 'BEGIN {
  printf "\nidle again, %d s after the last herd: RSS %.1f MiB (anonymous %.1f, file-mapped %.1f)\n",
    w, rss / 1024, anon / 1024, file / 1024
}'
