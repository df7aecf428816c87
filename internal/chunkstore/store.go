package chunkstore

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Options configure a Store. The zero value is usable.
type Options struct {
	// Cache is the host-local chunk cache; nil for none (a file:// store
	// on the same disk needs none).
	Cache *Cache
	// Chunking is how Export cuts files; zero for DefaultChunking.
	Chunking Chunking
	// Parallel is how many chunk transfers run at once; 0 for 16.
	Parallel int
	// Retry is how calls to a store that does not answer are retried; zero
	// for DefaultRetry.
	Retry Retry
	// Locker replaces the backend's own lock (the cluster's PostgreSQL
	// advisory lock).
	Locker Locker
	// Progress, if set, is called as an export or import moves on (from
	// several goroutines, so it must be safe for concurrent use and quick).
	Progress func(Progress)
	// S3 configures s3:// URLs; see S3Config.
	S3 S3Config
	// LinkFiles keeps each file an import assembles (of 1 MiB or more) in
	// the cache as a hard link, and imports of a file the cache holds
	// whole hard-link it instead of assembling it: no copy and no hashing,
	// so it trusts that file as verified when it was assembled. Image
	// files must then never be written after an import (runsc opens them
	// read-only), and the cache must be on the images' filesystem.
	LinkFiles bool
	// Immutable promises that a file is never written once an export may
	// read it (gVisor images are written beside their name and renamed
	// into place, then only read). Export then remembers the chunks of
	// each file with other names (hard links) by its device, inode, size
	// and modification time, and does not read or hash it again: a
	// base-*.img that every snapshot of a template holds as a hard link to
	// the same pages file is cut once per process. (Chunks it uploads are
	// still read and hashed again.) And Import hard-links a file of 1 MiB
	// or more that Export cut (its bytes, by size, mode and chunk list)
	// and that is still unchanged where it was last seen, instead of
	// assembling it: an image whose base this host holds imports as what
	// it changed, its base linked as the runtime itself links it.
	Immutable bool
	// PackBytes turns pack files on (pack.go): an export writes the chunks
	// the store lacks into pack objects of about this many bytes, listed
	// in a version 3 manifest, and a cold import reads them with ranged
	// reads of up to 4 MiB instead of one request per chunk. 0 leaves
	// them off, except that Open turns them on (DefaultPackBytes) for
	// s3:// stores, where each request costs (a file:// store reads a
	// chunk with one open and read); negative turns them off. With packs
	// on, an export does not ask the store which chunks it has: it
	// reuses its base's chunks and packs the rest, so a chunk that
	// another image's pack holds is stored again (docs/benchmarks.md,
	// "Pack files", measures what that costs).
	PackBytes int
}

// Progress is how far one Export or Import is, in bytes of the phase over
// the whole image: export "chunk" (the image's files), "upload" (the
// chunks the store lacks); import "fetch" (the chunks the cache lacks;
// with a cache only) and "assemble" (the stored chunks it writes: not zero
// chunks, not linked files). Done never passes Total.
type Progress struct {
	Op    string // "export" or "import"
	Phase string
	Done  int64 // bytes of the phase done
	Total int64 // bytes of the phase in all
}

// Store exports image directories into a Backend and imports them back.
// Safe for concurrent use.
type Store struct {
	b        Backend
	locker   Locker
	cache    *Cache
	chunking Chunking
	parallel int
	progress func(Progress)
	link     bool
	pack     int // pack size; 0 for no packs

	// Chunks this store saw in the backend (found or uploaded) since the
	// last collection, known by the collection epoch it read: exports skip
	// asking for them. Any GC changes the epoch (before it deletes), and
	// exports read it holding the store lock, so a set of a past epoch is
	// never trusted.
	knownMu    sync.Mutex
	known      map[Hash]struct{}
	knownEpoch string

	// With Options.Immutable: files cut before, by identity (memo.go).
	immutable  bool
	memoMu     sync.Mutex
	memo       map[fileID]remembered
	memoByKey  map[string]fileID // fileKey of each remembered file
	memoChunks int               // in memo

	// Images served to peers (Offer, PeerHandler), by root.
	offersMu sync.Mutex
	offers   map[Hash]*offer // guarded by offersMu

	// Flat manifests read as bases, decoded (baseManifest), by root, most
	// recently used last: never changed once decoded, so shared.
	basesMu sync.Mutex
	bases   []keptBase // guarded by basesMu; at most maxBases
}

type keptBase struct {
	root Hash
	m    *Manifest
}

// maxBases is how many base manifests a store keeps decoded.
const maxBases = 8

// maxKnown bounds the known set (32 bytes a chunk and the map's overhead):
// past it, the set starts afresh.
const maxKnown = 1 << 20

// epochKey is the object a collection rewrites before it deletes anything.
const epochKey = "gc/epoch"

