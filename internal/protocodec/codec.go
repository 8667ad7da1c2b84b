package protocodec

import (
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// Codec is connect's binary protobuf codec ("proto", the same options),
// except that a large PullMany answer is encoded (Append) and decoded
// (Unmarshal) in two halves at once.
type Codec struct{}

var _ connect.Codec = Codec{}

func (Codec) Name() string   { return "proto" }
func (Codec) IsBinary() bool { return true }

func (c Codec) Marshal(message any) ([]byte, error) { return c.MarshalAppend(nil, message) }

func (Codec) MarshalAppend(dst []byte, message any) ([]byte, error) {
	switch m := message.(type) {
	case *sequencerv1.PullManyResponse:
		return Append(dst, m)
	case proto.Message:
		return proto.MarshalOptions{}.MarshalAppend(dst, m)
	}
	return nil, fmt.Errorf("%T doesn't implement proto.Message", message)
}

func (Codec) MarshalStable(message any) ([]byte, error) {
	pm, ok := message.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T doesn't implement proto.Message", message)
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(pm)
}

func (Codec) Unmarshal(data []byte, message any) error {
	var err error
	switch m := message.(type) {
	case *sequencerv1.PullManyResponse:
		err = Unmarshal(data, m)
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
