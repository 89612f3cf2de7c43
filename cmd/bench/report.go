package main

import (
	"encoding/json"
	"fmt"
	"os"
)

// Result is one kernel on one shape, launched alone with the L2 flushed.
type Result struct {
	Kernel  string  `json:"kernel"`
	Model   string  `json:"model"`
	Format  string  `json:"format"`
	Phase   string  `json:"phase"`
	Batch   int     `json:"batch"`
	MTP     int     `json:"mtp"`
	Tokens  int     `json:"tokens"`
	Us      float64 `json:"us"`
	Bytes   int64   `json:"bytes"`
	GBps    float64 `json:"gbps"`
	PctCopy float64 `json:"pct_copy"`
	// CopyUs is a copy of the same bytes timed the same way, and
	// PctSameSize our rate as a share of its rate.
	CopyUs      float64 `json:"copy_us"`
	PctSameSize float64 `json:"pct_same_size_copy"`
	Variant     string  `json:"variant,omitempty"`
}

// Iteration is a whole decode step: every layer's KV and Q launches.
type Iteration struct {
	Model   string  `json:"model"`
	Batch   int     `json:"batch"`
	MTP     int     `json:"mtp"`
	Layers  int     `json:"layers"`
	EagerUs float64 `json:"eager_us"`
	GraphUs float64 `json:"graph_us"`
	// HeaderGraphUs is the graph of launches that read the batch's counts
	// from the device header (mla.FromHeader): the engine's decode graph.
	HeaderGraphUs float64 `json:"header_graph_us"`
	// LongGraphUs is the header-driven iteration captured twice in one
	// graph, per iteration, as in a server's whole-model decode graph: a
	// decode grid of more than a wave ran 5% slower there than in one
	// short graph launched again right after itself until its warps asked
	// L2 for their rows first (bench/results/2026-12-01-h200-f and -h).
	LongGraphUs float64 `json:"long_graph_us"`
	Speedup     float64 `json:"graph_speedup"`
	// HostUs is the eager iteration's wall time on the host: the events,
	// the launches and the wait for the device, so never below EagerUs.
	HostUs float64 `json:"eager_host_us"`
	// IssueUs is the host time of issuing the eager iteration's launches
	// alone (every layer's mla.RunLayer), the host cost per layer that
	// decides whether the device waits for the host.
	IssueUs float64 `json:"eager_issue_us"`
	Variant string  `json:"variant,omitempty"`
}

// LayerGraph is one shape the way a server's decode loop sees it: every
// layer with its own inputs, outputs, weight and cache pool, all layers
// captured in one CUDA graph, the L2 flushed before each replay.
type LayerGraph struct {
	Model       string `json:"model"`
	Phase       string `json:"phase"`
	Batch       int    `json:"batch"`
	MTP         int    `json:"mtp"`
	Tokens      int    `json:"tokens"`
	Rows        int    `json:"rows"` // rows the launches cover: the engine's graph bucket for generation
	QFormat     string `json:"q_format"`
	CacheFormat string `json:"cache_format"`
	Layers      int    `json:"layers"` // layer launches in the graph
	Sets        int    `json:"sets"`   // distinct input sets the layers cycle over (== Layers unless memory-bound)
	// TotalUs is the median replay; UsPerLayer = TotalUs / Layers.
	TotalUs    float64 `json:"total_us"`
	UsPerLayer float64 `json:"us_per_layer"`
	// ColdLayerUs is one layer launched alone with the L2 flushed.
	ColdLayerUs float64 `json:"cold_layer_us"`
	LayerBytes  int64   `json:"layer_bytes"`
	// CopyUsPerLayer is the layer's bytes at the measured copy rate: the
	// floor no kernel beats; PctCopy = 100 * CopyUsPerLayer / UsPerLayer.
	CopyUsPerLayer float64 `json:"copy_us_per_layer"`
	PctCopy        float64 `json:"pct_copy"`
}

