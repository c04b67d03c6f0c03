#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the test suite.
#
#   scripts/pg-cluster.sh start DIR   # prints a URL on stdout
#   scripts/pg-cluster.sh stop DIR
#
# The URL names a database `orders` (created here) that the server can serve
# on at once: `DATABASE_URL=$(scripts/pg-cluster.sh start /tmp/pg) orders-api`.
# Its user `postgres` may create databases, so the same URL serves as the test
# suite's TEST_DATABASE_URL (each test creates a database of its own beside it).
#
# PG_SERVER_OPTIONS adds server options to `start`, e.g.
# PG_SERVER_OPTIONS="-c lc_messages=de_DE.UTF-8" for a cluster whose errors
# are in German (the locale must exist: `locale-gen de_DE.UTF-8`).
#
# `start` on a DIR whose cluster was stopped starts it again on the same data
# and the same port, so that clients reconnect by themselves (outage tests).
#
# PostgreSQL refuses to run as root, so as root the server runs as the
# `postgres` user. The cluster listens on 127.0.0.1 only, on a free port,
# with trust authentication: it is for tests, never for data.
set -euo pipefail

cmd=${1:?usage: pg-cluster.sh start|stop DIR}
dir=${2:?usage: pg-cluster.sh start|stop DIR}

bindir=${PG_BINDIR:-}
if [ -z "$bindir" ]; then
  for candidate in /usr/lib/postgresql/*/bin; do
    [ -x "$candidate/pg_ctl" ] && bindir=$candidate
  done
fi
if [ -z "$bindir" ] || [ ! -x "$bindir/pg_ctl" ]; then
  echo "pg-cluster: no PostgreSQL server binaries found (apt-get install postgresql)" >&2
  exit 1
fi

as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "$cmd" in
  start)
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
    if [ -f "$dir/data/PG_VERSION" ] && [ -f "$dir/port" ]; then
      port=$(cat "$dir/port")
    else
      port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
      as_owner "$bindir/initdb" -D "$dir/data" -A trust -U postgres --no-sync >"$dir/initdb.log" 2>&1
    fi
    as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off ${PG_SERVER_OPTIONS:-}" \
      start >&2
    echo "$port" >"$dir/port"
    psql() { as_owner "$bindir/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qtAX "$@"; }
    if [ "$(psql -c "SELECT 1 FROM pg_database WHERE datname = 'orders'")" != 1 ]; then
      psql -c "CREATE DATABASE orders" >&2
    fi
    echo "postgres://postgres@127.0.0.1:$port/orders"
    ;;
  stop)
    [ -d "$dir/data" ] && as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    ;;
  *)
    echo "usage: pg-cluster.sh start|stop DIR" >&2
    exit 2
    ;;
esac
