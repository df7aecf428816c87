package envd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/agent"
)

// Zygotes. Nearly every command the SDKs run is `/bin/bash -l -c CMD`, and
// under gVisor the exec of bash (about 15 ms) costs far more than CMD
// itself. A zygote is such a shell started
// ahead of need for one account: it has read its profile and sources fd 3,
// where a claim writes a line that enters the request's directory and
// exports the request's variables, then CMD. Only CMD's own cost stays on
// the request's path; a fresh zygote is started behind each claim.
//
// A zygote serves only a request it is equivalent for: same account, same
// variables that shape a login (loginVars), profile files unchanged since
// it started (else it is discarded and the request starts its own shell).
// The sandbox's other variables may differ: /init sets the sandbox's own
// (E2B_SANDBOX_ID and the rest) after the warm image's spare started, and
// that spare must serve a pool hit's first command. The primer unsets and
// exports the difference, then the request's variables. Both come after
// the profile ran, where a plain login shell would see them before; they
// win over the profile either way.

// spareWait is how long a claim waits for a spare that is starting, at
// most: about what a shell of its own takes to start.
const spareWait = 50 * time.Millisecond

// zygoteBoot is what a zygote runs once its profile is read.
const zygoteBoot = ". /dev/fd/3"

type zygote struct {
	key    string   // account and login variables it was started with
	base   []string // the environment it was started with (KEY=VALUE, sorted)
	stamp  string   // profile files' state when it started
	cmd    *exec.Cmd
	stdin  *os.File // the agent's ends of its pipes
	stdout *os.File
	stderr *os.File
	script *os.File
}

// zygotes keeps one spare zygote per account that has run a command.
type zygotes struct {
	mu       sync.Mutex
	spare    map[uint32]*zygote       // by uid
	starting map[uint32]chan struct{} // closed when the start ends
	closed   bool
}

// close discards the spares; none are started after it.
func (zs *zygotes) close() {
	zs.mu.Lock()
	defer zs.mu.Unlock()
	zs.closed = true
	for uid, z := range zs.spare {
		z.discard()
		delete(zs.spare, uid)
	}
}

func newZygotes() *zygotes {
	return &zygotes{spare: map[uint32]*zygote{}, starting: map[uint32]chan struct{}{}}
}

// shellIdent matches the variable names a shell can export.
var shellIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// loginCommand returns CMD if the request is `/bin/bash -l -c CMD` over
// pipes, which a zygote can run.
func loginCommand(spec procSpec) (string, bool) {
	cfg := spec.req.GetProcess()
	a := cfg.GetArgs()
	if spec.path != "/bin/bash" || len(a) != 3 || a[0] != "-l" || a[1] != "-c" || spec.req.GetPty() != nil {
		return "", false
	}
	for k := range cfg.GetEnvs() {
		if !shellIdent.MatchString(k) {
			return "", false
		}
	}
	return a[2], true
}

// loginVars are the variables a profile is likely to read: a zygote
// serves only requests whose base environment has the same ones.
var loginVars = []string{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "ENV", "BASH_ENV", "TERM",
	"LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "PS1", "PROMPT_COMMAND", "HISTFILE", "TMPDIR"}

// zygoteKey is what a zygote must have been started with to serve spec.
func zygoteKey(acc agent.Account, groups []uint32, base []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d:%d:%v:%s", acc.UID, acc.GID, groups, acc.Home)
	for _, kv := range base {
		if k, _, _ := strings.Cut(kv, "="); slices.Contains(loginVars, k) {
			b.WriteString("\x00" + kv)
		}
	}
	return b.String()
}

// profileStamp sums up the files a login shell reads.
func profileStamp(home string) string {
	var b strings.Builder
	files := []string{"/etc/profile", "/etc/bash.bashrc", "/etc/profile.d"}
	extra, _ := filepath.Glob("/etc/profile.d/*")
	files = append(files, extra...)
	for _, f := range []string{".bash_profile", ".bash_login", ".profile", ".bashrc"} {
		files = append(files, filepath.Join(home, f))
	}
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil {
			fmt.Fprintf(&b, "%s:%d:%d;", f, fi.ModTime().UnixNano(), fi.Size())
		}
	}
	return b.String()
}

