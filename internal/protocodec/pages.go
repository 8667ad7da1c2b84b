// Package protocodec is the binary protobuf codec of the node's handler
// and of the Go SDK: connect's, except that large PullMany answers are
// encoded and decoded on two cores. A PullManyResponse is a list of pages (field 1) and nothing else,
// and the protobuf encoding of a message is the concatenation of its
// fields: the encodings of its first and second halves, concatenated, are
// its own, and a decoding may start at any field boundary. An answer of
// 1,000 conversations x 10 messages is about 2 MB; encoding or decoding it
// is a few milliseconds of one core that a second core can halve.
//
// The node encodes its answers through Append (api/feedcodec.go) and the Go
// SDK (client) decodes them through Unmarshal; both give what proto.Marshal
// and proto.Unmarshal give (pages_test.go).
package protocodec

import (
	"slices"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// Below these sizes one core does it all: a goroutine's start and the
// halves' join cost more than they save.
const (
	minSplitMessages = 512      // Append: messages in all pages
	minSplitBytes    = 64 << 10 // Unmarshal: bytes of the encoding
)

// Append appends r's protobuf encoding to dst, as
// proto.MarshalOptions{}.MarshalAppend does; an answer of many messages is
// encoded in two halves at once, each into its own part of one buffer.
func Append(dst []byte, r *sequencerv1.PullManyResponse) ([]byte, error) {
	n := 0
	for _, p := range r.GetPages() {
		n += len(p.GetMessages())
	}
	if n < minSplitMessages {
		return proto.MarshalOptions{}.MarshalAppend(dst, r)
	}
	// Cut where half of the messages lie on each side.
	pages, half, cut := r.GetPages(), 0, 0
	for cut < len(pages) && half < n/2 {
		half += len(pages[cut].GetMessages())
		cut++
	}
	first := &sequencerv1.PullManyResponse{Pages: pages[:cut]}
	second := &sequencerv1.PullManyResponse{Pages: pages[cut:]}
	// Sizes first (each half's messages cache theirs), then both halves
	// into their places: the buffer is allocated once.
	var firstSize, secondSize int
	var wg sync.WaitGroup
	wg.Go(func() { secondSize = proto.Size(second) })
	firstSize = proto.Size(first)
	wg.Wait()
	unknown := r.ProtoReflect().GetUnknown()
	start := len(dst)
	out := slices.Grow(dst, firstSize+secondSize+len(unknown))[:start+firstSize+secondSize]
	cached := proto.MarshalOptions{UseCachedSize: true}
	var secondOut []byte
	var secondErr error
	wg.Go(func() {
		at := start + firstSize
		secondOut, secondErr = cached.MarshalAppend(out[at:at:at+secondSize], second)
	})
	firstOut, err := cached.MarshalAppend(out[start:start:start+firstSize], first)
	wg.Wait()
	if err == nil {
		err = secondErr
	}
	if err != nil {
		return nil, err
	}
	// A half that did not fit its size (a message changed while being
	// encoded) was appended elsewhere: encode the whole on one core.
	if len(firstOut) != firstSize || len(secondOut) != secondSize ||
		(firstSize > 0 && &firstOut[0] != &out[start]) || (secondSize > 0 && &secondOut[0] != &out[start+firstSize]) {
		return proto.MarshalOptions{}.MarshalAppend(dst, r)
	}
	return append(out, unknown...), nil
}

// Unmarshal decodes data into r as proto.Unmarshal does; a large encoding
// is decoded in two halves at once, cut at a field boundary.
func Unmarshal(data []byte, r *sequencerv1.PullManyResponse) error {
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

// fieldBoundary is the offset of the first field that starts at or after
// the middle of data; 0: data is too small to split, or not a sequence of
// well-formed fields up to there (proto.Unmarshal of the whole reports it).
func fieldBoundary(data []byte) int {
	if len(data) < minSplitBytes {
		return 0
	}
	at := 0
	for at < len(data)/2 {
		num, typ, n := protowire.ConsumeTag(data[at:])
		if n < 0 {
			return 0
		}
		m := protowire.ConsumeFieldValue(num, typ, data[at+n:])
		if m < 0 {
			return 0
		}
		at += n + m
	}
	return at
}
