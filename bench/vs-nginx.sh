#!/usr/bin/env bash
# dart beside nginx (`slice 4m` + `proxy_cache`, the read-through range cache people already run),
# on loopback, on this machine, in one run: same origin, same objects, same wrk load.
#
#   bench/vs-nginx.sh            (from the repository root; builds the release binary if missing)
#
# What runs (every process and file is made here and removed on exit):
# - origin: nginx serving static files (sendfile), `worker_processes` = cores;
# - nginx cache: nginx with `slice 4m`, `proxy_cache` keyed on URI + slice, `sendfile on`,
#   `worker_processes` = cores, `access_log off` (configuration written below, in full);
# - dart, RAM tier on (the default --mem-size 256MiB) and dart, RAM tier off (--mem-size 0: the
#   disk tier only), both single nodes with 4 MiB blocks reading the origin through the prefix API.
# Cases (wrk -t2 -c16, requests per second), each measured in ROUNDS rounds of DURATION seconds
# per target, the targets taking turns within a round (in a rotating order), so that a slow or
# fast phase of the machine falls on all of them; a ratio is the median of the rounds' ratios,
# printed with their range. Beside each rate it takes the servers' CPU time from /proc (nginx: its
# master and workers; dart: its process), per request and per GiB served cold: what a request
# cost the server, where a rate says who served more on the shared cores:
# - one hot range (1 MiB, 64 KiB) of OBJECT;
# - random aligned ranges (1 MiB, 64 KiB) over OBJECT (256 MiB);
# - random aligned 1 MiB ranges over BIG (1 GiB): a working set larger than dart's RAM tier;
# - cold whole reads of fresh objects: MB/s through each cache and directly from the origin, the
#   four reads of one object in turn, one object per round; the timed read's body is discarded
#   (length checked) and the cache's bytes are checked by a whole read after it, untimed.
# A cache may go on working after its client has every byte (dart writes the blocks it served to
# its disk tier): after the warm-up, and after each cold read (whose CPU includes it), the script
# waits until the servers have used no CPU for 0.3 s, so that the next case is not charged with it.
# Every target is warmed by one whole read checked against the file's sha256, and each case's
# first range is checked byte for byte on every target before wrk runs; a non-2xx answer during a
# case fails the run. HOLD=1 stops after the warm-up, prints the URLs and waits (for a profiler);
# ctrl-c ends it. Knobs: ROUNDS (3), DURATION (2), CONNECTIONS (16), THREADS (2), OBJECT_MIB (256),
# BIG_MIB (1024), COLD_OBJECTS (3), DART (binary path), NGINX, WRK.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-2}
CONNECTIONS=${CONNECTIONS:-16}
THREADS=${THREADS:-2}
OBJECT_MIB=${OBJECT_MIB:-256}
BIG_MIB=${BIG_MIB:-1024}
COLD_OBJECTS=${COLD_OBJECTS:-$ROUNDS}
DART=${DART:-${CARGO_TARGET_DIR:-target}/release/dart}
CORES=$(nproc)

NAME=vs-nginx
# shellcheck source=bench/lib.sh
. bench/lib.sh
need_packages nginx wrk
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
WRK=${WRK:-$(command -v wrk)}
for tool in curl sha256sum dd awk; do command -v "$tool" >/dev/null || fail "missing $tool"; done
need_dart

# Four consecutive free ports (loopback only).
BASE=$(free_ports 4)
P_ORIGIN=$BASE P_NGINX=$((BASE + 1)) P_RAM=$((BASE + 2)) P_DISK=$((BASE + 3))

echo "== objects: ${OBJECT_MIB} MiB, ${BIG_MIB} MiB and ${COLD_OBJECTS} cold ones of ${OBJECT_MIB} MiB (random bytes)" >&2
mkdir -p "$WORK/www" "$WORK/nginx/cache" "$WORK/nginx/tmp" "$WORK/origin"
head -c "$((OBJECT_MIB << 20))" /dev/urandom >"$WORK/www/obj.bin"
head -c "$((BIG_MIB << 20))" /dev/urandom >"$WORK/www/big.bin"
for i in $(seq "$COLD_OBJECTS"); do
  head -c "$((OBJECT_MIB << 20))" /dev/urandom >"$WORK/www/cold$i.bin"
