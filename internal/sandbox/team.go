package sandbox

import "context"

type teamKey struct{}

// WithTeam scopes ctx to team: a cluster host's requests come from a
// gateway on behalf of one team, and see only that team's sandboxes and
// snapshots. A single host's requests carry no team and see everything.
func WithTeam(ctx context.Context, team string) context.Context {
	return context.WithValue(ctx, teamKey{}, team)
}

// TeamOf returns the team ctx is scoped to, if any.
func TeamOf(ctx context.Context) (string, bool) {
	t, ok := ctx.Value(teamKey{}).(string)
	return t, ok
}

// Sees reports whether a request of ctx may see something of team.
func Sees(ctx context.Context, team string) bool {
	t, ok := TeamOf(ctx)
	return !ok || t == team
}
