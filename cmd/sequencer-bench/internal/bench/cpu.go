package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// CPUMeter is implemented by engines that can say how much CPU the process
// doing the sequencing has used so far. The bench reads it at the start and
// end of the measured window and reports the difference per stored message.
type CPUMeter interface {
	// CPUSeconds is the process's user+system CPU time so far.
	CPUSeconds(ctx context.Context) (float64, error)
	// CPUScope says which process that is (cpuScope*).
	CPUScope() string
}

// What a CPU-per-message figure covers.
const (
	// cpuScopeServer: the server process the bench started, from its
	// /proc/PID/stat: the server alone.
	cpuScopeServer = "server"
	// cpuScopeServerMetrics: a --target server, from its own
	// process_cpu_seconds_total (the same /proc numbers, read by the server).
	cpuScopeServerMetrics = "server (its /metrics)"
	// cpuScopeBench: an in-process engine: the whole bench process, load
	// generator (senders, latency histograms) included.
	cpuScopeBench = "bench process (engine in process, senders included)"
)

// procCPUSeconds returns utime+stime of process pid from /proc/PID/stat, in
// seconds (the kernel counts them in clock ticks, getconf CLK_TCK).
func procCPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	ticks, err := parseProcStatCPU(string(b))
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return float64(ticks) / clockTicks(), nil
}

// parseProcStatCPU returns utime+stime (fields 14 and 15, in clock ticks) of
// a /proc/PID/stat line. The command name (field 2) is in parentheses and may
// itself hold spaces and parentheses, so fields are counted after the last ')'.
func parseProcStatCPU(line string) (uint64, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %.80q", line)
	}
	f := strings.Fields(line[i+1:])
	// f[0] is field 3 (state), so field n is f[n-3].
	if len(f) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 13", len(f))
	}
	utime, err := strconv.ParseUint(f[14-3], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("utime: %w", err)
	}
	stime, err := strconv.ParseUint(f[15-3], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stime: %w", err)
	}
	return utime + stime, nil
}

// clockTicks is the kernel's USER_HZ (getconf CLK_TCK): 100 on Linux unless
// getconf says otherwise.
var clockTicks = sync.OnceValue(func() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && v > 0 {
			return v
		}
	}
	return 100
})

// fsType names the filesystem dir is on (tmpfs, ext4, xfs, btrfs, overlay,
// or its magic number), so a report says where the SQLite files were.
func fsType(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return ""
	}
	switch uint64(st.Type) {
	case 0x01021994:
		return "tmpfs"
	case 0xEF53:
		return "ext4"
	case 0x58465342:
		return "xfs"
	case 0x9123683E:
		return "btrfs"
	case 0x794C7630:
		return "overlay"
	}
	return fmt.Sprintf("0x%x", uint64(st.Type))
}
