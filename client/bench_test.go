package client_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer/client"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// BenchmarkSend measures Sends through the SDK to one in-process node on
// the embedded store: parallel senders, one conversation each (b.SetParallelism
// scales the senders per CPU).
func BenchmarkSend(b *testing.B) {
	for _, proto := range []client.Protocol{client.ProtocolGRPC, client.ProtocolConnect} {
		b.Run(proto.String(), func(b *testing.B) {
			node := startNodeTB(b, b.TempDir())
			c, err := client.New(client.Config{Addrs: []string{node.Addr()}, Protocol: proto, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			var convs atomic.Int64
			body := make([]byte, 200)
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				conv := fmt.Sprintf("bench:%d", convs.Add(1))
				for pb.Next() {
					if _, err := c.Send(context.Background(), client.SendRequest{ConvID: conv, FromUID: 1, Body: body}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	// The same load on the generated Connect client without the SDK, to
	// show what the SDK (route cache, retry wrapper, key generation) adds.
	b.Run("raw-grpc", func(b *testing.B) {
		node := startNodeTB(b, b.TempDir())
		tr := h2cTransport()
		defer tr.CloseIdleConnections()
		rpc := sequencerv1connect.NewSequencerServiceClient(&http.Client{Transport: tr}, "http://"+node.Addr(), connect.WithGRPC())
		var convs atomic.Int64
		body := make([]byte, 200)
		b.SetParallelism(32)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			conv := fmt.Sprintf("bench:%d", convs.Add(1))
			for pb.Next() {
				req := &sequencerv1.SendRequest{ConvId: conv, FromUid: 1, ClientMsgId: client.NewClientMsgID(), Body: body}
				if _, err := rpc.Send(context.Background(), connect.NewRequest(req)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
