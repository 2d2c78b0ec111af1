# The first half of every R run (followed by r_run.sh, or by r_runner.sh in a pooled sandbox): a user profile
# (written to /tmp, outside the workspace) makes every graphics device a PNG device writing one file per page
# into $OUTPUT_DIR; R closes open devices at exit, on errors too, so base graphics and ggplot2 plots come back
# without dev.off(). Prints nothing of its own.
mkdir -p "$OUTPUT_DIR" /tmp/.llm-sandbox
cat > /tmp/.llm-sandbox/Rprofile <<'PROFILE'
local({
  devices <- 0L
  options(device = function(...) {
    devices <<- devices + 1L
    name <- if (devices == 1L) "figure_%03d.png" else sprintf("figure_%d_%%03d.png", devices)
    grDevices::png(file.path(Sys.getenv("OUTPUT_DIR"), name), width = 800, height = 600, res = 100)
  })
})
PROFILE
export R_PROFILE_USER=/tmp/.llm-sandbox/Rprofile