// knownSince returns which of hashes are known present, after reading the
// collection epoch (the caller holds the store lock shared).
func (s *Store) knownSince(ctx context.Context, hashes []Hash) ([]bool, error) {
	epoch, err := s.b.Get(ctx, epochKey)
	if err != nil && !isNotFound(err) {
		return nil, fmt.Errorf("reading the collection epoch: %w", err)
	}
	s.knownMu.Lock()
	defer s.knownMu.Unlock()
	if s.known == nil || string(epoch) != s.knownEpoch || len(s.known) > maxKnown {
		s.known, s.knownEpoch = make(map[Hash]struct{}), string(epoch)
	}
	out := make([]bool, len(hashes))
	for i, h := range hashes {
		_, out[i] = s.known[h]
	}
	return out, nil
}

// remember adds hashes seen in the backend to the known set, if the epoch
// is still the one they were seen in.
func (s *Store) remember(epoch string, hashes []Hash) {
	s.knownMu.Lock()
	defer s.knownMu.Unlock()
	if epoch != s.knownEpoch || s.known == nil {
		return
	}
	for _, h := range hashes {
		s.known[h] = struct{}{}
	}
}

// Open opens the store a URL names: file:///abs/dir or s3://bucket/prefix.
func Open(ctx context.Context, rawURL string, opts Options) (*Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "chunk store URL %q: %v", rawURL, err)
	}
	var b Backend
	switch u.Scheme {
	case "file":
		if u.Host != "" || u.RawQuery != "" {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "chunk store URL %q: want file:///absolute/dir", rawURL)
		}
		b, err = OpenFile(u.Path)
	case "s3":
		b, err = OpenS3(ctx, u.Host, strings.Trim(u.Path, "/"), opts.S3)
		if opts.PackBytes == 0 {
			opts.PackBytes = DefaultPackBytes
		}
	default:
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "chunk store URL %q: want file:///dir or s3://bucket/prefix", rawURL)
	}
	if err != nil {
		return nil, err
	}
	return New(b, opts)
}

// New returns a Store over b.
func New(b Backend, opts Options) (*Store, error) {
	s := &Store{b: b, locker: opts.Locker, cache: opts.Cache, chunking: opts.Chunking, parallel: opts.Parallel, progress: opts.Progress, link: opts.LinkFiles && opts.Cache != nil, immutable: opts.Immutable}
	if s.chunking == (Chunking{}) {
		s.chunking = DefaultChunking
	}
	if err := s.chunking.validate(); err != nil {
		return nil, err
	}
	if s.parallel <= 0 {
		s.parallel = 16
	}
	if opts.PackBytes > maxPackBytes {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "pack size %d: at most %d", opts.PackBytes, maxPackBytes)
	}
	s.pack = max(opts.PackBytes, 0)
	r := opts.Retry
	if r == (Retry{}) {
		r = DefaultRetry
	}
	s.b = retrying{b, r}
	if s.locker == nil {
		s.locker = b
	}
	return s, nil
}

// Backend returns the store's backend (with retries).
func (s *Store) Backend() Backend { return s.b }

func (s *Store) String() string { return s.b.String() }

// Stats describe one Export or Import.
type Stats struct {
	Root Hash
	// Export: the base the manifest was written over (zero: none, or the
	// base asked for was not in the store), and the manifest's size.
	Base          Hash
	ManifestBytes int
	Files         int
	Bytes         int64 // the image's size
	Chunks        int   // chunks in the manifest, zero chunks included
	ZeroChunks    int
	Distinct      int // distinct stored chunks
	// Export: distinct chunks the store already had. Import: distinct
	// chunks found (and verified) in the cache.
	Present int
	// Export: distinct chunks whose presence it asked the store about (the
	// others it had seen there since the last collection).
	Asked int
	// Export: files whose chunks it remembered (Options.Immutable) instead
	// of reading them.
	Reused int
	// Chunks uploaded (export) or downloaded (import), and their bytes.
	Transferred      int
	TransferredBytes int64
	// Export: the packs its manifest lists (uploaded or found stored).
	// Import: the ranged reads of packs it made.
	Packs int
	// Import: cached chunks that failed verification (dropped, refetched).
	CacheCorrupt int
	// Import: files hard-linked whole from the cache (Options.LinkFiles)
	// or from where Export last saw them (Options.Immutable).
	LinkedFiles int
	// ImportFrom: objects (manifests and chunks) read from the peer, their
	// bytes, those read from the store instead, and why the peer was no
	// longer asked ("" if it was to the end).
	Peer       int
	PeerBytes  int64
	PeerMissed int
	PeerError  string
	Phases     []Phase
	Duration   time.Duration
}

// Phase is one step's duration, as also recorded on the context's
// timing.Recorder (Server-Timing) under Name.
type Phase struct {
	Name string
	Dur  time.Duration
}

func (st *Stats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "root %s: %d files, %d bytes, %d chunks (%d zero, %d distinct, %d present, %d transferred, %d bytes)",
		st.Root, st.Files, st.Bytes, st.Chunks, st.ZeroChunks, st.Distinct, st.Present, st.Transferred, st.TransferredBytes)
	if st.Packs > 0 {
		fmt.Fprintf(&b, ", %d packs", st.Packs)
	}
	if st.Reused > 0 {
		fmt.Fprintf(&b, ", %d files remembered", st.Reused)
	}
	if st.Peer > 0 || st.PeerMissed > 0 {
		fmt.Fprintf(&b, ", %d objects (%d bytes) from the peer, %d from the store", st.Peer, st.PeerBytes, st.PeerMissed)
	}
	for _, p := range st.Phases {
		fmt.Fprintf(&b, " %s=%.1fms", p.Name, float64(p.Dur.Microseconds())/1000)
	}
	return b.String()
}

