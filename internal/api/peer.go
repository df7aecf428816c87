package api

import (
	"context"
	"net/http"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// Headers with which a gateway names the host that offers the image of
// the snapshot a create starts from (a fork child made on another host
// than its parent's): its address (host:port) and the image's manifest
// root. A cluster host heeds them from gateways only (as HeaderForkOf;
// gateways drop Cellfork-* headers from outside).
const (
	HeaderImagePeer = "Cellfork-Image-Peer"
	HeaderImageRoot = "Cellfork-Image-Root"
)

// withImagePeer returns ctx with the image peer a gateway's create names
// for its snapshot templateID, if it names one.
func withImagePeer(ctx context.Context, r *http.Request, templateID string) context.Context {
	addr, root := r.Header.Get(HeaderImagePeer), r.Header.Get(HeaderImageRoot)
	if addr == "" || root == "" {
		return ctx
	}
	return sandbox.WithImagePeer(ctx, sandbox.ImagePeer{Snapshot: templateID, Root: root, Addr: addr})
}
