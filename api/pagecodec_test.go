package api

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// appendPullMany's halves are a PullManyResponse's only while pages are its
// one field: a scalar field added to it would appear in each half (and
// the last one wins). This fails first.
func TestPullManyResponseHasOnlyPages(t *testing.T) {
	fields := (&sequencerv1.PullManyResponse{}).ProtoReflect().Descriptor().Fields()
	if fields.Len() != 1 || fields.Get(0).Number() != 1 || !fields.Get(0).IsList() {
		t.Fatalf("PullManyResponse has %d fields; appendPullMany cuts it between pages (field 1) and knows no other", fields.Len())
	}
}

// appendPullMany writes exactly proto.Marshal's bytes after what dst held,
// on one core or in halves, unknown fields included; the handler's codec
// uses it.
func TestAppendPullManyIsProtoMarshal(t *testing.T) {
	for _, c := range []struct{ convs, msgs int }{{0, 0}, {1, 1}, {3, 10}, {1, 600}, {1000, 10}, {2, 1000}, {600, 1}} {
		r := &sequencerv1.PullManyResponse{}
		protos := newMessageProtos(c.convs * c.msgs)
		for k := range c.convs {
			var ms []sequencer.Message
			for s := range c.msgs {
				ms = append(ms, sequencer.Message{MsgID: uint64(k*1000 + s + 1), ConvID: fmt.Sprint("c", k), Seq: uint64(s + 1), FromUID: 3,
					Body: bytes.Repeat([]byte{byte(s)}, 100), ClientMsgID: fmt.Sprint(k, "-", s), ServerAt: time.Unix(1_700_000_000, int64(s)*1e6)})
			}
			r.Pages = append(r.Pages, &sequencerv1.PullResponse{HeadSeq: uint64(c.msgs + k), HasMore: k%2 == 0, Messages: protos.next(ms)})
		}
		if c.convs == 1000 { // a field this build does not know travels along
			r.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 9, protowire.BytesType), []byte("later")))
		}
		want, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		for _, dst := range [][]byte{nil, []byte("prefix"), make([]byte, 3, len(want)+100)} {
			got, err := protoCodec{}.MarshalAppend(dst, r)
			if err != nil || !bytes.Equal(got[:len(dst)], dst) || !bytes.Equal(got[len(dst):], want) {
				t.Fatalf("%d x %d after %d bytes: %d bytes (%v), want proto.Marshal's %d after them", c.convs, c.msgs, len(dst), len(got), err, len(want))
			}
		}
	}
}
