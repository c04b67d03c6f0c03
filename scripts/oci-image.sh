#!/usr/bin/env bash
# An OCI image of the Debian package, built from scratch with buildah (no
# base image, no registry: the root comes from mmdebstrap, from the Debian
# mirror this machine's apt uses), then run with podman: the demo token on
# the first start, a key made with `podman exec`, the walkthrough's create
# and replay, a graceful stop (exit 0). As root. Not run by CI: it needs
# buildah, podman and runc (crun refuses a host on hybrid cgroups).
#
#   scripts/oci-image.sh [PACKAGE.deb]    # default: cargo xtask deb
#
# Leaves the image localhost/orders-api:VERSION; removes its test container
# and volume.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/orders-api-target}
export PATH="${CARGO_TOOLS:-/var/tmp/cargo-tools}/bin:$PATH"
buildah=(buildah --storage-driver vfs)
podman=(podman --storage-driver vfs --cgroup-manager cgroupfs --events-backend file --runtime runc)
fail() { printf 'oci-image: %s\n' "$*" >&2; exit 1; }

deb=${1:-$(timeout 2400 cargo xtask deb --locked | tail -1)}
[ -f "$deb" ] || fail "no package: $deb"
version=$(dpkg-deb -f "$deb" Version)
image=localhost/orders-api:${version%-*}

# shellcheck disable=SC1091
suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
sources=/etc/apt/sources.list.d/debian.sources
[ -f "$sources" ] || sources=/etc/apt/sources.list
packages=$(dpkg-deb -f "$deb" Depends | sed 's/([^)]*)//g; s/|[^,]*//g; s/ //g')

ctr="" name="orders-api-oci-test-$$"
cleanup() {
  "${podman[@]}" rm -f -v "$name" >/dev/null 2>&1 || true
  [ -z "$ctr" ] || "${buildah[@]}" rm "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT

ctr=$("${buildah[@]}" from scratch)
mnt=$("${buildah[@]}" mount "$ctr")
timeout 900 mmdebstrap --quiet --mode=root --variant=minbase --include="$packages" \
  --dpkgopt='path-exclude=/usr/share/{doc,man,locale,info}/*' "$suite" "$mnt" "$sources"
cp "$deb" "$mnt/tmp/orders-api.deb"
chroot "$mnt" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg -i /tmp/orders-api.deb >/dev/null
rm -rf "$mnt/tmp/orders-api.deb" "$mnt"/var/cache/apt/*.bin "$mnt"/var/lib/apt/lists/*
"${buildah[@]}" unmount "$ctr" >/dev/null
# The package's settings, as the unit has them, but listening on every
# address of the container; the database in the state directory, a volume.
"${buildah[@]}" config --entrypoint '["/usr/bin/orders-api", "serve"]' --cmd '[]' \
  --user orders-api --workingdir /var/lib/orders-api \
  --env DATABASE_URL=sqlite:///var/lib/orders-api/orders.db --env BIND_ADDR=0.0.0.0:8080 \
  --port 8080 --volume /var/lib/orders-api --stop-signal SIGTERM \
  --label org.opencontainers.image.title=orders-api \
  --label org.opencontainers.image.version="$version" "$ctr"
"${buildah[@]}" commit --quiet --rm "$ctr" "$image" >/dev/null
ctr=""
"${buildah[@]}" images "$image"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${podman[@]}" run -d --name "$name" --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 -p "127.0.0.1:$port:8080" "$image" >/dev/null
for _ in $(seq 300); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz")" = 200 ] && break
  sleep 0.1
done
"${podman[@]}" logs "$name" 2>&1 | grep ' oa_' >/dev/null || fail "no demo token in the log"
token=$("${podman[@]}" exec "$name" orders-api keys create alice)
create() {
  curl -sS -m 10 -i "http://127.0.0.1:$port/v1/orders" -H "Authorization: Bearer $token" \
    -H 'Idempotency-Key: oci-1' -H 'Content-Type: application/json' -d "$1"
}
created=$(create '{"item":"Widget","quantity":2,"price":9.99}')
replayed=$(create '{"quantity":2,"item":"Widget","price":9.990}')
echo "$created" | sed -n 1p | grep ' 201' >/dev/null || fail "create: $created"
echo "$replayed" | sed -n 1p | grep ' 200' >/dev/null || fail "replay: $replayed"
echo "$replayed" | grep -i '^idempotent-replayed: true' >/dev/null || fail "replay: $replayed"
echo "$created" | tail -1
"${podman[@]}" stop -t 45 "$name" >/dev/null
status=$("${podman[@]}" inspect "$name" --format '{{.State.ExitCode}}')
[ "$status" = 0 ] || fail "the container exited $status after SIGTERM"
echo "oci-image: $image runs (create, replay, graceful stop)"
