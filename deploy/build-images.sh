#!/usr/bin/env bash
# Builds the images of the chain's services: chain/<service>:<tag> (prefix and tag from .env).
#
#   deploy/build-images.sh               the binaries are built in the Dockerfile's rust stage
#                                        (needs the rust image from a registry)
#   deploy/build-images.sh --from-host   static binaries built here by cargo, packed into the
#                                        same FROM scratch runtime stage: needs no registry
#   --with-test-receiver                 also the otlp-receiver image of the compose test stack
#   --tag TAG                            image tag (default: IMAGE_TAG from deploy/.env)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
# shellcheck source=deploy/env.sh
source "$here/env.sh"
prefix="${IMAGE_PREFIX:-chain}"
tag="${IMAGE_TAG:-dev}"
from_host=false
services=(gateway orders payment bank-mock webhook-sender webhook-receiver)

while [[ $# -gt 0 ]]; do
    case "$1" in
        --from-host) from_host=true ;;
        --with-test-receiver) services+=(otlp-receiver) ;;
        --tag) tag="${2:?--tag needs a value}"; shift ;;
        *) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    esac
    shift
done

# Without the buildx plugin the docker client cannot use BuildKit: use the classic builder, which
# the Dockerfile's stage order keeps from pulling anything on the offline path. The classic
# builder builds every stage before its target, so the Rust stage needs BuildKit.
if [[ " ${services[*]} " == *" otlp-receiver "* ]] && ! $from_host; then
    echo "--with-test-receiver needs --from-host: the Rust stage builds the stack's services only" >&2
    exit 2
fi
if ! docker buildx version >/dev/null 2>&1; then
    if ! $from_host; then
        echo "building from source needs BuildKit (the docker buildx plugin); or use --from-host" >&2
        exit 2
    fi
    export DOCKER_BUILDKIT=0
fi

started=$SECONDS
if $from_host; then
    target=from-host
    echo "==> building static binaries (${services[*]}) with cargo, release"
    bins=()
    for service in "${services[@]}"; do bins+=(--bin "$service"); done
    # A target directory of its own: static builds never wait for (or invalidate) the usual ones.
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}/images"
    triple="$(uname -m)-unknown-linux-gnu"
    (cd "$root" && RUSTFLAGS="-C target-feature=+crt-static" \
        cargo build --release --locked --target "$triple" "${bins[@]}")
    mkdir -p "$here/dist"
    for service in "${services[@]}"; do
        cp "$CARGO_TARGET_DIR/$triple/release/$service" "$here/dist/$service"
    done
else
    target=from-source
fi

for service in "${services[@]}"; do
    echo "==> image $prefix/$service:$tag ($target)"
    docker build --quiet -f "$here/Dockerfile" --target "$target" --build-arg "SERVICE=$service" \
        -t "$prefix/$service:$tag" "$root" >/dev/null
done

echo
echo "Built in $((SECONDS - started)) s:"
for service in "${services[@]}"; do
    docker image inspect "$prefix/$service:$tag" --format "  {{index .RepoTags 0}}  {{.Size}} bytes" 
done
