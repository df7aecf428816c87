// Package envd holds the wire contract of the in-sandbox agent: the envd
// process and filesystem services that the official E2B SDKs call. The Go
// code under process/ and filesystem/ is generated from proto/ and committed;
// `go generate ./internal/envd` regenerates it (CI fails if that changes it).
package envd

//go:generate protoc -I proto --go_out=. --go_opt=module=github.com/cellfork/cellfork/internal/envd --connect-go_out=. --connect-go_opt=module=github.com/cellfork/cellfork/internal/envd process/process.proto filesystem/filesystem.proto
