// Package cleanup registers undo steps for a multi-step operation and runs
// them, newest first, unless the operation succeeded (gVisor's
// pkg/cleanup):
//
//	cu := cleanup.Make(func() { destroy(b) })
//	defer cu.Clean()
//	... more steps, cu.Add(undo) after each ...
//	cu.Release() // success: keep everything
package cleanup

// Cleanup holds undo steps. The zero value is ready to use. Not safe for
// concurrent use.
type Cleanup struct {
	fns []func()
}

// Make returns a Cleanup that runs f unless released.
func Make(f func()) Cleanup {
	return Cleanup{fns: []func(){f}}
}

// Add registers another undo step; it runs before the ones added earlier.
func (c *Cleanup) Add(f func()) {
	c.fns = append(c.fns, f)
}

// Clean runs the undo steps not released, newest first, once.
func (c *Cleanup) Clean() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
}

// Release drops the undo steps: the operation succeeded. It returns them
// as one function, for a caller that may still need to undo later.
func (c *Cleanup) Release() func() {
	fns := c.fns
	c.fns = nil
	return func() {
		for i := len(fns) - 1; i >= 0; i-- {
			fns[i]()
		}
	}
}
