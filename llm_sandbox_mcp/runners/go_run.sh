# Runs inside the sandbox as `sh -c <this file>`: the user's code arrives on stdin, is built as
# /workspace/main.go and run as ./main. A failed build ends stderr with the phase marker.
# The cache prepared by go_install.sh holds a pre-built standard library (GOCACHE, read-only here) and,
# with libraries, a module whose go.mod/go.sum are copied in and whose modules are in GOMODCACHE.
L=/opt/llm-sandbox/libs/go
cat > main.go || exit 70
if [ -d "$L/cache" ]; then export GOCACHE="$L/cache"; fi
if [ -f "$L/mod/go.mod" ]; then
  cp "$L/mod/go.mod" go.mod
  if [ -f "$L/mod/go.sum" ]; then cp "$L/mod/go.sum" go.sum; fi
fi
# No network in the sandbox: modules come from the cache or not at all.
export GOPROXY=off GOFLAGS=-mod=mod
go build -o main main.go
status=$?
if [ "$status" -ne 0 ]; then
  printf '\036llm-sandbox-phase:compile\036\n' >&2
  exit "$status"
fi
exec ./main