func (s *Store) report(op, phase string, done, total int64) {
	if s.progress != nil {
		s.progress(Progress{Op: op, Phase: phase, Done: done, Total: total})
	}
}

// Manifest reads and verifies the manifest root names, from the cache if
// it holds it, and resolves it over its bases (read and verified too).
func (s *Store) Manifest(ctx context.Context, root Hash) (*Manifest, error) {
	return s.manifest(ctx, s.b, root, 0)
}

// manifest is Manifest read from b (the store's backend, or a peer's
// before it) for a manifest depth manifests above the one asked for (its
// bases are read with depth+1).
func (s *Store) manifest(ctx context.Context, b Backend, root Hash, depth int) (*Manifest, error) {
	m, err := s.readManifest(ctx, b, root)
	if err != nil || m.ops == nil {
		return m, err
	}
	if depth+1 >= maxBaseDepth {
		return nil, fmt.Errorf("manifest %s: more than %d manifests over one another: %w", root, maxBaseDepth, errdefs.ErrCorrupt)
	}
	base, err := s.baseManifest(ctx, b, m.Base, depth+1)
	if err != nil {
		return nil, fmt.Errorf("reading the base of manifest %s: %w", root, err)
	}
	if err := m.resolve(base); err != nil {
		return nil, fmt.Errorf("manifest %s over %s: %v: %w", root, m.Base, err, errdefs.ErrCorrupt)
	}
	return m, nil
}

// baseManifest is manifest for a base. A flat one (a template's warm
// image, which every paused sandbox's manifest is written over: 1,700
// chunks, 161 KB with packs) is decoded and resolved the first time it is
// read as a base or imported (keepBase), then kept (up to maxBases):
// later its bytes are still read and verified, as every manifest's, but
// not decoded again.
func (s *Store) baseManifest(ctx context.Context, b Backend, root Hash, depth int) (*Manifest, error) {
	s.basesMu.Lock()
	var kept *Manifest
	for i, k := range s.bases {
		if k.root == root {
			s.bases = append(append(s.bases[:i:i], s.bases[i+1:]...), k)
			kept = k.m
			break
		}
	}
	s.basesMu.Unlock()
	if kept != nil {
		if _, err := s.manifestBytes(ctx, b, root); err != nil {
			return nil, err
		}
		return kept, nil
	}
	m, err := s.manifest(ctx, b, root, depth)
	if err != nil {
		return nil, err
	}
	return s.keepBase(root, m), nil
}

// keepBase keeps m, the manifest root names, decoded for baseManifest if
// it is flat (a template's warm image that an import pulled, or a base
// read), and returns the one kept. m must not change afterwards.
func (s *Store) keepBase(root Hash, m *Manifest) *Manifest {
	if m.Base != (Hash{}) {
		return m
	}
	s.basesMu.Lock()
	defer s.basesMu.Unlock()
	for _, k := range s.bases {
		if k.root == root {
			return k.m
		}
	}
	if len(s.bases) == maxBases {
		s.bases = s.bases[1:]
	}
	s.bases = append(s.bases, keptBase{root, m})
	return m
}

// readManifest reads and verifies one manifest from the cache or b, not
// resolved.
func (s *Store) readManifest(ctx context.Context, b Backend, root Hash) (*Manifest, error) {
	body, err := s.manifestBytes(ctx, b, root)
	if err != nil {
		return nil, err
	}
	return Decode(body, root)
}

// manifestBytes reads a manifest's bytes from the cache or b, verified
// (a bad cached copy is dropped and read again from b), and caches them.
func (s *Store) manifestBytes(ctx context.Context, b Backend, root Hash) ([]byte, error) {
	key := ManifestKey(root)
	if s.cache != nil {
		if cached, ok := s.cache.read(key, nil); ok {
			if Sum(cached) == root {
				return cached, nil
			}
			s.cache.remove(key)
		}
	}
	body, err := b.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("reading manifest %s from %s: %w", root, b, err)
	}
	if err := verify("manifest", root, body); err != nil {
		return nil, err
	}
	if s.cache != nil {
		s.cache.put(key, body)
	}
	return body, nil
}

// HasManifest reports whether the store holds the manifest root names.
func (s *Store) HasManifest(ctx context.Context, root Hash) (bool, error) {
	found, err := s.b.Has(ctx, []string{ManifestKey(root)})
	if err != nil {
		return false, err
	}
	return found[0], nil
}

// DeleteManifest removes a manifest. Its chunks stay until GC finds that no
// live manifest names them.
func (s *Store) DeleteManifest(ctx context.Context, root Hash) error {
	return s.b.Delete(ctx, ManifestKey(root))
}
