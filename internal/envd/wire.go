package envd

// The agent's contract with the daemon, beside the protos: the ports it
// serves inside every sandbox and the body of POST /init, which only the
// daemon may send (it sets the sandbox's identity, environment and limits).

// Ports the agent serves inside every sandbox.
const (
	Port                = 49983 // envd: Connect RPC process and filesystem, /files, /health, /init
	CodeInterpreterPort = 49999 // the code interpreter: /execute, /contexts
)

// InitRequest is POST /init: upstream envd's body plus our fields. The
// daemon sends it at every hand-off of a box to a sandbox.
type InitRequest struct {
	EnvVars        map[string]string `json:"envVars"`
	DefaultUser    string            `json:"defaultUser"`
	DefaultWorkdir string            `json:"defaultWorkdir,omitempty"`
	// Ours: the daemon's upload limit, and the sandbox's process limits
	// (0: leave as they are; they can be lowered, never raised).
	MaxUploadBytes int64 `json:"maxUploadBytes"`
	PidsMax        int64 `json:"pidsMax,omitempty"`
	OpenFiles      int64 `json:"openFiles,omitempty"`
	// CACert (ours) is the daemon's egress CA certificate, PEM, sent when
	// the sandbox's policy has network rules: the agent adds it to the
	// system's trusted certificates, once, and points the processes it
	// starts at them ("": leave the trust as it is). Never a key, never a
	// rule's header value.
	CACert string `json:"caCert,omitempty"`
}