done
# nginx's workers may run as another user: let them read and write what they need.
chmod -R a+rwX "$WORK"

{
  nginx_conf_head "$WORK/origin"
  cat <<EOF
  server {
    listen 127.0.0.1:$P_ORIGIN;
    root $WORK/www;
  }
}
EOF
} >"$WORK/origin/nginx.conf"
# The cache as its users run it: slice + proxy_cache, sendfile, a worker per core, no access log.
# Not `tcp_nopush on`: with it, every small range waited on a 40 ms delayed ACK here (424 req/s for
# a hot 64 KiB range against 32,233 without), which would flatter dart.
{
  nginx_conf_head "$WORK/nginx/tmp"
  cat <<EOF
  proxy_cache_path $WORK/nginx/cache levels=1:2 keys_zone=dart_bench:64m max_size=8g inactive=1h use_temp_path=off;
  upstream origin {
    server 127.0.0.1:$P_ORIGIN;
    keepalive 32;
  }
  server {
    listen 127.0.0.1:$P_NGINX;
    location / {
      slice 4m;
      proxy_cache dart_bench;
      proxy_cache_key \$uri\$slice_range;
      proxy_set_header Range \$slice_range;
      proxy_cache_valid 200 206 1h;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_pass http://origin;
    }
  }
}
EOF
} >"$WORK/nginx/nginx.conf"
"$NGINX" -c "$WORK/origin/nginx.conf" -e "$WORK/origin/error.log" &
pids+=($!)
"$NGINX" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/error.log" &
pids+=($!)

start_dart() {
  local name=$1 port=$2 mem=$3
  mkdir -p "$WORK/$name"
  DART_LOG=warn "$DART" --listen "127.0.0.1:$port" --admin "" --cache-dir "$WORK/$name/cache" \
    --cache-size 4GiB --mem-size "$mem" --allow-upstream 127.0.0.1 --public-upstream 127.0.0.1 \
    >"$WORK/$name/out.log" 2>"$WORK/$name/err.log" &
  pids+=($!)
}
start_dart dart-ram "$P_RAM" 256MiB
start_dart dart-disk "$P_DISK" 0

# URL of object `obj` through target `t` (origin, nginx, ram, disk).
url() {
  case $1 in
  origin) echo "http://127.0.0.1:$P_ORIGIN/$2" ;;
  nginx) echo "http://127.0.0.1:$P_NGINX/$2" ;;
  ram) echo "http://127.0.0.1:$P_RAM/dart/http://127.0.0.1:$P_ORIGIN/$2" ;;
  disk) echo "http://127.0.0.1:$P_DISK/dart/http://127.0.0.1:$P_ORIGIN/$2" ;;
  esac
}

