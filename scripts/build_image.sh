#!/usr/bin/env bash
# Build kvlab's Docker image with podman, also where no image registry can be reached.
#
#   scripts/build_image.sh [--tag TAG] [--work DIR] [--torch-wheel FILE] [--ca-bundle FILE] [--new-base]
#
#   --tag TAG          the image's name (default kvlab:local)
#   --work DIR         folder for the base root and the torch index (default
#                      ${XDG_CACHE_HOME:-~/.cache}/kvlab-image); reused by later runs
#   --torch-wheel FILE the CPU torch wheel to build with (default: pip download
#                      torch==TORCH+cpu, which finds a wheel on disk or the CPU index)
#   --ca-bundle FILE   CA bundle for pip inside the build, where the network re-signs
#                      TLS (default: $PIP_CERT, else none)
#   --new-base         make the base again with mmdebstrap even if it is stored
#
# The Dockerfile's base (FROM) is used when podman has it or can pull it. Else
# it is made: mmdebstrap writes a Debian root of the release the python slim
# images are built on (bookworm: its python3 is 3.11, at /usr/bin/python3
# rather than /usr/local/bin; setup.sh runs `python3` from PATH, so either
# serves; python3-dev adds the headers the slim images ship) and `podman
# import` tags it as the FROM image. torch comes from a
# local one-wheel index mounted at /idx; the CA bundle and a pip.conf naming it
# are mounted for the build's RUN steps only, so neither lands in the image.
# Built with --isolation=chroot (hosts that refuse crun its cgroups can build)
# in the docker format (the OCI format drops the HEALTHCHECK).
# Needs root (or rootless podman) and: podman (with buildah), and mmdebstrap
# when the base must be made; on Debian: apt-get install podman buildah mmdebstrap.
# Prints the image's size and the build's time. Exit status 3: a tool is missing.
set -euo pipefail

readonly TORCH_VERSION="2.13.0"
readonly DEBIAN_RELEASE="bookworm"
# python3-dev: the python slim images ship Python's headers, which the quanto kernel build includes.
readonly BASE_PACKAGES="python3,python3-venv,python3-pip,python3-dev,ca-certificates,bash"
readonly BASE_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
readonly PULL_TIMEOUT_S=120

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tag="kvlab:local"
work="${XDG_CACHE_HOME:-$HOME/.cache}/kvlab-image"
torch_wheel=""
ca_bundle="${PIP_CERT:-}"
new_base=0

usage() {
    sed -n '2,14s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

need_value() {
    [[ $2 -ge 2 ]] || { echo "build_image: $1 needs a value" >&2; exit 2; }
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --tag) need_value "$1" $#; tag="$2"; shift ;;
        --work) need_value "$1" $#; work="$2"; shift ;;
        --torch-wheel) need_value "$1" $#; torch_wheel="$2"; shift ;;
        --ca-bundle) need_value "$1" $#; ca_bundle="$2"; shift ;;
        --new-base) new_base=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "build_image: unknown option: $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

log() { echo "build_image: $*"; }

require() {
    command -v "$1" >/dev/null && return
    echo "build_image: $1 is missing; on Debian: apt-get install podman buildah mmdebstrap" >&2
    exit 3
}

# The FROM image as podman names it: python:3.11-slim -> docker.io/library/python:3.11-slim.
base_ref() {
    local from
    from="$(sed -n 's/^FROM[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' "$repo_root/Dockerfile" | head -n 1)"
    [[ -n "$from" ]] || { echo "build_image: no FROM line in the Dockerfile" >&2; exit 1; }
    [[ "$from" == */* ]] || from="library/$from"
    [[ "${from%%/*}" == *.* ]] || from="docker.io/$from"
    echo "$from"
}

make_base() {
    local ref="$1" root_tar="$work/$DEBIAN_RELEASE-root.tar"
    require mmdebstrap
    if [[ $new_base -eq 1 || ! -s "$root_tar" ]]; then
        log "making a $DEBIAN_RELEASE root with mmdebstrap ($BASE_PACKAGES)"
        mmdebstrap --variant=apt --format=tar --include="$BASE_PACKAGES" "$DEBIAN_RELEASE" "$root_tar.part"
        mv "$root_tar.part" "$root_tar"
    fi
    log "importing $root_tar as $ref"
    podman import --change "ENV PATH=$BASE_PATH" --change "ENV LANG=C.UTF-8" --change 'CMD ["python3"]' \
        "$root_tar" "$ref" >/dev/null
}

ensure_base() {
    local ref="$1"
    if [[ $new_base -eq 0 ]] && podman image exists "$ref"; then
        log "base $ref: stored"
    elif [[ $new_base -eq 0 ]] && timeout "$PULL_TIMEOUT_S" podman pull --quiet "$ref" >/dev/null 2>&1; then
        log "base $ref: pulled"
    else
        log "base $ref: not stored and no registry reached; making it"
        make_base "$ref"
    fi
}

# A pip index of one project (torch) holding one wheel, $work/torch-index/torch/index.html; sets $index.
torch_index() {
    local python_version="$1"
    index="$work/torch-index"
    rm -rf "$index"
    mkdir -p "$index/torch"
    if [[ -n "$torch_wheel" ]]; then
        cp "$torch_wheel" "$index/torch/"
    else
        log "finding torch==$TORCH_VERSION+cpu for python $python_version with pip download"
        python3 -m pip download --quiet --retries 1 --no-deps --only-binary=:all: --python-version "$python_version" \
            --platform "manylinux_2_28_$(uname -m)" --extra-index-url "https://download.pytorch.org/whl/cpu" \
            -d "$index/torch" "torch==$TORCH_VERSION+cpu"
    fi
    local wheel
    wheel="$(cd "$index/torch" && ls torch-*.whl)"
    printf '<!DOCTYPE html><html><body><a href="%s">%s</a></body></html>\n' "$wheel" "$wheel" \
        > "$index/torch/index.html"
    log "torch index $index: $wheel"
}

main() {
    require podman
    mkdir -p "$work"
    local ref python_version index
    ref="$(base_ref)"
    python_version="$(sed -n 's/^.*python:\([0-9]\{1,\}\.[0-9]\{1,\}\).*$/\1/p' <<<"$ref")"
    ensure_base "$ref"
    torch_index "${python_version:-3.11}"

    local -a mounts=(-v "$index:/idx:ro")
    if [[ -n "$ca_bundle" ]]; then
        printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$work/pip.conf"
        mounts+=(-v "$(realpath "$ca_bundle"):/etc/ssl/certs/ca-certificates.crt:ro" -v "$work/pip.conf:/etc/pip.conf:ro")
        log "pip in the build trusts $ca_bundle"
    fi
    log "building $tag from $repo_root/Dockerfile"
    local started=$SECONDS
    podman build --isolation=chroot --pull=never --format docker "${mounts[@]}" \
        --build-arg KVLAB_TORCH_INDEX_URL=file:///idx -t "$tag" -f "$repo_root/Dockerfile" "$repo_root"
    local took=$((SECONDS - started)) size
    size="$(podman image inspect --format '{{.Size}}' "$tag")"
    log "built $tag in $took s; size $size bytes ($((size / 1000000)) MB)"
}

main
