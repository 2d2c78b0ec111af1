# Runs inside the sandbox as `sh -c <this file>`: the user's code arrives on stdin, is compiled as
# /workspace/main.cpp (C++20, warnings on) and run as ./main. A failed compile ends stderr with the
# phase marker. Libraries installed by cpp_install.sh leave their compiler and linker flags in the cache.
# Under the warm runner the first line of stdin is "build", "capture" or "built", as in go_run.sh.
# cpp_flags.sh, before this file, sets the compile flags; the precompiled headers cpp_pch.sh made with
# them in the store are found first on the include path (g++ uses one only when it is valid for this
# compile and is the source's first include, else reads the header itself).
L=/opt/llm-sandbox/libs/cpp
mode=build
if [ -n "${LLM_SANDBOX_BUILD_PIPE:-}" ]; then
  unset LLM_SANDBOX_BUILD_PIPE
  IFS= read -r mode || exit 70
fi
cat > main.cpp || exit 70
if [ "$mode" = built ]; then exec ./main 3>&-; fi
cflags='' ldflags=''
if [ -d "$L/pch" ]; then cflags="-I$L/pch"; fi
if [ -f "$L/cflags" ]; then cflags="$cflags $(cat "$L/cflags")"; fi
if [ -f "$L/ldflags" ]; then ldflags=$(cat "$L/ldflags"); fi
set -f  # the flag files hold one flag per word, never a pattern
log=/tmp/.llm-sandbox-build.log
# shellcheck disable=SC2086
g++ $cpp_flags $cflags -o main main.cpp $ldflags 2>"$log" 3>&-
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
