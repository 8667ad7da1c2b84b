package client

import (
	"fmt"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// protoCodec is connect's binary protobuf codec (the same options), except
// that a large PullMany answer is decoded on two cores. A PullManyResponse
// is a list of pages (field 1) and nothing else, and the protobuf encoding
// of a message is the concatenation of its fields, so its decoding may
// start at any field boundary: an answer of 1,000 conversations x 10
// messages (about 2 MB) is cut near its middle and both halves are
// decoded at once. The node encodes it in halves the same way
// (api/pagecodec.go).
type protoCodec struct{}

var _ connect.Codec = protoCodec{}

func (protoCodec) Name() string { return "proto" }

func (c protoCodec) Marshal(message any) ([]byte, error) { return c.MarshalAppend(nil, message) }

// MarshalAppend lets connect encode requests into its pooled buffers, as
// with its own codec (a SendBatch of 1,000 items is about 150 KB).
func (protoCodec) MarshalAppend(dst []byte, message any) ([]byte, error) {
	pm, ok := message.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T doesn't implement proto.Message", message)
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, pm)
}

func (protoCodec) Unmarshal(data []byte, message any) error {
	var err error
	switch m := message.(type) {
	case *sequencerv1.PullManyResponse:
		err = unmarshalPullMany(data, m)
	case proto.Message:
		err = proto.Unmarshal(data, m)
	default:
		return fmt.Errorf("%T doesn't implement proto.Message", message)
	}
	if err != nil {
		return fmt.Errorf("unmarshal into %T: %w", message, err)
	}
	return nil
}

// minSplitBytes: below this size one core decodes it all.
const minSplitBytes = 64 << 10

// unmarshalPullMany decodes data into r as proto.Unmarshal does; a large encoding
// is decoded in two halves at once, cut at a field boundary.
func unmarshalPullMany(data []byte, r *sequencerv1.PullManyResponse) error {
	cut := fieldBoundary(data)
	if cut <= 0 || cut >= len(data) {
		return proto.Unmarshal(data, r)
	}
	var second sequencerv1.PullManyResponse
	var secondErr error
	var wg sync.WaitGroup
	wg.Go(func() { secondErr = proto.Unmarshal(data[cut:], &second) })
	err := proto.Unmarshal(data[:cut], r)
	wg.Wait()
	if err == nil {
		err = secondErr
	}
	if err != nil {
		return err
	}
	r.Pages = append(r.Pages, second.Pages...)
	if u := second.ProtoReflect().GetUnknown(); len(u) > 0 {
		r.ProtoReflect().SetUnknown(append(r.ProtoReflect().GetUnknown(), u...))
	}
	return nil
}

// fieldBoundary is the field boundary nearest the middle of data (0 or
// len(data): none to cut at); 0 also when data is too small to split, or
// not a sequence of well-formed fields up to there (proto.Unmarshal of the
// whole reports it).
func fieldBoundary(data []byte) int {
	if len(data) < minSplitBytes {
		return 0
	}
	half := len(data) / 2
	for at := 0; at < len(data); {
		num, typ, n := protowire.ConsumeTag(data[at:])
		if n < 0 {
			return 0
		}
		m := protowire.ConsumeFieldValue(num, typ, data[at+n:])
		if m < 0 {
			return 0
		}
		next := at + n + m
		if next >= half {
			if at > 0 && half-at < next-half {
				return at
			}
			return next
		}
		at = next
	}
	return 0
}
