# shellcheck shell=bash
# Shared by cluster/up, cluster/down, cluster/test and cluster/test-node. Not meant to be run
# directly.
#
# Environment (all optional):
#   GATEHOUSE_CLUSTER_CACHE   binary cache root (default $XDG_CACHE_HOME/gatehouse-cluster
#                             or ~/.cache/gatehouse-cluster); one subdirectory per build key
#   GATEHOUSE_CLUSTER_STATE   state dir: pids, certs, kubeconfig, etcd data, logs
#                             (default cluster/.state)
#   GATEHOUSE_GATEWAY_CHANNEL experimental (default; a superset of standard) or standard
#   GATEHOUSE_CLUSTER_CONTROLLERS  1: also start kube-controller-manager
#   GATEHOUSE_CLUSTER_NODE    1: also start the test node agent gatehouse-node (and
#                             gatehouse-lb if it was built); implies the controllers
#   GATEHOUSE_CLUSTER_IMAGES  the node's OCI image store (default <repo>/target/images)
#   GATEHOUSE_CLUSTER_NODE_ARGS  more gatehouse-node flags (split on whitespace)
#   GATEHOUSE_CLUSTER_LB      0: do not start gatehouse-lb even if it was built
#   GO                        the go command (default: go on PATH, else /usr/local/go/bin/go)
#   GOFLAGS                   passed through to go build (e.g. -p=1 on a busy machine)

CLUSTER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC2034 # used by up
REPO_ROOT=$(cd "$CLUSTER_DIR/.." && pwd)

# Pinned versions. Kubernetes and etcd are pinned in go.mod; these are for ldflags,
# the CRD bundle and the README.
KUBE_VERSION=v1.34.4
GATEWAY_API_VERSION=v1.7.0
GATEWAY_API_MODULE=sigs.k8s.io/gateway-api
# Bump when the build recipe below changes, so cached binaries are rebuilt.
BUILD_RECIPE=2

STATE=$(realpath -m "${GATEHOUSE_CLUSTER_STATE:-$CLUSTER_DIR/.state}")
CACHE_ROOT=${GATEHOUSE_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse-cluster}
# shellcheck disable=SC2034 # used by up
CHANNEL=${GATEHOUSE_GATEWAY_CHANNEL:-experimental}

log() { printf '%s\n' "cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }

# Seconds since the epoch with millisecond precision, and a formatter for durations.
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }

find_go() {
  if [[ -n ${GO:-} ]]; then echo "$GO"; return; fi
  if command -v go >/dev/null 2>&1; then command -v go; return; fi
  [[ -x /usr/local/go/bin/go ]] && { echo /usr/local/go/bin/go; return; }
  die "no go toolchain found (set GO=/path/to/go)"
}

# Serialise up/down/test on one state dir. The lock file lives next to the state dir
# so that `down` can remove the whole state dir while holding it.
lock_state() {
  mkdir -p "$(dirname "$STATE")"
  exec 9>"$STATE.lock"
  flock 9
}

# The build key: everything that changes the binaries or the CRD bundle.
build_key() {
  local go=$1
  {
    cat "$CLUSTER_DIR/go.mod" "$CLUSTER_DIR/go.sum"
    find "$CLUSTER_DIR/cmd" -type f -name '*.go' | LC_ALL=C sort | xargs cat
    "$go" version
    echo "$KUBE_VERSION $GATEWAY_API_VERSION $BUILD_RECIPE"
  } | sha256sum | cut -c1-16
}

ldflags() {
  local minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
  local f="-s -w" p
  for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    f+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    f+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$f"
}

