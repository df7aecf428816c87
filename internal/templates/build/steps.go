package build

import (
	"bufio"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cellfork/cellfork/internal/errdefs"
)

type imageT = v1.Image

// provisionScript readies an image for cellfork (E2B provisions its base
// images too): the user `user` that commands run as by default, with a
// home and sudo where sudo exists, the names and resolver every sandbox
// has, and a /bin/bash. Plain POSIX sh: images range from Debian to
// busybox.
const provisionScript = `set -e
if ! id -u user >/dev/null 2>&1; then
  sh=/bin/sh; [ -x /bin/bash ] && sh=/bin/bash
  if command -v useradd >/dev/null 2>&1; then
    useradd --create-home --uid 1000 --user-group --shell "$sh" user 2>/dev/null || useradd --create-home --shell "$sh" user
  elif command -v adduser >/dev/null 2>&1; then
    adduser -D -u 1000 -s "$sh" user 2>/dev/null || adduser -D -s "$sh" user
  else
    echo "user:x:1000:1000::/home/user:$sh" >> /etc/passwd
    grep -q '^user:' /etc/group 2>/dev/null || echo "user:x:1000:" >> /etc/group
  fi
fi
home=$(awk -F: '$1=="user"{print $6}' /etc/passwd 2>/dev/null || echo /home/user)
[ -n "$home" ] || home=/home/user
mkdir -p "$home" && chown user "$home" 2>/dev/null || true
if [ -d /etc/sudoers.d ]; then
  echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > /etc/sudoers.d/user && chmod 0440 /etc/sudoers.d/user
fi
printf '127.0.0.1\tlocalhost\n127.0.1.1\tsandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n' > /etc/hosts
echo sandbox > /etc/hostname
rm -f /etc/resolv.conf && echo 'nameserver 10.88.0.1' > /etc/resolv.conf
# The SDKs run every command as /bin/bash -l -c: an image without bash
# gets its sh under that name.
if [ ! -e /bin/bash ]; then
  printf '#!/bin/sh\nexec /bin/sh "$@"\n' > /bin/bash && chmod 755 /bin/bash
  echo "no bash in the image: /bin/bash runs /bin/sh"
fi
echo "provisioned: user $(id -u user), home $home"
`

