# Runs inside a pooled sandbox as `sh -c <r_profile.sh, this file>` under runners/supervisor.pl, started
# before the program exists: R starts (its base packages loaded) and then reads the program from stdin as
# `Rscript main.R` reads main.R (R --no-echo --no-restore --file=...), one top-level expression at a time.
exec R --no-echo --no-restore --file=/dev/stdin
