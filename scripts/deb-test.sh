#!/usr/bin/env bash
# The Debian package, end to end (as root):
#   1. builds it (`cargo xtask deb`) and lists it (`dpkg-deb -c`);
#   2. lintian: no error, and no warning that debian/orders-api.lintian-overrides
#      does not justify;
#   3. `systemd-analyze verify` on its unit, among the package's own files, and
#      the unit's exposure (`systemd-analyze security --offline`) under a bound;
#   4. a fresh Debian root (mmdebstrap, from the Debian mirror this machine's
#      apt uses, with the package's dependencies, man-db and curl), the package
#      installed into it with `dpkg -i`, and the service run there:
#      - `nspawn` (when systemd-nspawn boots the root here): systemd boots in
#        the root (private network), the package's postinst starts the unit,
#        and systemd runs it with every line of the unit, its hardening too;
#      - `chroot` (otherwise): the service started as its unit would start
#        it: its user and group, its settings file, its state directory, its
#        working directory, its umask, no new privileges;
#      then: the demo token printed once; a key made the way the README tells
#      operators; the README walkthrough's create and replay with curl;
#      nothing of the service's outside its state directory; a graceful stop
#      (exit 0); no token on the second start; (nspawn) a killed service
#      restarted by systemd; `man orders-api` renders; bash completes;
#   5. `apt-get remove` keeps the database and the settings, `apt-get purge`
#      deletes both (the system user stays, as Debian keeps system users).
#
# DEB_TEST_MODE=nspawn|chroot picks the way of step 4 (default: nspawn when
# it boots here). The root's tarball is cached under $DEB_TEST_CACHE for a
# week (its name says the suite, the mirror and the packages); each run
# unpacks a fresh copy and deletes it at the end. Every step is bounded.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/orders-api-target}
export PATH="${CARGO_TOOLS:-/var/tmp/cargo-tools}/bin:$PATH"
cache=${DEB_TEST_CACHE:-/var/tmp/orders-api-deb-test}
mode=${DEB_TEST_MODE:-auto}

say() { printf '== %s\n' "$*"; }
fail() { printf 'deb-test: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "run me as root (mmdebstrap, chroot, systemd-nspawn)"
for tool in cargo-deb lintian mmdebstrap systemd-analyze dpkg-deb; do
  command -v "$tool" >/dev/null || fail "$tool is missing (.ci/run installs it)"
done
if [ "$mode" = auto ]; then
  if command -v systemd-nspawn >/dev/null; then mode=nspawn; else mode=chroot; fi
fi

root="" stage="" server="" container="" log=""
cleanup() {
  if [ -n "$server" ] && running "$server"; then kill -KILL "$server" 2>/dev/null || true; fi
  if [ -n "$container" ] && running "$container"; then
    kill -TERM "$container" 2>/dev/null || true   # nspawn powers the container off
    timeout 60 tail --pid="$container" -f /dev/null || kill -KILL "$container" 2>/dev/null || true
  fi
  if [ -n "$root" ]; then
    if mountpoint -q "$root/proc"; then umount "$root/proc"; fi
    rm -rf "$root"
  fi
  [ -z "$stage" ] || rm -rf "$stage"
  [ -z "$log" ] || rm -f "$log"
}
trap cleanup EXIT
# Whether process $1 runs (an exited child not yet waited for does not).
running() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [ "${state:0:1}" != Z ]
}

say "cargo xtask deb"
# cargo deb prints the package's path last.
deb=$(timeout 2400 cargo xtask deb --locked | tail -1)
[ -f "$deb" ] || fail "cargo xtask deb made no package ($deb)"
say "dpkg-deb -c $(basename "$deb")"
dpkg-deb -c "$deb"
dpkg-deb -f "$deb" Package Version Depends Installed-Size

say "lintian"
# Errors and warnings fail; each one kept is overridden, with its reason, in
# debian/orders-api.lintian-overrides. Infos are shown, then the overrides
# used (a separate run: lintian exits 2 when --show-overrides shows one).
timeout 600 lintian --fail-on error,warning --display-info "$deb"
timeout 600 lintian --show-overrides "$deb" | grep '^O:' || true

say "systemd-analyze verify (the package's files over this machine's systemd units)"
stage=$(mktemp -d /tmp/orders-api-deb-stage.XXXXXX)
dpkg-deb -x "$deb" "$stage"
unit_path=""
for candidate in usr/lib/systemd/system/orders-api.service lib/systemd/system/orders-api.service; do
  if [ -f "$stage/$candidate" ]; then unit_path=$candidate; break; fi
