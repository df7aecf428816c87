package chunkstore

import (
	"errors"
	"net/http"
	"testing"

	"github.com/minio/minio-go/v7"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// A put that met a concurrent delete of its parent directory (versitygw's
// 409 ExistingObjectIsDirectory) is retried; the other 4xx are not.
func TestS3ErrorClasses(t *testing.T) {
	for _, c := range []struct {
		resp minio.ErrorResponse
		want error
	}{
		{minio.ErrorResponse{Code: "ExistingObjectIsDirectory", StatusCode: http.StatusConflict}, errdefs.ErrUnavailable},
		{minio.ErrorResponse{Code: "NoSuchKey", StatusCode: http.StatusNotFound}, errdefs.ErrNotFound},
		{minio.ErrorResponse{Code: "AccessDenied", StatusCode: http.StatusForbidden}, errdefs.ErrPermissionDenied},
		{minio.ErrorResponse{Code: "SlowDown", StatusCode: http.StatusServiceUnavailable}, errdefs.ErrUnavailable},
	} {
		if err := s3Err("writing", "k", c.resp); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.resp.Code, err, c.want)
		}
	}
	if err := s3Err("writing", "k", minio.ErrorResponse{Code: "InvalidArgument", StatusCode: http.StatusBadRequest}); errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a 400 is retried: %v", err)
	}
}
