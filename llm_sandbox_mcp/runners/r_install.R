# Runs in the install sandbox (with network) as `Rscript -e <this file> PACKAGE...`: installs the packages
# (and the dependencies they need that the image lacks) into the cache, from the CRAN-like repository in
# LLM_SANDBOX_CRAN_REPO when the server sets one, else the image's configured repository. Packages the
# image already has are used as they are. Fails when any package did not end up installed.
local({
  lib <- "/opt/llm-sandbox/libs/r"
  dir.create(lib, recursive = TRUE, showWarnings = FALSE)
  .libPaths(c(lib, .libPaths()))
  wanted <- commandArgs(trailingOnly = TRUE)
  present <- rownames(installed.packages())
  todo <- setdiff(wanted, present)
  if (length(todo) > 0L) {
    repo <- sub("/+$", "", Sys.getenv("LLM_SANDBOX_CRAN_REPO"))
    repos <- if (nzchar(repo)) c(CRAN = repo) else getOption("repos")
    if (length(repos) == 0L || any(repos == "@CRAN@")) {
      stop("no CRAN repository is configured: set SANDBOX_CRAN_REPO", call. = FALSE)
    }
    options(warn = 1)
    utils::install.packages(todo, lib = lib, repos = repos, Ncpus = 1L)
  }
  missing <- setdiff(wanted, rownames(installed.packages()))
  if (length(missing) > 0L) {
    message("not installed: ", paste(missing, collapse = ", "))
    quit(status = 1L)
  }
})
