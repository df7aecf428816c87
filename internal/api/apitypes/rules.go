package apitypes

import (
	"encoding/json"
	"fmt"
)

// NetworkRules is NetworkConfig.Rules (E2B's network rules, by domain).
// A null where the document has none (a domain's list, a rule, a header
// value) is an error when decoding, not an empty value.
type NetworkRules map[string][]NetworkRule

// UnmarshalJSON decodes rules, refusing nulls inside them.
func (r *NetworkRules) UnmarshalJSON(b []byte) error {
	var raw map[string][]*struct {
		Transform *struct {
			Headers map[string]*string `json:"headers"`
		} `json:"transform"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	if raw == nil {
		*r = nil
		return nil
	}
	out := make(NetworkRules, len(raw))
	for domain, rules := range raw {
		if rules == nil {
			return fmt.Errorf("rules: %q: want a list of rules, not null", domain)
		}
		list := make([]NetworkRule, 0, len(rules))
		for _, rule := range rules {
			if rule == nil {
				return fmt.Errorf("rules: %q: a rule is null", domain)
			}
			var nr NetworkRule
			if rule.Transform != nil {
				nr.Transform = &NetworkTransform{}
				if rule.Transform.Headers != nil {
					nr.Transform.Headers = make(map[string]string, len(rule.Transform.Headers))
				}
				for name, v := range rule.Transform.Headers {
					if v == nil {
						return fmt.Errorf("rules: %q: header %q: want a string value, not null", domain, name)
					}
					nr.Transform.Headers[name] = *v
				}
			}
			list = append(list, nr)
		}
		out[domain] = list
	}
	*r = out
	return nil
}
