#!/usr/bin/env bash
# The field report: small orders apps built on third-party idempotency
# middlewares from the registries (scripts/field/), each attacked by
# orders-atk. For each app: start it on a free port of 127.0.0.1, run every
# check with two users (tokens field-a, field-b), stop it. Writes NAME.json
# (the runner's report), NAME.txt (its text report) and summary.md (the
# verdict table, with the versions) under the output folder; docs/FIELD.md
# reads them.
#
#   scripts/field-report.sh [APP…]      # all apps, or those named
#
# Installs what is missing: php-cli, php-sqlite3, redis-server (apt-get,
# as root), the pinned Python packages (one venv per requirements file) and
# npm packages (package-lock.json), into FIELD_CACHE. Nothing goes into
# the repository. Redis runs on a free port for the run and is stopped at
# the end, as is every app.
#
# Settings (environment):
#   FIELD_CACHE   venvs and node_modules (default ~/.cache/orders-api-field)
#   FIELD_OUT     the reports (default $CARGO_TARGET_DIR/field, or target/field)
#   ORDERS_ATK    the runner's binary (default: cargo build --release -p orders-atk)
#   FIELD_TIMEOUT seconds one app's run may take (default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD/scripts/field
cache=${FIELD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/orders-api-field}
target=${CARGO_TARGET_DIR:-target}
out=${FIELD_OUT:-$target/field}
budget=${FIELD_TIMEOUT:-300}
mkdir -p "$cache" "$out"
out=$(cd "$out" && pwd)

all_apps="seed-php django-idempotency-key drf-idempotency fastapi-idempotency asgi-idempotency-header powertools powertools-default"
apps=${*:-$all_apps}

# --- what the apps need ------------------------------------------------------
missing=()
command -v php >/dev/null || missing+=(php-cli)
php -m 2>/dev/null | grep -qx pdo_sqlite || missing+=(php-sqlite3)
command -v redis-server >/dev/null || missing+=(redis-server)
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} (apt-get)" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi
for tool in python3 node npm; do
  command -v "$tool" >/dev/null || { echo "field-report: $tool is required" >&2; exit 1; }
done
# @aws-lambda-powertools needs Node.js 20 or later (Debian 12's nodejs is 18).
if [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then
  echo "field-report: Node.js 20 or later is required (found $(node --version))" >&2
  exit 1
fi

# venv NAME: $cache/py-NAME with scripts/field/requirements-NAME.txt, made
# again when the file changes.
venv() {
  local name=$1 dir=$cache/py-$1 file=$here/requirements-$1.txt
  if ! cmp -s "$file" "$dir/requirements.txt" 2>/dev/null; then
    echo "installing the $name venv" >&2
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/pip" install --quiet --disable-pip-version-check -r "$file" >&2
    cp "$file" "$dir/requirements.txt"
  fi
}
venv django
venv fastapi
venv header
if ! cmp -s "$here/package-lock.json" "$cache/node/package-lock.json" 2>/dev/null; then
  echo "installing the npm packages" >&2
  rm -rf "$cache/node"
  mkdir -p "$cache/node"
  cp "$here/package.json" "$here/package-lock.json" "$cache/node/"
  (cd "$cache/node" && npm ci --silent --no-audit --no-fund >&2)
fi

if [ -z "${ORDERS_ATK:-}" ]; then
  cargo build --locked --release --quiet -p orders-atk
  ORDERS_ATK=$target/release/orders-atk
fi

# --- running -----------------------------------------------------------------
work=$(mktemp -d /tmp/orders-api-field.XXXXXX)
pids=()
stop() {
  local pid
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  pids=()
}
trap 'stop; [ -n "${redis_pid:-}" ] && { kill "$redis_pid" 2>/dev/null; wait "$redis_pid" 2>/dev/null; }; rm -rf "$work"' EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# wait_port PORT PID LOG: until PORT answers (30 s at most) or PID is gone.
wait_port() {
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    kill -0 "$2" 2>/dev/null || break
    sleep 0.1
  done
  echo "the app on port $1 did not start:" >&2
  cat "$3" >&2
  return 1
}

redis_port=$(free_port)
redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no >"$work/redis.log" 2>&1 &
redis_pid=$!
wait_port "$redis_port" "$redis_pid" "$work/redis.log"
redis=redis://127.0.0.1:$redis_port

# start NAME PORT: starts app NAME on PORT in the background (pid in $!).
start() {
  local name=$1 port=$2 log=$work/$1.log
  case $name in
    seed-php)
      SEED_DB=$work/seed.sqlite php -d display_errors=0 -d log_errors=1 \
        -S "127.0.0.1:$port" "$here/seed.php" >"$log" 2>&1 & ;;
    django-idempotency-key)
      "$cache/py-django/bin/python" "$here/django_app.py" idempotency-key "$port" >"$log" 2>&1 & ;;
    drf-idempotency)
      REDIS_URL=$redis/0 "$cache/py-django/bin/python" "$here/django_app.py" drf-idempotency "$port" >"$log" 2>&1 & ;;
    fastapi-idempotency)
      "$cache/py-fastapi/bin/python" "$here/asgi_app.py" fastapi-idempotency "$port" >"$log" 2>&1 & ;;
    asgi-idempotency-header)
      REDIS_URL=$redis/1 "$cache/py-header/bin/python" "$here/asgi_app.py" asgi-idempotency-header "$port" >"$log" 2>&1 & ;;
    powertools)
      REDIS_URL=$redis/2 NODE_PATH=$cache/node/node_modules node "$here/powertools_app.js" "$port" >"$log" 2>&1 & ;;
    powertools-default)
      REDIS_URL=$redis/3 NODE_PATH=$cache/node/node_modules FIELD_PAYLOAD_VALIDATION=off \
        node "$here/powertools_app.js" "$port" >"$log" 2>&1 & ;;
    *) echo "unknown app $name (apps: $all_apps)" >&2; return 1 ;;
  esac
}

status=0
for name in $apps; do
  port=$(free_port)
  start "$name" "$port"
  pids=($!)
  wait_port "$port" "${pids[0]}" "$work/$name.log"
  echo "== $name on 127.0.0.1:$port" >&2
  code=0
  # The seed has no PATCH or DELETE (its built-in shape says so); the other apps have every route.
  profile=$here/profile.json
  [ "$name" = seed-php ] && profile=$here/profile-seed.json
  timeout "$budget" "$ORDERS_ATK" --server "http://127.0.0.1:$port" --profile "$profile" \
    --token field-a --token-b field-b --format json --out "$out/$name.json" \
    >"$out/$name.txt" 2>"$out/$name.err" || code=$?
  # 0: all blocked; 1: something exposed (the expected outcome here); else a failure.
  case $code in 0 | 1) ;; *) echo "orders-atk against $name exited $code:" >&2; cat "$out/$name.err" >&2; status=1 ;; esac
  tail -n 1 "$out/$name.txt" >&2
  stop
  cp "$work/$name.log" "$out/$name.server.log"
done

python3 "$here/summary.py" "$out" $apps >"$out/summary.md"
cat "$out/summary.md"
echo "reports in $out" >&2
exit $status
