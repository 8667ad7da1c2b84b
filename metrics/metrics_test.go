package metrics

import (
	"errors"
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

func TestReadinessGauge(t *testing.T) {
	s := New()
	var err error
	s.SetReadiness(func() error { return err })
	value := func() float64 {
		mfs, gerr := s.Registry.Gather()
		if gerr != nil {
			t.Fatal(gerr)
		}
		for _, mf := range mfs {
			if mf.GetName() == "sequencer_ready" {
				return mf.Metric[0].GetGauge().GetValue()
			}
		}
		t.Fatal("sequencer_ready not registered")
		return -1
	}
	if v := value(); v != 1 {
		t.Fatalf("ready: sequencer_ready %v, want 1", v)
	}
	err = errors.New("draining")
	if v := value(); v != 0 {
		t.Fatalf("not ready: sequencer_ready %v, want 0", v)
	}
	var nilSet *Set
	nilSet.SetReadiness(func() error { return nil }) // a nil Set records nothing
}

// A pool's four gauges come from one reading of its state per scrape, so a
// scrape never shows more connections acquired and idle than open (the
// state below changes at every reading, as a busy pool's does).
func TestStorePoolGaugesReadThePoolOnce(t *testing.T) {
	s := New()
	for _, name := range []string{"read", "control"} {
		readings := 0
		s.StorePool(name, func() PoolStat {
			readings++
			if readings%2 == 1 {
				return PoolStat{Acquired: 1, Idle: 0, Total: 1, Max: 1}
			}
			return PoolStat{Acquired: 0, Idle: 1, Total: 1, Max: 1}
		})
	}
	for range 3 {
		mfs, err := s.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{} // pool/metric -> value
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "pool" {
						got[l.GetValue()+"/"+mf.GetName()] = m.GetGauge().GetValue()
					}
				}
			}
		}
		for _, pool := range []string{"read", "control"} {
			acq, idle, total := got[pool+"/sequencer_store_pool_acquired_conns"], got[pool+"/sequencer_store_pool_idle_conns"], got[pool+"/sequencer_store_pool_total_conns"]
			if total != 1 || acq+idle != 1 || got[pool+"/sequencer_store_pool_max_conns"] != 1 {
				t.Fatalf("pool %s in one scrape: acquired %v, idle %v, total %v: not one reading", pool, acq, idle, total)
			}
		}
	}
}
