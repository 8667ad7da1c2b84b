package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
)

// engineColors gives each engine the same color in every chart.
var engineColors = map[string]string{
	"a":       "#1f77b4", // blue: this sequencer
	"b":       "#d62728", // red: Redis INCR
	"c":       "#ff7f0e", // orange: DB segment
	"d":       "#7f7f7f", // gray: COPY ceiling
	"e":       "#2ca02c", // greens: over the network
	"e-json":  "#98df8a",
	"e-batch": "#17becf",
	// The embedded store: the same hues, darker.
	"a-sqlite":       "#0b3c5d",
	"e-sqlite":       "#1a6b1a",
	"e-json-sqlite":  "#5a8f52",
	"e-batch-sqlite": "#0e7c86",
}

// chartData is the grouped values of one panel: groups are scenarios, series
// are engines.
type chartData struct {
	groups []string
	series []EngineInfo
	// value[g][s]; NaN means not measured.
	value [][]float64
}

// WriteSVG draws two panels side by side: throughput (msg/s) and p99
// latency (ms) per scenario, one bar per engine. The memory scenario and
// skipped runs are left out.
func (rep *Report) WriteSVG(w io.Writer) {
	var groups []string
	for _, sc := range rep.Scenarios {
		if sc.Name != "memory" {
			groups = append(groups, sc.Name)
		}
	}
	tput := chartData{groups: groups, series: rep.Engines}
	p99 := chartData{groups: groups, series: rep.Engines}
	for _, g := range groups {
		tv := make([]float64, len(rep.Engines))
		pv := make([]float64, len(rep.Engines))
		for i, e := range rep.Engines {
			tv[i], pv[i] = math.NaN(), math.NaN()
			if r, ok := find(rep.Results, e.Key, g); ok {
				tv[i] = r.Throughput
				if r.Latency.Count > 0 {
					pv[i] = r.Latency.P99
				}
			}
		}
		tput.value = append(tput.value, tv)
		p99.value = append(p99.value, pv)
	}

	const panelH, top, legendRowH = 300.0, 40.0, 20.0
	groupW := 40.0 + 26.0*float64(max(len(rep.Engines), 1))
	panelW := math.Max(320, 70+groupW*float64(max(len(groups), 1)))
	width := 2*panelW + 30
	// The legend wraps into rows as wide as the chart.
	type legendItem struct {
		key, label string
		x, y       float64
	}
	var legend []legendItem
	lx, ly := 10.0, top+panelH+50
	for _, e := range rep.Engines {
		label := e.Key + " " + e.Name
		w := 16 + 7*float64(len(label)) + 18
		if lx > 10 && lx+w > width {
			lx, ly = 10, ly+legendRowH
		}
		legend = append(legend, legendItem{e.Key, label, lx, ly})
		lx += w
	}
	height := ly + legendRowH

	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(w, `<text x="%.0f" y="20" font-size="15" text-anchor="middle">sequencer bench, run %s</text>`+"\n", width/2, html.EscapeString(rep.Info.RunID))
	drawPanel(w, tput, "throughput (messages/s, higher is better)", 10, top, panelW, panelH, fmtShort)
	drawPanel(w, p99, "p99 latency (ms, lower is better)", panelW+20, top, panelW, panelH, fmtMs)

	for _, it := range legend {
		fmt.Fprintf(w, `<rect x="%.0f" y="%.0f" width="12" height="12" fill="%s"/>`+"\n", it.x, it.y-10, colorOf(it.key))
		fmt.Fprintf(w, `<text x="%.0f" y="%.0f">%s</text>`+"\n", it.x+16, it.y, html.EscapeString(it.label))
	}
	fmt.Fprintln(w, "</svg>")
}

func colorOf(key string) string {
	if c, ok := engineColors[key]; ok {
		return c
	}
	return "#9467bd"
}

// drawPanel draws one grouped bar chart with a linear axis from 0.
func drawPanel(w io.Writer, d chartData, title string, x0, y0, width, height float64, label func(float64) string) {
	const left, bottom, topPad = 60.0, 30.0, 24.0
	plotW, plotH := width-left-10, height-bottom-topPad
	maxV := 0.0
	for _, g := range d.value {
		for _, v := range g {
			if !math.IsNaN(v) && v > maxV {
				maxV = v
			}
		}
	}
	top := niceCeil(maxV)
	fmt.Fprintf(w, `<g transform="translate(%.1f,%.1f)">`+"\n", x0, y0)
	fmt.Fprintf(w, `<text x="%.1f" y="12" font-size="13" text-anchor="middle">%s</text>`+"\n", width/2, html.EscapeString(title))
	// Axis and grid: 5 steps.
	for i := 0; i <= 5; i++ {
		v := top * float64(i) / 5
		y := topPad + plotH - plotH*float64(i)/5
		fmt.Fprintf(w, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, left+plotW, y, y)
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#555">%s</text>`+"\n", left-4, y+4, label(v))
	}
	fmt.Fprintf(w, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left, left+plotW, topPad+plotH, topPad+plotH)
	if len(d.groups) == 0 {
		fmt.Fprintln(w, "</g>")
		return
	}
	groupW := plotW / float64(len(d.groups))
	barW := math.Min(24, (groupW-16)/float64(max(len(d.series), 1)))
	for gi, g := range d.groups {
		gx := left + groupW*float64(gi)
		start := gx + (groupW-barW*float64(len(d.series)))/2
		for si, e := range d.series {
			v := d.value[gi][si]
			bx := start + barW*float64(si)
			if math.IsNaN(v) {
				continue
			}
			h := 0.0
			if top > 0 {
				h = plotH * v / top
			}
			by := topPad + plotH - h
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
				bx+1, by, barW-2, h, colorOf(e.Key), html.EscapeString(e.Key), html.EscapeString(g), label(v))
			fmt.Fprintf(w, `<text x="%.1f" y="%.1f" font-size="9" text-anchor="middle" fill="#333">%s</text>`+"\n",
				bx+barW/2, by-3, label(v))
		}
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", gx+groupW/2, topPad+plotH+18, html.EscapeString(g))
	}
	fmt.Fprintln(w, "</g>")
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for v <= 0).
func niceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// fmtShort formats a rate compactly: 45123 -> "45.1k".
func fmtShort(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 1, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}
