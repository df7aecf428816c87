// Package errdefs is the small set of error classes every layer uses. Errors
// are wrapped with %w and classified with errors.Is; the HTTP status of each
// class is decided in exactly one place (internal/api).
package errdefs

import (
	"errors"
	"fmt"
)

// The error classes. Wrap them: fmt.Errorf("sandbox %s: %w", id, ErrNotFound).
var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnavailable        = errors.New("unavailable")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrLimitReached       = errors.New("limit reached") // a quota, not the machine's capacity
	// ErrCorrupt: stored data failed its integrity check (a chunk or a
	// manifest whose hash does not match its name). Terminal: a retry
	// reads the same bytes.
	ErrCorrupt = errors.New("corrupt data")
)

// userError carries a message meant for the API caller next to its class.
type userError struct {
	class error
	msg   string
}

func (e *userError) Error() string { return e.msg }
func (e *userError) Unwrap() error { return e.class }

// New returns an error of the given class whose message is shown to callers
// as is. Use it for messages about the caller's input or the sandbox's state;
// internal detail belongs in wrapped errors that only reach the log.
func New(class error, format string, args ...any) error {
	return &userError{class: class, msg: fmt.Sprintf(format, args...)}
}

// UserMessage returns the caller-facing message of err: the message of the
// outermost error created with New, or "" if there is none (the caller then
// shows a generic message and logs err).
func UserMessage(err error) string {
	var ue *userError
	if errors.As(err, &ue) {
		return ue.msg
	}
	return ""
}
