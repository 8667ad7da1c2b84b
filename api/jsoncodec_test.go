package api

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// sendRequestJSON are request bodies: fast marks those in the plain shape
// the direct path must take; every other one must be left to protojson.
var sendRequestJSON = []struct {
	in   string
	fast bool
}{
	{`{"convId":"c1","fromUid":"42","clientMsgId":"k-1","msgType":1,"body":"aGVsbG8="}`, true},
	{`{"conv_id":"c1","from_uid":42,"client_msg_id":"k-1","msg_type":"7","body":"aGVsbG8"}`, true},
	{` { "convId" : "c1" , "fromUid" : 18446744073709551615 , "body" : "-_-_" } `, true},
	{"{\n\t\"convId\": \"ü\",\r\n\"msgType\": -2147483648}", true},
	{`{"msgType":2147483647,"body":""}`, true},
	{`{}`, true},
	{`{"fromUid":"0","msgType":0}`, true},
	{`{"convId":"c1","fromUid":"18446744073709551616"}`, false}, // overflow: protojson errors
	{`{"msgType":2147483648}`, false},
	{`{"msgType":-0}`, false},
	{`{"fromUid":-1}`, false},
	{`{"fromUid":042}`, false},
	{`{"fromUid":"042"}`, false},
	{`{"fromUid":4.2e1}`, false},
	{`{"fromUid":42.0}`, false},
	{`{"fromUid":" 42"}`, false},
	{`{"fromUid":true}`, false},
	{`{"convId":null}`, false},
	{`{"convId":"a\"b"}`, false},
	{`{"convId":"a\u0041"}`, false},
	{"{\"convId\":\"a\x01\"}", false},
	{"{\"convId\":\"\xff\"}", false},
	{`{"convId":"c1","convId":"c2"}`, false},
	{`{"convId":"c1","conv_id":"c2"}`, false},
	{`{"unknown":1,"convId":"c1"}`, false},
	{`{"convId":"c1",}`, false},
	{`{"convId":"c1"} x`, false},
	{`{"convId":"c1"`, false},
	{`{"body":"a"}`, false},
	{`{"body":"a=b="}`, false},
	{`{"body":"aGVsbG8=","body":"aGVsbG8="}`, false},
	{`[]`, false},
	{`"x"`, false},
	{``, false},
}

func TestJSONCodecSendRequestMatchesProtojson(t *testing.T) {
	c := jsonCodec{name: "json"}
	for _, tc := range sendRequestJSON {
		var direct sequencerv1.SendRequest
		if got := decodeSendRequest([]byte(tc.in), &direct); got != tc.fast {
			t.Errorf("%q: direct path taken = %v, want %v", tc.in, got, tc.fast)
		}
		checkSameAsProtojson(t, c, []byte(tc.in))
	}
}

// checkSameAsProtojson checks that the codec's answer for data is
// protojson's (DiscardUnknown, as connect's codec): both fail, or both
// give equal messages.
func checkSameAsProtojson(t *testing.T, c jsonCodec, data []byte) {
	t.Helper()
	var got, want sequencerv1.SendRequest
	err := c.Unmarshal(data, &got)
	werr := error(nil)
	if len(data) > 0 {
		werr = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(data, &want)
	}
	if (err != nil) != (werr != nil || len(data) == 0) {
		t.Fatalf("%q: err %v, protojson %v", data, err, werr)
	}
	if err == nil && !proto.Equal(&got, &want) {
		t.Fatalf("%q: decoded %v, protojson %v", data, &got, &want)
	}
}

func FuzzJSONCodecSendRequest(f *testing.F) {
	for _, tc := range sendRequestJSON {
		f.Add([]byte(tc.in))
	}
	c := jsonCodec{name: "json"}
	f.Fuzz(func(t *testing.T, data []byte) { checkSameAsProtojson(t, c, data) })
}

func TestJSONCodecSendResponseMatchesProtojson(t *testing.T) {
	c := jsonCodec{name: "json"}
	rng := rand.New(rand.NewPCG(1, 2))
	cases := []*sequencerv1.SendResponse{
		{},
		{MsgId: 1, Seq: 1},
		{MsgId: math.MaxUint64, Seq: math.MaxUint64, Duplicate: true},
		{Seq: 3, ServerAt: timestamppb.New(time.Unix(1_700_000_000, 0))},
		{MsgId: 5, ServerAt: &timestamppb.Timestamp{Seconds: minTimestampSeconds}},
		{MsgId: 5, ServerAt: &timestamppb.Timestamp{Seconds: maxTimestampSeconds, Nanos: 999_999_999}},
		{MsgId: 5, ServerAt: &timestamppb.Timestamp{Seconds: -1, Nanos: 1}},
	}
	for _, nanos := range []int32{1, 10, 100, 1000, 120_000, 123_000_000, 100_000_000, 999_000, 1_000_000, 5_000} {
		cases = append(cases, &sequencerv1.SendResponse{MsgId: 9, Seq: 2, ServerAt: &timestamppb.Timestamp{Seconds: 1_700_000_000, Nanos: nanos}})
	}
	for range 500 {
		r := &sequencerv1.SendResponse{MsgId: rng.Uint64() >> rng.IntN(64), Seq: rng.Uint64() >> rng.IntN(64), Duplicate: rng.IntN(2) == 0}
		if rng.IntN(5) > 0 {
			r.ServerAt = &timestamppb.Timestamp{Seconds: minTimestampSeconds + rng.Int64N(maxTimestampSeconds-minTimestampSeconds), Nanos: int32(rng.IntN(1e9))}
			if rng.IntN(2) == 0 {
				r.ServerAt.Nanos -= r.ServerAt.Nanos % 1_000_000
			}
		}
		cases = append(cases, r)
	}
	for _, r := range cases {
		got, err := c.Marshal(r)
		if err != nil {
			t.Fatalf("%v: %v", r, err)
		}
		ref, err := protojson.Marshal(r)
		if err != nil {
			t.Fatalf("protojson %v: %v", r, err)
		}
		var want bytes.Buffer
		if err := json.Compact(&want, ref); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("%v:\n got %s\nwant %s", r, got, want.Bytes())
		}
	}
	// Out of protojson's range: its error, not a made-up time.
	for _, ts := range []*timestamppb.Timestamp{{Seconds: maxTimestampSeconds + 1}, {Seconds: minTimestampSeconds - 1}, {Nanos: -1}, {Nanos: 1e9}} {
		r := &sequencerv1.SendResponse{MsgId: 1, ServerAt: ts}
		if _, err := c.Marshal(r); err == nil {
			t.Fatalf("%v: marshaled, want protojson's error", r)
		}
	}
	// Other messages are protojson's.
	m := &sequencerv1.GetHeadResponse{HeadSeq: 12}
	got, err := c.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var back sequencerv1.GetHeadResponse
	if err := protojson.Unmarshal(got, &back); err != nil || back.HeadSeq != 12 {
		t.Fatalf("GetHeadResponse %s: %v %v", got, &back, err)
	}
}
