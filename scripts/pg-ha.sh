#!/usr/bin/env bash
# A throwaway highly available PostgreSQL formation on pg_auto_failover:
# a monitor and two nodes on 127.0.0.1, synchronous replication, tuned to
# fail over in seconds rather than a minute.
#
#   scripts/pg-ha.sh start DIR         # prints the multi-host URL on stdout
#   scripts/pg-ha.sh stop DIR          # stops everything, keeps DIR's data
#   scripts/pg-ha.sh kill-primary DIR  # SIGKILLs the primary node's process group
#   scripts/pg-ha.sh rejoin DIR        # starts every killed node again
#   scripts/pg-ha.sh switchover DIR    # a planned switchover (pg_autoctl perform)
#   scripts/pg-ha.sh primary DIR       # prints the primary's node name
#   scripts/pg-ha.sh wait-healthy DIR  # waits for one primary and one secondary
#   scripts/pg-ha.sh wait-synchronous DIR  # ... and for commits to wait for that secondary
#   scripts/pg-ha.sh events DIR        # the monitor's last events, oldest first
#
# The URL names both nodes and asks for the one that writes:
#   postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/orders?target_session_attrs=read-write&connect_timeout=2
# so `DATABASE_URL=$(scripts/pg-ha.sh start /tmp/ha) orders-api` follows the
# primary across failovers by itself (libpq tries the hosts in turn).
#
# Durability is PostgreSQL's default here (fsync on, synchronous_commit on,
# full_page_writes on): this formation is for failover and durability tests.
# It listens on 127.0.0.1 only, with trust authentication: it is for tries
# and tests, never for data. As root, every process runs as `postgres`.
#
# Each node's keeper (`pg_autoctl run`) and its PostgreSQL run in a process
# group of their own (setsid), so that `kill-primary` takes down a node
# whole — keeper and server, as a crashed host would — and the monitor,
# not the node's own supervisor, has to notice and fail over.
#
# Installs the Debian packages postgresql-15-auto-failover and
# pg-auto-failover-cli when missing.
set -euo pipefail

cmd=${1:?usage: pg-ha.sh start|stop|kill-primary|rejoin|switchover|primary|wait-healthy|wait-synchronous|events DIR}
dir=${2:?usage: pg-ha.sh COMMAND DIR}

if ! command -v pg_autoctl >/dev/null || ! ls /usr/lib/postgresql/*/lib/pgautofailover.so >/dev/null 2>&1; then
  echo "pg-ha: installing pg_auto_failover" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15-auto-failover pg-auto-failover-cli >&2
fi
bindir=
for candidate in /usr/lib/postgresql/*/bin; do
  [ -x "$candidate/pg_ctl" ] && [ -e "$candidate/../lib/pgautofailover.so" ] && bindir=$candidate
done
if [ -z "$bindir" ]; then
  echo "pg-ha: no PostgreSQL with the pgautofailover extension found" >&2
  exit 1
fi

as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
# pg_autoctl keeps its configuration and state under XDG directories: all
# of them inside DIR, so that nothing outlives `rm -rf DIR`.
autoctl() {
  as_owner env XDG_CONFIG_HOME="$dir/xdg/config" XDG_DATA_HOME="$dir/xdg/data" \
    XDG_RUNTIME_DIR="$dir/xdg/run" PATH="$bindir:$PATH" PG_CONFIG="$bindir/pg_config" \
    pg_autoctl "$@"
}
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
psql_at() { # PORT DB SQL
  as_owner "$bindir/psql" -h 127.0.0.1 -p "$1" -U postgres -d "$2" -qtAX -c "$3"
}
monitor_sql() { psql_at "$(cat "$dir/monitor.port")" pg_auto_failover "$1"; }

# Starts `pg_autoctl run` for pgdata NAME in a process group of its own.
run_service() {
  local name=$1
  # setsid makes the keeper a process-group leader: its pid is the group id.
  setsid bash -c "$(declare -f as_owner autoctl); dir='$dir'; bindir='$bindir'; \
    exec > '$dir/$name.log' 2>&1 </dev/null; autoctl run --pgdata '$dir/$name'" &
  echo $! >"$dir/$name.pgid"
}
group_alive() { [ -f "$dir/$1.pgid" ] && kill -0 -- "-$(cat "$dir/$1.pgid")" 2>/dev/null; }

