# Runs in the install sandbox (with network) as `sh -c <this file> sh SPEC...`, writing the Go cache:
#   mod/      a throwaway module (go.mod, go.sum) requiring every SPEC (a module path, optional @version)
#   pkg/mod   GOMODCACHE with those modules and their dependencies
#   cache/    GOCACHE with the common standard packages and the libraries' packages pre-built, so that a
#             run compiles only the user's own package (an empty cache costs ~20 s for "fmt" alone)
# GOPROXY and GOSUMDB come from the server's settings when set, else the toolchain's defaults.
set -eu
L=/opt/llm-sandbox/libs/go
# Without libraries, a project image's pre-built standard library (go.Dockerfile) is all a run needs: the store
# stays empty and go_run.sh uses the image's cache. A base image without one gets a cache built here.
if [ "$#" -eq 0 ] && [ -d /opt/llm-sandbox/go-cache ]; then exit 0; fi
export GOMODCACHE="$L/pkg/mod" GOCACHE="$L/cache" GOTOOLCHAIN=local
mkdir -p "$L/mod" "$GOCACHE"
if [ "$#" -gt 0 ]; then
  cd "$L/mod"
  go mod init sandbox >/dev/null 2>&1
  GOFLAGS=-mod=mod go get "$@"
  for spec in "$@"; do
    GOFLAGS=-mod=mod go build "${spec%@*}/..." >/dev/null 2>&1 || true
  done
  cd /workspace
fi
# Best effort: a cache that lacks a package only makes a run slower. Packages this Go does not have yet
# (iter, math/rand/v2, ...) are left out, or the whole build would fail.
warm=$(go list -e -f '{{if not .Error}}{{.ImportPath}}{{end}}' \
  bufio bytes cmp container/heap container/list context crypto/md5 crypto/sha256 encoding/base64 \
  encoding/binary encoding/csv encoding/hex encoding/json errors flag fmt hash/fnv io iter log maps math \
  math/big math/bits math/rand math/rand/v2 os path/filepath reflect regexp slices sort strconv strings sync \
  sync/atomic text/tabwriter time unicode unicode/utf8 2>/dev/null) || true
# shellcheck disable=SC2086 # one package per word
go build $warm >/dev/null 2>&1 || true
