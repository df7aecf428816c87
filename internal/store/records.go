package store

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/cellfork/cellfork/internal/sandbox"
)

// Records are the store's own structs: what is on disk does not change
// when a domain type does. Each carries its version. Version 0 is what
// daemons before records wrote (the domain structs, untagged), which has
// the same keys: it decodes as version 1. A change that cannot keep the
// keys adds version 2 and its migration here, and a golden record of it
// in testdata/ beside those of every older version (records_test.go reads
// them all, and checks that this release writes its own version's bytes).
const recordVersion = 1

type sandboxRecord struct {
	V            int               `json:"v"`
	ID           string            `json:"ID"`
	Team         string            `json:"Team,omitempty"`
	TemplateID   string            `json:"TemplateID"`
	RuntimeID    string            `json:"RuntimeID"`
	State        string            `json:"State"`
	StartedAt    time.Time         `json:"StartedAt"`
	EndAt        time.Time         `json:"EndAt"`
	Metadata     map[string]string `json:"Metadata"`
	Envs         map[string]string `json:"Envs"`
	CPUCount     int               `json:"CPUCount"`
	MemoryMB     int               `json:"MemoryMB"`
	DiskSizeMB   int               `json:"DiskSizeMB"`
	PidsMax      int               `json:"PidsMax"`
	OpenFiles    int               `json:"OpenFiles"`
	AccessToken  string            `json:"AccessToken"`
	OnTimeout    string            `json:"OnTimeout"`
	AutoResume   bool              `json:"AutoResume"`
	AutoPauseFS  bool              `json:"AutoPauseFiles,omitempty"`
	Rootfs       string            `json:"Rootfs"`
	ParentID     string            `json:"ParentID"`
	BaseSnapshot string            `json:"BaseSnapshot"`
	PausedImage  string            `json:"PausedImage"`
	PausedRoot   string            `json:"PausedRoot,omitempty"` // since paused sandboxes travel
	PauseMode    string            `json:"PauseMode,omitempty"`
	BootMode     string            `json:"BootMode"`
	Network      networkRecord     `json:"Network"`
}

type networkRecord struct {
	AllowInternet      bool     `json:"AllowInternet"`
	AllowOut           []string `json:"AllowOut"`
	DenyOut            []string `json:"DenyOut"`
	DNSServers         []string `json:"DNSServers"`
	AllowPublicTraffic bool     `json:"AllowPublicTraffic"`
	// Since network rules; absent in records of earlier releases.
	Rules           map[string]transformRecord `json:"Rules,omitempty"`
	MaskRequestHost string                     `json:"MaskRequestHost,omitempty"`
}

type transformRecord struct {
	Headers map[string]string `json:"Headers,omitempty"`
}

type snapshotRecord struct {
	V          int               `json:"v"`
	ID         string            `json:"ID"`
	Team       string            `json:"Team,omitempty"`
	Names      []string          `json:"Names"`
	ParentID   string            `json:"ParentID"`
	SandboxID  string            `json:"SandboxID"`
	TemplateID string            `json:"TemplateID"`
	Rootfs     string            `json:"Rootfs"`
	Image      string            `json:"Image"`
	SizeBytes  int64             `json:"SizeBytes"`
	CreatedAt  time.Time         `json:"CreatedAt"`
	Envs       map[string]string `json:"Envs"`
	CPUCount   int               `json:"CPUCount"`
	MemoryMB   int               `json:"MemoryMB"`
	DiskMB     int               `json:"DiskMB"`
	PidsMax    int               `json:"PidsMax"`
	OpenFiles  int               `json:"OpenFiles"`
	Network    networkRecord     `json:"Network"`
	// Since the chunk store; absent in records of earlier releases (and
	// of daemons without a store).
	Upload      string `json:"Upload,omitempty"`
	StoreRoot   string `json:"StoreRoot,omitempty"`
	UploadError string `json:"UploadError,omitempty"`
	// Since snapshots travel between hosts; absent before.
	Runtime string `json:"Runtime,omitempty"`
}

func checkVersion(what string, v int) error {
	if v > recordVersion {
		return fmt.Errorf("%s record of version %d was written by a newer cellfork (this one reads up to %d)", what, v, recordVersion)
	}
	return nil
}

func netRecord(n sandbox.Network) networkRecord {
	r := networkRecord{AllowInternet: n.AllowInternet, AllowOut: n.AllowOut, DenyOut: n.DenyOut, DNSServers: n.DNSServers,
		AllowPublicTraffic: n.AllowPublicTraffic, MaskRequestHost: n.MaskRequestHost}
	if n.Rules != nil {
		r.Rules = make(map[string]transformRecord, len(n.Rules))
		for d, t := range n.Rules {
			r.Rules[d] = transformRecord{Headers: t.Headers}
		}
	}
	return r
}

func (r networkRecord) domain() sandbox.Network {
	n := sandbox.Network{AllowInternet: r.AllowInternet, AllowOut: r.AllowOut, DenyOut: r.DenyOut,
		DNSServers: r.DNSServers, AllowPublicTraffic: r.AllowPublicTraffic, MaskRequestHost: r.MaskRequestHost}
	if r.Rules != nil {
		n.Rules = make(map[string]sandbox.Transform, len(r.Rules))
		for d, t := range r.Rules {
			n.Rules[d] = sandbox.Transform{Headers: t.Headers}
		}
	}
	return n
}

