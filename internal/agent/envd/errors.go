package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"syscall"

	"connectrpc.com/connect"
)

// kind is the small set of error classes the agent reports. Every error that
// leaves a handler is classified once by classify and then mapped to a
// Connect code (connectError) or an HTTP status (httpStatus); nothing else
// decides status codes.
type kind int

const (
	kindInternal kind = iota
	kindInvalid
	kindNotFound
	kindExists
	kindPrecondition
	kindUnauthenticated
	kindPermission
	kindNoSpace
	kindTooLarge
	kindTimeout
	kindCanceled
)

// classed is an error whose message is meant for the caller, tagged with its
// class.
type classed struct {
	kind kind
	err  error
}

func (e *classed) Error() string { return e.err.Error() }
func (e *classed) Unwrap() error { return e.err }

func newErr(k kind, format string, args ...any) error {
	return &classed{kind: k, err: fmt.Errorf(format, args...)}
}

func invalidf(format string, args ...any) error { return newErr(kindInvalid, format, args...) }
func notFoundf(format string, args ...any) error {
	return newErr(kindNotFound, format, args...)
}
func preconditionf(format string, args ...any) error {
	return newErr(kindPrecondition, format, args...)
}

// classify derives the class of err from the tagged errors above and from
// well-known errors of the standard library and the kernel.
func classify(err error) kind {
	var c *classed
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &c):
		return c.kind
	case errors.As(err, &tooLarge):
		return kindTooLarge
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return kindNoSpace
	case errors.Is(err, os.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return kindNotFound
	case errors.Is(err, os.ErrExist), errors.Is(err, syscall.ENOTEMPTY):
		return kindExists
	case errors.Is(err, os.ErrPermission), errors.Is(err, syscall.EROFS):
		return kindPermission
	case errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.EISDIR):
		return kindInvalid
	case errors.Is(err, syscall.ELOOP), errors.Is(err, syscall.EXDEV), errors.Is(err, syscall.EBUSY):
		return kindPrecondition
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return kindTimeout
	case errors.Is(err, context.Canceled):
		return kindCanceled
	}
	return kindInternal
}

var connectCodes = map[kind]connect.Code{
	kindInternal:        connect.CodeInternal,
	kindInvalid:         connect.CodeInvalidArgument,
	kindNotFound:        connect.CodeNotFound,
	kindExists:          connect.CodeAlreadyExists,
	kindPrecondition:    connect.CodeFailedPrecondition,
	kindUnauthenticated: connect.CodeUnauthenticated,
	kindPermission:      connect.CodePermissionDenied,
	kindNoSpace:         connect.CodeResourceExhausted,
	kindTooLarge:        connect.CodeResourceExhausted,
	kindTimeout:         connect.CodeDeadlineExceeded,
	kindCanceled:        connect.CodeCanceled,
}

var httpStatuses = map[kind]int{
	kindInternal:        http.StatusInternalServerError,
	kindInvalid:         http.StatusBadRequest,
	kindNotFound:        http.StatusNotFound,
	kindExists:          http.StatusConflict,
	kindPrecondition:    http.StatusBadRequest,
	kindUnauthenticated: http.StatusUnauthorized,
	kindPermission:      http.StatusForbidden,
	kindNoSpace:         http.StatusInsufficientStorage,
	kindTooLarge:        http.StatusRequestEntityTooLarge,
	kindTimeout:         http.StatusRequestTimeout,
	kindCanceled:        499,
}

// publicMessage returns the text the caller sees. Internal errors are logged
// with a fresh request id and only the id is returned.
func publicMessage(k kind, op string, err error) string {
	if k != kindInternal {
		return err.Error()
	}
	id := requestID()
	slog.Error("envd request failed", "op", op, "request.id", id, "err", err)
	return "internal error (request id " + id + ")"
}

// connectError converts err into the Connect error the SDK maps to a typed
// exception. op names the RPC for the log line of internal errors.
func connectError(op string, err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	k := classify(err)
	return connect.NewError(connectCodes[k], errors.New(publicMessage(k, op, err)))
}

// httpStatus returns the HTTP status for err.
func httpStatus(err error) int { return httpStatuses[classify(err)] }

// writeError writes the upstream envd error body {"code":<status>,"message":...}.
func writeError(w http.ResponseWriter, op string, err error) {
	k := classify(err)
	writeJSONError(w, httpStatuses[k], publicMessage(k, op, err))
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Disposition")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

func requestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
