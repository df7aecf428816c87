package daemon

import (
	"strings"
	"testing"
)

// Store URLs are checked at start, with a message naming the flag.
func TestStoreConfigValidate(t *testing.T) {
	for _, ok := range []string{"", "none", "file:///var/lib/cellfork/store", "s3://bucket", "s3://bucket/some/prefix"} {
		if errs := (StoreConfig{URL: ok}).validate(); len(errs) != 0 {
			t.Errorf("%q refused: %v", ok, errs)
		}
	}
	for _, bad := range []string{"file://relative/dir", "file:///x?y=1", "s3:///prefix", "gs://bucket", "/var/lib/store", "file://host/dir"} {
		errs := (StoreConfig{URL: bad}).validate()
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), "--store") {
			t.Errorf("%q: %v", bad, errs)
		}
	}
	if errs := (StoreConfig{CacheBytes: -1}).validate(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "--store-cache-mb") {
		t.Errorf("negative cache: %v", errs)
	}
}
