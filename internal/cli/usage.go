package cli

const globalFlags = `Global flags (before or after the command):
  --url URL        daemon base URL (env CELLFORK_URL, default ` + DefaultURL + `)
  --api-key KEY    API key sent as X-API-KEY (env CELLFORK_API_KEY)
  --json           machine-readable output
`

const usageMain = `Usage: cellfork [global flags] <command> [flags] [args]

Commands:
  serve                         run the daemon
  template build --name NAME    build a custom template (Dockerfile, steps file, image)
  template import FILE          make a template of an image archive (docker save, OCI)
  template list                 list templates
  template delete NAME...       delete custom templates
  mcp [--http ADDR]             serve the Model Context Protocol (cellfork mcp --help)
  sandbox create                create a sandbox and print its id
  sandbox list                  list sandboxes
  sandbox kill ID...            kill sandboxes
  exec ID -- CMD [ARGS...]      run a command in a sandbox, streaming its output
  run-code ID CODE|-            run code in a sandbox's code interpreter
  snapshot create ID            snapshot a sandbox and print the snapshot id
  snapshot list|tree            list snapshots, as a table or as a tree
  snapshot get SNAPSHOT         show one snapshot
  snapshot rm SNAPSHOT...       delete snapshots
  snapshot usage                show the disk snapshots use
  fork ID [-n N]                fork a running sandbox and print the children's ids
  rollback ID SNAPSHOT          restore a sandbox in place to a snapshot
  merge PARENT CHILD            make a fork child's state its parent's
  pause ID [--spill]            pause a sandbox
  resume ID                     resume a paused sandbox
  help [command]                show help for a command

` + globalFlags

const usageSandbox = `Usage: cellfork sandbox <create|list|kill> [flags]

  create [--template base|--snapshot SNAP] [--timeout 300] [--env K=V]... [--metadata K=V]...
         [--cpus N] [--memory-mb N] [--disk-mb N] [--pids-max N] [--open-files N]
         [--no-internet] [--allow-out RULE]... [--deny-out RULE]...
  list   [--state running,paused] [--metadata K=V]...
  kill   ID...

` + globalFlags

const usageCreate = `Usage: cellfork sandbox create [flags]

Creates a sandbox and prints its id (--json: the full create response,
including bootMode: pool, standby, restore, boot or fork).

  --template NAME   template to start from (default base)
  --snapshot SNAP   snapshot (id or name) to start from; the same as --template
  --timeout SECS    seconds until the sandbox times out (default 300)
  --env K=V         environment variable for the sandbox (repeatable)
  --metadata K=V    metadata to attach (repeatable)

Limits (default: the template's, or the snapshot's; the daemon refuses
values past its maximums, and a snapshot's disk size or more processes or
open files than it had):
  --cpus N          CPUs
  --memory-mb N     memory, MiB
  --disk-mb N       writable disk (/tmp included), MiB; past it, ENOSPC
  --pids-max N      processes per user inside the sandbox
  --open-files N    open files per process

Egress (default: internet on; the host, the daemon, other sandboxes and
private ranges stay unreachable whatever is given):
  --no-internet     no egress but what --allow-out allows
  --allow-out RULE  allow an IPv4 address, a CIDR or a domain name
                    (example.com, *.example.com: HTTP and TLS); repeatable
  --deny-out RULE   deny an IPv4 address or CIDR (0.0.0.0/0: everything
                    --allow-out does not allow); repeatable

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

const usageSnapshot = `Usage: cellfork snapshot <create|list|get|tree|rm|usage> [flags]

  create ID [--name NAME]
  list   [--sandbox ID] [--name NAME]
  get    SNAPSHOT
  tree
  rm     SNAPSHOT...
  usage

A snapshot is a sandbox's whole state (memory, processes, files). Start a new
sandbox from one with: cellfork sandbox create --snapshot SNAPSHOT

` + globalFlags

const usageSnapshotCreate = `Usage: cellfork snapshot create [flags] ID

Snapshots sandbox ID (which keeps running) and prints the snapshot id
(--json: the snapshot).

  --name NAME       a name to find the snapshot by, in place of its id

` + globalFlags

const usageSnapshotList = `Usage: cellfork snapshot list [flags]

Lists snapshots, oldest first, as a table (--json: a JSON array of all pages).

  --sandbox ID      only snapshots taken of this sandbox
  --name NAME       only snapshots with this name

` + globalFlags

const usageSnapshotGet = `Usage: cellfork snapshot get SNAPSHOT

Shows one snapshot, by id or name (--json: the snapshot).

