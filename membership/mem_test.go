package membership_test

import (
	"testing"

	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/membership/membershiptest"
)

func TestMemConformance(t *testing.T) {
	membershiptest.Run(t, func(t *testing.T, clk *clock.Fake) membership.Store { return membership.NewMem(clk) })
}
