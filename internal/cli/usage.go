package cli

const globalFlags = `Global flags (before or after the command):
  --url URL        daemon base URL (env CELLFORK_URL, default ` + DefaultURL + `)
  --api-key KEY    API key sent as X-API-KEY (env CELLFORK_API_KEY)
  --json           machine-readable output
`

const usageMain = `Usage: cellfork [global flags] <command> [flags] [args]

Commands:
  serve                         run the daemon
  template build [NAME]         build a template's root filesystem locally
  sandbox create                create a sandbox and print its id
  sandbox list                  list sandboxes
  sandbox kill ID...            kill sandboxes
  exec ID -- CMD [ARGS...]      run a command in a sandbox, streaming its output
  run-code ID CODE|-            run code in a sandbox's code interpreter
  help [command]                show help for a command

` + globalFlags

const usageSandbox = `Usage: cellfork sandbox <create|list|kill> [flags]

  create [--template base] [--timeout 300] [--env K=V]... [--metadata K=V]...
  list   [--state running,paused] [--metadata K=V]...
  kill   ID...

` + globalFlags

const usageCreate = `Usage: cellfork sandbox create [flags]

Creates a sandbox and prints its id (--json: the full create response).

  --template NAME   template to start from (default base)
  --timeout SECS    seconds until the sandbox times out (default 300)
  --env K=V         environment variable for the sandbox (repeatable)
  --metadata K=V    metadata to attach (repeatable)

` + globalFlags

const usageList = `Usage: cellfork sandbox list [flags]

Lists sandboxes as a table (--json: a JSON array of all pages).

  --state LIST      comma-separated states to show: running, paused
  --metadata K=V    only sandboxes with this metadata (repeatable)

` + globalFlags

const usageKill = `Usage: cellfork sandbox kill ID...

Kills the given sandboxes and prints each id killed.

` + globalFlags

const usageExec = `Usage: cellfork exec [flags] ID [--] CMD [ARGS...]

Runs CMD ARGS in the sandbox with /bin/bash -l -c, each argument quoted, so
no shell syntax is interpreted. For pipes and the like, pass a script:
  cellfork exec ID -- bash -c 'ls | wc -l'
Streams the command's stdout and stderr and exits with its exit code
(128+N if killed by signal N). --json prints NDJSON events instead.

  --user USER       run as this user (default: the sandbox's default user)
  --cwd DIR         working directory
  --env K=V         environment variable (repeatable)
  --timeout SECS    kill the command after this many seconds (default 60, 0 = none)

` + globalFlags

const usageRunCode = `Usage: cellfork run-code [flags] ID CODE|-

Runs CODE (or standard input, for -) in the sandbox's code interpreter.
Streams stdout and stderr, prints the main result, and on an error prints the
traceback to stderr and exits 1. --json prints the NDJSON events.

  --language LANG   language (default: the interpreter's, python)
  --context ID      code context to run in (excludes --language)
  --env K=V         environment variable for this execution (repeatable)
  --timeout SECS    execution timeout (default 300, 0 = none)

` + globalFlags
