# Runs inside the sandbox as `sh -c <this file>`: the user's code arrives on stdin and runs as
# /workspace/main.rb. Gems installed into the cache are on GEM_PATH (set by the server).
cat > main.rb || exit 70
exec ruby main.rb
