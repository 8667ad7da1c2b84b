package protocodec

import (
	"bytes"
	"fmt"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// answer is a PullMany answer of convs pages of msgs messages each.
func answer(convs, msgs int) *sequencerv1.PullManyResponse {
	r := &sequencerv1.PullManyResponse{}
	for c := range convs {
		p := &sequencerv1.PullResponse{HeadSeq: uint64(msgs + c), HasMore: c%3 == 0}
		for s := range msgs {
			p.Messages = append(p.Messages, &sequencerv1.Message{
				MsgId: uint64(c*1000 + s + 1), ConvId: fmt.Sprintf("conv-%d", c), Seq: uint64(s + 1), FromUid: 7,
				Body: bytes.Repeat([]byte{byte(s)}, 128), ClientMsgId: fmt.Sprintf("c%d-%d", c, s),
				ServerAt: timestamppb.New(timestamppb.Now().AsTime()),
			})
		}
		r.Pages = append(r.Pages, p)
	}
	return r
}

// The halves only work while pages are PullManyResponse's one field: a
// scalar field added to it would have to be merged by hand (its last
// occurrence wins). This fails first.
func TestPullManyResponseHasOnlyPages(t *testing.T) {
	fields := (&sequencerv1.PullManyResponse{}).ProtoReflect().Descriptor().Fields()
	if fields.Len() != 1 || fields.Get(0).Number() != 1 || !fields.Get(0).IsList() {
		t.Fatalf("PullManyResponse has %d fields; protocodec splits at its pages (field 1) and knows no other", fields.Len())
	}
}

// Append writes exactly proto.Marshal's bytes, split or not, after what
// dst held, unknown fields included; Unmarshal reads them back as
// proto.Unmarshal does.
func TestAppendAndUnmarshalAreProtos(t *testing.T) {
	for _, c := range []struct{ convs, msgs int }{{0, 0}, {1, 1}, {3, 10}, {1, 600}, {1000, 10}, {2, 1000}, {600, 1}} {
		r := answer(c.convs, c.msgs)
		if c.convs == 1000 {
			// An unknown field (a newer node's) travels along.
			r.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 9, protowire.BytesType), []byte("later")))
		}
		want, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Append([]byte("prefix"), r)
		if err != nil || !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Fatalf("%d x %d: Append = %d bytes (%v), want proto.Marshal's %d after the prefix", c.convs, c.msgs, len(got), err, len(want))
		}
		var back sequencerv1.PullManyResponse
		back.Pages = []*sequencerv1.PullResponse{{HeadSeq: 99}} // Unmarshal replaces, as proto.Unmarshal does
		if err := Unmarshal(want, &back); err != nil || !proto.Equal(&back, r) {
			t.Fatalf("%d x %d: Unmarshal: %v, equal %v", c.convs, c.msgs, err, proto.Equal(&back, r))
		}
		split := fieldBoundary(want)
		if big := len(want) >= minSplitBytes; big != (split > 0) {
			t.Fatalf("%d x %d: %d bytes cut at %d", c.convs, c.msgs, len(want), split)
		}
	}
}

// A cut falls on a field boundary at or after the middle.
func TestFieldBoundary(t *testing.T) {
	data, err := proto.Marshal(answer(1000, 10))
	if err != nil {
		t.Fatal(err)
	}
	cut := fieldBoundary(data)
	if cut < len(data)/2 || cut >= len(data) {
		t.Fatalf("cut at %d of %d", cut, len(data))
	}
	var a, b sequencerv1.PullManyResponse
	if proto.Unmarshal(data[:cut], &a) != nil || proto.Unmarshal(data[cut:], &b) != nil || len(a.Pages)+len(b.Pages) != 1000 {
		t.Fatalf("the halves hold %d and %d pages", len(a.Pages), len(b.Pages))
	}
	if fieldBoundary(data[:minSplitBytes-1]) != 0 {
		t.Fatal("a small encoding was cut")
	}
	bad := append([]byte{}, data...)
	bad[0] = 0xff // a tag that cannot be consumed: no cut, proto.Unmarshal reports it
	if fieldBoundary(bad) != 0 {
		t.Fatal("a malformed encoding was cut")
	}
}

// Unmarshal fails where proto.Unmarshal fails, and reads what it reads.
func FuzzUnmarshalAgreesWithProto(f *testing.F) {
	whole, err := proto.Marshal(answer(400, 2))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(whole, 0, byte(0))
	f.Add(whole, len(whole)/2+3, byte(0x80))
	f.Add(whole, len(whole)-1, byte(0xff))
	f.Fuzz(func(t *testing.T, data []byte, at int, b byte) {
		if len(data) > 0 && at >= 0 {
			data = append([]byte{}, data...)
			data[at%len(data)] = b
		}
		var want, got sequencerv1.PullManyResponse
		werr := proto.Unmarshal(data, &want)
		gerr := Unmarshal(data, &got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("proto.Unmarshal: %v; Unmarshal: %v", werr, gerr)
		}
		if gerr == nil && !proto.Equal(&want, &got) {
			t.Fatal("Unmarshal read another message than proto.Unmarshal")
		}
	})
}

func BenchmarkUnmarshal(b *testing.B) {
	data, err := proto.Marshal(answer(1000, 10))
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		fn   func([]byte, *sequencerv1.PullManyResponse) error
	}{{"proto", func(d []byte, r *sequencerv1.PullManyResponse) error { return proto.Unmarshal(d, r) }}, {"halves", Unmarshal}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				var r sequencerv1.PullManyResponse
				if err := c.fn(data, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkAppend(b *testing.B) {
	r := answer(1000, 10)
	for _, c := range []struct {
		name string
		fn   func([]byte, *sequencerv1.PullManyResponse) ([]byte, error)
	}{{"proto", func(d []byte, r *sequencerv1.PullManyResponse) ([]byte, error) {
		return proto.MarshalOptions{}.MarshalAppend(d, r)
	}}, {"halves", Append}} {
		b.Run(c.name, func(b *testing.B) {
			var buf []byte // reused, as connect's buffer pool does
			for b.Loop() {
				out, err := c.fn(buf[:0], r)
				if err != nil {
					b.Fatal(err)
				}
				buf = out
			}
		})
	}
}
