# Runs inside the sandbox as `sh -c <this file>`: the user's code arrives on stdin, is compiled as
# /workspace/main.cpp (C++20, warnings on) and run as ./main. A failed compile ends stderr with the
# phase marker. Libraries installed by cpp_install.sh leave their compiler and linker flags in the cache.
L=/opt/llm-sandbox/libs/cpp
cat > main.cpp || exit 70
cflags='' ldflags=''
if [ -f "$L/cflags" ]; then cflags=$(cat "$L/cflags"); fi
if [ -f "$L/ldflags" ]; then ldflags=$(cat "$L/ldflags"); fi
set -f  # the flag files hold one flag per word, never a pattern
# shellcheck disable=SC2086
g++ -std=c++20 -O1 -Wall -Wextra $cflags -o main main.cpp $ldflags
status=$?
if [ "$status" -ne 0 ]; then
  printf '\036llm-sandbox-phase:compile\036\n' >&2
  exit "$status"
fi
exec ./main