// KernelGraph is one prologue kernel alone (the KV or the Q kernel of
// every layer, nothing else) in the many-layer graph of LayerGraph: the
// setting of the engines' per-kernel figures that issue 11 quotes.
type KernelGraph struct {
	Kernel string `json:"kernel"` // "kv" or "q"
	Model  string `json:"model"`
	Phase  string `json:"phase"`
	Batch  int    `json:"batch"`
	MTP    int    `json:"mtp"`
	Tokens int    `json:"tokens"`
	Rows   int    `json:"rows"`
	Format string `json:"format"` // the cache format (kv) or the Q format (q)
	Layers int    `json:"layers"`
	// TotalUs is the median replay; UsPerLayer = TotalUs / Layers.
	TotalUs    float64 `json:"total_us"`
	UsPerLayer float64 `json:"us_per_layer"`
	Bytes      int64   `json:"bytes"` // one launch's bytes read and written
	// CopyUs is Bytes at the measured copy rate; PctCopy = 100 * CopyUs / UsPerLayer.
	CopyUs  float64 `json:"copy_us"`
	PctCopy float64 `json:"pct_copy"`
}

// ChainCompResult is one chain shape with the KV compressor of a ratio in
// every layer.
type ChainCompResult struct {
	Ratio int `json:"ratio"`
	// UsPerLayer: the chain (KV forked) with the compressor on the side
	// stream; AddedUs and AddedPct: what it adds to the chain without it.
	// AloneUsPerLayer: the compressor alone (projection GEMM and step).
	UsPerLayer      float64 `json:"us_per_layer"`
	AddedUs         float64 `json:"added_us"`
	AddedPct        float64 `json:"added_pct"`
	AloneUsPerLayer float64 `json:"alone_us_per_layer"`
	GEMMUsPerLayer  float64 `json:"gemm_us_per_layer"` // the projection GEMM alone
	WeightBytes     int64   `json:"weight_bytes"`      // the projection weights, [wkv; wgate] bf16
	// LateUsPerLayer: the same layer with the compressor forked after the
	// [wq_a; wkv] GEMM instead of before act_quant, so that GEMM has the
	// device to itself.
	LateUsPerLayer float64 `json:"late_us_per_layer"`
}

// ChainResult is one shape of the whole chain from hidden states (DESIGN.md
// section 7): every layer with its own weights (and, memory allowing, its
// own hidden states, activations, outputs and cache pool) in one CUDA
// graph, the L2 flushed before each replay (median); per layer = total /
// layers. The same graph is timed four ways to show what the KV prologue
// costs: forked onto the second stream (the engine's way, UsPerLayer),
// left out, in order on the main stream, and alone.
type ChainResult struct {
	Model  string `json:"model"`
	Phase  string `json:"phase"`
	Batch  int    `json:"batch"`
	MTP    int    `json:"mtp"`
	Tokens int    `json:"tokens"`
	Rows   int    `json:"rows"`   // rows every step runs over: the graph bucket for generation
	Layers int    `json:"layers"` // layers in the graph, each with its own weights
	Sets   int    `json:"sets"`   // distinct activation sets the layers cycle over
	// FusedGEMM and WqBGEMM are the GEMM implementation that ran: "own"
	// (the weight-streaming kernel), "wgmma" (the sm_90a kernel) or
	// "cublaslt".
	FusedGEMM string  `json:"fused_gemm"`
	WqBGEMM   string  `json:"wq_b_gemm"`
	TotalUs   float64 `json:"total_us"`
	// UsPerLayer: the KV prologue forked. NoKVUsPerLayer: without it.
	// SerialKVUsPerLayer: in order on the main stream. KVAloneUsPerLayer:
	// only the KV prologue. KVExposedUs = UsPerLayer - NoKVUsPerLayer, what
	// the fork leaves of the KV work (about 0 when it is hidden).
	UsPerLayer         float64 `json:"us_per_layer"`
	NoKVUsPerLayer     float64 `json:"no_kv_us_per_layer"`
	SerialKVUsPerLayer float64 `json:"serial_kv_us_per_layer"`
	KVAloneUsPerLayer  float64 `json:"kv_alone_us_per_layer"`
	KVExposedUs        float64 `json:"kv_exposed_us"`
	// Compressor: the chain with every layer's KV compressor of a ratio
	// (--chain-compress).
	Compressor []ChainCompResult `json:"compressor,omitempty"`
	// LeaveOutUs: the chain (KV forked, no compressor) with one step left
	// out, per layer, keyed by the step: what each step costs inside the
	// graph, where programmatic launch overlaps its neighbours (a step
	// left out leaves its output as the previous replay wrote it).
	LeaveOutUs map[string]float64 `json:"leave_out_us,omitempty"`
	// WeightBytes is a layer's GEMM weights with their scales and the q_norm
	// weight; WeightGBps = WeightBytes / UsPerLayer. WeightFloorUs is the
	// weights at the measured copy rate (the weight-streaming floor), and
	// PctWeightFloor = 100 * WeightFloorUs / UsPerLayer.
	WeightBytes    int64   `json:"weight_bytes"`
	WeightGBps     float64 `json:"weight_gbps"`
	WeightFloorUs  float64 `json:"weight_floor_us"`
	PctWeightFloor float64 `json:"pct_weight_floor"`
	// IOBytes is the least the layer moves besides the weights (hidden rows
	// in, FP8 Q and cache rows out); FloorUs is weights + I/O at the copy
	// rate, the floor for context batches.
	IOBytes int64   `json:"io_bytes"`
	FloorUs float64 `json:"floor_us"`
}

