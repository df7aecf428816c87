package chunkstore_test

import (
	"testing"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
)

func TestFileBackend(t *testing.T) {
	chunkstoretest.Run(t, func(t *testing.T) chunkstore.Backend {
		b, err := chunkstore.OpenFile(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}
