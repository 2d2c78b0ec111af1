# Sourced by java_prepare.sh and the warm runner's start (languages.py): sets `jdk` to what identifies the
# JDK on PATH (its java, libjvm.so and modules image, with size and modification time), so that a runner jar
# and class data archive made for one JDK are never offered to another.
java_bin=$(readlink -f "$(command -v java)" 2>/dev/null) || java_bin=
jdk=$(stat -c '%n %s %Y' "$java_bin" "${java_bin%/bin/java}/lib/server/libjvm.so" \
  "${java_bin%/bin/java}/lib/modules" 2>/dev/null) || jdk=