// claim hands out the account's spare zygote, primed with cmd, if it fits
// spec; else nil. Either way a new spare is started for the account.
func (zs *zygotes) claim(spec procSpec, cmd string) *zygote {
	uid := spec.acc.UID
	zs.mu.Lock()
	if started := zs.starting[uid]; zs.spare[uid] == nil && started != nil {
		// One is on its way (the last claim's refill): waiting for it
		// costs less than a shell of the request's own.
		zs.mu.Unlock()
		select {
		case <-started:
		case <-time.After(spareWait):
		}
		zs.mu.Lock()
	}
	z := zs.spare[uid]
	delete(zs.spare, uid)
	zs.mu.Unlock()
	key := zygoteKey(spec.acc, spec.groups, spec.base)
	go zs.refill(spec.acc, spec.groups, spec.base, key)
	if z == nil {
		return nil
	}
	unset, export := envDiff(z.base, spec.base)
	if z.key != key || z.stamp != profileStamp(envValue(spec.base, "HOME")) ||
		slices.ContainsFunc(append(unset, export...), func(kv string) bool { k, _, _ := strings.Cut(kv, "="); return !shellIdent.MatchString(k) }) {
		z.discard()
		return nil
	}
	if _, err := z.script.WriteString(primer(unset, export, spec, cmd)); err != nil {
		z.discard()
		return nil
	}
	_ = z.script.Close()
	return z
}

// envDiff returns the names in had that want lacks, and the KEY=VALUE
// entries of want that had lacks.
func envDiff(had, want []string) (unset, export []string) {
	for _, kv := range had {
		if k, _, _ := strings.Cut(kv, "="); !slices.ContainsFunc(want, func(s string) bool { return strings.HasPrefix(s, k+"=") }) {
			unset = append(unset, k)
		}
	}
	for _, kv := range want {
		if !slices.Contains(had, kv) {
			export = append(export, kv)
		}
	}
	return unset, export
}

// primer is what a zygote sources: one line that closes fd 3, enters the
// directory, unsets and exports what its environment lacks of the
// request's base (envDiff), exports the request's variables, then the
// command.
func primer(unset, export []string, spec procSpec, cmd string) string {
	var b strings.Builder
	b.WriteString("exec 3<&- && cd -- " + shellQuote(spec.dir))
	for _, k := range unset {
		b.WriteString(" && unset " + k)
	}
	for _, kv := range export {
		b.WriteString(" && export " + shellQuote(kv))
	}
	envs := spec.req.GetProcess().GetEnvs()
	keys := make([]string, 0, len(envs))
	for k := range envs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.WriteString(" && export " + shellQuote(k+"="+envs[k]))
	}
	b.WriteString(" || exit 1\n")
	if execs(cmd) {
		b.WriteString("exec ")
	}
	b.WriteString(cmd)
	return b.String()
}

// shellWords are bash's builtins and reserved words: a command starting
// with one is not exec'd.
var shellWords = strings.Fields(`. : [ alias bg bind break builtin caller cd command compgen complete
	compopt continue declare dirs disown echo enable eval exec exit export false fc fg getopts hash
	help history jobs kill let local logout mapfile popd printf pushd pwd read readarray readonly
	return set shift shopt source suspend test times trap true type typeset ulimit umask unalias
	unset wait if then else elif fi case esac for select while until do done in function time { }
	! [[ ]] coproc`)

