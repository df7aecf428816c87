// Package chunkstoretest is the conformance suite of chunkstore backends
// (Run), and helpers that make and compare image directories.
package chunkstoretest

import (
	"bytes"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// Image describes a synthetic image directory: files of pages drawn from a
// seeded pool, so that two images with the same pool share most of their
// pages in shifted positions, as gVisor images do.
type Image struct {
	Seed  uint64 // which pages, in which order
	Pool  uint64 // the pool of distinct pages (images with one pool share)
	Pages int    // 4 KiB pages in pages.img
	// ZeroRun, if > 0, puts a run of that many zero pages in the middle.
	ZeroRun int
}

// TB is the part of testing.TB that Write needs (benchmarks pass their
// own).
type TB interface {
	Helper()
	Fatal(args ...any)
}

// Write creates the image in dir (which must not exist): checkpoint.img
// (random, 64 KiB), pages_meta.img (small), pages.img, and an empty file.
func (im Image) Write(t TB, dir string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(im.Seed, 1))
	pool := rand.New(rand.NewPCG(im.Pool, 2))
	pages := make([][]byte, 512)
	for i := range pages {
		pages[i] = make([]byte, 4096)
		for j := 0; j < 4096; j += 8 {
			v := pool.Uint64()
			for k := 0; k < 8; k++ {
				pages[i][j+k] = byte(v >> (8 * k))
			}
		}
	}
	var body bytes.Buffer
	// Runs of consecutive pool pages, as a memory file holds runs of an
	// address space, starting where the seed says.
	start := r.IntN(len(pages))
	for i := 0; i < im.Pages; i++ {
		if im.ZeroRun > 0 && i == im.Pages/2 {
			body.Write(make([]byte, 4096*im.ZeroRun))
		}
		if r.IntN(64) == 0 {
			start = r.IntN(len(pages)) // a jump
		}
		body.Write(pages[(start+i)%len(pages)])
	}
	state := make([]byte, 64<<10)
	for i := range state {
		state[i] = byte(r.Uint32())
	}
	write := func(name string, data []byte, mode fs.FileMode) {
		if err := os.WriteFile(filepath.Join(dir, name), data, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("checkpoint.img", state, 0o644)
	write("pages_meta.img", []byte(fmt.Sprintf("meta of %d pages, seed %d", im.Pages, im.Seed)), 0o600)
	write("pages.img", body.Bytes(), 0o644)
	write("empty.img", nil, 0o640)
}

// Equal fails t unless the directories hold the same file names, bytes and
// permission bits.
func Equal(t testing.TB, want, got string) {
	t.Helper()
	names := func(dir string) []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	wn, gn := names(want), names(got)
	if !slices.Equal(wn, gn) {
		t.Fatalf("files: want %v, got %v", wn, gn)
	}
	for _, n := range wn {
		a, err := os.ReadFile(filepath.Join(want, n))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(got, n))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("%s: %d bytes differ from the original's %d", n, len(b), len(a))
		}
		ai, _ := os.Stat(filepath.Join(want, n))
		bi, _ := os.Stat(filepath.Join(got, n))
		if ai.Mode() != bi.Mode() {
			t.Fatalf("%s: mode %v, want %v", n, bi.Mode(), ai.Mode())
		}
	}
}

// Allocated returns the bytes the file occupies on disk (less than its size
// when it has holes).
func Allocated(t testing.TB, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}
