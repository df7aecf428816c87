# Bash kernel of the cellfork code interpreter: one bash process per code
# context, started (bash --noprofile --norc kernel.sh) and driven by the Go
# package internal/agent/codeinterp; the protocol is described in
# foreign.go there. Each cell runs with `eval` in this shell, so variables,
# functions, aliases and the working directory carry over to the next cell.
# A cell that ends with a non-zero status is reported as an error whose
# value is the status, as E2B's bash kernel does.

__cellfork_mark=$CELLFORK_MARK
unset CELLFORK_MARK
__cellfork_count=0
__cellfork_incell=
declare -A __cellfork_global=()

# Interrupt (SIGINT, sent to the process group): the running command dies
# of it, and the trap ends the cell; between cells it does nothing. The
# trap is set again after every cell: once it has returned from a cell
# while bash waited for a child, bash runs it no more (bash 5.2).
__cellfork_trap='[[ -n $__cellfork_incell ]] && return 130'
trap "$__cellfork_trap" INT

# __cellfork_field reads one "<length>\n<bytes>" field into __cellfork_f.
__cellfork_field() {
	local len
	IFS= read -r -u 3 len || exit 0
	__cellfork_f=
	if ((len > 0)); then
		LC_ALL=C IFS= read -r -d '' -N "$len" -u 3 __cellfork_f || exit 0
	fi
}

# __cellfork_run evaluates a cell; a function, so that the trap can return.
__cellfork_run() {
	__cellfork_incell=1
	eval "$1"
}

# Names bash cannot hold as variables are skipped.
__cellfork_name='^[A-Za-z_][A-Za-z0-9_]*$'

printf '{"type":"ready","pid":%d}\n' $$ >&4
while :; do
	until IFS=' ' read -r -u 3 __cellfork_id __cellfork_nenv __cellfork_ntmp; do
		(($? > 128)) || exit 0 # EOF: the agent is gone; else interrupted
	done
	__cellfork_field
	__cellfork_code=$__cellfork_f
	for ((__cellfork_i = 0; __cellfork_i < __cellfork_nenv; __cellfork_i++)); do
		__cellfork_field
		__cellfork_k=$__cellfork_f
		__cellfork_field
		if [[ $__cellfork_k =~ $__cellfork_name ]]; then
			__cellfork_global[$__cellfork_k]=$__cellfork_f
			export "$__cellfork_k=$__cellfork_f"
		fi
	done
	__cellfork_tmp=()
	for ((__cellfork_i = 0; __cellfork_i < __cellfork_ntmp; __cellfork_i++)); do
		__cellfork_field
		__cellfork_k=$__cellfork_f
		__cellfork_field
		if [[ $__cellfork_k =~ $__cellfork_name ]]; then
			__cellfork_tmp+=("$__cellfork_k")
			export "$__cellfork_k=$__cellfork_f"
		fi
	done
	((__cellfork_count++))
	printf '{"type":"number_of_executions","execution_count":%d}\n' "$__cellfork_count" >&4
	# The cell gets neither the protocol's descriptors nor its input.
	__cellfork_run "$__cellfork_code" 3<&- 4>&- </dev/null
	__cellfork_status=$?
	__cellfork_incell=
	trap - INT
	trap "$__cellfork_trap" INT
	# An execution's own variables go back to the sandbox's value, or away.
	for __cellfork_k in "${__cellfork_tmp[@]}"; do
		if [[ -v __cellfork_global[$__cellfork_k] ]]; then
			export "$__cellfork_k=${__cellfork_global[$__cellfork_k]}"
		else
			unset "$__cellfork_k"
		fi
	done
	printf '%s' "$__cellfork_mark"
	printf '%s' "$__cellfork_mark" >&2
	if ((__cellfork_status != 0)); then
		printf '{"type":"error","name":"","value":"%d","traceback":""}\n' "$__cellfork_status" >&4
	fi
	printf '{"type":"done","id":%d}\n' "$__cellfork_id" >&4
done