// execs says whether bash -c would exec cmd in place of the shell (one
// simple command naming a program), so that the zygote does the same and
// the process keeps the program's pid and command line. It errs towards
// no: only plain words, quotes without expansions, and no operators.
func execs(cmd string) bool {
	cmd = strings.TrimSpace(cmd)
	first, _, _ := strings.Cut(cmd, " ")
	if first == "" || strings.ContainsAny(first, "='\"") || slices.Contains(shellWords, first) {
		return false
	}
	var quote rune
	for _, c := range cmd {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else if strings.ContainsRune("$`\\\n", c) {
				return false
			}
		case c == '\'' || c == '"':
			quote = c
		case strings.ContainsRune(";&|<>(){}#!$`\\\n\t", c):
			return false
		}
	}
	return quote == 0
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// refill starts a spare zygote for the account unless a fitting one is
// there or one is starting; a spare that no longer fits is discarded.
func (zs *zygotes) refill(acc agent.Account, groups []uint32, base []string, key string) {
	zs.mu.Lock()
	if z := zs.spare[acc.UID]; z != nil && z.key != key {
		delete(zs.spare, acc.UID)
		z.discard()
	}
	if zs.spare[acc.UID] != nil || zs.starting[acc.UID] != nil || zs.closed {
		zs.mu.Unlock()
		return
	}
	started := make(chan struct{})
	zs.starting[acc.UID] = started
	zs.mu.Unlock()
	z, err := startZygote(acc, groups, base, key)
	zs.mu.Lock()
	defer zs.mu.Unlock()
	delete(zs.starting, acc.UID)
	close(started)
	switch {
	case err != nil:
	case zs.closed:
		z.discard()
	default:
		zs.spare[acc.UID] = z
	}
}

func startZygote(acc agent.Account, groups []uint32, env []string, key string) (*zygote, error) {
	z := &zygote{key: key, base: env, stamp: profileStamp(envValue(env, "HOME"))}
	var child []*os.File
	defer func() {
		for _, f := range child {
			_ = f.Close()
		}
	}()
	pipe := func(agentWrites bool) (*os.File, *os.File, error) {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		if agentWrites {
			child = append(child, r)
			return r, w, nil
		}
		child = append(child, w)
		return w, r, nil
	}
	var inR, outW, errW, scriptR *os.File
	var err error
	if inR, z.stdin, err = pipe(true); err == nil {
		if outW, z.stdout, err = pipe(false); err == nil {
			if errW, z.stderr, err = pipe(false); err == nil {
				scriptR, z.script, err = pipe(true)
			}
		}
	}
	if err == nil {
		// The shell reopens its end as /dev/fd/3, which a pipe made by
		// root allows only to its owner.
		err = scriptR.Chown(int(acc.UID), int(acc.GID))
	}
	if err == nil {
		z.cmd = &exec.Cmd{
			Path: "/bin/bash", Args: []string{"/bin/bash", "-l", "-c", zygoteBoot},
			Env: env, Dir: "/", Stdin: inR, Stdout: outW, Stderr: errW,
			ExtraFiles: []*os.File{scriptR},
			SysProcAttr: &syscall.SysProcAttr{
				Credential: &syscall.Credential{Uid: acc.UID, Gid: acc.GID, Groups: groups},
				Setpgid:    true,
			},
		}
		err = agent.StartChild(z.cmd)
	}
	if err != nil {
		z.closeAgentEnds()
		return nil, fmt.Errorf("starting a zygote: %w", err)
	}
	return z, nil
}

func (z *zygote) closeAgentEnds() {
	for _, f := range []*os.File{z.stdin, z.stdout, z.stderr, z.script} {
		if f != nil {
			_ = f.Close()
		}
	}
}

// discard ends an unused zygote.
func (z *zygote) discard() {
	_ = syscall.Kill(-z.cmd.Process.Pid, syscall.SIGKILL)
	z.closeAgentEnds()
	go func() {
		_ = z.cmd.Wait()
		agent.ChildDone(z.cmd.Process.Pid)
	}()
}

// proc turns a claimed zygote into the request's process.
func (z *zygote) proc(ctx context.Context, cancel context.CancelFunc, spec procSpec, out *output) *proc {
	p := newProc(spec, z.cmd, out)
	p.readers, p.pid = []*os.File{z.stdout, z.stderr}, uint32(z.cmd.Process.Pid)
	if spec.wantsStdin() {
		p.stdin = z.stdin
	} else {
		_ = z.stdin.Close()
	}
	p.run(ctx, cancel)
	return p
}