# The server processes of target `t`, and their CPU time (user + system) in clock ticks.
server_pids() {
  case $1 in
  nginx) echo "${pids[1]}" $(pgrep -P "${pids[1]}") ;;
  ram) echo "${pids[2]}" ;;
  disk) echo "${pids[3]}" ;;
  esac
}
TICK=$(getconf CLK_TCK)
cpu_ticks() {
  local sum=0 p
  # Fields 14 and 15 of /proc/<pid>/stat, counted after the command name in parentheses.
  for p in $(server_pids "$1"); do
    sum=$((sum + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
  done
  echo "$sum"
}

for _ in $(seq 100); do
  ok=1
  for t in origin nginx ram disk; do
    curl -s -o /dev/null --max-time 1 -r 0-0 "$(url $t obj.bin)" || ok=0
  done
  [ "$ok" = 1 ] && break
  sleep 0.2
done
[ "$ok" = 1 ] || fail "a server did not come up (logs in $WORK; kept: remove it by hand)"

# One whole read, checked; prints seconds.
whole_read() {
  local t=$1 obj=$2 out="$WORK/body"
  local secs
  secs=$(curl -sS --fail -o "$out" -w '%{time_total}' "$(url "$t" "$obj")") || fail "$t: whole read of $obj failed"
  [ "$(sha256sum <"$out" | cut -d' ' -f1)" = "$(sha256sum <"$WORK/www/$obj" | cut -d' ' -f1)" ] ||
    fail "$t: wrong bytes for $obj"
  rm -f "$out"
  echo "$secs"
}

# One whole read timed with its body discarded (the client writing 256 MiB to a file took as
# long as the read itself, so a timed read that wrote it measured the client's page cache: direct
# and cached reads came out even where the caches' own rates differ 2x); its length and status
# are checked here and its bytes by a whole read after it (`whole_read`, untimed). Prints seconds.
timed_read() {
  local t=$1 obj=$2 got
  got=$(curl -sS --fail -o /dev/null -w '%{time_total} %{size_download}' "$(url "$t" "$obj")") ||
    fail "$t: timed read of $obj failed"
  [ "${got#* }" = "$(stat -c %s "$WORK/www/$obj")" ] || fail "$t: timed read of $obj gave ${got#* } bytes"
  echo "${got%% *}"
}

# Waits until target `t`'s server processes used no CPU for 0.3 s (at most 30 s): a cache may go
# on writing what it served after the client has every byte (dart writes its blocks to the disk
# tier on its blocking pool), and that work belongs to the read that caused it, not to the case
# measured next.
settle() {
  local t=$1 a b
  for _ in $(seq 100); do
    a=$(cpu_ticks "$t")
    sleep 0.3
    b=$(cpu_ticks "$t")
    [ "$a" = "$b" ] && return 0
  done
  echo "warning: $t still busy after 30 s" >&2
}

# big.bin first: OBJECT then fits the RAM tier and is what it holds when the cases start.
echo "== warm: one whole read of big.bin and obj.bin through each cache (checked)" >&2
for t in nginx ram disk; do
  whole_read "$t" big.bin >/dev/null
  whole_read "$t" obj.bin >/dev/null
done
for t in nginx ram disk; do settle "$t"; done

if [ "${HOLD:-0}" = 1 ]; then
  for t in origin nginx ram disk; do echo "$t: $(url "$t" obj.bin) $(url "$t" big.bin)"; done
  echo "dart pids: ${pids[*]:2}; waiting (ctrl-c ends)"
  wait
fi

# Check one range of `obj` on every cache against the file.
check_range() {
  local obj=$1 start=$2 len=$3 want got t
  want=$(dd if="$WORK/www/$obj" bs=65536 skip=$((start / 65536)) count=$((len / 65536)) 2>/dev/null | sha256sum | cut -d' ' -f1)
  for t in nginx ram disk; do
    got=$(curl -sS --fail -r "$start-$((start + len - 1))" "$(url "$t" "$obj")" | sha256sum | cut -d' ' -f1)
    [ "$got" = "$want" ] || fail "$t: wrong bytes for $obj $start+$len"
  done
}

# wrk over one case: a fixed range, or random ranges aligned to their length (seeded per thread,
# the same sequence on every target). Prints requests per second and the target's CPU
# microseconds per request.
run_wrk() {
  local t=$1 obj=$2 len=$3 mode=$4 size=$5 script="$WORK/case.lua" out="$WORK/wrk.out"
  local u
  u=$(url "$t" "$obj")
  cat >"$script" <<EOF
local counter = 0
function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
end
function init(args)
  math.randomseed(3401901085 + id)
end
local len = $len
local slots = math.floor($size / len)
local random = "$mode" == "random"
function request()
  local start = 0
  if random then start = math.random(0, slots - 1) * len end
  wrk.headers["Range"] = "bytes=" .. start .. "-" .. (start + len - 1)
  return wrk.format("GET")
end
EOF
  local c0 c1
  c0=$(cpu_ticks "$t")
  "$WRK" -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" -s "$script" "$u" >"$out" 2>&1 ||
    fail "$t: wrk failed: $(cat "$out")"
  c1=$(cpu_ticks "$t")
  if grep -q "Non-2xx" "$out"; then fail "$t: non-2xx answers: $(cat "$out")"; fi
  awk -v ticks=$((c1 - c0)) -v hz="$TICK" '/^Requests\/sec:/ {rps = $2} / requests in / {n = $1}
    END {printf "%s %.2f\n", rps, ticks / hz * 1e6 / n}' "$out"
}

# The median of the numbers on stdin, and their range as "lo-hi" (two decimals).
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
range() { sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%.2f-%.2f", lo, hi}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {print a / b}'; }
med() { printf '%s\n' "$@" | median; }
rng() { printf '%s\n' "$@" | range; }
# The targets of round `r` in turn, starting one place later each round.
turns() {
  local r=$1
  shift
  local all=("$@") i
  for i in $(seq 0 $(($# - 1))); do echo "${all[$(((i + r) % $#))]}"; done
}

rows=()
ratios_ram=()
ratios_disk=()
bench_case() {
  local label=$1 obj=$2 len=$3 mode=$4 size=$5 round t v c
  local ns=() rs=() ds=() rr=() dr=() n r d nc=() rc=() dc=()
  check_range "$obj" 0 "$len"
  echo "== $label ($ROUNDS rounds of ${DURATION}s per target)" >&2
  for round in $(seq 0 $((ROUNDS - 1))); do
    for t in $(turns "$round" nginx ram disk); do
      v=$(run_wrk "$t" "$obj" "$len" "$mode" "$size")
      read -r v c <<<"$v"
      case $t in nginx) n=$v nc+=("$c") ;; ram) r=$v rc+=("$c") ;; disk) d=$v dc+=("$c") ;; esac
    done
    ns+=("$n") rs+=("$r") ds+=("$d")
    rr+=("$(ratio "$r" "$n")") dr+=("$(ratio "$d" "$n")")
  done
  local mr md
  mr=$(med "${rr[@]}")
  md=$(med "${dr[@]}")
  rows+=("$(printf '| %s | %.0f | %.0f | %.2f (%s) | %.0f | %.2f (%s) |' "$label" "$(med "${ns[@]}")" \
    "$(med "${rs[@]}")" "$mr" "$(rng "${rr[@]}")" "$(med "${ds[@]}")" "$md" "$(rng "${dr[@]}")")")
  ratios_ram+=("$mr")
  ratios_disk+=("$md")
  cpu_row "$label (CPU µs per request)" "$(med "${nc[@]}")" "$(med "${rc[@]}")" "$(med "${dc[@]}")"
}
cpu_rows=()
# A row of the CPU table: the three targets' medians and the dart / nginx ratios.
cpu_row() {
  cpu_rows+=("$(awk -v l="$1" -v n="$2" -v r="$3" -v d="$4" 'BEGIN {
    printf "| %s | %.2f | %.2f | %.2f | %.2f | %.2f |", l, n, r, r / n, d, d / n }')")
}

obj_size=$((OBJECT_MIB << 20))
big_size=$((BIG_MIB << 20))
bench_case "one hot 1 MiB range" obj.bin 1048576 hot "$obj_size"
bench_case "one hot 64 KiB range" obj.bin 65536 hot "$obj_size"
bench_case "random aligned 1 MiB ranges" obj.bin 1048576 random "$obj_size"
bench_case "random aligned 64 KiB ranges" obj.bin 65536 random "$obj_size"
bench_case "random aligned 1 MiB ranges, ${BIG_MIB} MiB working set" big.bin 1048576 random "$big_size"

echo "== cold whole reads (${COLD_OBJECTS} objects, each cold for every target, read in turn)" >&2
# A read-through cache also writes every cold byte it serves to its store, which the direct read
# does not: the page cache's write rate here says what that costs. On the build machines (VMs that
# hand free memory back to their host) a new page costs a host fault, and this rate sits near
# 380 MB/s where rewriting cached pages runs at 9-12 GB/s (docs/benchmarks.md, "Why fresh memory
# is slow on these machines").
write_mbs() {
  local t0 t1
  t0=$(date +%s.%N)
  dd if=/dev/zero of="$WORK/write-test" bs=4M count=$((OBJECT_MIB / 4)) status=none
  t1=$(date +%s.%N)
  rm -f "$WORK/write-test"
  awk -v a="$t0" -v b="$t1" -v mib="$OBJECT_MIB" 'BEGIN {printf "%.1f", mib * 1.048576 / (b - a)}'
}
c_write=$(write_mbs)
mbs() { awk -v s="$1" -v mib="$OBJECT_MIB" 'BEGIN {print mib * 1.048576 / s}'; }
cs_origin=() cs_nginx=() cs_ram=() cs_disk=() cc_nginx=() cc_ram=() cc_disk=()
cr_ram=() cr_disk=() cd_nginx=() cd_ram=() cd_disk=()
for i in $(seq "$COLD_OBJECTS"); do
  for t in $(turns "$i" origin nginx ram disk); do
    c0=$(cpu_ticks "$t")
    v=$(timed_read "$t" "cold$i.bin")
    v=$(mbs "$v")
    # The rate is the client's; the CPU includes what the cache still did after it (its writes).
    settle "$t"
    # CPU seconds per GiB served (none for the origin read directly).
    c=$(awk -v t=$(($(cpu_ticks "$t") - c0)) -v hz="$TICK" -v mib="$OBJECT_MIB" 'BEGIN {print t / hz * 1024 / mib}')
    # The cold read's bytes, as the cache kept them, checked (untimed, uncounted).
    if [ "$t" != origin ]; then
      whole_read "$t" "cold$i.bin" >/dev/null
      settle "$t"
    fi
    case $t in origin) o=$v ;; nginx) n=$v cc_nginx+=("$c") ;; ram) r=$v cc_ram+=("$c") ;; disk) d=$v cc_disk+=("$c") ;; esac
  done
  cs_origin+=("$o") cs_nginx+=("$n") cs_ram+=("$r") cs_disk+=("$d")
  cr_ram+=("$(ratio "$r" "$n")") cr_disk+=("$(ratio "$d" "$n")")
  cd_nginx+=("$(ratio "$n" "$o")") cd_ram+=("$(ratio "$r" "$o")") cd_disk+=("$(ratio "$d" "$o")")
