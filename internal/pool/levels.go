package pool

// Levels reports the start line now: starts holding a slot, starts
// waiting for one, and the bounds on both (for metrics).
func (a *Admission) Levels() (running, waiting, slots, queue int) {
	return len(a.slots), len(a.waiting), cap(a.slots), cap(a.waiting)
}
