# R kernel of the cellfork code interpreter: one R process per code context,
# started (Rscript --vanilla kernel.R) and driven by the Go package
# internal/agent/codeinterp; the protocol is described in foreign.go there.
# Cells are evaluated one top-level expression at a time in the global
# environment, as IRkernel (E2B's R kernel) does: what an expression prints
# is sent as stdout when it ends, a visible value as a display result, a
# message or warning as stderr, an error as an `ERROR` error.

local({
  mark <- Sys.getenv("CELLFORK_MARK")
  Sys.unsetenv("CELLFORK_MARK")
  cmd <- file("/proc/self/fd/3", open = "rb")
  evt <- file("/proc/self/fd/4", open = "wb")
  count <- 0L
  global <- character(0) # the sandbox's variables, as last sent

  json_str <- function(s) {
    s <- enc2utf8(paste(s, collapse = "\n"))
    cp <- utf8ToInt(s)
    if (length(cp) == 0L || anyNA(cp)) {
      return(if (length(cp) == 0L) '""' else json_str(iconv(s, "UTF-8", "UTF-8", sub = "?")))
    }
    out <- intToUtf8(cp, multiple = TRUE)
    esc <- cp < 32L | cp == 34L | cp == 92L
    out[esc] <- vapply(cp[esc], function(c) switch(as.character(c),
      "34" = "\\\"", "92" = "\\\\", "10" = "\\n", "13" = "\\r", "9" = "\\t",
      sprintf("\\u%04x", c)), "")
    paste0('"', paste(out, collapse = ""), '"')
  }

  send <- function(...) {
    fields <- list(...)
    parts <- vapply(names(fields), function(k) {
      v <- fields[[k]]
      val <- if (is.logical(v)) tolower(as.character(v))
             else if (is.numeric(v)) format(v, scientific = FALSE)
             else json_str(v)
      paste0('"', k, '":', val)
    }, "")
    writeLines(paste0("{", paste(parts, collapse = ","), "}"), evt, useBytes = TRUE)
    flush(evt)
  }

  now <- function() format(Sys.time(), "%Y-%m-%dT%H:%M:%OS6Z", tz = "UTC")
  output <- function(stream, text) {
    if (length(text) && nzchar(paste(text, collapse = ""))) {
      send(type = stream, text = paste(text, collapse = ""), timestamp = now())
    }
  }

  field <- function() {
    len <- readLines(cmd, n = 1L, warn = FALSE)
    if (length(len) == 0L) quit(save = "no", status = 0L)
    n <- as.integer(len)
    if (n == 0L) return("")
    raw <- readBin(cmd, "raw", n)
    while (length(raw) < n) {
      more <- readBin(cmd, "raw", n - length(raw))
      if (length(more) == 0L) quit(save = "no", status = 0L)
      raw <- c(raw, more)
    }
    s <- rawToChar(raw)
    Encoding(s) <- "UTF-8"
    s
  }

  set_env <- function(keys, values) {
    if (length(keys)) do.call(Sys.setenv, as.list(stats::setNames(values, keys)))
  }

  # evaluate runs one top-level expression with its output captured; it
  # returns FALSE when the cell must stop (an error or an interrupt).
  evaluate <- function(expr) {
    # A raw connection keeps the output exactly (a text connection would
    # end an unfinished last line).
    con <- rawConnection(raw(0), "w")
    sink(con)
    on.exit({
      sink()
      bytes <- rawConnectionValue(con)
      text <- rawToChar(bytes[bytes != as.raw(0L)]) # R strings hold no NUL
      close(con)
      Encoding(text) <- "UTF-8"
      output("stdout", text)
    })
    ok <- TRUE
    withCallingHandlers(
      tryCatch({
        res <- withVisible(eval(expr, envir = globalenv()))
        if (res$visible) {
          text <- paste(utils::capture.output(print(res$value)), collapse = "\n")
          if (nzchar(text)) send(type = "result", text = text, is_main_result = FALSE)
        }
      }, error = function(e) {
        # An error of the cell's own top level has no call to show (as in
        # R's console), rather than this kernel's eval().
        call <- conditionCall(e)
        msg <- if (is.null(call) || identical(call, quote(eval(expr, envir = globalenv())))) {
          paste0("Error: ", conditionMessage(e))
        } else {
          toString(e)
        }
        if (!endsWith(msg, "\n")) msg <- paste0(msg, "\n")
        send(type = "error", name = "ERROR", value = msg, traceback = msg)
        ok <<- FALSE
      }, interrupt = function(i) {
        send(type = "error", name = "KeyboardInterrupt", value = "interrupted", traceback = "")
        ok <<- FALSE
      }),
      message = function(m) {
        output("stderr", conditionMessage(m))
        invokeRestart("muffleMessage")
      },
      warning = function(w) {
        call <- if (is.null(conditionCall(w))) "" else paste("In", deparse(conditionCall(w))[[1L]])
        output("stderr", sprintf("Warning message:\n%s: %s\n", call, conditionMessage(w)))
        invokeRestart("muffleWarning")
      })
    ok
  }

  run <- function(code) {
    exprs <- tryCatch(parse(text = code, keep.source = FALSE), error = function(e) e)
    if (inherits(exprs, "error")) {
      msg <- paste0("Error in parse(text = code): ", conditionMessage(exprs), "\n")
      send(type = "error", name = "ERROR", value = msg, traceback = msg)
      return(invisible())
    }
    for (expr in exprs) if (!evaluate(expr)) break
  }

  send(type = "ready", pid = Sys.getpid())
  repeat {
    head <- readLines(cmd, n = 1L, warn = FALSE)
    if (length(head) == 0L) break
    nums <- as.integer(strsplit(head, " ", fixed = TRUE)[[1L]])
    id <- nums[[1L]]
    code <- field()
    kv <- function(n) {
      if (n == 0L) return(list(k = character(0), v = character(0)))
      x <- vapply(seq_len(2L * n), function(i) field(), "")
      list(k = x[c(TRUE, FALSE)], v = x[c(FALSE, TRUE)])
    }
    env <- kv(nums[[2L]])
    tmp <- kv(nums[[3L]])
    set_env(env$k, env$v)
    global[env$k] <- env$v
    saved <- Sys.getenv(tmp$k, unset = NA, names = TRUE)
    set_env(tmp$k, tmp$v)
    count <- count + 1L
    send(type = "number_of_executions", execution_count = count)
    tryCatch(run(code), interrupt = function(i) {
      send(type = "error", name = "KeyboardInterrupt", value = "interrupted", traceback = "")
    })
    # An execution's own variables go back to the sandbox's value, or away.
    for (k in tmp$k) {
      if (!is.na(global[k])) set_env(k, global[[k]])
      else if (!is.na(saved[[k]])) set_env(k, saved[[k]])
      else Sys.unsetenv(k)
    }
    cat(mark)
    flush(stdout())
    cat(mark, file = stderr())
    send(type = "done", id = id)
  }
})