done
[ -n "$unit_path" ] || fail "the package has no orders-api.service"
# The targets the unit depends on come from this machine; the binary it
# runs and the man page it names, from the package. Any complaint fails.
cp -an /lib/systemd/system/. "$stage/$(dirname "$unit_path")/"
if ! complaints=$(MANPATH="$stage/usr/share/man" timeout 120 \
  systemd-analyze verify --root="$stage" "/$unit_path" 2>&1) || [ -n "$complaints" ]; then
  fail "systemd-analyze verify: ${complaints:-failed}"
fi
say "systemd-analyze security: the unit's exposure, at most 2.0 (of 10)"
timeout 120 systemd-analyze security --offline=true --threshold=20 --no-pager \
  --root="$stage" "/$unit_path" | tail -3

say "a fresh Debian root ($mode)"
# shellcheck disable=SC1091
suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
sources=/etc/apt/sources.list.d/debian.sources
[ -f "$sources" ] || sources=/etc/apt/sources.list
[ -f "$sources" ] || fail "no apt sources on this machine"
# The package's dependencies (the first of each alternative), man-db, curl;
# systemd to boot.
packages=$(dpkg-deb -f "$deb" Depends | sed 's/([^)]*)//g; s/|[^,]*//g; s/ //g'),man-db,curl
[ "$mode" = chroot ] || packages=$packages,systemd,systemd-sysv,dbus
key=$( (echo "$suite $packages"; cat "$sources") | sha256sum | cut -c1-16)
tarball="$cache/debian-$suite-$key.tar"
mkdir -p "$cache"
find "$cache" -name 'debian-*.tar' -mtime +7 -delete
if [ ! -s "$tarball" ]; then
  say "mmdebstrap $suite with $packages, from $sources (cached as $tarball)"
  # mmdebstrap writes a tarball when the name ends in .tar.
  timeout 900 mmdebstrap --quiet --mode=root --variant=minbase --include="$packages" \
    "$suite" "$cache/partial-$key.tar" "$sources"
  mv "$cache/partial-$key.tar" "$tarball"
fi
root=$(mktemp -d /var/tmp/orders-api-deb-root.XXXXXX)
tar -C "$root" -xf "$tarball"
log=$(mktemp /tmp/orders-api-deb-log.XXXXXX)

if [ "$mode" = nspawn ]; then
  # Its own network (loopback only): the service keeps its default port.
  systemd-nspawn --quiet --register=no --keep-unit --private-network \
    --directory="$root" --boot --console=read-only >"$log" 2>&1 &
  container=$!
  # The container's init: the child of systemd-nspawn that runs systemd
  # (not a helper that nspawn forks on the way).
  init=""
  for _ in $(seq 300); do
    init=$(ps -o pid= --ppid "$container" | tr -d ' ') || true # none yet: ps fails
    if [ -n "$init" ] && [ "$(cat "/proc/$init/comm" 2>/dev/null)" = systemd ]; then break; fi
    init=""
    running "$container" || { cat "$log"; fail "systemd-nspawn did not boot the root"; }
    sleep 0.1
  done
  [ -n "$init" ] || { cat "$log"; fail "no systemd in the container within 30 s"; }
  # A command in the container (its namespaces, its root), at most 5 minutes.
  inside() {
    timeout 300 nsenter --target "$init" --all --root --wd -- \
      /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"
  }
  # systemctl answers once the manager's socket is there.
  for _ in $(seq 600); do
    inside test -S /run/systemd/private && break
    sleep 0.1
  done
  booted=$(inside timeout 120 systemctl is-system-running --wait || true)
  [ "$booted" = running ] || {
    inside systemctl --failed --no-pager || true
    fail "the container's systemd is $booted, not running"
  }
else
  mount -t proc proc "$root/proc"
  # A command in the root, at most 5 minutes.
  inside() {
    timeout 300 chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"
  }
fi

say "dpkg -i"
# Not /tmp: a booted system mounts its own over it.
work=/var/tmp/deb-test
mkdir -p "$root$work"
cp "$deb" "$root$work/orders-api.deb"
inside dpkg -i "$work/orders-api.deb"
inside getent passwd orders-api >/dev/null || fail "postinst made no orders-api user"
uid=$(inside id -u orders-api)
[ "$(stat -c %a "$root/etc/default/orders-api")" = 640 ] || fail "the settings file is not 0640"
[ -L "$root/etc/systemd/system/multi-user.target.wants/orders-api.service" ] \
  || fail "the unit was not enabled"

