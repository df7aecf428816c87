package apitypes

// The generator renders an optional field as a pointer (nil: the key is
// left out) and a nullable one as a pointer too (nil: null or absent).
// Optional and Value convert to and from the zero-means-absent values the
// daemon and the CLI use.

// Optional returns a pointer to v, or nil (the key left out) when v is its
// type's zero value.
func Optional[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// Value returns *p, or the zero value when p is nil (absent or null).
func Value[T any](p *T) T {
	var v T
	if p != nil {
		v = *p
	}
	return v
}
