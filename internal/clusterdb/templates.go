package clusterdb

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// TemplateBuild is a published build of a team's custom template.
type TemplateBuild struct {
	BuildID    string
	Team       string
	TemplateID string
	Names      []string // the template's names
	Tags       []string // the tags naming this build
	Runtime    string   // the runsc build that made its warm image
	Roots      []string // the chunk store roots it keeps
	Artifact   []byte   // what a host needs to pull it (JSON)
}

// PutTemplateBuild records a published build (again: replaced).
func (db *DB) PutTemplateBuild(ctx context.Context, b TemplateBuild) error {
	_, err := db.pool.Exec(ctx, `INSERT INTO template_builds (build_id, team, template_id, names, tags, runtime, roots, artifact)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (build_id) DO UPDATE SET names = $4, tags = $5, runtime = $6, roots = $7, artifact = $8`,
		b.BuildID, b.Team, b.TemplateID, nonNil(b.Names), nonNil(b.Tags), b.Runtime, nonNil(b.Roots), b.Artifact)
	return unavailable(err)
}

// SyncTemplate sets a template's names and its builds' tags (a nil tag
// list leaves that build's as published: it is still being built) and
// forgets its builds not in builds (all of them when builds is empty: the
// template is gone).
func (db *DB) SyncTemplate(ctx context.Context, team, templateID string, names []string, builds map[string][]string) error {
	return unavailable(pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		keep := make([]string, 0, len(builds))
		for id, tags := range builds {
			keep = append(keep, id)
			if tags == nil {
				continue
			}
			if _, err := tx.Exec(ctx, `UPDATE template_builds SET names = $3, tags = $4 WHERE build_id = $1 AND team = $2`,
				id, team, nonNil(names), tags); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `DELETE FROM template_builds WHERE team = $1 AND template_id = $2 AND NOT (build_id = ANY($3))`,
			team, templateID, keep)
		return err
	}))
}

// FindTemplateBuild returns the build of team's template named name (its
// id or one of its names) that tag names, or its newest build when tag is
// "".
func (db *DB) FindTemplateBuild(ctx context.Context, team, name, tag string) (TemplateBuild, error) {
	var b TemplateBuild
	err := db.pool.QueryRow(ctx, `SELECT build_id, team, template_id, names, tags, runtime, roots, artifact FROM template_builds
		WHERE team = $1 AND (template_id = $2 OR $2 = ANY(names)) AND ($3 = '' OR $3 = ANY(tags))
		ORDER BY created_at DESC LIMIT 1`, team, name, tag).Scan(
		&b.BuildID, &b.Team, &b.TemplateID, &b.Names, &b.Tags, &b.Runtime, &b.Roots, &b.Artifact)
	if errors.Is(err, pgx.ErrNoRows) {
		return b, errdefs.New(errdefs.ErrNotFound, "template %q not found", name)
	}
	return b, unavailable(err)
}

// TemplateBuildByID returns team's published build id.
func (db *DB) TemplateBuildByID(ctx context.Context, team, id string) (TemplateBuild, error) {
	var b TemplateBuild
	err := db.pool.QueryRow(ctx, `SELECT build_id, team, template_id, names, tags, runtime, roots, artifact FROM template_builds
		WHERE team = $1 AND build_id = $2`, team, id).Scan(
		&b.BuildID, &b.Team, &b.TemplateID, &b.Names, &b.Tags, &b.Runtime, &b.Roots, &b.Artifact)
	if errors.Is(err, pgx.ErrNoRows) {
		return b, errdefs.New(errdefs.ErrNotFound, "template build %q not found", id)
	}
	return b, unavailable(err)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// BuiltinRoot returns the root published for a built-in template's
// definition ("" if none yet).
func (db *DB) BuiltinRoot(ctx context.Context, name, definition string) (string, error) {
	return db.builtinRoot(ctx, "builtin_templates", "definition", name, definition)
}

// PublishBuiltin records root for a built-in template's definition unless
// a root is recorded already, and returns the root on record.
func (db *DB) PublishBuiltin(ctx context.Context, name, definition, root string) (string, error) {
	return db.publishBuiltin(ctx, "builtin_templates", "definition", name, definition, root)
}

// WarmImageRoot returns the root of the warm image published for a
// built-in template's warm key ("" if none yet).
func (db *DB) WarmImageRoot(ctx context.Context, name, key string) (string, error) {
	return db.builtinRoot(ctx, "builtin_warm_images", "warm_key", name, key)
}

// PublishWarmImage records root for a built-in template's warm key unless
// a root is recorded already, and returns the root on record.
func (db *DB) PublishWarmImage(ctx context.Context, name, key, root string) (string, error) {
	return db.publishBuiltin(ctx, "builtin_warm_images", "warm_key", name, key, root)
}

// builtinRoot and publishBuiltin read and write table (one of the two
// above, keyed by name and col).
func (db *DB) builtinRoot(ctx context.Context, table, col, name, key string) (string, error) {
	var root string
	err := db.pool.QueryRow(ctx, `SELECT root FROM `+table+` WHERE name = $1 AND `+col+` = $2`, name, key).Scan(&root)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return root, unavailable(err)
}

func (db *DB) publishBuiltin(ctx context.Context, table, col, name, key, root string) (string, error) {
	var got string
	err := db.pool.QueryRow(ctx, `WITH i AS (
			INSERT INTO `+table+` (name, `+col+`, root) VALUES ($1, $2, $3)
			ON CONFLICT (name, `+col+`) DO NOTHING RETURNING root)
		SELECT root FROM i UNION ALL SELECT root FROM `+table+` WHERE name = $1 AND `+col+` = $2`,
		name, key, root).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		// Another host's insert committed after this statement's snapshot.
		if got, err = db.builtinRoot(ctx, table, col, name, key); err == nil && got == "" {
			err = errors.New("a built-in template's record vanished while it was published")
		}
		return got, err
	}
	return got, unavailable(err)
}