# The unit's own lines.
unit="$root/$unit_path"
setting() { sed -n "s/^$1=//p" "$unit" | tail -1; }
user=$(setting User) group=$(setting Group) exec_start=$(setting ExecStart)
env_file=$(setting EnvironmentFile) workdir=$(setting WorkingDirectory)
state="/var/lib/$(setting StateDirectory)" state_mode=$(setting StateDirectoryMode)
umask_=$(setting UMask)
for v in user group exec_start env_file workdir state_mode umask_; do
  [ -n "${!v}" ] || fail "the unit sets no $v"
done

if [ "$mode" = nspawn ]; then
  port=8080
  # The postinst started it; `systemctl start` of a Type=notify unit returned
  # once it answered READY=1.
  start_service() {
    inside systemctl start orders-api
    [ "$(inside systemctl is-active orders-api)" = active ] || fail "the unit is not active"
  }
  stop_service() {
    inside systemctl stop orders-api
    local result
    result=$(inside systemctl show -p Result -p ExecMainStatus --value orders-api | paste -sd' ')
    [ "$result" = "success 0" ] || fail "the unit stopped with $result, not success 0"
  }
  service_log() { inside journalctl -u orders-api --no-pager -o cat; }
  [ "$(inside systemctl is-active orders-api)" = active ] || {
    service_log; fail "the postinst did not start the unit"
  }
else
  # An operator's edit: any free port (the host's network is shared), which
  # the log then names.
  echo 'BIND_ADDR=127.0.0.1:0' >>"$root$env_file"
  start_service() {
    # What systemd does: StateDirectory= (the folder, made for the user),
    # then EnvironmentFile=, WorkingDirectory=, UMask=, User=/Group=,
    # NoNewPrivileges=, ExecStart= (split into words, as systemd splits it).
    # chroot, env, sh and setpriv each exec the next: $! is the service.
    inside install -d -o "$user" -g "$group" -m "$state_mode" "$state"
    local from
    from=$(wc -l <"$log")
    chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
      sh -c "set -a && . '$env_file' && set +a && cd '$workdir' && umask $umask_ && \
        exec setpriv --reuid='$user' --regid='$group' --init-groups --no-new-privs -- $exec_start" \
      2>>"$log" &
    server=$!
    for _ in $(seq 600); do
      port=$(tail -n +"$((from + 1))" "$log" | sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p')
      if [ -n "$port" ] && running "$server"; then return 0; fi
      running "$server" || { cat "$log"; fail "the service exited at its start"; }
      sleep 0.1
    done
    cat "$log"; fail "the service did not listen within 60 s"
  }
  stop_service() {
    kill -TERM "$server"
    # At most 60 s for the graceful stop (its bound is 30 s), then SIGKILL.
    ( sleep 60; kill -KILL "$server" 2>/dev/null ) &
    local watchdog=$! status=0
    wait "$server" || status=$?
    kill "$watchdog" 2>/dev/null || true
    server=""
    [ "$status" = 0 ] || { cat "$log"; fail "the service exited $status after SIGTERM, not 0"; }
  }
  service_log() { cat "$log"; }
  say "the first start, as the unit starts it"
  marker="$root$work/before-start"
  touch "$marker"
  start_service
fi

say "the demo token, printed once"
[ "$(service_log | grep -c 'No API keys existed')" = 1 ] || { service_log; fail "no demo token"; }
service_log | grep -A3 'No API keys existed' | grep ' oa_' >/dev/null || fail "the demo token is not shown"

say "a key for alice, as the README tells operators to make one"
TOKEN=$(inside sh -c "set -a; . '$env_file'; exec runuser -u orders-api -- orders-api keys create alice")
case $TOKEN in oa_*) ;; *) fail "keys create printed $TOKEN" ;; esac

