#!/usr/bin/env bash
# Serve a built kvlab image as a Space would (uid 1000, the image's ENV, WORKDIR
# and CMD) and call its `/compare` API through gradio_client.
#
#   scripts/serve_image_check.sh [--image TAG] [--preset NAME] [--tokens N]
#                                [--python PY] [--record FILE] [--timeout S]
#
#   --image TAG    the image (default kvlab:local, what scripts/build_image.sh builds)
#   --preset NAME  the preset `/compare` runs (default quickstart: it has a quanto column)
#   --tokens N     max new tokens (default 8)
#   --python PY    a Python with gradio_client (default .venv/bin/python, else python3)
#   --record FILE  also write the run record `/compare` returned to FILE (JSON)
#   --timeout S    seconds the app may take to start serving (default 600)
#
# Without `podman run` (hosts that refuse crun its cgroups or rlimits): the
# container's file system is `podman create`d and `podman mount`ed, /proc, /dev
# and /sys are bind-mounted into it, an /etc/hosts naming localhost is written,
# and the image's CMD runs there under `chroot --userspec=1000:1000`, on this
# host's network, on a free port (GRADIO_SERVER_PORT; the image's other ENV as
# it is). The mounts, the app and the container go in an exit trap.
# Fails (exit 1) when a column's status is not ok, when a column says quanto's
# kernel is not built or a pure-PyTorch unpack is used, when the preset has no
# quanto column, or when the image holds no built kernel. Exit 3: cannot run
# here (needs root, podman, chroot and a Python with gradio_client).
set -euo pipefail

readonly SPACES_USER="1000:1000"
readonly KERNEL_GLOB="lib/python3*/site-packages/optimum/quanto/library/extensions/cpp/build/quanto_cpp.so"
readonly STOP_WAIT_S=15

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
image="kvlab:local"
preset="quickstart"
tokens=8
python_bin=""
record=""
timeout_s=600

usage() {
    sed -n '2,13s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

need_value() {
    [[ $2 -ge 2 ]] || { echo "serve_image_check: $1 needs a value" >&2; exit 2; }
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --image) need_value "$1" $#; image="$2"; shift ;;
        --preset) need_value "$1" $#; preset="$2"; shift ;;
        --tokens) need_value "$1" $#; tokens="$2"; shift ;;
        --python) need_value "$1" $#; python_bin="$2"; shift ;;
        --record) need_value "$1" $#; record="$2"; shift ;;
        --timeout) need_value "$1" $#; timeout_s="$2"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "serve_image_check: unknown option: $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

log() { echo "serve_image_check: $*"; }
cannot() { echo "serve_image_check: cannot run here: $*" >&2; exit 3; }
fail() { echo "serve_image_check: FAIL: $*" >&2; exit 1; }

if [[ -z "$python_bin" ]]; then
    python_bin="python3"
    [[ -x "$repo_root/.venv/bin/python" ]] && python_bin="$repo_root/.venv/bin/python"
fi
[[ "$(id -u)" -eq 0 ]] || cannot "mounting and chroot need root"
for tool in podman chroot mount setsid; do
    command -v "$tool" >/dev/null || cannot "$tool is missing"
done
"$python_bin" -c "import gradio_client" 2>/dev/null || cannot "$python_bin has no gradio_client"
podman image exists "$image" || cannot "no image $image (build it: scripts/build_image.sh --tag $image)"

container=""
root=""
server_pid=""
mounted=()
scratch="$(mktemp -d)"