// step runs one step on chain and returns the chain with its layer and
// the context after it. ENV changes only the context: no sandbox, no layer.
func (b *Builder) step(ctx context.Context, job Job, chain []string, key string, c Context, st Step, name string,
	log func(string, string, string, ...any)) ([]string, Context, error) {
	out := func(line string, stderr bool) {
		level := "info"
		if stderr {
			level = "warn"
		}
		log(level, name, "%s", line)
	}
	switch strings.ToUpper(st.Type) {
	case StepEnv:
		// Only the context changes: an empty layer records it (so the step
		// is found in the cache like any other), no sandbox runs.
		nc := c.clone()
		for i := 0; i+1 < len(st.Args); i += 2 {
			nc.Env[st.Args[i]] = os.Expand(st.Args[i+1], func(k string) string { return nc.Env[k] })
		}
		p, err := b.cfg.Layers.Begin(key, chain[len(chain)-1])
		if err != nil {
			return nil, c, err
		}
		l, err := p.Commit(st.String(), nc)
		if err != nil {
			p.Abort()
			return nil, c, err
		}
		return append(slices.Clone(chain), l.ID), nc, nil
	case StepRun:
		return b.inSandbox(ctx, chain, key, c, st.String(), func(ctx context.Context, a *agent, shell string) (Context, error) {
			rc := c.clone()
			if len(st.Args) >= 2 && st.Args[1] != "" {
				rc.User = st.Args[1]
			}
			if err := a.run(ctx, command{shell: shell, cmd: st.Args[0], c: rc, out: out}); err != nil {
				return c, fmt.Errorf("failed to run command '%s': %w", st.Args[0], err)
			}
			return c, nil
		})
	case StepWorkdir:
		dir := st.Args[0]
		if !path.IsAbs(dir) {
			base := c.Workdir
			if base == "" {
				base = "/"
			}
			dir = path.Join(base, dir)
		}
		dir = path.Clean(dir)
		return b.inSandbox(ctx, chain, key, c, st.String(), func(ctx context.Context, a *agent, shell string) (Context, error) {
			script := fmt.Sprintf(`target=%s
[ -d "$target" ] && exit 0
first=""; check="$target"
while [ ! -d "$check" ]; do first="$check"; check=$(dirname "$check"); done
mkdir -p "$target"
[ -n "$first" ] && chown -R %s "$first"
exit 0`, shellQuote(dir), shellQuote(c.User))
			if err := a.run(ctx, command{shell: "/bin/sh", cmd: script, c: Context{User: "root", Env: c.Env}, out: out}); err != nil {
				return c, fmt.Errorf("failed to create workdir %s: %w", dir, err)
			}
			nc := c.clone()
			nc.Workdir = dir
			return nc, nil
		})
	case StepUser:
		user := st.Args[0]
		sudo := len(st.Args) >= 2 && st.Args[1] == "true"
		return b.inSandbox(ctx, chain, key, c, st.String(), func(ctx context.Context, a *agent, shell string) (Context, error) {
			u := user // validated: letters, digits, '.', '_', '-' (a plain shell word)
			script := fmt.Sprintf(`set -e
if ! id -u %[1]s >/dev/null 2>&1; then
  sh=/bin/sh; [ -x /bin/bash ] && sh=/bin/bash
  if command -v useradd >/dev/null 2>&1; then useradd --create-home --shell "$sh" %[1]s
  elif command -v adduser >/dev/null 2>&1; then adduser -D -s "$sh" %[1]s
  else
    uid=$(awk -F: '$3>=1000 && $3<60000 && $3>m {m=$3} END {print (m ? m+1 : 1000)}' /etc/passwd)
    echo "%[1]s:x:$uid:$uid::/home/%[1]s:$sh" >> /etc/passwd
    echo "%[1]s:x:$uid:" >> /etc/group
    mkdir -p /home/%[1]s && chown "$uid:$uid" /home/%[1]s
  fi
fi`, u)
			if sudo {
				script += fmt.Sprintf(`
mkdir -p /etc/sudoers.d
echo %s > /etc/sudoers.d/%s && chmod 0440 /etc/sudoers.d/%s`, shellQuote(user+" ALL=(ALL:ALL) NOPASSWD: ALL"), u, u)
			}
			if err := a.run(ctx, command{shell: "/bin/sh", cmd: script, c: Context{User: "root", Env: c.Env}, out: out}); err != nil {
				return c, fmt.Errorf("failed to create user %s: %w", user, err)
			}
			nc := c.clone()
			nc.User = user
			return nc, nil
		})
	case StepCopy:
		return b.copyStep(ctx, chain, key, c, st, out)
	}
	return nil, c, invalid("unknown step type %q", st.Type)
}

// copyStep puts uploaded files into the template, with Docker's COPY
// semantics as E2B has them: a directory source is merged into the target
// (files replaced), a file source becomes the target (or goes into it
// when the target ends in /), a relative target is relative to the
// working directory (or the user's home), and everything is owned by the
// step's owner (default: the current user).
func (b *Builder) copyStep(ctx context.Context, chain []string, key string, c Context, st Step, out func(string, bool)) ([]string, Context, error) {
	src, ok := b.cfg.Files(st.FilesHash)
	if !ok {
		return nil, c, errdefs.New(errdefs.ErrNotFound, "the files of COPY %s (hash %s) were not uploaded", st.Args[0], st.FilesHash)
	}
	owner := c.User + ":" + c.User
	if len(st.Args) >= 3 && st.Args[2] != "" {
		owner = st.Args[2]
		if !strings.Contains(owner, ":") {
			owner += ":" + owner
		}
	}
	mode := ""
	if len(st.Args) >= 4 {
		mode = st.Args[3]
	}
	return b.inSandbox(ctx, chain, key, c, st.String(), func(ctx context.Context, a *agent, shell string) (Context, error) {
		f, err := os.Open(src)
		if err != nil {
			return c, err
		}
		defer f.Close()
		r, err := maybeGunzip(f)
		if err != nil {
			return c, fmt.Errorf("reading the uploaded files: %w", err)
		}
		tmp := "/tmp/.cellfork-copy-" + st.FilesHash[:16]
		if err := a.upload(ctx, tmp+".tar", r); err != nil {
			return c, err
		}
		pattern := path.Clean(st.Args[0])
		script := fmt.Sprintf(copyScript, shellQuote(tmp), shellQuote(pattern), shellQuote(globBase(pattern)),
			shellQuote(st.Args[1]), shellQuote(owner), shellQuote(mode), shellQuote(c.Workdir), shellQuote(c.User))
		if err := a.run(ctx, command{shell: "/bin/sh", cmd: script, c: Context{User: "root", Env: c.Env}, out: out}); err != nil {
			return c, fmt.Errorf("failed to copy %s to %s: %w", st.Args[0], st.Args[1], err)
		}
		return c, nil
	})
}

