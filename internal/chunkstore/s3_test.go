package chunkstore_test

import (
	"context"
	"testing"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
)

func TestS3Backend(t *testing.T) {
	srv := chunkstoretest.StartS3(t)
	chunkstoretest.Run(t, func(t *testing.T) chunkstore.Backend {
		b, err := chunkstore.OpenS3(context.Background(), srv.NewBucket(t), "store/", srv.Config())
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}
