# Shared by bench/vs-nginx.sh and bench/memory.sh (sourced, not run). The caller sets NAME (its
# name in error messages) before sourcing.

fail() {
  echo "$NAME: $*" >&2
  exit 1
}

# Installs the Debian packages among "$@" whose command is missing (as root; otherwise fails
# naming them). The install must not start nginx's service, which would listen on :80 on every
# interface: a policy-rc.d refuses service starts for its duration when none exists.
need_packages() {
  local missing=() pkg
  for pkg in "$@"; do
    command -v "$pkg" >/dev/null || [ -x "/usr/sbin/$pkg" ] || missing+=("$pkg")
  done
  [ ${#missing[@]} = 0 ] && return 0
  [ "$(id -u)" = 0 ] || fail "missing ${missing[*]}: apt-get install ${missing[*]} (or run as root)"
  echo "installing ${missing[*]} with apt-get" >&2
  local policy=/usr/sbin/policy-rc.d made= ok=1
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made=1
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null || ok=0
  [ -n "$made" ] && rm -f "$policy"
  [ "$ok" = 1 ] || fail "could not install ${missing[*]} with apt-get"
}

# The release binary, built when missing.
# free_ports N: the first of N consecutive loopback ports that nothing listens on, below the
# kernel's ephemeral range (where sockets bound to port 0 and client connections take theirs:
# a base drawn there once collided with a listener another step had left, CI 2026-12-02).
free_ports() {
  local n=$1 floor base p tries ok
  floor=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  for tries in $(seq 50); do
    base=$((10000 + RANDOM % (floor - 10000 - n)))
    ok=1
    for p in $(seq "$base" $((base + n - 1))); do
      if ss -Htln "sport = :$p" 2>/dev/null | grep -q .; then ok=0; break; fi
    done
    if [ "$ok" = 1 ]; then echo "$base"; return 0; fi
  done
  fail "no $n free consecutive ports below $floor after 50 tries"
}

need_dart() {
  if [ ! -x "$DART" ]; then
    echo "building $DART (cargo build --release -p dart-node)" >&2
    cargo build --release -p dart-node >&2 || fail "could not build dart"
  fi
}

# A scratch directory and the processes started in it, all removed on exit.
WORK=$(mktemp -d "/tmp/dart-$NAME.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# The head of an nginx configuration whose files live in directory $1: a worker per core, no
# access log, sendfile, its temporary paths in $1. The caller appends its server blocks and the
# closing brace.
nginx_conf_head() {
  local dir=$1
  [ "$(id -u)" = 0 ] && echo "user root root;"
  cat <<CONF
worker_processes $(nproc);
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  sendfile on;
  keepalive_requests 1000000;
  client_body_temp_path $dir;
  proxy_temp_path $dir;
  fastcgi_temp_path $dir;
  uwsgi_temp_path $dir;
  scgi_temp_path $dir;
CONF
}
