package sandbox

import "errors"

// ErrDied marks the not-found error of a sandbox that ended on its own (its
// gVisor sandbox exited: out of memory, say), as opposed to one that never
// existed or was killed: the data plane then says why.
var ErrDied = errors.New("the sandbox died")
