#!/usr/bin/env bash
# Builds a PostgreSQL image without a registry, for the compose test only: a minimal Debian root
# made by debootstrap from Debian's packages, imported into Docker, and Debian's `postgresql`
# installed on it with an entrypoint that does what deploy/compose.yaml asks of the official image.
# Users keep the pinned official image of deploy/.env.
#
#   tests/compose/postgres/build-image.sh IMAGE
#
# An existing IMAGE is reused, so only the first run pays for the build. Needs root (debootstrap)
# and access to a Debian mirror (DEBIAN_MIRROR, default http://deb.debian.org/debian).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
image="${1:?usage: $0 IMAGE}"
base="${image%:*}-base:bookworm"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if docker image inspect "$image" >/dev/null 2>&1; then
    echo "==> image $image: already built, reused"
    exit 0
fi
started=$SECONDS
if ! docker image inspect "$base" >/dev/null 2>&1; then
    echo "==> image $base: debootstrap --variant=minbase bookworm"
    root="$(mktemp -d)"
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase bookworm "$root" "$mirror" >/dev/null
    # The downloaded packages are installed already: not worth carrying in the image.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* -c . | docker import - "$base" >/dev/null
fi
echo "==> image $image: Debian's postgresql on $base"
docker build --quiet --build-arg "BASE=$base" -t "$image" "$here" >/dev/null
echo "built in $((SECONDS - started)) s: $(docker image inspect "$image" --format '{{.Size}}') bytes"