// copyScript unpacks the upload in /tmp and moves the source into place
// (then removes the upload: it must not stay in the layer). A source with
// glob patterns copies each match to the same place under the target as
// it has under the pattern's plain prefix ("folder/*" to "dst" puts
// folder/a at dst/a), which is what E2B does with the files its SDKs
// upload. Arguments: tmp, pattern, its plain prefix, target, owner,
// mode, workdir, user.
const copyScript = `set -e
tmp=%s; pattern=%s; base=%s; target=%s; owner=%s; mode=%s; workdir=%s; user=%s
trap 'rm -rf "$tmp" "$tmp.tar"' EXIT
mkdir -p "$tmp/unpack"
tar -xf "$tmp.tar" -C "$tmp/unpack"
rm -f "$tmp.tar"
if [ -z "$workdir" ]; then workdir=$(awk -F: -v u="$user" '$1==u{print $6}' /etc/passwd); fi
[ -n "$workdir" ] || workdir=/
case "$target" in /*) ;; *) target="$workdir/$target" ;; esac
cd "$tmp/unpack"
# place ENTRY DEST: ENTRY (a file, link or directory) becomes DEST; a
# directory is merged into an existing one.
place() {
  if [ -L "$1" ]; then
    chown -h "$owner" "$1"; rm -rf "$2"; mv "$1" "$2"
  elif [ -f "$1" ]; then
    chown "$owner" "$1"; [ -z "$mode" ] || chmod "$mode" "$1"; rm -rf "$2"; mv "$1" "$2"
  elif [ -d "$1" ]; then
    chown -R "$owner" "$1"; [ -z "$mode" ] || chmod -R "$mode" "$1"
    mkdir -p "$2"; (cd "$1" && tar -cf - .) | tar -xf - -C "$2"
  else
    echo "$1 is neither a file, a directory nor a link" >&2; return 1
  fi
}
if [ "$pattern" = "$base" ]; then
  if [ ! -e "$base" ] && [ ! -L "$base" ]; then echo "source path does not exist in the upload: $pattern" >&2; exit 1; fi
  case "$target" in
    */) mkdir -p "$target"; [ -d "$base" ] && ! [ -L "$base" ] && dest="$target" || dest="$target$(basename "$base")" ;;
    *) mkdir -p "$(dirname "$target")"; dest="$target" ;;
  esac
  place "$base" "$dest"
else
  mkdir -p "$target"; found=0
  IFS='
'
  for e in $pattern; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    found=1
    if [ "$base" = . ]; then rel="$e"; else rel="${e#"$base"/}"; fi
    mkdir -p "$target/$(dirname "$rel")"
    place "$e" "$target/$rel"
  done
  [ "$found" = 1 ] || { echo "no file in the upload matches $pattern" >&2; exit 1; }
fi
`

// globBase is the part of a COPY source before its first glob pattern
// ("folder/*.txt" -> "folder"): the SDK puts the matched files in the
// upload under their paths, and the step copies from there.
func globBase(src string) string {
	var keep []string
	for _, part := range strings.Split(path.Clean(src), "/") {
		if strings.ContainsAny(part, "*?[{\\") {
			break
		}
		keep = append(keep, part)
	}
	if len(keep) == 0 {
		return "."
	}
	return path.Join(keep...)
}

// maybeGunzip undoes the gzip the SDKs apply to uploads by default.
func maybeGunzip(r io.Reader) (io.Reader, error) {
	br := bufio.NewReader(r)
	magic, err := br.Peek(2)
	if err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		return gzip.NewReader(br)
	}
	return br, nil
}

// shellQuote makes s one word for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
