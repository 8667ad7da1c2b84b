package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// jsonCodec is the handler's JSON codec: connect's own (protojson,
// unknown fields discarded) with a direct path for the unary Send, the RPC
// JSON callers make per message. A SendRequest in the plain shape clients
// send (the five fields under their JSON or proto names, strings without
// escapes, integers as digits or digit strings, base64 bodies) is decoded
// without reflection; anything else (escapes, null, exponents, unknown or
// repeated keys, invalid input) goes to protojson, which answers exactly as
// before. A SendResponse is written directly; it is the JSON protojson
// writes, compacted. Every other message goes to protojson.
//
// jsoncodec_test.go checks both against protojson (a table and a fuzz
// target); BenchmarkHandlerSendJSON measures it.
type jsonCodec struct{ name string }

// jsonCodecs replaces connect's codecs for application/json and
// application/json; charset=utf-8.
func jsonCodecs() []connect.HandlerOption {
	return []connect.HandlerOption{
		connect.WithCodec(jsonCodec{name: "json"}),
		connect.WithCodec(jsonCodec{name: "json; charset=utf-8"}),
	}
}

func (c jsonCodec) Name() string { return c.name }
func (jsonCodec) IsBinary() bool { return false }

func (c jsonCodec) Marshal(message any) ([]byte, error) { return c.MarshalAppend(nil, message) }

func (jsonCodec) MarshalAppend(dst []byte, message any) ([]byte, error) {
	if e, ok := message.(*sharedEvent); ok { // a Subscribe event shared by its streams (feedcodec.go)
		return e.appendTo(dst, "json", protojson.MarshalOptions{}.MarshalAppend)
	}
	if r, ok := message.(*sequencerv1.SendResponse); ok {
		if out, ok := appendSendResponse(dst, r); ok {
			return out, nil
		}
	}
	pm, ok := message.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T doesn't implement proto.Message", message)
	}
	return protojson.MarshalOptions{}.MarshalAppend(dst, pm)
}

// MarshalStable is Marshal compacted (protojson varies its white space).
func (c jsonCodec) MarshalStable(message any) ([]byte, error) {
	b, err := c.Marshal(message)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func (jsonCodec) Unmarshal(data []byte, message any) error {
	pm, ok := message.(proto.Message)
	if !ok {
		return fmt.Errorf("%T doesn't implement proto.Message", message)
	}
	if len(data) == 0 {
		return fmt.Errorf("zero-length payload is not a valid JSON object")
	}
	if r, ok := message.(*sequencerv1.SendRequest); ok && decodeSendRequest(data, r) {
		return nil
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, pm); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", message, err)
	}
	return nil
}

// Range of google.protobuf.Timestamp that protojson writes.
const (
	minTimestampSeconds = -62135596800 // 0001-01-01T00:00:00Z
	maxTimestampSeconds = 253402300799 // 9999-12-31T23:59:59Z
)

// appendSendResponse appends r as protojson writes it (zero fields left
// out, 64-bit integers as strings, RFC 3339 time with 0, 3, 6 or 9
// fractional digits), without white space. ok false: a timestamp protojson
// refuses (out of range), left to protojson for its error.
func appendSendResponse(dst []byte, r *sequencerv1.SendResponse) (_ []byte, ok bool) {
	ts := r.GetServerAt()
	if ts != nil {
		if s, n := ts.GetSeconds(), ts.GetNanos(); s < minTimestampSeconds || s > maxTimestampSeconds || n < 0 || n > 999_999_999 {
			return dst, false
		}
	}
	dst = append(dst, '{')
	sep := false
	field := func(name string) {
		if sep {
			dst = append(dst, ',')
		}
		sep = true
		dst = append(dst, '"')
		dst = append(dst, name...)
		dst = append(dst, `":`...)
	}
	if v := r.GetMsgId(); v != 0 {
		field("msgId")
		dst = append(dst, '"')
		dst = strconv.AppendUint(dst, v, 10)
		dst = append(dst, '"')
	}
	if v := r.GetSeq(); v != 0 {
		field("seq")
		dst = append(dst, '"')
		dst = strconv.AppendUint(dst, v, 10)
		dst = append(dst, '"')
	}
	if ts != nil {
		field("serverAt")
		dst = append(dst, '"')
		dst = appendTimestamp(dst, time.Unix(ts.GetSeconds(), int64(ts.GetNanos())).UTC())
		dst = append(dst, '"')
	}
	if r.GetDuplicate() {
		field("duplicate")
		dst = append(dst, "true"...)
	}
	return append(dst, '}'), true
}

// appendTimestamp appends t (UTC) in RFC 3339 with 0, 3, 6 or 9 fractional
// digits and a Z, as protojson does.
func appendTimestamp(dst []byte, t time.Time) []byte {
	dst = t.AppendFormat(dst, "2006-01-02T15:04:05")
	if ns := t.Nanosecond(); ns != 0 {
		digits := 9
		for _, d := range []int{3, 6} {
			if ns%pow10[9-d] == 0 {
				digits = d
				break
			}
		}
		var frac [10]byte
		frac[0] = '.'
		v := ns / pow10[9-digits]
		for i := digits; i >= 1; i-- {
			frac[i] = byte('0' + v%10)
			v /= 10
		}
		dst = append(dst, frac[:digits+1]...)
	}
	return append(dst, 'Z')
}

