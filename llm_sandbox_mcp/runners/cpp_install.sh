# Runs in the install sandbox (with network) as `sh -c <this file> sh PACKAGE...` for Debian packages
# (normally -dev packages). apt cannot install as a non-root user on a read-only root, but it can
# download: each PACKAGE, and whatever it depends on that the image lacks, is fetched from the image's
# own apt sources and unpacked (not installed: no maintainer scripts run) under root/ in the cache.
# Written for cpp_run.sh:
#   cflags   -isystem for the unpacked include directories, plus the packages' pkg-config Cflags
#   ldflags  -L and -rpath for the unpacked library directories, plus -l for each PACKAGE's libraries
#            (its pkg-config Libs, else one -l per lib*.so it ships)
set -eu
L=/opt/llm-sandbox/libs/cpp
R="$L/root"
A=/tmp/llm-sandbox-apt
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
  echo "this image has no apt-get/dpkg-deb: C++ libraries need a Debian-based image (SANDBOX_IMAGE_CPP)" >&2
  exit 1
fi
mkdir -p "$A/lists/partial" "$A/cache/archives/partial" "$A/debs" "$R"
opts="-q -o Dir::State::Lists=$A/lists -o Dir::Cache=$A/cache -o Debug::NoLocking=1
  -o Acquire::IndexTargets::deb::Translations::DefaultEnabled=false -o APT::Sandbox::User=$(id -un 2>/dev/null || id -u)"
# shellcheck disable=SC2086
apt-get $opts -o APT::Update::Error-Mode=any update >"$A/update.log" 2>&1 || {
  cat "$A/update.log" >&2
  echo "apt-get update failed: the image's apt sources are unreachable from the installer" >&2
  exit 1
}
# What `apt-get install` would install here: the packages and their missing dependencies.
# shellcheck disable=SC2086
apt-get $opts -s install --no-install-recommends "$@" >"$A/plan.log" 2>&1 || {
  grep '^E:' "$A/plan.log" >&2 || cat "$A/plan.log" >&2
  exit 1
}
fetch=$(sed -n 's/^Inst \([^ ]*\) .*/\1/p' "$A/plan.log")
if [ -n "$fetch" ]; then
  # shellcheck disable=SC2086
  (cd "$A/debs" && apt-get $opts download $fetch >"$A/download.log" 2>&1) || {
    cat "$A/download.log" >&2
    exit 1
  }
  for deb in "$A"/debs/*.deb; do dpkg-deb -x "$deb" "$R"; done
fi
triplet=$(gcc -print-multiarch 2>/dev/null || dpkg --print-architecture)
cflags="-isystem $R/usr/include -isystem $R/usr/include/$triplet"
ldflags=""
for dir in "$R/usr/lib/$triplet" "$R/lib/$triplet" "$R/usr/lib"; do
  ldflags="$ldflags -L$dir -Wl,-rpath,$dir"
done
# The files of a package: from its .deb when it was downloaded, else from the image's dpkg database.
files_of() {
  for deb in "$A"/debs/"$1"_*.deb; do break; done
  if [ -f "$deb" ]; then
    dpkg-deb --fsys-tarfile "$deb" | tar -t | sed 's:^\./:/:'
  else
    dpkg -L "$1" 2>/dev/null || true
  fi
}
# Cflags and Libs of a .pc file, ${variables} expanded, paths moved under root/ when they exist there.
pc_flags() {
  awk -v R="$R" '
    function expand(s,   name) {
      while (match(s, /\$\{[A-Za-z0-9_.]+\}/)) {
        name = substr(s, RSTART + 2, RLENGTH - 3)
        s = substr(s, 1, RSTART - 1) vars[name] substr(s, RSTART + RLENGTH)
      }
      return s
    }
    /^[A-Za-z0-9_.]+=/ { i = index($0, "="); vars[substr($0, 1, i - 1)] = expand(substr($0, i + 1)); next }
    /^(Cflags|Libs):/ {
      n = split(expand(substr($0, index($0, ":") + 1)), words, /[ \t]+/)
      for (k = 1; k <= n; k++) {
        w = words[k]
        if (w ~ /^-I\/[A-Za-z0-9_+.\/-]+$/) { p = substr(w, 3); if (system("test -d " R p) == 0) w = "-I" R p; print w }
        else if (w ~ /^(-l[A-Za-z0-9_+.-]+|-pthread|-D[A-Za-z0-9_=.]+)$/) print w
      }
    }' "$1"
}
for pkg in "$@"; do
  files=$(files_of "$pkg")
  pcs=$(printf '%s\n' "$files" | grep -E '/pkgconfig/[^/]+\.pc$' || true)
  if [ -n "$pcs" ]; then
    for pc in $pcs; do
      if [ -f "$R$pc" ]; then pc="$R$pc"; fi
      for flag in $(pc_flags "$pc"); do
        case $flag in
          -l*) ldflags="$ldflags $flag" ;;
          *) cflags="$cflags $flag" ;;
        esac
      done
    done
  else
    for so in $(printf '%s\n' "$files" | grep -E '/lib[^/]+\.so$' || true); do
      name=${so##*/lib}
      ldflags="$ldflags -l${name%.so}"
    done
  fi
done
printf '%s\n' "$cflags" >"$L/cflags"
printf '%s\n' "$ldflags" >"$L/ldflags"
