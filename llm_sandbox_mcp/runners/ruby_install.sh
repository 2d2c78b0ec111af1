# Runs in the install sandbox (with network) as `sh -c <this file> sh GEM...`: installs the gems (GEM or
# GEM:VERSION) and their dependencies into the cache, from LLM_SANDBOX_GEM_SOURCE when the server sets
# one, else the image's default source.
set -eu
L=/opt/llm-sandbox/libs/ruby
if [ -n "${LLM_SANDBOX_GEM_SOURCE:-}" ]; then
  # A source URL without its trailing slash would lose its last path segment.
  set -- --clear-sources --source "${LLM_SANDBOX_GEM_SOURCE%/}/" "$@"
fi
exec gem install --install-dir "$L" --bindir "$L/bin" --no-document --no-user-install "$@"
