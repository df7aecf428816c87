package api

import "github.com/cellfork/cellfork/internal/api/apitypes"

// Adapters between the domain's values and the generated wire types
// (apitypes) where Optional and Value do not do.

// stringMap reads a string map whose values may be null: a null value is
// the empty string.
func stringMap(m map[string]*string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = apitypes.Value(v)
	}
	return out
}

// bootMode is the sandbox's bootMode; absent for sandboxes started by an
// older daemon.
func bootMode(mode string) *apitypes.BootMode {
	return apitypes.Optional(apitypes.BootMode(mode))
}
