package api

import (
	"fmt"
	"sync/atomic"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/feed"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// Encode once: a live message that N Subscribe streams send is encoded
// once per encoding (binary protobuf for gRPC and Connect, protojson for
// Connect JSON and gRPC JSON), not once per stream. Subscribe hands the
// stream a *sharedEvent instead of a SubscribeResponse; the handler's
// codecs (protoCodec here, jsonCodec in jsoncodec.go) recognise it and
// copy the bytes the message's feed.Wire holds, encoding them on the first
// stream's send. Compression, when a client asks for it, stays per stream.

// sharedEvent is a SubscribeResponse carrying one live message whose
// encoded form is shared (feed.Event.Wire).
type sharedEvent struct {
	msg  *sequencer.Message
	wire *feed.Wire
}

// feedEncodings counts the SubscribeResponses of shared events encoded
// (the tests count them to prove the sharing).
var feedEncodings atomic.Int64

// appendTo appends the event's encoding name (encoding it first if no
// stream did yet; marshal encodes a SubscribeResponse).
func (e *sharedEvent) appendTo(dst []byte, name string, marshal func(dst []byte, m proto.Message) ([]byte, error)) ([]byte, error) {
	b, err := e.wire.Encoded(name, func() ([]byte, error) {
		feedEncodings.Add(1)
		return marshal(nil, &sequencerv1.SubscribeResponse{Event: &sequencerv1.SubscribeResponse_Message{Message: messageProto(e.msg)}})
	})
	if err != nil {
		return nil, err
	}
	return append(dst, b...), nil
}

// protoCodec is connect's binary protobuf codec (the same options) that
// also writes shared events, and encodes a large PullMany answer in two
// halves at once (pagecodec.go).
type protoCodec struct{}

func (protoCodec) Name() string   { return "proto" }
func (protoCodec) IsBinary() bool { return true }

func (c protoCodec) Marshal(message any) ([]byte, error) { return c.MarshalAppend(nil, message) }

func (protoCodec) MarshalAppend(dst []byte, message any) ([]byte, error) {
	if e, ok := message.(*sharedEvent); ok {
		return e.appendTo(dst, "proto", proto.MarshalOptions{}.MarshalAppend)
	}
	if r, ok := message.(*sequencerv1.PullManyResponse); ok {
		return appendPullMany(dst, r) // a large answer on two cores (pagecodec.go)
	}
	pm, ok := message.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T doesn't implement proto.Message", message)
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, pm)
}

func (protoCodec) MarshalStable(message any) ([]byte, error) {
	pm, ok := message.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T doesn't implement proto.Message", message)
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(pm)
}

func (protoCodec) Unmarshal(data []byte, message any) error {
	pm, ok := message.(proto.Message)
	if !ok {
		return fmt.Errorf("%T doesn't implement proto.Message", message)
	}
	if err := proto.Unmarshal(data, pm); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", message, err)
	}
	return nil
}

// sendEvent sends one feed event on a Subscribe stream: a live message as
// its shared encoding (in shared, which the stream reuses: Send encodes it
// before it returns), anything else as a SubscribeResponse built in out.
// Neither keeps the event once sent: a stream idle after a backlog message
// must not hold that message's body, nor the store read's block it was cut
// from, for the life of the stream.
func sendEvent(st *connect.ServerStream[sequencerv1.SubscribeResponse], out *sequencerv1.SubscribeResponse, shared *sharedEvent, e feed.Event) error {
	switch e.Kind {
	case feed.KindMessage:
		if e.Wire != nil {
			*shared = sharedEvent{msg: e.Msg, wire: e.Wire}
			err := st.Conn().Send(shared)
			*shared = sharedEvent{}
			return err
		}
		out.Event = &sequencerv1.SubscribeResponse_Message{Message: messageProto(e.Msg)}
	case feed.KindTruncated:
		out.Event = &sequencerv1.SubscribeResponse_Truncated{Truncated: &sequencerv1.Truncated{ConvId: e.ConvID, OldestSeq: e.OldestSeq}}
	case feed.KindHeartbeat:
		out.Event = &sequencerv1.SubscribeResponse_Heartbeat{Heartbeat: &sequencerv1.Heartbeat{}}
	case feed.KindReadPosition:
		out.Event = &sequencerv1.SubscribeResponse_ReadPosition{ReadPosition: &sequencerv1.ReadPositionChanged{ConvId: e.ConvID, Uid: e.UID, ReadSeq: e.ReadSeq}}
	}
	err := st.Send(out)
	out.Event = nil
	return err
}
