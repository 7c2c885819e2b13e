package report

import (
	"fmt"
	"strings"

	"github.com/gorun/gorun/internal/words"
)

// byRank prints per-rank means: "rank 0 89 %, rank 1 87 %".
func byRank(s [][]Point, unit string) string {
	parts := make([]string, 0, len(s))
	for i, p := range s {
		if len(p) > 0 {
			parts = append(parts, fmt.Sprintf("rank %d %s%s", i, fmtNum(mean(p), "%.0f"), unit))
		}
	}
	return strings.Join(parts, ", ")
}

func (r *report) devicesSection() {
	ri := r.ri
	r.w("## Were the devices busy?\n\n")
	hosts := UniqueHosts(ri.Hosts)
	cpuRanks, gpuRanks := perRank(r.recs, "train", "cpu_util_pct"), perRank(r.recs, "train", "gpu_util_pct")
	if r.onGPU() {
		r.w("- Trained on GPUs: rank 0's is %s.\n", orStr(ri.Device, "cuda"))
		if len(r.gpu) > 0 {
			r.w("- GPU utilization (NVML, the share of time a kernel ran): **%s %%** on average", fmtNum(mean(r.gpu), "%.0f"))
			if len(gpuRanks) > 1 {
				r.w(" (%s)", byRank(gpuRanks, " %"))
			}
			r.w(".\n")
		}
		if used, peak := series(r.recs, "train", "gpu_mem_used_MiB"), series(r.recs, "train", "gpu_mem_peak_MiB"); len(used) > 0 {
			r.w("- GPU memory: %s MiB in use on the device at the last log line (every process, as nvidia-smi counts), gorun's own allocations peaked at %s MiB.\n",
				fmtNum(used[len(used)-1].V, "%.0f"), fmtNum(maxOf(peak), "%.0f"))
		}
	} else {
		cpu := orStr(ri.CPUModel, "CPU model unknown")
		if ri.CPUs > 0 {
			cpu += fmt.Sprintf(", %d logical CPUs", ri.CPUs)
		}
		onHost0 := 0
		for _, h := range ri.Hosts {
			if h == hosts[0] {
				onHost0++
			}
		}
		where := fmt.Sprintf("rank 0's host (%s: %s)", hosts[0], cpu)
		if len(hosts) == 1 {
			where = fmt.Sprintf("one host (%s: %s)", hosts[0], cpu)
		}
		r.w("- Trained on the CPU of %s; %s there, %s each. No GPU was used.\n", where, words.Plural(max(onHost0, 1), "rank"), words.Plural(ri.Threads, "compute thread"))
	}
	if len(r.cpu) == 0 {
		r.w("- CPU use: **not enough data**: no log line recorded it (--log-every logs more often).\n")
	} else {
		r.w("- CPU use: **%s %%** of the cores given to each rank on average", fmtNum(mean(r.cpu), "%.0f"))
		if len(cpuRanks) > 1 {
			r.w(" (%s)", byRank(cpuRanks, " %"))
		}
		r.w(".\n")
	}
	if len(r.compute) > 0 && len(r.stepTime) > 0 {
		r.w("- Compute (forward, backward, optimizer) is **%s %%** of the step time; the rest is exposed communication, data and logging.\n", fmtNum(100*mean(r.compute)/mean(r.stepTime), "%.0f"))
	}
	lines := []Line{{"cpu", r.cpu}, {"gpu", r.gpu}}
	if k := len(cpuRanks) + len(gpuRanks); k > 1 && k <= len(palette) {
		lines = nil
		for i, p := range cpuRanks {
			lines = append(lines, Line{fmt.Sprintf("cpu rank %d", i), p})
		}
		for i, p := range gpuRanks {
			lines = append(lines, Line{fmt.Sprintf("gpu rank %d", i), p})
		}
	}
	r.w("\n%s\n\n", r.plot("utilization.png", "utilization", "%", lines...))
}
