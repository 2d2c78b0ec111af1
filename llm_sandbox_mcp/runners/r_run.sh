# Runs inside the sandbox as `sh -c <r_profile.sh, this file>`: the user's code arrives on stdin and runs as
# `Rscript main.R`.
cat > main.R || exit 70
exec Rscript main.R
