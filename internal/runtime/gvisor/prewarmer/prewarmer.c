/*
 * gvisor-sentry-prewarmer: the sidecar runsc execs ahead of the sentry as
 * `prewarmer <binary> <argv0> [args...]`.
 *
 * Growing a process's fd table while it has several threads waits for an RCU
 * grace period (milliseconds). The sentry remaps its stdio to fds 253..255
 * after the Go runtime has started its threads, so we grow the table now,
 * while single-threaded; the table survives execve.
 */
#include <unistd.h>

int main(int argc, char **argv) {
	if (argc < 3)
		return 127;
	if (dup2(2, 255) == 255)
		close(255);
	execv(argv[1], argv + 2);
	return 127;
}