cleanup() {
    local status=$?
    if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM -- "-$server_pid" 2>/dev/null || true
        for _ in $(seq "$STOP_WAIT_S"); do
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 1
        done
        kill -KILL -- "-$server_pid" 2>/dev/null || true
    fi
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount -R "${mounted[i]}" 2>/dev/null || umount -R -l "${mounted[i]}" || true
    done
    if [[ -n "$container" ]]; then
        podman umount "$container" >/dev/null 2>&1 || true
        podman rm -f "$container" >/dev/null 2>&1 || true
    fi
    rm -rf "$scratch"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The image's configuration: ENV lines, WORKDIR, CMD (one argument a line).
mapfile -t image_env < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$image" | sed '/^$/d')
workdir="$(podman image inspect --format '{{.Config.WorkingDir}}' "$image")"
mapfile -t image_cmd < <(podman image inspect --format '{{range .Config.Cmd}}{{println .}}{{end}}' "$image" | sed '/^$/d')
[[ ${#image_cmd[@]} -gt 0 ]] || fail "the image has no CMD"
log "image $image: USER $(podman image inspect --format '{{.Config.User}}' "$image"), WORKDIR ${workdir:-/}," \
    "CMD ${image_cmd[*]}, size $(podman image inspect --format '{{.Size}}' "$image") bytes"

container="$(podman create --no-healthcheck "$image")"  # nothing runs it: no systemd timer to leave behind
root="$(podman mount "$container")"
for folder in proc dev sys; do
    mkdir -p "$root/$folder"
    mount --rbind "/$folder" "$root/$folder"
    mounted+=("$root/$folder")
    mount --make-rslave "$root/$folder"
done
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > "$root/etc/hosts"

shopt -s nullglob
kernels=("$root${workdir:-/}/.venv/"$KERNEL_GLOB)
shopt -u nullglob
if [[ ${#kernels[@]} -gt 0 ]]; then
    log "quanto kernel built in the image: yes (${kernels[0]#"$root"})"
else
    log "quanto kernel built in the image: no"
fi

port="$("$python_bin" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
url="http://127.0.0.1:$port/"
server_log="$scratch/server.log"
log "serving as uid $SPACES_USER on port $port (log: the app's output below on failure)"
setsid chroot --userspec="$SPACES_USER" "$root" /usr/bin/env -i "${image_env[@]}" "GRADIO_SERVER_PORT=$port" \
    /bin/sh -c 'cd "$1" && shift && exec "$@"' sh "${workdir:-/}" "${image_cmd[@]}" > "$server_log" 2>&1 &
server_pid=$!

started=$SECONDS
until "$python_bin" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$url" 2>/dev/null; do
    if ! kill -0 "$server_pid" 2>/dev/null; then
        tail -n 40 "$server_log" >&2
        fail "the app exited before serving"
    fi
    if ((SECONDS - started > timeout_s)); then
        tail -n 40 "$server_log" >&2
        fail "the app is not serving after $timeout_s s"
    fi
    sleep 2
done
log "serving after $((SECONDS - started)) s; calling /compare (preset $preset, $tokens tokens)"

client_status=0
"$python_bin" - "$url" "$preset" "$tokens" "$record" <<'PY' || client_status=$?
import json
import sys

from gradio_client import Client

NOT_BUILT = ("pure-PyTorch unpack", "kernel is not built", "could not be built")
url, preset, tokens, record_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
record = Client(url, verbose=False).predict(preset, None, tokens, api_name="/compare")
if record_path:
    with open(record_path, "w") as handle:
        json.dump(record, handle, indent=1)
problems = []
print(f"{'column':<34} {'status':<12} message")
for column in record["columns"]:
    message = column.get("message") or ""
    print(f"{column['name']:<34} {column['status']:<12} {message}")
    if column["status"] != "ok":
        problems.append(f"{column['name']}: status {column['status']}")
    if any(phrase in message for phrase in NOT_BUILT):
        problems.append(f"{column['name']}: {message}")
if not any("quanto" in column["name"] for column in record["columns"]):
    problems.append(f"preset {preset} has no quanto column")
for problem in problems:
    print(f"serve_image_check: FAIL: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
if [[ $client_status -ne 0 ]]; then
    tail -n 40 "$server_log" >&2
    fail "the /compare call or its columns failed (above)"
fi
[[ ${#kernels[@]} -gt 0 ]] || fail "the image holds no built quanto kernel"
log "PASS"
