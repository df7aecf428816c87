package envd

import (
	"maps"
	"slices"
	"sync"

	"github.com/cellfork/cellfork/internal/envd/process"
)

// subscriberBuffer is how many data events a slow stream may lag behind
// before it back-pressures the process's output.
const subscriberBuffer = 64

// output fans the data events of one process out to the streams attached
// to it (Start and any number of Connect). Output produced while no stream
// is attached is dropped, as in upstream envd. Safe for concurrent use.
type output struct {
	done chan struct{} // closed by finish, after the last publish

	mu   sync.Mutex
	subs map[*subscriber]struct{}
	end  *process.ProcessEvent_EndEvent
}

// subscriber is one attached stream; only that stream reads events.
type subscriber struct {
	events chan *process.ProcessEvent_DataEvent
	gone   chan struct{}
	once   sync.Once
}

func newOutput() *output {
	return &output{done: make(chan struct{}), subs: map[*subscriber]struct{}{}}
}

func (o *output) subscribe() *subscriber {
	s := &subscriber{
		events: make(chan *process.ProcessEvent_DataEvent, subscriberBuffer),
		gone:   make(chan struct{}),
	}
	o.mu.Lock()
	o.subs[s] = struct{}{}
	o.mu.Unlock()
	return s
}

func (o *output) unsubscribe(s *subscriber) {
	o.mu.Lock()
	delete(o.subs, s)
	o.mu.Unlock()
	s.once.Do(func() { close(s.gone) })
}

// publish delivers ev to every attached stream, waiting for slow ones
// unless they detach.
func (o *output) publish(ev *process.ProcessEvent_DataEvent) {
	o.mu.Lock()
	subs := slices.Collect(maps.Keys(o.subs))
	o.mu.Unlock()
	for _, s := range subs {
		select {
		case s.events <- ev:
		case <-s.gone:
		}
	}
}

// finish records the end event; it must be called after the last publish.
func (o *output) finish(end *process.ProcessEvent_EndEvent) {
	o.mu.Lock()
	o.end = end
	o.mu.Unlock()
	close(o.done)
}

// endEvent returns the end event once done is closed.
func (o *output) endEvent() *process.ProcessEvent_EndEvent {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.end
}