// HostCost is the engine's own host time per generation iteration.
type HostCost struct {
	Backend string `json:"backend"`
	Model   string `json:"model"`
	Batch   int    `json:"batch"`
	MTP     int    `json:"mtp"`
	Tokens  int    `json:"tokens"`
	// Graphs: the engine replayed CUDA graphs (Begin padded the batch).
	Graphs bool `json:"graphs"`
	// BeginUs is Begin's wall time: plan, page reservation, metadata build
	// and upload. EndUs is End's, on an idle device: the wait, the commit.
	BeginUs float64 `json:"begin_us"`
	EndUs   float64 `json:"end_us"`
	TotalUs float64 `json:"total_us"` // median of Begin + End
	Reps    int     `json:"reps"`
}

// StridedCopy reads 1 KiB of every StrideBytes and writes it densely.
type StridedCopy struct {
	Model       string  `json:"model"`
	Rows        int     `json:"rows"`
	StrideBytes int     `json:"stride_bytes"`
	Us          float64 `json:"us"`
	GBps        float64 `json:"gbps"`
}

// Report is the JSON output.
type Report struct {
	Device    string      `json:"device"`
	Date      string      `json:"date"`
	Command   string      `json:"command"`
	CopyGBps  float64     `json:"copy_gbps"`
	Results   []Result    `json:"results"`
	Iteration []Iteration `json:"iteration"`
	// IterationVariants are the decode iteration under the --variants.
	IterationVariants []Iteration   `json:"iteration_variants,omitempty"`
	LayerGraphs       []LayerGraph  `json:"layer_graph,omitempty"`
	KernelGraphs      []KernelGraph `json:"kernel_graph,omitempty"`
	ChainFloors       []ChainFloor  `json:"chain_floor,omitempty"`
	HostCost          []HostCost    `json:"host_cost,omitempty"`
	Chain             []ChainResult `json:"chain,omitempty"`
	// Indexer is the ratio-4 layer with and without the indexer
	// (--indexer), IndexerQuery the indexer's query step alone at 128
	// tokens.
	Indexer      []IndexerResult      `json:"indexer,omitempty"`
	IndexerQuery []IndexerQueryResult `json:"indexer_query,omitempty"`
	// ChainGEMM says whether cuBLASLt is in use for the chain's GEMMs.
	ChainGEMM string   `json:"chain_gemm,omitempty"`
	Checks    []string `json:"checks"`
	// StridedCopy is a copy with the KV kernel's read pattern, L2-flushed
	// like the kernels: the ceiling for reading the latent in place.
	StridedCopy      []StridedCopy `json:"strided_copy"`
	ContiguousLatent bool          `json:"contiguous_latent,omitempty"`
	// Errors are the parts of the run that failed (the others ran).
	Errors []string `json:"errors,omitempty"`
}

// write stores the report as indented JSON, through a temporary file so a
// reader never sees half of it.
func (r *Report) write(path string) error {
	data, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// readReport loads a report written by write.
func readReport(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}
