package cleanup

import (
	"slices"
	"testing"
)

// Clean runs the undo steps newest first, once; Release keeps them from
// running and hands them back as one func, which runs them the same way.
func TestCleanup(t *testing.T) {
	var ran []int
	step := func(i int) func() { return func() { ran = append(ran, i) } }

	cu := Make(step(1))
	cu.Add(step(2))
	cu.Add(step(3))
	cu.Clean()
	cu.Clean() // a second Clean runs nothing
	if !slices.Equal(ran, []int{3, 2, 1}) {
		t.Errorf("Clean ran %v, want [3 2 1]", ran)
	}

	ran = nil
	var zero Cleanup // ready to use
	zero.Add(step(1))
	zero.Add(step(2))
	undo := zero.Release()
	zero.Clean()
	if len(ran) != 0 {
		t.Errorf("Clean after Release ran %v", ran)
	}
	undo()
	if !slices.Equal(ran, []int{2, 1}) {
		t.Errorf("the released steps ran %v, want [2 1]", ran)
	}
}
