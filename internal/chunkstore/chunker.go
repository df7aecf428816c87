package chunkstore

import (
	"bufio"
	"fmt"
	"io"

	cdc "github.com/PlakarKorp/go-cdc-chunkers"
	_ "github.com/PlakarKorp/go-cdc-chunkers/chunkers/fastcdc" // registers "fastcdc-v1.0.0"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// The chunkings Export knows. Import reads any manifest: the chunk list
// alone says where each chunk goes.
const (
	// AlgFastCDC is FastCDC as go-cdc-chunkers names its stable version:
	// the name pins the cut points, so exports by later builds still share
	// chunks with earlier ones.
	AlgFastCDC = "fastcdc-v1.0.0"
	// AlgFixed cuts every Avg bytes (Min and Max equal Avg).
	AlgFixed = "fixed"
)

// DefaultChunking is FastCDC with min 8, average 32, max 128 KiB: of the
// settings measured on real gVisor images it is the smallest average that
// keeps per-chunk costs low while >= 80% of a spilled sandbox's chunks are
// already in its template's warm image (docs/benchmarks.md, "Chunk store").
var DefaultChunking = Chunking{Alg: AlgFastCDC, Min: 8 << 10, Avg: 32 << 10, Max: 128 << 10}

// FixedChunking cuts every size bytes.
func FixedChunking(size int) Chunking {
	return Chunking{Alg: AlgFixed, Min: size, Avg: size, Max: size}
}

func (c Chunking) validate() error {
	switch c.Alg {
	case AlgFixed:
		if c.Avg > 0 && c.Avg <= maxChunkSize && c.Min == c.Avg && c.Max == c.Avg {
			return nil
		}
	case AlgFastCDC:
		pow2 := c.Avg&(c.Avg-1) == 0
		if 64 <= c.Min && c.Min < c.Avg && c.Avg < c.Max && c.Max <= maxChunkSize && pow2 {
			return nil
		}
	}
	return errdefs.New(errdefs.ErrInvalidArgument, "chunking %+v: want %s (64 <= min < avg < max <= %d, avg a power of two) or %s (min = avg = max)", c, AlgFastCDC, maxChunkSize, AlgFixed)
}

// Split cuts r into chunks as Export does and calls fn with each, in
// order, with its offset. data is only valid during the call.
func (c Chunking) Split(r io.Reader, fn func(off int64, data []byte) error) error {
	var off int64
	if c.Alg == AlgFixed {
		buf := make([]byte, c.Avg)
		br := bufio.NewReaderSize(r, 1<<20)
		for {
			n, err := io.ReadFull(br, buf)
			if n > 0 {
				if ferr := fn(off, buf[:n]); ferr != nil {
					return ferr
				}
				off += int64(n)
			}
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return nil
			}
			if err != nil {
				return err
			}
		}
	}
	ch, err := cdc.NewChunker(c.Alg, r, &cdc.ChunkerOpts{MinSize: c.Min, NormalSize: c.Avg, MaxSize: c.Max})
	if err != nil {
		return fmt.Errorf("chunker %s: %w", c.Alg, err)
	}
	for {
		data, err := ch.Next()
		if len(data) > 0 {
			if ferr := fn(off, data); ferr != nil {
				return ferr
			}
			off += int64(len(data))
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
