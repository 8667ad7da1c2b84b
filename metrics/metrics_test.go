package metrics

import (
	"testing"

	"github.com/sequencer-im/sequencer/buildinfo"
)

func TestBuildInfoGauge(t *testing.T) {
	s := New()
	mfs, err := s.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	bi := buildinfo.Get()
	for _, mf := range mfs {
		if mf.GetName() != "sequencer_build_info" {
			continue
		}
		if len(mf.Metric) != 1 {
			t.Fatalf("%d sequencer_build_info series, want 1", len(mf.Metric))
		}
		m := mf.Metric[0]
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		want := map[string]string{"version": bi.Version, "commit": bi.Commit, "goversion": bi.GoVersion}
		for k, v := range want {
			if labels[k] != v {
				t.Errorf("label %s=%q, want %q", k, labels[k], v)
			}
		}
		if len(labels) != len(want) {
			t.Errorf("labels %v, want exactly %v", labels, want)
		}
		if m.GetGauge().GetValue() != 1 {
			t.Errorf("value %v, want 1", m.GetGauge().GetValue())
		}
		return
	}
	t.Fatal("sequencer_build_info not registered")
}
