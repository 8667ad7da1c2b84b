package client

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// pullManyWire is the encoding of a PullMany answer of convs pages of msgs
// messages each (100-byte bodies).
func pullManyWire(t testing.TB, convs, msgs int) []byte {
	t.Helper()
	r := &sequencerv1.PullManyResponse{}
	at := timestamppb.Now()
	for k := range convs {
		p := &sequencerv1.PullResponse{HeadSeq: uint64(msgs + k), HasMore: k%3 == 0}
		for s := range msgs {
			p.Messages = append(p.Messages, &sequencerv1.Message{MsgId: uint64(k<<20 | s), ConvId: fmt.Sprint("conv-", k),
				Seq: uint64(s + 1), Body: make([]byte, 100), ClientMsgId: fmt.Sprint(k, "/", s), ServerAt: at})
		}
		r.Pages = append(r.Pages, p)
	}
	if convs == 1000 { // a field this build does not know travels along
		r.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 9, protowire.BytesType), []byte("later")))
	}
	b, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The SDK's codec reads a PullMany answer as proto.Unmarshal does, in two
// halves when it is large (above minSplitBytes), unknown fields included;
// the cut falls on the field boundary nearest the middle.
func TestCodecReadsPullManyAsProto(t *testing.T) {
	for _, c := range []struct{ convs, msgs int }{{0, 0}, {1, 1}, {3, 10}, {1, 700}, {1000, 10}, {2, 1000}, {700, 1}} {
		data := pullManyWire(t, c.convs, c.msgs)
		var want sequencerv1.PullManyResponse
		if err := proto.Unmarshal(data, &want); err != nil {
			t.Fatal(err)
		}
		got := sequencerv1.PullManyResponse{Pages: []*sequencerv1.PullResponse{{HeadSeq: 99}}} // replaced, as by proto.Unmarshal
		if err := (protoCodec{}).Unmarshal(data, &got); err != nil || !proto.Equal(&got, &want) {
			t.Fatalf("%d x %d: %v, equal %v", c.convs, c.msgs, err, proto.Equal(&got, &want))
		}
		cut := fieldBoundary(data)
		if len(data) < minSplitBytes {
			if cut != 0 {
				t.Fatalf("%d bytes cut at %d", len(data), cut)
			}
			continue
		}
		if cut == len(data) && c.convs == 1 {
			continue // one page: nothing to cut, decoded whole
		}
		var a, b sequencerv1.PullManyResponse
		if cut < len(data)/4 || cut > len(data)*3/4 || proto.Unmarshal(data[:cut], &a) != nil || proto.Unmarshal(data[cut:], &b) != nil ||
			len(a.Pages)+len(b.Pages) != c.convs {
			t.Fatalf("%d x %d: %d bytes cut at %d into %d and %d pages", c.convs, c.msgs, len(data), cut, len(a.Pages), len(b.Pages))
		}
	}
	bad := pullManyWire(t, 1000, 10)
	bad[0] = 0xff // a tag that cannot be read: no cut, and proto.Unmarshal's error
	if fieldBoundary(bad) != 0 || (protoCodec{}).Unmarshal(bad, &sequencerv1.PullManyResponse{}) == nil {
		t.Fatal("a malformed answer was cut or read")
	}
}

// The codec fails where proto.Unmarshal fails, and reads what it reads.
func FuzzCodecReadsPullManyAsProto(f *testing.F) {
	whole := pullManyWire(f, 400, 2)
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
		gerr := (protoCodec{}).Unmarshal(data, &got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("proto.Unmarshal: %v; the codec: %v", werr, gerr)
		}
		if gerr == nil && !proto.Equal(&want, &got) {
			t.Fatal("the codec read another message than proto.Unmarshal")
		}
	})
}

// go test ./client -run '^$' -bench DecodePullMany
func BenchmarkDecodePullMany(b *testing.B) {
	data := pullManyWire(b, 1000, 10)
	for _, c := range []struct {
		name string
		fn   func([]byte, proto.Message) error
	}{{"proto", proto.Unmarshal}, {"halves", func(d []byte, m proto.Message) error { return protoCodec{}.Unmarshal(d, m) }}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if err := c.fn(data, &sequencerv1.PullManyResponse{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
