/*
 * gvisor-sentry-prewarmer: the sidecar runsc execs ahead of the sentry as
 * `prewarmer [--capbset=MASK] <binary> <argv0> [args...]`. It does, while
 * the process has one thread, what costs the sentry much more once the Go
 * runtime has started its threads:
 *
 * - The host fd table grows to FD_TABLE slots (runsc/boot/fdtable.Size, or
 *   the hard RLIMIT_NOFILE if lower). Growing a process's fd table while it
 *   has several threads waits for an RCU grace period (milliseconds, each
 *   doubling); the sentry remaps its stdio to fds 253..255 and a restore
 *   opens a few hundred host files. The table survives execve.
 * - With --capbset (gVisor patch 0029), every capability whose bit is clear
 *   in MASK leaves the bounding set. The sentry trims the bounding set
 *   itself, one all-threads call (every thread stopped) per capability; it
 *   skips those already gone. The bounding set survives execve; the
 *   capabilities the sentry still needs until it applies its own (it sets
 *   up its chroot first) survive in the inheritable set (keep_over_exec).
 *   Not root, or a capset that fails: the sentry trims it all.
 */
#include <errno.h>
#include <linux/capability.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FD_TABLE 4096

static void grow_fd_table(void) {
	/* The sentry's Go runtime raises its soft RLIMIT_NOFILE to the hard
	 * limit, so the hard limit bounds the table; the soft one is ours only
	 * until the exec. */
	struct rlimit rl, raised;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return;
	raised = rl;
	if (raised.rlim_cur != RLIM_INFINITY && raised.rlim_cur < FD_TABLE)
		raised.rlim_cur = raised.rlim_max < FD_TABLE ? raised.rlim_max : FD_TABLE;
	if (raised.rlim_cur != rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &raised) != 0)
		raised = rl;
	long top = FD_TABLE - 1;
	if (raised.rlim_cur != RLIM_INFINITY && (long)raised.rlim_cur <= top)
		top = (long)raised.rlim_cur - 1;
	if (top >= 3 && dup2(2, (int)top) == top)
		close((int)top);
	if (raised.rlim_cur != rl.rlim_cur)
		setrlimit(RLIMIT_NOFILE, &rl);
}

/* keep_over_exec puts the permitted set into the inheritable one, so that
 * the capabilities leaving the bounding set stay the sentry's until it
 * applies its own: a root process's permitted set after execve is its
 * bounding set and its inheritable one (capabilities(7)). The sentry sets
 * the inheritable set to the sandbox's (none) on every thread with one
 * capset. */
static int keep_over_exec(void) {
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
	if (syscall(SYS_capget, &h, d) != 0)
		return -1;
	for (int i = 0; i < _LINUX_CAPABILITY_U32S_3; i++)
		d[i].inheritable = d[i].permitted;
	return syscall(SYS_capset, &h, d);
}

static void trim_bounding_set(unsigned long long keep) {
	if (geteuid() != 0 || keep_over_exec() != 0)
		return; /* the sentry trims it */
	for (int c = 0; c < 64; c++) {
		if (keep & (1ULL << c))
			continue;
		/* EINVAL: past the kernel's last capability. */
		if (prctl(PR_CAPBSET_READ, c, 0, 0, 0) < 0 && errno == EINVAL)
			break;
		prctl(PR_CAPBSET_DROP, c, 0, 0, 0);
	}
}

int main(int argc, char **argv) {
	static const char flag[] = "--capbset=";
	if (argc >= 2 && strncmp(argv[1], flag, sizeof(flag) - 1) == 0) {
		char *end;
		const char *v = argv[1] + sizeof(flag) - 1;
		errno = 0;
		unsigned long long keep = strtoull(v, &end, 0);
		if (*v == '\0' || *end != '\0' || errno != 0)
			return 127;
		trim_bounding_set(keep);
		argc--;
		argv++;
	}
	if (argc < 3)
		return 127;
	grow_fd_table();
	execv(argv[1], argv + 2);
	return 127;
}
