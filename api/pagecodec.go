package api

import (
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// A PullMany answer is encoded on two cores. A PullManyResponse is a list
// of pages (field 1) and nothing else, and the protobuf encoding of a
// message is the concatenation of its fields: the encodings of its first
// and second halves, concatenated, are its own. An answer of 1,000
// conversations x 10 messages is about 2 MB, a couple of milliseconds of
// one core to encode. The Go SDK decodes it in halves the same way
// (client/codec.go).

// minSplitMessages: below this many messages in all pages one core does
// it all (a goroutine's start and the join cost more than they save).
const minSplitMessages = 512

// appendPullMany appends r's protobuf encoding to dst, as
// proto.MarshalOptions{}.MarshalAppend does; an answer of many messages is
// encoded in two halves at once, each into its own part of one buffer.
func appendPullMany(dst []byte, r *sequencerv1.PullManyResponse) ([]byte, error) {
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