wait_for() { # SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "pg-ha: timed out waiting for $what" >&2
      return 1
    fi
    sleep 0.2
  done
}
healthy() {
  [ "$(monitor_sql "SELECT count(*) FILTER (WHERE reportedstate = 'primary' AND goalstate = 'primary')
                     || ',' || count(*) FILTER (WHERE reportedstate = 'secondary' AND goalstate = 'secondary')
                      FROM pgautofailover.node")" = "1,1" ]
}
primary_name() {
  monitor_sql "SELECT nodename FROM pgautofailover.node
                WHERE reportedstate IN ('primary', 'wait_primary', 'single')
                  AND goalstate IN ('primary', 'wait_primary', 'single') LIMIT 1"
}
is_primary() { [ "$(primary_name)" = "$1" ]; }
# PostgreSQL's own view, not the monitor's: the primary names a standby in
# synchronous_standby_names and that standby streams as its synchronous
# (quorum) standby, so every commit from here on waits for it.
synchronous() {
  local name port
  name=$(primary_name)
  [ -n "$name" ] || return 1
  port=$(cat "$dir/$name.port")
  [ "$(psql_at "$port" postgres "SELECT current_setting('synchronous_standby_names') <> ''
                                   AND EXISTS (SELECT 1 FROM pg_stat_replication
                                                WHERE state = 'streaming'
                                                  AND sync_state IN ('sync', 'quorum'))")" = t ]
}

# What keeps two primaries from both acknowledging writes, and what the
# timeouts decide (pg_auto_failover's states and settings, as its docs
# name them):
#
# - The fence is synchronous replication, not a timeout. A failover or a
#   switchover first takes the standby to stop_replication: it stops
#   streaming from the old primary and is promoted read-only
#   (default_transaction_read_only). From then on the old primary, whose
#   synchronous_standby_names still names that standby, cannot get a commit
#   confirmed: its commits wait, and end unacknowledged when its keeper stops
#   it (the service answers 503; the retry with the same key lands on the
#   new primary). So the old primary may still accept sessions for a while —
#   a keeper that is alive but slow (an overloaded machine) is not fenced by
#   any timeout, and the monitor makes the new primary writable after
#   primary_demote_timeout whether or not the old one has stopped — but only
#   one of them can acknowledge.
# - The fence holds only while the old primary names its standby. With two
#   nodes pg_auto_failover empties synchronous_standby_names whenever the
#   monitor calls the standby unhealthy (the primary goes to wait_primary:
#   availability over durability). A failover from that state loses what the
#   old primary acknowledged alone (docs/SCALING.md), as stalling the old
#   primary's keeper during a switchover with its synchronous_standby_names
#   emptied reproduces. So the failover test starts each
#   failover only from a primary that PostgreSQL shows waiting for a
#   streaming synchronous standby (`wait-synchronous`), and the health
#   checks below are lenient, so that a loaded machine is less likely to
#   have a slow standby called unhealthy. On two nodes that is a precaution,
#   not a guarantee; the setting that removes the relaxation itself is
#   number_sync_standbys 1, which needs a third node (docs/SCALING.md).
# - network_partition_timeout (3 s): a primary's keeper that reaches neither
#   the monitor nor its standby for this long stops accepting writes itself;
#   primary_demote_timeout (6 s) is longer than that plus a keeper loop, so a
#   primary cut off from everything is read-only before the monitor lets
#   the standby write.
# - Detection: the monitor calls a node unhealthy only when its health
#   checks fail (every second, 2 s connect timeout, two retries 0.5 s apart)
#   and its keeper has not reported for node_considered_unhealthy_timeout
#   (5 s). A killed node refuses connections at once, so a dead primary is
#   seen after about 5 s; a slow one has to miss its reports for 5 s.
#
# Shorter detection would trade availability against false failovers and
# relaxations of synchronous replication; no timeout setting fences a keeper
# that is alive but stalled.
MONITOR_SETTINGS=(
  "pgautofailover.health_check_period = 1000"
  "pgautofailover.health_check_timeout = 2000"
  "pgautofailover.health_check_max_retries = 2"
  "pgautofailover.health_check_retry_delay = 500"
  "pgautofailover.node_considered_unhealthy_timeout = 5000"
  "pgautofailover.primary_demote_timeout = 6000"
  "pgautofailover.startup_grace_period = 3000"
)
KEEPER_SETTINGS=(
  "timeout.network_partition_timeout 3"
)

