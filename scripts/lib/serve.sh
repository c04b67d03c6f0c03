# Sourced by the scripts that need a live server (schemathesis.sh, atk-live.sh).
#
#   serve_on_free_port BINARY LOG   # sets server_pid and address, or fails
#
# Starts `BINARY serve` on port 0 (the server picks a free port and logs it)
# with the caller's environment (DATABASE_URL), logging to LOG, and waits up
# to 30 s for its "listening on" line. On failure it prints the log and
# returns 1.
serve_on_free_port() {
  local binary=$1 log=$2
  "$binary" serve --bind 127.0.0.1:0 >"$log" 2>&1 &
  server_pid=$!
  address=
  for _ in $(seq 1 300); do
    address=$(grep -o 'listening on http://[0-9.]*:[0-9]*' "$log" | head -n1 | sed 's/^listening on //' || true)
    [ -n "$address" ] && return 0
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "orders-api did not start:" >&2
  cat "$log" >&2
  return 1
}
