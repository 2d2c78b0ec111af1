# Runs inside the sandbox as `sh -c <this file>`: the user's code arrives on stdin, is built as
# /workspace/main.go and run as ./main. A failed build ends stderr with the phase marker.
# The cache prepared by go_install.sh holds a pre-built standard library (GOCACHE, read-only here) and,
# with libraries, a module whose go.mod/go.sum are copied in and whose modules are in GOMODCACHE.
# Under the warm runner (LLM_SANDBOX_BUILD_PIPE set) the first line of stdin says what to do: "build", or
# "capture" (also hand a silent build's binary to the runner on fd 3, closed before the program starts), or
# "built" (./main is already there, built before from this very source: run it without building).
L=/opt/llm-sandbox/libs/go
mode=build
if [ -n "${LLM_SANDBOX_BUILD_PIPE:-}" ]; then
  unset LLM_SANDBOX_BUILD_PIPE
  IFS= read -r mode || exit 70
fi
cat > main.go || exit 70
if [ -d "$L/cache" ]; then
  export GOCACHE="$L/cache"
elif [ -d /opt/llm-sandbox/go-cache ]; then
  export GOCACHE=/opt/llm-sandbox/go-cache # the project image's pre-built standard library
fi
if [ -f "$L/mod/go.mod" ]; then
  cp "$L/mod/go.mod" go.mod
  if [ -f "$L/mod/go.sum" ]; then cp "$L/mod/go.sum" go.sum; fi
fi
# No network in the sandbox: modules come from the cache or not at all.
export GOPROXY=off GOFLAGS=-mod=mod
if [ "$mode" = built ]; then exec ./main 3>&-; fi
log=/tmp/.llm-sandbox-build.log
go build -ldflags="-s -w" -o main main.go 2>"$log" 3>&-
status=$?
cat "$log" >&2
if [ "$status" -ne 0 ]; then
  rm -f "$log"
  printf '\036llm-sandbox-phase:compile\036\n' >&2
  exit "$status"
fi
if [ "$mode" = capture ] && [ ! -s "$log" ]; then cat main >&3; fi
rm -f "$log"
exec ./main 3>&-