say "the walkthrough: create, then its replay"
API=http://127.0.0.1:$port
KEY=order-$RANDOM
call() { # BODY [HEADER…]: the answer's head and body, with curl inside the root
  local body=$1 extra=() header
  shift
  for header in "$@"; do extra+=(-H "$header"); done
  inside curl -sS --max-time 10 -i "$API/v1/orders" -H "Authorization: Bearer $TOKEN" \
    -H "Idempotency-Key: $KEY" -H 'Content-Type: application/json' "${extra[@]}" -d "$body"
}
body() { sed '1,/^\r\?$/d'; }
created=$(call '{"item":"Widget","quantity":2,"price":9.99}')
echo "$created" | sed -n 1p | grep ' 201' >/dev/null || fail "create: $created"
echo "$created" | grep -i '^location: /v1/orders/' >/dev/null || fail "create: no Location: $created"
replayed=$(call '{"quantity":2, "item":"Widget", "price":9.990}')
echo "$replayed" | sed -n 1p | grep ' 200' >/dev/null || fail "replay: $replayed"
echo "$replayed" | grep -i '^idempotent-replayed: true' >/dev/null || fail "replay: no Idempotent-Replayed"
[ "$(echo "$replayed" | body)" = "$(echo "$created" | body)" ] || fail "the replay's body differs"
refused=$(call '{"item":"Widget","quantity":99,"price":0.01}' 'X-Request-Id: deb-test-1')
echo "$refused" | sed -n 1p | grep ' 409' >/dev/null || fail "another payload: $refused"
echo "$refused" | body | grep '"instance":"urn:request:deb-test-1"' >/dev/null || fail "no instance: $refused"
echo "created, then replayed: $(echo "$created" | body)"

say "the database is the service's; nothing of the service's outside its state directory"
[ "$(stat -c %u "$root$state/orders.db")" = "$uid" ] || fail "orders.db is not $user's"
outside=$(find "$root" -xdev -uid "$uid" ! -path "$root$state" ! -path "$root$state/*" -print)
[ -z "$outside" ] || fail "the service's files outside $state: $outside"
if [ "$mode" = chroot ]; then
  # Without a booted system, nothing else writes: whatever changed since the
  # start is the service's (or the operator's command's).
  outside=$(find "$root" -xdev -newer "$marker" ! -path "$root$state" ! -path "$root$state/*" \
    ! -path "$root$work" ! -path "$root$work/*" ! -path "$root$env_file" -print)
  [ -z "$outside" ] || fail "written outside $state: $outside"
fi

say "a graceful stop (exit 0); a second start prints no token"
stop_service
start_service
[ "$(service_log | grep -c 'No API keys existed')" = 1 ] || fail "a demo token again on the second start"
if [ "$mode" = nspawn ]; then
  say "killed, it is started again (Restart=on-failure)"
  inside systemctl kill --kill-whom=main --signal=SIGKILL orders-api
  for _ in $(seq 300); do
    restarts=$(inside systemctl show -p NRestarts --value orders-api)
    [ "$restarts" -ge 1 ] && [ "$(inside systemctl is-active orders-api)" = active ] && break
    sleep 0.1
  done
  [ "$restarts" -ge 1 ] || fail "systemd did not restart the killed service"
  [ "$(inside curl -s -o /dev/null -w '%{http_code}' "$API/readyz")" = 200 ] || fail "not ready after the restart"
  say "the unit's exposure as systemd sees it"
  inside systemd-analyze security --no-pager orders-api | tail -1
fi
stop_service

say "man orders-api, man orders-api-keys-create; bash completion"
# Wide enough that no line wraps (or hyphenates) what is looked for.
inside env MANPAGER=cat MANWIDTH=1000 man orders-api | grep '^FILES' -A3 \
  | grep '/etc/default/orders-api' >/dev/null || fail "man orders-api does not render"
inside env MANPAGER=cat MANWIDTH=1000 man orders-api-keys-create | grep 'orders-api keys create' \
  | grep 'USER_ID' >/dev/null || fail "man orders-api-keys-create does not render"
inside bash -c '. /usr/share/bash-completion/completions/orders-api && complete -p orders-api' >/dev/null \
  || fail "the bash completion does not load"

say "apt-get remove keeps the database and the settings"
inside apt-get -o Dpkg::Use-Pty=0 remove -y -q orders-api >/dev/null
[ ! -e "$root/usr/bin/orders-api" ] || fail "remove left the binary"
[ -f "$root$state/orders.db" ] || fail "remove deleted the database"
[ -f "$root$env_file" ] || fail "remove deleted the settings"

say "apt-get purge leaves no state behind"
inside apt-get -o Dpkg::Use-Pty=0 purge -y -q orders-api >/dev/null
for gone in "$state" "$env_file" /etc/systemd/system/multi-user.target.wants/orders-api.service; do
  [ ! -e "$root$gone" ] || fail "purge left $gone"
done
if inside dpkg-query -W -f '${db:Status-Status}' orders-api 2>/dev/null | grep -qv not-installed; then
  fail "dpkg still knows orders-api"
fi
inside getent passwd orders-api >/dev/null || fail "the system user should stay (Debian keeps system users)"

say "deb-test ($mode): passed"