create_node() { # NAME PORT
  local name=$1 port=$2
  autoctl create postgres --pgdata "$dir/$name" --pgport "$port" --pghost 127.0.0.1 \
    --listen 127.0.0.1 --hostname 127.0.0.1 --name "$name" --dbname orders \
    --auth trust --no-ssl --pgctl "$bindir/pg_ctl" \
    --monitor "postgres://autoctl_node@127.0.0.1:$(cat "$dir/monitor.port")/pg_auto_failover?sslmode=disable" \
    >>"$dir/$name.create.log" 2>&1
  for setting in "${KEEPER_SETTINGS[@]}"; do
    # shellcheck disable=SC2086 # "key value"
    autoctl config set --pgdata "$dir/$name" $setting >/dev/null
  done
}

url() {
  echo "postgres://postgres@127.0.0.1:$(cat "$dir/node1.port"),127.0.0.1:$(cat "$dir/node2.port")/orders?target_session_attrs=read-write&connect_timeout=2"
}

case "$cmd" in
  start)
    mkdir -p "$dir/xdg/run"
    chmod 700 "$dir/xdg/run"
    [ "$(id -u)" = 0 ] && chown -R postgres:postgres "$dir"
    if [ ! -f "$dir/node2.port" ]; then
      free_port >"$dir/monitor.port"
      free_port >"$dir/node1.port"
      free_port >"$dir/node2.port"
      autoctl create monitor --pgdata "$dir/monitor" --pgport "$(cat "$dir/monitor.port")" \
        --hostname 127.0.0.1 --auth trust --no-ssl --pgctl "$bindir/pg_ctl" \
        >"$dir/monitor.create.log" 2>&1
      run_service monitor
      wait_for 30 "the monitor" monitor_sql "SELECT 1"
      for setting in "${MONITOR_SETTINGS[@]}"; do
        psql_at "$(cat "$dir/monitor.port")" postgres "ALTER SYSTEM SET $setting" >/dev/null
      done
      psql_at "$(cat "$dir/monitor.port")" postgres "SELECT pg_reload_conf()" >/dev/null
      create_node node1 "$(cat "$dir/node1.port")"
      run_service node1
      wait_for 30 "node1 to be primary" is_primary node1
      # A standby's `create` takes its base backup from the running primary.
      create_node node2 "$(cat "$dir/node2.port")"
      run_service node2
    else
      for name in monitor node1 node2; do group_alive "$name" || run_service "$name"; done
    fi
    wait_for 60 "a primary and a secondary" healthy
    url
    ;;
  stop)
    for name in node2 node1 monitor; do
      if group_alive "$name"; then
        kill -TERM -- "-$(cat "$dir/$name.pgid")" 2>/dev/null || true
      fi
    done
    for name in node2 node1 monitor; do
      for _ in $(seq 1 100); do group_alive "$name" || break; sleep 0.1; done
      if group_alive "$name"; then kill -KILL -- "-$(cat "$dir/$name.pgid")" 2>/dev/null || true; fi
    done
    # A server whose keeper died first (kill-primary) may still be up.
    for name in node1 node2 monitor; do
      [ -f "$dir/$name/postmaster.pid" ] &&
        as_owner "$bindir/pg_ctl" -D "$dir/$name" -m immediate -w stop >/dev/null 2>&1 || true
    done
    ;;
  kill-primary)
    name=$(primary_name)
    [ -n "$name" ] || { echo "pg-ha: no primary" >&2; exit 1; }
    kill -KILL -- "-$(cat "$dir/$name.pgid")"
    # PostgreSQL's own children leave when the postmaster is gone; wait for
    # the last so that the port is free for the rejoin.
    for _ in $(seq 1 100); do group_alive "$name" || break; sleep 0.1; done
    echo "$name"
    ;;
  rejoin)
    for name in node1 node2; do group_alive "$name" || run_service "$name"; done
    ;;
  switchover)
    autoctl perform switchover --pgdata "$dir/monitor" >"$dir/switchover.log" 2>&1
    ;;
  primary)
    primary_name
    ;;
  events)
    monitor_sql "SELECT to_char(eventtime, 'HH24:MI:SS.MS') || ' ' || nodename || ' ' || description
                   FROM pgautofailover.event ORDER BY eventid DESC LIMIT ${PG_HA_EVENTS:-60}" | tac
    ;;
  wait-healthy)
    wait_for "${PG_HA_WAIT:-120}" "a primary and a secondary" healthy
    ;;
  wait-synchronous)
    wait_for "${PG_HA_WAIT:-120}" "a synchronous standby" synchronous
    ;;
  *)
    echo "usage: pg-ha.sh start|stop|kill-primary|rejoin|switchover|primary|wait-healthy|wait-synchronous|events DIR" >&2
    exit 2
    ;;
esac