done
c_origin=$(med "${cs_origin[@]}") c_nginx=$(med "${cs_nginx[@]}")
c_ram=$(med "${cs_ram[@]}") c_disk=$(med "${cs_disk[@]}")
rows+=("$(printf '| cold whole read (MB/s) | %.1f | %.1f | %.2f (%s) | %.1f | %.2f (%s) |' "$c_nginx" \
  "$c_ram" "$(med "${cr_ram[@]}")" "$(rng "${cr_ram[@]}")" "$c_disk" "$(med "${cr_disk[@]}")" "$(rng "${cr_disk[@]}")")")
ratios_ram+=("$(med "${cr_ram[@]}")")
ratios_disk+=("$(med "${cr_disk[@]}")")
cpu_row "cold whole read (CPU s per GiB)" "$(med "${cc_nginx[@]}")" "$(med "${cc_ram[@]}")" "$(med "${cc_disk[@]}")"

geo() { printf '%s\n' "$@" | awk '{s += log($1); n++} END {printf "%.2f", exp(s / n)}'; }

echo
echo "dart $("$DART" --version 2>/dev/null | head -n1), nginx $("$NGINX" -v 2>&1 | sed 's/.*nginx\///'), $CORES cores, wrk -t$THREADS -c$CONNECTIONS, $ROUNDS rounds of ${DURATION}s per case and target"
echo "req/s (MB/s for the cold read): medians of the rounds; ratios: the median of the rounds' ratios (their range)"
echo
echo "| case | nginx | dart (RAM tier on) | dart / nginx | dart (disk tier only) | dart / nginx |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo "| geometric mean of the ratios | | | $(geo "${ratios_ram[@]}") | | $(geo "${ratios_disk[@]}") |"
echo
printf 'cold whole read against the origin read directly (%.1f MB/s), medians of the objects'"'"' ratios (range): dart (RAM tier on) %.2fx (%s), dart (disk tier only) %.2fx (%s), nginx %.2fx (%s)\n' \
  "$c_origin" "$(med "${cd_ram[@]}")" "$(rng "${cd_ram[@]}")" "$(med "${cd_disk[@]}")" "$(rng "${cd_disk[@]}")" \
  "$(med "${cd_nginx[@]}")" "$(rng "${cd_nginx[@]}")"
echo "page-cache write of ${OBJECT_MIB} MiB beside the caches (dd, bs=4M): ${c_write} MB/s (nginx writes every cold byte it serves through the page cache, dart around it with O_DIRECT unless --buffered-writes)"
echo
echo "The servers' CPU time (user + system, from /proc; nginx: master and workers), medians of the rounds; lower is better, and a ratio below 1 means dart spent less:"
echo
echo "| case | nginx | dart (RAM tier on) | dart / nginx | dart (disk tier only) | dart / nginx |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${cpu_rows[@]}"