func sandboxToRecord(s *sandbox.Sandbox) *sandboxRecord {
	return &sandboxRecord{
		V: recordVersion, ID: s.ID, Team: s.Team, TemplateID: s.TemplateID, RuntimeID: s.RuntimeID, State: string(s.State),
		StartedAt: s.StartedAt, EndAt: s.EndAt, Metadata: s.Metadata, Envs: s.Envs,
		CPUCount: s.CPUCount, MemoryMB: s.MemoryMB, DiskSizeMB: s.DiskSizeMB, PidsMax: s.PidsMax, OpenFiles: s.OpenFiles,
		AccessToken: s.AccessToken, OnTimeout: s.OnTimeout, AutoResume: s.AutoResume, AutoPauseFS: s.AutoPauseFiles,
		Rootfs: s.Rootfs, ParentID: s.ParentID, BaseSnapshot: s.BaseSnapshot, PausedImage: s.PausedImage, PausedRoot: s.PausedRoot,
		PauseMode: s.PauseMode, BootMode: s.BootMode, Network: netRecord(s.Network),
	}
}

func (r *sandboxRecord) domain() (*sandbox.Sandbox, error) {
	if err := checkVersion("sandbox", r.V); err != nil {
		return nil, err
	}
	return &sandbox.Sandbox{
		ID: r.ID, Team: r.Team, TemplateID: r.TemplateID, RuntimeID: r.RuntimeID, State: sandbox.State(r.State),
		StartedAt: r.StartedAt, EndAt: r.EndAt, Metadata: r.Metadata, Envs: r.Envs,
		CPUCount: r.CPUCount, MemoryMB: r.MemoryMB, DiskSizeMB: r.DiskSizeMB, PidsMax: r.PidsMax, OpenFiles: r.OpenFiles,
		AccessToken: r.AccessToken, OnTimeout: r.OnTimeout, AutoResume: r.AutoResume, AutoPauseFiles: r.AutoPauseFS,
		Rootfs: r.Rootfs, ParentID: r.ParentID, BaseSnapshot: r.BaseSnapshot, PausedImage: r.PausedImage, PausedRoot: r.PausedRoot,
		PauseMode: r.PauseMode, BootMode: r.BootMode, Network: r.Network.domain(),
	}, nil
}

func snapshotToRecord(s *sandbox.Snapshot) *snapshotRecord {
	return &snapshotRecord{
		V: recordVersion, ID: s.ID, Team: s.Team, Names: s.Names, ParentID: s.ParentID, SandboxID: s.SandboxID, TemplateID: s.TemplateID,
		Rootfs: s.Rootfs, Image: s.Image, SizeBytes: s.SizeBytes, CreatedAt: s.CreatedAt, Envs: s.Envs,
		CPUCount: s.CPUCount, MemoryMB: s.MemoryMB, DiskMB: s.DiskMB, PidsMax: s.PidsMax, OpenFiles: s.OpenFiles,
		Network: netRecord(s.Network), Upload: string(s.Upload), StoreRoot: s.StoreRoot, UploadError: s.UploadError,
		Runtime: s.Runtime,
	}
}

func (r *snapshotRecord) domain() (*sandbox.Snapshot, error) {
	if err := checkVersion("snapshot", r.V); err != nil {
		return nil, err
	}
	return &sandbox.Snapshot{
		ID: r.ID, Team: r.Team, Names: r.Names, ParentID: r.ParentID, SandboxID: r.SandboxID, TemplateID: r.TemplateID,
		Rootfs: r.Rootfs, Image: r.Image, SizeBytes: r.SizeBytes, CreatedAt: r.CreatedAt, Envs: r.Envs,
		CPUCount: r.CPUCount, MemoryMB: r.MemoryMB, DiskMB: r.DiskMB, PidsMax: r.PidsMax, OpenFiles: r.OpenFiles,
		Network: r.Network.domain(), Upload: sandbox.UploadState(r.Upload), StoreRoot: r.StoreRoot, UploadError: r.UploadError,
		Runtime: r.Runtime,
	}, nil
}

// EncodeSandbox and DecodeSandbox are the sandbox record as this file keeps
// it, for the cluster's rows: a host resumes a paused sandbox another host
// paused from it.
func EncodeSandbox(sb *sandbox.Sandbox) ([]byte, error) { return json.Marshal(sandboxToRecord(sb)) }

func DecodeSandbox(b []byte) (*sandbox.Sandbox, error) {
	var r sandboxRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decoding sandbox record: %w", err)
	}
	return r.domain()
}

// EncodeSnapshot and DecodeSnapshot are the snapshot record as this file
// keeps it, for the cluster's rows: a host restores another host's
// snapshot from it.
func EncodeSnapshot(sn *sandbox.Snapshot) ([]byte, error) { return json.Marshal(snapshotToRecord(sn)) }

func DecodeSnapshot(b []byte) (*sandbox.Snapshot, error) {
	var r snapshotRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decoding snapshot record: %w", err)
	}
	return r.domain()
}