` + globalFlags

const usageSnapshotTree = `Usage: cellfork snapshot tree

Shows all snapshots as a tree: each snapshot under its parent (the snapshot
its sandbox was last started from, rolled back to or snapshotted as), with its
names, size and the sandbox it was taken of. --json: the snapshots, each with
a "children" array.

` + globalFlags

const usageSnapshotRemove = `Usage: cellfork snapshot rm SNAPSHOT...

Deletes the given snapshots (ids or names) and prints each one deleted.
A deleted snapshot's children move up to its parent.

` + globalFlags

const usageSnapshotUsage = `Usage: cellfork snapshot usage

Shows how many snapshots there are and the disk they use, against the
daemon's cap (--json: {totalBytes, capBytes, count}; capBytes 0 = no cap).

` + globalFlags

const usageFork = `Usage: cellfork fork [flags] ID

Forks running sandbox ID into N children that start from its current state,
and prints their ids, one a line. A child that failed to start is reported
on stderr and makes the exit code 1. --json: the daemon's array of results.

  -n N              number of children (default 1)
  --timeout SECS    children's timeout (default: the daemon's)

` + globalFlags

const usageRollback = `Usage: cellfork rollback ID SNAPSHOT

Restores sandbox ID in place to SNAPSHOT (an id or name from its tree): same
id, same address, the snapshot's state. Prints the sandbox id (--json: the
sandbox).

` + globalFlags

const usageMerge = `Usage: cellfork merge PARENT CHILD

Makes fork child CHILD's state PARENT's: PARENT keeps its id and address,
CHILD's id goes away. Prints PARENT's id (--json: the sandbox).

` + globalFlags

const usagePause = `Usage: cellfork pause [flags] ID

Pauses sandbox ID and prints its id. Fails if it is paused already.

  --spill           also write its state to disk now, freeing its memory

` + globalFlags

const usageResume = `Usage: cellfork resume [flags] ID

Resumes sandbox ID if it is paused and prints its id; says so on stderr if it
was running already. --json: the sandbox, with "resumed": true or false.

  --timeout SECS    its new timeout from now (default: the daemon's)

` + globalFlags

const usageTemplate = `Usage: cellfork template <build|import|list|delete> [flags]

  build  --name NAME (-f DOCKERFILE | --steps FILE | --from-image IMAGE | --from-template NAME) [CONTEXT]
  import --name NAME IMAGE.tar
  list
  delete NAME...

(The built-in base template's root filesystem is built on the daemon's
host by ` + "`cellfork template build --data-dir DIR [base]`" + `.)

` + globalFlags

const usageTemplateBuild = `Usage: cellfork template build --name NAME[:TAG] [flags] [CONTEXT]

Builds a custom template on the daemon and follows its log. CONTEXT
(default .) is the directory COPY sources are taken from; it is uploaded
as one archive (without what .dockerignore excludes), once: the daemon
keeps files by their hash. Prints the template id.

One of:
  -f, --file DOCKERFILE    FROM, RUN, COPY, ADD (local files), ENV, ARG,
                           WORKDIR, USER; CMD/ENTRYPOINT is the start
                           command, HEALTHCHECK CMD its ready check
  --steps FILE             the template as E2B's build API takes it (JSON:
                           fromImage or fromTemplate, steps [{type, args}],
                           startCmd, readyCmd); COPY steps without a
                           filesHash copy from CONTEXT
  --from-image IMAGE       an image (Docker Hub, or REGISTRY/REPO:TAG)
  --from-template NAME     another template (base for the built-in one)

  --build-arg K=V          a Dockerfile ARG (repeatable)
  --start-cmd CMD          command left running in every sandbox
  --ready-cmd CMD          retried until it succeeds before the snapshot
  --cpus N, --memory-mb N  the template's sandbox size
  --tag TAG                another tag for the build (repeatable)
  --no-cache               run every step again

` + globalFlags

const usageTemplateImport = `Usage: cellfork template import --name NAME[:TAG] [--start-cmd CMD] [--ready-cmd CMD] IMAGE.tar

Makes a template of an image archive (` + "`docker save`" + ` or an OCI archive):
uploads it and builds from it. The image gets cellfork's agent, a user
` + "`user`" + ` and the sandbox's network files; it needs /bin/sh.

` + globalFlags

const usageTemplateList = `Usage: cellfork template list

Lists the built-in and custom templates (--json: the daemon's answer).

` + globalFlags

const usageTemplateDelete = `Usage: cellfork template delete NAME...

Deletes custom templates. Sandboxes created from them keep running.

` + globalFlags
