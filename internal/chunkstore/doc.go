// Package chunkstore stores directories of image files (gVisor checkpoint
// images: checkpoint.img, pages_meta.img, pages.img and whatever else the
// directory holds) as manifests of content-addressed chunks, in a local
// directory (file://DIR) or an S3-compatible object store
// (s3://bucket/prefix), with a host-local chunk cache. It depends on
// nothing of the daemon: the manager calls Export when it writes an image
// and Import before it restores one elsewhere.
//
// # Chunks
//
// Each file is cut by content-defined chunking (FastCDC, "fastcdc-v1.0.0"
// of github.com/PlakarKorp/go-cdc-chunkers; by default min 8, average 32,
// max 128 KiB). Fixed 64 KiB chunks share almost nothing between a
// template's warm image and a sandbox restored from it, because gVisor
// writes pages.img in memory-file order and a few pages inserted early
// shift the rest by a number of pages that is rarely a multiple of 16;
// content-defined boundaries move with the content (docs/benchmarks.md,
// "Chunk store"). A chunk is named by its BLAKE3-256 hash. A chunk of
// zeros is never stored: the manifest marks it and an import leaves a hole.
//
// # Objects
//
//	chunks/<h[0:2]>/<h>   a chunk's bytes, h its hash in lower-case hex
//	packs/<id>            chunks concatenated (pack files; id the hash of
//	                      their list, below)
//	manifests/<root>      a manifest's canonical encoding, root its hash
//	gc/epoch              rewritten by each collection before it deletes
//	locks/<id>            leases of the store's lock (S3 only)
//
// # Manifest
//
// A manifest is a JSON object in canonical form (fields in the order
// below, no spaces, metadata keys sorted, files sorted by name):
//
//	{"version":1,"hash":"blake3-256",
//	 "chunking":{"alg":"fastcdc-v1.0.0","min":8192,"avg":32768,"max":131072},
//	 "files":[{"name":"checkpoint.img","size":557774,"mode":420,"chunks":"<base64>"}, ...],
//	 "meta":{"k":"v", ...}}
//
// A file's chunks are one standard base64 string of its chunk list in
// order: per chunk, uvarint(size<<1 | zero) followed, unless zero is 1, by
// the chunk's 32-byte hash. The sizes add up to the file's size. A
// manifest's root is the BLAKE3-256 hash of its canonical bytes; Decode
// accepts only canonical bytes, so a root names exactly one manifest.
// Metadata is the caller's (the template artifact, the runsc build).
//
// # Manifests over a base
//
// ExportOver writes a manifest over another, its base (version 2, a
// "base" root after "hash"): each file as runs of the base's chunks
// (file, first chunk, count) and the chunks the base lacks (base.go). A
// suspended sandbox restored from a template's warm image shares all but a
// few per cent of its chunks with it, so its manifest is a few KB instead
// of 80. Reading one reads and verifies its bases (at most maxBaseDepth
// manifests in a chain; an export over a base at the limit is written
// flat), and a collection keeps every base of a manifest it keeps.
// Version 1 manifests are read as before, and Export still writes them
// unless it is given a base: ExportOver names one; with Options.Immutable,
// after ExportBase of a template's warm image, Export writes every image
// that holds one of its files by identity (a base-*.img) over it.
//
// # Pack files
//
// With Options.PackBytes (Open turns it on for s3:// stores), Export
// writes a version 3 manifest: version 1 or 2 (flat, or with a "base")
// plus a "packs" list after "chunking":
//
//	"packs":[{"id":"<hex>","chunks":"<base64>"}, ...]
//
// each the chunks of one pack file, in the order they are concatenated
// there, as a version 1 chunk list (no zero chunks); a chunk's offset is
// the sum of the sizes before it. The pack's id is the BLAKE3-256 hash of
// that list's binary form, and the object packs/<id> holds the chunks: so
// the same chunks in the same order are one pack, and an export that
// failed half-way finds the packs it uploaded when it runs again. Decode
// checks every id against its list and refuses a chunk listed in two
// packs. The export puts every stored chunk its base lacks into packs of
// about PackBytes (at least one chunk each), in the manifest's order, asks
// the store which of those packs it holds (a few HEADs), uploads the
// others, then writes the manifest. It does not ask about chunks one by
// one: a packed chunk is not an object an existence check finds, so with
// packs on, an image shares stored chunks with the manifest it is written
// over (and its bases), not with unrelated images (docs/benchmarks.md,
// "Pack files", measures the bytes this costs). A resolved manifest knows
// where each chunk is: its own packs, then its bases' (a version 2
// manifest over a packed base reads the base's packs too), else
// chunks/<h>. An import with a cache reads the packed chunks it lacks in
// ranged reads (Backend's optional RangeReader; a whole GET otherwise) of
// up to 4 MiB, skipping at most 64 KiB it does not need, verifies each
// chunk and caches it on its own, as if it had been fetched alone (behind
// the import, as every chunk an import fetches: see Cache); without
// a cache each chunk is read from its pack. A pack the backend lacks is
// read as its chunks' own objects if it has those (a peer's handler
// serves chunks, not packs). A collection marks the packs
// its kept manifests list and deletes the others once older than the
// grace period, as it does chunks: a pack goes with the last manifest
// that names it, and a manifest's bases are kept with it. Readers built
// before version 3 refuse such a manifest ("version 3, want 1 or 2",
// ErrCorrupt); stores with and without packs share a backend.
//
// # Reads are verified
//
// Every chunk is hashed when it is read, from the store or from the cache,
// and every manifest against its root: a mismatch is errdefs.ErrCorrupt and
// the bad bytes are never written into an image. A store that does not
// answer is errdefs.ErrUnavailable, after retries with jittered backoff.
//
// # Files cut once
//
// With Options.Immutable, Export remembers the chunks of each file that
// has other names (hard links) by its device, inode, size and modification
// time, and does not cut it again: a snapshot's base-*.img is a hard link
// to a pages file many images share. Import then hard-links such a file,
// still unchanged where it was last seen, instead of assembling it from
// chunks (it trusts it as it trusts what Export read).
//
// # From a peer
//
// Offer cuts an image and encodes its manifest as Export will write it
// (same root) without uploading it, and PeerHandler serves that manifest
// and the image's chunks, read from its files, to other hosts; ImportFrom
// imports from such a peer first (verifying everything as from the store)
// and from the store what the peer does not give (peer.go).
//
// # Writes are ordered
//
// Export uploads only the chunks the store lacks (one batched existence
// check, then 16 uploads in flight; with packs, the packs it lacks, 4 in
// flight), and the manifest last: a crash or a store that goes away
// mid-upload leaves orphan chunks or packs, never a manifest that names a
// missing one. GC removes the orphans after its grace period. Export holds the store's lock shared from its existence check to
// its manifest; GC holds it exclusively while it sweeps, so a chunk that an
// export found present is not deleted under it.
package chunkstore