# Builds the binaries and copies the Gateway API CRDs into $CACHE_ROOT/<key>, once.
# Sets BUILD_DIR. Safe against concurrent callers (flock on the cache root).
ensure_built() {
  local go key start
  go=$(find_go)
  key=$(build_key "$go")
  BUILD_DIR=$CACHE_ROOT/$key
  if [[ -f $BUILD_DIR/.complete ]]; then return; fi
  mkdir -p "$CACHE_ROOT"
  exec 8>"$CACHE_ROOT/.lock"
  flock 8
  if [[ -f $BUILD_DIR/.complete ]]; then exec 8>&-; return; fi
  start=$(now)
  log "building kube-apiserver, kube-controller-manager, etcd, kubectl ($KUBE_VERSION) and the test binaries (gatehouse-node, ...) into $BUILD_DIR (first build takes minutes)"
  local tmp=$BUILD_DIR.tmp.$$
  rm -rf "$tmp" && mkdir -p "$tmp/bin" "$tmp/crds"
  # Static binaries: nothing depends on the host's libc. A second attempt covers a module
  # download that failed half-way (the proxy is remote; the build itself is deterministic).
  local attempt
  for attempt in 1 2; do
    (
      cd "$CLUSTER_DIR"
      CGO_ENABLED=0 GOFLAGS="-buildvcs=false ${GOFLAGS:-}" GOTOOLCHAIN=local \
        "$go" build -trimpath -ldflags "$(ldflags)" -o "$tmp/bin/" ./cmd/...
    ) && break
    ((attempt == 2)) && { rm -rf "$tmp"; die "go build failed twice (output above)"; }
    log "go build failed; retrying once"
  done

  # Gateway API CRDs from the module (go verifies the zip against go.sum/sum.golang.org).
  # gateway-api v1.7.0's go.mod says `go 1.27.0`, so with an older local toolchain
  # `go mod download` still downloads, verifies and extracts the module but exits 1
  # with a "requires go >= 1.27.0" error; only the files are needed here, so the exit
  # status is ignored and the files are taken from the module cache (or the zip).
  local json dir zip
  json=$(cd "$tmp" || exit
         GOFLAGS='' GOWORK=off GO111MODULE=on "$go" mod download -json \
           "$GATEWAY_API_MODULE@$GATEWAY_API_VERSION" || true)
  dir=$("$go" env GOMODCACHE)/$GATEWAY_API_MODULE@$GATEWAY_API_VERSION
  zip=$(sed -n 's/^\s*"Zip": "\(.*\)",$/\1/p' <<<"$json")
  if [[ ! -d $dir/config/crd/standard && -f $zip ]]; then
    dir=$tmp/gateway-api
    unzip -q "$zip" "$GATEWAY_API_MODULE@$GATEWAY_API_VERSION/config/crd/*" -d "$dir" &&
      dir=$dir/$GATEWAY_API_MODULE@$GATEWAY_API_VERSION
  fi
  [[ -d $dir/config/crd/standard ]] || { printf '%s\n' "$json" >&2; rm -rf "$tmp"; die "could not fetch $GATEWAY_API_MODULE@$GATEWAY_API_VERSION"; }
  local ch
  for ch in standard experimental; do
    mkdir -p "$tmp/crds/$ch"
    # Every manifest except kustomization.yaml (not a Kubernetes object).
    find "$dir/config/crd/$ch" -maxdepth 1 -name '*.yaml' ! -name kustomization.yaml \
      -exec cp {} "$tmp/crds/$ch/" \;
    chmod -R u+w "$tmp/crds/$ch"
  done
  rm -rf "$tmp/gateway-api"
  echo "$KUBE_VERSION gateway-api $GATEWAY_API_VERSION $($go version)" >"$tmp/VERSIONS"
  touch "$tmp/.complete"
  rm -rf "$BUILD_DIR" && mv "$tmp" "$BUILD_DIR"
  # Keep the three newest builds (other worktrees may still use an older key).
  local old
  while read -r old; do [[ -n $old ]] && rm -rf "$old"; done < <(
    find "$CACHE_ROOT" -mindepth 1 -maxdepth 1 -type d -name '????????????????' -printf '%T@ %p\n' |
      sort -rn | tail -n +4 | cut -d' ' -f2-)
  exec 8>&-
  log "built in $(since "$start")"
}

# pid_alive NAME: the process recorded in $STATE/NAME.pid is running and is ours
# (its command line mentions this state dir, so a recycled pid is never touched).
pid_alive() {
  local f=$STATE/$1.pid pid
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ -r /proc/$pid/cmdline ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$STATE" || return 1
  echo "$pid"
}

# stop_proc NAME: TERM, wait up to 15s, then KILL.
stop_proc() {
  local pid i
  pid=$(pid_alive "$1") || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 150; i++)); do
    [[ -d /proc/$pid ]] || return 0
    # A zombie child of this shell counts as gone.
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] && return 0
    sleep 0.1
  done
  log "$1 (pid $pid) did not stop on TERM; killing"
  kill -KILL "$pid" 2>/dev/null || true
}