var pow10 = [10]int{1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000}

// decodeSendRequest decodes data into r when it has the plain shape (see
// jsonCodec) and reports whether it did; false leaves r untouched.
func decodeSendRequest(data []byte, r *sequencerv1.SendRequest) bool {
	d := jsonScanner{b: data}
	var (
		convID, clientMsgID string
		fromUID             uint64
		msgType             int32
		body                []byte
		seen                uint8
	)
	d.space()
	if !d.byte('{') {
		return false
	}
	d.space()
	if !d.byte('}') {
		for {
			key, ok := d.plainString()
			if !ok {
				return false
			}
			d.space()
			if !d.byte(':') {
				return false
			}
			d.space()
			var bit uint8
			switch string(key) {
			case "convId", "conv_id":
				bit = 1
				s, ok := d.plainString()
				if !ok {
					return false
				}
				convID = string(s)
			case "fromUid", "from_uid":
				bit = 2
				if fromUID, ok = d.uint64(); !ok {
					return false
				}
			case "clientMsgId", "client_msg_id":
				bit = 4
				s, ok := d.plainString()
				if !ok {
					return false
				}
				clientMsgID = string(s)
			case "msgType", "msg_type":
				bit = 8
				if msgType, ok = d.int32(); !ok {
					return false
				}
			case "body":
				bit = 16
				s, ok := d.plainString()
				if !ok {
					return false
				}
				if body, ok = decodeBase64(s); !ok {
					return false
				}
			default:
				return false // unknown field: protojson decides
			}
			if seen&bit != 0 {
				return false // repeated field: protojson refuses it
			}
			seen |= bit
			d.space()
			if d.byte(',') {
				d.space()
				continue
			}
			if d.byte('}') {
				break
			}
			return false
		}
	}
	d.space()
	if d.i != len(d.b) {
		return false
	}
	r.Reset()
	r.ConvId, r.FromUid, r.ClientMsgId, r.MsgType, r.Body = convID, fromUID, clientMsgID, msgType, body
	return true
}

// decodeBase64 decodes a bytes field as protojson does: standard or URL
// alphabet, padded or not.
func decodeBase64(s []byte) ([]byte, bool) {
	enc := base64.StdEncoding
	if bytes.ContainsAny(s, "-_") {
		enc = base64.URLEncoding
	}
	if len(s)%4 != 0 {
		enc = enc.WithPadding(base64.NoPadding)
	}
	out := make([]byte, enc.DecodedLen(len(s)))
	n, err := enc.Decode(out, s)
	if err != nil {
		return nil, false
	}
	return out[:n], true
}

// jsonScanner reads the plain subset of JSON decodeSendRequest accepts.
type jsonScanner struct {
	b []byte
	i int
}

func (d *jsonScanner) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *jsonScanner) byte(c byte) bool {
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// plainString reads a string without escapes or control characters, valid
// UTF-8, and returns its bytes (aliasing the input).
func (d *jsonScanner) plainString() ([]byte, bool) {
	if !d.byte('"') {
		return nil, false
	}
	start := d.i
	ascii := true
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			if !ascii && !utf8.Valid(s) {
				return nil, false
			}
			return s, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
		d.i++
	}
	return nil, false
}

// digits reads an unsigned decimal integer without leading zeros (or "0"),
// quoted or not, as protojson accepts for 64-bit fields; neg allows a '-'.
func (d *jsonScanner) digits(neg bool) (s []byte, ok bool) {
	quoted := d.byte('"')
	start := d.i
	if neg && d.i < len(d.b) && d.b[d.i] == '-' {
		d.i++
	}
	first := d.i
	for d.i < len(d.b) && '0' <= d.b[d.i] && d.b[d.i] <= '9' {
		d.i++
	}
	n := d.i - first
	if n == 0 || n > 20 || (n > 1 && d.b[first] == '0') {
		return nil, false
	}
	s = d.b[start:d.i]
	if quoted && !d.byte('"') {
		return nil, false
	}
	if !quoted && d.i < len(d.b) {
		// A number must end here: '.', 'e' or more would be a fraction or
		// an exponent (protojson's business).
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r', ',', '}':
		default:
			return nil, false
		}
	}
	return s, true
}

func (d *jsonScanner) uint64() (uint64, bool) {
	s, ok := d.digits(false)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseUint(string(s), 10, 64)
	return v, err == nil
}

func (d *jsonScanner) int32() (int32, bool) {
	s, ok := d.digits(true)
	if !ok || string(s) == "-0" {
		return 0, false
	}
	v, err := strconv.ParseInt(string(s), 10, 32)
	return int32(v), err == nil
}
