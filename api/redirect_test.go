package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// ownerOut is what cluster answers for a send whose owner (at addr) it could
// not reach over the cluster link.
func ownerOut(addr string, code sequencer.Code) error {
	return &sequencer.OwnerElsewhere{NodeID: "n2", Addr: addr,
		Err: sequencer.Wrap(code, sequencer.ErrNotOwner, "node n2 does not answer over the cluster link")}
}

func postSendTo(t *testing.T, c *http.Client, u string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u+sendPath, strings.NewReader(`{"convId":"g:1","fromUid":"7","clientMsgId":"k1","body":"aGk="}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

var noFollow = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// A plain Connect Send that the node could not place because the owner
// was out of its reach is answered 307 to the owner; an HTTP client that
// follows it (net/http, as curl -L, fetch and requests do) is answered by
// the owner, and one that does not reads the same Connect error.
func TestRedirectToOwner(t *testing.T) {
	owner, ownerSender, ownerHits := edgeServer(t, Edge{RedirectToOwner: true})
	ownerSender.set(answer(42, 9, false))
	ownerAddr := strings.TrimPrefix(owner, "http://")

	for _, code := range []sequencer.Code{sequencer.CodeUnavailable, sequencer.CodeDeadlineExceeded} {
		t.Run(code.String(), func(t *testing.T) {
			cut, cutSender, _ := edgeServer(t, Edge{RedirectToOwner: true})
			cutSender.set(fail(ownerOut(ownerAddr, code)))

			resp, body := postSendTo(t, noFollow, cut, nil)
			cutSender.mu.Lock()
			follows := cutSender.follows[len(cutSender.follows)-1]
			cutSender.mu.Unlock()
			if !follows {
				t.Fatal("the Sender was not told that the client follows redirects")
			}
			if resp.StatusCode != http.StatusTemporaryRedirect {
				t.Fatalf("status %d, want 307 (%s)", resp.StatusCode, body)
			}
			want := owner + sendPath + "?" + redirectedParam + "=1"
			if code == sequencer.CodeDeadlineExceeded {
				// The cut node's attempt got no answer: the owner must
				// not answer "not stored".
				want += "&" + unknownParam + "=1"
			}
			if loc := resp.Header.Get("Location"); loc != want {
				t.Fatalf("Location %q, want %q", loc, want)
			}
			if resp.Header.Get(HeaderOwner) != "n2" || resp.Header.Get(HeaderOwnerAddr) != ownerAddr {
				t.Fatalf("owner headers %q %q", resp.Header.Get(HeaderOwner), resp.Header.Get(HeaderOwnerAddr))
			}
			if !strings.Contains(body, `"code":"`+code.String()+`"`) {
				t.Fatalf("a client that does not follow reads %s, want the Connect error %s", body, code)
			}

			before := ownerHits.n.Load()
			resp, body = postSendTo(t, http.DefaultClient, cut, nil)
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"msgId":"42"`) {
				t.Fatalf("followed: status %d %s, want the owner's answer", resp.StatusCode, body)
			}
			if ownerHits.n.Load() != before+1 {
				t.Fatalf("the owner got %d requests, want 1", ownerHits.n.Load()-before)
			}
			calls := ownerSender.Calls()
			if last := calls[len(calls)-1]; last.ClientMsgID != "k1" || string(last.Body) != "hi" {
				t.Fatalf("the owner got %+v, want the same send", last)
			}
			ownerSender.mu.Lock()
			unknown := ownerSender.unknown[len(ownerSender.unknown)-1]
			ownerSender.mu.Unlock()
			if want := code == sequencer.CodeDeadlineExceeded; unknown != want {
				t.Fatalf("the owner was told the earlier outcome is unknown: %v, want %v", unknown, want)
			}

			// connect-go clients are answered the error, not redirected
			// (they may replay an empty body on a redirect).
			for name, opts := range map[string][]connect.ClientOption{"json": {connect.WithProtoJSON()}, "proto": nil} {
				c := sequencerv1connect.NewSequencerServiceClient(http.DefaultClient, cut, opts...)
				_, err := c.Send(context.Background(), connect.NewRequest(&sequencerv1.SendRequest{ConvId: "g:1", FromUid: 7, ClientMsgId: "k1", Body: []byte("hi")}))
				var ce *connect.Error
				if !errors.As(err, &ce) || ce.Code() != ConnectCode(code) || ce.Meta().Get(HeaderOwnerAddr) != ownerAddr {
					t.Fatalf("connect-go %s client: %v, want %v naming the owner", name, err, code)
				}
			}
		})
	}
}

