package clusterdb

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// StoreRoots returns the chunk store manifests the cluster's rows name:
// snapshots' images and paused sandboxes' (a collection keeps them).
func (db *DB) StoreRoots(ctx context.Context) ([]string, error) {
	rows, err := db.pool.Query(ctx, `SELECT store_root FROM sandboxes WHERE store_root <> ''
		UNION SELECT store_root FROM snapshots WHERE store_root <> ''
		UNION SELECT unnest(roots) FROM template_builds
		UNION SELECT root FROM builtin_templates
		UNION SELECT root FROM builtin_warm_images`)
	if err != nil {
		return nil, unavailable(err)
	}
	roots, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, unavailable(err)
	}
	return roots, nil
}

// ClaimJob claims this round of a job that one host of the cluster runs
// every so often: true if the job last ran (by any host) at least every
// ago, or never; the claim is the new last run.
func (db *DB) ClaimJob(ctx context.Context, name string, slot int, every time.Duration) (bool, error) {
	var got string
	err := db.pool.QueryRow(ctx, `INSERT INTO jobs (name, holder, ran_at) VALUES ($1, $2, now())
		ON CONFLICT (name) DO UPDATE SET holder = $2, ran_at = now()
		WHERE jobs.ran_at <= now() - $3 * interval '1 millisecond'
		RETURNING name`, name, slot, every.Milliseconds()).Scan(&got)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, unavailable(err)
	}
	return true, nil
}
