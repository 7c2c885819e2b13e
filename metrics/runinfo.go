package metrics

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// RunInfo is run.json: what a run was asked to do and on what data. The
// trainer writes it at start; the report reads it.
type RunInfo struct {
	Preset       string   `json:"preset"`
	Params       int64    `json:"params"`
	DModel       int      `json:"d_model"`
	WorldSize    int      `json:"world_size"`
	Hosts        []string `json:"hosts"`
	Device       string   `json:"device"`
	CPUModel     string   `json:"cpu_model,omitempty"` // rank 0's host's CPU
	CPUs         int      `json:"cpus,omitempty"`      // logical CPUs of rank 0's host
	Threads      int      `json:"threads_per_rank"`
	BatchTokens  int      `json:"batch_tokens_per_rank"`
	LRPolicy     string   `json:"lr_policy"`
	LearningRate float64  `json:"learning_rate"`
	Warmup       int      `json:"warmup_steps"`
	MaxSteps     int      `json:"max_steps"`
	LinkGbps     float64  `json:"link_gbps"`
	LinkSource   string   `json:"link_source"` // "flag", "probe", "" (unknown)
	Compression  string   `json:"compression"`
	Dataset      Dataset  `json:"dataset"`
	// Started is when the run's first segment started (unix seconds);
	// each segment logs a "start" record.
	Started       float64 `json:"started"`
	CheckpointDir string  `json:"checkpoint_dir"`
	// Vocab is the vocabulary's size (the embedding's rows).
	Vocab int `json:"vocab,omitempty"`
	// Overlap: the buckets were all-reduced while backward ran (nil: a
	// run from before it was recorded).
	Overlap *bool `json:"overlap,omitempty"`
	// Buckets: the fusion buckets' float32 bytes in the order they leave
	// (the layout the Bucketer cuts with the run's caps).
	Buckets []int `json:"buckets,omitempty"`
	// PowerSGDRank and PowerSGDStartStep: --powersgd-rank and
	// --powersgd-start-step of a run whose Compression is "powersgd" (0:
	// not recorded; the rank is then plan.DefaultPowerSGDRank).
	PowerSGDRank      int `json:"powersgd_rank,omitempty"`
	PowerSGDStartStep int `json:"powersgd_start_step,omitempty"`
}

// Dataset describes the training set.
type Dataset struct {
	Name string `json:"name"`
	// MB is the corpus' size: its files on disk, or, InMemory, the text
	// made in memory.
	MB        float64 `json:"mb"`
	InMemory  bool    `json:"in_memory,omitempty"` // built at start (the synthetic corpus), no file
	Lines     int64   `json:"lines"`
	SrcTokens int64   `json:"src_tokens"`
	TgtTokens int64   `json:"tgt_tokens"`
	Dropped   int64   `json:"dropped"`
}

// WriteRunInfo writes dir/run.json.
func WriteRunInfo(dir string, ri RunInfo) error {
	b, err := json.MarshalIndent(ri, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "run.json"), append(b, '\n'), 0o644)
}

// ReadRunInfo reads dir/run.json.
func ReadRunInfo(dir string) (RunInfo, error) {
	var ri RunInfo
	b, err := os.ReadFile(filepath.Join(dir, "run.json"))
	if err != nil {
		return ri, err
	}
	if err := json.Unmarshal(b, &ri); err != nil {
		return ri, fmt.Errorf("%s: %w", filepath.Join(dir, "run.json"), err)
	}
	return ri, nil
}
