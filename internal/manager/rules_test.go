package manager

import (
	"context"
	"testing"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// The egress CA reaches a box's agent when the sandbox's policy has
// network rules, once per box, on every path: create, update, resume from
// memory (rules given while frozen), fork children.
func TestEgressCATrust(t *testing.T) {
	const ca = "-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n"
	e := newEnv(t, func(c *Config) { c.EgressCA = []byte(ca) })
	ctx := context.Background()
	withRules := sandbox.DefaultNetwork
	withRules.Rules = map[string]sandbox.Transform{"api.example.com": {Headers: map[string]string{"Authorization": "Bearer s"}}}
	cas := func(id string) int {
		n := 0
		for _, in := range e.h.Inits(e.mustGet(id).RuntimeID) {
			if in.CACert == ca {
				n++
			} else if in.CACert != "" {
				t.Errorf("%s: init with another caCert %q", id, in.CACert)
			}
		}
		return n
	}

	plain := e.create(sandbox.CreateRequest{})
	if n := cas(plain.ID); n != 0 {
		t.Errorf("a sandbox without rules got the CA %d times", n)
	}
	if err := e.m.UpdateNetwork(ctx, plain.ID, withRules); err != nil {
		t.Fatal(err)
	}
	if err := e.m.UpdateNetwork(ctx, plain.ID, withRules); err != nil {
		t.Fatal(err)
	}
	if n := cas(plain.ID); n != 1 {
		t.Errorf("rules given at runtime: the CA sent %d times, want once", n)
	}

	ruled := e.create(sandbox.CreateRequest{Network: &withRules})
	if n := cas(ruled.ID); n != 1 {
		t.Errorf("created with rules: the CA sent %d times", n)
	}
	res, err := e.m.Fork(ctx, ruled.ID, 1, 0)
	if err != nil || res[0].Err != nil {
		t.Fatal(err, res)
	}
	if n := cas(res[0].Sandbox.ID); n != 1 {
		t.Errorf("fork child of a ruled sandbox: the CA sent %d times", n)
	}

	// Rules given while frozen reach the agent when it resumes.
	frozen := e.create(sandbox.CreateRequest{})
	if err := e.m.Pause(ctx, frozen.ID, sandbox.PauseRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.UpdateNetwork(ctx, frozen.ID, withRules); err != nil {
		t.Fatal(err)
	}
	if n := cas(frozen.ID); n != 0 {
		t.Errorf("a frozen agent was sent the CA")
	}
	if _, _, err := e.m.Connect(ctx, frozen.ID, sandbox.ConnectRequest{}); err != nil {
		t.Fatal(err)
	}
	if n := cas(frozen.ID); n != 1 {
		t.Errorf("resumed with rules: the CA sent %d times", n)
	}
	// The secret itself never goes to an agent.
	for _, id := range []string{plain.ID, ruled.ID, frozen.ID} {
		for _, in := range e.h.Inits(e.mustGet(id).RuntimeID) {
			for k, v := range in.EnvVars {
				if v == "Bearer s" {
					t.Errorf("%s: the rule's header value went to the agent as %s", id, k)
				}
			}
		}
	}
}
