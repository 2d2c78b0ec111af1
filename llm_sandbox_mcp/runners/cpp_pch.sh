# Runs in the C++ install sandbox after cpp_flags.sh and, with libraries, cpp_install.sh: precompiles the
# headers C++ programs most often include first into $L/pch (HEADER.gch, compiled with the run's flags and
# the libraries' cflags), which every run mounts read-only and puts first on the include path. Each is a
# one-line file including the header, so it holds exactly what that header does. No user code runs here.
# Best effort: a header that fails to precompile is left out, and runs read it as before.
L=/opt/llm-sandbox/libs/cpp
set +e
cflags=''
if [ -f "$L/cflags" ]; then cflags=$(cat "$L/cflags"); fi
mkdir -p "$L/pch/bits" /tmp/llm-sandbox-pch || exit 0
precompile() {
  printf '#include <%s>\n' "$1" >"/tmp/llm-sandbox-pch/$2.h"
  # shellcheck disable=SC2086 # one flag per word
  g++ $cpp_flags $cflags -x c++-header -o "$L/pch/$1.gch" "/tmp/llm-sandbox-pch/$2.h" >/dev/null 2>&1 ||
    rm -f "$L/pch/$1.gch"
}
set -f  # the flag files hold one flag per word, never a pattern
# The largest in the background: this sandbox has two CPUs.
precompile bits/stdc++.h stdcpp &
for header in iostream vector string; do precompile "$header" "$header"; done
wait
rm -rf /tmp/llm-sandbox-pch
