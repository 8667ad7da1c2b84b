package api

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/internal/netbuf"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// A server on netbuf.Listener (the API port without TLS) answers gRPC over h2c (many concurrent
// streams on one connection, messages smaller and larger than the buffer)
// and JSON over HTTP/1.1 keep-alive exactly as on a bare listener.
func TestListenerServesH2CAndHTTP1(t *testing.T) {
	sender := &fakeSender{}
	sender.set(func(req sequencer.SendRequest) (sequencer.SendResult, error) {
		return sequencer.SendResult{MsgID: uint64(len(req.Body)) + 1000, Seq: req.FromUID}, nil
	})
	svc := NewService(Config{Sender: sender, Reader: newFakeReader(), Logger: slog.New(slog.DiscardHandler)})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(ln.Addr().String(), NewHTTPHandler(svc, nil, nil))
	go srv.Serve(netbuf.Listener(ln))
	t.Cleanup(func() { srv.Close() })
	url := "http://" + ln.Addr().String()

	// gRPC: 64 concurrent Sends on one h2c connection, bodies 0 B..20 KiB.
	c := sequencerv1connect.NewSequencerServiceClient(h2cClient(t), url, connect.WithGRPC())
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := bytes.Repeat([]byte{byte(i)}, i*320)
			res, err := c.Send(context.Background(), connect.NewRequest(&sequencerv1.SendRequest{
				ConvId: "c", FromUid: uint64(i + 1), ClientMsgId: fmt.Sprint("k", i), MsgType: 1, Body: body}))
			switch {
			case err != nil:
				errs <- err
			case res.Msg.MsgId != uint64(len(body))+1000 || res.Msg.Seq != uint64(i+1):
				errs <- fmt.Errorf("send %d: answer %v", i, res.Msg)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// HTTP/1.1 JSON: several requests on one keep-alive connection.
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	for i := range 5 {
		in := fmt.Sprintf(`{"convId":"c","fromUid":"%d","clientMsgId":"j%d","body":"%s"}`, i+1, i, strings.Repeat("QUFB", i*500))
		resp, err := hc.Post(url+sequencerv1connect.SequencerServiceSendProcedure, "application/json", strings.NewReader(in))
		if err != nil {
			t.Fatal(err)
		}
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := fmt.Sprintf(`{"msgId":"%d","seq":"%d"}`, i*1500+1000, i+1)
		if err != nil || resp.StatusCode != http.StatusOK || string(out) != want {
			t.Fatalf("JSON send %d: %d %s %v, want %s", i, resp.StatusCode, out, err, want)
		}
	}
	if got := len(sender.Calls()); got != 69 {
		t.Fatalf("%d sends reached the sender, want 69", got)
	}
}
