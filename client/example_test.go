package client_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/sequencer-im/sequencer/client"
	"github.com/sequencer-im/sequencer/server"
)

// Example sends, resends and pulls through the SDK. It starts a one-node
// sequencer in process on a temporary embedded store; a real application
// passes the addresses of its running nodes in Addrs instead.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "sequencer-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	node, err := server.Start(ctx, server.Config{
		Listen: "127.0.0.1:0",
		Store:  "sqlite:" + filepath.Join(dir, "sequencer.db"),
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		panic(err)
	}
	defer node.Shutdown(ctx)

	c, err := client.New(client.Config{Addrs: []string{node.Addr()}})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	// The caller's own resend key: sending it again returns the first ids.
	hello := client.SendRequest{ConvID: "g:42", FromUID: 1001, ClientMsgID: "5f0c-hello", Body: []byte("hi")}
	first, err := c.Send(ctx, hello)
	if err != nil {
		panic(err)
	}
	again, err := c.Send(ctx, hello)
	if err != nil {
		panic(err)
	}
	fmt.Println("first:", first.Seq, first.Duplicate)
	fmt.Println("resend:", again.Seq, again.Duplicate, again.MsgID == first.MsgID)

	// No key given: the SDK generates one and keeps it across its retries.
	if _, err := c.Send(ctx, client.SendRequest{ConvID: "g:42", FromUID: 1002, Body: []byte("hello")}); err != nil {
		panic(err)
	}

	page, err := c.Pull(ctx, "g:42", 0, 100)
	if err != nil {
		panic(err)
	}
	for _, m := range page.Messages {
		fmt.Printf("seq %d from %d: %s\n", m.Seq, m.FromUID, m.Body)
	}
	fmt.Println("head:", page.HeadSeq, "more:", page.HasMore)

	// Errors carry the domain code; invalid requests are never retried.
	_, err = c.Send(ctx, client.SendRequest{ConvID: "g:42", FromUID: 0, Body: []byte("x")})
	fmt.Println("from_uid 0:", client.ErrorCode(err))
	_, err = c.GetMessage(ctx, 1)
	fmt.Println("unknown msg_id:", client.ErrorCode(err))

	// Output:
	// first: 1 false
	// resend: 1 true true
	// seq 1 from 1001: hi
	// seq 2 from 1002: hello
	// head: 2 more: false
	// from_uid 0: invalid_argument
	// unknown msg_id: not_found
}
