# Shared by java_prepare.sh and the warm runner's start (languages.py). `java_made_for DIR` prints what
# identifies the JDK on PATH (its java, libjvm.so and modules image) and the runner jar and archive in DIR,
# each with its size and modification time, and fails when one is missing. The runner starts from them only
# when DIR/made-for holds the same: never on another JDK, never from an archive changed after it was made (a
# JVM given a truncated archive can crash instead of ignoring it).
java_made_for() {
  java_bin=$(readlink -f "$(command -v java)") || return 1
  stat -c '%n %s %Y' "$java_bin" "${java_bin%/bin/java}/lib/server/libjvm.so" "${java_bin%/bin/java}/lib/modules" \
    "$1/runner.jar" "$1/runner.jsa" 2>/dev/null
}
