// Package templates embeds the definitions of the built-in templates: a
// Debian package list per template and the script that builds a rootfs from
// it. A template's rootfs is cached under the hash of those two, so editing
// one triggers a rebuild and nothing else does.
package templates

import "embed"

// FS holds build-rootfs.sh, <template>/packages, <template>/pip (Python
// packages from PyPI, pinned with hashes), <template>/preimport (modules
// the warm image has imported, so the first run_code is instant) and the
// optional <template>/limits (resource defaults of its sandboxes).
//
//go:embed build-rootfs.sh base/packages base/pip base/preimport base/limits
var FS embed.FS