// What is never redirected: an owner this node can reach (any other error),
// a request redirected once, gRPC and gRPC-Web, browsers, a bearer token
// that would not follow, and a node with redirects off.
func TestRedirectToOwnerNot(t *testing.T) {
	on := Edge{RedirectToOwner: true}
	cut, cutSender, _ := edgeServer(t, on)
	cutSender.set(fail(ownerOut("127.0.0.1:1", sequencer.CodeUnavailable)))

	if resp, _ := postSendTo(t, noFollow, cut, map[string]string{"Origin": "https://app.example.com"}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a browser's request: status %d, want 503", resp.StatusCode)
	}
	if resp, _ := postSendTo(t, noFollow, cut, map[string]string{"Authorization": "Bearer x"}); resp.StatusCode != http.StatusTemporaryRedirect {
		t.Fatalf("a token to the same host: status %d, want 307", resp.StatusCode)
	}
	cutSender.mu.Lock()
	follows := cutSender.follows[len(cutSender.follows)-1]
	cutSender.mu.Unlock()
	if follows {
		t.Fatal("a request with a bearer token was marked as following redirects (a slow link would refuse it)")
	}
	cutSender.set(fail(ownerOut("10.9.9.9:7070", sequencer.CodeUnavailable)))
	if resp, _ := postSendTo(t, noFollow, cut, map[string]string{"Authorization": "Bearer x"}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a token to another host: status %d, want 503 (the client would drop the token)", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodPost, cut+sendPath+"?"+redirectedParam+"=1", strings.NewReader(`{"convId":"g:1","fromUid":"7","clientMsgId":"k1"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a request redirected once: status %d, want 503", resp.StatusCode)
	}

	for name, opts := range protocols() {
		if name == "connect" {
			continue
		}
		c := sequencerv1connect.NewSequencerServiceClient(h2cClient(t), cut, opts...)
		_, err := c.Send(context.Background(), connect.NewRequest(&sequencerv1.SendRequest{ConvId: "g:1", FromUid: 7, ClientMsgId: "k1"}))
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable || ce.Meta().Get(HeaderOwnerAddr) != "10.9.9.9:7070" {
			t.Fatalf("%s: %v, want unavailable naming the owner", name, err)
		}
		cutSender.mu.Lock()
		follows := cutSender.follows[len(cutSender.follows)-1]
		cutSender.mu.Unlock()
		if follows {
			t.Fatalf("%s: the Sender was told the client follows redirects", name)
		}
	}

	cutSender.set(fail(sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner, "moving")))
	if resp, _ := postSendTo(t, noFollow, cut, nil); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderOwnerAddr) != "" {
		t.Fatalf("an error without an owner out of reach: status %d", resp.StatusCode)
	}

	// Edit and Recall are sends too: redirected like Send.
	cutSender.set(fail(ownerOut("127.0.0.1:1", sequencer.CodeUnavailable)))
	for _, body := range []struct{ path, json string }{
		{sequencerv1connect.SequencerServiceEditProcedure, `{"convId":"g:1","fromUid":"7","clientMsgId":"e1","targetMsgId":"5","body":"aGk="}`},
		{sequencerv1connect.SequencerServiceRecallProcedure, `{"convId":"g:1","fromUid":"7","clientMsgId":"r1","targetMsgId":"5"}`},
	} {
		req, _ := http.NewRequest(http.MethodPost, cut+body.path, strings.NewReader(body.json))
		req.Header.Set("Content-Type", "application/json")
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTemporaryRedirect || resp.Header.Get("Location") != "http://127.0.0.1:1"+body.path+"?"+redirectedParam+"=1" {
			t.Fatalf("%s: status %d Location %q, want 307 to the owner", body.path, resp.StatusCode, resp.Header.Get("Location"))
		}
	}

	off, offSender, _ := edgeServer(t, Edge{})
	offSender.set(fail(ownerOut("127.0.0.1:1", sequencer.CodeUnavailable)))
	if resp, _ := postSendTo(t, noFollow, off, nil); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderOwnerAddr) != "127.0.0.1:1" {
		t.Fatalf("redirects off: status %d, want 503 with the owner header", resp.StatusCode)
	}
}
