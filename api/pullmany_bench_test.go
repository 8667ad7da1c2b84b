package api

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// BenchmarkPullManyAnswer measures the server's work on a PullMany answer
// of 1,000 conversations x 10 messages (128-byte bodies, as
// `sequencer-bench pullmany` stores them: zeros, or random bytes as an
// encrypted body would be): building the protobuf answer, marshalling it,
// and gzipping it at connect's default level and at the level the handler
// uses (gzipLevel); marshal-halves is the handler's own encoding, two
// halves at once (pagecodec.go). Run:
//
//	go test ./api/ -run '^$' -bench PullManyAnswer -benchmem
func BenchmarkPullManyAnswer(b *testing.B) {
	for _, random := range []bool{false, true} {
		pages := make([][]sequencer.Message, 1000)
		for k := range pages {
			for s := range 10 {
				body := make([]byte, 128)
				if random {
					rand.Read(body)
				}
				pages[k] = append(pages[k], sequencer.Message{MsgID: uint64(1<<40 + k*10 + s), ConvID: fmt.Sprintf("pullmany-5f1c2a3b-%d", k),
					Seq: uint64(s + 1), FromUID: 1, MsgType: 1, Body: body, ClientMsgID: fmt.Sprintf("pullmany-5f1c2a3b-%d-%d", k, s),
					ServerAt: time.Unix(1_700_000_000, 123_000_000).UTC()})
			}
		}
		build := func() *sequencerv1.PullManyResponse {
			protos := newMessageProtos(10_000)
			out := &sequencerv1.PullManyResponse{Pages: make([]*sequencerv1.PullResponse, len(pages))}
			for i, p := range pages {
				out.Pages[i] = &sequencerv1.PullResponse{HeadSeq: 10, Messages: protos.next(p)}
			}
			return out
		}
		name := "zeros"
		if random {
			name = "random"
		}
		b.Run(name+"/build", func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				build()
			}
		})
		wire, err := proto.Marshal(build())
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name+"/marshal", func(b *testing.B) {
			b.ReportAllocs()
			resp := build()
			var buf []byte
			for range b.N {
				buf, _ = proto.MarshalOptions{}.MarshalAppend(buf[:0], resp)
			}
			b.SetBytes(int64(len(buf)))
		})
		b.Run(name+"/marshal-halves", func(b *testing.B) { // the handler's codec (pagecodec.go)
			b.ReportAllocs()
			resp := build()
			var buf []byte
			for range b.N {
				buf, _ = appendPullMany(buf[:0], resp)
			}
			b.SetBytes(int64(len(buf)))
		})
		for _, level := range []int{gzip.DefaultCompression, gzipLevel} {
			b.Run(fmt.Sprintf("%s/gzip-level-%d", name, level), func(b *testing.B) {
				b.ReportAllocs()
				var out bytes.Buffer
				w, _ := gzip.NewWriterLevel(&out, level)
				for range b.N {
					out.Reset()
					w.Reset(&out)
					w.Write(wire)
					w.Close()
				}
				b.SetBytes(int64(len(wire)))
				b.ReportMetric(float64(out.Len()), "gzipped-bytes")
			})
		}
	}
}
