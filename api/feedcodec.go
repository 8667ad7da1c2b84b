package api

import (
	"sync/atomic"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/feed"
	"github.com/sequencer-im/sequencer/internal/protocodec"
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

// protoCodec is the binary protobuf codec of internal/protocodec (connect's,
// with large PullMany answers on two cores) that also writes shared events.
type protoCodec struct{ protocodec.Codec }

func (c protoCodec) Marshal(message any) ([]byte, error) { return c.MarshalAppend(nil, message) }

func (c protoCodec) MarshalAppend(dst []byte, message any) ([]byte, error) {
	if e, ok := message.(*sharedEvent); ok {
		return e.appendTo(dst, "proto", proto.MarshalOptions{}.MarshalAppend)
	}
	return c.Codec.MarshalAppend(dst, message)
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
