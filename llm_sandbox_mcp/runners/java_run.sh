# The second half of a Java run, after java_scan.sh: javac compiles the named file into /tmp/classes (a
# failure ends stderr with the phase marker), then java runs the main type, with the library jars on the
# class path of both. Also what the warm runner (java_runner.java) falls back to for preview code.
L=/opt/llm-sandbox/libs/java
S=/tmp/.llm-sandbox
{ read -r file; read -r main; read -r kind; } < "$S/scan"
cp=/tmp/classes
if [ -d "$L" ]; then cp="$cp:$L/*"; fi
set --
if [ "$kind" = implicit ]; then set -- --enable-preview; fi
# C1 only and one GC thread: javac is a short-lived process, where start-up time is what counts.
javac -J-XX:TieredStopAtLevel=1 -J-XX:+UseSerialGC -J-Xshare:auto ${1:+--release 21 -XDsuppressNotes} "$@" \
  -encoding UTF-8 -cp "$cp" -d /tmp/classes "$file.java"
status=$?
if [ "$status" -ne 0 ]; then
  printf '\036llm-sandbox-phase:compile\036\n' >&2
  exit "$status"
fi
# The heap may use most of the sandbox's memory (the JVM's default is a quarter of it).
exec java -XX:+UseSerialGC -XX:MaxRAMPercentage=75 "$@" -cp "$cp" "$main"