# Calls the API server with the admin client certificate.
api_get() {
  curl -fsS --max-time 2 --cacert "$STATE/pki/ca.crt" \
    --cert "$STATE/pki/admin.crt" --key "$STATE/pki/admin.key" \
    "https://$(<"$STATE/apiserver.addr")$1"
}

# Every process that was started is alive, the API server is ready, and the cluster has
# what this caller asks for (controllers, node): otherwise `up` starts afresh.
cluster_healthy() {
  pid_alive etcd >/dev/null && pid_alive kube-apiserver >/dev/null &&
    [[ -f $STATE/kubeconfig && -f $STATE/ready ]] && [[ $(api_get /readyz 2>/dev/null) == ok ]] || return 1
  local n
  for n in kube-controller-manager node lb; do
    [[ ! -f $STATE/$n.pid ]] || pid_alive "$n" >/dev/null || return 1
  done
  [[ ${GATEHOUSE_CLUSTER_CONTROLLERS:-0} != 1 || -f $STATE/kube-controller-manager.pid ]] &&
    [[ ${GATEHOUSE_CLUSTER_NODE:-0} != 1 || -f $STATE/node.pid ]]
}

# The node agent's network, one per state dir so that several clusters (and the conformance
# run's node on ghnode0/10.244.0.0/16) coexist: bridge ghn<N>, pods in 10.245.<N>.0/24,
# network namespaces ghp<N>-*. N starts from a hash of the state dir and skips any N whose
# bridge or addresses exist. Recorded in <state>/node.net for node_cleanup.
node_net_pick() {
  local start n i addrs
  start=$((16#$(printf '%s' "$STATE" | sha256sum | cut -c1-2)))
  addrs=$(ip -o -4 addr show 2>/dev/null; ip -4 route show 2>/dev/null)
  for ((i = 0; i < 256; i++)); do
    n=$(((start + i) % 256))
    ip link show "ghn$n" >/dev/null 2>&1 && continue
    grep -qE "(^| )10\.245\.$n\." <<<"$addrs" && continue
    NODE_BRIDGE=ghn$n NODE_CIDR=10.245.$n.0/24 NODE_NETNS_PREFIX=ghp$n-
    printf 'NODE_BRIDGE=%s\nNODE_CIDR=%s\nNODE_NETNS_PREFIX=%s\n' "$NODE_BRIDGE" "$NODE_CIDR" "$NODE_NETNS_PREFIX" >"$STATE/node.net"
    return 0
  done
  return 1
}

# Removes what this state dir's node agent may have left (it cleans up itself on TERM; this
# is for one that was killed): tmpfs mounts under <state>/node, its network namespaces (with
# their veths), its bridge and its nftables table (Service rules, `ip gatehouse-node-<bridge>`).
# Never touches another cluster's or the conformance run's.
node_cleanup() {
  [[ -f $STATE/node.net ]] || return 0
  local NODE_BRIDGE='' NODE_CIDR='' NODE_NETNS_PREFIX='' m ns
  # shellcheck disable=SC1091
  source "$STATE/node.net"
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(
    awk -v p="$STATE/node/" 'index($2, p) == 1 {print $2}' /proc/self/mounts | sort -r)
  if [[ -n $NODE_NETNS_PREFIX ]]; then
    for ns in $(ip netns list 2>/dev/null | awk -v p="$NODE_NETNS_PREFIX" 'index($1, p) == 1 {print $1}'); do
      ip netns del "$ns" 2>/dev/null || true
    done
  fi
  if [[ -n $NODE_BRIDGE ]] && ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
    ip link del "$NODE_BRIDGE" 2>/dev/null || true
  fi
  if [[ -n $NODE_BRIDGE ]] && command -v nft >/dev/null 2>&1; then
    nft delete table ip "gatehouse-node-$NODE_BRIDGE" 2>/dev/null || true
  fi
}

print_env() {
  echo "export KUBECONFIG=$STATE/kubeconfig"
  echo "export GATEHOUSE_CLUSTER_BIN=$STATE/bin"
}
