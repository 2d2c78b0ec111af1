# Runs in the Java install sandbox after the libraries (if any), with Runner.java (java_runner.java) written
# beside it in $S: makes the warm runner's fast start in the store, R=/opt/llm-sandbox/libs/java/.runner,
# which every run mounts read-only. runner.jar is the runner compiled ahead (no source launcher compile at
# each JVM start); runner.jsa is a dynamic class data sharing archive of the classes a run loads (javac's
# included), dumped at the exit of a training run that compiles and runs a fixed sample (no user code runs
# here); made-for names the JDK and files they are (java_made_for.sh). Best effort: when any step fails,
# nothing is left and the runner starts through the source launcher as before; the install goes on.
R=/opt/llm-sandbox/libs/java/.runner
rm -rf "$R" && mkdir -p "$R/classes" || exit 0
if javac -J-XX:TieredStopAtLevel=1 -encoding UTF-8 -d "$R/classes" "$S/Runner.java" >/dev/null 2>&1 &&
  jar --create --file "$R/runner.jar" -C "$R/classes" . >/dev/null 2>&1 &&
  java -XX:+UseSerialGC -XX:ArchiveClassesAtExit="$R/runner.jsa" -Xlog:all=off -cp "$R/runner.jar" Runner \
    --train </dev/null >/dev/null 2>&1; then
  rm -rf "$R/classes"
  java_made_for "$R" >"$R/made-for" || rm -rf "$R"
else
  rm -rf "$R"
fi
