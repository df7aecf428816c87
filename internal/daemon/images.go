package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"time"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/snapshots"
)

// StoreConfig is where snapshot images go besides the data directory.
type StoreConfig struct {
	// URL is the chunk store: file:///dir or s3://bucket/prefix ("": a
	// file store in DATA_DIR/store; "none": no store). An s3:// store
	// reads its endpoint and credentials from the AWS_* variables
	// (chunkstore.S3ConfigFromEnv).
	URL string
	// CacheBytes is the budget of the host-local chunk cache of an s3://
	// store, in DATA_DIR/store-cache (0: no cache). A file:// store is on
	// a local disk already and has none.
	CacheBytes int64
}

func (c StoreConfig) validate() []error {
	if c.CacheBytes < 0 {
		return []error{fmt.Errorf("--store-cache-mb must be at least 0")}
	}
	switch c.URL {
	case "", "none":
		return nil
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "file" && u.Scheme != "s3") || (u.Scheme == "s3" && u.Host == "") ||
		(u.Scheme == "file" && (u.Host != "" || u.RawQuery != "" || !filepath.IsAbs(u.Path))) {
		return []error{fmt.Errorf("--store %q: want file:///absolute/dir, s3://bucket/prefix or none", c.URL)}
	}
	return nil
}

// openImages opens the configured chunk store (nil, nil with "none").
func openImages(ctx context.Context, c StoreConfig, dataDir string, log *slog.Logger) (snapshots.ImageStore, string, error) {
	raw := c.URL
	switch raw {
	case "none":
		return nil, "", nil
	case "":
		raw = "file://" + filepath.Join(dataDir, "store")
	}
	// Images are written beside their name and renamed into place, then
	// only read: a snapshot's base-*.img (a hard link to the pages file of
	// the image it was restored from) is cut once, not at every export.
	opts := chunkstore.Options{Immutable: true}
	if u, _ := url.Parse(raw); u != nil && u.Scheme == "s3" && c.CacheBytes > 0 {
		cache, err := chunkstore.OpenCache(filepath.Join(dataDir, "store-cache"), c.CacheBytes)
		if err != nil {
			return nil, "", err
		}
		opts.Cache = cache
	}
	// A store that does not answer is not a reason not to start: uploads
	// retry until it does. One that answers without the bucket is.
	check, cancel := context.WithTimeout(ctx, 3*time.Second)
	s, err := chunkstore.Open(check, raw, opts)
	cancel()
	if errors.Is(err, errdefs.ErrUnavailable) && ctx.Err() == nil {
		log.Warn("the chunk store does not answer; starting without it (uploads and imports retry)", "store", raw, "err", err)
		opts.S3.NoCheck = true
		s, err = chunkstore.Open(ctx, raw, opts)
	}
	if err != nil {
		return nil, "", fmt.Errorf("opening the chunk store: %w", err)
	}
	return chunkImages{s: s, log: log, peers: newPeerClient()}, s.String(), nil
}

// chunkImages is the manager's ImageStore over a chunk store.
type chunkImages struct {
	s     *chunkstore.Store
	log   *slog.Logger
	peers *peerClient // a cluster host's: imports from the host offering an image
}

func (c chunkImages) Export(ctx context.Context, dir string, meta map[string]string) (string, int64, error) {
	st, err := c.s.Export(ctx, dir, meta)
	if err != nil {
		return "", st.TransferredBytes, err
	}
	c.log.Debug("image exported", "dir", dir, "stats", st.String())
	return st.Root.String(), st.TransferredBytes, nil
}

func (c chunkImages) Import(ctx context.Context, root, dir string) (int64, error) {
	h, err := chunkstore.ParseHash(root)
	if err != nil {
		return 0, fmt.Errorf("manifest root %q: %v: %w", root, err, errdefs.ErrCorrupt)
	}
	if p, ok := sandbox.ImagePeerOf(ctx); ok && p.Root == root {
		return c.importFromPeer(ctx, h, dir, p.Addr)
	}
	st, err := c.s.Import(ctx, h, dir)
	if err != nil {
		return st.TransferredBytes, err
	}
	c.log.Debug("image imported", "dir", dir, "stats", st.String())
	return st.TransferredBytes, nil
}

// importFromPeer imports root from the host at addr that offers it, and
// from the store what that host does not give.
func (c chunkImages) importFromPeer(ctx context.Context, root chunkstore.Hash, dir, addr string) (int64, error) {
	peer, err := c.peers.backend(addr)
	if err != nil {
		return 0, err
	}
	st, err := c.s.ImportFrom(ctx, root, dir, peer, 0)
	if err != nil {
		return st.TransferredBytes, err
	}
	c.log.Info("image imported from a peer", "root", root.String(), "peer", addr, "peer_objects", st.Peer, "peer_bytes", st.PeerBytes,
		"store_objects", st.PeerMissed, "peer_error", st.PeerError, "ms", st.Duration.Milliseconds())
	return st.TransferredBytes, nil
}

func (c chunkImages) Delete(ctx context.Context, root string) error {
	h, err := chunkstore.ParseHash(root)
	if err != nil {
		return nil // names nothing the store could hold
	}
	c.log.Debug("deleting a manifest", "root", root)
	return c.s.DeleteManifest(ctx, h)
}

func (c chunkImages) GC(ctx context.Context, live []string, grace time.Duration) (int64, error) {
	roots := make([]chunkstore.Hash, 0, len(live))
	for _, r := range live {
		if h, err := chunkstore.ParseHash(r); err == nil {
			roots = append(roots, h)
		}
	}
	st, err := c.s.GC(ctx, chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return roots, nil }), grace)
	if err != nil {
		return 0, err
	}
	c.log.Debug("chunk store collected", "deleted_manifests", st.DeletedManifests, "deleted_chunks", st.DeletedChunks, "freed_bytes", st.BytesFreed)
	if len(st.Dropped) > 0 {
		c.log.Info("chunk store collection deleted manifests no snapshot or paused sandbox names", "roots", st.Dropped, "live", len(live))
	}
	return st.BytesFreed, nil
}

// Remember notes a template's warm image for imports, and as the base of
// later uploads (NoteBase): a snapshot or paused sandbox of the template
// is then a manifest of a few KB over the warm image's, which the first
// such upload stores (and any upload after a collection dropped it, once
// nothing live was over it).
func (c chunkImages) Remember(ctx context.Context, dir string) error {
	return c.s.NoteBase(ctx, dir, map[string]string{"kind": "warm-image"})
}

// exportBase exports dir now and notes it as a base (ExportBase).
func (c chunkImages) exportBase(ctx context.Context, dir, kind string) (string, error) {
	st, err := c.s.ExportBase(ctx, dir, map[string]string{"kind": kind})
	if err != nil {
		return "", err
	}
	c.log.Debug("image exported as a base", "dir", dir, "stats", st.String())
	return st.Root.String(), nil
}

// Has reports whether the store holds (and can read) the manifest root.
func (c chunkImages) Has(ctx context.Context, root string) (bool, error) {
	h, err := chunkstore.ParseHash(root)
	if err != nil {
		return false, nil
	}
	_, err = c.s.Manifest(ctx, h)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrCorrupt):
		return false, nil // an export writes it again
	}
	return false, err
}
